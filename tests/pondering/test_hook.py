"""The steering hook (lm_eval_ponder.pondering.hook) on a tiny random Llama: removal, per-row
and per-token offsets, bit-identity at offset 0, and a controller deciding through it."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import transformers

from lm_eval_ponder.backbone import decoder_layers
from lm_eval_ponder.errors import PonderError
from lm_eval_ponder.pondering.controller import PonderController
from lm_eval_ponder.pondering.dynamics import ControllerDecide, PonderConfig, cumulative_offsets
from lm_eval_ponder.pondering.hook import SteeringHook

D, LAYER, SCALE, NEW = 64, 1, 4.0, 6


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=D, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=128, vocab_size=128, max_position_embeddings=64,
        bos_token_id=1, eos_token_id=2, pad_token_id=0,
    )
    return transformers.LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module")
def vector():
    torch.manual_seed(1)
    v = torch.randn(D)
    return v / v.norm()


def generate(model, ids, **kw):
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW,
                         min_new_tokens=NEW, do_sample=False, output_scores=True,
                         return_dict_in_generate=True, pad_token_id=0, **kw)
    return out.sequences, torch.stack(out.scores, dim=1)


def fixed(offsets):
    calls = []

    def decide(z, rows=None):
        calls.append(z.shape)
        return torch.tensor(offsets)

    return decide, calls


def test_hook_removed_on_exit_and_on_error(model, vector) -> None:
    layer = decoder_layers(model)[LAYER]
    ids = torch.randint(3, 128, (1, 5))
    with SteeringHook(model, LAYER, vector, SCALE, fixed([1.0])[0]) as hook:
        assert len(layer._forward_hooks) == 1
        model(ids)
    assert len(layer._forward_hooks) == 0 and hook.n_forward == 1
    with pytest.raises(RuntimeError, match="boom"):
        with SteeringHook(model, LAYER, vector, SCALE, fixed([1.0])[0], mode="token"):
            raise RuntimeError("boom")
    assert len(layer._forward_hooks) == 0
    with pytest.raises(PonderError, match="one offset per row"):  # error raised inside the hook
        with SteeringHook(model, LAYER, vector, SCALE, fixed([1.0, 2.0])[0]):
            model(ids)
    assert len(layer._forward_hooks) == 0


def test_bad_arguments(model, vector) -> None:
    with pytest.raises(PonderError):
        SteeringHook(model, 5, vector, SCALE, fixed([0.0])[0])
    with pytest.raises(PonderError):
        SteeringHook(model, LAYER, vector, SCALE, fixed([0.0])[0], mode="layer")
    with pytest.raises(PonderError, match="hidden size"):
        with SteeringHook(model, LAYER, torch.ones(D + 1), SCALE, fixed([0.0])[0]):
            model(torch.randint(3, 128, (1, 4)))


@pytest.mark.parametrize("mode", ["prompt", "token"])
def test_zero_offsets_are_bit_identical(model, vector, mode) -> None:
    ids = torch.randint(3, 128, (2, 7))
    with torch.no_grad():
        base_logits = model(ids).logits
        base_seq, base_scores = generate(model, ids)
        with SteeringHook(model, LAYER, vector, SCALE, fixed([0.0, 0.0])[0], mode=mode):
            logits = model(ids).logits
        with SteeringHook(model, LAYER, vector, SCALE, fixed([0.0, 0.0])[0], mode=mode):
            seq, scores = generate(model, ids)
    assert torch.equal(logits, base_logits)
    assert torch.equal(seq, base_seq) and torch.equal(scores, base_scores)


class ManualHook:
    """Reference: add offsets[b] * SCALE * vector at the last position of every forward pass."""

    def __init__(self, offsets, vector) -> None:
        self.shift = torch.tensor(offsets)[:, None] * SCALE * vector

    def __call__(self, module, args, output):
        out = output.clone()
        out[:, -1, :] += self.shift
        return out


def test_prompt_mode_reuses_the_prefill_offsets(model, vector) -> None:
    ids = torch.randint(3, 128, (2, 7))
    offsets = [1.5, -2.0]
    decide, calls = fixed(offsets)
    with torch.no_grad():
        with SteeringHook(model, LAYER, vector, SCALE, decide, mode="prompt") as hook:
            seq, scores = generate(model, ids)
        handle = decoder_layers(model)[LAYER].register_forward_hook(ManualHook(offsets, vector))
        try:
            ref_seq, ref_scores = generate(model, ids)
        finally:
            handle.remove()
        _, base_scores = generate(model, ids)
    assert calls == [(2, D)]  # one decision, on the prefill's last token
    assert hook.n_forward == NEW and len(hook.decisions) == 1
    assert hook.decisions[0].tolist() == offsets
    assert torch.equal(seq, ref_seq) and torch.allclose(scores, ref_scores, atol=1e-5)
    assert not torch.allclose(scores, base_scores, atol=1e-3)  # the steering did something


def test_rows_get_their_own_offsets(model, vector) -> None:
    ids = torch.randint(3, 128, (2, 7))
    offsets = [2.0, -1.0]
    with torch.no_grad():
        with SteeringHook(model, LAYER, vector, SCALE, fixed(offsets)[0]):
            seq, scores = generate(model, ids)
        for b in range(2):
            with SteeringHook(model, LAYER, vector, SCALE, fixed([offsets[b]])[0]):
                row_seq, row_scores = generate(model, ids[b : b + 1])
            assert torch.equal(seq[b], row_seq[0])
            assert torch.allclose(scores[b], row_scores[0], atol=1e-4)


def test_token_mode_decides_at_every_step(model, vector) -> None:
    ids = torch.randint(3, 128, (2, 5))
    seen = []

    def decide(z, rows=None):
        seen.append(z.clone())
        return torch.full((z.shape[0],), float(len(seen)))  # a different offset each step

    passes = []
    counter = model.register_forward_hook(lambda *a: passes.append(1))
    try:
        with torch.no_grad(), SteeringHook(model, LAYER, vector, SCALE, decide, "token") as hook:
            generate(model, ids)
    finally:
        counter.remove()
    assert len(seen) == len(passes) == NEW == hook.n_forward
    assert [d.tolist() for d in hook.decisions] == [[float(i + 1)] * 2 for i in range(NEW)]
    assert all(z.shape == (2, D) for z in seen)


def test_tuple_outputs_and_bfloat16(vector) -> None:
    class TupleLayer(nn.Module):
        def forward(self, x):
            return x * 2, "cache"

    class Fake(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = nn.Module()
            self.model.layers = nn.ModuleList([TupleLayer()])

    fake = Fake()
    x = torch.randn(2, 3, D, dtype=torch.bfloat16)
    with SteeringHook(fake, 0, vector, SCALE, fixed([1.0, 0.0])[0]) as hook:
        out, extra = fake.model.layers[0](x)
    assert extra == "cache" and out.dtype == torch.bfloat16
    want = x * 2
    want[0, -1] += (SCALE * vector).to(torch.bfloat16)
    assert torch.equal(out, want)
    assert hook.decisions[0].tolist() == [1.0, 0.0]


def test_controller_decide_records_depths(model, vector) -> None:
    torch.manual_seed(0)
    cfg = PonderConfig(k_max=4, alpha0=0.5)
    offsets = cumulative_offsets(cfg)
    decide = ControllerDecide(PonderController(D, width=32), vector, SCALE, offsets, tau=0.99)
    ids = torch.randint(3, 128, (2, 6))
    with torch.no_grad(), SteeringHook(model, LAYER, vector, SCALE, decide) as hook:
        generate(model, ids)
    assert len(decide.depths) == 1 and decide.depths[0].tolist() == [0, 0]  # tau ~ 1: halt now
    assert torch.equal(hook.decisions[0], offsets[decide.depths[0]])


def test_rows_that_leave_keep_their_prompt_offsets(model, vector):
    """Under the generation loop rows leave and join: begin_forward names the original rows of
    each forward, and a prompt-mode offset decided at a row's prefill follows that row."""
    calls = []

    def decide(z, rows=None):
        calls.append(z.shape[0])
        return torch.arange(z.shape[0], dtype=torch.float32) + 10 * len(calls)

    hook = SteeringHook(model, LAYER, vector, SCALE, decide, mode="prompt")
    seen = []
    layer = decoder_layers(model)[LAYER]
    probe = layer.register_forward_hook(lambda m, a, out: seen.append(
        (out[0] if isinstance(out, tuple) else out)[:, -1, :].clone()))
    ids = torch.randint(3, 100, (3, 5))
    try:
        with hook, torch.no_grad():
            hook.expect_rows(4)
            hook.begin_forward(torch.tensor([0, 1, 2]), prefill=True)
            base = model(ids).logits  # prefill rows 0, 1, 2: offsets 10, 11, 12
            hook.begin_forward(torch.tensor([3]), prefill=True)
            model(ids[:1])  # row 3 joins: offset 20
            hook.begin_forward(torch.tensor([2, 3]), prefill=False)
            model(ids[:2, -1:])  # rows 0 and 1 left: rows 2 and 3 keep 12 and 20
    finally:
        probe.remove()
    assert calls == [3, 1]
    assert torch.equal(hook._offsets, torch.tensor([10.0, 11.0, 12.0, 20.0]))
    per_row = hook.per_row(hook.decisions, 4)
    assert [r.tolist() for r in per_row] == [[10.0], [11.0], [12.0], [20.0]]
    assert base.shape[0] == 3 and len(seen) == 3


