"""Atomic writes, hashes and fsynced log lines (lm_eval_ponder.files)."""

from __future__ import annotations

import hashlib
import json

import pytest

from lm_eval_ponder.errors import PonderError
from lm_eval_ponder.files import (append_jsonl, atomic_write_text, exact_float32, file_sha256,
                                  read_jsonl, short_float32, write_jsonl_xz)


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


def test_jsonl_xz_round_trip_and_clear_errors(tmp_path):
    path = tmp_path / "r.jsonl.xz"
    write_jsonl_xz(path, [{"a": 1}, {"b": "x\ny"}])
    assert read_jsonl(path) == [{"a": 1}, {"b": "x\ny"}]
    assert [p.name for p in tmp_path.iterdir()] == ["r.jsonl.xz"]
    path.write_bytes(path.read_bytes()[:-8])  # cut off
    with pytest.raises(PonderError, match="r.jsonl.xz: cannot be read"):
        read_jsonl(path)
    plain = tmp_path / "p.jsonl"
    plain.write_text('{"a": 1}\n{"a": \n')
    with pytest.raises(PonderError, match="p.jsonl, line 2"):
        read_jsonl(plain)


def test_short_float32_reads_back_bit_for_bit():
    import numpy as np

    scale = 10.0 ** np.random.default_rng(1).integers(-30, 30, 10000)
    values = (np.random.default_rng(0).random(10000) * scale).astype(np.float32)
    values = [float(v) for v in values] + [0.0, -1.5, None, float("inf")]
    short = short_float32(values)
    assert exact_float32(short)[:-1] == values[:-1] and exact_float32(short)[-1] == float("inf")
    assert len(json.dumps(short)) < 0.7 * len(json.dumps(values))
    assert short_float32([0.1]) is None  # a float64 value: not ours to shorten
