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


@pytest.mark.parametrize("module", ["train", "steer", "report", "suite"])
def test_every_command_uses_the_convention(module):
    import importlib

    main = importlib.import_module(f"lm_eval_ponder.{module}").main
    assert getattr(main, "__wrapped__", None) is not None, f"{module}.main is not a @command"
