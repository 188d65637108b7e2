"""GRPO (lm_eval_ponder.training.grpo): the equations by hand, and proof that the trainer learns
(and would not with a sign bug), per prompt and per token (``GRPOTrainer.step`` on a
synthetic environment, ``Lookup`` or ``Online``)."""

from __future__ import annotations

import math

import pytest
import torch

import lm_eval_ponder.training.grpo as grpo
from lm_eval_ponder.errors import PonderError
from lm_eval_ponder.pondering.controller import PonderController
from lm_eval_ponder.training.grpo import GRPOConfig
from lm_eval_ponder.training.grpo import GRPOTrainer as _GRPOTrainer


class Scored:
    """The trainer's reward book for synthetic outcomes: ``score`` is the test's own function
    (by default the outcomes come scored already)."""

    ppl_ref = (1.0, 1.0)

    def __init__(self, fn=lambda records: records):
        self.fn = fn

    def score(self, records, flops):
        return self.fn(records)


def GRPOTrainer(*args, rewards=None, **kwargs):  # noqa: N802
    return _GRPOTrainer(*args, rewards=rewards or Scored(), **kwargs)


class Lookup:
    """A synthetic prompt-level environment: the batch's states ``z`` and outcomes scored by
    ``reward_fn(prompt ids, depths)``."""

    granularity = "prompt"

    def __init__(self, z, reward_fn):
        self.z, self.reward_fn = z, reward_fn

    def states(self, ids):
        return self.z

    def outcomes(self, ids, depths):
        return self.reward_fn(ids, depths), None


class Online:
    """A synthetic token-level environment around ``rollout(ids, G, policy)``; decisions are
    drawn from the trainer's generator."""

    granularity = "token"

    def __init__(self, rollout):
        self.rollout = rollout

    def decision_sampler(self, t):
        return None


def step_tokens(trainer, t, ids, rollout, score):
    """One token-level step with ``score(records)`` as the reward book."""
    trainer.rewards = Scored(score)
    return trainer.step(t, ids, Online(rollout))


def test_curriculum_schedule():
    assert grpo.curriculum_probability(0, 500, 1500) == 1.0
    assert grpo.curriculum_probability(499, 500, 1500) == 1.0
    assert grpo.curriculum_probability(500, 500, 1500) == 1.0
    assert grpo.curriculum_probability(1000, 500, 1500) == pytest.approx(0.5)
    assert grpo.curriculum_probability(1500, 500, 1500) == 0.0
    assert grpo.curriculum_probability(10**6, 500, 1500) == 0.0


def test_group_advantages():
    r = torch.tensor([[1.0, 0.0, 0.5, 0.5]])
    assert torch.allclose(grpo.group_advantages(r), torch.tensor([[0.5, -0.5, 0.0, 0.0]]))
    keep = torch.tensor([[True, True, False, False]])
    assert torch.allclose(grpo.group_advantages(r, keep), torch.tensor([[0.5, -0.5, 0.0, 0.0]]))
    only_one = torch.tensor([[True, False, False, False]])
    assert torch.equal(grpo.group_advantages(r, only_one), torch.zeros(1, 4))
    scaled = grpo.group_advantages(torch.tensor([[2.0, 0.0]]), scale_std=True)
    assert torch.allclose(scaled, torch.tensor([[1.0, -1.0]]) / math.sqrt(2), atol=1e-6)


def test_step_reports_collapse_diagnostics():
    """Stages 2-3 report mean |advantage| over kept trajectories and the policy entropy (what a
    collapse shows in the log); stage 1 has no advantages, so both are nan."""
    D = 8
    trainer = GRPOTrainer(PonderController(D, width=8), torch.ones(D), torch.arange(3.0), 0.2,
                          GRPOConfig(prompts_per_step=2, num_generations=4, t1=1, t2=1,
                                     quality_gates=False), seed=0)
    seen = {}

    def reward_fn(ids, depths):
        seen["reward"] = depths.float()  # reward = depth: advantages are depth - group mean
        return {"reward": depths.float(), "flops": 1.0 + depths.float()}

    z = torch.randn(2, D)
    first = trainer.step(0, torch.tensor([0, 1]), Lookup(z, reward_fn))
    assert math.isnan(first.advantage_abs) and math.isnan(first.entropy)
    res = trainer.step(5, torch.tensor([0, 1]), Lookup(z, reward_fn))
    r = seen["reward"].view(2, 4)
    assert res.advantage_abs == pytest.approx(float((r - r.mean(1, keepdim=True)).abs().mean()))
    assert res.entropy > 0


