"""The report from synthetic lm-eval output directories: labels, CIs, honest bolding, files."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from conftest import needs_embedded

from lm_eval_ponder.errors import PonderError
from lm_eval_ponder.reporting import report as rp
from lm_eval_ponder.reporting import tables


def write_results(root, name, config, task, samples, configs=None, stamp="2026-01-01T00-00-00.0"):
    """An lm-eval output directory as the CLI writes it: results JSON + samples log."""
    d = root / name / "model"
    d.mkdir(parents=True, exist_ok=True)
    (d / f"results_{stamp}.json").write_text(json.dumps(
        {"config": config, "configs": configs or {}, "results": {task: {}}}))
    with open(d / f"samples_{task}_{stamp}.jsonl", "w") as f:
        for sample in samples:
            f.write(json.dumps(sample) + "\n")
    return d / f"results_{stamp}.json"


def write_run(root, name, model_args, task, rows, model="ponder", config=None, configs=None,
              stamp="2026-01-01T00-00-00.0"):
    samples = [{"doc_id": i, "doc": {"question": f"q{i}", "level": level}, "target": "1",
                "resps": [[f"answer {i}"]], "filtered_resps": [f"answer {i}"],
                "exact_match": float(correct), "gen_tokens": tokens, "flops": 1e9 * tokens,
                "ponder_steps": depth}
               for i, (correct, tokens, depth, level) in enumerate(rows)]
    return write_results(root, name, {"model": model, "model_args": model_args, **(config or {})},
                         task, samples, configs, stamp)


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
    assert "Spearman(ponder depth, level) FP-Direct on arith: 1.000" in md
    html = (out / "leaderboard.html").read_text()
    assert "data:image/png;base64" in html and "Rule:" in html


def test_linked_figures_make_a_small_page_of_the_same_report(runs, tmp_path):
    """``--link-figures`` (what docs/leaderboard keeps): the page names the PNGs beside it;
    tables and figures are the report's own."""
    rp.main([str(runs), "--output", str(tmp_path / "inline")])
    assert rp.main([str(runs), "--output", str(tmp_path / "linked"), "--link-figures"]) == 0
    inline, linked = ((tmp_path / d / "leaderboard.html").read_text() for d in ("inline", "linked"))
    assert "base64" not in linked and "src='pareto_arith.png'" in linked
    assert len(linked) < len(inline) / 5
    for name in ("leaderboard.md", "leaderboard.csv"):
        assert (tmp_path / "linked" / name).read_text() == (tmp_path / "inline" / name).read_text()


def test_a_controller_with_one_depth_is_reported_not_dropped():
    """A controller that halts at the same depth everywhere has no depth-difficulty
    correlation: the report says so instead of leaving the run out of the list."""
    run = rp.Run("smollm2", "FP-Direct", "arith",
                 [{"doc": {"level": 1 + i % 5}, "ponder_steps": 0} for i in range(10)])
    (row,) = rp.depth_difficulty([run, rp.Run("smollm2", "Direct", "arith", run.samples)])
    assert tables.spearman_text(*row) == ("Spearman(ponder depth, level) FP-Direct on arith: "
                                      "undefined (the depth is the same on every question) (n=10)")


def test_tie_within_ci_is_not_bolded(tmp_path):
    write_run(tmp_path, "a", {"controller": "none"}, "gsm8k_ponder", [(i < 5, 10, 0, None)
                                                                      for i in range(10)])
    write_run(tmp_path, "b", {"controller": "none"}, "gsm8k_ponder_cot",
              [(i < 6, 10, 0, None) for i in range(10)])
    rows, notes = rp.leaderboard(rp.load_runs([tmp_path]))
    assert not any(r["gsm8k"]["win"] for r in rows)
    assert notes and "tie within the 95% CI" in notes[0]


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


# ------------------------------------------------------------------ run identity (issue 11.7)
FINGERPRINT = {"backbone": "/cache/smollm2", "backbone_sha256": "ab" * 8, "dtype": "torch.float32",
               "generation": "loop", "pondering": {"steering": "cd" * 8, "layer": 15,
                                                   "alpha": None, "controller": "ef" * 8}}
GEN = {"arith_ponder": {"generation_kwargs": {"until": [], "max_gen_toks": 500,
                                              "do_sample": False}}}


def ponder_config(**changes):
    return {"ponder_fingerprint": {**FINGERPRINT, **changes}}


