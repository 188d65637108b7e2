"""Every change to lm-eval in one module (``evaluation.lmeval_patches``, issue 67): no other
module assigns to an lm-eval attribute, each installed wrapper is that module's, and a process
that never builds ``--model ponder`` gets only the task-folder one."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

from conftest import REPO

PATCHES = REPO / "lm_eval_ponder" / "evaluation" / "lmeval_patches.py"


def lm_eval_names(tree: ast.Module) -> set[str]:
    """Names a module binds to lm-eval objects (``from lm_eval.x import Y``, ``import lm_eval``)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "lm_eval":
            names |= {a.asname or a.name for a in node.names}
        elif isinstance(node, ast.Import):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names
                      if a.name.split(".")[0] == "lm_eval"}
    return names


def root(node: ast.AST) -> str | None:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def lm_eval_assignments(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    bound = lm_eval_names(tree)
    found = []
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "setattr" and node.args:
            targets = [ast.Attribute(value=node.args[0], attr="?")]
        found += [f"{path.name}:{node.lineno}" for t in targets
                  if isinstance(t, ast.Attribute) and root(t) in bound]
    return found


def test_no_other_module_assigns_to_lm_eval():
    modules = [*sorted((REPO / "lm_eval_ponder").rglob("*.py")), REPO / "lm_eval_ponder_autoload.py"]
    assert [hit for path in modules if path != PATCHES for hit in lm_eval_assignments(path)] == []
    assert lm_eval_assignments(PATCHES)  # the check sees the patches where they are


def test_a_planted_assignment_is_caught(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text("from lm_eval.api import metrics\nimport lm_eval.evaluator as ev\n"
                       "def f():\n    metrics.mean_stderr = len\n    setattr(ev, 'x', 1)\n")
    assert lm_eval_assignments(planted) == ["planted.py:4", "planted.py:5"]


PROBE = """
import json, sys
import lm_eval._cli.run, lm_eval.tasks.manager as manager, lm_eval.api.metrics as metrics
from lm_eval.config.evaluate_config import EvaluatorConfig
from lm_eval.loggers.evaluation_tracker import GeneralConfigTracker
if sys.argv[1] == "ponder":
    import lm_eval_ponder.evaluation.lm
seen = {"TaskManager.__init__": manager.TaskManager.__init__,
        "TaskIndex.build": manager.TaskIndex.build,
        "Run._execute": lm_eval._cli.run.Run._execute,
        "EvaluatorConfig.from_cli": EvaluatorConfig.from_cli.__func__,
        "log_experiment_args": GeneralConfigTracker.log_experiment_args,
        "mean_stderr": metrics.mean_stderr}
print(json.dumps({k: f.__code__.co_filename.rsplit("/", 1)[-1] for k, f in seen.items()
                  if getattr(f, "_lm_eval_ponder", 0)}))
"""


def test_the_installed_wrappers_are_the_patch_modules_and_act_only_for_ponder():
    got = {}
    for mode in ("plain", "ponder"):
        out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True,
                             cwd=REPO, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        got[mode] = json.loads(out.stdout.strip().splitlines()[-1])
    module = "lmeval_patches.py"  # the file the wrapper's code is in (wraps copies its name)
    # any process: our task folder, and the command line's wrappers (which pass other models'
    # runs through); only with --model ponder: the index cache and the results' wrappers
    assert got["plain"] == {k: module for k in ("TaskManager.__init__", "Run._execute",
                                                "EvaluatorConfig.from_cli")}
    assert got["ponder"] == {**got["plain"], "TaskIndex.build": module,
                             "log_experiment_args": module, "mean_stderr": module}
