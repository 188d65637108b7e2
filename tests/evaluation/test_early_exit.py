"""The early-exit baseline (lm_eval_ponder.generation.early_exit) on a tiny random Llama whose LM
head is sharpened, so that intermediate layers are confident on some tokens and not others:
settings and refusals, the hook against a one-row reference implementation (logits, exit
layers and the skipped layers' cache), Direct above threshold 1, early exits lowering FLOPs,
rows leaving and joining the loop, and the identity."""

from __future__ import annotations

import copy

import pytest
import torch
from lm_eval.api.model import CachingLM
from test_lm import requests

from lm_eval_ponder.backbone import decoder_layers
from lm_eval_ponder.engine import cache_keyword
from lm_eval_ponder.errors import PonderError
from lm_eval_ponder.evaluation.lm import PonderLM
from lm_eval_ponder.flops import early_exit_generation_flops, generation_flops
from lm_eval_ponder.generation.early_exit import (
    ExitHook,
    ExitSettings,
    exit_accounting,
    exit_label,
    exit_tests,
    parse_layers,
)
from lm_eval_ponder.generation.settings import PonderArgs

# stop strings that end rows at different steps (as the steering loop test uses)
KWARGS = {"until": ["I", "]", "7", "v"], "max_gen_toks": 12, "do_sample": False}
THRESHOLD = 0.6  # sharp_model_dir's intermediate layers: top-1 probabilities of 0.3-0.95


def make(model_dir, **kwargs) -> PonderLM:
    return PonderLM(pretrained=str(model_dir), batch_size=4, device="cpu", dtype="float32",
                    controller="none", **kwargs)


@pytest.fixture(scope="module")
def direct(sharp_model_dir):
    return make(sharp_model_dir).generate_until(requests(KWARGS))


# ----------------------------------------------------------------------------- settings
def test_settings_parse_and_candidates():
    assert ExitSettings.from_model_args(None) is None
    assert ExitSettings.from_model_args("none") is None
    plain = ExitSettings.from_model_args("0.9")
    assert plain == ExitSettings(0.9) and plain.candidates(4) == (1, 2, 3)
    assert ExitSettings.from_model_args(0.5, "2").candidates(30) == tuple(range(2, 30))
    assert ExitSettings.from_model_args(0.5, "16:30:4").candidates(30) == (16, 20, 24, 28)
    assert ExitSettings.from_model_args(0.5, "10:20").candidates(30) == tuple(range(10, 20))
    assert ExitSettings(1.01, 2, 4).candidates(4) == ()  # built directly: never reached
    for outside in (0, 1.01):  # the model arg takes (0, 1] (issue 55)
        with pytest.raises(PonderError, match=r"threshold in \(0, 1\]"):
            ExitSettings.from_model_args(outside)
    assert parse_layers(None) == (1, None, 1) and parse_layers("3::2") == (3, None, 2)
    assert exit_label(plain.fingerprint()) == "EE (p>=0.9)"
    assert exit_label(ExitSettings(0.99, 16, 30, 4).fingerprint()) == "EE (p>=0.99, layers 16:30:4)"
    assert exit_tests((16, 20, 24, 28), 20) == 2 and exit_tests((16, 20, 24, 28), 30) == 4


@pytest.mark.parametrize("early_exit, layers, message", [
    ("-0.1", None, r"threshold in \(0, 1\]"), ("nan", None, r"threshold in \(0, 1\]"),
    ("often", None, r"threshold in \(0, 1\]"), (None, "3", "needs early_exit"),
    ("0.9", "3:2", "start < stop"), ("0.9", "0:4", "start < stop"),
    ("0.9", "a:b", "start\\[:stop"), ("0.9", "1:2:3:4", "start\\[:stop"),
])
def test_bad_settings_are_one_clear_line(early_exit, layers, message):
    with pytest.raises(PonderError, match=message):
        ExitSettings.from_model_args(early_exit, layers)


def test_early_exit_refuses_steering():
    for args in (dict(controller="/c"), dict(alpha=0.1), dict()):  # {}: the shipped controller
        with pytest.raises(PonderError, match="controller=none"):
            ExitSettings.from_model_args(0.9, None, PonderArgs.from_model_args(**args))
    assert ExitSettings.from_model_args(
        0.9, None, PonderArgs.from_model_args(controller=None)) == ExitSettings(0.9)


