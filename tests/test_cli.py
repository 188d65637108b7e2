"""The console script ``lm-eval-ponder`` (lm_eval_ponder.cli): its subcommands are the
documented commands, the same functions as their ``python -m`` forms."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

from lm_eval_ponder import cli
from lm_eval_ponder.errors import PREFIX, USAGE_ERROR

REPO = Path(__file__).resolve().parents[1]


def test_the_console_script_is_installed_at_the_entry_that_runs_main_as_a_program():
    """pip writes ``sys.exit(program())``: ``program`` runs ``main`` under
    ``errors.run_program`` (Ctrl-C one line), as ``python -m lm_eval_ponder.cli`` does."""
    section = (REPO / "pyproject.toml").read_text().split("\n[project.scripts]\n")[1]
    scripts = dict(re.findall(r'^([\w-]+) = "([^"]+)"$', section.split("\n[")[0], re.M))
    assert list(scripts) == ["lm-eval-ponder"]
    module, _, name = scripts["lm-eval-ponder"].partition(":")
    assert getattr(importlib.import_module(module), name) is cli.program
    source = (REPO / "lm_eval_ponder" / "cli.py").read_text()
    assert "run_program(main)" in source and 'if __name__ == "__main__":\n    program()' in source


@pytest.mark.parametrize("name", ["train", "suite", "report", "steer"])
def test_each_subcommand_runs_the_main_of_its_python_m_form(name):
    """``lm-eval-ponder train`` and ``python -m lm_eval_ponder.train`` run one function (the
    latter under its ``errors.command`` wrapper, which the console script has once, as its own)."""
    assert cli.command_main(name) is importlib.import_module(f"lm_eval_ponder.{name}").main.__wrapped__


def test_help_lists_the_commands(capsys):
    with pytest.raises(SystemExit) as exited:
        cli.main(["--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert "usage: lm-eval-ponder" in out
    for name in ("train", "suite", "report", "steer"):
        assert f"\n    {name} " in out, (name, out)


def test_a_commands_help_is_its_own(capsys):
    from lm_eval_ponder.reporting import report

    with pytest.raises(SystemExit) as exited:
        report.main(["--help"])
    own = capsys.readouterr().out
    with pytest.raises(SystemExit) as exited:
        cli.main(["report", "--help"])
    # the same help, signed with the program the user typed (issue 66); argparse wraps the
    # usage lines to the name's length, so the options after them are what must be equal
    typed = capsys.readouterr().out
    assert exited.value.code == 0 and typed.startswith("usage: lm-eval-ponder report")
    assert own.startswith("usage: python -m lm_eval_ponder.report")
    assert typed.split("\n\n", 1)[1] == own.split("\n\n", 1)[1]
    assert "--link-figures" in own


def test_no_or_an_unknown_command_is_a_usage_error(capsys):
    for argv in ([], ["nosuch"], ["--output", "x"]):
        with pytest.raises(SystemExit) as exited:
            cli.main(argv)
        assert exited.value.code == 2
        assert "usage: lm-eval-ponder" in capsys.readouterr().err


def test_a_commands_mistake_is_one_line_and_status_lines_are_not_doubled(tmp_path, capsys):
    """One ``errors.command`` around the subcommand: a ``PonderError`` is one line, status 2;
    a warning is printed once (a second wrapper would add a second handler)."""
    status = cli.main(["train", "--output", str(tmp_path / "run"), "--grpo.lr", "0.1",
                       "--grpo.nope", "1"])
    err = capsys.readouterr().err
    assert status == USAGE_ERROR
    assert [line for line in err.splitlines() if line.startswith(PREFIX)] == [
        f"{PREFIX}unknown config key 'grpo.nope' (see --help for the keys)"]
    assert err.count("'grpo.lr' is now 'grpo.learning_rate'") == 1, err
