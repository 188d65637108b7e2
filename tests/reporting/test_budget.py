"""Estimating a suite's wall time from a pilot, before it starts."""

from __future__ import annotations

import json

import pytest

from lm_eval_ponder.errors import PonderError
from lm_eval_ponder.reporting import budget, suite, suite_plan, suite_run


def pilot_run(root, decoding, method, dataset, tokens_per_question, wall_s, questions=10,
              kept_answers=0):
    d = root / decoding / method.replace(" ", "_") / dataset
    (d / "model").mkdir(parents=True)
    (d / "ponder_run.json").write_text(json.dumps(
        {"method": method, "decoding": decoding, "wall_s": wall_s, "kept_answers": kept_answers}))
    with open(d / "model" / "samples_x_2026.jsonl", "w") as f:
        for i in range(questions):
            for _ in range(2):  # lm-eval logs a question once per filter: count it once
                f.write(json.dumps({"doc_id": i, "gen_tokens": tokens_per_question}) + "\n")


def test_cost_model_is_fitted_to_the_pilot(tmp_path):
    # wall = 20 s + 0.01 s per token, exactly
    for method, dataset, per_q in (("Direct", "arith", 50), ("CoT", "arith", 200),
                                   ("BoN", "gsm8k", 1000)):
        pilot_run(tmp_path, "greedy", method, dataset, per_q, 20 + 0.01 * 10 * per_q)
    runs = budget.read_pilot(tmp_path)
    assert {(r.label, r.dataset, r.questions, r.tokens) for r in runs} == {
        ("Direct", "arith", 10, 500.0), ("CoT", "arith", 10, 2000.0), ("BoN", "gsm8k", 10, 10000.0)}
    model = budget.fit_cost(runs)
    assert model.startup_s == pytest.approx(20) and model.s_per_token == pytest.approx(0.01)


def test_a_resumed_run_does_not_price_tokens(tmp_path):
    """Its wall time is its last attempt's, not its answers': kept out of the fit."""
    pilot_run(tmp_path, "greedy", "Direct", "arith", 50, 25.0)
    pilot_run(tmp_path, "greedy", "CoT", "arith", 200, 3.0, kept_answers=8)
    assert [r.label for r in budget.read_pilot(tmp_path)] == ["Direct"]


def test_a_negative_start_up_falls_back_to_a_fit_through_the_origin():
    runs = [budget.PilotRun("a", "greedy", "arith", 1, 100, 0.5),
            budget.PilotRun("b", "greedy", "arith", 1, 200, 2.0)]
    model = budget.fit_cost(runs)
    assert model.startup_s == 0 and model.s_per_token == pytest.approx(450 / 50000)


def test_full_runs_are_priced_at_the_datasets_sizes(tmp_path):
    pilot = [budget.PilotRun("Direct", "greedy", "gsm8k", 10, 1000, 30.0),
             budget.PilotRun("CoT", "greedy", "gsm8k", 10, 3000, 50.0)]
    planned = suite_plan.plan(["Direct", "CoT", "BoN"], ["gsm8k"], ["greedy"], -0.2, None)
    rows, model = budget.estimate(planned, pilot, done={("CoT", "greedy", "gsm8k")})
    by = {r["label"]: r for r in rows}
    assert by["Direct"]["questions"] == 1319 and by["Direct"]["tokens"] == 1319 * 100
    assert by["Direct"]["wall_s"] == pytest.approx(model.wall(1319 * 100))
    assert by["CoT"]["wall_s"] == 0 and by["CoT"]["done"]
    assert by["BoN"]["wall_s"] is None  # no pilot run: not guessed
    text = budget.render_estimate(rows, model)
    assert "no pilot run" in text and "1 runs have no pilot run and are not counted" in text
    limited, _ = budget.estimate(planned, pilot, limit=20)
    assert {r["questions"] for r in limited} == {20}


