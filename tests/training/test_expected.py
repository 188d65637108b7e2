"""The expected-reward trainer (``training.expected``): its distribution, values and loss by
hand, the fixed point the advantage loss is built for, and the saturation it avoids."""

from __future__ import annotations

import math

import pytest
import torch

from lm_eval_ponder.errors import PonderError
from lm_eval_ponder.pondering.controller import PonderController
from lm_eval_ponder.training.expected import (
    ExpectedConfig,
    ExpectedRewardTrainer,
    advantage_loss,
    continuation_values,
    depth_log_probabilities,
    expected_reward,
)
from lm_eval_ponder.training.grpo import trajectory_log_prob


def test_the_depth_distribution_is_the_trajectory_probability_and_sums_to_one():
    logits = torch.randn(5, 4)
    log_p = depth_log_probabilities(logits)
    assert torch.allclose(log_p.exp().sum(1), torch.ones(5))
    for d in range(4):
        assert torch.allclose(log_p[:, d], trajectory_log_prob(logits, torch.full((5,), d)))


def test_continuation_values_by_hand():
    phi = torch.tensor([[0.5, 0.25, 0.9]])
    r = torch.tensor([[1.0, 2.0, 4.0]])
    v2 = 4.0
    v1 = 0.75 * 2.0 + 0.25 * v2
    v0 = 0.5 * 1.0 + 0.5 * v1
    assert torch.allclose(continuation_values(phi, r), torch.tensor([[v0, v1, v2]]))
    # V(0) is the expected reward of the whole distribution
    logits = torch.log(phi / (1 - phi))
    assert torch.allclose(expected_reward(logits, r), torch.tensor([v0]))


def test_the_advantage_loss_weights_each_decision_by_its_advantage():
    logits = torch.zeros(1, 3, requires_grad=True)  # phi = 0.5 everywhere
    r = torch.tensor([[1.0, 0.0, 3.0]])
    advantage_loss(logits, r, tau=0.2).backward()
    # V = [1.0, 1.5, 3.0]; A(0) = 1.5 - 1 = 0.5 > 0 (continue), A(1) = 3 - 0 = 3 > 0
    # d/dl of w * BCE(sigmoid(l), 1) at l = 0 is -w / 2, w = |A| * tau
    assert torch.allclose(logits.grad, torch.tensor([[-0.5 * 0.2 / 2, -3 * 0.2 / 2, 0.0]]))


@pytest.mark.parametrize("share_continuing_pays, halts", [(0.6, False), (0.4, True)])
def test_pooled_prompts_halt_exactly_where_halting_pays_on_average(share_continuing_pays, halts):
    """Prompts the controller cannot tell apart (one shared logit): the fitted phi is <= tau
    exactly where the mean advantage of continuing is <= 0 (the module's claim)."""
    n, tau = 100, 0.2
    pays = int(share_continuing_pays * n)
    r = torch.zeros(n, 2)
    r[:pays, 1] = 1.0  # continuing gains 1 on these ...
    r[pays:, 0] = 1.0  # ... halting gains 1 on the rest
    logit = torch.zeros(1, requires_grad=True)
    opt = torch.optim.Adam([logit], lr=0.05)
    for _ in range(600):
        opt.zero_grad()
        advantage_loss(torch.cat([logit.expand(n, 1), torch.zeros(n, 1)], 1), r, tau).backward()
        opt.step()
    assert (torch.sigmoid(logit).item() <= tau) == halts


def world(n=64, d=16, seed=0):
    """Two kinds of prompt, readable from z_0: kind 0 pays at depth 0, kind 1 at depth 3."""
    g = torch.Generator().manual_seed(seed)
    kind = torch.arange(n) % 2
    z = torch.randn(n, d, generator=g) + 3.0 * kind[:, None] * torch.ones(d) / math.sqrt(d)
    r = torch.zeros(n, 4)
    r[kind == 0, 0] = 1.0
    r[kind == 1, 3] = 1.0
    r[kind == 0, 1:] = 0.8
    return z, r, kind


def trainer(method, d=16):
    torch.manual_seed(0)
    ctrl = PonderController(d, width=64)
    return ExpectedRewardTrainer(ctrl, torch.ones(d) / 4, torch.arange(4.0), 0.2,
                                 ExpectedConfig(method=method, max_steps=200, eval_every=20,
                                                patience=0), seed=0)


def test_the_advantage_method_learns_both_kinds_and_the_gradient_saturates():
    z, r, kind = world()
    learned = trainer("advantage")
    learned.fit(z, r, None, None, progress=False)
    depths = learned.greedy_depths(z)
    assert (depths[kind == 0] == 0).float().mean() > 0.9
    assert (depths[kind == 1] == 3).float().mean() > 0.9
    # ascending the expected reward itself: every prompt goes to the majority's depth 3
    # (kind 0 loses 0.2 there, kind 1 would lose 1.0 at depth 0) and stays
    plain = trainer("gradient")
    plain.fit(z, r, None, None, progress=False)
    assert (plain.greedy_depths(z)[kind == 0] == 0).float().mean() < 0.5


def test_held_out_selection_keeps_the_best_weights_and_stops_early():
    z, r, _ = world()
    t = trainer("advantage")
    t.cfg.patience = 2
    lines = []
    step, _ = t.fit(z[:48], r[:48], z[48:], r[48:], progress=False,
                    on_eval=lambda s, line: lines.append(line))
    best = max(lines, key=lambda line: line["val"]["score"])
    assert step == best["step"]
    assert t.readout(z[48:], r[48:])["score"] == pytest.approx(best["val"]["score"])


def test_config_is_checked():
    for bad in ({"learning_rate": 0}, {"weight_decay": -1}, {"max_steps": 0},
                {"method": "newton"}):
        with pytest.raises(PonderError):
            ExpectedConfig(**bad).validate()