def test_the_model_refuses_what_it_cannot_run(sharp_model_dir):
    with pytest.raises(PonderError, match="controller=none"):
        PonderLM(pretrained=str(sharp_model_dir), batch_size=4, device="cpu", early_exit=0.9)
    with pytest.raises(PonderError, match="has 4 layers"):
        make(sharp_model_dir, early_exit=0.9, exit_layers="1:9")
    lm = make(sharp_model_dir, early_exit=0.9)
    from lm_eval.api.instance import Instance

    with pytest.raises(PonderError, match="early_exit= applies to generated tokens only"):
        lm.loglikelihood([Instance("loglikelihood", doc={}, arguments=("2 + 2 =", " 4"),
                                   idx=0)])


# ----------------------------------------------------------------------------- the hook
def reference_step(model, cache, token: torch.Tensor, position: int, threshold: float,
                   candidates: set[int]) -> tuple[torch.Tensor, int]:
    """One decode token of one row as an early-exit implementation runs it, written
    sequentially: layers up to the exit, then every later layer fed the exit state (only for
    its cache). Returns the logits and the exit layer."""
    layers = decoder_layers(model)
    pos = torch.tensor([[position]])
    h = model.model.embed_tokens(token[None, None])
    emb = model.model.rotary_emb(h, position_ids=pos)
    kwargs = {"position_ids": pos, "position_embeddings": emb, cache_keyword(model): cache,
              "use_cache": True}
    exit_layer = len(layers)
    for k, layer in enumerate(layers, 1):
        if exit_layer < len(layers):
            layer(h, **kwargs)  # a skipped layer: its cache from the exit state
            continue
        h = layer(h, **kwargs)
        if k in candidates:
            p = model.lm_head(model.model.norm(h)).float().softmax(-1).amax(-1)
            if float(p) >= threshold:
                exit_layer = k
    return model.lm_head(model.model.norm(h))[0, -1], exit_layer


