"""What the report measures: intervals, ranks, fronts, levels, strong wins."""

from __future__ import annotations

import math

import pytest

from lm_eval_ponder.reporting import measures as ms


def test_wilson_and_pareto():
    lo, hi = ms.wilson(5, 10)
    assert lo == pytest.approx(0.2366, abs=1e-3) and hi == pytest.approx(0.7634, abs=1e-3)
    assert math.isnan(ms.wilson(0, 0)[0])
    assert ms.pareto_front([(1, 0.5), (2, 0.4), (3, 0.9), (0.5, 0.1)]) == [3, 0, 2]


def sample(doc_id, level, correct, tokens=10):
    return {"doc_id": doc_id, "doc": {"level": level}, "exact_match": float(correct),
            "gen_tokens": tokens, "flops": 1e9 * tokens, "ponder_steps": 0}


def test_by_level_reads_string_levels_and_skips_documents_without_one():
    samples = [sample(0, 2, True), sample(1, "1", False), sample(2, None, True)]
    assert {k: [s["doc_id"] for s in v] for k, v in ms.by_level(samples).items()} == \
        {1: [1], 2: [0]}


def test_strong_win_counts_right_against_wrong_and_cheaper_when_both_right():
    fp = [sample(0, 1, True, 5), sample(1, 1, True, 20), sample(2, 1, False), sample(3, 2, True)]
    base = [sample(0, 1, True, 10), sample(1, 1, True, 10), sample(2, 1, True), sample(3, 2, False)]
    assert ms.strong_win_rate(fp, base) == {1: 1 / 3, 2: 1.0}
    assert ms.strong_wins(fp, base) == (2, 4)  # over every question both answered


def test_a_dataset_without_levels_has_one_strong_win_rate():
    fp = [{"doc_id": i, "doc": {}, "exact_match": 1.0, "gen_tokens": 5} for i in range(4)]
    base = [{"doc_id": i, "doc": {}, "exact_match": float(i % 2), "gen_tokens": 5}
            for i in range(3)]
    assert ms.strong_win_rate(fp, base) == {}
    assert ms.strong_wins(fp, base) == (2, 3)  # doc 3 has no baseline answer


def test_metrics_mean_costs_and_interval():
    f = ms.metrics([sample(0, 1, True, 10), sample(1, 1, False, 30)])
    assert (f["n"], f["acc"], f["tokens"]) == (2, 0.5, 20.0)
    assert f["lo"] < 0.5 < f["hi"] and f["log10_flops"] == pytest.approx(math.log10(2e10))


def test_paired_difference_pairs_questions_and_prices_the_saving():
    from lm_eval_ponder.reporting.measures import paired_difference

    def sample(i, right, tokens):
        return {"doc_id": i, "exact_match": float(right), "gen_tokens": tokens,
                "flops": 1e9 * tokens}

    base = [sample(i, i % 2 == 0, 100) for i in range(200)]
    # right where the base is right, and on no other question; a quarter fewer tokens
    same = [sample(i, i % 2 == 0, 75) for i in range(200)]
    d = paired_difference(same, base)
    assert d["gain"] == 0 and d["lo"] == 0 == d["hi"]  # identical outcomes: no paired spread
    assert d["n"] == 200 and d["tokens_saved"] == pytest.approx(0.25)
    assert d["saved"] == pytest.approx(0.25)
    worse = [sample(i, i % 4 == 0, 75) for i in range(200)]  # loses half the base's rights
    d = paired_difference(worse, base)
    assert d["gain"] == pytest.approx(-0.25) and d["hi"] < 0
    assert paired_difference(worse[:10], base[100:]) is None  # no shared question
    assert paired_difference(worse[:10], base)["n"] == 10


def test_sign_test_and_holm() -> None:
    from lm_eval_ponder.reporting.measures import holm, sign_test

    assert sign_test([1.0] * 10) == pytest.approx(2 * 0.5**10)
    assert sign_test([1.0, -1.0, 0.0, 0.0]) == 1.0 and sign_test([0.0, 0.0]) == 1.0
    assert sign_test([1 / 3, -2 / 3] * 3 + [1.0] * 6) == sign_test([1.0] * 9 + [-1.0] * 3)
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])  # capped at 1, order kept
    # issue 52: p = 0.016 alone survives, as one of ten (the nine others at 0.5) it does not
    assert holm([0.016] + [0.5] * 9)[0] == pytest.approx(0.16)


def test_sign_flip_test_weighs_sizes_not_signs() -> None:
    from lm_eval_ponder.reporting.measures import sign_flip_test, sign_test

    # many tiny negative differences against a few large positive ones: a mean of ~0
    diffs = [-0.002] * 55 + [0.0] * 430 + [0.0073] * 15
    assert sign_test(diffs) < 1e-5  # what the sign test said
    assert sign_flip_test(diffs) > 0.5  # the mean is nowhere near beyond chance
    assert sign_flip_test([0.05] * 40) < 1e-3  # a real shift is found
    assert sign_flip_test([0.0] * 10) == 1.0