def test_runs_differing_only_in_dtype_are_two_rows(tmp_path):
    rows_a = [(i % 2 == 0, 50, i % 3, 1) for i in range(10)]  # depths differ: adaptive rows
    write_run(tmp_path, "f32", {"controller": "/c"}, "arith_ponder", rows_a,
              config=ponder_config(), configs=GEN)
    write_run(tmp_path, "bf16", {"controller": "/c"}, "arith_ponder",
              [(True, 40, i % 2, 1) for i in range(10)],
              config=ponder_config(dtype="torch.bfloat16"), configs=GEN)
    runs = rp.load_runs([tmp_path])
    assert sorted(r.label for r in runs) == ["FP-Direct [dtype=bfloat16]",
                                             "FP-Direct [dtype=float32]"]
    rows, _ = rp.leaderboard(runs)
    assert len(rows) == 2 and len({r["identity"] for r in rows}) == 2
    assert {r["label"]: r["arith"]["acc"] for r in rows} == {
        "FP-Direct [dtype=bfloat16]": 1.0, "FP-Direct [dtype=float32]": 0.5}
    rp.report([tmp_path], tmp_path / "out")
    md = (tmp_path / "out" / "leaderboard.md").read_text()
    html = (tmp_path / "out" / "leaderboard.html").read_text()
    for row in rows:  # the identity is shown, and explained in a footnote
        assert f"| {row['label']} | {row['identity']} |" in md
        assert f"<code>{row['identity']}</code>" in html
        assert f"- {row['identity']}: model=ponder" in md


def test_hf_runs_differing_in_dtype_and_gen_kwargs_are_split(tmp_path):
    """--model hf has no fingerprint: its model args and dtype are its identity; generation
    kwargs the task used are part of it too (runtime args such as batch_size are not)."""
    rows = [(True, 10, 0, None)] * 5
    write_run(tmp_path, "a", "pretrained=/m,dtype=float32,batch_size=8", "gsm8k_ponder", rows,
              model="hf")
    write_run(tmp_path, "b", "pretrained=/m,dtype=bfloat16", "gsm8k_ponder", rows, model="hf")
    long = {"gsm8k_ponder": {"generation_kwargs": {"max_gen_toks": 1000}}}
    write_run(tmp_path, "c", "pretrained=/m,dtype=bfloat16,batch_size=64", "gsm8k_ponder", rows,
              model="hf", configs=long)
    labels = sorted(r.label for r in rp.load_runs([tmp_path]))
    assert labels == ["Direct [dtype=bfloat16, max_gen_toks=1000]",
                      "Direct [dtype=bfloat16, max_gen_toks=null]",
                      "Direct [dtype=float32, max_gen_toks=null]"]


def test_unreadable_differences_get_a_short_hash(tmp_path):
    rows = [(True, 10, i % 2, None) for i in range(5)]
    write_run(tmp_path, "a", {}, "gsm8k_ponder", rows, config=ponder_config())
    write_run(tmp_path, "b", {}, "gsm8k_ponder", rows, config=ponder_config(pondering={
        **FINGERPRINT["pondering"], "steering": "a-much-longer-steering-vector-identity"}))
    runs = rp.load_runs([tmp_path])
    assert sorted(r.label for r in runs) == sorted(
        f"FP-Direct [model {r.identity.model_digest}]" for r in runs)


def test_pages_name_backbones_not_directories_of_the_machine(tmp_path):
    """A backbone loaded from a local directory (the converted-GGUF cache) was recorded by its
    path; labels show its name, and where the SHA-256 beside it identifies the weights the
    identity (and so its digest) leaves the spelling out (issue 73 item 10: two machines, one
    identity); without a hash it keeps the spelling as recorded."""
    rows = [(True, 10, 1, None)] * 5
    cached = ("/home/someone/.cache/lm_eval_ponder/converted/"
              "SmolLM2-135M-Instruct.Q4_1-b179c9523d0e6a0f")
    write_run(tmp_path, "a", {}, "gsm8k_ponder", rows, config=ponder_config(backbone=cached))
    write_run(tmp_path, "b", {}, "gsm8k_ponder", rows,
              config=ponder_config(backbone="/elsewhere/Other-Model", backbone_sha256=None))
    runs = rp.load_runs([tmp_path])
    # two backbones, two rows (issue 55: the backbone is what the model loaded, by its name)
    assert {r.backbone for r in runs} == {"SmolLM2-135M-Instruct.Q4_1", "Other-Model"}
    assert not any("/" in r.label for r in runs) and len({(r.backbone, r.label)
                                                          for r in runs}) == 2
    rows_, _ = rp.leaderboard(runs)
    lines = tables.identity_lines(rows_)
    assert any("backbone_sha256=abab" in line for line in lines)
    assert any("backbone=Other-Model" in line for line in lines)
    assert not any("/home" in line or "/elsewhere" in line for line in lines)
    assert {r.identity.model.get("backbone") for r in runs} == {None, "/elsewhere/Other-Model"}


