"""The report's figures, drawn so that a reader can compare methods at a glance and across
figures: a method keeps one colour in every figure (its family picks it, the decoding policy of
``suite --decoding`` the marker; labels the table split for another reason, e.g.
``[dtype=bfloat16]``, get hollow markers); accuracy is drawn with its 95% interval (Wilson's for
one seed, a bootstrap over questions for a mean over seeds; every caption says which) on a 0..1
axis that every panel shares, so levels and datasets read on one scale; FR runs at several
alphas, and EE runs at several thresholds, are one curve through their points in order of cost
(a controller helps only where it lies above that curve beyond its interval); every caption
says which differences its intervals resolve. Overlapping unpaired 95% intervals are read as
"not distinguishable": conservative, since a paired test on the same questions can separate more.
"""

from __future__ import annotations

import math
import re
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from lm_eval_ponder import registry
from lm_eval_ponder.reporting.images import save_figure
from lm_eval_ponder.reporting.measures import (
    by_level,
    metrics,
    paired_difference,
    pareto_front,
    strong_win_rate,
    strong_wins,
    wilson,
)

# one colour per method of the registry (tests/test_registry.py checks that none is missing)
FAMILY_COLOURS = {
    "Direct": "#1f77b4", "CoT": "#ff7f0e", "BoN": "#2ca02c", "FR": "#555555",
    "FP-Direct": "#d62728", "FP-CoT": "#9467bd", "FP-BoN": "#8c564b", "EE": "#17becf",
}
# Table 1's row order: the registry's, baselines first, then FR and the FP variants, then EE
TABLE_ORDER = registry.METHOD_LABELS
SPARE_COLOURS = ("#17becf", "#bcbd22", "#e377c2", "#000000", "#aec7e8", "#98df8a")
# families drawn as one curve through their points: the parameter the points differ in
CURVES = {"FR": ("alpha", "="), "EE": ("p", ">=")}
DECODING_MARKERS = {"greedy": "o", "t0.7": "s", "top_p0.95": "^", "top_k40": "D"}


def interval_kind(stats) -> str:
    """Which 95% interval a set of cells carries (``measures.metrics``): Wilson's for a row of
    one seed, a bootstrap over questions for a mean over seeds; said wherever intervals are
    drawn, since a caption that names the wrong one misleads."""
    seeds = {int(f.get("seeds", 1)) > 1 for f in stats}
    if seeds == {True}:
        return "95% bootstrap intervals over questions of the mean over seeds"
    if seeds == {True, False}:
        return ("95% intervals: Wilson for rows of one seed, a bootstrap over questions for "
                "rows that average seeds")
    return "Wilson 95% intervals"


def ci_note(stats) -> str:
    return (f"Error bars: {interval_kind(stats)}. Overlapping intervals are read as not "
            "distinguishable (conservative for unpaired intervals).")


class LabelledRun(Protocol):
    label: str
    method: str
    samples: list[dict]


@dataclass(frozen=True)
class Style:
    """How one leaderboard label is drawn everywhere."""

    family: str
    decoding: str
    colour: str
    marker: str
    hollow: bool

    def kwargs(self) -> dict:
        return {"color": self.colour, "marker": self.marker,
                "markerfacecolor": "none" if self.hollow else self.colour}


def label_variants(label: str) -> list[str]:
    """The bracketed variants of a label, in order: ``["t0.7"]`` of ``FP-CoT [t0.7]``."""
    return re.findall(r" \[([^\]]+)\]", label)


def style(label: str) -> Style:
    """The family (colour), decoding policy (marker) and other variants (hollow) of a label
    such as ``FR (alpha=-0.2) [t0.7]`` or ``FP-Direct [dtype=bfloat16]``."""
    variants = label_variants(label)
    name = re.sub(r" \[[^\]]+\]", "", label)
    family = re.sub(r" \((?:alpha=[^)]*|p>=[^)]*|default args|depth \d+ on every question)\)$",
                    "", name).strip()
    decoding = next((v for v in variants if v in DECODING_MARKERS), "greedy")
    colour = FAMILY_COLOURS.get(family) or \
        SPARE_COLOURS[zlib.crc32(family.encode()) % len(SPARE_COLOURS)]
    hollow = any(v not in DECODING_MARKERS for v in variants)
    return Style(family, decoding, colour, DECODING_MARKERS[decoding], hollow)


