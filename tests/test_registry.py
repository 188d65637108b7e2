"""lm_eval_ponder.registry: the one table of datasets and of methods agrees with the files that
cannot import it (the ``tasks/`` folders, their YAML, the suite group) and with every module
that reads it; its suffix maps are inverse; GPQA is never published."""

from __future__ import annotations

import importlib.util
import inspect
import json
import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from lm_eval_ponder import registry

TASKS = Path(__file__).resolve().parents[1] / "tasks"


def task_folders(root: Path = TASKS) -> set[str]:
    """The dataset folders of a tasks tree: those that bind tasks (a ``utils.py``)."""
    return {p.parent.name for p in root.glob("*/utils.py")}


def yaml_tasks(path: Path) -> list[str]:
    """The ``task:`` names a YAML file declares: its one name, or the items of its list."""
    text = path.read_text()
    one = re.search(r"^task:[ \t]*(\S+)[ \t]*$", text, re.M)
    return [one.group(1)] if one else re.findall(r"^\s+-\s*(\S+)\s*$", text, re.M)


def test_every_task_folder_is_a_registry_dataset_and_back():
    assert task_folders() == set(registry.DATASET_NAMES)


def test_the_folder_check_fails_on_a_folder_the_registry_lacks(tmp_path):
    for name in (*registry.DATASET_NAMES, "bbh"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "utils.py").write_text("")
    assert task_folders(tmp_path) - set(registry.DATASET_NAMES) == {"bbh"}


@pytest.mark.parametrize("dataset", registry.DATASET_NAMES)
def test_each_folder_holds_one_task_per_baseline_prompt(dataset):
    declared = sorted(t for f in (TASKS / dataset).glob("*.yaml") for t in yaml_tasks(f))
    assert declared == sorted(registry.task_name(dataset, b) for b in registry.BASELINES)


def test_the_suite_group_lists_every_task():
    expected = {registry.task_name(d, b) for d in registry.DATASET_NAMES for b in registry.BASELINES}
    listed = yaml_tasks(TASKS / "ponder_suite.yaml")
    assert len(listed) == len(set(listed)) and set(listed) == expected


@pytest.mark.parametrize("dataset", registry.DATASET_NAMES)
def test_each_folder_binds_its_own_registry_row(dataset):
    spec = importlib.util.spec_from_file_location(f"utils_{dataset}", TASKS / dataset / "utils.py")
    utils = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(utils)
    assert utils.DATASET is registry.dataset(dataset)


def test_answer_kinds_are_grading_kinds():
    from lm_eval_ponder.scoring import grading, tasklib

    kinds = {d.answer for d in registry.DATASETS}
    assert kinds <= set(grading.KINDS) and kinds <= set(tasklib.ANSWER_PROMPTS)
    assert {m.model for m in registry.METHODS} <= set(registry.MODELS)


def test_gpqa_is_never_published():
    assert registry.UNPUBLISHED == {"gpqa"}
    assert not registry.publishable("gpqa")
    assert registry.publishable("gsm8k") and registry.publishable("arith")
    assert registry.publishable("bbh")  # another lm-eval task a report was given


def loaders() -> dict[str, Callable]:
    """Each dataset's loader in ``lm_eval_ponder.data`` (``load_<name>``, ``load_gpqa_diamond``),
    found by its name: the module where the data comes from, which cannot lie about it."""
    from lm_eval_ponder import data

    found = {name: [f for key, f in vars(data).items() if key.startswith(f"load_{name}")
                    and callable(f)] for name in registry.DATASET_NAMES}
    assert all(len(f) == 1 for f in found.values()), found
    return {name: f[0] for name, f in found.items()}


def test_only_datasets_with_a_train_split_train_a_controller():
    """A dataset has a training split exactly when its loader reads one (takes ``split`` and
    returns rows for "train"), and the trainer's reader agrees: it draws prompts from those and
    refuses the others (it never trains on a test split)."""
    from lm_eval_ponder.errors import PonderError
    from lm_eval_ponder.training.rollouts import train_documents

    for name, load in loaders().items():
        reads_train = "split" in inspect.signature(load).parameters and len(load("train")) > 0
        assert registry.dataset(name).train_split == reads_train, name
        task = registry.task_name(name, "Direct")
        if reads_train:
            assert len(train_documents(task, 2)) == 2
        else:
            with pytest.raises(PonderError, match="no training split"):
                train_documents(task, 2)


def test_synthetic_datasets_are_the_ones_generated_without_a_data_source(tmp_path, monkeypatch):
    """``synthetic`` (our own generated data, kept whole in compact logs) is exactly what loads
    with no data at all: an empty data folder (no file to read, and the Hub is never asked
    once the folder is set) stops every downloaded dataset and no generated one."""
    from lm_eval_ponder.errors import PonderDataError

    monkeypatch.setenv("LM_EVAL_PONDER_DATA", str(tmp_path))
    for name, load in loaders().items():
        try:
            generated = len(load()) > 0
        except PonderDataError:
            generated = False
        assert registry.dataset(name).synthetic == generated, name


def published_table_1() -> list[str]:
    """The dataset columns of the published Table 1, in order: the leaderboard that
    ``scripts/rebuild_reports.sh`` writes as ``greedy-full`` from the committed logs."""
    script = (TASKS.parent / "scripts" / "rebuild_reports.sh").read_text()
    (folder,) = re.findall(r"^report greedy-full (\S+)", script, re.M)
    header = (TASKS.parent / folder / "leaderboard.md").read_text().splitlines()[0]
    return re.findall(r"\| (\w+) ACC", header)