def test_label_follows_the_fingerprint_not_the_args(tmp_path):
    """lm-eval 0.4.13 parses the CLI string "controller=none" to None, which ponder reads as
    "not given" (the shipped controller): the fingerprint says what the model really did."""
    rows = [(True, 10, i % 2, None) for i in range(5)]
    write_run(tmp_path, "on", "controller=none", "gsm8k_ponder", rows, config=ponder_config())
    write_run(tmp_path, "off", "controller=/c", "gsm8k_ponder", rows,
              config=ponder_config(pondering=None))
    write_run(tmp_path, "fr", "", "gsm8k_ponder", rows, config=ponder_config(
        pondering={**FINGERPRINT["pondering"], "controller": None, "alpha": -0.1}))
    labels = {r.source.split("/")[-3]: r.label for r in rp.load_runs([tmp_path])}
    assert labels == {"on": "FP-Direct", "off": "Direct", "fr": "FR (alpha=-0.1)"}


def test_early_exit_runs_are_labelled_by_threshold(tmp_path):
    """From the fingerprint (what the model did), from the model args of a run without one,
    and from the suite's ponder_run.json; two thresholds are two rows, one plot family."""
    from lm_eval_ponder.reporting.plots import curve_key, style

    rows = [(True, 10, 0, None)] * 5
    for name, threshold in (("a", 0.9), ("b", 0.99)):
        write_run(tmp_path, name, "controller=none", "gsm8k_ponder", rows,
                  config=ponder_config(pondering=None,
                                       early_exit={"threshold": threshold, "layers": "1:"}))
    write_run(tmp_path, "c", "controller=none,early_exit=0.95,exit_layers=16:30:2",
              "gsm8k_ponder", rows)
    marked = write_run(tmp_path, "d", "controller=none,early_exit=0.5", "gsm8k_ponder", rows)
    (marked.parent / "ponder_run.json").write_text(json.dumps({"method": "EE (p>=0.5)"}))
    labels = {r.source.split("/")[-3]: r.label for r in rp.load_runs([tmp_path])}
    assert labels == {"a": "EE (p>=0.9)", "b": "EE (p>=0.99)",
                      "c": "EE (p>=0.95, layers 16:30:2)", "d": "EE (p>=0.5)"}
    assert {style(label).family for label in labels.values()} == {"EE"}
    assert curve_key(labels["a"]) == curve_key(labels["b"]) != curve_key(labels["c"])


def test_same_configuration_on_two_datasets_is_one_row(tmp_path):
    """One lm-eval run per dataset (as suite does): one identity, one row, no suffix, even
    though the tasks' generation kwargs differ."""
    write_run(tmp_path, "a", {"controller": "/c"}, "arith_ponder",
              [(True, 10, i % 2, 1) for i in range(5)], config=ponder_config(), configs=GEN)
    write_run(tmp_path, "b", {"controller": "/c"}, "gsm8k_ponder",
              [(True, 10, i % 2, None) for i in range(5)],
              config=ponder_config(),
              configs={"gsm8k_ponder": {"generation_kwargs": {"max_gen_toks": 256}}})
    rows, _ = rp.leaderboard(rp.load_runs([tmp_path]))
    assert [(r["label"], "arith" in r, "gsm8k" in r) for r in rows] == [("FP-Direct", True, True)]


def test_columns_follow_table_1(tmp_path):
    """Our ladder first, then the paper's order (GSM8K, MATH500, GPQA), then anything else."""
    assert rp.dataset_order(["gpqa", "mmlu", "math500", "arith", "gsm8k", "gpqa", "bbh"]) == \
        ["arith", "gsm8k", "math500", "gpqa", "bbh", "mmlu"]
    for name, task in (("g", "gpqa_ponder"), ("m", "math500_ponder"), ("s", "gsm8k_ponder")):
        write_run(tmp_path, name, {"controller": "none"}, task, [(True, 10, 0, None)] * 3)
        write_run(tmp_path, name + "fr", {"alpha": "-0.2"}, task, [(True, 9, 0, None)] * 3)
    rp.report([tmp_path], tmp_path / "out")
    header = (tmp_path / "out" / "leaderboard.md").read_text().splitlines()[0]
    assert header.index("gsm8k ACC") < header.index("math500 ACC") < header.index("gpqa ACC")
    notes = [line.split(":")[0] for line in (tmp_path / "out" / "leaderboard.md").read_text()
             .splitlines() if line.startswith("- ") and "best accuracy" in line]
    assert notes == ["- gsm8k", "- math500", "- gpqa"]