def test_token_mode_decisions_regroup_by_row(model, vector):
    hook = SteeringHook(model, LAYER, vector, SCALE, lambda z, rows=None: torch.zeros(z.shape[0]),
                        mode="token")
    ids = torch.randint(3, 100, (2, 4))
    with hook, torch.no_grad():
        hook.expect_rows(2)
        hook.begin_forward(torch.tensor([0, 1]), prefill=True)
        model(ids)
        hook.begin_forward(torch.tensor([1]), prefill=False)
        model(ids[1:, -1:])
    assert [len(r) for r in hook.per_row(hook.decisions, 2)] == [1, 2]


@pytest.mark.parametrize("mode", ["token", "prompt"])
def test_per_token_steering_never_waits_for_the_host(model, vector, mode, host_syncs):
    """Every steered forward of a generation (controller decisions, offsets, the in-place add)
    stays on the model's device: no host read or tensor from Python data while the steering
    hook runs (``host_syncs``; where CUDA exists, its sync debug mode too)."""
    torch.manual_seed(0)
    offsets = cumulative_offsets(PonderConfig(k_max=4, alpha0=0.5))
    decide = ControllerDecide(PonderController(D, width=32), vector, SCALE, offsets, tau=0.5)
    layer = decoder_layers(model)[LAYER]
    # forward hooks run in the order they were registered: ``enter`` before the steering
    # hook, ``leave`` after it, so only the steering work is counted (not transformers' own)
    enter = layer.register_forward_hook(lambda *a: setattr(host_syncs, "active", True))
    ids = torch.randint(3, 128, (3, 6))
    try:
        with torch.no_grad(), SteeringHook(model, LAYER, vector, SCALE, decide, mode=mode) as hook:
            leave = layer.register_forward_hook(lambda *a: setattr(host_syncs, "active", False))
            if torch.cuda.is_available():
                torch.cuda.set_sync_debug_mode("error")
            try:
                generate(model, ids)
            finally:
                leave.remove()
                if torch.cuda.is_available():
                    torch.cuda.set_sync_debug_mode(0)
    finally:
        enter.remove()
    assert hook.n_forward == NEW and len(decide.depths) == (NEW if mode == "token" else 1)
    assert host_syncs.calls == []
