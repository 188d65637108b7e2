"""Our seams in lm-eval's command line (``lm_eval``, ``lm_eval run``, ``python -m lm_eval``),
for ``--model ponder`` runs: what is checked before anything loads, and how a run ends.

Why (docs/design/lm-eval.md, "lm-eval's command line"): lm-eval 0.4.13 writes results only
after the whole evaluation, and a folder it cannot write then costs the run (one INFO line,
exit status 0); Ctrl-C ends in a traceback of whatever frame it landed in. So ``check_config``
checks what lm-eval read (``EvaluatorConfig.from_cli``) before the model loads, and the wrapped
``Run._execute`` ends a run as our commands end: a ``PonderError`` in one line (status 1),
Ctrl-C in one line saying where generation stopped, what ``--use_cache`` kept and the command
that resumes the run (status 130), written results checked (``check_written``). The wrappers
are ``evaluation.lmeval_patches``' (installed by ``lm_eval_ponder_autoload`` when
``lm_eval._cli.run`` is imported); other models' runs are left as lm-eval runs them.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any

from lm_eval_ponder import errors
from lm_eval_ponder.errors import PonderError
from lm_eval_ponder.files import check_output

MODEL = "ponder"
# sampling settings of --gen_kwargs that must be numbers (temperature=abc failed in a traceback)
NUMERIC_GEN_KWARGS = ("temperature", "top_p", "top_k", "min_p")
CONFIG_ATTR = "_lm_eval_ponder_config"  # the EvaluatorConfig, kept on lm-eval's namespace
MIN_FREE_MIB = 64  # what a run's results and samples logs may take, refused below it


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
        check_free_space(out.parent if out.suffix == ".json" else out)
    if cfg.num_fewshot is not None and int(cfg.num_fewshot) < 0:
        raise PonderError(f"--num_fewshot {cfg.num_fewshot} is negative: pass 0 (no examples) "
                          "or a positive number of examples")
    if getattr(cfg, "use_cache", None):  # lm-eval writes <use_cache>_rank<r>.db beside it
        cache = Path(cfg.use_cache)
        check_output(cache, "--use_cache", cache.parent)
    if getattr(cfg, "limit", None) is not None and float(cfg.limit) < 0:
        raise PonderError(f"--limit {cfg.limit:g} is negative: pass a number of documents per "
                          "task (or a fraction below 1), or leave it out for all")
    check_tasks(getattr(cfg, "tasks", None), getattr(cfg, "include_path", None))
    check_batch_size(cfg.batch_size)
    check_gen_kwargs(cfg.gen_kwargs)
    cfg.device = cli_device(cfg.device)


def check_tasks(tasks: Any, include_path: Any) -> None:
    """A task name that is one of ours but for its case (``ARITH_PONDER``), or one letter off
    (``arith_pondr``), refused with the name meant; lm-eval's own error for it was a traceback
    listing thousands of tasks. A name near ours is let through when ``--include_path`` may
    hold it (a user's own task)."""
    import difflib

    from lm_eval_ponder import registry

    if not tasks:
        return
    names = [t.strip() for t in (tasks.split(",") if isinstance(tasks, str) else tasks)
             if isinstance(t, str) and t.strip()]
    ours = registry.task_names()
    lower = {name.lower(): name for name in ours}
    for name in names:
        if name in ours:
            continue
        if name.lower() in lower:
            raise PonderError(f"--tasks {name}: task names are case-sensitive; did you mean "
                              f"{lower[name.lower()]}?")
        close = difflib.get_close_matches(name, ours, n=3, cutoff=0.9)
        if close and not include_path:
            raise PonderError(f"--tasks {name}: no such task; did you mean "
                              f"{' or '.join(close)}? (ours: {', '.join(ours)})")


def check_free_space(folder: Path) -> None:
    """Refuse, before the model loads, an ``--output_path`` on a disk with almost no room: the
    results would be written only after the whole run, and lost (``check_written``)."""
    import shutil

    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    free = shutil.disk_usage(existing).free / 2**20
    if free < MIN_FREE_MIB:
        raise PonderError(f"--output_path {folder}: {free:.0f} MiB free on its disk, under the "
                          f"{MIN_FREE_MIB} MiB a run's results and samples may need; free space "
                          "or pass another --output_path")


def check_gen_kwargs(gen_kwargs: Any) -> None:
    """``--gen_kwargs``' ``max_gen_toks``, a positive integer, before the model loads."""
    from lm_eval.utils import simple_parse_args_string

    from lm_eval_ponder.evaluation.requests import checked_max_gen_toks

    if not gen_kwargs:
        return
    kwargs = simple_parse_args_string(gen_kwargs) if isinstance(gen_kwargs, str) else dict(gen_kwargs)
    if "max_gen_toks" in kwargs:
        checked_max_gen_toks(kwargs["max_gen_toks"])
    for key in NUMERIC_GEN_KWARGS:
        value = kwargs.get(key)
        if value is None or isinstance(value, bool):
            continue
        try:
            good = float(value) >= 0
        except (TypeError, ValueError):
            good = False
        if not good:
            raise PonderError(f"--gen_kwargs {key}={value} is not a number >= 0: pass e.g. "
                              f"{key}=0.7")


def cli_device(device: Any) -> Any:
    """lm-eval's ``--device`` default is ``cuda:0`` whatever the machine, and it records that
    value as the run's ``config.device``: every CPU run said ``cuda:0``. Without CUDA that
    default (or a bare ``cuda``) becomes ``cpu``, which is where HFLM and ``PonderLM`` load
    the model anyway; an explicit other CUDA device is left for ``PonderLM`` to refuse."""
    import torch

    if device in (None, "cuda", "cuda:0") and not torch.cuda.is_available():
        return "cpu"
    return device


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
    """The stopped command's line (``errors.stopped_line``) and the command that resumes it."""
    return "; ".join(part for part in (errors.stopped_line(exc), resume_text(cfg)) if part)


def check_written(output: Path, since: float, samples: bool) -> None:
    """lm-eval writes its results and samples after the whole run and only logs a failure to
    write them (an ``OSError`` at INFO: a full disk left 0-byte files and exit status 0). Each
    file this run wrote under ``output`` must be whole: the results JSON parses and names its
    tasks, every samples line parses. One line names the first that is not, and the run ends
    with status 1."""
    folder = output.parent if output.suffix == ".json" else output
    results = [p for p in folder.rglob("results_*.json") if p.stat().st_mtime >= since - 1] \
        if folder.is_dir() else []
    if output.suffix == ".json" and output.is_file() and output.stat().st_mtime >= since - 1:
        results.append(output)
    if not results:
        raise PonderError(f"lm-eval wrote no results file under {folder}: a full disk or a "
                          "failed write (lm-eval only logs it); free space and run again")
    for path in results:
        problem = _json_problem(path)
        if problem:
            raise PonderError(f"{path} is {problem}: lm-eval could not write it whole (a "
                              "full disk?); free space and run again")
        if not samples:
            continue
        stamp = path.stem[len("results_"):]
        for log in path.parent.glob(f"samples_*_{stamp}.jsonl"):
            # JSON Lines end at "\n" only: str.splitlines() also splits at U+2028, U+0085 and
            # the like, which json.dumps leaves raw inside strings (lm-eval's GPQA has them).
            # An empty file is one empty line, which is reported.
            lines = log.read_text(errors="replace").removesuffix("\n").split("\n")
            for number, line in enumerate(lines, 1):
                if _json_problem(None, line):
                    raise PonderError(f"{log} line {number} is not whole JSON: lm-eval could not "
                                      "write its samples (a full disk?); free space and run again")


def _json_problem(path: Path | None, text: str | None = None) -> str | None:
    """What is wrong with a JSON document (a file's, or ``text``), or None."""
    try:
        text = path.read_text() if path is not None else text
    except OSError as error:
        return f"unreadable ({error.strerror})"
    if not text or not text.strip():
        return "empty"
    try:
        json.loads(text)
    except ValueError:
        return "cut short (not whole JSON)"
    return None
