"""The one table of datasets and the one table of methods that every stage reads.

Why a registry. Which datasets the suite runs, how their answers are graded, which of them
have a training split, which may never be published, and in which order a report shows them
were written down four times (suite, report, the rollout cache, the tasks' bindings), and a
method's task suffix twice as two inverse maps. A fact kept in several places drifts: a fifth
dataset added to one list and not to another would run but never be reported, or be published
though its authors forbid it. Here each fact is one field of one row, and every other module
derives what it needs from these rows (``tests/test_registry.py`` checks the rows against the
``tasks/`` folders and the suite YAML, which cannot import Python).

A foundation: it imports nothing of the package, so every stage may read it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TypeVar

Row = TypeVar("Row")

# Every task of ours is named ``<dataset>_ponder<suffix>`` (tasks/<dataset>/*.yaml).
TASK_INFIX = "_ponder"


@dataclass(frozen=True)
class Dataset:
    """One benchmark: a folder under ``tasks/`` holding one task per baseline's prompt
    (``task_name``).

    ``answer`` is the grading kind (``scoring.grading.KINDS``): it picks the grader, what
    the prompt asks for (``scoring.tasklib``) and how a Best-of-N vote compares answers.
    ``train_split``: a controller may train on it (``training.rollouts`` never trains on a
    test split, and MATH500 and GPQA Diamond have no other). ``publishable``: its question
    text may leave this machine (GPQA's authors ask that its questions never appear in plain
    text on the web, so its answers are never exported for committing and never quoted on a
    report page). ``synthetic``: our own generated data, whose documents, prompts and answers a
    committed compact log may keep whole (``reporting.compact``). ``test_size``: questions in
    the test split (``reporting.budget`` prices a run with it; tests check it against the
    loaders).
    """

    name: str
    answer: str
    test_size: int
    train_split: bool = False
    publishable: bool = True
    synthetic: bool = False


# In Table 1's column order: our arithmetic ladder, then the paper's GSM8K, MATH500, GPQA.
DATASETS: tuple[Dataset, ...] = (
    Dataset("arith", answer="numeric", test_size=500, train_split=True, synthetic=True),
    Dataset("gsm8k", answer="numeric", test_size=1319, train_split=True),
    Dataset("math500", answer="math", test_size=500),
    Dataset("gpqa", answer="choice", test_size=198, publishable=False),
)
DATASET_NAMES: tuple[str, ...] = tuple(d.name for d in DATASETS)
# Datasets whose text never leaves this machine: no export of kept answers, no quoted case.
UNPUBLISHED: frozenset[str] = frozenset(d.name for d in DATASETS if not d.publishable)


def row(table: Mapping[str, Row], key: str, what: str) -> Row:
    """``table[key]``, or a ``KeyError`` that names the known keys (a typo in a task's
    ``utils.py`` or a caller then says what it could have meant)."""
    if key not in table:
        raise KeyError(f"unknown {what} {key!r}; known: {list(table)}")
    return table[key]


def dataset(name: str) -> Dataset:
    """The registry's row of a dataset."""
    return row({d.name: d for d in DATASETS}, name, "dataset")


def publishable(name: str) -> bool:
    """Whether a dataset's text may be exported or quoted. A dataset outside the registry
    (another lm-eval task a report was given) is not ours to restrict."""
    return name not in UNPUBLISHED


def dataset_order(names: Iterable[str]) -> list[str]:
    """The datasets in Table 1's order (unknown ones alphabetically after the known)."""
    rank = {d: i for i, d in enumerate(DATASET_NAMES)}
    return sorted(set(names), key=lambda d: (rank.get(d, len(rank)), d))