def table_rank(label: str) -> tuple[int, str]:
    """Where a label's row goes in Table 1: by family in the paper's order (other families
    last), then by label."""
    name = family(label)
    return (TABLE_ORDER.index(name) if name in TABLE_ORDER else len(TABLE_ORDER), label)


def curve_parameter(label: str) -> tuple[str, str, str] | None:
    """(name, relation, value) of the parameter a curve's points differ in, or None."""
    for family, (name, relation) in CURVES.items():
        match = re.match(rf"{family} \({name}{re.escape(relation)}([^,)]*)", label)
        if match:
            return name, relation, match.group(1)
    return None


def curve_key(label: str) -> str | None:
    """Runs with the same key are points of one curve: FR runs that differ only in alpha,
    early-exit runs that differ only in threshold (their candidate layers stay in the key).
    None for any other method."""
    parameter = curve_parameter(label)
    if parameter is None:
        return None
    name, relation, value = parameter
    return label.replace(f"({name}{relation}{value}", f"({name}", 1)


def distinguishability(stats: dict[str, dict], subject: str) -> str:
    """One sentence on what the intervals of ``stats`` (label -> ``metrics``) resolve: the
    best accuracy, which labels are within its interval and which are below it beyond it."""
    ranked = sorted(stats.items(), key=lambda kv: -kv[1]["acc"])
    best, b = ranked[0]
    tied = [label for label, f in ranked[1:] if f["hi"] >= b["lo"]]
    below = [label for label, f in ranked[1:] if f["hi"] < b["lo"]]
    ns = sorted({f["n"] for f in stats.values()})
    text = (f"{subject} (n={'/'.join(map(str, ns))}): highest accuracy {best} {b['acc']:.3f} "
            f"[{b['lo']:.2f}, {b['hi']:.2f}].")
    if len(ranked) == 1:
        return text
    text += (f" Not distinguishable from it: {', '.join(tied)}." if tied
             else " Its interval clears every other method's.")
    if below:
        text += f" Below it beyond the intervals: {', '.join(below)}."
    return text


def cost_label(x: float, _pos=None, digits: int = 2) -> str:
    """A cost tick at ``digits`` significant digits ("4.5e10", "5e10")."""
    mantissa, exponent = f"{x:.{digits - 1}e}".split("e")
    return f"{float(mantissa):g}e{int(exponent)}"


def cost_labels(values: list[float]) -> list[str]:
    """The labels of one axis's ticks, at the fewest significant digits (two at least, six at
    most) that write every tick as it is, so that no two read the same: costs within a few
    percent of each other (1.78e10 to 1.84e10) read 1.78e10, 1.8e10, 1.82e10, where two digits
    printed 1.8e10 under each."""
    for digits in range(2, 7):
        labels = [cost_label(v, digits=digits) for v in values]
        if all(abs(float(label) - v) <= 1e-9 * abs(v) for label, v in zip(labels, values)):
            break
    return labels


def cost_formatter():
    """A matplotlib formatter that labels an axis's ticks with ``cost_labels``."""
    from matplotlib import ticker

    class CostFormatter(ticker.Formatter):
        def __call__(self, x, pos=None) -> str:
            return cost_label(x)

        def format_ticks(self, values) -> list[str]:
            return cost_labels(list(values))

    return CostFormatter()