def test_trajectory_log_prob_by_hand():
    logits = torch.tensor([[0.0, 1.0, -1.0]])  # K = 2
    p = torch.sigmoid(logits[0])
    lp = lambda d: grpo.trajectory_log_prob(logits, torch.tensor([d]))[0]  # noqa: E731
    assert lp(0) == pytest.approx(math.log(1 - p[0]))
    assert lp(1) == pytest.approx(math.log(p[0]) + math.log(1 - p[1]))
    assert lp(2) == pytest.approx(math.log(p[0]) + math.log(p[1]))  # K reached: no halt term
    # the three depths are the whole distribution
    total = sum(math.exp(lp(d)) for d in range(3))
    assert total == pytest.approx(1.0)


def test_trajectory_entropy_counts_visited_decisions():
    logits = torch.zeros(1, 3)  # p = 0.5 everywhere: entropy log 2 per decision
    ent = grpo.trajectory_entropy(logits, torch.tensor([0]))
    assert ent.item() == pytest.approx(math.log(2))
    ent = grpo.trajectory_entropy(logits, torch.tensor([2]))  # decisions at k=0,1 only
    assert ent.item() == pytest.approx(2 * math.log(2))


def test_grpo_loss_and_gate():
    lp = torch.tensor([-1.0, -2.0])
    adv = torch.tensor([1.0, -1.0])
    ent = torch.tensor([0.5, 0.5])
    keep = torch.tensor([True, True])
    # -((-1*1 + 0.1*0.5) + (-2*-1 + 0.1*0.5)) / 2 = -(-0.95 + 2.05) / 2
    assert grpo.grpo_loss(lp, adv, ent, keep, 0.1).item() == pytest.approx(-0.55)
    gate = grpo.quality_gate(torch.tensor([0.25, 0.5, 0.5, 0.75]),
                             torch.tensor([0.5, 0.0, 0.5, 0.5]), 0.5, 0.0)
    # R_comp >= theta_comp (inclusive: "at least setup and computation"), R_qual > theta_qual
    assert gate.tolist() == [False, False, True, True]


def test_flops_diversity():
    assert grpo.flops_diversity(torch.tensor([2.0, 2.0])) == 0.0
    assert grpo.flops_diversity(torch.tensor([1.0, 3.0])) == pytest.approx(1 / 4)


def test_sample_depths_follows_probabilities():
    g = torch.Generator().manual_seed(0)
    p = torch.tensor([[1.0, 1.0, 0.3], [0.0, 1.0, 1.0]]).repeat(2000, 1)
    d = grpo.sample_depths(p, g)
    assert set(d[0::2].tolist()) == {2} and set(d[1::2].tolist()) == {0}
    half = torch.tensor([[0.5, 0.5, 0.5]]).repeat(20000, 1)
    counts = torch.bincount(grpo.sample_depths(half, g), minlength=3).float() / 20000
    assert torch.allclose(counts, torch.tensor([0.5, 0.25, 0.25]), atol=0.02)
    thresholded = grpo.sample_depths(torch.tensor([[0.15, 1.0, 1.0]]), g, tau=0.2)
    assert thresholded.tolist() == [0]


def test_config_validation():
    with pytest.raises(PonderError, match="optim"):
        GRPOConfig(optim="rmsprop").validate()
    with pytest.raises(PonderError, match="group_by"):
        GRPOConfig(group_by="cluster").validate()
    with pytest.raises(PonderError, match="max_grad_norm"):
        GRPOConfig(max_grad_norm=0.0).validate()
    with pytest.raises(PonderError, match="num_generations"):
        GRPOConfig(num_generations=1).validate()
    with pytest.raises(PonderError, match="stage1"):
        GRPOConfig(stage1="skip").validate()
    with pytest.raises(PonderError, match="t1"):
        GRPOConfig(t1=10, t2=5).validate()


