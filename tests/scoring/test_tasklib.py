"""The shared task logic (lm_eval_ponder.scoring.tasklib): prompts, scoring of single and
Best-of-N responses (garbage included), accounting."""

from __future__ import annotations

import math

import pytest

from lm_eval_ponder.generation.accounting import GenerationText
from lm_eval_ponder.scoring import tasklib


def text(s: str, tokens: int, flops: float) -> GenerationText:
    return GenerationText(s, {"gen_tokens": tokens, "flops": flops, "ponder_steps": 0.0})


def test_prompts_follow_the_paper():
    doc = {"question": "What is 2 + 2?"}
    assert tasklib.make_prompt(tasklib.PLAIN_PROMPT)(doc) == "Please solve the math problem: What is 2 + 2?"
    assert tasklib.make_prompt(tasklib.COT_PROMPT)(doc).startswith(
        "Please solve the math problem step by step: ")
    math_doc = {"problem": "Compute $1+1$."}
    assert "\\boxed{}" in tasklib.make_prompt(tasklib.PLAIN_PROMPT, tasklib.BOXED_SUFFIX)(math_doc)


def test_choice_prompt_lists_choices_and_answer_format():
    doc = {"question": "Synthetic question?", "choices": ["w", "x", "y", "z"], "answer": "C"}
    prompt = tasklib.make_prompt(tasklib.PLAIN_PROMPT, tasklib.CHOICE_SUFFIX, with_choices=True)(doc)
    assert "(A) w\n(B) x\n(C) y\n(D) z" in prompt
    assert 'The answer is (X)' in prompt


def test_single_response_scoring_and_stats():
    metrics = tasklib.score("numeric", {}, [text("so the answer is 1,234.", 7, 100.0)], "1234")
    assert metrics == {"exact_match": 1.0, "gen_tokens": 7.0, "flops": 100.0, "ponder_steps": 0.0}


def test_best_of_n_majority_vote_and_summed_cost():
    responses = [text("The answer is 5", 3, 10.0), text("The answer is 7", 4, 20.0),
                 text("I get 7.", 5, 30.0)]
    metrics = tasklib.score("numeric", {}, [responses], "7")  # identity filter: a list per doc
    assert metrics["exact_match"] == 1.0
    assert metrics["gen_tokens"] == 12.0 and metrics["flops"] == 60.0
    wrong = tasklib.score("numeric", {}, [responses], "5")
    assert wrong["exact_match"] == 0.0


def test_best_of_n_math_and_choice_votes():
    boxed = [text("\\boxed{\\frac{1}{2}}", 1, 1.0), text("\\boxed{0.5}", 1, 1.0),
             text("\\boxed{3}", 1, 1.0)]
    assert tasklib.score("math", {}, [boxed], "\\dfrac12")["exact_match"] == 1.0
    letters = [text("The answer is (B)", 1, 1.0), text("Answer: C", 1, 1.0),
               text("The answer is (C)", 1, 1.0)]
    assert tasklib.score("choice", {}, [letters], "C")["exact_match"] == 1.0


def test_missing_stats_are_nan_not_zero():
    metrics = tasklib.score("numeric", {}, ["The answer is 4"], "4")
    assert metrics["exact_match"] == 1.0
    assert math.isnan(metrics["gen_tokens"]) and math.isnan(metrics["flops"])


@pytest.mark.parametrize("response", ["", "   ", "\x00\x01garbage###", "The answer is"])
@pytest.mark.parametrize("kind,gold", [("numeric", "42"), ("math", "\\frac{1}{2}"), ("choice", "B")])
def test_empty_or_garbage_generation_is_graded_wrong(kind, gold, response):
    metrics = tasklib.score(kind, {}, [response], gold)
    assert metrics["exact_match"] == 0.0
