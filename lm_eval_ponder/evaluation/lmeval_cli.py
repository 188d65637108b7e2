"""Our seams in lm-eval's command line (``lm_eval``, ``lm_eval run``, ``python -m lm_eval``),
for ``--model ponder`` runs: what is checked before anything loads, and how a run ends.

lm-eval 0.4.13 reads its command line and ``--config`` file into an ``EvaluatorConfig``
(``EvaluatorConfig.from_cli``) and runs it in ``Run._execute``. It writes results only after
the whole evaluation, and a folder it cannot write then costs the run: one INFO line, exit
status 0, results lost. Ctrl-C ends in a traceback of whatever frame it landed in. So, for a
``ponder`` run:

- ``checked_from_cli`` checks what lm-eval read before the model loads: ``--output_path`` can
  be written (``files.check_output``), ``--num_fewshot`` is not negative, ``--batch_size`` is
  a positive size or ``auto``;
- ``run_execute`` ends the run as our commands end: a ``PonderError`` in one line (status 1,
  as lm-eval's own exit for an uncaught error), Ctrl-C in one line saying where generation
  stopped (``PonderLM.generate_until``'s ``Interrupted``), what ``--use_cache`` kept and the
  command that resumes the run, status 130.

Installed by ``lm_eval_ponder_autoload`` when lm-eval's ``lm_eval._cli.run`` is imported;
other models' runs are left as lm-eval runs them.
"""

from __future__ import annotations

import functools
import shlex
import sys
from pathlib import Path
from typing import Any

from lm_eval_ponder.errors import (
    INTERRUPTED,
    PREFIX,
    STOPPED,
    Interrupted,
    PonderError,
    close_progress_bars,
    install_excepthook,
)
from lm_eval_ponder.files import check_output

MODEL = "ponder"
CONFIG_ATTR = "_lm_eval_ponder_config"  # the EvaluatorConfig, kept on lm-eval's namespace


def check_batch_size(value: Any) -> None:
    """``--batch_size``/``batch_size=``: a positive integer, ``auto`` or ``auto:N`` (N > 0), as
    HFLM reads it, refused by name before HFLM's ``int()`` fails in a traceback (``abc``) or a
    size below 1 is taken (``0`` made ``generation=hf`` hand lm-eval no answers)."""
    text = str(value).strip().lower()
    head, _, schedule = text.partition(":")
    try:
        good = float(schedule) > 0 if head == "auto" and schedule else \
            head == "auto" or int(text) >= 1
    except ValueError:
        good = False
    if not good:
        raise PonderError(f"batch_size={value!r} is not a positive integer or auto: pass e.g. "
                          "--batch_size auto (--model ponder keeps max_rows rows in flight "
                          "whatever the batch size)")


def check_config(cfg: Any) -> None:
    """What lm-eval read for a ``ponder`` run, checked before anything loads."""
    if cfg.output_path:
        out = Path(cfg.output_path)
        check_output(out, "--output_path", out.parent if out.suffix == ".json" else None)
    if cfg.num_fewshot is not None and int(cfg.num_fewshot) < 0:
        raise PonderError(f"--num_fewshot {cfg.num_fewshot} is negative: pass 0 (no examples) "
                          "or a positive number of examples")
    check_batch_size(cfg.batch_size)


def checked_from_cli(original):
    """``EvaluatorConfig.from_cli`` (a classmethod's function), checking a ponder run's
    config and keeping it on the namespace for ``run_execute``."""
    if getattr(original, "_lm_eval_ponder", False):
        return original

    @functools.wraps(original)
    def from_cli(cls, namespace):
        cfg = original(cls, namespace)
        if cfg.model == MODEL:
            install_excepthook()
            setattr(namespace, CONFIG_ATTR, cfg)
            check_config(cfg)
        return cfg

    from_cli._lm_eval_ponder = True  # type: ignore[attr-defined]
    return from_cli


def command_line() -> str:
    """The command as the user typed it (``python -m lm_eval`` for lm-eval's ``__main__``)."""
    name = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "lm_eval"
    program = "python -m lm_eval" if name == "__main__.py" else name
    return " ".join([program, shlex.join(sys.argv[1:])])


def resume_text(cfg: Any) -> str:
    """What ``--use_cache`` kept, and the command that resumes the run (the same command;
    ``--use_cache PATH`` added where none was given, so a next stop keeps its answers)."""
    if cfg is None:
        return f"Run it again with: {command_line()}"
    if cfg.use_cache:
        from lm_eval_ponder.evaluation.resume import kept_answers

        db = f"{cfg.use_cache}_rank0.db"
        return (f"{kept_answers(db)} answers kept in {db}; Resume with: {command_line()} "
                "(the kept answers are not generated again)")
    out = Path(cfg.output_path or ".")
    cache = (out.parent if out.suffix == ".json" else out) / "answers"
    return (f"no answer was kept (no --use_cache); run it again, with --use_cache so that "
            f"answers are kept as they come: {command_line()} --use_cache "
            f"{shlex.quote(str(cache))}")


def stopped_line(exc: KeyboardInterrupt, cfg: Any) -> str:
    where = str(exc) if isinstance(exc, Interrupted) else ""
    return "; ".join(part for part in (STOPPED, where, resume_text(cfg)) if part)


def run_execute(original):
    """``Run._execute`` ending a ponder run as our commands end (module docstring)."""
    if getattr(original, "_lm_eval_ponder", False):
        return original

    @functools.wraps(original)
    def execute(args):
        try:
            return original(args)
        except PonderError as exc:
            close_progress_bars()
            print(f"{PREFIX}{exc}", file=sys.stderr)
            sys.exit(1)
        except KeyboardInterrupt as exc:
            cfg = getattr(args, CONFIG_ATTR, None)
            if cfg is None and not isinstance(exc, Interrupted):
                raise  # not a ponder run: lm-eval's own ending
            close_progress_bars()
            print(stopped_line(exc, cfg), file=sys.stderr)
            sys.exit(INTERRUPTED)

    execute._lm_eval_ponder = True  # type: ignore[attr-defined]
    return execute


def install(run_module: Any) -> None:
    """Wrap ``Run._execute`` of ``lm_eval._cli.run`` and ``EvaluatorConfig.from_cli``
    (idempotent)."""
    from lm_eval.config.evaluate_config import EvaluatorConfig

    run = run_module.Run
    run._execute = staticmethod(run_execute(run.__dict__["_execute"].__func__))
    EvaluatorConfig.from_cli = classmethod(
        checked_from_cli(EvaluatorConfig.__dict__["from_cli"].__func__))
