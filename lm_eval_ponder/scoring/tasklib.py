"""What every ``*_ponder`` task shares: prompts, dataset loading for lm-eval, grading, metrics.

Each dataset folder under ``tasks/`` has a thin ``utils.py`` that binds these functions to its
dataset's row of ``registry`` (its answer kind picks the prompt's answer format and the
grader), as lm-eval's own tasks do; the logic lives here once so the twelve tasks cannot drift
apart.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from lm_eval_ponder import data, registry
from lm_eval_ponder.errors import PonderError, install_excepthook
from lm_eval_ponder.generation.accounting import response_stats
from lm_eval_ponder.scoring import grading

# our tasks' errors (missing data, few-shot without a training split) are one line under any
# model, as under --model ponder
install_excepthook()

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
# lm-eval passes a task's metadata to its ``custom_dataset``: the trainer asks for the training
# split under this key (``training.rollouts.build_prompts`` renders training prompts through
# the tasks and never reads a test split), everything else gets the test split
SPLIT_KEY = "ponder_split"


def gsm8k_dataset(ponder_split: str = "test", **_: object):
    return _dataset_dict(test=data.load_gsm8k(ponder_split))


def math500_dataset(**_: object):
    return _dataset_dict(test=data.load_math500())


def gpqa_dataset(**_: object):
    return _dataset_dict(test=data.process_gpqa(data.load_gpqa_diamond()))


def arith_dataset(per_level: int = 100, ponder_split: str = "test", **_: object):
    return _dataset_dict(test=data.load_arith(ponder_split, per_level=per_level))


# ---------------------------------------------------------------- few-shot examples
def train_docs(dataset: registry.Dataset) -> list[dict]:
    """The documents few-shot examples are drawn from: the dataset's training split; a
    dataset without one (MATH500 and GPQA Diamond are test sets only) is refused, since the
    only other source is the questions being evaluated."""
    if dataset.name == "arith":
        return data.arith_ladder("train")
    if dataset.name == "gsm8k":
        return [dict(doc) for doc in data.load_gsm8k("train")]
    raise PonderError(
        f"--num_fewshot > 0 needs a training split to draw examples from, and "
        f"{dataset.name}{registry.TASK_INFIX} has none (its only split is the test set being "
        "evaluated): run it with --num_fewshot 0 (the arith and gsm8k tasks take few-shot "
        "examples from their training splits)")


def fewshot_sampler(dataset: registry.Dataset) -> type:
    """The few-shot sampler of a dataset's tasks (YAML ``fewshot_config: sampler``).

    lm-eval 0.4.13 draws few-shot examples from the task's ``fewshot_split`` and, when a task
    names none, from its test split: ``--num_fewshot 5`` put five test questions, with their
    answers, into every prompt. This sampler draws from the training split (``train_docs``),
    read only when an example is first asked for (a zero-shot run needs no training data),
    and leaves out any training question that is also one of the evaluated documents (which
    lm-eval hands the sampler when the task names no few-shot split)."""
    from lm_eval.api.samplers import ContextSampler

    class TrainSplitSampler(ContextSampler):
        def __init__(self, df=None, **kwargs) -> None:
            super().__init__(None, **kwargs)
            self.evaluated = {question_text(doc) for doc in df or ()}
            self.pool: list[dict] | None = None

        def sample(self, n: int, eval_doc=None, df=None, **kwargs):
            if n > 0 and self.pool is None:
                self.pool = [d for d in train_docs(dataset)
                             if question_text(d) not in self.evaluated]
                self.replace_df(self.pool)
            if self.pool is not None and n > len(self.pool):
                raise PonderError(f"--num_fewshot {n}: the {dataset.name} training split has "
                                  f"{len(self.pool)} examples; pass at most that many")
            return super().sample(n, **kwargs)

    TrainSplitSampler.__qualname__ = f"TrainSplitSampler[{dataset.name}]"
    return TrainSplitSampler


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
