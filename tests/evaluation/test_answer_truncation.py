"""The answer-truncation reading of the paper's tau (``min_top_prob``): an answer stops at its
first position whose top next-token probability is below tau, and that position's token is not
kept. Checked against a one-row reference built from ``generate``'s own logits (the engine, rows
joining), priced at one forward more than the tokens kept, refused where it cannot hold, named
in the fingerprint and the report's label."""

from __future__ import annotations

import pytest
import torch
from conftest import build_tiny_llama
from test_lm import PROMPTS, requests

from lm_eval_ponder.engine import (
    FINISH_UNSURE,
    Callbacks,
    LoopConfig,
    TopProbBelow,
    generate_rows,
)
from lm_eval_ponder.errors import PonderError
from lm_eval_ponder.evaluation.lm import PonderLM
from lm_eval_ponder.flops import generation_flops
from lm_eval_ponder.generation.settings import AnswerStops
from lm_eval_ponder.reporting.report import _label

MAX_NEW = 12
PAD = 3


def parse_min_top_prob(value, generation: str, early_exit: bool) -> float | None:
    """The ``min_top_prob`` model arg as the model reads it (None: no answer stop)."""
    stops = AnswerStops.from_model_args({"min_top_prob": value}, generation, early_exit)
    assert len(stops.rules) == len(stops.values) <= 1
    return stops.values.get("min_top_prob")


@pytest.fixture(scope="module")
def tok(left_tokenizer):
    return left_tokenizer


@pytest.fixture(scope="module")
def sharp(tok):
    """A tiny Llama whose head is sharpened so top probabilities spread over (0, 1)."""
    model = build_tiny_llama(len(tok), seed=0)
    with torch.no_grad():
        model.lm_head.weight.mul_(30.0)
    return model


def reference(model, tok, prompt: str) -> tuple[list[int], list[float]]:
    """``generate``'s greedy tokens for one unpadded prompt and, per position, the top
    probability of the raw logits it chose from (no EOS: every row runs ``MAX_NEW``)."""
    enc = tok([prompt], return_tensors="pt", add_special_tokens=False)
    out = model.generate(**enc, max_new_tokens=MAX_NEW, do_sample=False, eos_token_id=None,
                         pad_token_id=PAD, output_logits=True, return_dict_in_generate=True)
    tokens = out.sequences[0, enc.input_ids.shape[1]:].tolist()
    tops = [float(torch.softmax(step[0].float(), -1).max()) for step in out.logits]
    return tokens, tops