# ------------------------------------------------------------------ synthetic environment
K, D, N = 4, 16, 512


def synthetic_run(steps: int = 1200, seed: int = 0, optim: str = "adam", lr: float = 1e-3,
                  max_grad_norm: float | None = 1.0, temperature_end: float | None = None):
    """States whose best depth is a known function of the input: class c in 0..K lives at
    z[1] ~ 2c - K (+-0.5), the steering direction is e_0 (so the controller sees the step
    count), and the reward is 1 for halting exactly at the class's depth. Adam with clipping
    by default (the sign checks below); ``optim="sgd"`` is Algorithm 1's plain step."""
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(123)
    z = 0.3 * torch.randn(N, D, generator=gen)
    z[:, 0] = 0
    best = torch.randint(0, K + 1, (N,), generator=gen)
    z[:, 1] = 2.0 * best - K + torch.rand(N, generator=gen) - 0.5
    h = torch.zeros(D)
    h[0] = 1.0
    cfg = GRPOConfig(prompts_per_step=16, learning_rate=lr, t1=0, t2=0, max_steps=steps,
                     quality_gates=False, entropy_beta=0.01, optim=optim,
                     max_grad_norm=max_grad_norm)
    trainer = GRPOTrainer(PonderController(D, width=64), h, torch.arange(K + 1.0), 0.2, cfg,
                          seed, temperature_end)

    def reward_fn(ids, depths):
        return {"reward": (depths == best[ids]).float(), "flops": 1.0 + depths.float()}

    for t in range(steps):
        ids = torch.randint(0, N, (16,), generator=trainer.generator)
        trainer.step(t, ids, Lookup(z[ids], reward_fn))
    return (trainer.greedy_depths(z) == best).float().mean().item()


@pytest.fixture(scope="module")
def learned():
    return synthetic_run()


def test_trainer_learns_the_optimal_depth(learned):
    assert learned >= 0.95


def test_the_papers_plain_step_learns():
    """Algorithm 1's step (SGD on the batch sum, eta = 5e-4, no clipping) learns the synthetic
    task (0.70 of states at their best depth after 1200 steps; chance is 0.2); clipped at 1.0
    it barely moves (0.22): clipping a summed gradient caps the step at eta."""
    assert synthetic_run(optim="sgd", lr=5e-4, max_grad_norm=None) >= 0.6
    assert synthetic_run(optim="sgd", lr=5e-4, max_grad_norm=1.0) < 0.4


def test_flipped_advantage_does_not_learn(monkeypatch):
    real = grpo.group_advantages
    monkeypatch.setattr(grpo, "group_advantages", lambda *a, **k: -real(*a, **k))
    assert synthetic_run() < 0.5


def test_wrong_log_probability_does_not_learn(monkeypatch):
    real = grpo.trajectory_log_prob
    # log(1 - p) where log p belongs (and vice versa): the classic sign slip in a logit
    monkeypatch.setattr(grpo, "trajectory_log_prob", lambda logits, d, t=1.0: real(-logits, d, t))
    assert synthetic_run() < 0.5