def test_duplicate_runs_that_disagree_are_refused_naming_both(tmp_path):
    rows = [(True, 10, 1, 1)] * 5
    first = write_run(tmp_path, "a", {"controller": "/c"}, "arith_ponder", rows,
                      config=ponder_config(), configs=GEN)
    second = write_run(tmp_path, "b", {"controller": "/c"}, "arith_ponder", rows,
                       config=ponder_config(), configs=GEN)
    lines = second.with_name("samples_arith_ponder_2026-01-01T00-00-00.0.jsonl")
    changed = [json.loads(x) for x in lines.read_text().splitlines()]
    changed[3]["resps"] = [["another answer"]]
    lines.write_text("".join(json.dumps(x) + "\n" for x in changed))
    with pytest.raises(PonderError, match="disagree on question 3") as error:
        rp.load_runs([tmp_path])
    assert str(first) in str(error.value) and str(second) in str(error.value)


def test_duplicate_runs_that_agree_are_pooled(tmp_path):
    """The same results twice (a directory passed twice, a deterministic re-run, or --limit
    slices) are one configuration: pooled, not refused, not double-counted."""
    rows = [(i % 2 == 0, 10, 1, 1) for i in range(8)]
    write_run(tmp_path, "a", {"controller": "/c"}, "arith_ponder", rows[:6],
              config=ponder_config(), configs=GEN)
    write_run(tmp_path, "b", {"controller": "/c"}, "arith_ponder", rows,
              config=ponder_config(), configs=GEN, stamp="2026-01-02T00-00-00.0")
    runs = rp.load_runs([tmp_path, tmp_path / "a"])
    assert len(runs) == 1 and len(runs[0].samples) == 8


# ------------------------------------------------------------------ estimated accounting (11.8)
def hf_samples(texts, prompt="Please solve: 2 + 2", max_gen_toks=32):
    return [{"doc_id": i, "doc": {"question": f"q{i}"}, "target": "4",
             "arguments": [[prompt, {"until": [], "max_gen_toks": max_gen_toks}]],
             "resps": [[t] if isinstance(t, str) else t], "filtered_resps": [t],
             "exact_match": 1.0, "gen_tokens": math.nan, "flops": math.nan,
             "ponder_steps": math.nan} for i, t in enumerate(texts)]


def test_hf_run_gets_estimated_tokens_and_flops(tmp_path, tiny_model_dir):
    """--model hf logs NaN accounting; the report re-counts with the run's tokenizer like ponder
    counts (to and including EOS, capped at max_gen_toks), prices FLOPs from its config, marks
    both as estimated. Best-of-N pays for every response."""
    from transformers import AutoConfig, AutoTokenizer

    from lm_eval_ponder.flops import FlopsSpec, generation_flops
    from lm_eval_ponder.generation.accounting import count_text_tokens

    texts = ["The answer is 4", "x" * 50, ["2+2=4", "four", "4"]]
    write_results(tmp_path, "hf", {"model": "hf", "model_args": f"pretrained={tiny_model_dir}"},
                  "arith_ponder", hf_samples(texts))
    runs = rp.load_runs([tmp_path])
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    spec = FlopsSpec.from_config(AutoConfig.from_pretrained(tiny_model_dir))
    prompt = len(tok("Please solve: 2 + 2").input_ids)
    for sample, text in zip(runs[0].samples, texts):
        counts = [count_text_tokens(tok, t, 32) for t in (text if isinstance(text, list)
                                                          else [text])]
        assert sample["estimated"] and sample["gen_tokens"] == sum(counts)
        assert sample["flops"] == sum(generation_flops(spec, prompt, n) for n in counts)
        assert sample["ponder_steps"] == 0.0
    assert [s["gen_tokens"] for s in runs[0].samples] == [16, 32, 6 + 5 + 2]
    rows, notes = rp.leaderboard(runs)
    assert rows[0]["arith"]["estimated"] and any(n.startswith("* estimated") for n in notes)
    md = tables.write_tables(rows, ["arith"], notes, tmp_path)
    assert f"| {rows[0]['arith']['tokens']:.1f}* |" in md


