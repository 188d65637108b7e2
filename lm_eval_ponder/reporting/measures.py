"""What the report measures from per-sample logs: accuracy with its Wilson interval, mean cost,
ranks, the Pareto front, per-level splits and strong wins. Pure functions of sample dicts, so the
tables (``reporting.report``) and the figures (``reporting.plots``) read the same numbers."""

from __future__ import annotations

import math
from collections import defaultdict

from lm_eval_ponder.reporting.seeds import bootstrap_interval


def wilson(k: float, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of a proportion k/n (scipy's ``BinomTestResult``)."""
    from scipy.stats import binomtest

    if n == 0:
        return math.nan, math.nan
    ci = binomtest(int(round(k)), n).proportion_ci(confidence_level=confidence, method="wilson")
    return float(ci.low), float(ci.high)


def spearman(x: list[float], y: list[float]) -> float:
    """Spearman rank correlation (average ranks for ties); NaN if either side is constant."""
    from scipy.stats import spearmanr

    if len(set(x)) < 2 or len(set(y)) < 2:
        return math.nan
    return float(spearmanr(x, y).statistic)


def metrics(samples: list[dict]) -> dict[str, float]:
    """A run's cell of the leaderboard: accuracy, its 95% interval, n and mean costs. One seed:
    the Wilson interval of k/n; several (``n_seeds`` on the merged samples): a bootstrap over
    questions of the per-question means (``reporting.seeds``)."""
    n = len(samples)
    k = sum(float(s["exact_match"]) for s in samples)
    seeds = max((int(s.get("n_seeds", 1)) for s in samples), default=1)
    if seeds > 1:
        lo, hi = bootstrap_interval([float(s["exact_match"]) for s in samples])
    else:
        lo, hi = wilson(k, n)
    mean = lambda key: sum(float(s.get(key, math.nan)) for s in samples) / n  # noqa: E731
    flops = mean("flops")
    return {"n": n, "acc": k / n, "lo": lo, "hi": hi, "tokens": mean("gen_tokens"),
            "flops": flops, "log10_flops": math.log10(flops) if flops > 0 else math.nan,
            "depth": mean("ponder_steps"), "estimated": any(s.get("estimated") for s in samples),
            "seeds": seeds}


def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """Indices of points not dominated (lower cost and higher-or-equal accuracy)."""
    front = [i for i, (c, a) in enumerate(points)
             if not any(c2 <= c and a2 >= a and (c2, a2) != (c, a) for c2, a2 in points)]
    return sorted(front, key=lambda i: points[i][0])


def by_level(samples: list[dict]) -> dict[int, list[dict]]:
    """Samples split by their document's integer ``level`` (arith ladder, MATH500), in level
    order; documents without one are left out."""
    levels: dict[int, list[dict]] = defaultdict(list)
    for s in samples:
        level = s["doc"].get("level")
        if isinstance(level, str) and level.strip().isdigit():
            level = int(level)
        if isinstance(level, int):
            levels[level].append(s)
    return dict(sorted(levels.items()))


def strong_wins(fp: list[dict], base: list[dict]) -> tuple[int, int]:
    """(strong wins, questions both runs answered): FP is correct and the baseline is wrong, or
    both are correct and FP used fewer tokens (our definition of a strong win)."""
    other = {s["doc_id"]: s for s in base}
    pairs = [(s, other[s["doc_id"]]) for s in fp if s["doc_id"] in other]
    wins = sum(1 for a, b in pairs if a["exact_match"] and (
        not b["exact_match"] or a["gen_tokens"] < b["gen_tokens"]))
    return wins, len(pairs)


def strong_win_rate(fp: list[dict], base: list[dict]) -> dict[int, float]:
    """Per level, the fraction of questions that are strong wins (``strong_wins``); empty for
    a dataset without levels (GSM8K, GPQA), whose one rate ``strong_wins`` gives."""
    counts = {level: strong_wins(ss, base) for level, ss in by_level(fp).items()}
    return {level: wins / n for level, (wins, n) in counts.items() if n}


def paired_difference(samples: list[dict], base: list[dict]) -> dict[str, float] | None:
    """``samples`` against ``base`` on the questions both answered: the accuracy difference
    with a bootstrap 95% interval over questions (paired: each question's difference, so the
    interval is the comparison's, not two runs' side by side, and a seed-averaged run's
    per-question means pair as they are), and the FLOPs and tokens saved (1 - mean of
    ``samples`` / mean of ``base``). None when no question is shared."""
    other = {s["doc_id"]: s for s in base}
    pairs = [(s, other[s["doc_id"]]) for s in samples if s["doc_id"] in other]
    if not pairs:
        return None
    diffs = [float(a["exact_match"]) - float(b["exact_match"]) for a, b in pairs]
    lo, hi = bootstrap_interval(diffs)

    def saved(key: str) -> float:
        mine = sum(float(a.get(key, math.nan)) for a, _ in pairs)
        theirs = sum(float(b.get(key, math.nan)) for _, b in pairs)
        return 1 - mine / theirs if theirs > 0 else math.nan

    return {"gain": sum(diffs) / len(diffs), "lo": lo, "hi": hi, "n": len(pairs),
            "p": sign_test(diffs), "saved": saved("flops"), "tokens_saved": saved("gen_tokens")}


def sign_test(diffs: list[float]) -> float:
    """Two-sided exact sign test of paired differences (McNemar's exact test when they are
    0/1 scores; ties drop out): the p-value of a paired comparison, for ``holm``."""
    from scipy.stats import binomtest

    up, down = sum(d > 0 for d in diffs), sum(d < 0 for d in diffs)
    return 1.0 if up + down == 0 else float(binomtest(up, up + down, 0.5).pvalue)


def sign_flip_test(diffs, draws: int = 10000, seed: int = 0) -> float:
    """Two-sided paired permutation test of the mean difference (each pair's sign flipped at
    random), for differences that are not 0/1: a budget gap mixes many small fractional
    differences with a few large ones, and the sign test, which counts signs and ignores size,
    called a mean difference of +0.00005 [-0.006, +0.006] significant at p = 1.7e-6 (a
    review's finding). p = (1 + draws at least as extreme) / (1 + draws)."""
    import numpy as np

    d = np.asarray(diffs, dtype=float)
    if not len(d) or not np.any(d):
        return 1.0
    observed = abs(d.mean())
    flips = np.random.default_rng(seed).choice((-1.0, 1.0), size=(draws, len(d)))
    extreme = int((np.abs((flips * d).mean(axis=1)) >= observed - 1e-12).sum())
    return (1 + extreme) / (1 + draws)


def holm(pvalues: list[float]) -> list[float]:
    """Holm's step-down adjustment of a family of p-values (same order as given): a paired
    comparison flagged among many must survive it (one "p = 0.016" of ten does not)."""
    order = sorted(range(len(pvalues)), key=lambda i: pvalues[i])
    adjusted, running = [0.0] * len(pvalues), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(pvalues) - rank) * pvalues[i]))
        adjusted[i] = running
    return adjusted
