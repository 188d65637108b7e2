"""Every change this package makes to lm-eval 0.4.13, in one place.

lm-eval offers a registry for models and ``--include_path`` for tasks, and nothing else a
plugin can hook: the rest is done by replacing an lm-eval function with a wrapper that calls
the original. Each wrapper is marked (``_lm_eval_ponder``) so that installing twice wraps
once, and ``tests/evaluation/test_lmeval_patches.py`` fails if any other module of the
package assigns to an lm-eval attribute.

What each wrapper changes, why, when it is installed and which runs it acts on (lm-eval
attributes under ``lm_eval.``):

- ``tasks.manager.TaskManager.__init__``: adds our ``tasks/`` before the user's
  ``--include_path`` (so theirs win). Why: 0.4.13 finds tasks only under its own folder and
  ``--include_path``. Installed when lm-eval's task manager is imported
  (``lm_eval_ponder_autoload``). Acts on every task manager, the one exception: a ponder task
  can be asked for by any model, and lm-eval offers no other way to find it
  (``LM_EVAL_PONDER_BUILTIN_TASKS=0`` leaves lm-eval's own tasks out).
- ``tasks._index.TaskIndex.build``: indexes lm-eval's ~15,000 built-in YAML files once per
  process. Why: ``simple_evaluate`` makes a task manager per call, 10 s each on 2 cores.
  Installed when ``--model ponder`` is imported; acts on the task managers after it.
- ``_cli.run.Run._execute``: a ``PonderError`` in one line, Ctrl-C in one line with the
  command that resumes, the written results checked. Why: lm-eval logs a failed write at INFO
  and exits 0. Installed when lm-eval's CLI is imported; acts on ``--model ponder`` runs only.
- ``config.evaluate_config.EvaluatorConfig.from_cli``: ``--output_path``, ``--batch_size``,
  ``--gen_kwargs`` and ``--device`` checked before the model loads. Why: a bad flag failed
  after loading, or hours later. Installed and acting as ``Run._execute``.
- ``loggers.evaluation_tracker.GeneralConfigTracker.log_experiment_args``: the results folder
  named after the backbone. Why: without ``pretrained=`` lm-eval names it with a random id,
  with a local ``pretrained=`` after its path (a home directory in a committed folder name).
  Installed when ``--model ponder`` is imported; acts on ``ponder`` runs only.
- ``loggers.evaluation_tracker.EvaluationTracker.save_results_aggregated``: no path of this
  machine in the results JSON (``portable``). Why: results are committed and read elsewhere.
  Installed and acting as the previous one.
- ``api.metrics.mean_stderr``: FLOPs keep their type (``flops.FlopCount``) in the table.
  Why: lm-eval prints every metric with four decimals. Installed with the model; acts on FLOPs
  values only.
"""

from __future__ import annotations

import functools
from typing import Any

MARK = "_lm_eval_ponder"


def ours(function: Any) -> bool:
    """Whether ``function`` is one of these wrappers (installed already)."""
    return getattr(function, MARK, False)


def marked(function: Any) -> Any:
    setattr(function, MARK, True)
    return function


# ----------------------------------------------------------------------------- tasks

def cache_builtin_index(module) -> None:
    """Build the index of lm-eval's own task folder once per process (module docstring: a
    notebook that evaluates ten times paid the 10 s ten times for files that cannot change).
    Other folders (ours, ``--include_path``) are read afresh each time; the merge keeps
    lm-eval's order (later folders override). The factory deep-copies an entry's config before
    use, so sharing the cached entries is safe; each caller gets its own dict of copies."""
    import copy
    from pathlib import Path

    index_class = module.TaskIndex
    if ours(index_class.build):
        return
    build, builtin, kept = index_class.build, Path(module.__file__).parent.resolve(), {}

    def cached_build(paths, *, resolve_includes=True):
        index: dict = {}
        for root in paths:
            if Path(root).resolve() != builtin:
                merge(index, build([root], resolve_includes=resolve_includes))
                continue
            if resolve_includes not in kept:
                kept[resolve_includes] = build([root], resolve_includes=resolve_includes)
            merge(index, {name: copy.copy(entry) for name, entry in kept[resolve_includes].items()})
        return index

    index_class.build = staticmethod(marked(cached_build))


def merge(index: dict, entries: dict) -> None:
    """Add one folder's task entries to ``index``, later folders winning, with lm-eval's own
    warning naming both files when a name is defined twice (its ``TaskIndex.build`` warns so,
    and a folder-by-folder build must not lose that line)."""
    import logging

    for name, entry in entries.items():
        if name in index and getattr(index[name], "yaml_path", None) != getattr(entry, "yaml_path", None):
            logging.getLogger("lm_eval.tasks._index").warning(
                "Task '%s' from %s overrides existing task from %s", name,
                getattr(entry, "yaml_path", "?"), getattr(index[name], "yaml_path", "?"))
        index[name] = entry


def include_our_tasks(module) -> None:
    """Every ``TaskManager`` (of ``module``, ``lm_eval.tasks.manager``) also indexes our
    tasks. ``LM_EVAL_PONDER_BUILTIN_TASKS=0`` leaves lm-eval's built-in ones out (``python -m
    lm_eval_ponder.suite`` sets it for the lm_eval runs it starts, which only ever name ours:
    each run starts about 10 s sooner)."""
    import os

    from lm_eval_ponder.resources import BUILTIN_TASKS_ENV, tasks_dir

    manager = module.TaskManager
    if ours(manager.__init__):
        return
    original = manager.__init__

    def __init__(self, *args, include_path=None, **kwargs):
        if os.environ.get(BUILTIN_TASKS_ENV) == "0" and not args:
            kwargs.setdefault("include_defaults", False)
        paths = [] if include_path is None else (
            list(include_path) if isinstance(include_path, (list, tuple)) else [include_path]
        )
        ours = tasks_dir()
        if ours not in [str(p) for p in paths]:
            # first, so that a user's folder (later) overrides a task of ours of the same
            # name, as it overrides lm-eval's own: an edited copy of arith_ponder.yaml passed
            # with --include_path is the one that runs
            paths.insert(0, ours)
        original(self, *args, include_path=paths, **kwargs)

    manager.__init__ = marked(__init__)


