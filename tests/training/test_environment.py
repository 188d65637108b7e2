"""Rewards over cached outcomes (lm_eval_ponder.training.environment): the deterministic
train/validation split, the reward state shared by both trainers, and cache lookups."""

from __future__ import annotations

import pytest
import torch

from lm_eval_ponder.errors import PonderError
from lm_eval_ponder.training import rewards as R
from lm_eval_ponder.training.environment import (
    CachedEnvironment,
    RewardBook,
    problem_types,
    reward_key,
    split_prompts,
)
from lm_eval_ponder.training.rollouts import Prompt, RolloutCache


def record(key, depth, correct, flops, text="The answer is 4", sample=0):
    return {"key": key, "depth": depth, "sample": sample, "correct": correct, "flops": flops,
            "gen_tokens": 10 + depth, "text": text, "ppl": 2.0, "rel_error": None}


def test_split_is_deterministic_disjoint_and_complete():
    keys = [f"k{i}" for i in range(200)]
    train, val = split_prompts(keys, 0.2)
    assert (train, val) == split_prompts(keys, 0.2)
    assert sorted(train + val) == list(range(200)) and 20 < len(val) < 60
    with pytest.raises(PonderError, match="no training prompts"):
        split_prompts(["a"], 0.999999)


def test_problem_types_are_task_and_level():
    """GRPO's "grouping by problem type": one label per (task, level); a dataset without
    levels is one type."""
    def prompt(task, level, i):
        return Prompt(f"{task}{level}{i}", task, str(i), level, "q", "1", "numeric")

    prompts = [prompt("arith_ponder", 1, 0), prompt("gsm8k_ponder", None, 1),
               prompt("arith_ponder", 3, 2), prompt("arith_ponder", 1, 3),
               prompt("gsm8k_ponder", None, 4)]
    labels = problem_types(prompts).tolist()
    assert labels[0] == labels[3] and labels[1] == labels[4]
    assert len({labels[0], labels[1], labels[2]}) == 3


def test_reward_book_scores_then_balances_flops_weight():
    cfg = R.RewardConfig(objective="paper", balance_every=2)
    book = RewardBook(cfg, ppl_ref=(2.0, 1.0))
    recs = [record("a", 0, True, 100.0), record("a", 1, False, 300.0)]
    out = book.score(recs, [100.0, 300.0])
    assert out["correct"].tolist() == [1.0, 0.0] and out[reward_key("acc")].tolist() == [1.0, 0.0]
    expected = [R.total_reward(R.reward_components(r, f, book.stats, (2.0, 1.0), cfg),
                               book.weights) for r, f in zip(recs, [100.0, 300.0])]
    assert out["reward"].tolist() == pytest.approx(expected)
    w0 = book.weights["flops"]
    book.observe(out, 0)
    assert book.weights["flops"] == w0  # not yet: every balance_every steps
    book.observe(book.score(recs, [100.0, 300.0]), 1)
    assert book.weights["flops"] != w0 and book.weights["acc"] == cfg.weights["acc"]


def test_cached_environment_looks_outcomes_up(tmp_path):
    prompts = [Prompt(f"p{i}", "arith_ponder", str(i), 1, "What is 2+2?", "4", "numeric")
               for i in range(2)]
    cache = RolloutCache(tmp_path, manifest={"fingerprint": "x"})
    cache.write_prompts(prompts, torch.zeros(2, 8))
    cache.append(0, [record(p.key, k, k == 1, 100.0 * (k + 1)) for p in prompts for k in range(3)])
    env = CachedEnvironment(cache, k_max=2, samples=1, controller_flops=5.0,
                            reward_cfg=R.RewardConfig(), generator=torch.Generator())
    out = env(torch.tensor([0, 1]), torch.tensor([1, 2]))
    assert out["correct"].tolist() == [1.0, 0.0]
    assert out["flops"].tolist() == [205.0, 305.0]  # cached FLOPs + the controller's
    figures = env.evaluate([0, 1], torch.tensor([1, 1]))
    assert figures["accuracy"] == 1.0 and figures["depth"] == 1.0
    assert env.oracle([0, 1])["best_fixed_depth"] in (0, 1, 2)