def pick_tau(minima: list[float]) -> float:
    """A threshold between two rows' lowest top probabilities with room on both sides, so that
    some rows stop and others do not (batching moves probabilities by ~1e-6, not 1e-3)."""
    values = sorted(minima)
    gaps = [(b - a, (a + b) / 2) for a, b in zip(values, values[1:])]
    gap, tau = max(gaps[len(gaps) // 4: 3 * len(gaps) // 4 + 1])
    assert gap > 2e-3
    return tau


def test_rows_stop_where_the_reference_says(sharp, tok):
    refs = [reference(sharp, tok, p) for p in PROMPTS]
    tau = pick_tau([min(tops) for _, tops in refs])
    expected = []
    for tokens, tops in refs:
        cut = next((k for k, top in enumerate(tops) if top < tau), None)
        expected.append((tokens if cut is None else tokens[:cut], cut is not None))
    assert any(unsure for _, unsure in expected) and not all(u for _, u in expected)
    enc = tok(PROMPTS, return_tensors="pt", padding=True, add_special_tokens=False)
    seen: dict[int, tuple[list[int], str]] = {}
    for max_rows in (None, 2):  # all rows at once, and rows joining as others stop
        result = generate_rows(
            sharp, enc.input_ids, enc.attention_mask, max_new_tokens=MAX_NEW,
            eos_token_ids={999}, pad_token_id=PAD,
            config=LoopConfig(max_rows=max_rows, stops=(TopProbBelow(tau),)),
            observers=[Callbacks(on_tokens=lambda r, t, why: seen.__setitem__(r, (t, why)))])
        width = enc.input_ids.shape[1]
        for row, (tokens, unsure) in enumerate(expected):
            n = result.gen_tokens[row]
            assert result.sequences[row, width:width + n].tolist() == tokens
            assert result.finish_reason[row] == ("unsure" if unsure else "length")
            assert seen[row] == (tokens, FINISH_UNSURE if unsure else "length")
            # the dropped token's column is padding, as after any row's end
            assert result.sequences[row, width + n:].eq(PAD).all()


def test_without_it_nothing_changes(sharp, tok):
    enc = tok(PROMPTS, return_tensors="pt", padding=True, add_special_tokens=False)
    plain = generate_rows(sharp, enc.input_ids, enc.attention_mask, max_new_tokens=MAX_NEW,
                          eos_token_ids={999}, pad_token_id=PAD)
    assert set(plain.finish_reason) == {"length"}


@pytest.mark.parametrize("value, message", [
    ("0", r"in \(0, 1\)"), ("1", r"in \(0, 1\)"), ("often", "not a finite number"),
])
def test_bad_values_are_one_line(value, message):
    with pytest.raises(PonderError, match=message):
        parse_min_top_prob(value, "loop", False)


def test_refused_where_it_cannot_hold():
    assert parse_min_top_prob(None, "hf", True) is None
    with pytest.raises(PonderError, match="generation=hf"):
        parse_min_top_prob("0.2", "hf", False)
    with pytest.raises(PonderError, match="two stopping rules"):
        parse_min_top_prob("0.2", "loop", True)
    with pytest.raises(PonderError, match="in \\(0, 1\\)"):
        TopProbBelow(1.5)


def test_lm_eval_answers_are_priced_as_run(sharp_model_dir):
    """Through ``generate_until``: an answer it stopped ran one forward more than it kept, and
    is priced so; the others are priced as Direct's; the fingerprint names tau."""
    kwargs = {"until": ["\n\n\n"], "max_gen_toks": MAX_NEW, "do_sample": False}
    plain = PonderLM(pretrained=str(sharp_model_dir), batch_size=4, device="cpu",
                     dtype="float32", controller="none")
    direct = plain.generate_until(requests(kwargs))
    for tau in (0.5, 0.3, 0.2, 0.1, 0.05, 0.02):  # the first that stops some answers, not all
        lm = PonderLM(pretrained=str(sharp_model_dir), batch_size=4, device="cpu",
                      dtype="float32", controller="none", min_top_prob=tau)
        answers = lm.generate_until(requests(kwargs))
        if 0 < sum(a.stats["unsure_stop"] for a in answers) < len(answers):
            break
    assert lm.fingerprint()["min_top_prob"] == tau and "min_top_prob" not in plain.fingerprint()
    assert lm.fingerprint_hash() != plain.fingerprint_hash()
    stops = [a.stats["unsure_stop"] for a in answers]
    assert set(stops) == {0.0, 1.0}  # some answers stopped and some did not: both paths priced
    for answer, full in zip(answers, direct):
        stats = answer.stats
        ran = stats["gen_tokens"] + int(stats["unsure_stop"])
        assert stats["flops"] == generation_flops(lm.flops_spec, stats["prompt_tokens"], ran,
                                                  lm.prefill_logits)
        assert str(full).startswith(str(answer))  # a prefix of the unstopped answer
        if not stats["unsure_stop"]:
            assert str(answer) == str(full) and stats["flops"] == full.stats["flops"]
    assert "unsure_stop" not in direct[0].stats


def test_the_report_names_it():
    fingerprint = {"backbone": "b", "pondering": None, "min_top_prob": 0.2}
    assert _label("arith_ponder_cot", "ponder", {}, None, fingerprint)[1] == \
        "CoT (answer stop p<0.2)"
    assert _label("arith_ponder_cot", "ponder", {}, None, {"backbone": "b"})[1] == "CoT"


def test_the_report_pairs_a_stopped_run_with_the_same_run_unstopped():
    from types import SimpleNamespace

    from lm_eval_ponder.reporting.report import truncated_from

    def run(**model):
        return SimpleNamespace(identity=SimpleNamespace(model=model, generation={"t": 0.7}))

    plain = {"backbone": "b", "pondering": None}
    stopped = run(**plain, min_top_prob=0.2)
    assert truncated_from(stopped, run(**plain))
    assert not truncated_from(stopped, run(backbone="b", pondering={"alpha": -0.2}))
    assert not truncated_from(stopped, run(**plain, min_top_prob=0.1))
    assert not truncated_from(run(**plain), run(**plain))
