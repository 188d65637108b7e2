"""The report's figures: one colour per method everywhere, intervals on a shared 0..1 axis,
the fixed-alpha curve as a line, captions that say what the intervals resolve."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.colors import to_hex  # noqa: E402

from lm_eval_ponder.reporting import plots as pl  # noqa: E402


def fig(acc, n=100, flops=1e9, tokens=10.0):
    from lm_eval_ponder.reporting.measures import wilson

    lo, hi = wilson(acc * n, n)
    return {"n": n, "acc": acc, "lo": lo, "hi": hi, "flops": flops, "tokens": tokens}


def test_a_method_keeps_its_colour_whatever_its_label_adds():
    colours = {pl.style(label).colour for label in
               ("FP-Direct", "FP-Direct [t0.7]", "FP-Direct [dtype=bfloat16]")}
    assert colours == {pl.FAMILY_COLOURS["FP-Direct"]}
    assert pl.style("FR (alpha=-0.2)").colour == pl.style("FR (alpha=0.1) [top_k40]").colour
    assert pl.style("Direct (default args)").family == "Direct"
    assert len({pl.style(m).colour for m in pl.FAMILY_COLOURS}) == len(pl.FAMILY_COLOURS)
    assert pl.style("Something new").colour == pl.style("Something new [t0.7]").colour


def test_decoding_picks_the_marker_and_other_variants_are_hollow():
    assert pl.style("CoT").marker == "o" and pl.style("CoT [top_p0.95]").marker == "^"
    assert not pl.style("CoT [t0.7]").hollow and pl.style("CoT [dtype=float32]").hollow
    assert pl.style("CoT [dtype=float32]").kwargs()["markerfacecolor"] == "none"


def test_fixed_alpha_runs_are_one_curve_in_order_of_cost():
    assert pl.curve_key("FR (alpha=-0.2)") == pl.curve_key("FR (alpha=0)") == "FR (alpha)"
    assert pl.curve_key("FR (alpha=0) [t0.7]") != pl.curve_key("FR (alpha=0)")
    assert pl.curve_key("FP-Direct") is None
    _, ax = plt.subplots()
    runs = [("FR (alpha=0)", fig(0.3, flops=3e9)), ("Direct", fig(0.2, flops=2e9)),
            ("FR (alpha=-0.2)", fig(0.4, flops=1e9)), ("FR (alpha=-0.1)", fig(0.5, flops=2e9))]
    pl.draw_accuracy_cost(ax, runs)
    series = {c.get_label(): c.lines[0] for c in ax.containers}
    assert set(series) == {"FR (alpha=-0.2, -0.1, 0)", "Direct"}  # one series for the 3 FR runs
    curve = series["FR (alpha=-0.2, -0.1, 0)"]
    assert list(curve.get_xdata()) == [1e9, 2e9, 3e9] and curve.get_linestyle() == "-"
    assert list(curve.get_ydata()) == [0.4, 0.5, 0.3]
    assert series["Direct"].get_linestyle() == "None"
    assert ax.get_ylim() == (0, 1)
    assert all(c.has_yerr for c in ax.containers)  # every point carries its interval
    plt.close("all")


def test_colours_do_not_depend_on_the_order_runs_come_in():
    drawn = []
    for order in (["Direct", "CoT", "FP-Direct"], ["FP-Direct", "Direct", "CoT"]):
        _, ax = plt.subplots()
        pl.draw_accuracy_cost(ax, [(label, fig(0.5)) for label in order])
        drawn.append({c.get_label(): to_hex(c.lines[0].get_color()) for c in ax.containers})
    assert drawn[0] == drawn[1] and drawn[0]["CoT"] == pl.FAMILY_COLOURS["CoT"]
    plt.close("all")


def test_caption_says_what_the_intervals_resolve():
    text = pl.distinguishability({"A": fig(0.80), "B": fig(0.75), "C": fig(0.30)}, "gsm8k")
    assert "highest accuracy A 0.800" in text
    assert "Not distinguishable from it: B." in text
    assert "Below it beyond the intervals: C." in text
    clear = pl.distinguishability({"A": fig(0.9), "B": fig(0.2)}, "arith")
    assert "clears every other" in clear and "(n=100)" in clear


class FakeRun:
    def __init__(self, label, correct, levels=True):
        self.label = self.method = label
        self.samples = [{"doc_id": i, "doc": {"level": 1 + i % 3} if levels else {},
                         "exact_match": float(c), "gen_tokens": 10.0, "flops": 1e9,
                         "ponder_steps": 0}
                        for i, c in enumerate(correct)]


def test_a_dataset_without_levels_gets_one_win_rate_per_pair(tmp_path):
    """GSM8K and GPQA have no levels: the win-rate figure is one bar per FP/baseline pair with
    its interval (a per-level line chart would be empty)."""
    runs = [FakeRun("Direct", [i % 2 for i in range(30)], levels=False),
            FakeRun("CoT", [0] * 30, levels=False),
            FakeRun("FP-Direct", [1] * 30, levels=False)]
    written = dict((p.name, c) for p, c in pl.plots({"gsm8k": runs}, tmp_path))
    assert set(written) == {"pareto_gsm8k.png", "win_rate_gsm8k.png"}
    caption = written["win_rate_gsm8k.png"]
    assert "FP-Direct vs Direct 0.500" in caption and "FP-Direct vs CoT 1.000" in caption
    assert "(n=30)" in caption


def test_every_figure_is_written_with_a_caption(tmp_path):
    runs = [FakeRun("Direct", [i % 2 for i in range(30)]),
            FakeRun("FP-Direct", [1] * 30), FakeRun("FR (alpha=-0.2)", [0] * 30)]
    written = pl.plots({"arith": runs}, tmp_path)
    names = {p.name for p, _ in written}
    assert {"pareto_arith.png", "pareto_levels_arith.png", "accuracy_by_level_arith.png",
            "tokens_by_level_arith.png", "depth_by_level_arith.png",
            "win_rate_arith.png", "savings_by_level_arith.png"} == names  # no CoT: no
    # relative-to-CoT figure
    captions = dict((p.name, c) for p, c in written)
    assert "level 1 (n=10)" in captions["accuracy_by_level_arith.png"]
    assert "highest accuracy FP-Direct 1.000" in captions["pareto_arith.png"]
    assert all(p.stat().st_size > 1000 for p, _ in written)


def test_each_decoding_policy_gets_its_own_figures(tmp_path):
    runs = [FakeRun(label, [1, 0] * 15) for label in
            ("Direct", "BoN", "Direct [t0.7]", "FR (alpha=-0.2) [t0.7]", "CoT [top_k40]")]
    groups = pl.by_decoding("arith", runs)
    assert {k: [r.label for r in v] for k, v in groups.items()} == {
        "arith": ["Direct", "BoN"], "arith [t0.7]": ["Direct [t0.7]", "FR (alpha=-0.2) [t0.7]"],
        "arith [top_k40]": ["CoT [top_k40]"]}
    names = {p.name for p, _ in pl.plots({"arith": runs}, tmp_path)}
    assert {"pareto_arith.png", "pareto_arith_t0.7.png", "pareto_arith_top_k40.png"} <= names


def test_a_cost_axis_under_a_decade_gets_distinct_labels():
    """Methods of one backbone often span less than a decade of FLOPs: the axis must still
    carry several different labels (1-2-5 per decade would leave one, and one significant digit
    printed 4.5e10 and 5.4e10 both as 5e10)."""
    fig, ax = plt.subplots()
    ax.plot([4.3e10, 5.6e10], [0.1, 0.2], "o")
    pl.cost_axis(ax, "FLOPs")
    fig.canvas.draw()
    lo, hi = ax.get_xlim()
    labels = [t.get_text() for t in ax.get_xticklabels() if lo <= t.get_position()[0] <= hi]
    plt.close(fig)
    assert len(labels) >= 3 and len(set(labels)) == len(labels)
    assert pl.cost_label(4.5e10) == "4.5e10" and pl.cost_label(5e10) == "5e10"
    assert pl.cost_label(2e11) == "2e11"


def test_close_costs_get_distinct_ticks_that_read_as_they_are():
    """Issue 55: costs within a few percent (1.78e10 to 1.84e10) had every tick read 1.8e10.
    Each tick now carries the digits that tell it from its neighbours, and no more."""
    fig, ax = plt.subplots()
    ax.plot([1.78e10, 1.84e10], [0.1, 0.2], "o")
    pl.cost_axis(ax, "FLOPs")
    fig.canvas.draw()
    lo, hi = ax.get_xlim()
    ticks = [t for t in ax.get_xticklabels() if lo <= t.get_position()[0] <= hi]
    plt.close(fig)
    labels = [t.get_text() for t in ticks]
    assert len(labels) >= 3 and len(set(labels)) == len(labels)
    for tick in ticks:
        assert abs(float(tick.get_text()) - tick.get_position()[0]) <= 1e-9 * tick.get_position()[0]
    assert pl.cost_labels([1.8e10, 1.82e10]) == ["1.8e10", "1.82e10"]
    assert pl.cost_labels([4e10, 5e10]) == ["4e10", "5e10"]


def test_runs_on_the_same_point_are_named_in_the_caption():
    same = pl.coincident({"FP-Direct": fig(0.164, 500, 4.4e10), "FR (alpha=-0.2)":
                          fig(0.164, 500, 4.4001e10), "Direct": fig(0.164, 500, 5.5e10)})
    assert "FP-Direct and FR (alpha=-0.2) have the same accuracy and cost" in same
    assert "Direct and" not in same.replace("FP-Direct and", "")
    assert pl.coincident({"A": fig(0.2), "B": fig(0.3)}) == ""
    assert pl.coincident({"A": fig(0.2, 100, 1e9), "B": fig(0.2, 100, 1.1e9)}) == ""


def test_table_rows_follow_the_papers_order():
    labels = ["FP-BoN", "BoN", "FR (alpha=-0.2)", "Direct [t0.7]", "Zeta", "FP-Direct", "CoT",
              "Direct"]
    assert sorted(labels, key=pl.table_rank) == ["Direct", "Direct [t0.7]", "CoT", "BoN",
                                                 "FR (alpha=-0.2)", "FP-Direct", "FP-BoN", "Zeta"]


def test_savings_by_level_pairs_each_method_with_its_base(tmp_path):
    """The paper's FLOPs-saved-against-accuracy-gained figure: per level, paired on questions,
    with an interval of the paired difference."""
    base = FakeRun("Direct", [i % 2 for i in range(60)])
    fp = FakeRun("FP-Direct", [1] * 60)
    for s in fp.samples:
        s["flops"] = 0.25e9  # a quarter of the base's
    levels = pl.paired_levels(fp, base)
    assert sorted(levels) == [1, 2, 3]
    assert all(v["saved"] == 0.75 and v["n"] == 20 for v in levels.values())
    assert all(v["lo"] <= v["gain"] <= v["hi"] for v in levels.values())
    assert levels[1]["gain"] == 0.5  # level 1 = even doc ids: Direct wrong on half of them
    written = dict((p.name, c) for p, c in pl.plots({"arith": [base, fp]}, tmp_path))
    assert "L1 +75% FLOPs saved, +0.500" in written["savings_by_level_arith.png"]


def test_relative_to_cot_flags_levels_beyond_the_interval(tmp_path):
    cot = FakeRun("CoT", [0] * 60)
    same = FakeRun("Direct", [0] * 60)
    better = FakeRun("FP-CoT", [1] * 60)
    written = dict((p.name, c) for p, c in pl.plots({"arith": [cot, same, better]}, tmp_path))
    caption = written["relative_to_cot_arith.png"]
    assert "FP-CoT: beyond its interval at level(s) 1, 2, 3" in caption
    assert "Direct: within its interval of CoT at every level" in caption
