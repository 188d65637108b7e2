"""Atomic writes, hashes and fsynced log lines (lm_eval_ponder.files)."""

from __future__ import annotations

import hashlib
import json

from lm_eval_ponder.files import append_jsonl, atomic_write_text, file_sha256


def test_file_sha256_matches_hashlib_across_chunks(tmp_path):
    path = tmp_path / "f.bin"
    data = bytes(range(256)) * 1000
    path.write_bytes(data)
    assert file_sha256(path, chunk=1000) == hashlib.sha256(data).hexdigest()


def test_append_jsonl_appends_sorted_lines(tmp_path):
    path = tmp_path / "log.jsonl"
    append_jsonl(path, {"b": 1, "a": 2})
    append_jsonl(path, {"step": 3})
    lines = path.read_text().splitlines()
    assert lines[0] == '{"a": 2, "b": 1}' and json.loads(lines[1]) == {"step": 3}


def test_atomic_write_text_replaces_whole_file(tmp_path):
    path = tmp_path / "card.md"
    atomic_write_text(path, "one")
    atomic_write_text(path, "two")
    assert path.read_text() == "two" and [p.name for p in tmp_path.iterdir()] == ["card.md"]
