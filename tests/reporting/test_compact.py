"""Compact sample logs: nothing of a benchmark question or answer survives, our own data keeps
what the reports quote, and the report reads them to the same metrics as the full logs."""

from __future__ import annotations

import json
import lzma

import pytest
from test_report import write_run

from lm_eval_ponder.errors import PonderError
from lm_eval_ponder.files import read_jsonl
from lm_eval_ponder.reporting import compact
from lm_eval_ponder.reporting import report as rp

SECRET = "Which gas do plants take in during photosynthesis"


def gpqa_like_sample(doc_id=0):
    return {"doc_id": doc_id,
            "doc": {"Question": SECRET, "choice1": "Carbon dioxide", "level": None,
                    "subdomain": "Botany", "high-level domain": "Biology",
                    "id": "rec123", "Explanation": SECRET + " ... because"},
            "target": "A", "arguments": {"gen_args_0": {"arg_0": "Q: " + SECRET}},
            "resps": [["The answer is (A) Carbon dioxide"]],
            "filtered_resps": ["The answer is (A) Carbon dioxide"],
            "filter": "none", "metrics": ["exact_match"], "doc_hash": "d" * 64,
            "prompt_hash": "p" * 64, "target_hash": "t" * 64,
            "exact_match": 1.0, "gen_tokens": 12.0, "flops": 3.5e9, "ponder_steps": 2.0}


def drop_full_logs(root):
    for log in root.rglob("samples_*"):
        if compact.form_of(log) == compact.FULL:
            log.unlink()


def test_no_text_survives_and_the_numbers_do(tmp_path):
    path = tmp_path / "samples_gpqa_ponder_2026.jsonl"
    path.write_text(json.dumps(gpqa_like_sample()) + "\n")
    out = compact.compact_file(path)
    assert out.name == "samples_gpqa_ponder_2026.compact.jsonl.xz"
    assert sorted(p.name for p in tmp_path.iterdir()) == [out.name, path.name]  # no answers
    raw = lzma.decompress(out.read_bytes()).decode()
    for text in (SECRET, "Carbon dioxide", "Q: ", "d" * 64):
        assert text not in raw
    s = json.loads(raw)
    assert s["doc"] == {"id": "rec123", "subdomain": "Botany", "high-level domain": "Biology"}
    assert (s["exact_match"], s["gen_tokens"], s["flops"], s["ponder_steps"]) == \
        (1.0, 12.0, 3.5e9, 2.0)
    assert "target" not in s and "resps" not in s and "doc_hash" not in s
    assert s["resps_sha256"] == compact.answers_digest(gpqa_like_sample())
    assert len(s["resps_sha256"]) == compact.DIGEST_HEX


def test_long_label_like_fields_are_dropped_too():
    sample = gpqa_like_sample()
    sample["doc"]["subject"] = "x" * 200  # a field named like a label but holding prose
    assert "subject" not in compact.compact_sample(sample, keep_text=False)[0]["doc"]


def test_our_data_keeps_question_prompt_and_answers_in_two_files(tmp_path):
    """arith keeps what the case studies and testset.py read; its answers go to their own
    file, so the repository can keep the compact log without them."""
    samples = [{**gpqa_like_sample(i), "doc": {"question": f"What is {i} + 1?", "level": 1},
                "target": str(i + 1), "resps": [[f"{i} + 1 = {i + 1}"]],
                "filtered_resps": [f"{i} + 1 = {i + 1}"]} for i in range(3)]
    samples[2]["filtered_resps"] = ["a filter's own choice"]
    path = tmp_path / "samples_arith_ponder_cot_2026.jsonl"
    path.write_text("".join(json.dumps(s) + "\n" for s in samples))
    out = compact.compact_file(path)
    answers = compact.answers_path(path)
    assert answers.name == "samples_arith_ponder_cot_2026.answers.jsonl.xz"
    kept = read_jsonl(out)
    assert kept[0]["doc"]["question"] == "What is 0 + 1?" and kept[0]["target"] == "1"
    assert kept[0]["arguments"] == samples[0]["arguments"] and "resps" not in kept[0]
    assert [a.get("filtered_resps") for a in read_jsonl(answers)] == \
        [None, None, ["a filter's own choice"]]  # stored only where it is not resps' own
    path.unlink()
    back = compact.read_samples(out)
    for s, b in zip(samples, back):
        assert (b["resps"], b["filtered_resps"]) == (s["resps"], s["filtered_resps"])
        assert compact.answers_digest(b) == compact.answers_digest(s)
    answers.unlink()  # the repository may keep the compact log alone
    assert all("resps" not in b for b in compact.read_samples(out))