def test_imitation_stage_teaches_the_teacher():
    """Stage 1 with our fix moves the policy toward the teacher's 3..5 steps; the paper's
    schedule leaves the controller untouched."""
    gen = torch.Generator().manual_seed(0)
    z = torch.randn(64, D, generator=gen)
    h = torch.nn.functional.normalize(torch.randn(D, generator=gen), dim=0)
    offsets = torch.arange(9.0)  # one unit of h per step: depths are distinguishable

    def reward_fn(ids, depths):
        return {"reward": torch.zeros(len(ids)), "flops": 1.0 + depths.float()}

    for mode in ("imitation", "paper"):
        torch.manual_seed(0)
        ctrl = PonderController(D, width=32)
        before = {k: v.clone() for k, v in ctrl.state_dict().items()}
        cfg = GRPOConfig(stage1=mode, t1=300, t2=400, learning_rate=3e-3, prompts_per_step=8,
                         optim="adam", max_grad_norm=1.0)
        trainer = GRPOTrainer(ctrl, h, offsets, 0.2, cfg, 0)
        for t in range(300):
            ids = torch.randint(0, 64, (8,), generator=gen)
            trainer.step(t, ids, Lookup(z[ids], reward_fn))
        if mode == "paper":
            assert all(torch.equal(before[k], v) for k, v in ctrl.state_dict().items())
        else:
            depths = trainer.greedy_depths(z).float()
            assert 3.0 <= depths.mean().item() <= 5.5


def synthetic_rollout(target_sign: float, tokens: int = 4):
    """A fake backbone: each row sees `tokens` random states; the reward is target_sign x its
    mean depth, so the optimum is depth K everywhere (sign +1) or depth 0 everywhere (-1)."""
    gen = torch.Generator().manual_seed(7)

    def rollout(ids, group, policy):
        rows = len(policy.teacher)
        assert rows == len(ids) * group  # one call for the whole step
        for _ in range(tokens):
            policy(torch.randn(rows, 8, generator=gen))
        trajs = policy.trajectories([tokens] * rows)
        recs = [{"reward": target_sign * float(d.float().mean()), "flops": 1.0 + float(d.sum())}
                for _, d in trajs]
        return recs, trajs

    def score(records):
        return {"reward": torch.tensor([r["reward"] for r in records], dtype=torch.float64),
                "flops": torch.tensor([r["flops"] for r in records], dtype=torch.float64)}

    return rollout, score


@pytest.mark.parametrize("sign,want_depth", [(-1.0, 0), (1.0, 2)])
def test_token_level_update_learns_the_rewarded_direction(sign, want_depth):
    """GRPO on per-token decisions moves the greedy depth to whichever end is rewarded; a
    wrong advantage sign or log-probability would send both cases the same way."""
    torch.manual_seed(0)
    ctrl = PonderController(8, width=16)
    cfg = GRPOConfig(num_generations=4, prompts_per_step=2, t1=0, t2=0, learning_rate=5e-3,
                     optim="adam", max_grad_norm=1.0,
                     quality_gates=False, eps_div=0.0)
    offsets = torch.tensor([0.0, 0.5, 1.0])
    trainer = GRPOTrainer(ctrl, torch.ones(8), offsets, 0.5, cfg, seed=0)
    rollout, score = synthetic_rollout(sign)
    for t in range(150):
        step_tokens(trainer, t, torch.tensor([0, 1]), rollout, score)
    z = torch.randn(200, 8, generator=torch.Generator().manual_seed(3))
    depths = trainer.greedy_depths(z)
    assert (depths == want_depth).float().mean() >= 0.95


def test_token_step_reports_collapse_diagnostics():
    """As at prompt level: nan in stage 1; in stages 2-3 the mean |advantage| of the kept
    trajectories and the entropy per token (the Bernoulli entropies of at most K = 2 halting
    decisions: at most 2 log 2)."""
    cfg = GRPOConfig(num_generations=4, prompts_per_step=2, t1=1, t2=1, quality_gates=False,
                     eps_div=0.0)
    trainer = GRPOTrainer(PonderController(8, width=16), torch.ones(8),
                          torch.tensor([0.0, 0.5, 1.0]), 0.5, cfg, seed=0)
    rollout, score = synthetic_rollout(1.0)
    first = step_tokens(trainer, 0, torch.tensor([0, 1]), rollout, score)
    assert math.isnan(first.advantage_abs) and math.isnan(first.entropy)
    res = step_tokens(trainer, 5, torch.tensor([0, 1]), rollout, score)
    r = res.mean_depth  # reward = +mean depth per trajectory
    assert res.advantage_abs == pytest.approx(float((r - r.mean(1, keepdim=True)).abs().mean()),
                                              rel=1e-5)
    assert 0 < res.entropy <= 2 * math.log(2) + 1e-6


