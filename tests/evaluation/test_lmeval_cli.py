"""lm_eval_ponder.evaluation.lmeval_cli: what a ``--model ponder`` run checks before it loads
and after lm-eval has written its files (issue 66: results lost with exit status 0)."""

from __future__ import annotations

import json
import os
import shutil
import time
from collections import namedtuple

import pytest

from lm_eval_ponder.errors import PonderError
from lm_eval_ponder.evaluation import lmeval_cli


def written(folder, results: str, samples: str | None = None):
    folder.mkdir(parents=True, exist_ok=True)
    stamp = "2026-12-01T00-00-00.000000"
    (folder / f"results_{stamp}.json").write_text(results)
    if samples is not None:
        (folder / f"samples_arith_ponder_{stamp}.jsonl").write_text(samples)


def test_whole_files_pass_and_empty_or_cut_ones_are_named(tmp_path):
    """A full disk left 0-byte results_*.json and samples_*.jsonl behind and exit status 0
    (lm-eval only logs the OSError at INFO)."""
    since = time.time()
    good = json.dumps({"results": {"arith_ponder": {}}})
    written(tmp_path / "ok" / "m", good, '{"doc_id": 0}\n{"doc_id": 1}\n')
    lmeval_cli.check_written(tmp_path / "ok", since, samples=True)
    written(tmp_path / "empty" / "m", "")
    with pytest.raises(PonderError, match=r"results_.*\.json is empty.*full disk"):
        lmeval_cli.check_written(tmp_path / "empty", since, samples=False)
    written(tmp_path / "cut" / "m", good, '{"doc_id": 0}\n{"doc_')
    with pytest.raises(PonderError, match=r"samples_arith_ponder_.*\.jsonl line 2 is not whole"):
        lmeval_cli.check_written(tmp_path / "cut", since, samples=True)
    (tmp_path / "none").mkdir()
    with pytest.raises(PonderError, match="wrote no results file"):
        lmeval_cli.check_written(tmp_path / "none", since, samples=False)
    old = tmp_path / "old"
    written(old / "m", "")  # an earlier run's file in the same folder is not this run's
    os.utime(next(old.rglob("results_*.json")), (since - 100, since - 100))
    written(old / "n", good)
    lmeval_cli.check_written(old, since, samples=False)


def test_a_sample_whose_text_holds_a_line_separator_is_whole(tmp_path):
    """Issue 73: lm-eval's GPQA has U+2028 in its texts, which json.dumps leaves raw; the check
    split lines with str.splitlines() and called a whole samples file cut (exit 1)."""
    since = time.time()
    good = json.dumps({"results": {"gpqa": {}}})
    row = json.dumps({"doc_id": 0, "arguments": "a\u2028b\x85c"}, ensure_ascii=False)
    assert "\u2028" in row
    written(tmp_path / "ok" / "m", good, row + "\n" + row + "\n")
    lmeval_cli.check_written(tmp_path / "ok", since, samples=True)
    written(tmp_path / "cut" / "m", good, row + "\n" + row[:10])
    with pytest.raises(PonderError, match="line 2 is not whole"):
        lmeval_cli.check_written(tmp_path / "cut", since, samples=True)


def test_an_output_path_on_a_full_disk_is_refused_before_the_run(tmp_path, monkeypatch):
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(10**9, 10**9, 2**20))
    with pytest.raises(PonderError, match="1 MiB free on its disk"):
        lmeval_cli.check_free_space(tmp_path / "out")


def test_max_gen_toks_is_checked_before_the_model_loads():
    lmeval_cli.check_gen_kwargs("max_gen_toks=8,do_sample=false")
    lmeval_cli.check_gen_kwargs(None)
    for bad in ("max_gen_toks=abc", "max_gen_toks=0", "max_gen_toks=2.5"):
        with pytest.raises(PonderError, match="max_gen_toks=.* is not a positive integer"):
            lmeval_cli.check_gen_kwargs(bad)


def test_the_cli_default_device_is_the_cpu_without_cuda(monkeypatch):
    """Issue 65: lm-eval records its --device flag as the run's config.device, and its default
    (cuda:0) made every CPU run say cuda:0; an explicit device is left as given."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert [lmeval_cli.cli_device(d) for d in (None, "cuda", "cuda:0", "cpu", "cuda:1")] == \
        ["cpu", "cpu", "cpu", "cpu", "cuda:1"]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert lmeval_cli.cli_device("cuda:0") == "cuda:0"
