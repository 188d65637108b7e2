"""Make ``lm_eval --model ponder --tasks gsm8k_ponder`` work with no flag and no wrapper.

lm-eval 0.4.13 discovers models only through its own registry and tasks only under
``lm_eval/tasks`` and ``--include_path``. The wheel installs ``lm_eval_ponder.pth``, whose one
line imports this module at interpreter start-up. It is a top-level module, not part of the
``lm_eval_ponder`` package, so that importing it does not pin ``lm_eval_ponder`` to the
installed copy (a source checkout on ``sys.path`` still wins). All it does then is put a tiny finder on
``sys.meta_path``; nothing of lm-eval, torch or transformers is imported (cost: well under a
millisecond; ``benchmarks/startup_cost.py`` measures it). When, and only when, a process
imports lm-eval, the finder runs our registration right after the relevant module executes:

- after ``lm_eval.models`` (which lm-eval imports on the first model lookup, and whose lazy
  table must be registered first or ``--model hf`` breaks): register ``ponder`` lazily, as
  lm-eval registers its own models, so the heavy ``lm_eval_ponder.evaluation.lm`` is imported only
  when ``--model ponder`` is used;
- after ``lm_eval.tasks.manager``: every ``TaskManager`` also indexes our ``tasks`` folder,
  before the user's ``--include_path`` folders, so that theirs win;
- after ``lm_eval._cli.run`` (lm-eval's command line): a ``--model ponder`` run's
  ``--output_path`` and batch size are checked before anything loads, and its errors and
  Ctrl-C end in one line (``lm_eval_ponder.evaluation.lmeval_cli``).

Newer lm-eval releases read entry points instead; ``pyproject.toml`` declares those too.
"""

from __future__ import annotations

import importlib.machinery
import sys

MODEL_TARGET = "lm_eval_ponder.evaluation.lm:PonderLM"


def tasks_dir() -> str:
    """Our YAML tasks: inside the installed package, or ``tasks/`` of a source checkout."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("lm_eval_ponder")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("lm_eval_ponder is not importable")
    here = Path(list(spec.submodule_search_locations)[0]).resolve()
    for candidate in (here / "tasks", here.parent / "tasks"):
        if candidate.is_dir():
            return str(candidate)
    raise FileNotFoundError("lm_eval_ponder: tasks folder not found")


def register_model() -> None:
    from lm_eval.api.registry import model_registry

    if "ponder" not in model_registry:
        model_registry.register("ponder", target=MODEL_TARGET)


BUILTIN_TASKS_ENV = "LM_EVAL_PONDER_BUILTIN_TASKS"


def cache_builtin_index(module) -> None:
    """Build the index of lm-eval's own task folder once per process. lm-eval parses its
    ~15,000 built-in YAML files on every ``TaskManager`` (about 10 s on a 2-core CPU), and
    ``simple_evaluate`` makes one per call: a notebook or a test session that evaluates ten
    times paid that ten times for files that cannot change while it runs. Other folders (ours,
    ``--include_path``) are read afresh each time; the merge keeps lm-eval's order (later
    folders override). The factory deep-copies an entry's config before use, so sharing the
    cached entries is safe; each caller gets its own dict of copied entries all the same."""
    import copy
    from pathlib import Path

    index_class = module.TaskIndex
    if getattr(index_class.build, "_lm_eval_ponder", False):
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

    cached_build._lm_eval_ponder = True  # type: ignore[attr-defined]
    index_class.build = staticmethod(cached_build)


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


def patch_task_manager(module) -> None:
    """Every ``TaskManager`` also indexes our tasks. ``LM_EVAL_PONDER_BUILTIN_TASKS=0`` leaves
    lm-eval's built-in ones out (``python -m lm_eval_ponder.suite`` sets it for the lm_eval
    runs it starts, which only ever name ours: each run starts about 10 s sooner)."""
    import os

    cache_builtin_index(module)
    manager = module.TaskManager
    if getattr(manager.__init__, "_lm_eval_ponder", False):
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

    __init__._lm_eval_ponder = True  # type: ignore[attr-defined]
    manager.__init__ = __init__


def patch_cli(module) -> None:
    from lm_eval_ponder.evaluation import lmeval_cli

    lmeval_cli.install(module)


_AFTER = {"lm_eval.models": lambda module: register_model(),
          "lm_eval.tasks.manager": patch_task_manager,
          "lm_eval._cli.run": patch_cli}


class _Loader:
    """Runs the real loader, then our action (plain class: importlib.abc costs start-up time)."""

    def __init__(self, inner, action) -> None:
        self.inner, self.action = inner, action

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module) -> None:
        self.inner.exec_module(module)
        try:
            self.action(module)
        except Exception as error:  # never break lm-eval itself because of the plugin
            print(f"lm_eval_ponder: registration failed: {error!r}", file=sys.stderr)


class _Finder:
    def find_spec(self, fullname, path, target=None):
        action = _AFTER.get(fullname)
        if action is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _Loader(spec.loader, action)
        return spec


def install() -> None:
    """Called from ``lm_eval_ponder.pth``; also safe to call by hand (idempotent)."""
    if not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
    # lm-eval imported before us (e.g. install() called late): register directly.
    if "lm_eval.models" in sys.modules:
        register_model()
    if "lm_eval.tasks.manager" in sys.modules:
        patch_task_manager(sys.modules["lm_eval.tasks.manager"])
    if "lm_eval._cli.run" in sys.modules:
        patch_cli(sys.modules["lm_eval._cli.run"])
