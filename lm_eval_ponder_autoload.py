"""Make ``lm_eval --model ponder --tasks gsm8k_ponder`` work with no flag and no wrapper.

lm-eval 0.4.13 discovers models only through its own registry and tasks only under
``lm_eval/tasks`` and ``--include_path``. The wheel installs ``lm_eval_ponder.pth``, whose one
line imports this module at interpreter start-up. It is a top-level module, not part of the
``lm_eval_ponder`` package, so that importing it does not pin ``lm_eval_ponder`` to the
installed copy (a source checkout on ``sys.path`` still wins). All it does then is put a tiny finder on
``sys.meta_path``; nothing of lm-eval, torch or transformers is imported (cost: well under a
millisecond; ``benchmarks/startup_cost.py`` measures it). When, and only when, a process
imports lm-eval, the finder runs our registration right after the relevant module executes
(the wrappers themselves, with a table of each, are ``lm_eval_ponder.evaluation.lmeval_patches``):

- after ``lm_eval.models`` (which lm-eval imports on the first model lookup, and whose lazy
  table must be registered first or ``--model hf`` breaks): register ``ponder`` lazily, as
  lm-eval registers its own models, so the heavy ``lm_eval_ponder.evaluation.lm`` is imported only
  when ``--model ponder`` is used;
- after ``lm_eval.tasks.manager``: every ``TaskManager`` also indexes our ``tasks`` folder
  (``lm_eval_ponder.resources.tasks_dir``), before the user's ``--include_path`` folders, so
  that theirs win;
- after ``lm_eval._cli.run`` (lm-eval's command line): a ``--model ponder`` run's
  ``--output_path`` and batch size are checked before anything loads, and its errors and
  Ctrl-C end in one line (``lm_eval_ponder.evaluation.lmeval_cli``).

Newer lm-eval releases read entry points instead; ``pyproject.toml`` declares those too. The
arrow points one way: this module imports the package (lazily), the package never imports it
(``tests/test_layout.py``).
"""

from __future__ import annotations

import importlib.machinery
import sys

MODEL_TARGET = "lm_eval_ponder.evaluation.lm:PonderLM"


def register_model() -> None:
    from lm_eval.api.registry import model_registry

    if "ponder" not in model_registry:
        model_registry.register("ponder", target=MODEL_TARGET)


def patch_task_manager(module) -> None:
    from lm_eval_ponder.evaluation import lmeval_patches

    lmeval_patches.include_our_tasks(module)


def patch_cli(module) -> None:
    from lm_eval_ponder.evaluation import lmeval_patches

    lmeval_patches.wrap_cli(module)


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
