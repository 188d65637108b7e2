"""``lm-eval-ponder``: one console script for the package's four commands.

    lm-eval-ponder train --output runs/smollm2       # = python -m lm_eval_ponder.train ...
    lm-eval-ponder suite --output suite/ --limit 20  # = python -m lm_eval_ponder.suite ...
    lm-eval-ponder report suite/                     # = python -m lm_eval_ponder.report ...
    lm-eval-ponder steer inspect controllers/smollm2-135m-instruct

Each subcommand is the ``main`` of the module its ``python -m`` form runs, given the rest of
the command line unchanged, so both forms take the same options and fail the same way
(``lm-eval-ponder COMMAND --help`` is that command's own help). Like the shims (``train.py``)
it holds no stage's code, and it imports a command's module only once the command is named,
so ``--help`` needs no torch.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable
from typing import NoReturn

from lm_eval_ponder import errors
from lm_eval_ponder.errors import command, run_program

# name: (the module whose ``main`` runs it, what it does)
COMMANDS: dict[str, tuple[str, str]] = {
    "train": ("lm_eval_ponder.training.cli",
              "train a halting controller with GRPO on a frozen backbone"),
    "suite": ("lm_eval_ponder.reporting.suite",
              "run every method on every dataset through lm-eval, then report"),
    "report": ("lm_eval_ponder.reporting.report",
               "the leaderboard (tables, figures, page) of lm-eval output directories"),
    "steer": ("lm_eval_ponder.steering.cli", "extract or inspect a steering vector"),
}


def command_main(name: str) -> Callable[[list[str]], int]:
    """The command's ``main`` without its ``errors.command`` wrapper: this script's own
    wrapper already turns a ``PonderError`` into one line and routes the status lines, and a
    second one would print every status line twice (each adds a handler to the logger)."""
    return importlib.import_module(COMMANDS[name][0]).main.__wrapped__


def parser() -> argparse.ArgumentParser:
    """The top-level parser: only for ``--help`` (the commands and what they do) and for the
    usage error of a missing or unknown command."""
    top = argparse.ArgumentParser(
        prog="lm-eval-ponder",
        description="FR-Ponder (adaptive latent pondering) for lm-evaluation-harness.",
        epilog="'lm-eval-ponder COMMAND --help' shows a command's options; each command is "
               "also 'python -m lm_eval_ponder.<COMMAND>'. Evaluation itself is lm-eval's: "
               "lm_eval --model ponder ...")
    sub = top.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (_, what) in COMMANDS.items():
        sub.add_parser(name, help=what, add_help=False)
    return top


@command
def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in COMMANDS:
        errors.TYPED_PROGRAM = f"lm-eval-ponder {argv[0]}"  # its usage lines say so
        try:
            return command_main(argv[0])(argv[1:])
        finally:
            errors.TYPED_PROGRAM = None
    top = parser()
    top.parse_args(argv)  # --help, or argparse's usage error for no or an unknown command
    # not reached when argv[0] is a command; argparse may still take one later ('-- train')
    top.error("the command comes first: lm-eval-ponder COMMAND [its options]")


def program() -> NoReturn:
    """The console script's entry point: ``main`` run as a program, so Ctrl-C ends in one line
    that says where the command stopped (``errors.run_program``), as under ``python -m``; an
    entry point at ``main`` itself would end it in a traceback."""
    run_program(main)


if __name__ == "__main__":
    program()