@dataclass(frozen=True)
class Method:
    """One method of Table 1 as the suite runs it.

    ``suffix`` names the task it runs (``task_name``): the prompt of its baseline, the
    method of ``model == "none"`` with the same suffix (FR and FP-Direct run Direct's prompt).
    ``model`` is what the model does on that prompt: ``none`` (the backbone as it is),
    ``alpha`` (a fixed steering offset, FR), ``controller`` (a trained controller picks each
    depth, FP) or ``early_exit`` (EE, the early-exit baseline). ``samples``: Best-of-N, which
    samples by definition (its tasks decode at T = 0.7), so it is one configuration under
    every decoding. ``default``: ``suite`` runs it unless ``--methods`` says otherwise (EE is a
    sweep, one run per threshold, so it is run only when named).
    """

    label: str
    suffix: str
    model: str = "none"
    samples: bool = False
    default: bool = True

    @property
    def baseline(self) -> bool:
        """A prompting baseline: the backbone as it is, on its own prompt."""
        return self.model == "none"

    @property
    def steered(self) -> bool:
        """Whether it adds the steering vector (and so takes ``suite --steering``)."""
        return self.model in ("alpha", "controller")

    @property
    def needs_controller(self) -> bool:
        return self.model == "controller"


MODELS = ("none", "alpha", "controller", "early_exit")
# In Table 1's row order: baselines first, then FR, the FP variants, EE.
METHODS: tuple[Method, ...] = (
    Method("Direct", ""),
    Method("CoT", "_cot"),
    Method("BoN", "_bon", samples=True),
    Method("FR", "", model="alpha"),
    Method("FP-Direct", "", model="controller"),
    Method("FP-CoT", "_cot", model="controller"),
    Method("FP-BoN", "_bon", model="controller", samples=True),
    Method("EE", "", model="early_exit", default=False),
)
METHOD_LABELS: tuple[str, ...] = tuple(m.label for m in METHODS)
BASELINES: tuple[str, ...] = tuple(m.label for m in METHODS if m.baseline)


def method(label: str) -> Method:
    """The registry's row of a method."""
    return row({m.label: m for m in METHODS}, label, "method")


def base_of(label: str) -> str:
    """The baseline whose prompt a method runs: FR -> Direct, FP-CoT -> CoT, CoT -> CoT."""
    return baseline_for_suffix(method(label).suffix)


def baseline_for_suffix(suffix: str) -> str:
    """The baseline a task suffix stands for (``_cot`` -> CoT; leading underscores do not
    matter); any other suffix, the plain prompt's baseline, Direct."""
    for m in METHODS:
        if m.baseline and m.suffix.lstrip("_") == suffix.lstrip("_"):
            return m.label
    return baseline_for_suffix("")


def controlled(base: str) -> str:
    """The controller method on a baseline's prompt: Direct -> FP-Direct."""
    suffix = method(base).suffix
    return next(m.label for m in METHODS if m.needs_controller and m.suffix == suffix)


def task_name(dataset_name: str, label: str) -> str:
    """The lm-eval task a method runs on a dataset: (gsm8k, FP-CoT) -> gsm8k_ponder_cot."""
    return f"{dataset_name}{TASK_INFIX}{method(label).suffix}"


# the group task of tasks/ponder_suite.yaml: every dataset's Direct, CoT and BoN prompts
SUITE_TASK = "ponder_suite"


def task_names() -> list[str]:
    """Every task this package registers: each dataset under each baseline's prompt, and the
    suite group."""
    return [task_name(d.name, b) for d in DATASETS for b in BASELINES] + [SUITE_TASK]


def split_task(task: str) -> tuple[str, str]:
    """(dataset, baseline) of a task name, the inverse of ``task_name`` for the baselines:
    gsm8k_ponder_cot -> (gsm8k, CoT); a suffix no baseline has reads as Direct."""
    name, _, suffix = task.partition(TASK_INFIX)
    return name, baseline_for_suffix(suffix)


def dataset_of(task: str) -> str:
    """The dataset part of a task name (or of anything that starts with one)."""
    return task.partition(TASK_INFIX)[0]