def test_incomplete_cache_is_refused(tmp_path):
    prompts = [Prompt("p0", "arith_ponder", "0", 1, "q", "4", "numeric")]
    cache = RolloutCache(tmp_path, manifest={"fingerprint": "x"})
    cache.write_prompts(prompts, torch.zeros(1, 8))
    cache.append(0, [record("p0", 0, True, 1.0)])
    with pytest.raises(PonderError, match="incomplete"):
        CachedEnvironment(cache, k_max=2, samples=1, controller_flops=0.0,
                          reward_cfg=R.RewardConfig(), generator=torch.Generator())


def test_analysis_of_a_cache_in_progress_keeps_only_complete_prompts(tmp_path):
    prompts = [Prompt(f"p{i}", "arith_ponder", str(i), 1, "q", "4", "numeric") for i in range(3)]
    cache = RolloutCache(tmp_path, manifest={"fingerprint": "x"})
    cache.write_prompts(prompts, torch.arange(3.0).repeat_interleave(8).view(3, 8))
    # p0 and p2 complete (2 depths x 2 samples), p1 missing one sample
    cache.append(0, [record(p, k, s == 0, 10.0, sample=s) for p in ("p0", "p2")
                     for k in range(2) for s in range(2)])
    cache.append(0, [record("p1", 0, True, 10.0, sample=0)])
    env = CachedEnvironment(cache, k_max=1, samples=2, controller_flops=0.0,
                            reward_cfg=R.RewardConfig(), generator=torch.Generator(),
                            complete_only=True)
    assert [p.key for p in env.prompts] == ["p0", "p2"]
    assert env.z0[:, 0].tolist() == [0.0, 2.0]  # states follow their prompts
    assert env.expected(0, 1)["accuracy"] == 0.5  # the mean over samples
    assert env.expected(0, 1, samples=[0])["accuracy"] == 1.0
    first = CachedEnvironment(cache, k_max=1, samples=2, controller_flops=0.0,
                              reward_cfg=R.RewardConfig(), generator=torch.Generator(),
                              complete_only=True, max_prompts=1)
    assert [p.key for p in first.prompts] == ["p0"] and first.z0[:, 0].tolist() == [0.0]
    empty = RolloutCache(tmp_path / "empty", manifest={"fingerprint": "y"})
    empty.write_prompts(prompts[:1], torch.zeros(1, 8))
    with pytest.raises(PonderError, match="no prompt with all"):
        CachedEnvironment(empty, k_max=1, samples=2, controller_flops=0.0,
                          reward_cfg=R.RewardConfig(), generator=torch.Generator(),
                          complete_only=True)


def test_the_priced_objective_is_stationary_and_never_rebalances():
    """The default objective: accuracy minus the user's price per 1,000 tokens, whatever the
    batch and the running FLOPs statistics; no weight adapts."""
    cfg = R.RewardConfig(price_per_1k_tokens=2.0, balance_every=1)
    book = RewardBook(cfg, ppl_ref=(2.0, 1.0))
    recs = [record("a", 0, True, 100.0), record("a", 1, False, 300.0)]
    first = book.score(recs, [100.0, 300.0])
    for t in range(5):
        book.observe(book.score(recs, [100.0, 300.0]), t)
    again = book.score(recs, [100.0, 300.0])
    tokens = [r["gen_tokens"] for r in recs]
    assert first["reward"].tolist() == pytest.approx([1 - 2.0 * tokens[0] / 1000,
                                                      -2.0 * tokens[1] / 1000])
    assert again["reward"].tolist() == first["reward"].tolist()
    assert book.weights == cfg.weights