def test_imitation_stage_learns_the_teacher_depth():
    torch.manual_seed(0)
    ctrl = PonderController(8, width=16)
    cfg = GRPOConfig(num_generations=4, prompts_per_step=2, t1=1000, t2=1000, learning_rate=5e-3,
                     optim="adam", max_grad_norm=1.0,
                     teacher_min=1, teacher_max=1, eps_div=0.0)
    # a step about as long as the states and not along (1,..,1), which LayerNorm removes, so
    # z_0, z_1 and z_2 can be told apart
    trainer = GRPOTrainer(ctrl, torch.linspace(-3, 3, 8), torch.tensor([0.0, 0.5, 1.0]), 0.5,
                          cfg, seed=0)
    rollout, score = synthetic_rollout(1.0)
    z = torch.randn(200, 8, generator=torch.Generator().manual_seed(3))
    before = (trainer.greedy_depths(z) == 1).float().mean()
    for t in range(150):
        res = step_tokens(trainer, t, torch.tensor([0, 1]), rollout, score)
    assert bool(res.teacher.all())
    # Random states that LayerNorm rescales limit how well a 16-unit controller separates
    # z_0, z_1 and z_2: it plateaus at ~75% depth 1 (the reward pushes toward 2 instead).
    assert before < 0.3 and (trainer.greedy_depths(z) == 1).float().mean() >= 0.7


def test_curriculum_stage_and_sources_are_one_function_each():
    assert [grpo.curriculum_stage(t, 500, 1500) for t in (0, 499, 500, 1499, 1500)] == \
        [1, 1, 2, 2, 3]
    cfg = GRPOConfig(t1=2, t2=6)
    for t in (0, 3, 7):
        a, b = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
        got = grpo.curriculum_sources(64, t, cfg, a)
        want = torch.rand(64, generator=b) < grpo.curriculum_probability(t, cfg.t1, cfg.t2)
        assert torch.equal(got, want)
    assert grpo.curriculum_sources(32, 0, cfg, torch.Generator()).all()
    assert not grpo.curriculum_sources(32, 6, cfg, torch.Generator()).any()


@pytest.mark.parametrize("greedy", [False, True])
def test_token_policy_decides_without_host_syncs(host_syncs, greedy):
    """Online token-level training decides at every decoded token: sampled or greedy depths,
    teacher rows and rows that left the batch all stay on the backbone's device (the policy
    used to copy each state to the CPU and the offsets back). The states reach the CPU once,
    for the update."""
    torch.manual_seed(0)
    d, rows = 16, 4
    trainer = GRPOTrainer(PonderController(d, width=8), torch.randn(d) / 4,
                          torch.linspace(0, 0.4, 4), tau=0.5, cfg=GRPOConfig(), seed=0)
    policy = trainer.token_policy(torch.tensor([True, False, False, True]),
                                  torch.tensor([2, 0, 0, 1]), greedy=greedy)
    states = [torch.randn(rows, d) for _ in range(3)] + [torch.randn(2, d)]
    remaining = [None, None, None, torch.tensor([1, 3])]
    host_syncs.active = True
    offsets = [policy(z, r) for z, r in zip(states, remaining)]
    host_syncs.active = False
    assert host_syncs.calls == []
    if not greedy:  # teacher rows ponder their teacher depth, also after others left
        assert offsets[0][0] == trainer.offsets[2] and offsets[3][1] == trainer.offsets[1]
    assert [o.shape[0] for o in offsets] == [4, 4, 4, 2]


