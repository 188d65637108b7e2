"""lm_eval_ponder.registry: the one table of datasets and of methods agrees with the files that
cannot import it (the ``tasks/`` folders, their YAML, the suite group) and with every module
that reads it; its suffix maps are inverse; GPQA is never published."""

from __future__ import annotations

import importlib.util
import re
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
    from lm_eval_ponder.evaluation import grading, tasklib

    kinds = {d.answer for d in registry.DATASETS}
    assert kinds <= set(grading.KINDS) and kinds <= set(tasklib.ANSWER_PROMPTS)
    assert {m.model for m in registry.METHODS} <= set(registry.MODELS)


def test_gpqa_is_never_published():
    assert registry.UNPUBLISHED == {"gpqa"}
    assert not registry.publishable("gpqa")
    assert registry.publishable("gsm8k") and registry.publishable("arith")
    assert registry.publishable("bbh")  # another lm-eval task a report was given


def test_only_datasets_with_a_train_split_train_a_controller():
    assert [d.name for d in registry.DATASETS if d.train_split] == ["arith", "gsm8k"]
    assert [d.name for d in registry.DATASETS if d.synthetic] == ["arith"]


def test_table_1_column_order():
    assert registry.DATASET_NAMES == ("arith", "gsm8k", "math500", "gpqa")
    assert registry.dataset_order(["mmlu", "gpqa", "arith", "gpqa"]) == ["arith", "gpqa", "mmlu"]


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


def test_method_flags():
    assert [m.label for m in registry.METHODS if m.needs_controller] == ["FP-Direct", "FP-CoT", "FP-BoN"]
    assert [m.label for m in registry.METHODS if m.steered] == ["FR", "FP-Direct", "FP-CoT", "FP-BoN"]
    assert [m.label for m in registry.METHODS if m.samples] == ["BoN", "FP-BoN"]
    assert [m.label for m in registry.METHODS if not m.default] == ["EE"]


def test_unknown_names_are_refused_naming_the_known():
    with pytest.raises(KeyError, match="math500"):
        registry.dataset("mmlu")
    with pytest.raises(KeyError, match="FP-CoT"):
        registry.method("FP-EE")


def test_readers_take_the_registry_tables():
    """The suite, the report's figures, the budget and the compact logs read the registry, so
    a row added there reaches them all."""
    from lm_eval_ponder.reporting import budget, compact, plots, suite

    assert suite.METHODS + suite.EXTRA_METHODS == registry.METHOD_LABELS
    assert set(plots.FAMILY_COLOURS) == set(registry.METHOD_LABELS)  # every method has a colour
    assert plots.TABLE_ORDER == registry.METHOD_LABELS
    assert plots.BASE_OF == {"FR": "Direct", "FP-Direct": "Direct", "FP-CoT": "CoT", "FP-BoN": "BoN"}
    assert list(budget.DATASET_SIZES) == list(registry.DATASET_NAMES)
    assert compact.TEXT_KEPT == {"arith"}
