"""The trainer's positive control (``training.control``): the shipped recipe, unchanged, on
small versions of the shipped worlds must beat the best fixed depth on held-out contexts with
the interval of its gain above 0 (issue 75). Minutes, not seconds: each world trains the real
controller (width 512) through ``training.loop.fit``."""

from __future__ import annotations

import json

import pytest
import torch

from lm_eval_ponder.errors import PonderError
from lm_eval_ponder.training import control
from lm_eval_ponder.training.config import parse_args
from lm_eval_ponder.training.control import load_world, passed, realise, run_control, score

# small versions: fewer contexts (the held-out 100 keep the interval meaningful)
SMALL = {"clean": {"contexts": 250}, "organism": {"contexts": 300},
         "non_monotone": {"contexts": 250}}


@pytest.mark.parametrize("name", sorted(SMALL))
def test_the_shipped_recipe_beats_the_best_fixed_depth(name, tmp_path):
    cfg = parse_args(["--output", str(tmp_path / name)])
    report = run_control(cfg, load_world(name, **SMALL[name]), [0], ceiling=False,
                         progress=False)
    result = report["results"][0]
    assert result["label"].startswith("default (expected)")
    assert passed(result), control.summary_table(report["results"])
    assert result["score"]["captured"] > 0.3
    assert json.loads((tmp_path / name / "control.json").read_text())["passed"]


def test_a_fixed_depth_or_a_shuffled_policy_does_not_pass():
    """The bar can fail: the best fixed depth itself, and the oracle's depths given to the
    wrong contexts, gain nothing over the best fixed depth."""
    world = load_world("clean")
    realised = realise(world)
    levels = [realised.levels[i] for i in realised.held_out]
    truth = control.truth_table(world, levels)
    best_fixed = int(truth.mean(0).argmax())
    fixed = {"score": score(world, levels, torch.full((len(levels),), best_fixed))}
    assert not passed(fixed) and fixed["score"]["captured"] == 0
    oracle = truth.argmax(1)
    shuffled = oracle[torch.randperm(len(levels), generator=torch.Generator().manual_seed(0))]
    assert not passed({"score": score(world, levels, shuffled)})
    assert passed({"score": score(world, levels, oracle)})
    assert score(world, levels, oracle)["captured"] == pytest.approx(1.0)


def test_a_world_realises_its_levels_and_draws():
    world = load_world("organism", contexts=50, held_out=10, draws=4)
    realised = realise(world)
    assert realised.z0.shape == (50, world.width)
    assert len(realised.train) == 40 and len(realised.held_out) == 10
    key = realised.prompts[0].key
    assert [len(realised.table[(key, d)]) for d in range(world.n_depths)] == [4] * 9
    # depths of one mode share their draws; the world's features reach the records
    assert realised.table[(key, 0)][0]["correct"] == realised.table[(key, 2)][0]["correct"]
    assert realised.table[(key, 0)][0]["text_features"]["stages"] == ["conclusion"]
    assert realise(world).z0.equal(realised.z0)  # the world's seed fixes it


@pytest.mark.parametrize("change, words", [
    ({"modes": {"direct": [0, 2], "steps": [4, 8]}}, "cover depths"),
    ({"contexts": 10, "held_out": 10}, "held_out"),
    ({"features": {"direct": {}}}, "features"),
])
def test_a_malformed_world_is_one_line(tmp_path, change, words):
    data = json.loads(control.world_path("clean").read_text())
    data.update(change)
    path = tmp_path / "w.json"
    path.write_text(json.dumps(data))
    with pytest.raises(PonderError, match=words):
        load_world(str(path))


def test_an_unknown_world_names_the_shipped_ones():
    with pytest.raises(PonderError, match="clean, non_monotone, organism"):
        load_world("nowhere")


def test_a_world_and_a_recipe_of_other_depths_are_refused(tmp_path):
    cfg = parse_args(["--output", str(tmp_path), "--ponder.k_max", "4"])
    with pytest.raises(PonderError, match="--ponder.k_max 8"):
        run_control(cfg, load_world("clean", contexts=40, held_out=10), [0], progress=False)


def test_a_world_from_a_rollout_cache_has_its_landscape(tmp_path):
    """--control-from: per level and depth the cache's accuracy and tokens, its samples as
    draws, one mode per depth; written beside the run and loadable again."""
    from lm_eval_ponder.training.rollouts import Prompt, RolloutCache

    cache = RolloutCache(tmp_path / "cache", manifest={"fingerprint": "x", "identity": {},
                                                       "k_max": 1})
    prompts = [Prompt(f"k{i}", "arith_ponder", str(i), 1 + i % 2, "", "", "numeric")
               for i in range(8)]
    cache.write_prompts(prompts, torch.randn(8, 6))
    records = [{"key": p.key, "depth": d, "sample": s, "correct": d == 1 or p.level == 1,
                "gen_tokens": 10 + 20 * d, "flops": 1e6 * (10 + 20 * d), "rel_error": None,
                "ppl": 2.0, "text": "so the answer is 3"}
               for p in prompts for d in (0, 1) for s in (0, 1)]
    cache.append(0, records)
    cfg = parse_args(["--output", str(tmp_path / "out"), "--ponder.k_max", "1"])
    world = control.world_from_cache(str(tmp_path / "cache"), cfg)
    assert world.modes == {"d0": [0, 0], "d1": [1, 1]} and world.draws == 2
    assert world.levels["arith_ponder level 2"]["d0"] == {"accuracy": 0.0, "tokens": 10}
    assert world.levels["arith_ponder level 1"]["d1"] == {"accuracy": 1.0, "tokens": 30}
    assert world.width == 6 and world.price_per_1k_tokens == cfg.reward.price_per_1k_tokens
    assert load_world(str(tmp_path / "out" / "world.json")).levels == world.levels
