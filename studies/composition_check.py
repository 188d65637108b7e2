"""Issue 65, item 5: does a controller composed from the fixed-depth sweep give what
``lm_eval --model ponder`` gives when the controller runs, at T = 0.7?

The adaptation and test-set pages score a controller without running it: each document's answer
is the sweep's answer at the depth the controller picks for that document (the composition).
Greedily the two agree token for token (``testset.py verify``). At T = 0.7 an answer is a draw,
and a run that mixes depths in one batch need not draw what the one-depth run drew, so the
composition can only agree in distribution. This compares, per seed, the composed answers
with a real run's: how many documents got the same answer (by the compact log's digest), the
two accuracies, their paired difference with a bootstrap interval, and the tokens.

    python studies/composition_check.py --depth 0 \
        --sweep results/testset-t0.7/ours/k{depth}/{decoding}/FR/arith \
        --run results/suite/{decoding}/FP-Direct/arith --out docs/testset/composition-t0.7.json

``--depth``: the controller's depth on every document (the shipped controller's is 0: its
card); the sweep's run at that depth is the composition. ``{decoding}`` takes ``t0.7``,
``t0.7-seed1``, ``t0.7-seed2`` (seeds 0-2).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from studylib import records as archive

from lm_eval_ponder.reporting.compact import answers_digest, latest_log, read_samples

DECODINGS = {0: "t0.7", 1: "t0.7-seed1", 2: "t0.7-seed2"}


def samples_of(directory: Path, task: str) -> dict[int, dict]:
    """doc_id -> sample of the one run under ``directory``."""
    logs = [latest_log(d, task) for d in sorted(directory.iterdir()) if d.is_dir()]
    logs = [log for log in logs if log is not None]
    if len(logs) != 1:
        raise SystemExit(f"composition_check.py error: {directory} holds {len(logs)} runs of "
                         f"{task}, not one")
    return {s["doc_id"]: s for s in read_samples(logs[0])}


def compare(composed: dict[int, dict], ran: dict[int, dict], draws: int = 2000,
            seed: int = 0) -> dict:
    """Agreement and accuracy of a composed and a real run on the documents both answered."""
    docs = sorted(set(composed) & set(ran))
    a = np.array([composed[d]["exact_match"] for d in docs], dtype=float)
    b = np.array([ran[d]["exact_match"] for d in docs], dtype=float)
    same = np.array([answers_digest(composed[d]) == answers_digest(ran[d]) for d in docs])
    rng = np.random.default_rng(seed)
    boot = [float((b - a)[idx].mean()) for idx in rng.integers(0, len(docs), (draws, len(docs)))]
    return {"n": len(docs), "same_answer": float(same.mean()),
            "composed_accuracy": float(a.mean()), "run_accuracy": float(b.mean()),
            "run_minus_composed": float((b - a).mean()),
            "ci95": [float(np.percentile(boot, 2.5)), float(np.percentile(boot, 97.5))],
            "composed_tokens": float(np.mean([composed[d]["gen_tokens"] for d in docs])),
            "run_tokens": float(np.mean([ran[d]["gen_tokens"] for d in docs]))}


def seed_means(runs: list[dict[int, dict]]) -> dict[int, dict]:
    """Per document answered under every seed: its accuracy and tokens averaged over the seeds
    (the unit the pages compare at T = 0.7), and no answer digest (nothing to match)."""
    docs = set.intersection(*(set(r) for r in runs))
    return {d: {"exact_match": float(np.mean([r[d]["exact_match"] for r in runs])),
                "gen_tokens": float(np.mean([r[d]["gen_tokens"] for r in runs])),
                "resps_sha256": ""} for d in docs}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python studies/composition_check.py",
                                description=__doc__.split("\n")[0])
    p.add_argument("--depth", type=int, required=True)
    p.add_argument("--sweep", required=True, help="the sweep's run folder, with {depth} and "
                   "{decoding}")
    p.add_argument("--run", required=True, help="the controller's lm_eval run, with {decoding}")
    p.add_argument("--task", default="arith_ponder")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    seeds = [int(s) for s in a.seeds.split(",")]
    per_seed, composed_all, ran_all = {}, [], []
    for seed in seeds:
        sweep = Path(a.sweep.format(depth=a.depth, decoding=DECODINGS[seed]))
        run = Path(a.run.format(decoding=DECODINGS[seed]))
        archive.ensure(sweep), archive.ensure(run)  # the committed runs (results/*.tar.xz)
        composed, ran = samples_of(sweep, a.task), samples_of(run, a.task)
        per_seed[str(seed)] = compare(composed, ran)
        composed_all.append(composed)
        ran_all.append(ran)
        print(f"seed {seed}: {json.dumps(per_seed[str(seed)])}")
    pooled = compare(*(seed_means(x) for x in (composed_all, ran_all)))
    pooled["same_answer"] = None  # seed means have no answers to match
    print(f"seeds pooled: {json.dumps(pooled)}")
    record = {"what": "a controller composed from the sweep against its lm_eval run, T = 0.7",
              "depth": a.depth, "sweep": a.sweep, "run": a.run, "task": a.task,
              "per_seed": per_seed, "seeds_pooled": pooled}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