def test_estimate_that_cannot_load_stays_nan_with_a_note(tmp_path):
    write_results(tmp_path, "hf", {"model": "vllm", "model_args": "pretrained=/no/such/model"},
                  "arith_ponder", hf_samples(["4"]))
    runs = rp.load_runs([tmp_path])
    assert math.isnan(runs[0].samples[0]["gen_tokens"])
    _, notes = rp.leaderboard(runs)
    assert any("not estimated" in n and "/no/such/model" in n for n in notes)


def lm_eval_run(out, model: str, model_args: str | dict, task: str = "arith_ponder",
                limit: int = 2):
    """One lm-eval run written to ``out`` as the CLI writes it (EvaluationTracker)."""
    from lm_eval import simple_evaluate
    from lm_eval.loggers import EvaluationTracker
    from lm_eval.tasks import TaskManager

    from lm_eval_ponder.resources import tasks_dir

    result = simple_evaluate(
        model=model, model_args=model_args, tasks=[task], limit=limit,
        gen_kwargs="max_gen_toks=32", apply_chat_template=True, log_samples=True, batch_size=4,
        device="cpu", task_manager=TaskManager(include_path=tasks_dir()))
    tracker = EvaluationTracker(output_path=str(out))
    tracker.general_config_tracker.log_experiment_args(
        model_source=model, model_args=model_args, system_instruction=None, chat_template=None,
        fewshot_as_multiturn=False)
    samples = result.pop("samples")
    tracker.save_results_aggregated(results=result, samples=samples)
    tracker.save_results_samples(task_name=task, samples=samples[task])


@needs_embedded
@pytest.mark.slow
def test_hf_run_counts_compare_with_ponder(tmp_path, embedded_dir):
    """--model hf and --model ponder (no pondering) on the embedded backbone generate the same
    text; the report's estimate for the hf run matches ponder's own count and FLOPs, and the
    two configurations stay apart (ponder's fingerprint is in its results JSON)."""
    lm_eval_run(tmp_path / "hf", "hf", f"pretrained={embedded_dir},dtype=float32")
    # a dict: lm-eval 0.4.13 parses the string "controller=none" to controller=None
    lm_eval_run(tmp_path / "ponder", "ponder", {"controller": "none", "dtype": "float32"})
    runs = {r.identity.model["model"]: r for r in rp.load_runs([tmp_path])}
    hf, ponder = runs["hf"], runs["ponder"]
    assert ponder.identity.model["pondering"] is None and ponder.identity.model["dtype"] == \
        "torch.float32"
    assert hf.method == ponder.method == "Direct"
    assert hf.identity.model_digest != ponder.identity.model_digest
    for a, b in zip(hf.samples, ponder.samples):
        assert a["resps"] == b["resps"]
        assert a["estimated"] and not b.get("estimated")
        assert abs(a["gen_tokens"] - b["gen_tokens"]) <= 1, (a["resps"], b["gen_tokens"])
        assert a["flops"] == pytest.approx(b["flops"], rel=0.02)
    rows, _ = rp.leaderboard(list(runs.values()))
    assert len(rows) == 2


@pytest.mark.parametrize("dataset, quoted", [("gsm8k", True), ("gpqa", False)])
def test_gpqa_is_never_quoted_in_the_cases(tmp_path, dataset, quoted):
    """Full logs at hand, FP right where both baselines are wrong: a GSM8K case is quoted, a
    GPQA one never (its authors ask that its questions stay off the web)."""
    rows = [(True, 10, 0, 1), (False, 10, 0, 1)]
    wrong = [(False, 10, 0, 1), (False, 10, 0, 1)]
    write_run(tmp_path, "direct", {"controller": "none"}, f"{dataset}_ponder", wrong)
    write_run(tmp_path, "cot", {"controller": "none"}, f"{dataset}_ponder_cot", wrong)
    write_run(tmp_path, "fp", {"controller": "/x"}, f"{dataset}_ponder", rows)
    rp.report([tmp_path], tmp_path / "out")
    html = (tmp_path / "out" / "leaderboard.html").read_text()
    assert ("<pre>q0</pre>" in html) is quoted
    assert "Never quoted: gpqa" in html