# ------------------------------------------------------------------ issue 38: paper training
def test_annealed_temperature_is_monotone_and_hits_its_end_points():
    """Soft (start) through stage 1, hard (end) at the last step, never rising in between;
    geometric, so the midpoint of the anneal is the geometric mean."""
    t1, steps = 500, 2500
    temps = [grpo.annealed_temperature(t, 1.0, 0.1, t1, steps) for t in range(steps)]
    assert all(a >= b for a, b in zip(temps, temps[1:]))
    assert temps[0] == temps[t1] == 1.0 and temps[-1] == pytest.approx(0.1)
    assert temps[t1 + (steps - 1 - t1) // 2] == pytest.approx(math.sqrt(0.1), rel=1e-3)
    assert grpo.annealed_temperature(10**6, 1.0, 0.1, t1, steps) == pytest.approx(0.1)
    assert grpo.annealed_temperature(700, 1.0, None, t1, steps) == 1.0  # off: constant


def test_trainer_anneals_the_controllers_temperature():
    ctrl = PonderController(D, width=8)
    cfg = GRPOConfig(prompts_per_step=2, num_generations=2, t1=2, t2=3, max_steps=6,
                     quality_gates=False, eps_div=0.0)
    trainer = GRPOTrainer(ctrl, torch.ones(D), torch.arange(3.0), 0.2, cfg, 0,
                          temperature_end=0.1)

    def reward_fn(ids, depths):
        return {"reward": depths.float(), "flops": 1.0 + depths.float()}

    seen = [trainer.step(t, torch.tensor([0, 1]), Lookup(torch.randn(2, D), reward_fn)).temperature
            for t in range(6)]
    assert seen[:3] == [1.0, 1.0, 1.0] and seen[-1] == pytest.approx(0.1)
    assert ctrl.temperature == pytest.approx(0.1)


def test_theta_comp_is_the_completeness_of_setup_and_computation():
    """theta_comp is derived from the completeness reward, not written down: the score of an
    answer that shows a setup and a computation and nothing else, under the run's stage
    weights; with it, such an answer passes the gate and one without its setup fails."""
    from lm_eval_ponder.training.rewards import RewardConfig, completeness_reward

    reward = RewardConfig()
    both = "Let x be the sum. 3 + 4 = 7"
    assert grpo.completeness_threshold(reward) == completeness_reward(both, reward) == 0.5
    assert GRPOConfig().validate().theta_comp == 0.5
    weighted = RewardConfig(stage_weights={"setup": 0.1, "computation": 0.2,
                                           "verification": 0.3, "conclusion": 0.4})
    assert GRPOConfig().validate(weighted).theta_comp == pytest.approx(0.3)
    assert GRPOConfig(theta_comp=0.25).validate(weighted).theta_comp == 0.25  # explicit wins
    comp = torch.tensor([completeness_reward(both, reward),
                         completeness_reward("3 + 4 = 7", reward)], dtype=torch.float64)
    gate = grpo.quality_gate(comp, torch.ones(2), grpo.completeness_threshold(reward),
                             grpo.QUALITY_CUT)
    assert gate.tolist() == [True, False]


def test_each_gates_drops_are_reported_in_stage_3_only():
    cfg = GRPOConfig(prompts_per_step=2, num_generations=4, t1=1, t2=2, max_steps=4,
                     eps_div=0.0)
    trainer = GRPOTrainer(PonderController(D, width=8), torch.ones(D), torch.arange(3.0), 0.2,
                          cfg, 0)
    comp = torch.tensor([0.0, 0.5, 0.5, 0.75, 0.25, 0.5, 1.0, 0.5], dtype=torch.float64)
    qual = torch.tensor([0.5, 0.05, 0.9, 0.9, 0.0, 0.5, 0.5, 0.5], dtype=torch.float64)

    def reward_fn(ids, depths):
        return {"reward": depths.double(), "flops": 1.0 + depths.double(), "comp": comp,
                "qual": qual}

    z = torch.randn(2, D)
    early = trainer.step(1, torch.tensor([0, 1]), Lookup(z, reward_fn))  # stage 2: no gate
    assert not early.gate_drops.any() and early.keep.all()
    late = trainer.step(2, torch.tensor([0, 1]), Lookup(z, reward_fn))  # stage 3
    drops = late.gate_drops.view(-1, 2)
    assert drops[:, 0].tolist() == [True, False, False, False, True, False, False, False]
    assert drops[:, 1].tolist() == [False, True, False, False, True, False, False, False]
    assert late.keep.view(-1).tolist() == [False, False, True, True, False, True, True, True]


def test_group_advantages_by_problem_type_by_hand():
    """Rows with one label share one baseline (the paper's grouping by problem type); per
    prompt (no labels) is each row alone; gates and the two-survivor rule apply per group."""
    r = torch.tensor([[1.0, 0.0], [3.0, 2.0], [5.0, 5.0]])
    per_prompt = grpo.group_advantages(r)
    assert torch.allclose(per_prompt, torch.tensor([[0.5, -0.5], [0.5, -0.5], [0.0, 0.0]]))
    by_type = grpo.group_advantages(r, groups=torch.tensor([7, 7, 2]))
    assert torch.allclose(by_type, torch.tensor([[-0.5, -1.5], [1.5, 0.5], [0.0, 0.0]]))
    assert torch.allclose(grpo.group_advantages(r, groups=torch.tensor([0, 1, 2])), per_prompt)
    keep = torch.tensor([[True, False], [False, False], [True, True]])
    # type 7 keeps one trajectory: no baseline, no advantage
    assert torch.equal(grpo.group_advantages(r, keep, groups=torch.tensor([7, 7, 2])),
                       torch.zeros(3, 2))
    scaled = grpo.group_advantages(r, groups=torch.tensor([7, 7, 2]), scale_std=True)
    std = torch.tensor([1.0, 0.0, 3.0, 2.0]).std()
    assert torch.allclose(scaled[:2].reshape(-1), by_type[:2].reshape(-1) / std, atol=1e-6)


def test_type_groups_reach_the_advantages(monkeypatch):
    seen = {}
    real = grpo.group_advantages

    def spy(rewards, keep=None, scale_std=False, groups=None):
        seen["groups"] = groups
        return real(rewards, keep, scale_std, groups)

    monkeypatch.setattr(grpo, "group_advantages", spy)
    cfg = GRPOConfig(prompts_per_step=2, num_generations=2, t1=0, t2=0, group_by="type",
                     quality_gates=False, eps_div=0.0)
    trainer = GRPOTrainer(PonderController(D, width=8), torch.ones(D), torch.arange(3.0), 0.2,
                          cfg, 0)

    def reward_fn(ids, depths):
        return {"reward": depths.float(), "flops": 1.0 + depths.float()}

    with pytest.raises(PonderError, match="problem type"):
        trainer.step(0, torch.tensor([0, 1]), Lookup(torch.randn(2, D), reward_fn))
    trainer.step(0, torch.tensor([0, 1]), Lookup(torch.randn(2, D), reward_fn),
                 types=torch.tensor([3, 3]))
    assert seen["groups"].tolist() == [3, 3]


def test_a_diverged_update_stops_training(monkeypatch):
    """A non-finite loss raises instead of leaving NaN weights, which would ship a controller
    that halts at K_max everywhere under the threshold rule."""
    monkeypatch.setattr(grpo, "grpo_loss", lambda *a, **k: torch.tensor(float("nan"),
                                                                      requires_grad=True))
    cfg = GRPOConfig(prompts_per_step=2, num_generations=2, t1=0, t2=0, quality_gates=False,
                     eps_div=0.0)
    trainer = GRPOTrainer(PonderController(D, width=8), torch.ones(D), torch.arange(3.0), 0.2,
                          cfg, 0)
    before = {k: v.clone() for k, v in trainer.controller.state_dict().items()}
    with pytest.raises(PonderError, match="diverged at step 1"):
        trainer.step(0, torch.tensor([0, 1]), Lookup(torch.randn(2, D),
                     lambda ids, d: {"reward": d.float(), "flops": 1.0 + d.float()}))
    assert all(torch.equal(before[k], v) for k, v in trainer.controller.state_dict().items())


def test_sgd_step_is_the_algorithms_sum_over_the_batch(monkeypatch):
    """optim="sgd" at eta equals SGD at eta x (trajectories in the batch) on the mean loss:
    Algorithm 1's theta += eta sum_i A_i grad log pi_i. Stage 1's imitation loss is a mean over
    all P x G trajectories; no clipping unless max_grad_norm is set."""
    def trained(lr, scale_fn=None):
        torch.manual_seed(0)
        ctrl = PonderController(D, width=8)
        cfg = GRPOConfig(prompts_per_step=2, num_generations=4, t1=5, t2=5, optim="sgd",
                         learning_rate=lr, eps_div=0.0, max_grad_norm=None)
        trainer = GRPOTrainer(ctrl, torch.ones(D), torch.arange(3.0), 0.2, cfg, 0)
        if scale_fn is not None:
            monkeypatch.setattr(trainer, "batch_sum_scale", scale_fn)
        trainer.step(0, torch.tensor([0, 1]), Lookup(
            torch.randn(2, D, generator=torch.Generator().manual_seed(1)),
            lambda ids, d: {"reward": d.float(), "flops": 1.0 + d.float()}))
        return ctrl.state_dict()

    summed = trained(1e-4)
    mean_at_n = trained(1e-4 * 2 * 4, scale_fn=lambda n, gather: 1.0)
    assert all(torch.allclose(summed[k], mean_at_n[k], atol=1e-7) for k in summed)
    clipped = []
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_",
                        lambda params, norm: clipped.append(norm))
    trained(1e-4)
    assert clipped == []  # max_grad_norm None: no clipping