def test_table_1_column_order():
    """The registry's order is the published Table 1's (the committed leaderboard of every
    method on the four datasets; the report orders its columns by the registry, so a change
    of order here without rebuilding the published tables fails); any other dataset a report
    is given comes after the known ones."""
    assert list(registry.DATASET_NAMES) == published_table_1()
    shuffled = [*reversed(registry.DATASET_NAMES), "mmlu", registry.DATASET_NAMES[0]]
    assert registry.dataset_order(shuffled) == [*registry.DATASET_NAMES, "mmlu"]


@pytest.mark.parametrize("base", registry.BASELINES)
def test_task_suffix_maps_are_inverse(base):
    for dataset in registry.DATASET_NAMES:
        assert registry.split_task(registry.task_name(dataset, base)) == (dataset, base)
    assert registry.base_of(base) == base
    assert registry.baseline_for_suffix(registry.method(base).suffix) == base


def test_every_method_runs_a_baselines_prompt():
    suffixes = [registry.method(b).suffix for b in registry.BASELINES]
    assert len(set(suffixes)) == len(suffixes)  # one baseline per suffix, or the inverse is ambiguous
    assert {m.suffix for m in registry.METHODS} == set(suffixes)
    assert {m.label: registry.base_of(m.label) for m in registry.METHODS} == {
        "Direct": "Direct", "CoT": "CoT", "BoN": "BoN", "FR": "Direct", "FP-Direct": "Direct",
        "FP-CoT": "CoT", "FP-BoN": "BoN", "EE": "Direct"}
    assert [registry.controlled(b) for b in registry.BASELINES] == ["FP-Direct", "FP-CoT", "FP-BoN"]
    assert registry.split_task("gsm8k_ponder_unknown") == ("gsm8k", "Direct")
    assert registry.task_name("gpqa", "FP-CoT") == "gpqa_ponder_cot"


def committed_runs() -> list[tuple[str, dict]]:
    """(method label, fingerprint) of every committed run of the greedy suite
    (``results/suite/greedy``, each method on each dataset): the fingerprint is what the model
    did (``evaluation.lm``): its steering vector, controller, alpha or early exit."""
    out = []
    for marker in sorted((TASKS.parent / "results" / "suite" / "greedy").glob("*/*/ponder_run.json")):
        label = json.loads(marker.read_text())["method"].split(" ")[0]  # "FR (alpha=-0.2)"
        (result,) = marker.parent.glob("*/results_*.json")
        out.append((label, json.loads(result.read_text())["config"]["ponder_fingerprint"]))
    return out


def test_method_flags():
    """Each method's flags agree with what its runs did and its tasks do: a controller chose
    the depths exactly where ``needs_controller``, the steering vector was added exactly where
    ``steered``, a fixed alpha and the early exit exactly for those models (the committed
    suite's fingerprints); its task samples exactly where ``samples`` (the tasks' YAML); the
    suite leaves out of its default exactly the methods it plans as a sweep (several runs per
    dataset: one per early-exit threshold)."""
    from lm_eval_ponder.reporting import suite_plan

    seen = set()
    for label, fingerprint in committed_runs():
        m, pondering = registry.method(label), fingerprint.get("pondering") or {}
        assert m.needs_controller == bool(pondering.get("controller")), label
        assert m.steered == bool(pondering.get("steering")), label
        assert (m.model == "alpha") == (pondering.get("alpha") is not None), label
        assert (m.model == "early_exit") == bool(fingerprint.get("early_exit")), label
        seen.add(label)
    assert seen == set(registry.METHOD_LABELS)  # every method has committed runs
    for m in registry.METHODS:
        for dataset in registry.DATASET_NAMES:
            (path,) = (TASKS / dataset).glob(f"{registry.task_name(dataset, m.label)}.yaml")
            samples = re.search(r"^\s+do_sample:\s*true\s*$", path.read_text(), re.M | re.I)
            assert m.samples == bool(samples), (m.label, path.name)
    planned = Counter(r.method for r in suite_plan.plan(
        list(registry.METHOD_LABELS), ["arith"], ["greedy"], -0.2, "ctrl"))
    assert {label for label, n in planned.items() if n > 1} == {
        m.label for m in registry.METHODS if not m.default}


def test_unknown_names_are_refused_naming_the_known():
    with pytest.raises(KeyError, match="math500"):
        registry.dataset("mmlu")
    with pytest.raises(KeyError, match="FP-CoT"):
        registry.method("FP-EE")


def test_readers_take_the_registry_tables():
    """The suite, the report's figures, the budget and the compact logs read the registry, so
    a row added there reaches them all."""
    from lm_eval_ponder.reporting import budget, compact, plots, suite_plan

    assert suite_plan.METHODS + suite_plan.EXTRA_METHODS == registry.METHOD_LABELS
    assert set(plots.FAMILY_COLOURS) == set(registry.METHOD_LABELS)  # every method has a colour
    assert plots.TABLE_ORDER == registry.METHOD_LABELS
    assert plots.BASE_OF == {"FR": "Direct", "FP-Direct": "Direct", "FP-CoT": "CoT", "FP-BoN": "BoN"}
    assert list(budget.DATASET_SIZES) == list(registry.DATASET_NAMES)
    assert compact.TEXT_KEPT == {"arith"}
