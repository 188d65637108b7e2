"""The analysis that ``headroom.py``, ``adaptation.py`` and ``testset.py`` share: expected
outcomes per (prompt, depth), the fixed-depth curve and a point's accuracy against it, oracle
choices, cross-fitting folds, bootstrap intervals, depth by difficulty level. One copy of each,
so that the three scripts' figures in docs/results.md are computed the same way.

Arrays are [item, depth] (an item is a prompt or a test document) unless a docstring says
otherwise; ``testset.py`` keeps its sweeps [depth, document] and transposes when it calls in.
numpy and scipy are imported inside the functions, so that importing a script stays cheap.
"""

from __future__ import annotations

import hashlib


def outcome_matrices(env, ids: list[int], samples: list[int] | None = None) -> dict:
    """[prompt, depth] arrays of expected accuracy, tokens, FLOPs and score."""
    import numpy as np

    keys = ("accuracy", "gen_tokens", "flops", "score")
    out = {k: np.zeros((len(ids), env.k_max + 1)) for k in keys}
    for row, i in enumerate(ids):
        for k in range(env.k_max + 1):
            e = env.expected(i, k, samples)
            for name in keys:
                out[name][row, k] = e[name]
    return out


def oracle_choice(value, tokens):
    """Per row, the column with the highest value; ties go to the fewest tokens."""
    import numpy as np

    best = value.max(axis=1, keepdims=True)
    masked = np.where(np.isclose(value, best), tokens, np.inf)
    return masked.argmin(axis=1)


def fixed_curve(tokens, accuracy):
    """The fixed-depth curve of [item, depth] ``tokens`` and ``accuracy``: every depth's mean
    over the items, [depth, (mean tokens, mean accuracy)], for ``accuracy_at_tokens``."""
    import numpy as np

    return np.stack([tokens.mean(axis=0), accuracy.mean(axis=0)], 1)


def accuracy_at_tokens(curve, tokens: float) -> float:
    """Oracle accuracy at a token budget: the curve's upper envelope linearly interpolated at
    ``tokens``; nan below the curve's cheapest point (beyond a 2% tolerance)."""
    import numpy as np

    order = np.argsort(curve[:, 0])
    x, y = curve[order, 0], np.maximum.accumulate(curve[order, 1])
    if tokens < x[0]:
        return float(y[0]) if tokens >= 0.98 * x[0] else float("nan")
    return float(np.interp(tokens, x, y))


def fold_of(keys: list[str], folds: int) -> list[int]:
    """Cross-fitting folds by key hash, so a prompt is in the same fold in every analysis."""
    return [int(hashlib.sha256(k.encode()).hexdigest()[:8], 16) % folds for k in keys]


def fixed_by_fold(values, fold, folds: int):
    """Each prompt's fixed depth: the one with the best mean ``values`` [prompt, depth] on the
    other folds. Returns (depth per prompt, depth per fold)."""
    import numpy as np

    depths, chosen = np.zeros(len(fold), dtype=int), []
    for f in range(folds):
        k = int(values[fold != f].mean(axis=0).argmax())
        depths[fold == f] = k
        chosen.append(k)
    return depths, chosen


def bootstrap(fn, n: int, draws: int, seed: int = 0) -> dict[str, tuple[float, float]]:
    """Percentile 95% intervals of every figure ``fn(idx)`` returns, resampling prompts."""
    import numpy as np

    rng = np.random.default_rng(seed)
    samples: dict[str, list[float]] = {}
    for _ in range(draws):
        for k, v in fn(rng.integers(0, n, n)).items():
            samples.setdefault(k, []).append(v)
    return {k: (float(np.nanpercentile(v, 2.5)), float(np.nanpercentile(v, 97.5)))
            for k, v in samples.items()}


def depth_by_level(depth, level) -> tuple[dict[str, float], float] | None:
    """Does depth follow difficulty? Over the items that have a level (``level >= 0``; -1 marks
    none, e.g. GSM8K): the mean depth per level as ``{"L<level>": mean}`` and Spearman(level,
    depth), nan where every depth is the same (rho is undefined). None if no item has a level.
    ``depth`` may be fractional (an expected depth, or a mean over tokens)."""
    import numpy as np
    from scipy.stats import spearmanr

    levelled = level >= 0
    if not levelled.any():
        return None
    d, lv = depth[levelled], level[levelled]
    by_level = {f"L{v}": float(d[lv == v].mean()) for v in sorted(set(lv.tolist()))}
    rho = float(spearmanr(lv, d).statistic) if np.ptp(d) > 0 else float("nan")
    return by_level, rho