# ------------------------------------------------------------------ issue 52: the recipe as written
def test_curriculum_temperature_schedule_is_linear_over_the_handover():
    """The other reading of the paper's anneal: 1.0 through stage 1, linear to the end value at
    T2 (midway at the midpoint), then the end value through stage 3; an unknown schedule is
    refused by the config, not silently geometric."""
    t1, t2, steps = 500, 1500, 2500
    temps = [grpo.annealed_temperature(t, 1.0, 0.1, t1, steps, "curriculum", t2)
             for t in range(steps)]
    assert temps[0] == temps[t1] == 1.0
    assert temps[(t1 + t2) // 2] == pytest.approx(0.55)
    assert temps[t2] == pytest.approx(0.1) and temps[-1] == pytest.approx(0.1)
    assert all(a >= b for a, b in zip(temps, temps[1:]))
    # the geometric default reaches 0.1 only at the last step
    assert grpo.annealed_temperature(t2, 1.0, 0.1, t1, steps) > 0.2
    with pytest.raises(PonderError, match="temperature_schedule"):
        GRPOConfig(temperature_schedule="cosine").validate()


@pytest.mark.parametrize("threshold", [False, True])
def test_threshold_in_training_cuts_the_teachers_trajectories_too(threshold):
    """Algorithm 1 tests "a_k = 0 or p_k <= tau" after the teacher's override: with the
    threshold on, a controller whose phi is below tau everywhere halts every trajectory at
    depth 0, the teacher's included; without it the teacher ponders its 3-5 steps. At token
    level the same."""
    torch.manual_seed(0)
    ctrl = PonderController(D, width=8)
    with torch.no_grad():
        ctrl.head.bias.fill_(-20.0)  # phi ~ 2e-9 on every state
    cfg = GRPOConfig(prompts_per_step=2, num_generations=4, t1=10, t2=20, max_steps=30,
                     quality_gates=False, eps_div=0.0, threshold_in_training=threshold)
    trainer = GRPOTrainer(ctrl, torch.ones(D), torch.arange(9.0) / 10, 0.2, cfg, 0)
    env = Lookup(torch.randn(2, D), lambda ids, depths: {"reward": depths.float(),
                                                          "flops": 1.0 + depths.float()})
    batch = trainer.sample_prompts(0, torch.tensor([0, 1]), env)  # stage 1: all teacher
    assert bool(batch.teacher.all())
    if threshold:
        assert batch.depths.eq(0).all()
    else:
        assert batch.depths.ge(3).all() and batch.depths.le(5).all()
    policy = trainer.token_policy(torch.tensor([True, True]), torch.tensor([4, 3]))
    offsets = policy(torch.randn(2, D))
    assert offsets.tolist() == ([0.0, 0.0] if threshold else
                                [trainer.offsets[4].item(), trainer.offsets[3].item()])