# ----------------------------------------------------------------------------- the command line
def checked_from_cli(original):
    """``EvaluatorConfig.from_cli`` (a classmethod's function), checking a ponder run's
    config and keeping it on the namespace for ``run_execute``."""
    from lm_eval_ponder.errors import install_excepthook
    from lm_eval_ponder.evaluation.lmeval_cli import CONFIG_ATTR, MODEL, check_config

    if ours(original):
        return original

    @functools.wraps(original)
    def from_cli(cls, namespace):
        cfg = original(cls, namespace)
        if cfg.model == MODEL:
            install_excepthook()
            setattr(namespace, CONFIG_ATTR, cfg)
            check_config(cfg)
        return cfg

    return marked(from_cli)


def run_execute(original):
    """``Run._execute`` ending a ponder run as our commands end (``evaluation.lmeval_cli``)."""
    import os
    import sys
    import time
    from pathlib import Path

    from lm_eval_ponder.errors import (
        INTERRUPTED,
        PREFIX,
        Interrupted,
        PonderError,
        close_progress_bars,
        terminate_as_interrupt,
    )
    from lm_eval_ponder.evaluation.lmeval_cli import CONFIG_ATTR, check_written, stopped_line

    if ours(original):
        return original

    @functools.wraps(original)
    def execute(args):
        started = time.time()
        try:
            with terminate_as_interrupt():
                returned = original(args)
            cfg = getattr(args, CONFIG_ATTR, None)
            # rank 0 writes (lm-eval gathers every rank's samples there)
            if cfg is not None and cfg.output_path and os.environ.get("RANK", "0") == "0":
                check_written(Path(cfg.output_path), started, bool(cfg.log_samples))
            return returned
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

    return marked(execute)


def wrap_cli(run_module: Any) -> None:
    """Wrap ``Run._execute`` of ``lm_eval._cli.run`` and ``EvaluatorConfig.from_cli``
    (idempotent)."""
    from lm_eval.config.evaluate_config import EvaluatorConfig

    run = run_module.Run
    run._execute = staticmethod(run_execute(run.__dict__["_execute"].__func__))
    EvaluatorConfig.from_cli = classmethod(
        checked_from_cli(EvaluatorConfig.__dict__["from_cli"].__func__))


# ----------------------------------------------------------------------------- the results
def name_results_after_the_backbone() -> None:
    """Wrap ``GeneralConfigTracker.log_experiment_args`` (idempotent): a ``ponder`` run is
    named after its backbone (``ponder_model_name``), never a random id or a local path."""
    from lm_eval.loggers.evaluation_tracker import GeneralConfigTracker
    from lm_eval.utils import sanitize_model_name

    from lm_eval_ponder.evaluation.lmeval_output import MODEL, ponder_model_name

    original = GeneralConfigTracker.log_experiment_args
    if ours(original):
        return

    @functools.wraps(original)
    def log_experiment_args(self, model_source, model_args, *args, **kwargs):
        original(self, model_source, model_args, *args, **kwargs)
        if model_source == MODEL:
            self.model_name = ponder_model_name(model_args)
            self.model_name_sanitized = sanitize_model_name(self.model_name)

    GeneralConfigTracker.log_experiment_args = marked(log_experiment_args)


def write_portable_results() -> None:
    """Wrap ``EvaluationTracker.save_results_aggregated`` (idempotent): a ``ponder`` run's
    results JSON holds no path of this machine (``portable.portable_record``: model args,
    the tasks' ``config_source``, the answer cache)."""
    from lm_eval.loggers.evaluation_tracker import EvaluationTracker

    from lm_eval_ponder.evaluation.lmeval_output import MODEL
    from lm_eval_ponder.portable import portable_record

    original = EvaluationTracker.save_results_aggregated
    if ours(original):
        return

    @functools.wraps(original)
    def save_results_aggregated(self, results, *args, **kwargs):
        if (results.get("config") or {}).get("model") == MODEL:
            results = portable_record(results)
        return original(self, results, *args, **kwargs)

    EvaluationTracker.save_results_aggregated = marked(save_results_aggregated)


def keep_flops_readable() -> None:
    """Wrap lm-eval's ``mean_stderr`` (idempotent) so that the standard error of FLOPs values
    is a ``FlopCount`` too, and its table shows both readably."""
    from lm_eval.api import metrics

    from lm_eval_ponder.flops import FlopCount

    original = metrics.mean_stderr
    if ours(original):
        return

    @functools.wraps(original)
    def mean_stderr(arr):
        result = original(arr)
        return FlopCount(result) if arr and isinstance(arr[0], FlopCount) else result

    metrics.mean_stderr = marked(mean_stderr)


def install_for_the_model() -> None:
    """The patches that serve ``--model ponder`` runs, installed when ``evaluation.lm`` is
    imported (lm-eval imports it to build the model, before it logs the run's arguments)."""
    from lm_eval.tasks import manager

    cache_builtin_index(manager)
    name_results_after_the_backbone()
    write_portable_results()
    keep_flops_readable()
