"""lm_eval_ponder.reporting.seeds and the report's handling of seeds: runs of one configuration
with different seeds are one row, the per-question mean over seeds, with a bootstrap interval
over questions; a run's seed comes from lm-eval's results JSON."""

from __future__ import annotations

import pytest
from test_report import GEN, ponder_config, write_run

from lm_eval_ponder.reporting import report as rp
from lm_eval_ponder.reporting.seeds import bootstrap_interval, merge_seeds, run_seed


def sample(doc_id: int, correct: bool, tokens: float) -> dict:
    return {"doc_id": doc_id, "doc": {"level": 1}, "exact_match": float(correct),
            "gen_tokens": tokens, "flops": tokens * 1e9, "ponder_steps": 0.0,
            "resps": [[f"a{doc_id}-{correct}"]]}


def test_merge_averages_each_question_over_the_seeds_that_all_answered():
    by_seed = {0: [sample(0, True, 10), sample(1, False, 20), sample(2, True, 30)],
               1: [sample(0, False, 14), sample(1, False, 22)]}  # seed 1 lacks question 2
    merged = merge_seeds(by_seed)
    assert [m["doc_id"] for m in merged] == [0, 1]
    assert [m["exact_match"] for m in merged] == [0.5, 0.0]
    assert [m["gen_tokens"] for m in merged] == [12, 21] and merged[0]["n_seeds"] == 2
    assert merged[0]["resps_sha256"] != merge_seeds({0: by_seed[0]})[0].get("resps_sha256")


def test_bootstrap_interval_is_deterministic_and_shrinks_with_questions():
    few = [1.0, 0.0, 0.5, 1.0, 0.0, 0.5, 1 / 3, 2 / 3] * 5
    lo, hi = bootstrap_interval(few)
    assert (lo, hi) == bootstrap_interval(few)  # a report rebuilds to the same metrics
    assert lo < sum(few) / len(few) < hi
    lo4, hi4 = bootstrap_interval(few * 4)
    assert hi4 - lo4 < hi - lo


def test_run_seed_reads_lm_evals_config():
    assert run_seed({"config": {"random_seed": 0, "torch_seed": 2}}) == 2
    assert run_seed({"config": {"random_seed": 1}}) == 1
    assert run_seed({"config": {}}) is None


def test_report_shows_one_row_per_configuration_over_its_seeds(tmp_path):
    """Three seeds of one sampled configuration: one row, the mean, a bootstrap interval, a
    note naming the seeds. Without the seed rule they would be refused as a disagreeing pair."""
    rows = {0: [(i % 2 == 0, 10, 0, 1) for i in range(40)],
            1: [(i % 4 == 0, 12, 0, 1) for i in range(40)],
            2: [(i % 2 == 1, 14, 0, 1) for i in range(40)]}
    for seed, r in rows.items():
        write_run(tmp_path, f"s{seed}", {"controller": "/c"}, "arith_ponder", r,
                  config={**ponder_config(), "torch_seed": seed, "random_seed": seed},
                  configs=GEN)
    runs = rp.load_runs([tmp_path])
    assert len(runs) == 1 and runs[0].seeds == [0, 1, 2]
    table, notes = rp.leaderboard(runs)
    cell = table[0]["arith"]
    assert cell["seeds"] == 3 and cell["acc"] == pytest.approx((20 + 10 + 20) / 120)
    assert cell["tokens"] == pytest.approx(12)
    assert cell["lo"] < cell["acc"] < cell["hi"]
    assert any("mean of 3 seeds (0, 1, 2)" in n for n in notes)
