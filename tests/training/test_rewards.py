"""Each reward equation against values computed by hand."""

from __future__ import annotations

import math

import pytest

from lm_eval_ponder.errors import PonderError
from lm_eval_ponder.training import rewards as R

CFG = R.RewardConfig()


def test_accuracy_reward_three_levels():
    assert R.accuracy_reward(True, None, CFG) == 1.0
    # relative error 0.05 < theta_tol=0.1: 0.5 * exp(-0.05)
    assert R.accuracy_reward(False, 0.05, CFG) == pytest.approx(0.5 * math.exp(-0.05))
    assert R.accuracy_reward(False, 0.1, CFG) == 0.0  # not under the tolerance
    assert R.accuracy_reward(False, None, CFG) == 0.0  # non-numeric: exact only
    assert R.accuracy_reward(False, float("nan"), CFG) == 0.0


def test_flops_reward_is_a_scaled_zscore():
    # -0.1 * (150 - 100) / (25 + 1e-8)
    assert R.flops_reward(150.0, 100.0, 25.0, CFG) == pytest.approx(-0.2)
    assert R.flops_reward(50.0, 100.0, 25.0, CFG) == pytest.approx(0.2)


def test_completeness_reward_counts_stages():
    text = "Given 3 apples, we compute 3 * 4 = 12. Let me check: 12 / 4 = 3. The answer is 12."
    assert R.completeness_reward(text, CFG) == pytest.approx(1.0)
    assert R.completeness_reward("12", CFG) == 0.0
    assert R.completeness_reward("2 + 2 = 4", CFG) == pytest.approx(0.25)  # computation only
    assert R.completeness_reward("The answer is 4", CFG) == pytest.approx(0.25)


def test_quality_reward_length_and_perplexity():
    # 32 of 64 target tokens, PPL 6 vs baseline 4, sigma 2: 0.5 * exp(-1)
    assert R.quality_reward(32, 6.0, 4.0, 2.0, CFG) == pytest.approx(0.5 * math.exp(-1))
    assert R.quality_reward(128, 3.0, 4.0, 2.0, CFG) == 1.0  # both factors capped at 1
    assert R.quality_reward(0, 3.0, 4.0, 2.0, CFG) == 0.0
    assert R.quality_reward(10, None, 4.0, 2.0, CFG) == 0.0
    assert R.quality_reward(64, 1e6, 4.0, 2.0, CFG) == pytest.approx(0.0)  # no overflow


def test_repetition_reward_by_hand():
    words = "a b a b a b".split()  # 6 words
    assert R.repeated_ngrams(words, 1) == 4  # 6 unigrams, 2 distinct
    assert R.repeated_ngrams(words, 2) == 3  # 5 bigrams: ab ba ab ba ab -> 2 distinct
    assert R.repeated_ngrams(words, 3) == 2  # 4 trigrams: aba bab aba bab -> 2 distinct
    expected = -(0.02 * 4 + 0.05 * 3 + 0.1 * 2) / 6
    assert R.repetition_reward("a b a b a b", CFG) == pytest.approx(expected)
    assert R.repetition_reward("", CFG) == 0.0
    assert R.repetition_reward("all words differ here", CFG) == 0.0


def test_total_reward_applies_each_weight_once():
    comps = {"acc": 1.0, "flops": -0.2, "comp": 0.5, "qual": 0.25, "rep": -0.1}
    weights = {"acc": 1.0, "flops": 2.0, "comp": 0.1, "qual": 0.2, "rep": 1.0}
    assert R.total_reward(comps, weights) == pytest.approx(1.0 - 0.4 + 0.05 + 0.05 - 0.1)


def test_balance_weights_moves_toward_target():
    # w <- w * exp(eta * (log target - log magnitude)) = 1 * exp(0.5 * log(0.25)) = 0.5
    out = R.balance_weights({"flops": 1.0, "acc": 1.0}, {"flops": 1.0, "acc": 1.0},
                            {"flops": 0.25}, eta=0.5)
    assert out["flops"] == pytest.approx(0.5)
    assert out["acc"] == 1.0  # no target: unchanged
    assert R.balance_weights({"flops": 1.0}, {"flops": 0.0}, {"flops": 0.3}, 0.5) == {"flops": 1.0}


