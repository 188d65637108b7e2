"""The plugin as a whole: registration with lm-eval (model, tasks) by lm_eval_ponder_autoload,
and end-to-end runs through lm-eval's evaluator on a tiny random model: reproducibility,
Best-of-N accounting, metrics for every task family, unknown task names."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

INSTALLED_PTH = Path(sysconfig.get_paths()["purelib"]) / "lm_eval_ponder.pth"
ALL_TASKS = [f"{d}_ponder{v}" for d in ("gsm8k", "math500", "gpqa", "arith") for v in ("", "_cot", "_bon")]


def run_python(code: str, env: dict[str, str] | None = None) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         cwd="/", env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


@pytest.mark.skipif(not INSTALLED_PTH.exists(), reason="needs `pip install .` (installs the .pth)")
def test_registration_adds_ponder_without_breaking_hf():
    out = run_python(
        "from lm_eval.api.registry import get_model\n"
        "print(get_model('hf').__name__, get_model('ponder').__name__)"
    )
    assert out.split() == ["HFLM", "PonderLM"]


@pytest.mark.skipif(not INSTALLED_PTH.exists(), reason="needs `pip install .` (installs the .pth)")
def test_registration_indexes_our_tasks_next_to_builtin_ones():
    """Every TaskManager indexes ours beside lm-eval's; in a process that builds --model ponder
    lm-eval's own ~15,000 YAML files are parsed once (a second TaskManager reads only ours, and
    lists the same names; issue 67: other processes are left as lm-eval runs them);
    LM_EVAL_PONDER_BUILTIN_TASKS=0 (what the suite gives its runs) leaves the built-in ones out."""
    out = run_python(
        "import json, os\n"
        "import lm_eval_ponder.evaluation.lm\n"
        "from lm_eval.tasks import TaskManager, _index\n"
        "first = TaskManager()\n"
        "loads, load = [], _index.load_yaml\n"
        "_index.load_yaml = lambda *a, **k: loads.append(a) or load(*a, **k)\n"
        "again = TaskManager()\n"
        "os.environ['LM_EVAL_PONDER_BUILTIN_TASKS'] = '0'\n"
        "ours = TaskManager()\n"
        "print(json.dumps([first.all_tasks, again.all_tasks, ours.all_tasks, len(loads)]))"
    )
    first, again, ours, loads = json.loads(out)
    names = set(first)
    assert set(ALL_TASKS) <= names and "ponder_suite" in names
    assert "gsm8k" in names and len(names) > 1000  # built-in tasks still there
    assert again == first and loads < 100
    assert set(ALL_TASKS) <= set(ours) and "gsm8k" not in ours


def test_an_edited_copy_of_our_task_passed_with_include_path_is_the_one_that_runs(tmp_path):
    """Issue 66: a user who copies ``tasks/``, edits ``arith_ponder.yaml`` and passes the copy
    with ``--include_path`` got the installed file (ours came after theirs, and the later one
    wins). Theirs wins now, as over lm-eval's own tasks, and the log names both files."""
    import shutil

    from conftest import REPO

    copy = tmp_path / "mytasks"
    shutil.copytree(REPO / "tasks", copy)
    yaml = copy / "arith" / "arith_ponder.yaml"
    yaml.write_text(yaml.read_text() + "generation_kwargs:\n  until: []\n  max_gen_toks: 3\n")
    out = run_python(
        "import json, logging, os\n"
        "os.environ['LM_EVAL_PONDER_BUILTIN_TASKS'] = '0'\n"
        "seen = []\n"
        "class Keep(logging.Handler):\n"
        "    def emit(self, record): seen.append(record.getMessage())\n"
        "logging.getLogger('lm_eval').addHandler(Keep())\n"
        "from lm_eval.tasks import TaskManager\n"
        f"tm = TaskManager(include_path={str(copy)!r})\n"
        "task = tm.load_task_or_group(['arith_ponder'])['arith_ponder']\n"
        "print(json.dumps([task.config.generation_kwargs['max_gen_toks'], "
        "[m for m in seen if 'overrides' in m]]))")
    max_toks, warnings = json.loads(out.strip().splitlines()[-1])
    assert max_toks == 3
    assert any(str(yaml) in m and "arith_ponder" in m for m in warnings), warnings


