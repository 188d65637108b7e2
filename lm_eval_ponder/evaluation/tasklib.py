"""What every ``*_ponder`` task shares: prompts, dataset loading for lm-eval, grading, metrics.

Each dataset folder under ``tasks/`` has a thin ``utils.py`` that binds these functions to its
dataset's row of ``registry`` (its answer kind picks the prompt's answer format and the
grader), as lm-eval's own tasks do; the logic lives here once so the twelve tasks cannot drift
apart.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from lm_eval_ponder import data, registry
from lm_eval_ponder.evaluation import grading
from lm_eval_ponder.evaluation.accounting import response_stats

# The paper's two prompts (Experiments: "Please solve the math problem" + question).
PLAIN_PROMPT = "Please solve the math problem: "
COT_PROMPT = "Please solve the math problem step by step: "
# MATH500 graders need a boxed answer and GPQA a letter: the prompt says so (documented choice).
BOXED_SUFFIX = "\nPut your final answer in \\boxed{}."
CHOICE_SUFFIX = "\nEnd your reply with \"The answer is (X)\", where X is A, B, C or D."
# What the prompt asks of each answer kind (``registry.Dataset.answer``): its suffix, and
# whether the choices are listed.
ANSWER_PROMPTS = {"numeric": ("", False), "math": (BOXED_SUFFIX, False),
                  "choice": (CHOICE_SUFFIX, True)}


def _dataset_dict(**splits):
    import datasets

    return datasets.DatasetDict(splits)


# ---------------------------------------------------------------- datasets (custom_dataset)
def gsm8k_dataset(**_: object):
    return _dataset_dict(test=data.load_gsm8k("test"))


def math500_dataset(**_: object):
    return _dataset_dict(test=data.load_math500())


def gpqa_dataset(**_: object):
    return _dataset_dict(test=data.process_gpqa(data.load_gpqa_diamond()))


def arith_dataset(per_level: int = 100, **_: object):
    return _dataset_dict(
        train=data.load_arith("train", per_level=per_level),
        test=data.load_arith("test", per_level=per_level),
    )


# ---------------------------------------------------------------- prompts
def question_text(doc: dict) -> str:
    return doc.get("question") or doc.get("problem") or ""


def choices_text(doc: dict) -> str:
    letters = "ABCD"
    lines = [f"({letters[i]}) {choice}" for i, choice in enumerate(doc["choices"])]
    return "\n" + "\n".join(lines)


def make_prompt(prefix: str, suffix: str = "", with_choices: bool = False) -> Callable[[dict], str]:
    def doc_to_text(doc: dict) -> str:
        body = question_text(doc) + (choices_text(doc) if with_choices else "")
        return prefix + body + suffix

    return doc_to_text


def dataset_prompt(prefix: str, dataset: registry.Dataset) -> Callable[[dict], str]:
    """A dataset's prompt: ``prefix``, the question, and what its answer kind asks for."""
    suffix, with_choices = ANSWER_PROMPTS[dataset.answer]
    return make_prompt(prefix, suffix, with_choices=with_choices)


def gsm8k_gold(doc: dict) -> str:
    return grading.extract_numeric(doc["answer"]) or ""


# ---------------------------------------------------------------- results
def score(kind: str, doc: dict, results: Sequence, gold: str) -> dict[str, float]:
    """Metrics of one document. ``results`` holds one response, or all N of Best-of-N (the
    identity filter keeps every repeat), which are majority-voted over extracted answers."""
    responses = list(results[0]) if results and isinstance(results[0], list) else list(results)
    responses = [r if isinstance(r, str) else "" for r in responses]
    if len(responses) == 1:
        correct, _ = grading.grade(kind, responses[0], gold)
    else:
        voted = grading.majority_vote(kind, responses)
        correct = voted is not None and grading.grade(kind, _as_answer(kind, voted), gold)[0]
    return {"exact_match": float(correct), **response_stats(responses)}


def _as_answer(kind: str, canonical: str) -> str:
    """Wrap a canonical answer so ``grade`` re-extracts exactly it."""
    if kind == "math":
        return f"\\boxed{{{canonical}}}"
    if kind == "choice":
        return f"The answer is ({canonical})"
    return f"The answer is {canonical}"


def keep_all(resps, docs):
    """Identity filter: keep every repeat so Best-of-N can vote and count all N samples."""
    return resps
