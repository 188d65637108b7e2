"""The analysis that ``headroom.py``, ``adaptation.py``, ``testset.py`` and ``per_type.py`` share: expected
outcomes per (prompt, depth), the fixed-depth curve and a point's accuracy against it, oracle
choices, cross-fitting folds, bootstrap intervals, depth by difficulty level. One copy of each,
so that the scripts' figures in the study pages (docs/results/) are computed the same way.

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


# cross-fitting folds of every issue-52 comparator (per_type.py, testset.py): one number, so a
# test document sits in the same fold in both
FOLDS = 5


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


def per_type_choice(values, groups, train) -> dict:
    """One depth per group (problem type), each the best mean ``values`` [item, depth] over
    the ``train`` items of that group; a group with no training item gets the best depth of
    all ``train`` items."""

    overall = int(values[train].mean(axis=0).argmax())
    out = {}
    for g in sorted(set(groups.tolist())):
        sel = train & (groups == g)
        out[g] = int(values[sel].mean(axis=0).argmax()) if sel.any() else overall
    return out


def cross_fitted_policies(values, groups, fold, folds: int) -> dict:
    """Each item's depth under two policies chosen on the *other* folds (issue 52): one depth
    for all (``single``) and one depth per group (``per_type``). [item] int arrays."""
    import numpy as np

    single, per_type = np.zeros(len(fold), dtype=int), np.zeros(len(fold), dtype=int)
    for f in range(folds):
        held, train = fold == f, fold != f
        single[held] = int(values[train].mean(axis=0).argmax())
        choice = per_type_choice(values, groups, train)
        per_type[held] = [choice[g] for g in groups[held].tolist()]
    return {"single": single, "per_type": per_type}


def per_type_headroom(accuracy, tokens, groups, fold, folds: int, draws: int = 2000,
                      nulls: int = 200, seed: int = 0) -> dict:
    """Does one depth per problem type beat one depth for all, held out? Both policies are
    chosen by accuracy on the other folds and scored on the held-out fold; the headroom is the
    mean per-item difference with a bootstrap 95% interval over items. The null repeats the
    whole procedure with the group labels shuffled across items (``nulls`` times): the
    headroom that choosing per group buys by chance, so a reader sees the noise floor; ``p`` is
    the share of shuffles at or above the observed headroom. The in-sample envelope (the best
    depth's mean, chosen on the items it is scored on) is the optimistic bound beside them."""
    import numpy as np

    rng = np.random.default_rng(seed)
    rows = np.arange(len(fold))

    def scored(policy):
        return accuracy[rows, policy], tokens[rows, policy]

    pol = cross_fitted_policies(accuracy, groups, fold, folds)
    acc_single, tok_single = scored(pol["single"])
    acc_type, tok_type = scored(pol["per_type"])
    diff = acc_type - acc_single
    ci = bootstrap(lambda idx: {"d": float(diff[idx].mean())}, len(diff), draws, seed)["d"]
    null = []
    for _ in range(nulls):
        shuffled = groups[rng.permutation(len(groups))]
        p = cross_fitted_policies(accuracy, shuffled, fold, folds)["per_type"]
        null.append(float((accuracy[rows, p] - acc_single).mean()))
    null = np.array(null)
    envelope = accuracy.mean(axis=0)
    return {
        "n": int(len(fold)), "folds": folds,
        "single": {"accuracy": float(acc_single.mean()), "tokens": float(tok_single.mean())},
        "per_type": {"accuracy": float(acc_type.mean()), "tokens": float(tok_type.mean())},
        "headroom": float(diff.mean()), "headroom_ci95": [float(ci[0]), float(ci[1])],
        "null": {"draws": nulls, "mean": float(null.mean()),
                 "q95": float(np.percentile(null, 95)),
                 "p": float((1 + (null >= diff.mean() - 1e-12).sum()) / (1 + nulls))},
        "envelope_in_sample": {"depth": int(envelope.argmax()),
                               "accuracy": float(envelope.max()),
                               "tokens": float(tokens[:, int(envelope.argmax())].mean())},
        "oracle_per_item_in_sample": float(accuracy.max(axis=1).mean()),
        "per_depth": {"accuracy": envelope.tolist(), "tokens": tokens.mean(axis=0).tolist()},
    }


def controller_gaps(accuracy, tokens, groups, runs: list[dict], draws: int = 2000,
                    seed: int = 0) -> dict:
    """Cross-fitted controllers against the cross-fitted comparators on the same held-out
    items. ``runs``: one per (seed, fold): ``{"val": [item], "depth": [depth]}``, the items a
    run held out and the depth its controller chose on each. Per run, the comparators are
    chosen on the items it did not hold out (its training side): the best depth, the best depth
    per group, and the fixed curve at the controller's cost (``curve_mix``: the training side's
    upper envelope at the controller's held-out mean tokens, as a mix of two depths, scored on
    the held-out items). Per item the gaps are averaged over the runs that held it out (one per
    seed)."""
    import numpy as np

    n = accuracy.shape[0]
    sums = {k: np.zeros(n) for k in ("ctrl", "single", "per_type", "budget", "tokens")}
    count = np.zeros(n)
    for run in runs:
        val = np.asarray(run["val"])
        depth = np.asarray(run["depth"])
        train = np.ones(n, dtype=bool)
        train[val] = False
        means = accuracy[train].mean(axis=0)
        single = int(means.argmax())
        choice = per_type_choice(accuracy, groups, train)
        mix = curve_mix(tokens[train].mean(axis=0), means, tokens[val, depth].mean())
        sums["ctrl"][val] += accuracy[val, depth]
        sums["tokens"][val] += tokens[val, depth]
        sums["single"][val] += accuracy[val, single]
        sums["budget"][val] += sum(w * accuracy[val, k] for k, w in mix.items())
        sums["per_type"][val] += accuracy[val, [choice[g] for g in groups[val].tolist()]]
        count[val] += 1
    seen = count > 0
    mean = {k: v[seen] / count[seen] for k, v in sums.items()}
    gaps = {name: mean["ctrl"] - mean[name] for name in ("single", "per_type", "budget")}
    ci = bootstrap(lambda idx: {k: float(v[idx].mean()) for k, v in gaps.items()},
                   int(seen.sum()), draws, seed)
    return {"n": int(seen.sum()), "accuracy": float(mean["ctrl"].mean()),
            "tokens": float(mean["tokens"].mean()),
            **{f"gap_{k}": float(v.mean()) for k, v in gaps.items()},
            **{f"gap_{k}_ci95": list(ci[k]) for k in gaps}}


def final_controller_gaps(accuracy, tokens, groups, depth, fold, folds: int,
                          draws: int = 2000, seed: int = 0) -> dict:
    """A controller trained elsewhere (a final one, on the training prompts) against the
    cross-fitted comparators on test items: every item is held out by the controller, so each
    fold of items plays one held-out run whose comparators are chosen on the other folds
    (``controller_gaps``)."""
    import numpy as np

    depth = np.asarray(depth)
    runs = [{"val": np.flatnonzero(fold == f), "depth": depth[fold == f]}
            for f in range(folds) if (fold == f).any()]
    return controller_gaps(accuracy, tokens, groups, runs, draws, seed)


def curve_mix(tokens, accuracy, budget: float) -> dict[int, float]:
    """The fixed-depth curve's upper envelope at a token budget as a policy: depth -> weight (a
    random mix of the two envelope depths around ``budget``, whose mean tokens are the budget),
    from per-depth mean ``tokens`` and ``accuracy`` measured on other items. Below the cheapest
    depth, that depth; beyond the envelope's last point, its depth. What "the fixed curve at
    equal tokens" means for a comparator that must itself be chosen out of sample."""
    import numpy as np

    order = [int(k) for k in np.argsort(tokens, kind="stable")]
    envelope, best = [], -np.inf
    for k in order:  # the running best in order of cost: the points the envelope joins
        if accuracy[k] > best:
            envelope.append(k)
            best = accuracy[k]
    if budget <= tokens[envelope[0]]:
        return {envelope[0]: 1.0}
    for a, b in zip(envelope, envelope[1:]):
        if tokens[a] <= budget <= tokens[b]:
            w = float((tokens[b] - budget) / (tokens[b] - tokens[a])) if tokens[b] > tokens[a] else 1.0
            return {a: w, b: 1.0 - w}
    return {envelope[-1]: 1.0}


def budget_gap(accuracy, tokens, policy, train, held) -> "object":
    """Per held-out item, a policy's accuracy minus the fixed-depth curve's at the policy's
    mean tokens there: the curve (``curve_mix``) is measured on the ``train`` items, its two
    depths' outcomes scored on the ``held`` items themselves. ``policy``: [item] depths. What
    "beats the fixed curve at equal cost" means for a policy that trades accuracy for tokens:
    a cheaper policy at the same accuracy has a positive gap."""
    import numpy as np

    rows = np.flatnonzero(held)
    mix = curve_mix(tokens[train].mean(axis=0), accuracy[train].mean(axis=0),
                    float(tokens[rows, policy[rows]].mean()))
    curve = sum(w * accuracy[rows, k] for k, w in mix.items())
    return accuracy[rows, policy[rows]] - curve


def per_level_budget_choice(accuracy, tokens, levels, train) -> dict:
    """One depth per level, the combination of all ``(K + 1) ** L`` that maximises the budget
    gap on the ``train`` items (each level's depth means over its train items, weighted by the
    level's share; the curve over all train items). The per-level oracle of the model organism
    (issue 64): where direct answers suffice on easy levels and steps are needed on hard ones,
    the best combination is cheap where it can be and deep where it must be."""
    import itertools

    import numpy as np

    groups = sorted(set(levels[train].tolist()))
    share = np.array([(levels[train] == g).mean() for g in groups])
    acc = np.stack([accuracy[train & (levels == g)].mean(axis=0) for g in groups])
    tok = np.stack([tokens[train & (levels == g)].mean(axis=0) for g in groups])
    k = accuracy.shape[1]
    combos = np.array(list(itertools.product(range(k), repeat=len(groups))))
    pick = np.arange(len(groups))
    a = (acc[pick, combos] * share).sum(axis=1)
    t = (tok[pick, combos] * share).sum(axis=1)
    curve_t, curve_a = tokens[train].mean(axis=0), accuracy[train].mean(axis=0)
    order = np.argsort(curve_t, kind="stable")
    env = np.maximum.accumulate(curve_a[order])
    gap = a - np.interp(t, curve_t[order], env)
    best = combos[int(np.argmax(gap + 1e-12 * -t))]  # ties: the cheaper combination
    return {g: int(d) for g, d in zip(groups, best)}


def per_level_budget_headroom(accuracy, tokens, levels, fold, folds: int, draws: int = 2000,
                              nulls: int = 200, seed: int = 0) -> dict:
    """The per-level oracle against the best single depth, both cross-fitted over ``folds``:
    each fold's policies are chosen on the other folds (the single depth by accuracy, ties to
    the fewer tokens; the per-level one by ``per_level_budget_choice``) and scored on the fold.
    Reports each policy's accuracy, tokens and budget gap (``budget_gap``), the oracle's gain
    in budget gap over the single depth with a bootstrap interval over items, and the null:
    the whole procedure with levels shuffled across items. [item] arrays of each policy's
    depth are returned for the controllers' comparisons."""
    import numpy as np

    rng = np.random.default_rng(seed)
    n = len(fold)
    rows = np.arange(n)

    def policies(lv):
        single, per_level = np.zeros(n, dtype=int), np.zeros(n, dtype=int)
        for f in range(folds):
            held, train = fold == f, fold != f
            if not held.any():
                continue
            single[held] = int(oracle_choice(accuracy[train].mean(axis=0)[None],
                                             tokens[train].mean(axis=0)[None])[0])
            choice = per_level_budget_choice(accuracy, tokens, lv, train)
            per_level[held] = [choice.get(g, single[held][0]) for g in lv[held].tolist()]
        return single, per_level

    def gaps(policy):
        out = np.zeros(n)
        for f in range(folds):
            held, train = fold == f, fold != f
            if held.any():
                out[held] = budget_gap(accuracy, tokens, policy, train, held)
        return out

    single, per_level = policies(levels)
    g_single, g_level = gaps(single), gaps(per_level)
    diff = g_level - g_single
    ci = bootstrap(lambda idx: {"d": float(diff[idx].mean())}, n, draws, seed)["d"]
    null = []
    for _ in range(nulls):
        shuffled = levels[rng.permutation(n)]
        _, p = policies(shuffled)
        null.append(float((gaps(p) - g_single).mean()))
    null = np.array(null)
    return {
        "n": int(n), "folds": folds,
        "single": {"accuracy": float(accuracy[rows, single].mean()),
                   "tokens": float(tokens[rows, single].mean()),
                   "budget_gap": float(g_single.mean()), "depths": single.tolist()},
        "per_level": {"accuracy": float(accuracy[rows, per_level].mean()),
                      "tokens": float(tokens[rows, per_level].mean()),
                      "budget_gap": float(g_level.mean()), "depths": per_level.tolist()},
        "gain": float(diff.mean()), "gain_ci95": [float(ci[0]), float(ci[1])],
        "null": {"draws": nulls, "mean": float(null.mean()), "sd": float(null.std()),
                 "q95": float(np.percentile(null, 95)),
                 "p": float((1 + (null >= diff.mean() - 1e-12).sum()) / (1 + nulls))},
        "in_sample": {"per_level": per_level_budget_choice(accuracy, tokens, levels,
                                                           np.ones(n, dtype=bool))},
    }


def minimum_detectable_effect(ci95: tuple[float, float], power: float = 0.8) -> float:
    """The smallest true effect a two-sided 95% test of a mean difference detects with
    ``power``, from the interval it was reported with: (z_0.975 + z_power) x SE, the SE read
    back from the interval's width (a bootstrap percentile interval is about +-1.96 SE)."""
    from scipy.stats import norm

    se = (ci95[1] - ci95[0]) / (2 * norm.ppf(0.975))
    return float((norm.ppf(0.975) + norm.ppf(power)) * se)


def null_detectable_effect(null_sd: float, power: float = 0.8) -> float:
    """The same for a one-sided permutation test at 5% with a roughly normal null of standard
    deviation ``null_sd``, measured above the null's mean: (z_0.95 + z_power) x sd."""
    from scipy.stats import norm

    return float((norm.ppf(0.95) + norm.ppf(power)) * null_sd)


# ----------------------------------------------------------------------------- three comparators
# Issue 65: a gap "at equal tokens" has three readings, and each errs its own way when depths
# are near-tied. The in-sample envelope (``fixed_curve``) is the upper envelope of nine noisy
# depth means chosen on the items it is scored on: optimistic. The cross-fitted curve
# (``crossfit_budget_gap``) is chosen on the other folds and scored held out: unbiased for
# the policy it picks, but with near-ties it picks the other folds' noise, so it is
# pessimistic about the best fixed policy. The smoothed curve (``smoothed_curve``) pools each
# depth with its neighbours before the envelope is taken, so its best point is not the
# maximum of nine noises: neither bias, at the price of some smoothing bias at a sharp peak.


def smooth_over_depths(values) -> "object":
    """Depth means smoothed over neighbouring depths: a 3-point moving average, and at each
    end the value at the end depth of the least-squares line through the last three
    (Savitzky-Golay, window 3, order 1). Why: a noisy mean at one depth cannot lift the curve's
    best point on its own, while a real trend over depths (a rise, a fall, a plateau) stays."""
    import numpy as np

    a = np.asarray(values, dtype=float)
    if len(a) < 3:
        return a.copy()
    out = np.empty_like(a)
    out[1:-1] = (a[:-2] + a[1:-1] + a[2:]) / 3
    out[0] = (5 * a[0] + 2 * a[1] - a[2]) / 6
    out[-1] = (5 * a[-1] + 2 * a[-2] - a[-3]) / 6
    return out


def smoothed_curve(tokens, accuracy):
    """``fixed_curve`` with each depth's mean accuracy smoothed over depths
    (``smooth_over_depths``); tokens as measured. For ``accuracy_at_tokens``: the smoothed
    comparator at equal tokens, whose best depth is the smoothed choice."""
    curve = fixed_curve(tokens, accuracy)
    curve[:, 1] = smooth_over_depths(curve[:, 1])
    return curve


def crossfit_budget_gap(accuracy, tokens, weights, fold, folds: int):
    """Per item, a policy's accuracy minus the fixed curve's at the policy's tokens, the curve
    chosen out of sample: on each fold, ``curve_mix`` of the *other* folds' depth means at the
    policy's mean tokens on the fold, its depths scored on the fold's own items. ``weights``
    [item, depth]: each item's probability of each depth (one-hot for a threshold rule, the
    halting distribution for a sampled one). ``budget_gap`` with weights in place of depths:
    what "on the fixed curve" means when the curve, too, must be chosen held out."""
    import numpy as np

    w = np.asarray(weights, dtype=float)
    own = (w * accuracy).sum(axis=1)
    gap = np.full(len(fold), np.nan)
    for f in range(folds):
        held, train = fold == f, fold != f
        if not held.any() or not train.any():  # nothing to score, or nothing to choose on
            continue
        budget = float((w[held] * tokens[held]).sum(axis=1).mean())
        mix = curve_mix(tokens[train].mean(axis=0), accuracy[train].mean(axis=0), budget)
        gap[held] = own[held] - sum(v * accuracy[held, k] for k, v in mix.items())
    return gap


def curve_verdict(ci95, tol: float = 1e-9) -> str:
    """What an interval says of a gap to the curve: "above" or "below" the curve beyond it,
    else "on" (it includes 0; ``tol`` absorbs the float dust of a gap that is exactly 0)."""
    lo, hi = ci95
    if lo > tol:
        return "above"
    if hi < -tol:
        return "below"
    return "on"


def comparator_gaps(accuracy, tokens, weights_by_seed: list, fold, folds: int,
                    draws: int = 2000, seed: int = 0) -> dict:
    """A policy's gap at equal tokens against all three comparators, seed means, with paired
    95% bootstrap intervals over items (the same resamples as ``bootstrap`` draws for the
    in-sample figures, so that interval is the one the pages already print): ``in_sample``
    (``fixed_curve``, re-chosen on each resample, optimistic), ``cross_fitted``
    (``crossfit_budget_gap``, comparators fixed, items resampled) and ``smoothed``
    (``smoothed_curve``, re-fitted on each resample). ``weights_by_seed``: one [item, depth]
    array per seed. Also the verdict of each interval (``curve_verdict``), so a page can say
    which verdicts survive all three."""
    import numpy as np

    w = [np.asarray(x, dtype=float) for x in weights_by_seed]
    own_acc = np.mean([(x * accuracy).sum(axis=1) for x in w], axis=0)
    own_tok = np.mean([(x * tokens).sum(axis=1) for x in w], axis=0)
    cross = np.mean([crossfit_budget_gap(accuracy, tokens, x, fold, folds) for x in w], axis=0)

    def figures(idx):
        a, t = float(own_acc[idx].mean()), float(own_tok[idx].mean())
        return {"in_sample": a - accuracy_at_tokens(fixed_curve(tokens[idx], accuracy[idx]), t),
                "cross_fitted": float(np.nanmean(cross[idx])),
                "smoothed": a - accuracy_at_tokens(smoothed_curve(tokens[idx], accuracy[idx]), t)}

    n = len(own_acc)
    point = figures(np.arange(n))
    ci = bootstrap(figures, n, draws, seed)
    return {"accuracy": float(own_acc.mean()), "tokens": float(own_tok.mean()),
            "gaps": point, "ci95": {k: list(v) for k, v in ci.items()},
            "verdicts": {k: curve_verdict(v) for k, v in ci.items()}}


def fixed_curve_summary(accuracy, tokens, fold, folds: int) -> dict:
    """The fixed depths as the three comparators see them: every depth's mean accuracy and
    tokens, the smoothed accuracy, each comparator's best depth and the cross-fitted one depth
    for all, so a page can say where near-ties make the cross-fitted depth pessimistic."""
    import numpy as np

    means = accuracy.mean(axis=0)
    smooth = smooth_over_depths(means)
    single, per_fold = fixed_by_fold(accuracy, fold, folds)
    return {"accuracy": means.tolist(), "tokens": tokens.mean(axis=0).tolist(),
            "smoothed_accuracy": smooth.tolist(),
            "best_depth": {"in_sample": int(means.argmax()), "smoothed": int(smooth.argmax())},
            "one_depth_cross_fitted": {
                "depth_per_fold": per_fold,
                "accuracy": float(accuracy[np.arange(len(fold)), single].mean()),
                "tokens": float(tokens[np.arange(len(fold)), single].mean())}}


# the table columns of ``comparator_gaps`` (``comparator_cells``), one wording for every page
COMPARATOR_HEADER = ("gap: in-sample envelope (optimistic) | gap: cross-fitted curve at its "
                     "tokens | gap: smoothed curve at its tokens | verdict (in-sample / "
                     "cross-fitted / smoothed)")


def comparator_cells(c: dict, digits: int = 3) -> str:
    """The four cells of ``COMPARATOR_HEADER`` for one ``comparator_gaps`` result: each gap
    with its interval, then the verdicts, said once where all three agree (the verdict that
    survives every comparator) and one per comparator where they do not."""
    cells = []
    for name in ("in_sample", "cross_fitted", "smoothed"):
        v, (lo, hi) = c["gaps"][name], c["ci95"][name]
        cells.append(f"{v:+.{digits}f} [{lo:+.{digits}f}, {hi:+.{digits}f}]")
    verdicts = [c["verdicts"][k] for k in ("in_sample", "cross_fitted", "smoothed")]
    said = (f"{verdicts[0]} (all three)" if len(set(verdicts)) == 1 else " / ".join(verdicts))
    return " | ".join([*cells, said])


def comparators_said(items: str, folds: int) -> str:
    """The sentences a page prints above a ``COMPARATOR_HEADER`` table: what each comparator
    is, which way it errs, and the smoother (one wording for every page). ``items``: what the
    rows are scored on, plural ("prompts", "documents")."""
    return (f"Gap: accuracy minus a fixed-depth curve at equal tokens, 95% paired bootstrap "
            f"CI over {items}, against three comparators. *In-sample envelope*: the upper "
            f"envelope of the depth means on the {items} it is scored on (optimistic: its best "
            f"point is the maximum of nine noisy means). *Cross-fitted*: in each of {folds} "
            f"folds by key hash, the curve of the other folds at the policy's tokens, its "
            f"depths scored on the fold's {items} (pessimistic where depths are near-tied: it "
            "picks the other folds' noise). *Smoothed*: the envelope after a 3-point moving "
            "average of the depth means over depths (at each end, the least-squares line "
            f"through the last three), on the same {items}: neither. Verdicts: above / below "
            "the curve beyond the interval, else on it.")


def curve_said(curve: dict) -> str:
    """One line of a ``fixed_curve_summary``: every depth's mean accuracy and tokens with its
    smoothed accuracy, each comparator's best depth and the cross-fitted one depth for all."""
    one = curve["one_depth_cross_fitted"]
    return ("Depth means (accuracy / tokens; smoothed accuracy): " + ", ".join(
        f"k={k}: {a:.4f} / {t:.0f} ({m:.4f})" for k, (a, t, m) in enumerate(zip(
            curve["accuracy"], curve["tokens"], curve["smoothed_accuracy"])))
        + f". Best depth in sample k = {curve['best_depth']['in_sample']}, smoothed k = "
        f"{curve['best_depth']['smoothed']}; one depth for all, cross-fitted (depth per fold "
        f"{one['depth_per_fold']}): {one['accuracy']:.4f} at {one['tokens']:.1f} tokens.")
