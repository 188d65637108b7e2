"""Pondering maths (lm_eval_ponder.pondering.dynamics): offsets, the displacement bound,
halting, and the batched ponder against the paper's step-by-step loop."""

from __future__ import annotations

import math

import pytest
import torch

from lm_eval_ponder.errors import PonderError
from lm_eval_ponder.pondering.controller import PonderController
from lm_eval_ponder.pondering.dynamics import (
    PonderConfig,
    candidate_states,
    cumulative_offsets,
    displacement_bound,
    halting_depth,
    ponder,
    step_size,
)

D = 64


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
    controller = PonderController(D, width=32).eval()
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
