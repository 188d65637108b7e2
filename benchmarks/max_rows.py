"""Rows in flight (``max_rows``) against wall time, end to end through lm-eval.

    python benchmarks/max_rows.py --values 16,32,64,128 --pairs 2 --limit 100

One process, one loaded ``--model ponder controller=none`` (our defaults otherwise); each pair
runs every value once (the order reversed in odd pairs) on arith_ponder with 256 new tokens,
greedy, chat template. Prints each run and the median wall per value, fastest first. The
default of ``max_rows`` (``evaluation.lm.default_max_rows``) is chosen from this.
"""

from __future__ import annotations

import argparse
import statistics
import time


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--values", default="16,32,64,128")
    p.add_argument("--pairs", type=int, default=2)
    p.add_argument("--limit", type=int, default=100)
    p.add_argument("--max-gen-toks", type=int, default=256)
    args = p.parse_args()

    import torch
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    from lm_eval_ponder.evaluation.lm import PonderLM
    from lm_eval_ponder.resources import tasks_dir

    torch.set_num_threads(2)
    manager = TaskManager(include_path=tasks_dir())
    lm = PonderLM(controller="none")
    values = [int(v) for v in args.values.split(",")]
    walls: dict[int, list[float]] = {v: [] for v in values}
    for pair in range(args.pairs):
        for v in values if pair % 2 == 0 else values[::-1]:
            lm.batching.max_rows = v
            t = time.perf_counter()
            simple_evaluate(model=lm, tasks=["arith_ponder"], limit=args.limit,
                            apply_chat_template=True, task_manager=manager,
                            gen_kwargs=f"max_gen_toks={args.max_gen_toks}")
            walls[v].append(time.perf_counter() - t)
            print(f"pair {pair + 1} max_rows {v:4d} {walls[v][-1]:7.1f} s", flush=True)
    print(f"\narith_ponder --limit {args.limit}, {args.max_gen_toks} new tokens, "
          f"{lm.model.dtype}, medians of {args.pairs} pairs")
    for v in sorted(values, key=lambda v: statistics.median(walls[v])):
        print(f"max_rows {v:4d}: {statistics.median(walls[v]):7.1f} s")


if __name__ == "__main__":
    main()