def test_old_random_folders_and_new_backbone_folders_read_alike(tmp_path):
    """lm-eval named a default ponder run's folder at random (``qdpv68r5``, as committed under
    results/); runs now land in one named after the backbone. The report reads both."""
    rows = [(True, 10, 0, 1)] * 4
    old = write_run(tmp_path / "old", "direct", {"controller": "none"}, "arith_ponder", rows)
    new = write_run(tmp_path / "new", "cot", {"controller": "none"}, "arith_ponder_cot", rows)
    old.parent.rename(old.parent.with_name("qdpv68r5"))
    new.parent.rename(new.parent.with_name("SmolLM2-135M-Instruct"))
    runs = rp.load_runs([tmp_path])
    assert sorted(r.method for r in runs) == ["CoT", "Direct"]
    assert sorted(Path(r.source).parent.name for r in runs) == ["SmolLM2-135M-Instruct",
                                                                "qdpv68r5"]


def test_steered_runs_are_compared_with_their_own_base_paired(tmp_path):
    """FP-CoT against CoT (not Direct), at the same decoding, per question."""
    for name, method, rows in (
            ("cot", "CoT [t0.7]", [(i % 2 == 0, 100, 0, 1) for i in range(80)]),
            ("fpcot", "FP-CoT [t0.7]", [(i % 4 == 0, 70, i % 3, 1) for i in range(80)]),
            ("direct", "Direct [t0.7]", [(i % 2 == 0, 100, 0, 1) for i in range(80)]),
            ("fpd", "FP-Direct [t0.7]", [(i % 2 == 0, 60, i % 3, 1) for i in range(80)]),
            ("fpg", "FP-Direct", [(True, 60, 1, 1) for i in range(80)])):
        (tmp_path / name).mkdir()
        (tmp_path / name / "ponder_run.json").write_text(json.dumps({"method": method}))
        write_run(tmp_path / name, "run", {"controller": "x"}, "arith_ponder", rows)
    lines = rp.steering_verdicts(rp.common_questions(rp.load_runs([tmp_path])))
    assert len(lines) == 2  # the greedy FP-Direct has no greedy Direct to pair with
    cot = next(x for x in lines if x.startswith("arith: FP-CoT [t0.7] against CoT [t0.7]"))
    assert "accuracy -0.250" in cot and "(loses beyond the interval;" in cot
    # 20 discordant questions, all against FP-CoT: sign test p = 2 * 0.5**20; two comparisons
    assert "sign test p = 1.91e-06, Holm-adjusted over the 2 paired comparisons" in cot
    assert "of this report p = 3.81e-06)" in cot
    assert "30% fewer tokens" in cot
    direct = next(x for x in lines if "FP-Direct [t0.7] against Direct [t0.7]" in x)
    assert "+0.000 [+0.000, +0.000] (no difference beyond the interval; sign test p = 1," in direct
    assert "40% fewer tokens" in direct


def test_two_steered_forms_beside_one_base_are_each_paired_with_it(tmp_path):
    """Issue 52 item 2: two forms' FP-Direct (alpha_start -0.2 and 0.0) beside one Direct.
    Their labels carry a suffix the base lacks, yet each is paired with it (same model and
    generation, only the pondering differs); a steered run that spends more says "more"."""
    direct = [(i % 2 == 0, 100, 0, 1) for i in range(40)]
    write_run(tmp_path, "direct", {"controller": "none"}, "arith_ponder", direct,
              config=ponder_config(pondering=None), configs=GEN)
    for name, start, tokens in (("ours", -0.2, 60), ("paper", 0.0, 104), ("same", 0.1, 100)):
        write_run(tmp_path, name, {"controller": f"/{name}"}, "arith_ponder",
                  [(i % 2 == 0, tokens, 0, 1) for i in range(40)], configs=GEN,
                  config=ponder_config(pondering={**FINGERPRINT["pondering"],
                                                  "controller": name, "alpha_start": start}))
    lines = rp.steering_verdicts(rp.common_questions(rp.load_runs([tmp_path])))
    assert len(lines) == 3, lines
    assert "as many tokens" in next(x for x in lines if "alpha_start=0.1" in x)
    ours = next(x for x in lines if "alpha_start=-0.2" in x)
    paper = next(x for x in lines if "alpha_start=0.0" in x)
    assert " against Direct, paired on 40 questions" in ours and "40% fewer tokens" in ours
    assert " against Direct, paired on 40 questions" in paper and "4% more tokens" in paper


