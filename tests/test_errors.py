"""One exit-code convention for every command (lm_eval_ponder.errors.command)."""

from __future__ import annotations

import logging

import pytest

from lm_eval_ponder.errors import USAGE_ERROR, PonderError, command


def test_command_turns_a_ponder_error_into_one_line_and_status_2(capsys):
    @command
    def main(argv=None) -> int:
        raise PonderError("bad input, do X")

    assert main([]) == USAGE_ERROR == 2
    assert capsys.readouterr().err == "lm-eval-ponder error: bad input, do X\n"


def test_command_keeps_tracebacks_for_bugs():
    @command
    def main(argv=None) -> int:
        raise KeyError("bug")

    with pytest.raises(KeyError):
        main([])


def test_command_logs_status_lines_to_stderr_and_restores_the_logger(capsys):
    logger = logging.getLogger("lm_eval_ponder.some.module")
    root = logging.getLogger("lm_eval_ponder")
    before = (root.level, root.propagate, list(root.handlers))

    @command
    def main(argv=None) -> int:
        logger.info("resuming at step 3")
        return 0

    assert main([]) == 0
    assert "resuming at step 3" in capsys.readouterr().err
    assert (root.level, root.propagate, list(root.handlers)) == before


def command_modules() -> list[str]:
    """The module of every ``main`` that runs as a program (``run_program(main)``): the module
    itself where it defines ``main``, else the one it imports ``main`` from. Found by parsing
    the package, so a new command cannot be left out of the test below."""
    import ast
    from pathlib import Path

    pkg = Path(__file__).resolve().parents[1] / "lm_eval_ponder"
    found = set()
    for path in sorted(pkg.rglob("*.py")):
        nodes = list(ast.walk(ast.parse(path.read_text())))
        if not any(isinstance(n, ast.Call) and getattr(n.func, "id", None) == "run_program"
                   for n in nodes):
            continue
        origin = [n.module for n in nodes if isinstance(n, ast.ImportFrom)
                  and any(a.name == "main" and a.asname is None for a in n.names)]
        found.add(origin[0] if origin else ".".join(path.relative_to(pkg.parent).with_suffix("").parts))
    return sorted(found)


def test_command_modules_are_found():
    """The documented commands (train, steer, report, suite), the console script that runs
    them (issue 53) and nothing that is not one (the records' storage is the repository's:
    scripts/records.py)."""
    assert command_modules() == ["lm_eval_ponder.cli",
                                 "lm_eval_ponder.reporting.report",
                                 "lm_eval_ponder.reporting.suite",
                                 "lm_eval_ponder.steering.cli", "lm_eval_ponder.training.cli"]


@pytest.mark.parametrize("module", command_modules())
def test_every_command_uses_the_convention(module):
    """Each command's ``main`` is ``errors.command``'s wrapper, not merely some decorator that
    sets ``__wrapped__`` (``functools.wraps`` in any decorator does)."""
    import importlib

    main = importlib.import_module(module).main
    assert getattr(main, "__wrapped__", None) is not None, f"{module}.main is not a @command"
    assert main.__code__ is command(lambda: 0).__code__, f"{module}.main is not errors.command's"


def test_sigterm_ends_a_command_with_the_ctrl_c_line(tmp_path):
    """Issue 73: SIGTERM ended a run without a word; it now ends as Ctrl-C does, in one line
    and with the interrupted status."""
    import signal
    import subprocess
    import sys
    import time

    from lm_eval_ponder.errors import INTERRUPTED, STOPPED

    script = ("import time; from lm_eval_ponder.errors import run_program\n"
              "def main():\n    print('ready', flush=True); time.sleep(60); return 0\n"
              "run_program(main)\n")
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        time.sleep(0.2)
        child.send_signal(signal.SIGTERM)
        _, err = child.communicate(timeout=30)
    finally:
        child.kill()
    assert child.returncode == INTERRUPTED
    assert err.strip().splitlines() == [STOPPED] and "Traceback" not in err


@pytest.mark.parametrize("message", ["", "generation stopped after 3 of 10 answers"])
def test_the_excepthook_prints_the_stopped_line_without_a_dangling_separator(message, capsys):
    """An ``Interrupted`` that reaches the excepthook prints the same line as ``run_program``:
    with its message after "; ", or the bare line (it printed "...Ctrl-C; " without one)."""
    import sys

    from lm_eval_ponder.errors import STOPPED, Interrupted, install_excepthook

    previous = sys.excepthook
    try:
        install_excepthook()
        sys.excepthook(Interrupted, Interrupted(message), None)
    finally:
        sys.excepthook = previous
    expected = f"{STOPPED}; {message}" if message else STOPPED
    assert capsys.readouterr().err.splitlines() == [expected]
