"""Re-key an lm-eval ``--samples`` run's doc_id to the original test-set index.

Why. lm-eval 0.4.13 enumerates the selected documents from 0 (``Task.doc_iterator``), so a run
of questions 50..199 logs doc_id 0..149 and would collide with a first-50 run when the report
merges by doc_id. The selected indices are a contiguous range, so the original index is
``first + doc_id`` (checked by hand for GSM8K: the re-keyed question 50 is test row 50).
Usage: python benchmarks/rekey_samples.py RUN_DIR FIRST LAST
"""
from __future__ import annotations

import json
import sys
from pathlib import Path


def rekey(run_dir: Path, first: int, last: int) -> int:
    changed = 0
    for path in sorted(run_dir.rglob("samples_*.jsonl")):
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        if rows and min(r["doc_id"] for r in rows) >= first:
            continue  # already re-keyed
        if rows and max(r["doc_id"] for r in rows) > last - first:
            raise SystemExit(f"{path}: doc_id beyond the selected range; not a --samples run?")
        for r in rows:
            r["doc_id"] += first
        tmp = path.with_suffix(".tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
        tmp.replace(path)
        changed += len(rows)
    return changed


if __name__ == "__main__":
    print(f"re-keyed {rekey(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))} samples")