def test_drop_text_keeps_labels_metrics_and_digests(tmp_path):
    """The organism's runs: a compact arith log rewritten without document, target and prompt
    reads back to the same metrics, levels and answer digests; a second pass changes nothing."""
    samples = [{**gpqa_like_sample(i), "doc": {"question": f"What is {i} + 1?", "level": 2},
                "target": str(i + 1), "resps": [[f"{i + 1}"]],
                "filtered_resps": [f"{i + 1}"]} for i in range(3)]
    path = tmp_path / "samples_arith_ponder_2026.jsonl"
    path.write_text("".join(json.dumps(s) + "\n" for s in samples))
    out = compact.compact_file(path)
    before = read_jsonl(out)
    assert compact.drop_text_tree(tmp_path) == 1 and compact.drop_text_tree(tmp_path) == 0
    after = read_jsonl(out)
    for b, a in zip(before, after):
        assert "question" not in a["doc"] and "target" not in a and "arguments" not in a
        assert a["doc"]["level"] == 2 and a["resps_sha256"] == b["resps_sha256"]
        assert {k: v for k, v in a.items() if k != "doc"} == \
            {k: v for k, v in b.items() if k not in ("doc", "target", "arguments")}


def test_best_of_n_answers_come_back_whole(tmp_path):
    resps = [["10", "7 + 1 = 8", "ten"]]
    sample = {**gpqa_like_sample(), "resps": resps, "filtered_resps": resps, "filter": "bon"}
    path = tmp_path / "samples_arith_ponder_bon_2026.jsonl"
    path.write_text(json.dumps(sample) + "\n")
    out = compact.compact_file(path)
    assert "filtered_resps" not in read_jsonl(compact.answers_path(path))[0]
    assert compact.read_samples(out)[0]["filtered_resps"] == resps


def test_an_older_text_free_twin_is_read_and_converted(tmp_path):
    twin = tmp_path / "samples_gsm8k_ponder_2026.stripped.jsonl"
    full = {**gpqa_like_sample(), "resps_sha256": "ab" * 32}
    twin.write_text(json.dumps(full) + "\n")
    assert compact.read_samples(twin)[0]["exact_match"] == 1.0
    [out] = compact.compact_tree(tmp_path)
    assert out == compact.compact_path(twin)
    assert read_jsonl(out)[0]["resps_sha256"] == "ab" * 8  # the digest's first 16 digits
    assert compact.compact_tree(tmp_path) == []  # up to date


def test_a_cut_off_log_is_refused_and_leaves_nothing(tmp_path):
    path = tmp_path / "samples_gsm8k_ponder_2026.jsonl"
    path.write_text(json.dumps(gpqa_like_sample()) + "\n{\"doc_id\": 1, \"do")
    with pytest.raises(PonderError, match="line 2"):
        compact.compact_file(path)
    assert list(tmp_path.iterdir()) == [path]  # no temporary file left behind either


def test_a_truncated_compact_log_is_a_clear_error(tmp_path):
    path = tmp_path / "samples_gsm8k_ponder_2026.jsonl"
    path.write_text(json.dumps(gpqa_like_sample()) + "\n")
    out = compact.compact_file(path)
    out.write_bytes(out.read_bytes()[:20])
    with pytest.raises(PonderError, match="cannot be read"):
        compact.read_samples(out)


def test_two_writers_of_one_log_do_not_trip_over_each_other(tmp_path, monkeypatch):
    """Two suites started side by side compact the same finished runs; each writes under a
    temporary name of its own."""
    path = tmp_path / "samples_gsm8k_ponder_2026.jsonl"
    path.write_text("".join(json.dumps(gpqa_like_sample(i)) + "\n" for i in range(3)))
    real = compact.write_jsonl_xz
    nested = []

    def write_with_a_rival(target, records):  # the rival writes the same log mid-way
        if not nested:
            nested.append(True)
            compact.compact_file(path)
        real(target, records)

    monkeypatch.setattr(compact, "write_jsonl_xz", write_with_a_rival)
    out = compact.compact_file(path)
    monkeypatch.undo()
    assert [s["doc_id"] for s in read_jsonl(out)] == [0, 1, 2]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([path.name, out.name])


def test_compact_tree_is_idempotent(tmp_path):
    write_run(tmp_path, "fr", {"alpha": "-0.2"}, "gsm8k_ponder", [(True, 10, 0, 1)] * 3)
    assert len(compact.compact_tree(tmp_path)) == 1
    assert compact.compact_tree(tmp_path) == []  # up to date: nothing rewritten


def test_the_newest_run_and_its_best_form_are_read(tmp_path):
    for name in ("samples_arith_ponder_2026-01.compact.jsonl.xz",
                 "samples_arith_ponder_2026-02.stripped.jsonl",
                 "samples_arith_ponder_2026-02.jsonl",
                 "samples_arith_ponder_cot_2026-03.jsonl"):  # another task
        (tmp_path / name).write_text("")
    assert compact.latest_log(tmp_path, "arith_ponder").name == \
        "samples_arith_ponder_2026-02.jsonl"
    assert compact.latest_log(tmp_path, "gsm8k_ponder") is None


