"""Per-row accounting (lm_eval_ponder.generation.accounting): generated-token counts, the
GenerationText that carries stats through lm-eval (and its cache), and their aggregation."""

from __future__ import annotations

import math
import pickle

from lm_eval_ponder.generation.accounting import (
    GenerationText,
    count_generated_tokens,
    count_text_tokens,
    response_stats,
)


def test_count_generated_tokens_eos_and_stop():
    decode = lambda toks: "".join(chr(t) for t in toks)  # noqa: E731
    toks = [ord(c) for c in "abc###def"]
    assert count_generated_tokens(decode, toks, ["###"], eos_ids=[]) == 6
    assert count_generated_tokens(decode, toks, [], eos_ids=[ord("c")]) == 3
    assert count_generated_tokens(decode, toks, ["zz"], eos_ids=[]) == 9
    assert count_generated_tokens(decode, [], ["x"], eos_ids=[]) == 0


def test_count_text_tokens_adds_the_lost_eos_and_caps_at_max_gen_toks():
    """Re-counting a bare response (--model hf/vllm) the way ponder counts: its tokens plus the
    EOS the text no longer shows, but never more than max_gen_toks (a cut row had no EOS)."""
    from conftest import build_tiny_tokenizer

    tok = build_tiny_tokenizer()  # one token per character
    assert count_text_tokens(tok, "12 + 3") == 7
    assert count_text_tokens(tok, "12 + 3", max_gen_toks=6) == 6
    assert count_text_tokens(tok, "") == 1


def test_generation_text_pickles_and_stats_aggregate():
    text = GenerationText("42", {"gen_tokens": 3, "flops": 10.0, "ponder_steps": 2.0})
    back = pickle.loads(pickle.dumps(text))
    assert back == "42" and back.stats == text.stats
    two = response_stats([text, GenerationText("1", {"gen_tokens": 5, "flops": 1.0})])
    assert two == {"gen_tokens": 8.0, "flops": 11.0, "ponder_steps": 1.0}
    assert math.isnan(response_stats(["plain string"])["flops"])


def test_exit_layer_reaches_the_samples_of_early_exit_runs_only():
    """Early-exit rows carry ``exit_layer`` (averaged over a document's responses); any other
    run's samples keep exactly their keys."""
    a = GenerationText("1", {"gen_tokens": 3, "flops": 1.0, "ponder_steps": 0.0,
                             "exit_layer": 20.0})
    b = GenerationText("2", {"gen_tokens": 1, "flops": 1.0, "ponder_steps": 0.0,
                             "exit_layer": 30.0})
    assert response_stats([a, b])["exit_layer"] == 25.0
    plain = GenerationText("3", {"gen_tokens": 1, "flops": 1.0, "ponder_steps": 0.0})
    assert set(response_stats([plain])) == {"gen_tokens", "flops", "ponder_steps"}
    assert "exit_layer" not in response_stats([a, plain])


def test_old_use_cache_pickles_still_open():
    """lm-eval's --use_cache pickles our texts; files written before the layout move name the
    class ``lm_eval_ponder.stats.GenerationText`` and must still unpickle with their stats."""
    old = (b"\x80\x04\x95F\x00\x00\x00\x00\x00\x00\x00\x8c\x14lm_eval_ponder.stats\x94\x8c"
           b"\x0eGenerationText\x94\x93\x94\x8c\x02hi\x94}\x94\x8c\ngen_tokens\x94K\x03s"
           b"\x86\x94R\x94.")  # pickle.dumps of the old class, protocol 4
    text = pickle.loads(old)
    assert isinstance(text, GenerationText) and text == "hi" and text.stats == {"gen_tokens": 3}
    assert pickle.loads(pickle.dumps(text)).stats == {"gen_tokens": 3}