def test_running_stats_ema():
    s = R.RunningStats(momentum=0.5)
    s.update([1.0, 3.0])  # first batch initialises: mean 2, var 1
    assert (s.mean, s.var) == (2.0, 1.0)
    s.update([6.0])  # mean 0.5*2 + 0.5*6 = 4; var 0.5*1 + 0.5*(0 + 0.5*16) = 4.5
    assert s.mean == pytest.approx(4.0)
    assert s.var == pytest.approx(4.5)
    assert s.std == pytest.approx(math.sqrt(4.5))


def test_quality_reference_median_and_iqr():
    base, sigma = R.quality_reference([1.0, 2.0, 3.0, 4.0, 5.0])
    assert base == 3.0 and sigma == pytest.approx(2.0)
    assert R.quality_reference([]) == (1.0, 1.0)


def test_reward_components_of_a_record():
    stats = R.RunningStats(0.9)
    stats.update([100.0, 300.0])  # mean 200, std 100
    record = {"correct": True, "rel_error": 0.0, "text": "The answer is 4", "gen_tokens": 64,
              "ppl": 2.0}
    comps = R.reward_components(record, 300.0, stats, (2.0, 1.0), CFG)
    assert comps == pytest.approx({"acc": 1.0, "flops": -0.1, "comp": 0.25, "qual": 1.0,
                                   "rep": 0.0})


def test_bad_reward_config_is_refused():
    with pytest.raises(PonderError, match="beta_1"):
        R.RewardConfig(rep_betas=(0.3, 0.2, 0.1)).validate()
    with pytest.raises(PonderError, match="unknown reward components"):
        R.RewardConfig(balance=("speed",)).validate()


def test_flops_std_floor_lives_in_the_flops_reward():
    cfg = R.RewardConfig(lambda_flops=1.0)
    # a near-constant history: the std is floored at 1% of the mean, not ~0
    assert R.flops_reward(101.0, 100.0, 1e-9, cfg) == pytest.approx(-1.0, rel=1e-6)
    assert R.flops_reward(110.0, 100.0, 5.0, cfg) == pytest.approx(-2.0, rel=1e-6)
    floored = R.RewardConfig(lambda_flops=1.0, flops_std_floor=0.1)
    assert R.flops_reward(110.0, 100.0, 1e-9, floored) == pytest.approx(-1.0, rel=1e-6)


def test_balance_targets_follow_accuracy_magnitude():
    cfg = R.RewardConfig(balance=("flops", "rep"), balance_ratio=0.5)
    assert R.balance_targets({"acc": 0.4, "flops": 2.0}, cfg) == {"flops": 0.2, "rep": 0.2}
    assert R.balance_targets({"acc": 0.0, "flops": 2.0}, cfg) == {}  # nothing to aim at yet


def test_rewards_are_named_functions_in_component_order():
    assert tuple(name for name, _ in R.REWARD_FUNCTIONS) == R.COMPONENTS
    cfg = R.RewardConfig()
    stats = R.RunningStats(0.9)
    stats.update([100.0, 140.0])
    rec = {"correct": True, "rel_error": None, "text": "Let x = 2. Then 2 + 2 = 4. The answer is 4",
           "gen_tokens": 20, "ppl": 3.0}
    comps = R.reward_components(rec, 130.0, stats, (2.0, 1.0), cfg)
    assert comps == {
        "acc": R.accuracy_reward(True, None, cfg),
        "flops": R.flops_reward(130.0, stats.mean, stats.std, cfg),
        "comp": R.completeness_reward(rec["text"], cfg),
        "qual": R.quality_reward(20, 3.0, 2.0, 1.0, cfg),
        "rep": R.repetition_reward(rec["text"], cfg),
    }
