"""One exception type for every user-facing mistake, and a hook that prints it cleanly.

lm-eval's command line does not catch exceptions, so a wrong path would otherwise end in a
long traceback. ``PonderError`` carries a message written for the user; ``install_excepthook``
makes an *uncaught* ``PonderError`` print one line, ``lm-eval-ponder error: <message>``,
instead of a traceback; Python then exits with status 1 as for any uncaught exception. Library
users who catch the exception are unaffected.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import sys
from collections.abc import Callable
from types import TracebackType
from typing import NoReturn

# the program as the user typed it, for usage lines: set by the console script
# (``lm-eval-ponder report``); None under ``python -m lm_eval_ponder.report``
TYPED_PROGRAM: str | None = None


def program_name(module_form: str) -> str:
    """``argparse``'s ``prog`` for a command: the console script's form when the user typed
    that (``lm-eval-ponder report``), else the ``python -m`` form the module runs as."""
    return TYPED_PROGRAM or module_form


class PonderError(Exception):
    """A problem with the user's input or environment, with a message that says how to fix it."""


class PonderDataError(PonderError):
    """A benchmark dataset could not be found or read."""


class UnsupportedGeneration(Exception):
    """The generation loop cannot reproduce ``model.generate`` exactly for this model or these
    settings. Not a user error: raised before any forward pass, and the caller falls back to
    ``model.generate`` (with one warning)."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C stopped a command that can be resumed: the message says where it stopped and
    which command resumes it. A ``KeyboardInterrupt`` still, so a Python caller of a command's
    ``main`` sees the Ctrl-C it pressed; ``run_program`` prints it as one line."""


USAGE_ERROR = 2  # our commands' exit status for a PonderError (argparse uses 2 for bad flags)
INTERRUPTED = 130  # 128 + SIGINT: what a shell reports for a command ended by Ctrl-C
PREFIX = "lm-eval-ponder error: "
STOPPED = "lm-eval-ponder: stopped by Ctrl-C"


def close_progress_bars() -> None:
    """End the progress bars still drawn (a loop left by an exception leaves its bar open, and
    the next line would be glued to it)."""
    tqdm = sys.modules.get("tqdm")
    if tqdm is None:
        return
    for bar in list(getattr(tqdm.tqdm, "_instances", ())):
        with contextlib.suppress(Exception):  # a bar that cannot close must not hide the message
            bar.close()


def command(main: Callable[..., int]) -> Callable[..., int]:
    """Wrap a command's ``main``: a ``PonderError`` becomes one line on stderr and exit status
    ``USAGE_ERROR``; anything else is a bug and keeps its traceback. Every ``python -m
    lm_eval_ponder.*`` command goes through this, so they all fail the same way. Ctrl-C goes
    on to the caller (``run_program`` turns it into one line for the command line)."""

    @functools.wraps(main)
    def wrapped(*args, **kwargs) -> int:
        # status lines of our modules (logging.getLogger(__name__)) go to stderr, plainly, for
        # the length of the command; the handler is created per call so it writes to the
        # sys.stderr of that moment
        logger = logging.getLogger("lm_eval_ponder")
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        saved = logger.level, logger.propagate
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False
        try:
            return main(*args, **kwargs)
        except PonderError as exc:
            close_progress_bars()
            print(f"{PREFIX}{exc}", file=sys.stderr)
            return USAGE_ERROR
        finally:
            logger.removeHandler(handler)
            logger.level, logger.propagate = saved

    return wrapped


@contextlib.contextmanager
def terminate_as_interrupt():
    """SIGTERM (``kill``, a scheduler's stop) handled as Ctrl-C while the block runs: the same
    one line saying where the run stopped, what it kept and how to resume, where SIGTERM
    ended the process without a word. Only in the main thread (the only one that
    may set a handler); the previous handler is restored after."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def stopped_line(exc: BaseException) -> str:
    """The one line a stopped command prints: where it stopped, if an ``Interrupted`` says."""
    where = str(exc) if isinstance(exc, Interrupted) else ""
    return STOPPED + (f"; {where}" if where else "")


def run_program(main: Callable[[], int]) -> NoReturn:
    """Run a command's ``main`` as the program (its ``if __name__ == "__main__"`` line) and exit
    with its status. Ctrl-C ends it with one line, ``lm-eval-ponder: stopped by Ctrl-C; <where
    it stopped, what it kept, the command that resumes it>`` (an ``Interrupted``'s message; a
    plain ``KeyboardInterrupt`` has none) and status ``INTERRUPTED``, instead of a traceback of
    whatever frame the signal landed in."""
    try:
        with terminate_as_interrupt():
            status = main()
    except KeyboardInterrupt as exc:
        close_progress_bars()
        print(stopped_line(exc), file=sys.stderr)
        status = INTERRUPTED
    sys.exit(status)


def install_excepthook() -> None:
    """Route uncaught PonderErrors (and ``Interrupted``) to a one-line message; idempotent."""
    current = sys.excepthook
    if getattr(current, "_lm_eval_ponder", False):
        return

    def hook(exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        if isinstance(exc, PonderError):
            print(f"{PREFIX}{exc}", file=sys.stderr)
        elif isinstance(exc, Interrupted):  # e.g. lm-eval's simple_evaluate in a user's script
            close_progress_bars()
            print(stopped_line(exc), file=sys.stderr)
        else:
            (current or sys.__excepthook__)(exc_type, exc, tb)

    hook._lm_eval_ponder = True  # type: ignore[attr-defined]
    sys.excepthook = hook
