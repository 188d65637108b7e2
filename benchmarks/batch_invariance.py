"""Do greedy answers depend on the batching? The same configuration under several batchings,
end to end through lm-eval, answer by answer (issue 73 item 9).

    python benchmarks/batch_invariance.py --limit 500 --dtypes bfloat16,float32 \
        --settings "max_rows=128;max_rows=16;max_cache_gib=0.05" \
        --out results/batch-invariance/$NAME.json
    # the cost of a setting against the defaults, as a ratio of interleaved pairs
    python benchmarks/batch_invariance.py --limit 40 --dtypes bfloat16 \
        --settings "max_rows=128;max_rows=1" --pairs 3 --out /tmp/cost.json

One process per dtype, one loaded ``--model ponder controller=none`` (the embedded backbone,
greedy, 256 new tokens, chat template, arith_ponder); each setting changes only the batching
(``max_rows``: rows in flight; ``max_cache_gib``: their key/value budget, which caps the rows
too). Every setting's answers are compared with the first setting's, document by document
(the answer digest of ``reporting.compact``): the fraction that differ, and the accuracy
difference with a paired bootstrap interval. With ``--pairs N`` each setting runs N times,
the order reversed in odd pairs, and the record keeps every wall time and the median ratio of
each setting to the first (pairs run side by side share the machine's noise).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path


def parse_setting(text: str) -> dict[str, float | int]:
    out: dict[str, float | int] = {}
    for item in filter(None, text.split(",")):
        key, _, value = item.partition("=")
        if key not in ("max_rows", "max_cache_gib"):
            raise SystemExit(f"a setting names max_rows or max_cache_gib, not {key!r}")
        out[key] = int(value) if key == "max_rows" else float(value)
    return out


def apply(lm, setting: dict, defaults: dict) -> None:
    """The batching of ``setting`` on a loaded model (the rest at ``defaults``)."""
    batching = lm.batching
    batching.max_rows = int(setting.get("max_rows", defaults["max_rows"]))
    batching.max_cache_gib = setting.get("max_cache_gib", defaults["max_cache_gib"])
    batching.fit(lm.model.config, lm.model.dtype, defaults["weight_bytes"])


def run(lm, manager, limit: int, max_gen_toks: int) -> tuple[dict[int, dict], float]:
    from lm_eval import simple_evaluate

    from lm_eval_ponder.reporting.compact import answers_digest

    start = time.perf_counter()
    out = simple_evaluate(model=lm, tasks=["arith_ponder"], limit=limit, apply_chat_template=True,
                          task_manager=manager, log_samples=True,
                          gen_kwargs=f"max_gen_toks={max_gen_toks}")
    wall = time.perf_counter() - start
    return {int(s["doc_id"]): {"digest": answers_digest(s), "correct": float(s["exact_match"]),
                               "tokens": float(s["gen_tokens"])}
            for s in out["samples"]["arith_ponder"]}, wall


def compare(base: dict[int, dict], other: dict[int, dict], draws: int = 2000) -> dict:
    import numpy as np

    ids = sorted(base)
    diff = np.array([other[i]["correct"] - base[i]["correct"] for i in ids])
    rng = np.random.default_rng(0)
    boot = np.sort([diff[rng.integers(0, len(ids), len(ids))].mean() for _ in range(draws)])
    return {"n": len(ids), "answers_differ": int(sum(base[i]["digest"] != other[i]["digest"]
                                                     for i in ids)),
            "accuracy": float(np.mean([other[i]["correct"] for i in ids])),
            "accuracy_difference": float(diff.mean()),
            "accuracy_difference_ci95": [float(boot[int(0.025 * draws)]),
                                         float(boot[int(0.975 * draws) - 1])]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--limit", type=int, default=500)
    p.add_argument("--dtypes", default="bfloat16,float32")
    p.add_argument("--settings", default="max_rows=128;max_rows=16;max_cache_gib=0.05",
                   help="';'-separated batchings, each 'key=value,...'; the first is the base")
    p.add_argument("--pairs", type=int, default=1, help="runs of each setting (interleaved)")
    p.add_argument("--max-gen-toks", type=int, default=256)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", required=True)
    args = p.parse_args()

    import torch
    from lm_eval.tasks import TaskManager

    from lm_eval_ponder.backbone import device_description, weight_bytes
    from lm_eval_ponder.evaluation.lm import PonderLM
    from lm_eval_ponder.resources import tasks_dir

    torch.set_num_threads(args.threads)
    manager = TaskManager(include_path=tasks_dir())
    settings = [parse_setting(s) for s in args.settings.split(";")]
    record = {"command": "python benchmarks/batch_invariance.py " + " ".join(
        f"--{k.replace('_', '-')} {v!r}" for k, v in vars(args).items() if k != "out"),
              "machine": f"{device_description('cpu')}, {args.threads} thread(s), "
                         f"{platform.machine()}", "date": time.strftime("%Y-%m-%d"),
              "dtypes": {}}
    for dtype in args.dtypes.split(","):
        lm = PonderLM(controller="none", dtype=dtype)
        defaults = {"max_rows": lm.batching.max_rows, "max_cache_gib": lm.batching.max_cache_gib,
                    "weight_bytes": weight_bytes(lm.model)}
        answers: list[dict | None] = [None] * len(settings)
        walls: list[list[float]] = [[] for _ in settings]
        for pair in range(args.pairs):
            order = range(len(settings)) if pair % 2 == 0 else reversed(range(len(settings)))
            for j in order:
                apply(lm, settings[j], defaults)
                got, wall = run(lm, manager, args.limit, args.max_gen_toks)
                walls[j].append(wall)
                if answers[j] is None:
                    answers[j] = got
                elif got != answers[j]:
                    print(f"{dtype} {settings[j]}: a repeat gave other answers", flush=True)
                print(f"{dtype} pair {pair + 1} {settings[j]}: {wall:.1f} s", flush=True)
        rows = []
        for j, setting in enumerate(settings):
            row = {"setting": setting, "batching": {**defaults, **setting}, "wall_s": walls[j],
                   **compare(answers[0], answers[j])}
            if args.pairs > 1 or j:
                row["wall_ratio_to_first"] = statistics.median(
                    w / w0 for w, w0 in zip(walls[j], walls[0]))
            rows.append(row)
            print(f"{dtype} {setting}: {row['answers_differ']} of {row['n']} answers differ, "
                  f"accuracy {row['accuracy']:.3f} ({row['accuracy_difference']:+.3f} "
                  f"{[round(x, 3) for x in row['accuracy_difference_ci95']]}), "
                  f"wall x{row.get('wall_ratio_to_first', 1.0):.2f}", flush=True)
        for row in rows:
            row["batching"].pop("weight_bytes", None)
        record["dtypes"][dtype] = rows
        del lm
        # after each dtype, so a run stopped in the next keeps what it finished
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
