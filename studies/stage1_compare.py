"""Stage 1 of the curriculum: the paper's schedule (no update before T1) against our imitation
fix, same rollout cache, seeds 0..S-1. Prints held-out inference-time figures and training time.

Usage: python studies/stage1_compare.py CACHE_DIR OUT_DIR [SEEDS] [extra --key value ...]
(CACHE_DIR: a finished rollout cache for the embedded backbone, e.g. the one the shipped
controller was trained on; each run trains in OUT_DIR/<mode>-<seed>.)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from lm_eval_ponder.training.cli import main as train


def run(cache: str, out: Path, seeds: int, extra: list[str]) -> None:
    print("| stage 1 | seed | held-out acc | held-out tokens | held-out FLOPs | mean depth | "
          "score | best fixed depth score | train s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for mode in ("imitation", "paper"):
        for seed in range(seeds):
            target = out / f"{mode}-{seed}"
            if not (target / "config.json").is_file():
                train(["--output", str(target), "--cache_dir", cache, "--grpo.stage1", mode,
                       "--seed", str(seed), *extra])
            cfg = json.loads((target / "config.json").read_text())
            v, o = cfg["figures"]["val"], cfg["figures"]["val_oracle"]
            print(f"| {mode} | {seed} | {v['accuracy']:.3f} | {v['gen_tokens']:.1f} | "
                  f"{v['flops']:.3e} | {v['depth']:.2f} | {v['score']:.4f} | "
                  f"{o['best_fixed_score']:.4f} (depth {int(o['best_fixed_depth'])}) | "
                  f"{cfg['cost']['train_wall_s']} |")


if __name__ == "__main__":
    run(sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else 3,
        sys.argv[4:])