def test_a_pilot_without_runs_is_a_clear_error(tmp_path):
    with pytest.raises(PonderError, match="no finished suite runs"):
        budget.read_pilot(tmp_path)
    with pytest.raises(PonderError, match="no such pilot"):
        budget.read_pilot(tmp_path / "missing")


def test_suite_plan_prints_the_estimate_and_runs_nothing(tmp_path, monkeypatch, capsys):
    pilot_run(tmp_path / "pilot", "greedy", "Direct", "arith", 60, 26.0)
    pilot_run(tmp_path / "pilot", "greedy", "CoT", "arith", 150, 35.0)
    monkeypatch.setattr(suite_run.subprocess, "run", lambda *a, **k: pytest.fail("ran a run"))
    suite.main(["--output", str(tmp_path / "full"), "--controller", "none", "--tasks", "arith",
                "--methods", "Direct,CoT", "--plan", "--pilot", str(tmp_path / "pilot")])
    out = capsys.readouterr().out
    assert "| Direct | arith | 500 | 60 |" in out and "Estimated total:" in out
    suite.main(["--output", str(tmp_path / "full"), "--controller", "none", "--tasks", "arith",
                "--methods", "Direct", "--plan"])
    assert "Direct on arith: 500 questions, to run" in capsys.readouterr().out


def test_dataset_sizes_are_the_loaders(shared_data):
    from lm_eval_ponder import data

    assert budget.DATASET_SIZES == {
        "arith": len(data.load_arith()), "gsm8k": len(data.load_gsm8k("test")),
        "math500": len(data.load_math500()), "gpqa": len(data.load_gpqa_diamond())}


def logged_run(root, method, dataset, tokens, decoding="greedy"):
    """A finished suite run as the repository keeps it: marker, results JSON, compact log
    (a resumed run's ``kept_answers`` does not matter: only its lengths are read)."""
    from lm_eval_ponder.files import write_jsonl_xz

    d = root / decoding / method / dataset / "model"
    d.mkdir(parents=True)
    (d.parent / "ponder_run.json").write_text(json.dumps(
        {"method": method, "decoding": decoding, "wall_s": 1.0, "kept_answers": 5}))
    task = f"{dataset}_ponder"
    (d / "results_2026.json").write_text(json.dumps({"results": {task: {}}}))
    write_jsonl_xz(d / f"samples_{task}_2026.compact.jsonl.xz",
                   [{"doc_id": i, "gen_tokens": t} for i, t in enumerate(tokens)])


def test_a_scale_cost_prices_the_runs_and_the_training(tmp_path, capsys):
    """Issue 54's estimate: runs priced at scale.py's measured rate (100 useful tok/s, 30 s to
    load) with the answer lengths of a finished suite's compact logs; the paper-scale training
    at the same rate; refusals in one line."""
    lengths = tmp_path / "suite"
    logged_run(lengths, "Direct", "arith", [100, 300])   # 200 tokens a question
    logged_run(lengths, "Direct", "gsm8k", [400, 400])
    scale = tmp_path / "scale.json"
    scale.write_text(json.dumps({"shape": "qwen2.5-7b", "device": "cuda", "dtype": "bf16",
                                 "useful_tok_s": {"loop": 100.0, "hf-64": 40.0},
                                 "load_s": 30.0, "harness_s": 70.0}))
    runs = [suite_plan.Run("greedy", m, m, "arith", "arith_ponder", "controller=none")
            for m in ("Direct", "CoT")]
    text = suite_plan.plan_text(runs, tmp_path / "out", str(lengths), 10, str(scale))
    assert "| Direct | arith | 10 | 200 | 2 min |" in text  # 30 s + 70 s + 10 x 200 / 100 s
    assert "| CoT | arith | 10 | - | no pilot run |" in text
    assert "qwen2.5-7b on cuda" in text and "100 useful tok/s" in text
    # training: the trainer's defaults at the greedy Direct mean (300 tokens an answer)
    tokens = budget.training_tokens(300.0)
    for name, n in tokens.items():
        assert f"{name}: {n:,.0f} tokens, {n / 100 / 3600:.1f} h" in text
    assert "the loop alone: a lower bound" in text
    # with the harness's own cost per token measured (scale.py --harness-questions): 5 ms more
    # a token, so 10 x 200 tokens at 15 ms = 30 s on top of 100 s of start-up
    scale.write_text(json.dumps({"shape": "qwen2.5-7b", "device": "cuda", "dtype": "bf16",
                                 "useful_tok_s": {"loop": 100.0}, "load_s": 30.0,
                                 "harness_s": 70.0, "harness_overhead": {"s_per_token": 0.005}}))
    assert budget.ScaleCost.read(scale).model().s_per_token == pytest.approx(0.015)
    text = suite_plan.plan_text(runs, tmp_path / "out", str(lengths), 10, str(scale))
    assert "+ 5.00 ms/token the harness spends beyond the loop" in text
    with pytest.raises(PonderError, match="needs --pilot"):
        suite_plan.plan_text(runs, tmp_path / "out", None, 10, str(scale))
    with pytest.raises(PonderError, match="not a benchmarks/scale.py"):
        suite_plan.plan_text(runs, tmp_path / "out", str(lengths), 10, str(lengths))