def cost_axis(ax, label: str, nbins: int = 5, span: tuple[float, float] | None = None) -> None:
    """A log cost axis, called after the data are drawn. Over a decade or more it is labelled
    at 1, 2 and 5 per decade; over less (methods of one backbone often are), at 1, 2, 3 and 5,
    and under a factor of 3 at up to ``nbins`` evenly spaced ticks, since 1-2-5 would leave one
    label or none. No minor labels, so narrow panels stay legible. ``span``: the data range of
    every panel sharing the axis."""
    from matplotlib import ticker

    ax.set_xscale("log")
    lo, hi = span or ax.dataLim.intervalx
    ratio = hi / lo if lo > 0 else math.inf
    if ratio < 3:
        ax.xaxis.set_major_locator(ticker.MaxNLocator(nbins=nbins, steps=[1, 2, 2.5, 5, 10]))
    else:  # 1-2-3-5 under a decade, so that at least two labels fall inside
        subs = (1.0, 2.0, 3.0, 5.0) if ratio < 10 else (1.0, 2.0, 5.0)
        ax.xaxis.set_major_locator(ticker.LogLocator(base=10, subs=subs))
    ax.xaxis.set_major_formatter(cost_formatter())
    ax.xaxis.set_minor_locator(ticker.NullLocator())
    ax.set_xlabel(label)


def coincident(stats: dict[str, dict], cost: str = "flops", rtol: float = 1e-3) -> str:
    """A sentence naming runs drawn on the same point (same n and accuracy, cost within
    ``rtol``), which hide one another in a figure: e.g. a controller that always halts at
    depth 0 and the fixed alpha it then equals (its own few FLOPs apart). Empty when none."""
    groups: list[list[tuple[str, dict]]] = []
    for label, f in sorted(stats.items(), key=lambda kv: kv[1][cost]):
        for g in groups:
            first = g[0][1]
            if (first["n"], first["acc"]) == (f["n"], f["acc"]) and \
                    abs(f[cost] - first[cost]) <= rtol * abs(first[cost]):
                g.append((label, f))
                break
        else:
            groups.append([(label, f)])
    return "".join(f" {' and '.join(label for label, _ in g)} have the same accuracy and "
                   "cost and are drawn on top of each other." for g in groups if len(g) > 1)


def error_bars(fs: list[dict], key: str = "acc") -> list[list[float]]:
    """Error bars from each point's ``key`` down to its ``lo`` and up to its ``hi``."""
    return [[f[key] - f["lo"] for f in fs], [f["hi"] - f[key] for f in fs]]


def draw_accuracy_cost(ax, runs: list[tuple[str, dict]], cost: str = "flops",
                       legend: bool = True) -> None:
    """Accuracy (with intervals) against mean cost; FR and EE runs joined into their curves."""
    curves: dict[str, list[tuple[str, dict]]] = {}
    for label, f in runs:
        key = curve_key(label)
        if key is not None:
            curves.setdefault(key, []).append((label, f))
            continue
        ax.errorbar([f[cost]], [f["acc"]], yerr=error_bars([f]), linestyle="none", capsize=3,
                    label=label if legend else None, **style(label).kwargs())
    for key, points in curves.items():
        points.sort(key=lambda lf: lf[1][cost])
        st = style(points[0][0])
        xs, fs = [f[cost] for _, f in points], [f for _, f in points]
        parameter, relation, _ = curve_parameter(points[0][0])
        values = [curve_parameter(label)[2] for label, _ in points]
        name = key.replace(f"({parameter}", f"({parameter}{relation}{', '.join(values)}", 1)
        ax.errorbar(xs, [f["acc"] for f in fs], yerr=error_bars(fs), capsize=3, linestyle="-",
                    label=name if legend else None, **st.kwargs())
    ax.set_ylim(0, 1)


def pareto_figure(dataset: str, group: list[LabelledRun], out: Path) -> tuple[Path, str]:
    import matplotlib.pyplot as plt

    stats = {r.label: metrics(r.samples) for r in group}
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    draw_accuracy_cost(ax, list(stats.items()))
    pts = [(f["flops"], f["acc"]) for f in stats.values()]
    front = pareto_front(pts)
    ax.plot([pts[i][0] for i in front], [pts[i][1] for i in front], "k--", lw=1, marker="o",
            markersize=13, markerfacecolor="none", label="Pareto frontier (circled)")
    cost_axis(ax, "mean FLOPs per question")
    ax.set(ylabel="accuracy", title=dataset)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    caption = distinguishability(stats, dataset) + coincident(stats) + " " + \
        ci_note(stats.values())
    return save(fig, out / f"pareto_{slug(dataset)}.png"), caption


