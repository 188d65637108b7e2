"""``benchmarks/gpu_check.py`` in its small CPU form, so the GPU acceptance script cannot rot
between the rare sessions that have a GPU (issue 35)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, needs_embedded

pytestmark = pytest.mark.slow


@needs_embedded
def test_cpu_form_runs_every_step_and_says_ok(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO), "OUT": str(tmp_path)}
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_check.py"),
                           "--device", "cpu", "--limit", "4"], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.rstrip().splitlines()[-1] == "gpu_check ok"
    assert "fastest controller=none: " in done.stdout and "useful tok/s" in done.stdout
    record = json.loads((tmp_path / "gpu_check.json").read_text())
    names = [s["name"] for s in record["steps"]]
    assert names == ["steering hook, no host sync (prompt)",
                     "steering hook, no host sync (token)", "ponder (shipped controller)",
                     "ponder controller=none", "train prompt level", "train token level",
                     "hf batch 256", "hf batch 64"]
    evals = [s for s in record["steps"] if "accuracy" in s["figures"]]
    assert len(evals) == 4
    assert all(s["ok"] and s["figures"]["n"] == 4 for s in evals)
    assert all(0 <= s["figures"]["ci"][0] <= s["figures"]["accuracy"] <= s["figures"]["ci"][1]
               for s in evals)
    assert (tmp_path / "gpu_check.md").read_text().count("| yes |") == len(names)


@needs_embedded
def test_a_failing_step_fails_the_check(tmp_path):
    """Negative control: a step that fails makes the exit status non-zero, the others still
    run, and the last line names the failed step."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "OUT": str(tmp_path)}
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_check.py"),
                           "--device", "cpu", "--limit", "2", "--skip",
                           "ponder-none,ponder,hf-64,hf-256,"
                           "train-prompt,train-token",
                           "--fail", "sync-prompt"],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.rstrip().splitlines()[-1] == \
        "gpu_check FAILED: steering hook, no host sync (prompt)"
    steps = json.loads((tmp_path / "gpu_check.json").read_text())["steps"]
    assert [s["ok"] for s in steps] == [False, True]  # sync-prompt failed, sync-token ran


@needs_embedded
def test_the_gpu_session_script_runs_its_parts_small(tmp_path):
    """``benchmarks/gpu_session.sh`` in its small CPU form (the acceptance check itself is
    tested above): each part reports its exit status and leaves its log in $OUT."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "OUT": str(tmp_path), "DEVICE": "cpu",
           "SMALL": "1", "PARTS": "scale_7b train_7b scale_8b step_cost",
           "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
    done = subprocess.run(["bash", str(REPO / "benchmarks" / "gpu_session.sh")], env=env,
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith("== ")]
    assert [line.split(":")[0] for line in lines] == [
        "== scale_7b", "== train_7b", "== scale_8b", "== step_cost"]
    assert all(": rc 0 at" in line for line in lines)
    scale_7b = json.loads((tmp_path / "scale_7b.json").read_text())
    assert {"loop", "loop-rows3"} <= set(scale_7b["useful_tok_s"])
    assert json.loads((tmp_path / "train_7b.json").read_text())["token_step"]["rows"] == 4
    assert (tmp_path / "scale_8b.log").read_text().splitlines()[-1].startswith("loop_over_hf ")
    assert "host_ms_per_step" in (tmp_path / "step_cost.log").read_text()
    assert not (tmp_path / "gpu_check.log").exists()
