"""Data-parallel evaluation on CPUs (issue 66): ``torchrun --nproc_per_node 2 -m lm_eval --model
ponder`` shards the documents over two real processes (gloo), as HFLM shards them over GPUs,
and writes one results file whose per-sample answers equal a one-process run's (greedy,
float32). Before, each process evaluated every document, and nothing said so."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LIMIT = 6


def free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def run(prefix: list[str], model_dir: Path, out: Path) -> dict[int, dict]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",
           "LM_EVAL_PONDER_BUILTIN_TASKS": "0"}
    cmd = [*prefix, "-m", "lm_eval", "--model", "ponder", "--model_args",
           f"pretrained={model_dir},controller=none,dtype=float32", "--tasks", "arith_ponder",
           "--limit", str(LIMIT), "--gen_kwargs", "max_gen_toks=6", "--device", "cpu",
           "--log_samples", "--output_path", str(out)]
    done = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    (results,) = out.rglob("results_*.json")  # one file: rank 0's, of every rank's answers
    (samples,) = out.rglob("samples_arith_ponder_*.jsonl")
    rows = [json.loads(line) for line in samples.read_text().splitlines()]
    return {r["doc_id"]: r for r in rows}, done.stderr


def test_two_cpu_processes_share_the_documents_and_answer_as_one(tiny_model_dir, tmp_path):
    one, _ = run([sys.executable], tiny_model_dir, tmp_path / "one")
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                "--master_port", free_port()]
    two, stderr = run(torchrun, tiny_model_dir, tmp_path / "two")
    assert sorted(two) == sorted(one) == list(range(LIMIT))  # each document once
    for doc_id in one:
        assert two[doc_id]["resps"] == one[doc_id]["resps"]
        assert two[doc_id]["gen_tokens"] == one[doc_id]["gen_tokens"]
    # one results file (above: before, each process wrote its own, of every document)
    assert "Traceback" not in stderr
