"""Summarise lm-eval sample logs: accuracy (Wilson 95% CI), mean generated tokens, mean FLOPs,
mean ponder steps per task, and per arith level, as text (``python -m lm_eval_ponder.report``
writes the full leaderboard, plots and HTML).

Usage: python studies/summarize.py results/baselines [results/alpha_sweep/alpha_-0.2 ...]
"""

from __future__ import annotations

import json
import math
import sys
from collections import defaultdict
from pathlib import Path

from lm_eval_ponder.reporting.measures import wilson


def rows(root: Path):
    for path in sorted(root.rglob("samples_*.jsonl")):
        task = path.name[len("samples_"):].rsplit("_", 1)[0]
        label = str(path.parent.parent.relative_to(root.parent)) if path.parent.parent != root else root.name
        for line in path.open():
            yield label, task, json.loads(line)


def line(name: str, samples: list[dict]) -> str:
    n = len(samples)
    acc = sum(s["exact_match"] for s in samples)
    lo, hi = wilson(acc, n)
    mean = lambda key: sum(s[key] for s in samples) / n  # noqa: E731
    return (f"| {name} | {n} | {acc / n:.3f} [{lo:.2f}, {hi:.2f}] | {mean('gen_tokens'):.1f} | "
            f"{math.log10(mean('flops')):.2f} | {mean('ponder_steps'):.2f} |")


def main(paths: list[str]) -> None:
    print("| run / task | n | accuracy [95% CI] | mean gen tokens | log10 mean FLOPs | ponder steps |")
    print("| --- | --- | --- | --- | --- | --- |")
    for root in map(Path, paths):
        groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
        for label, task, sample in rows(root):
            groups[(label, task)].append(sample)
        for (label, task), samples in sorted(groups.items()):
            print(line(f"{label} {task}", samples))
            if task.startswith("arith"):
                levels = defaultdict(list)
                for s in samples:
                    levels[s["doc"]["level"]].append(s)
                for level in sorted(levels):
                    print(line(f"&nbsp;&nbsp;level {level}", levels[level]))


if __name__ == "__main__":
    main(sys.argv[1:])