@pytest.mark.parametrize("threshold, layers", [(THRESHOLD, None), (0.0, "2:4"), (1.5, None)])
def test_hook_equals_a_sequential_early_exit(sharp_model_dir, threshold, layers):
    """A batch through the hook gives each row what a one-row sequential early exit gives:
    the exit layer, the logits, and every layer's keys and values for the new token (the
    skipped layers' computed from the exit state)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(sharp_model_dir, dtype=torch.float32).eval()
    settings = ExitSettings(threshold, *parse_layers(layers))  # 0 and 1.5: built directly
    candidates = set(settings.candidates(4))
    torch.manual_seed(0)
    prompts = torch.randint(4, 90, (6, 7))
    tokens = torch.randint(4, 90, (6,))
    with torch.no_grad():
        prefill = model(prompts, use_cache=True).past_key_values
        cache = copy.deepcopy(prefill)
        with ExitHook(model, settings) as hook:
            model(prompts[:, :1], use_cache=False)  # the hook's first forward is the prefill
            out = model(tokens[:, None], position_ids=torch.full((6, 1), 7),
                        **{cache_keyword(model): cache}, use_cache=True)
        exits = hook.per_row(6)
        assert [len(e) for e in exits] == [1] * 6
        for row in range(6):
            own = model(prompts[row:row + 1], use_cache=True).past_key_values
            logits, exit_layer = reference_step(model, own, tokens[row], 7, threshold,
                                                candidates)
            assert int(exits[row][0]) == exit_layer
            assert torch.allclose(out.logits[row, -1], logits, atol=1e-4)
            for layer in range(4):
                for got, want in ((cache.layers[layer].keys, own.layers[layer].keys),
                                  (cache.layers[layer].values, own.layers[layer].values)):
                    assert torch.allclose(got[row, :, -1], want[0, :, -1], atol=1e-4)
    seen = {int(e[0]) for e in exits}
    if threshold == THRESHOLD:
        assert len(seen) > 1, "rows must exit at different layers"
    if threshold > 1:
        assert seen == {4}
    if threshold == 0.0:
        assert seen == {2}


def test_hook_removed_on_exit_and_on_error(sharp_model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(sharp_model_dir, dtype=torch.float32).eval()
    layers = decoder_layers(model)
    with pytest.raises(RuntimeError, match="boom"):
        with ExitHook(model, ExitSettings(0.5)):
            assert all(len(layer._forward_hooks) == 1 for layer in layers)
            raise RuntimeError("boom")
    assert all(not layer._forward_hooks and not layer._forward_pre_hooks for layer in layers)


# ----------------------------------------------------------------------------- generation
@pytest.mark.parametrize("generation", ["loop", "hf"])
def test_above_threshold_one_it_is_direct(sharp_model_dir, direct, generation):
    """No probability reaches a threshold above 1: the same texts, tokens and FLOPs as
    controller=none, and every token from the full depth."""
    lm = make(sharp_model_dir, early_exit=0.5, generation=generation)
    lm.early_exit = ExitSettings(1.01)  # built directly: the model arg takes (0, 1]
    got = lm.generate_until(requests(KWARGS))
    assert got == direct
    for g, d in zip(got, direct):
        assert g.stats["gen_tokens"] == d.stats["gen_tokens"]
        assert g.stats["flops"] == d.stats["flops"]
        assert g.stats["exit_layer"] == 4.0


def test_a_low_threshold_exits_early_and_lowers_flops(sharp_model_dir, direct):
    lm = make(sharp_model_dir, early_exit=THRESHOLD)
    got = lm.generate_until(requests(KWARGS))
    assert any(g.stats["exit_layer"] < 4 for g in got)
    per_token = [g.stats["flops"] / g.stats["gen_tokens"] for g in got]
    plain = [generation_flops(lm.flops_spec, int(g.stats["prompt_tokens"]),
                              int(g.stats["gen_tokens"])) / g.stats["gen_tokens"] for g in got]
    assert sum(per_token) < sum(plain)
    # a threshold below every top-1 probability at layer 1: every decode token runs one layer
    # and one test
    low = make(sharp_model_dir, early_exit=1e-9, exit_layers="1:2").generate_until(requests(KWARGS))
    for g in low:
        n = int(g.stats["gen_tokens"])
        assert g.stats["exit_layer"] == pytest.approx((4 + (n - 1)) / n)
        assert g.stats["flops"] == early_exit_generation_flops(
            lm.flops_spec, int(g.stats["prompt_tokens"]), [(1, 1)] * (n - 1))
        assert g.stats["flops"] < generation_flops(lm.flops_spec, int(g.stats["prompt_tokens"]), n)


@pytest.mark.parametrize("layers", [None, "2:4"])
def test_exits_follow_rows_that_leave_and_join(sharp_model_dir, layers):
    """The loop with max_rows=2 of 4 (rows finish at different steps, waiting ones join, a
    finished row rides until the batch is compacted) gives each row the texts and accounting
    that generate gives, where every row stays in the batch to the end."""
    args = dict(early_exit=THRESHOLD, exit_layers=layers)
    hf = make(sharp_model_dir, generation="hf", **args).generate_until(requests(KWARGS))
    loop = make(sharp_model_dir, max_rows=2, **args).generate_until(requests(KWARGS))
    assert loop == hf
    assert [a.stats for a in loop] == [b.stats for b in hf]
    assert len({t.stats["gen_tokens"] for t in loop}) > 1, "rows must finish at different steps"
    assert len({t.stats["exit_layer"] for t in loop}) > 1, "rows must exit differently"


def test_accounting_cuts_records_after_the_last_token(sharp_model_dir):
    lm = make(sharp_model_dir, early_exit=0.5)
    settings = lm.early_exit
    exits = torch.tensor([2, 3, 1, 1, 1])  # the last two: after the row's end
    stats = exit_accounting(lm.flops_spec, settings, exits, prompt_tokens=5, gen_tokens=3)
    assert stats["exit_layer"] == pytest.approx((4 + 2 + 3) / 3)
    assert stats["flops"] == early_exit_generation_flops(lm.flops_spec, 5, [(2, 2), (3, 3)])
    with pytest.raises(RuntimeError, match="internal"):
        exit_accounting(lm.flops_spec, settings, exits[:1], prompt_tokens=5, gen_tokens=4)


# ----------------------------------------------------------------------------- identity
def test_fingerprint_carries_the_threshold_and_only_under_early_exit(sharp_model_dir, tmp_path):
    plain = make(sharp_model_dir).fingerprint()
    assert "early_exit" not in plain  # earlier runs keep their identity
    a, b = make(sharp_model_dir, early_exit=0.9), make(sharp_model_dir, early_exit=0.95)
    assert a.fingerprint()["early_exit"] == {"threshold": 0.9, "layers": "1:"}
    assert a.fingerprint_hash() != b.fingerprint_hash()
    assert a.get_model_info()["ponder_fingerprint"]["early_exit"]["threshold"] == 0.9
    cache = str(tmp_path / "cache")
    CachingLM(a, cache).generate_until(requests(KWARGS))
    with pytest.raises(PonderError, match="other model/ponder settings"):
        CachingLM(b, cache)
