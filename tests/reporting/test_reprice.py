"""Re-pricing kept logs after issue 52's FLOPs fix: P recovered from the old price, the
overcharge removed per generation, Best-of-N and early exit priced from a plain run of the same
question, and refusals where the logs do not determine P."""

from __future__ import annotations

import json
import lzma

import pytest
import transformers

from lm_eval_ponder.errors import PonderError
from lm_eval_ponder.files import read_json, read_jsonl, write_jsonl_xz
from lm_eval_ponder.flops import FlopsSpec, controller_flops, generation_flops
from lm_eval_ponder.reporting.reprice import (
    PRICING,
    STAMP,
    old_price,
    prompt_from_price,
    prompt_key,
    reprice,
)

SPEC = FlopsSpec.from_config(transformers.LlamaConfig(
    hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    intermediate_size=128, vocab_size=2048))
PROMPTS = {0: 31, 1: 57, 2: 12}  # question -> prompt tokens
TOKENS = {0: 40, 1: 3, 2: 250}


def test_prompt_from_price_inverts_the_old_price() -> None:
    for prompt in (1, 2, 17, 300, 4000):
        for gen in (0, 1, 9, 500):
            assert prompt_from_price(SPEC, old_price(SPEC, prompt, gen), gen) == prompt
            # a controller's evaluations on top (under one LM-head row) do not move it
            with_ctrl = old_price(SPEC, prompt, gen) + controller_flops(64, 32, n_evals=9)
            assert prompt_from_price(SPEC, with_ctrl, gen, extra=True) == prompt
            assert prompt_from_price(SPEC, with_ctrl, gen) is None  # no controller: exact
    # already re-priced (or another model's) values are refused, not guessed
    assert prompt_from_price(SPEC, generation_flops(SPEC, 40, 10), 10) is None
    assert prompt_from_price(SPEC, 10.0, 3) is None
    assert prompt_from_price(SPEC, old_price(SPEC, 5, 2), 2.5) is None


def test_prompt_key_shares_the_plain_prompt() -> None:
    assert prompt_key("gsm8k_ponder") == prompt_key("gsm8k_ponder_bon") == "gsm8k/plain"
    assert prompt_key("gsm8k_ponder_cot") == "gsm8k/cot"
    assert prompt_key("arith_ponder") != prompt_key("gsm8k_ponder")


def _run(root, name: str, task: str, rows: list[dict], repeats: int = 1,
         controller: bool = False) -> None:
    folder = root / name / "model"
    folder.mkdir(parents=True)
    stamp = "2026-11-27T00-00-00.0"
    write_jsonl_xz(folder / f"samples_{task}_{stamp}.compact.jsonl.xz", rows)
    filt = "bon" if repeats > 1 else "none"
    mean = sum(r["flops"] for r in rows) / len(rows)
    (folder / f"results_{stamp}.json").write_text(json.dumps({
        "results": {task: {f"flops,{filt}": mean, f"flops_stderr,{filt}": 1.0,
                           f"exact_match,{filt}": 0.5}},
        "configs": {task: {"repeats": repeats}},
        "config": {"ponder_fingerprint": {"pondering": {"controller": "ab" if controller else None}}}}))


def _logs(root) -> dict[str, list[dict]]:
    return {p.parent.parent.name: read_jsonl(p) for p in root.rglob("*.compact.jsonl.xz")}