def test_a_controller_at_one_depth_everywhere_is_labelled_so(tmp_path):
    """Issue 52: a controller that halts at one depth on every question is a fixed offset; its
    row says so, read from the per-question depths (not from the method's name)."""
    cases = {
        "everywhere0": ([0] * 6, {}),                      # the shipped controller's case
        "varies": ([0, 1, 0, 2, 0, 1], {}),                # adaptive: no label
        "token_mean": ([0.5] * 6, {"granularity": "token"}),  # a mean over tokens: not pinned
        "token_kmax": ([8] * 6, {"granularity": "token"}),    # k_max at every token: pinned
        "token_mid": ([3] * 6, {"granularity": "token"}),     # 3 may be a mean of 0s and 6s
    }
    for name, (depths, extra) in cases.items():
        write_run(tmp_path, name, {"controller": "/c"}, "arith_ponder",
                  [(True, 10, d, 1) for d in depths], config=ponder_config(
                      pondering={**FINGERPRINT["pondering"], "controller": name, "k_max": 8,
                                 **extra}))
    write_run(tmp_path, "fr", "", "arith_ponder", [(True, 10, 0, 1)] * 6, config=ponder_config(
        pondering={**FINGERPRINT["pondering"], "controller": None, "alpha": -0.2}))
    runs = rp.load_runs([tmp_path])
    depth = {r.source.split("/")[-3]: r.depth for r in runs}
    assert depth == {"everywhere0": 0, "varies": None, "token_mean": None, "token_kmax": 8,
                     "token_mid": None, "fr": None}
    labels = {r.source.split("/")[-3]: r.label for r in runs}
    assert labels["everywhere0"].startswith("FP-Direct (depth 0 on every question)")
    assert labels["token_kmax"].startswith("FP-Direct (depth 8 on every question)")
    assert "on every question" not in labels["varies"] + labels["fr"]
    # table, CSV, plots and the plot family all carry it
    rp.report([tmp_path], tmp_path / "out")
    md = (tmp_path / "out" / "leaderboard.md").read_text()
    csv_text = (tmp_path / "out" / "leaderboard.csv").read_text()
    assert "| FP-Direct (depth 0 on every question) [" in md
    assert "FP-Direct (depth 0 on every question) [" in csv_text
    from lm_eval_ponder.reporting.plots import style

    assert style("FP-Direct (depth 0 on every question) [t0.7]").family == "FP-Direct"
    # after the variant's brackets are added, the note stays before them
    run = next(r for r in runs if r.depth == 0)
    assert rp.Run(run.backbone, "FP-CoT [t0.7]", "arith", depth=2, variant="x").label == \
        "FP-CoT (depth 2 on every question) [t0.7] [x]"


def test_interval_captions_name_their_interval(tmp_path):
    from lm_eval_ponder.reporting.plots import interval_kind

    assert interval_kind([{"seeds": 1}]) == "Wilson 95% intervals"
    assert "bootstrap" in interval_kind([{"seeds": 3}]) and "Wilson" not in \
        interval_kind([{"seeds": 3}])
    assert "Wilson for rows of one seed" in interval_kind([{"seeds": 1}, {"seeds": 3}])
    for seed in (0, 1):
        write_run(tmp_path, f"s{seed}", {"controller": "none"}, "arith_ponder",
                  [(i % 2 == seed, 10, 0, 1 + i % 5) for i in range(10)],
                  config={"random_seed": seed})
    rp.report([tmp_path], tmp_path / "out")
    md = (tmp_path / "out" / "leaderboard.md").read_text()
    assert "Wilson" not in md and "bootstrap intervals over questions" in md


def test_a_run_cut_to_the_common_questions_is_said_on_the_page(tmp_path):
    """Issue 73: a 50-question run became n = 3 beside a 3-question run without a word."""
    write_run(tmp_path, "a", {"controller": "none"}, "gsm8k_ponder",
              [(i % 2 == 0, 10, 0, None) for i in range(50)])
    write_run(tmp_path, "b", {"controller": "none"}, "gsm8k_ponder_cot",
              [(True, 10, 0, None) for _ in range(3)])
    rows, notes = rp.leaderboard(rp.load_runs([tmp_path]))
    assert rows[0]["gsm8k"]["n"] == 3
    cut = [n for n in notes if "cut to them" in n]
    assert len(cut) == 1 and "the 3 questions" in cut[0] and "Direct (had 50)" in cut[0]
    write_run(tmp_path / "same", "a", {"controller": "none"}, "gsm8k_ponder",
              [(True, 10, 0, None) for _ in range(3)])
    write_run(tmp_path / "same", "b", {"controller": "none"}, "gsm8k_ponder_cot",
              [(True, 10, 0, None) for _ in range(3)])
    assert not any("cut to them" in n for n in rp.leaderboard(rp.load_runs([tmp_path / "same"]))[1])