def level_figures(dataset: str, group: list[LabelledRun], out: Path) -> list[tuple[Path, str]]:
    """Per-level accuracy: one panel per level (accuracy against FLOPs, shared 0..1 axis) and
    one accuracy-by-level chart; then tokens and depth by level."""
    import matplotlib.pyplot as plt

    levelled = [(r, lv) for r in group if (lv := by_level(r.samples))]
    if not levelled:
        return []
    levels = sorted({k for _, lv in levelled for k in lv})
    per = {level: {r.label: metrics(lv[level]) for r, lv in levelled if level in lv}
           for level in levels}
    sentences = [distinguishability(per[level], f"level {level}") + coincident(per[level])
                 for level in levels]
    caption = f"{dataset} by level. " + " ".join(sentences) + " " + \
        ci_note([f for cells in per.values() for f in cells.values()])
    written = []

    fig, axes = plt.subplots(1, len(levels), figsize=(2.8 * len(levels) + 2.2, 3.2),
                             squeeze=False, sharey=True, sharex=True)
    for i, (ax, level) in enumerate(zip(axes[0], levels)):
        draw_accuracy_cost(ax, list(per[level].items()), legend=i == len(levels) - 1)
        ax.set_title(f"level {level}")
    span = (min(ax.dataLim.intervalx[0] for ax in axes[0]),
            max(ax.dataLim.intervalx[1] for ax in axes[0]))
    for ax in axes[0]:  # after every panel is drawn: the shared axis spans all their data
        cost_axis(ax, "FLOPs", nbins=4, span=span)
    axes[0][0].set_ylabel("accuracy")
    axes[0][-1].legend(fontsize=6, loc="center left", bbox_to_anchor=(1.02, 0.5))
    written.append((save(fig, out / f"pareto_levels_{slug(dataset)}.png"), caption))

    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    width = 0.8 / max(1, len(levelled))
    for j, (r, lv) in enumerate(levelled):
        xs = [lev + (j - (len(levelled) - 1) / 2) * width for lev in lv]
        fs = [per[lev][r.label] for lev in lv]
        ax.errorbar(xs, [f["acc"] for f in fs], capsize=2, label=r.label, yerr=error_bars(fs),
                    linestyle="-" if curve_key(r.label) is None else ":", lw=0.8,
                    **style(r.label).kwargs())
    ax.set(xlabel="level", ylabel="accuracy", title=f"{dataset}: accuracy by level",
           ylim=(0, 1), xticks=levels)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    written.append((save(fig, out / f"accuracy_by_level_{slug(dataset)}.png"), caption))

    for key, ylabel, name in (("tokens", "mean generated tokens", "tokens"),
                              ("depth", "mean ponder depth", "depth")):
        fig, ax = plt.subplots(figsize=(7.5, 4.2))
        for r, lv in levelled:
            ax.plot(list(lv), [per[lev][r.label][key] for lev in lv], "-", label=r.label,
                    **style(r.label).kwargs())
        ax.set(xlabel="level", ylabel=ylabel, title=dataset, xticks=levels)
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
        written.append((save(fig, out / f"{name}_by_level_{slug(dataset)}.png"),
                        f"{dataset}: {ylabel} per level (means, no intervals drawn)."))
    return written


def win_rate_figure(dataset: str, group: list[LabelledRun], out: Path) -> tuple[Path, str] | None:
    """Strong win rates of each FP run against Direct and CoT: per level where the dataset has
    levels, else one bar per pair with its Wilson 95% interval (GSM8K, GPQA)."""
    import matplotlib.pyplot as plt

    fp_runs = [r for r in group if r.method.startswith("FP-")]
    bases = [r for r in group if r.method in ("Direct", "CoT")]
    if not fp_runs or not bases:
        return None
    pairs = [(fp, base) for fp in fp_runs for base in bases]
    levels = sorted({lev for fp in fp_runs for lev in by_level(fp.samples)})
    if not levels:
        return _overall_win_figure(dataset, pairs, out)
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    for fp, base in pairs:
        rate = strong_win_rate(fp.samples, base.samples)
        ax.plot(list(rate), list(rate.values()), linestyle="-" if base.method == "Direct"
                else "--", label=f"{fp.label} vs {base.label}", **style(fp.label).kwargs())
    ax.set(xlabel="level", ylabel="strong win rate", title=dataset, ylim=(0, 1), xticks=levels)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    caption = (f"{dataset}: per level, the share of questions where FP is right and the "
               "baseline wrong, or both right with FP using fewer tokens (solid: against "
               "Direct, dashed: against CoT). Point estimates, no intervals.")
    return save(fig, out / f"win_rate_{slug(dataset)}.png"), caption


