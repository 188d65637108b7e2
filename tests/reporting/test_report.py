"""The report from synthetic lm-eval output directories: labels, CIs, honest bolding, files."""

from __future__ import annotations

import json
import math

import pytest

from lm_eval_ponder.reporting import report as rp
from lm_eval_ponder.errors import PonderError


def write_run(root, name, model_args, task, rows, model="ponder"):
    d = root / name / "model"
    d.mkdir(parents=True)
    stamp = "2026-01-01T00-00-00.0"
    (d / f"results_{stamp}.json").write_text(json.dumps(
        {"config": {"model": model, "model_args": model_args}, "results": {task: {}}}))
    with open(d / f"samples_{task}_{stamp}.jsonl", "w") as f:
        for i, (correct, tokens, depth, level) in enumerate(rows):
            f.write(json.dumps({"doc_id": i, "doc": {"question": f"q{i}", "level": level},
                                "target": "1", "filtered_resps": [f"answer {i}"],
                                "exact_match": float(correct), "gen_tokens": tokens,
                                "flops": 1e9 * tokens, "ponder_steps": depth}) + "\n")


@pytest.fixture
def runs(tmp_path):
    levels = [1, 1, 2, 2, 3, 3, 4, 4, 5, 5] * 4
    write_run(tmp_path, "direct", {"controller": "none"}, "arith_ponder",
              [(i % 2 == 0, 100, 0, lv) for i, lv in enumerate(levels)])
    write_run(tmp_path, "cot", {"controller": "none"}, "arith_ponder_cot",
              [(i % 4 == 0, 150, 0, lv) for i, lv in enumerate(levels)])
    write_run(tmp_path, "fp", {"controller": "/x"}, "arith_ponder",
              [(True, 60, lv, lv) for lv in levels])  # depth rises with level
    write_run(tmp_path, "fr", {"alpha": "-0.2"}, "arith_ponder",
              [(i % 2 == 0, 70, 0, lv) for i, lv in enumerate(levels)])
    return tmp_path


def test_labels_from_model_args(runs):
    methods = {r.method for r in rp.load_runs([runs])}
    assert methods == {"Direct", "CoT", "FP-Direct", "FR (alpha=-0.2)"}


def test_report_files_bold_and_spearman(runs, tmp_path):
    text = rp.report([runs], tmp_path / "out")
    out = tmp_path / "out"
    for name in ("leaderboard.md", "leaderboard.csv", "leaderboard.html", "pareto_arith.png",
                 "depth_by_level_arith.png", "win_rate_arith.png"):
        assert (out / name).is_file(), name
    md = (out / "leaderboard.md").read_text()
    assert "**1.000 [" in md  # FP: 40/40 vs 20/40, intervals do not overlap -> bold
    assert "Spearman(ponder depth, level) FP-Direct on arith: 1.000" in text
    html = (out / "leaderboard.html").read_text()
    assert "data:image/png;base64" in html and "Rule:" in html


def test_tie_within_ci_is_not_bolded(tmp_path):
    write_run(tmp_path, "a", {"controller": "none"}, "gsm8k_ponder", [(i < 5, 10, 0, None)
                                                                      for i in range(10)])
    write_run(tmp_path, "b", {"controller": "none"}, "gsm8k_ponder_cot",
              [(i < 6, 10, 0, None) for i in range(10)])
    rows, notes = rp.leaderboard(rp.load_runs([tmp_path]))
    assert not any(r["gsm8k"]["win"] for r in rows)
    assert notes and "tie within the 95% CI" in notes[0]


def test_wilson_and_pareto():
    lo, hi = rp.wilson(5, 10)
    assert lo == pytest.approx(0.2366, abs=1e-3) and hi == pytest.approx(0.7634, abs=1e-3)
    assert math.isnan(rp.wilson(0, 0)[0])
    assert rp.pareto_front([(1, 0.5), (2, 0.4), (3, 0.9), (0.5, 0.1)]) == [3, 0, 2]


def test_missing_results_is_a_clear_error(tmp_path):
    with pytest.raises(PonderError, match="no lm-eval results"):
        rp.load_runs([tmp_path])


def test_decoding_policies_get_a_verdict_each(tmp_path):
    """Rows labelled by `suite --decoding` ("FP-Direct [t0.7]") are compared per policy: a win
    only with disjoint CIs, otherwise a tie."""
    (tmp_path / "g").mkdir()
    (tmp_path / "g" / "ponder_run.json").write_text(json.dumps({"method": "{base}"}))
    write_run(tmp_path / "g", "direct", {"controller": "none"}, "arith_ponder",
              [(i < 10, 50, 0, 1) for i in range(40)])
    for name, method, rows in (("fp", "FP-Direct", [(True, 30, 1, 1)] * 40),
                               ("fpt", "FP-Direct [t0.7]", [(i < 12, 30, 1, 1) for i in range(40)]),
                               ("dt", "Direct [t0.7]", [(i < 10, 50, 0, 1) for i in range(40)])):
        (tmp_path / name).mkdir()
        (tmp_path / name / "ponder_run.json").write_text(json.dumps({"method": method}))
        write_run(tmp_path / name, "run", {"controller": "x"}, "arith_ponder", rows)
    rows, _ = rp.leaderboard(rp.load_runs([tmp_path]))
    verdicts = rp.decoding_verdicts(rows, ["arith"])
    assert len(verdicts) == 2
    assert verdicts[0].startswith("decoding greedy") and verdicts[0].endswith("FP wins")
    assert verdicts[1].startswith("decoding t0.7") and "tie within the 95% CIs" in verdicts[1]
    assert rp.decoding_verdicts([r for r in rows if "[" not in r["method"]], ["arith"]) == []