def test_reprice_rewrites_every_kind_of_row(tmp_path) -> None:
    ctrl = controller_flops(64, 32, n_evals=9)
    _run(tmp_path, "direct", "gsm8k_ponder", [
        {"doc_id": d, "filter": "none", "gen_tokens": TOKENS[d],
         "flops": float(old_price(SPEC, PROMPTS[d], TOKENS[d]))} for d in PROMPTS])
    _run(tmp_path, "fp", "gsm8k_ponder", [
        {"doc_id": d, "filter": "none", "gen_tokens": TOKENS[d],
         "flops": float(old_price(SPEC, PROMPTS[d], TOKENS[d]) + ctrl)} for d in PROMPTS],
         controller=True)
    # Best-of-3: only the total kept; early exit: not a function of (P, tokens)
    _run(tmp_path, "bon", "gsm8k_ponder_bon", [
        {"doc_id": d, "filter": "bon", "gen_tokens": 3 * TOKENS[d],
         "flops": float(3 * old_price(SPEC, PROMPTS[d], TOKENS[d]))} for d in PROMPTS], repeats=3)
    _run(tmp_path, "ee", "gsm8k_ponder", [
        {"doc_id": d, "filter": "none", "gen_tokens": TOKENS[d], "exit_layer": 1.5,
         "flops": float(old_price(SPEC, PROMPTS[d], TOKENS[d]) - 1000)} for d in PROMPTS])
    summary = reprice([tmp_path], SPEC)
    assert summary == {"logs": 4, "results": 4, "questions": 3, "counted": 0, "outcome_parts": 0}
    logs = _logs(tmp_path)
    for d in PROMPTS:
        new = generation_flops(SPEC, PROMPTS[d], TOKENS[d])
        rows = {name: next(r for r in rows if r["doc_id"] == d) for name, rows in logs.items()}
        assert rows["direct"]["flops"] == new
        assert rows["fp"]["flops"] == new + ctrl
        assert rows["bon"]["flops"] == 3 * new
        assert rows["ee"]["flops"] == new - 1000
    for results in tmp_path.rglob("results_*.json"):
        data = read_json(results)
        assert data[STAMP] == PRICING
        task, metrics = next(iter(data["results"].items()))
        key = next(k for k in metrics if k.startswith("flops,"))
        rows = logs[results.parent.parent.name]
        assert metrics[key] == pytest.approx(sum(r["flops"] for r in rows) / len(rows))
        assert metrics[key.replace("flops", "flops_stderr")] != 1.0  # recomputed
    # once only: a second pass finds nothing left to re-price
    assert reprice([tmp_path], SPEC)["logs"] == 0
    assert _logs(tmp_path) == logs


def test_reprice_refuses_what_the_logs_do_not_determine(tmp_path) -> None:
    # Best-of-N with no plain run of its questions: P unknown
    _run(tmp_path, "bon", "math500_ponder_bon", [
        {"doc_id": 0, "filter": "bon", "gen_tokens": 30,
         "flops": float(3 * old_price(SPEC, 20, 10))}], repeats=3)
    with pytest.raises(PonderError, match="no run under the math500/plain prompt"):
        reprice([tmp_path], SPEC)
    # two plain runs of one question that price different prompts
    other = tmp_path / "two"
    _run(other, "a", "arith_ponder", [{"doc_id": 0, "gen_tokens": 5,
                                       "flops": float(old_price(SPEC, 20, 5))}])
    _run(other, "b", "arith_ponder", [{"doc_id": 0, "gen_tokens": 5,
                                       "flops": float(old_price(SPEC, 21, 5))}])
    with pytest.raises(PonderError, match="priced as a"):
        reprice([other], SPEC)


def test_reprice_counts_kept_prompts_and_checks_them(tmp_path) -> None:
    class Tokenizer:  # one token per word
        def __call__(self, text, add_special_tokens=False):
            return type("Enc", (), {"input_ids": text.split()})

    context = " ".join(["w"] * 31)
    row = {"doc_id": 0, "gen_tokens": 8, "flops": float(old_price(SPEC, 31, 8)),
           "arguments": {"gen_args_0": {"arg_0": context, "arg_1": {}}}}
    _run(tmp_path, "ok", "arith_ponder", [row])
    assert reprice([tmp_path], SPEC, Tokenizer())["counted"] == 1
    bad = tmp_path / "bad"
    _run(bad, "x", "arith_ponder", [{**row, "flops": float(old_price(SPEC, 30, 8))}])
    with pytest.raises(PonderError, match="priced as a 30-token prompt"):
        reprice([bad], SPEC, Tokenizer())


def test_reprice_rollout_outcomes(tmp_path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "manifest.json").write_text(json.dumps({"k_max": 1}))
    cols = {"key": [0, 0, 1], "gen_tokens": [4, 9, 2],
            "flops": [float(old_price(SPEC, 11, 4)), float(old_price(SPEC, 11, 9)),
                      float(old_price(SPEC, 40, 2))], "ppl": [1.0, 2.0, 3.0]}
    part = cache / "rollouts.rank0.part000.outcomes.json.xz"
    part.write_bytes(lzma.compress(json.dumps(
        {"keys": ["a", "b"], "columns": cols}).encode()))
    assert reprice([tmp_path], SPEC)["outcome_parts"] == 1
    data = json.loads(lzma.decompress(part.read_bytes()))
    assert data["columns"]["flops"] == [generation_flops(SPEC, 11, 4),
                                        generation_flops(SPEC, 11, 9),
                                        generation_flops(SPEC, 40, 2)]
    assert data["columns"]["ppl"] == [1.0, 2.0, 3.0]
    assert read_json(cache / "manifest.json")[STAMP] == PRICING
    assert reprice([tmp_path], SPEC)["outcome_parts"] == 0