@pytest.mark.parametrize("task", ["gsm8k_ponder", "arith_ponder"])
def test_report_reads_a_compact_run_to_the_same_metrics(tmp_path, task):
    rows = [(i % 3 == 0, 40 + i, i % 4, 1 + i % 5) for i in range(30)]
    full, only = tmp_path / "full", tmp_path / "compact"
    for root in (full, only):
        write_run(root, "fp", {"controller": "/c"}, task, rows)
        write_run(root, "direct", {"controller": "none"}, task, rows[::-1])
        write_run(root, "cot", {"controller": "none"}, task.replace("_ponder", "_ponder_cot"),
                  rows[1:] + rows[:1])
    compact.compact_tree(only)
    drop_full_logs(only)
    a, b = rp.load_runs([full]), rp.load_runs([only])
    assert [r.label for r in a] == [r.label for r in b]
    rows_a, _ = rp.leaderboard(a)
    rows_b, _ = rp.leaderboard(b)
    assert rows_a == rows_b
    assert rp.depth_difficulty(a) == rp.depth_difficulty(b)
    full_cases, kept_cases = ([(c["question"], c["target"], [
        (name, s["filtered_resps"], s["exact_match"], s["gen_tokens"]) for name, s in c["answers"]])
        for c in rp.case_studies(rp.common_questions(x))] for x in (a, b))
    # our data quotes its cases from the compact log and its answers; a benchmark none
    assert kept_cases == (full_cases if task.startswith("arith") else []) and full_cases
    rp.report([only], tmp_path / "out")  # the whole page


def test_compact_duplicates_that_disagree_are_still_refused(tmp_path):
    rows = [(True, 10, 1, 1)] * 4
    write_run(tmp_path, "a", {"controller": "/c"}, "gsm8k_ponder", rows)
    second = write_run(tmp_path, "b", {"controller": "/c"}, "gsm8k_ponder", rows)
    log = second.with_name("samples_gsm8k_ponder_2026-01-01T00-00-00.0.jsonl")
    changed = [json.loads(x) for x in log.read_text().splitlines()]
    changed[2]["resps"] = [["another answer"]]
    log.write_text("".join(json.dumps(x) + "\n" for x in changed))
    compact.compact_tree(tmp_path)
    drop_full_logs(tmp_path)
    with pytest.raises(PonderError, match="disagree on question 2"):
        rp.load_runs([tmp_path])


ENV = """PyTorch version: 2.13.0+cpu
Is debug build: False

OS: Debian GNU/Linux 12 (bookworm) (x86_64)
Python version: 3.11.7 (main) [GCC 12.2.0] (64-bit runtime)
Is CUDA available: False

CPU:
Architecture:                            x86_64
CPU(s):                                  2
Vendor ID:                               GenuineIntel
Model name:                              Intel(R) Xeon(R) Processor
L2 cache:                                4 MiB (2 instances)
Flags:                                   fpu sse2 avx2 avx512f avx512_bf16 amx_bf16 amx_tile
Vulnerability Mds:                       Not affected
"""


def test_a_results_json_keeps_the_machine_and_every_figure_in_less_room(tmp_path):
    """lm-eval's results JSON as the tree keeps it (issue 52: the tracked tree passed its alarm):
    the metrics, config and task configs unchanged; torch's environment report cut to the lines
    that name the machine, the CPU flags to the units that decide its bf16 speed; a second pass
    changes nothing."""
    data = {"results": {"arith_ponder": {"exact_match,none": 0.15, "flops,none": 3.3e10}},
            "config": {"model_args": {"controller": "none"}}, "configs": {"arith_ponder": {
                "generation_kwargs": {"until": ["\n\n"]}}}, "pretty_env_info": ENV}
    path = tmp_path / "results_2026-11-29T00-00-00.json"
    path.write_text(json.dumps(data, indent=2))
    before = path.stat().st_size
    assert compact.compact_results(path)
    got = json.loads(path.read_text())
    assert {k: v for k, v in got.items() if k != "pretty_env_info"} == \
        {k: v for k, v in data.items() if k != "pretty_env_info"}
    env = got["pretty_env_info"].splitlines()
    assert env[1:] == ["PyTorch version: 2.13.0+cpu", "OS: Debian GNU/Linux 12 (bookworm) (x86_64)",
                       "Python version: 3.11.7 (main) [GCC 12.2.0] (64-bit runtime)",
                       "Is CUDA available: False", "CPU(s): 2", "Vendor ID: GenuineIntel",
                       "Model name: Intel(R) Xeon(R) Processor",
                       "Flags (vector units only): avx2 avx512f avx512_bf16 amx_bf16"]
    assert path.stat().st_size < before
    assert not compact.compact_results(path)
    (tmp_path / "results_cut.json").write_text('{"results": ')
    assert not compact.compact_results(tmp_path / "results_cut.json")  # left for its reader


def test_compact_tree_compacts_a_runs_results_json(tmp_path):
    run = tmp_path / "greedy" / "Direct" / "arith" / "model"
    run.mkdir(parents=True)
    (run / "results_x.json").write_text(json.dumps({"results": {}, "pretty_env_info": ENV},
                                                   indent=2))
    compact.compact_tree(tmp_path)
    assert json.loads((run / "results_x.json").read_text())["pretty_env_info"].startswith(
        compact.ENV_MARK)