def test_a_scale_record_of_fewer_questions_than_rows_in_flight_is_flagged(tmp_path):
    """A rate measured with fewer questions than the loop keeps in flight is too low for a full
    run on a memory-bound device (issue 54: 24 questions priced a 234 s run at 414 s): the plan
    says so, and how to record a better one; a record at least as wide as the rows is quiet."""
    lengths = tmp_path / "suite"
    logged_run(lengths, "Direct", "arith", [100, 300])
    scale = tmp_path / "scale.json"
    record = {"shape": "qwen2.5-0.5b", "device": "cpu", "dtype": "bf16", "questions": 24,
              "loop_max_rows": 128, "useful_tok_s": {"loop": 100.0}, "load_s": 1.0}
    scale.write_text(json.dumps(record))
    runs = [suite_plan.Run("greedy", "Direct", "Direct", "arith", "arith_ponder", "controller=none")]
    text = suite_plan.plan_text(runs, tmp_path / "out", str(lengths), None, str(scale))
    assert text.startswith("Warning: this record replayed 24 questions, fewer than the loop's "
                           "128 rows in flight in a 500-question run")
    assert "`benchmarks/scale.py --questions 128` or more" in text
    # a 20-question run keeps no more rows in flight than the record did
    assert not suite_plan.plan_text(runs, tmp_path / "out", str(lengths), 20, str(scale)).startswith(
        "Warning")
    scale.write_text(json.dumps({**record, "questions": 256}))
    assert not suite_plan.plan_text(runs, tmp_path / "out", str(lengths), None, str(scale)).startswith(
        "Warning")


def test_a_pilot_of_committed_runs_is_read_from_their_compact_logs(tmp_path):
    """Issue 66: ``suite --plan --pilot results/suite`` said "no finished suite runs" of the
    committed runs, which keep a compact samples log and no full one; a folder of resumed runs
    says that is why."""
    from lm_eval_ponder.files import write_jsonl_xz
    from lm_eval_ponder.reporting.compact import COMPACT

    pilot_run(tmp_path, "greedy", "Direct", "arith", 20, 30.0)
    (log,) = (tmp_path / "greedy").rglob("samples_*.jsonl")
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    write_jsonl_xz(log.with_name(log.name.replace(".jsonl", COMPACT)), rows)
    log.unlink()
    (run,) = budget.read_pilot(tmp_path)
    assert (run.questions, run.tokens) == (10, 200)
    resumed = tmp_path / "resumed"
    pilot_run(resumed, "greedy", "CoT", "arith", 20, 30.0, kept_answers=3)
    with pytest.raises(PonderError, match="were all resumed runs"):
        budget.read_pilot(resumed)