def outside_checkout_env() -> dict[str, str]:
    """The environment of a process started outside the checkout: no PYTHONPATH that puts a
    source tree first."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def imported_from_outside_checkout() -> str:
    """Where ``lm_eval_ponder`` comes from for a process outside the checkout: the wheel's copy
    in purelib after ``pip install .``, the source tree after ``pip install -e .`` (its .pth
    points there)."""
    out = subprocess.run(
        [sys.executable, "-c", "import importlib.util as u; "
         "print(list(u.find_spec('lm_eval_ponder').submodule_search_locations)[0])"],
        capture_output=True, text=True, timeout=60, cwd="/", env=outside_checkout_env())
    return out.stdout.strip() if out.returncode == 0 else ""


def installed_as_wheel() -> bool:
    return INSTALLED_PTH.exists() and imported_from_outside_checkout().startswith(
        str(INSTALLED_PTH.parent))


@pytest.mark.skipif(not installed_as_wheel(),
                    reason="needs `pip install .` (not -e): the wheel's own tasks and controllers")
def test_installed_package_ships_tasks_and_controllers():
    """Outside the checkout, tasks/ and controllers/ come from the installed wheel. Run without
    PYTHONPATH: a source tree first on the path (or ``pip install -e``) would serve its own."""
    out = run_python(
        "import lm_eval_ponder.resources as r\n"
        "print(r.tasks_dir()); print(r.shipped_dir('controllers'))",
        env=outside_checkout_env(),
    )
    tasks, controllers = out.split()
    purelib = str(INSTALLED_PTH.parent)
    assert tasks.startswith(purelib) and controllers.startswith(purelib)
    assert (Path(tasks) / "gsm8k" / "gsm8k_ponder.yaml").is_file()
    assert (Path(controllers) / "smollm2-135m-instruct" / "steering.safetensors").is_file()


@pytest.mark.skipif(not INSTALLED_PTH.exists(), reason="needs `pip install .` (installs the .pth)")
def test_startup_hook_imports_nothing_heavy():
    out = run_python("import sys; print(sorted(m for m in sys.modules "
                     "if m.startswith(('lm_eval', 'torch'))))")
    assert out.strip() == "['lm_eval_ponder_autoload']"


def evaluate(model, tasks, limit=3, **kwargs):
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    from lm_eval_ponder.resources import tasks_dir

    manager = TaskManager(include_path=tasks_dir())
    return simple_evaluate(model=model, tasks=tasks, limit=limit, task_manager=manager,
                           log_samples=True, **kwargs)


@pytest.fixture(scope="module")
def tiny_ponder(tiny_model_dir):
    from lm_eval_ponder.evaluation.lm import PonderLM

    return PonderLM(pretrained=str(tiny_model_dir), batch_size=4, device="cpu")


def test_same_run_twice_gives_identical_results(tiny_ponder):
    runs = [
        evaluate(tiny_ponder, ["arith_ponder", "arith_ponder_bon"], gen_kwargs="max_gen_toks=6")
        for _ in range(2)
    ]
    first, second = ({k: r["results"][k] for k in r["results"]} for r in runs)
    assert json.dumps(first, sort_keys=True) == json.dumps(second, sort_keys=True)
    samples = [[s["resps"] for s in r["samples"]["arith_ponder_bon"]] for r in runs]
    assert samples[0] == samples[1]


def test_bon_counts_all_samples(tiny_ponder):
    result = evaluate(tiny_ponder, ["arith_ponder_bon"], limit=2, gen_kwargs="max_gen_toks=5")
    for sample in result["samples"]["arith_ponder_bon"]:
        responses = sample["resps"][0]
        assert len(responses) == 5
        assert sample["gen_tokens"] <= 5 * 5 and sample["gen_tokens"] >= 5
    assert "exact_match,bon" in result["results"]["arith_ponder_bon"]


def test_task_metrics_present_for_every_family(tiny_ponder):
    result = evaluate(tiny_ponder, ["gsm8k_ponder", "math500_ponder_cot", "gpqa_ponder"], limit=2,
                      gen_kwargs="max_gen_toks=4")
    for task in ("gsm8k_ponder", "math500_ponder_cot", "gpqa_ponder"):
        metrics = result["results"][task]
        for key in ("exact_match", "gen_tokens", "flops", "ponder_steps"):
            assert f"{key},none" in metrics
        assert metrics["flops,none"] > 0


def test_unknown_task_variant_is_a_clear_error(tmp_path):
    """Next to a real variant, only the typo is reported missing: lm-eval found our task, which it
    does only with this plugin registered (without it, both names would be listed)."""
    out = subprocess.run(
        [sys.executable, "-m", "lm_eval", "--model", "ponder", "--tasks",
         "gsm8k_ponder,gsm8k_ponder_typo", "--output_path", str(tmp_path)],
        capture_output=True, text=True, timeout=300,
    )
    assert out.returncode != 0
    assert "gsm8k_ponder_typo" in out.stderr + out.stdout
    missing = re.findall(r"Tasks not found: (.*)", out.stderr + out.stdout)
    assert missing, out.stderr[-2000:]
    assert [name.strip() for name in missing[-1].split(",")] == ["gsm8k_ponder_typo"]
