"""Pondering maths (offsets, bound, halting) and the steering hook on a tiny random Llama."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn
import transformers

from lm_eval_ponder.backbone import decoder_layers
from lm_eval_ponder.pondering.controller import PonderController
from lm_eval_ponder.errors import PonderError
from lm_eval_ponder.pondering.dynamics import (
    ControllerDecide,
    PonderConfig,
    candidate_states,
    cumulative_offsets,
    displacement_bound,
    halting_depth,
    ponder,
    step_size,
)
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

    def decide(z):
        calls.append(z.shape)
        return torch.tensor(offsets)

    return decide, calls


# ---------------------------------------------------------------- maths


def test_config_validation() -> None:
    assert PonderConfig().validate().granularity == "prompt"
    for bad in (dict(tau=0.0), dict(tau=1.0), dict(k_max=-1), dict(beta=-0.1),
                dict(granularity="layer"), dict(alpha0=math.nan)):
        with pytest.raises(PonderError):
            PonderConfig(**bad).validate()


def test_step_size_and_offsets_by_hand() -> None:
    assert step_size(0.1, 0.5, 2) == pytest.approx(0.1 * math.exp(-1.0))
    cfg = PonderConfig(alpha0=0.1, beta=0.5, k_max=3, alpha_start=-0.2)
    e = math.exp
    want = [-0.2, -0.1, -0.1 + 0.1 * e(-0.5), -0.1 + 0.1 * e(-0.5) + 0.1 * e(-1.0)]
    assert cumulative_offsets(cfg).tolist() == pytest.approx(want, abs=1e-7)
    only_start = cumulative_offsets(PonderConfig(k_max=0, alpha_start=0.3))
    assert only_start.tolist() == pytest.approx([0.3])


@pytest.mark.parametrize(
    "alpha0,beta,start", [(0.05, 0.3, 0.0), (0.2, 1.0, -0.15), (0.1, 0.01, 0.5)]
)
def test_bounded_evolution(alpha0: float, beta: float, start: float) -> None:
    cfg = PonderConfig(alpha0=alpha0, beta=beta, alpha_start=start, k_max=40)
    torch.manual_seed(0)
    z0 = torch.randn(3, D, dtype=torch.float64)
    h = torch.randn(D, dtype=torch.float64)
    h = h / h.norm()
    z = candidate_states(z0, h, cumulative_offsets(cfg).double())
    moved = (z - z[:, :1]).norm(dim=-1)  # from the started state z0 + alpha_start h
    bound = displacement_bound(alpha0, beta)
    assert bool((moved <= bound + 1e-6).all())
    for k in range(cfg.k_max + 1):  # the finite-T form is tight: the steps are collinear
        assert moved[:, k].tolist() == pytest.approx([displacement_bound(alpha0, beta, k)] * 3,
                                                     rel=1e-5, abs=1e-7)
    assert math.isinf(displacement_bound(0.1, 0.0))


def test_papers_prose_bound_is_too_small() -> None:
    """alpha0/beta (the paper's wording) is exceeded at the default beta=0.3 by step 8."""
    c = cumulative_offsets(PonderConfig(alpha0=1.0, beta=0.3, k_max=8, alpha_start=0.0))
    assert c[-1] > 1.0 / 0.3
    assert c[-1] <= displacement_bound(1.0, 0.3)


def test_halting_depth_by_hand() -> None:
    p = torch.tensor([
        [0.1, 0.9, 0.9, 0.9],  # halts at once
        [0.9, 0.9, 0.2, 0.1],  # <= tau counts as halting
        [0.9, 0.9, 0.9, 0.9],  # never halts: the budget K
        [0.9, 0.1, 0.9, 0.1],  # the first halt wins
        [0.9, 0.9, 0.9, 0.15],  # halting at K is also K
    ])
    assert halting_depth(p, 0.2).tolist() == [0, 2, 3, 1, 3]
    assert halting_depth(p, 0.2).dtype == torch.long
    assert halting_depth(torch.tensor([[0.9], [0.1]]), 0.2).tolist() == [0, 0]  # k_max = 0


def test_ponder_matches_a_step_by_step_loop() -> None:
    torch.manual_seed(0)
    controller = PonderController(D, hidden=32).eval()
    cfg = PonderConfig(alpha0=0.5, beta=0.3, k_max=6)
    z0, h = torch.randn(16, D), 8.0 * torch.randn(D)
    offsets = cumulative_offsets(cfg)
    with torch.no_grad():
        tau = controller(candidate_states(z0, h, offsets)).median().item()
    depth, p = ponder(controller, z0, h, offsets, tau)
    assert p.shape == (16, cfg.k_max + 1) and len(set(depth.tolist())) > 2
    for b in range(16):  # the paper's sequential algorithm, one row at a time
        z, k = z0[b].clone() + cfg.alpha_start * h, 0  # the signed start
        with torch.no_grad():
            while True:
                phi = controller(z).item()
                assert phi == pytest.approx(p[b, k].item(), abs=1e-5)
                if phi <= tau or k == cfg.k_max:
                    break
                z = z + step_size(cfg.alpha0, cfg.beta, k) * h
                k += 1
        assert depth[b].item() == k


def test_ponder_is_one_batched_call() -> None:
    calls = []

    def controller(states):
        calls.append(tuple(states.shape))
        return torch.full(states.shape[:-1], 0.9)

    depth, _ = ponder(controller, torch.randn(5, D), torch.randn(D),
                      cumulative_offsets(PonderConfig(k_max=4)), 0.2)
    assert calls == [(5, 5, D)] and depth.tolist() == [4] * 5


# ---------------------------------------------------------------- the hook


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

    def decide(z):
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
    decide = ControllerDecide(PonderController(D, hidden=32), vector, SCALE, offsets, tau=0.99)
    ids = torch.randint(3, 128, (2, 6))
    with torch.no_grad(), SteeringHook(model, LAYER, vector, SCALE, decide) as hook:
        generate(model, ids)
    assert len(decide.depths) == 1 and decide.depths[0].tolist() == [0, 0]  # tau ~ 1: halt now
    assert torch.equal(hook.decisions[0], offsets[decide.depths[0]])
