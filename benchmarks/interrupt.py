"""How long Ctrl-C takes to stop ``lm_eval --model ponder`` in the middle of a prefill (issue 66:
"Ctrl-C acts within a few seconds in every phase"). The prefill of a 128-row group is the
longest stretch without a Python step between the loop's own checks (GPQA's prompts run to
2,899 tokens), so it is where a slow interrupt would show.

    python benchmarks/interrupt.py --task gpqa_ponder --limit 128 --after 2 8 --out record.json

Starts the run, waits for the progress bar's "prefilling" status, sends SIGINT ``--after``
seconds later, and times the exit (the run prints its resume advice and ends with 130).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def interrupt_once(task: str, limit: int, after: float) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    cmd = [sys.executable, "-m", "lm_eval", "--model", "ponder", "--model_args",
           "controller=none", "--tasks", task, "--apply_chat_template", "--limit", str(limit),
           "--output_path", str(Path(os.environ.get("TMPDIR", "/tmp")) / "interrupt-out")]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                            text=True, bufsize=1)
    seen = ""
    while True:
        ch = proc.stdout.read(1)
        if not ch:
            return {"task": task, "after_s": after, "error": "ended before prefilling",
                    "rc": proc.wait()}
        seen = (seen + ch)[-400:]
        if "prefilling" in seen:
            break
    time.sleep(after)
    sent = time.perf_counter()
    proc.send_signal(signal.SIGINT)
    proc.stdout.read()
    rc = proc.wait()
    return {"task": task, "limit": limit, "after_s": after, "exit_s": round(
        time.perf_counter() - sent, 2), "rc": rc}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python benchmarks/interrupt.py",
                                description=__doc__.split("\n")[0])
    p.add_argument("--task", default="gpqa_ponder")
    p.add_argument("--limit", type=int, default=128)
    p.add_argument("--after", type=float, nargs="+", default=[2.0, 8.0],
                   help="seconds into the first prefill to send SIGINT, one run each")
    p.add_argument("--out", default=None, help="write the record as JSON here")
    a = p.parse_args(argv)
    from lm_eval_ponder.backbone import device_description

    record = {"machine": device_description("cpu"),
              "runs": [interrupt_once(a.task, a.limit, s) for s in a.after]}
    print(json.dumps(record, indent=1))
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
