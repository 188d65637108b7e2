"""Text-free sample logs: nothing of the question or answer survives, and the report reads
them to the same figures as the full logs."""

from __future__ import annotations

import json

import pytest
from test_report import write_run

from lm_eval_ponder.errors import PonderError
from lm_eval_ponder.reporting import report as rp
from lm_eval_ponder.reporting import strip

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


def test_no_text_survives_and_the_numbers_do(tmp_path):
    path = tmp_path / "samples_gpqa_ponder_2026.jsonl"
    path.write_text(json.dumps(gpqa_like_sample()) + "\n")
    out = strip.strip_file(path)
    assert out.name == "samples_gpqa_ponder_2026.stripped.jsonl"
    raw = out.read_text()
    for text in (SECRET, "Carbon dioxide", "Q: "):
        assert text not in raw
    s = json.loads(raw)
    assert s["doc"] == {"id": "rec123", "subdomain": "Botany", "high-level domain": "Biology"}
    assert (s["exact_match"], s["gen_tokens"], s["flops"], s["ponder_steps"]) == \
        (1.0, 12.0, 3.5e9, 2.0)
    assert s["doc_hash"] == "d" * 64 and "target" not in s and "resps" not in s
    assert s["resps_sha256"] == strip.answers_digest(gpqa_like_sample())


def test_long_label_like_fields_are_dropped_too(tmp_path):
    sample = gpqa_like_sample()
    sample["doc"]["subject"] = "x" * 200  # a field named like a label but holding prose
    assert "subject" not in strip.strip_sample(sample)["doc"]


def test_a_cut_off_log_is_refused_and_leaves_no_twin(tmp_path):
    path = tmp_path / "samples_gsm8k_ponder_2026.jsonl"
    path.write_text(json.dumps(gpqa_like_sample()) + "\n{\"doc_id\": 1, \"do")
    with pytest.raises(PonderError, match="line 2"):
        strip.strip_file(path)
    assert not strip.stripped_path(path).exists()
    assert list(tmp_path.iterdir()) == [path]  # no temporary file left behind either


def test_two_writers_of_one_twin_do_not_trip_over_each_other(tmp_path, monkeypatch):
    """Two suites started side by side strip the same finished runs; the second one's write
    used to move the first one's temporary file away under it (FileNotFoundError)."""
    path = tmp_path / "samples_gsm8k_ponder_2026.jsonl"
    path.write_text("".join(json.dumps(gpqa_like_sample(i)) + "\n" for i in range(3)))
    real_dumps = json.dumps
    nested = []

    def dumps_with_a_rival(obj, *a, **k):  # the rival writes the same twin mid-way through ours
        if not nested and "resps_sha256" in obj:
            nested.append(True)
            strip.strip_file(path)
        return real_dumps(obj, *a, **k)

    monkeypatch.setattr(strip.json, "dumps", dumps_with_a_rival)
    out = strip.strip_file(path)
    monkeypatch.undo()
    assert [json.loads(line)["doc_id"] for line in out.read_text().splitlines()] == [0, 1, 2]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([path.name, out.name])


def test_strip_tree_is_idempotent(tmp_path):
    write_run(tmp_path, "fr", {"alpha": "-0.2"}, "gsm8k_ponder", [(True, 10, 0, 1)] * 3)
    assert len(strip.strip_tree(tmp_path)) == 1
    assert strip.strip_tree(tmp_path) == []  # up to date: nothing rewritten


def test_report_reads_a_stripped_run_to_the_same_figures(tmp_path):
    rows = [(i % 3 == 0, 40 + i, i % 4, 1 + i % 5) for i in range(30)]
    full, only = tmp_path / "full", tmp_path / "stripped"
    for root in (full, only):
        write_run(root, "fp", {"controller": "/c"}, "gsm8k_ponder", rows)
        write_run(root, "direct", {"controller": "none"}, "gsm8k_ponder", rows[::-1])
    strip.strip_tree(only)
    for log in only.rglob("samples_*.jsonl"):
        if not log.name.endswith(strip.SUFFIX):
            log.unlink()
    a, b = rp.load_runs([full]), rp.load_runs([only])
    assert [r.label for r in a] == [r.label for r in b]
    rows_a, _ = rp.leaderboard(a)
    rows_b, _ = rp.leaderboard(b)
    assert rows_a == rows_b
    assert rp.depth_difficulty(a) == rp.depth_difficulty(b)
    rp.report([only], tmp_path / "out")  # the whole page, with no case studies to quote


def test_stripped_duplicates_that_disagree_are_still_refused(tmp_path):
    rows = [(True, 10, 1, 1)] * 4
    write_run(tmp_path, "a", {"controller": "/c"}, "gsm8k_ponder", rows)
    second = write_run(tmp_path, "b", {"controller": "/c"}, "gsm8k_ponder", rows)
    log = second.with_name("samples_gsm8k_ponder_2026-01-01T00-00-00.0.jsonl")
    changed = [json.loads(x) for x in log.read_text().splitlines()]
    changed[2]["resps"] = [["another answer"]]
    log.write_text("".join(json.dumps(x) + "\n" for x in changed))
    strip.strip_tree(tmp_path)
    for log in tmp_path.rglob("samples_*.jsonl"):
        if not log.name.endswith(strip.SUFFIX):
            log.unlink()
    with pytest.raises(PonderError, match="disagree on question 2"):
        rp.load_runs([tmp_path])
