"""Per-row accounting (lm_eval_ponder.evaluation.accounting): generated-token counts, the
GenerationText that carries stats through lm-eval (and its cache), and their aggregation."""

from __future__ import annotations

import math
import pickle

from lm_eval_ponder.evaluation.accounting import (
    GenerationText,
    count_generated_tokens,
    response_stats,
)


def test_count_generated_tokens_eos_and_stop():
    decode = lambda toks: "".join(chr(t) for t in toks)  # noqa: E731
    toks = [ord(c) for c in "abc###def"]
    assert count_generated_tokens(decode, toks, ["###"], eos_ids=[]) == 6
    assert count_generated_tokens(decode, toks, [], eos_ids=[ord("c")]) == 3
    assert count_generated_tokens(decode, toks, ["zz"], eos_ids=[]) == 9
    assert count_generated_tokens(decode, [], ["x"], eos_ids=[]) == 0


def test_generation_text_pickles_and_stats_aggregate():
    text = GenerationText("42", {"gen_tokens": 3, "flops": 10.0, "ponder_steps": 2.0})
    back = pickle.loads(pickle.dumps(text))
    assert back == "42" and back.stats == text.stats
    two = response_stats([text, GenerationText("1", {"gen_tokens": 5, "flops": 1.0})])
    assert two == {"gen_tokens": 8.0, "flops": 11.0, "ponder_steps": 1.0}
    assert math.isnan(response_stats(["plain string"])["flops"])