def _overall_win_figure(dataset: str, pairs: list, out: Path) -> tuple[Path, str]:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 0.9 + 0.45 * len(pairs)))
    rates = []
    for y, (fp, base) in enumerate(pairs):
        wins, n = strong_wins(fp.samples, base.samples)
        rate = wins / n if n else math.nan
        lo, hi = wilson(wins, n)
        st = style(fp.label)
        ax.barh(y, rate, color=st.colour, alpha=0.85 if base.method == "Direct" else 0.45,
                hatch="" if base.method == "Direct" else "//", edgecolor=st.colour)
        ax.errorbar(rate, y, xerr=[[rate - lo], [hi - rate]], fmt="none", ecolor="black",
                    capsize=3, lw=1)
        rates.append(f"{fp.label} vs {base.label} {rate:.3f} [{lo:.3f}, {hi:.3f}] (n={n})")
    ax.set_yticks(range(len(pairs)), [f"{fp.label} vs {base.label}" for fp, base in pairs],
                  fontsize=8)
    ax.invert_yaxis()
    ax.set(xlabel="strong win rate", title=dataset, xlim=(0, 1))
    caption = (f"{dataset} (no difficulty levels): the share of questions where FP is right "
               "and the baseline wrong, or both right with FP using fewer tokens, with Wilson "
               "95% intervals (solid: against Direct, hatched: against CoT): "
               + "; ".join(rates) + ".")
    return save(fig, out / f"win_rate_{slug(dataset)}.png"), caption


# the paired comparisons of the paper's per-level figures: each method against its own base
# (the steered methods: FR and FP-Direct on Direct's prompt, FP-CoT on CoT's, FP-BoN on BoN's)
BASE_OF = {m.label: registry.base_of(m.label) for m in registry.METHODS if m.steered}


def paired_levels(run: LabelledRun, base: LabelledRun) -> dict[int, dict[str, float]]:
    """Per level, ``run`` against ``base`` (``measures.paired_difference``)."""
    other = by_level(base.samples)
    paired = {level: paired_difference(samples, other.get(level, []))
              for level, samples in by_level(run.samples).items()}
    return {level: d for level, d in paired.items() if d is not None}


def family(label: str) -> str:
    return style(label).family