@pytest.mark.parametrize("difference", ["backbone", "max_gen_toks"])
def test_steering_is_never_paired_across_backbones_or_generation_settings(tmp_path, difference):
    """Issue 73: FR on one backbone (or at one max_gen_toks) was paired with Direct of another
    ("3025% more tokens"); same backbone and settings still pair."""
    rows = [(i % 2 == 0, 10, 0, None) for i in range(20)]
    direct_args = {"controller": "none"}
    fr_args = {"alpha": "-0.2"}
    # lm-eval records --gen_kwargs in the task's generation_kwargs
    direct_config = {"gsm8k_ponder": {"generation_kwargs": {"max_gen_toks": 256}}}
    fr_config = direct_config
    if difference == "backbone":
        direct_args["pretrained"], fr_args["pretrained"] = "org/model-a", "org/model-b"
    else:
        fr_config = {"gsm8k_ponder": {"generation_kwargs": {"max_gen_toks": 8}}}
    write_run(tmp_path, "direct", direct_args, "gsm8k_ponder", rows, configs=direct_config)
    write_run(tmp_path, "fr", fr_args, "gsm8k_ponder", rows, configs=fr_config)
    common = rp.common_questions(rp.load_runs([tmp_path]))
    assert rp.steering_verdicts(common) == []
    write_run(tmp_path / "same", "direct", {"controller": "none"}, "gsm8k_ponder", rows,
              configs=direct_config)
    write_run(tmp_path / "same", "fr", {"alpha": "-0.2"}, "gsm8k_ponder", rows,
              configs=direct_config)
    assert len(rp.steering_verdicts(rp.common_questions(rp.load_runs([tmp_path / "same"])))) == 1


def test_a_relative_folder_is_one_backbone_however_it_is_spelt(tmp_path, monkeypatch):
    """Issue 73: ``own/tiny-qwen2`` was read as a Hub id beside ``tiny-qwen2``: two labels for
    one folder. A relative path that is a folder here is named by its folder."""
    (tmp_path / "own" / "tiny-qwen2").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert rp.weights_name("own/tiny-qwen2") == rp.weights_name(
        str(tmp_path / "own" / "tiny-qwen2")) == "tiny-qwen2"
    assert rp.weights_name("Qwen/Qwen2.5-0.5B-Instruct") == "Qwen/Qwen2.5-0.5B-Instruct"


def test_a_packed_study_is_named_with_the_command_that_unpacks_it(tmp_path):
    """The records' archive is the repository's upkeep (scripts/records.py, issue 74): the
    report reads folders only, and a study committed as an archive is named with the line
    that unpacks it."""
    (tmp_path / "study.tar.xz").write_bytes(b"")
    with pytest.raises(PonderError, match=r"study.tar.xz: unpack it first, python "
                                          r"scripts/records.py unpack"):
        rp.load_runs([tmp_path / "study"])
    with pytest.raises(PonderError, match=r"no such results directory: \S+elsewhere$"):
        rp.load_runs([tmp_path / "elsewhere"])


def test_a_greedy_half_precision_row_carries_the_batch_note(tmp_path):
    """Issue 73 item 9: the page says how large the batch effect is wherever a row's greedy
    answers depend on the batch (bf16, not batch_invariant), and nowhere else."""
    rows = [(True, 10, 0, None)] * 4
    for name, dtype, batching in (("bf16", "torch.bfloat16", {"max_rows": 128}),
                                  ("invariant", "torch.bfloat16", {"batch_invariant": True}),
                                  ("f32", "torch.float32", {"max_rows": 128})):
        write_run(tmp_path / name, name, {}, "arith_ponder", rows,
                  config={**ponder_config(dtype=dtype), "ponder_batching": batching}, configs=GEN)
    for names, expected in ((["bf16", "f32"], True), (["invariant", "f32"], False)):
        runs = rp.load_runs([tmp_path / n for n in names])
        assert [r.batch_dependent for r in runs] == [expected, False]
        assert (rp.BATCH_NOTE in rp.leaderboard(runs)[1]) is expected
