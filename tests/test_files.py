"""Atomic writes, hashes and fsynced log lines (lm_eval_ponder.files)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from lm_eval_ponder.errors import PonderError
from lm_eval_ponder.files import (
    append_jsonl,
    atomic_write_text,
    check_output,
    exact_float32,
    file_sha256,
    read_jsonl,
    short_float32,
    write_jsonl_xz,
)


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


def test_read_json_names_a_cut_off_file(tmp_path):
    from lm_eval_ponder.files import read_json

    path = tmp_path / "results_x.json"
    path.write_text('{"results": {"a": 1}}')
    assert read_json(path) == {"results": {"a": 1}}
    path.write_text('{"results": {"a"')
    with pytest.raises(PonderError, match="results_x.json: not JSON"):
        read_json(path)


HOLD = ("import sys, time; from lm_eval_ponder.files import acquire_lock; "
        "acquire_lock(sys.argv[1], {'pid': 'other'}); print('held', flush=True); time.sleep(60)")


def test_a_lock_names_its_live_holder_and_is_taken_over_when_it_dies(tmp_path):
    """flock: the kernel lets go of a dead process's lock, so a lock file left by a killed
    process is taken over (and what it said is handed back), while a live holder is named."""
    import os
    import subprocess
    import sys

    from lm_eval_ponder.files import LockHeld, acquire_lock

    path = tmp_path / "run.lock"
    repo = str(Path(__file__).resolve().parents[1])
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(path)], stdout=subprocess.PIPE,
                              text=True, env={**os.environ, "PYTHONPATH": repo})
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(LockHeld) as busy:
            acquire_lock(path, {"pid": "me"})
        assert busy.value.holder == {"pid": "other"}
    finally:
        holder.kill()
        holder.wait()
    lock = acquire_lock(path, {"pid": "me"})
    assert lock.previous == {"pid": "other"} and json.loads(path.read_text()) == {"pid": "me"}
    with pytest.raises(LockHeld):  # one holder at a time, within a process too
        acquire_lock(path, {"pid": "again"})
    lock.release()
    assert not path.exists()
    again = acquire_lock(path, {"pid": "me"})
    assert again.previous is None  # released cleanly: nothing left to take over
    again.release()


def test_the_output_probe_never_makes_a_folder_another_walk_could_trip_on(tmp_path, monkeypatch):
    """Two suites side by side: one probes its output while the other walks the same tree
    (compact_tree's rglob). A probe folder removed between the walk's listing and its entering
    it raised FileNotFoundError in the other suite; the probe must make no folder at all."""
    import os

    made = []
    real_mkdir = os.mkdir
    monkeypatch.setattr(os, "mkdir", lambda p, *a, **k: (made.append(p), real_mkdir(p, *a, **k)))
    assert check_output(tmp_path / "runs" / "k0") == tmp_path / "runs" / "k0"
    assert made == [] and list(tmp_path.iterdir()) == []
    (tmp_path / "ro").mkdir()
    (tmp_path / "ro").chmod(0o500)
    try:
        if not os.access(tmp_path / "ro", os.W_OK):  # root writes anywhere
            with pytest.raises(PonderError, match="cannot write"):
                check_output(tmp_path / "ro" / "out")
    finally:
        (tmp_path / "ro").chmod(0o700)