def savings_figure(dataset: str, group: list[LabelledRun], out: Path) -> tuple[Path, str] | None:
    """The paper's "FLOPs saved against accuracy gained" per difficulty level: each FP run
    (and FR) against its base, one point per level."""
    import matplotlib.pyplot as plt

    by_family = {family(r.label): r for r in group}
    pairs = [(r, by_family[BASE_OF[family(r.label)]]) for r in group
             if family(r.label) in BASE_OF and BASE_OF[family(r.label)] in by_family]
    stats = [(r, b, lv) for r, b in pairs if (lv := paired_levels(r, b))]
    if not stats:
        return None
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    lines = []
    for r, b, lv in stats:
        xs, ys = [lv[k]["saved"] for k in lv], [lv[k]["gain"] for k in lv]
        ax.errorbar(xs, ys, yerr=error_bars(list(lv.values()), "gain"), capsize=2, lw=0.8,
                    label=f"{r.label} vs {b.label}", **style(r.label).kwargs())
        for k, x, y in zip(lv, xs, ys):
            ax.annotate(str(k), (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
        lines.append(f"{r.label} vs {b.label}: " + ", ".join(
            f"L{k} {lv[k]['saved']:+.0%} FLOPs saved, {lv[k]['gain']:+.3f} "
            f"[{lv[k]['lo']:+.3f}, {lv[k]['hi']:+.3f}]" for k in lv))
    ax.axhline(0, color="black", lw=0.6)
    ax.axvline(0, color="black", lw=0.6)
    ax.set(xlabel="FLOPs saved against the base (fraction)",
           ylabel="accuracy gained (paired difference)", title=f"{dataset}: savings by level")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    caption = (f"{dataset}: per difficulty level (numbers at the points), the FLOPs a method "
               "saves against its base and the accuracy it gains, with bootstrap 95% intervals "
               "of the paired per-question difference. " + "; ".join(lines) + ".")
    return save(fig, out / f"savings_by_level_{slug(dataset)}.png"), caption


def relative_to_cot_figure(dataset: str, group: list[LabelledRun],
                           out: Path) -> tuple[Path, str] | None:
    """The paper's "performance relative to CoT" per difficulty level: every method's accuracy
    minus CoT's on the same questions, with a paired bootstrap interval."""
    import matplotlib.pyplot as plt

    cot = next((r for r in group if family(r.label) == "CoT"), None)
    if cot is None:
        return None
    others = [(r, lv) for r in group if r is not cot and (lv := paired_levels(r, cot))]
    if not others:
        return None
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    width = 0.8 / len(others)
    lines = []
    for j, (r, lv) in enumerate(others):
        xs = [k + (j - (len(others) - 1) / 2) * width for k in lv]
        ax.errorbar(xs, [lv[k]["gain"] for k in lv], yerr=error_bars(list(lv.values()), "gain"),
                    capsize=2, lw=0.8, label=r.label, **style(r.label).kwargs())
        beyond = [k for k in lv if lv[k]["lo"] > 0 or lv[k]["hi"] < 0]
        lines.append(f"{r.label}: " + (f"beyond its interval at level(s) "
                                       f"{', '.join(map(str, beyond))}" if beyond
                                       else "within its interval of CoT at every level"))
    ax.axhline(0, color="black", lw=0.6)
    ax.set(xlabel="level", ylabel=f"accuracy minus {cot.label}'s",
           title=f"{dataset}: relative to CoT", xticks=sorted({k for _, lv in others for k in lv}))
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    caption = (f"{dataset}: each method's accuracy minus {cot.label}'s on the same questions, "
               "per level, with bootstrap 95% intervals of the paired difference. "
               + "; ".join(lines) + ".")
    return save(fig, out / f"relative_to_cot_{slug(dataset)}.png"), caption


def plots(common: dict[str, list[LabelledRun]], out: Path) -> list[tuple[Path, str]]:
    """Every figure of the report, each with its caption, for runs restricted per dataset to
    the questions all of them answered."""
    import matplotlib

    matplotlib.use("Agg")
    written = []
    for dataset, group in sorted(common.items()):
        for name, runs in by_decoding(dataset, [r for r in group if r.samples]).items():
            written.append(pareto_figure(name, runs, out))
            written += level_figures(name, runs, out)
            written += [figure for extra in (win_rate_figure, savings_figure, relative_to_cot_figure)
                        if (figure := extra(name, runs, out)) is not None]
    return written


def by_decoding(dataset: str, group: list[LabelledRun]) -> dict[str, list[LabelledRun]]:
    """One set of figures per decoding policy (``suite --decoding``), so that each stays
    readable: the greedy runs (with Best-of-N, which samples by definition) under the dataset's
    name, each other policy's runs under ``<dataset> [<policy>]``."""
    out: dict[str, list[LabelledRun]] = {}
    for r in group:
        decoding = style(r.label).decoding
        out.setdefault(dataset if decoding == "greedy" else f"{dataset} [{decoding}]",
                       []).append(r)
    return out


def slug(name: str) -> str:
    """A figure's file-name part: ``arith [t0.7]`` -> ``arith_t0.7``."""
    return re.sub(r"[^A-Za-z0-9.]+", "_", name).strip("_")


def save(fig, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    save_figure(fig, path, dpi=110, bbox_inches="tight")  # a palette PNG: a third the bytes
    plt.close(fig)
    return path
