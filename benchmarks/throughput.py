"""End-to-end generation throughput: lm-eval's ``--model hf`` against ``--model ponder``.

    python benchmarks/throughput.py                 # arith_ponder --limit 100, 256 new tokens
    python benchmarks/throughput.py --pairs 3 --limit 100 --max-gen-toks 256

One process, the same task (chat template, greedy), the models loaded once and the runs
interleaved pair by pair so that noise on a shared machine hits every side alike:

  (a) ``--model hf`` with lm-eval's defaults (dtype "auto" = the checkpoint's float32;
      ``--hf-batch-size``, default 16 as in the issue's reference figure);
  (b) ``--model ponder controller=none`` with our defaults (no batch size given: lm-eval's CLI
      hands 1; the loop keeps ``max_rows`` rows in flight anyway);
  (c) ``--model ponder`` with the shipped controller, our defaults;
  (d) our loop against HFLM's path at the same dtype and rows in flight
      (``generation=loop, max_rows=B`` vs ``generation=hf, batch_size=B``).

Per run: wall time, useful generated tokens per second (tokens each response generated, to its
own EOS; ``--model hf`` reports none, so its responses are re-tokenised), accuracy with its
Wilson 95% CI; for (d) the fraction of identical responses and the ceiling that padding alone
sets (``lib.decoding.padding_bound``: x1.97 at the default 256 tokens, x3.04 at 500). Then the
physical reference: this CPU's matmul rate in the run's dtype and the FLOPs the run needed.
``--out FILE`` keeps the figures as JSON (the machine, the settings, each side's runs without
their texts, the ratios). Last line: ``speedup <median (a) wall / (b) wall>``.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

from lib.decoding import padding_bound


def matmul_rate(dtype, n: int = 2048, reps: int = 4) -> float:
    """GFLOP/s of an n x n matmul in ``dtype`` on this machine (median of ``reps``)."""
    import torch

    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    a @ b
    rates = []
    for _ in range(reps):
        t = time.perf_counter()
        a @ b
        rates.append(2 * n ** 3 / (time.perf_counter() - t) / 1e9)
    return statistics.median(rates)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--limit", type=int, default=100)
    p.add_argument("--max-gen-toks", type=int, default=256)
    p.add_argument("--hf-batch-size", type=int, default=16)
    p.add_argument("--rows", type=int, default=64, help="B of comparison (d)")
    p.add_argument("--skip", default="", help="comma-separated runs to leave out, e.g. c,d "
                   "((a) is loaded anyway: its tokenizer and dtype are the reference)")
    p.add_argument("--threads", type=int, default=2,
                   help="torch threads (1 beside another job: two busy processes on 2 cores "
                        "with 2 threads each run about 10x slower)")
    p.add_argument("--out", default=None, help="write the figures as JSON here")
    return p.parse_args()


def load_models(args: argparse.Namespace, skip: set[str]) -> dict:
    """Every side, loaded once before any run (so loading is timed apart from generating):
    (a) always, as its tokenizer and dtype are the reference; (d)'s two at (a)'s dtype."""
    from lm_eval.models.huggingface import HFLM

    from lm_eval_ponder import backbone as bb
    from lm_eval_ponder.evaluation.lm import PonderLM

    path = bb.resolve_backbone(None).path
    t0 = time.perf_counter()
    models = {"a": HFLM(pretrained=path, batch_size=args.hf_batch_size, device="cpu")}
    if "b" not in skip:
        models["b"] = PonderLM(controller="none")
    if "c" not in skip:
        models["c"] = PonderLM()
    if "d" not in skip:
        models["d-loop"] = PonderLM(controller="none", dtype=str(models["a"].model.dtype)[6:],
                                    max_rows=args.rows, batch_size=args.rows)
        models["d-hf"] = PonderLM(controller="none", dtype=str(models["a"].model.dtype)[6:],
                                  generation="hf", batch_size=args.rows)
    print(f"loaded {len(models)} models in {time.perf_counter() - t0:.0f}s; "
          + ", ".join(f"{k}: {m.model.dtype}, batch {m.batch_size}"
                      + (f", max_rows {m.max_rows}, generation={m.generation}"
                         if isinstance(m, PonderLM) else "") for k, m in models.items()),
          flush=True)
    return models


def run(model, tokenizer, manager, args: argparse.Namespace) -> dict:
    """One side on the task: wall time, useful tokens (re-tokenised where the model reports
    none, as ``--model hf``), accuracy, responses, prompt lengths and FLOPs where reported."""
    import torch
    from lm_eval import simple_evaluate

    from lm_eval_ponder.generation.accounting import count_text_tokens

    torch.manual_seed(1234)
    t = time.perf_counter()
    out = simple_evaluate(model=model, tasks=["arith_ponder"], limit=args.limit,
                          apply_chat_template=True, log_samples=True, task_manager=manager,
                          gen_kwargs=f"max_gen_toks={args.max_gen_toks}")
    wall = time.perf_counter() - t
    samples = out["samples"]["arith_ponder"]
    responses = [s["resps"][0][0] for s in samples]
    tokens = [s.get("gen_tokens") for s in samples]
    if any(x is None or (isinstance(x, float) and math.isnan(x)) for x in tokens):
        tokens = [count_text_tokens(tokenizer, r, args.max_gen_toks) for r in responses]
    acc = [float(s["exact_match"]) for s in samples]
    flops = [s.get("flops") for s in samples]
    contexts = [s["arguments"][0][0] if isinstance(s["arguments"], (list, tuple))
                else s["arguments"]["gen_args_0"]["arg_0"] for s in samples]
    return {"wall": wall, "tokens": sum(tokens), "acc": sum(acc) / len(acc), "n": len(acc),
            "k": sum(acc), "responses": responses, "token_list": tokens,
            "prompt_lengths": [len(tokenizer(c).input_ids) for c in contexts],
            "flops": sum(flops) if all(isinstance(f, float) and not math.isnan(f)
                                       for f in flops) else None}


def run_pairs(models: dict, order: list[str], args: argparse.Namespace) -> dict[str, list[dict]]:
    """``--pairs`` rounds of every side, the order reversed every other round, so that noise
    on a shared machine hits every side alike."""
    from lm_eval.tasks import TaskManager

    from lm_eval_ponder.resources import tasks_dir

    manager = TaskManager(include_path=tasks_dir())
    tokenizer = models["a"].tokenizer
    results: dict[str, list[dict]] = {k: [] for k in order}
    for pair in range(args.pairs):
        sequence = order if pair % 2 == 0 else order[::-1]  # alternate who runs first
        for name in sequence:
            results[name].append(run(models[name], tokenizer, manager, args))
            r = results[name][-1]
            print(f"pair {pair + 1} {name:7s} {r['wall']:7.1f} s  {r['tokens'] / r['wall']:7.1f} "
                  f"useful tok/s  acc {r['acc']:.3f}", flush=True)
    return results


def print_medians(results: dict[str, list[dict]], args: argparse.Namespace) -> dict[str, float]:
    """Each side's median wall time and useful tokens/s and its accuracy (Wilson 95% CI);
    returns the median walls."""
    from lm_eval_ponder.reporting.measures import wilson

    print(f"\narith_ponder --limit {args.limit}, {args.max_gen_toks} new tokens, greedy, chat "
          f"template; medians of {args.pairs} interleaved pairs")
    labels = {"a": "(a) --model hf, lm-eval defaults", "b": "(b) ponder controller=none",
              "c": "(c) ponder, shipped controller", "d-loop": f"(d) loop, {args.rows} rows",
              "d-hf": f"(d) HFLM path, batch {args.rows}"}
    med = {}
    for name, rs in results.items():
        wall = statistics.median(r["wall"] for r in rs)
        med[name] = wall
        lo, hi = wilson(rs[0]["k"], rs[0]["n"])
        print(f"{labels[name]:36s} wall {wall:7.1f} s  "
              f"{statistics.median(r['tokens'] / r['wall'] for r in rs):7.1f} useful tok/s  "
              f"accuracy {rs[0]['acc']:.3f} [{lo:.2f}, {hi:.2f}] (n={rs[0]['n']})")
    return med


def print_loop_comparison(results: dict[str, list[dict]], args: argparse.Namespace) -> None:
    """(d): our loop's speedup over HFLM's path at equal dtype and rows, the identical
    responses, and the ceiling that padding alone sets."""
    same = [sum(x == y for x, y in zip(a["responses"], b["responses"])) / len(a["responses"])
            for a, b in zip(results["d-loop"], results["d-hf"])]
    ratios = [b["wall"] / a["wall"] for a, b in zip(results["d-loop"], results["d-hf"])]
    print(f"(d) loop speedup at equal dtype and rows: x{statistics.median(ratios):.2f} "
          f"(pairs {', '.join(f'{r:.2f}' for r in ratios)}); identical responses "
          f"{statistics.median(same):.0%}")
    hf = results["d-hf"][0]
    print(f"(d) ceiling from padding alone (generate's row-steps / useful row-steps at batch "
          f"{args.rows}): x{padding_bound(hf['prompt_lengths'], hf['token_list'], args.rows):.2f}")


def print_physical_reference(model, run_b: dict, wall: float) -> None:
    """(b)'s FLOPs against this CPU's matmul rate in (b)'s dtype: the share of the machine's
    arithmetic the run achieved."""
    dtype = model.model.dtype
    rate = matmul_rate(dtype)
    needed = float(run_b["flops"])  # a FlopCount formats .1f as "2.503 FLOPs"
    print(f"physical reference: {dtype} matmul {rate:.0f} GFLOP/s on this CPU; run (b) needed "
          f"{needed:.3e} FLOPs = {needed / 1e9 / rate:.1f} s at that rate; it took "
          f"{wall:.1f} s ({needed / 1e9 / wall:.1f} GFLOP/s achieved, "
          f"{needed / 1e9 / wall / rate:.0%} of the matmul rate)")


def main() -> None:
    args = parse_args()

    import torch

    torch.set_num_threads(args.threads)
    skip = set(args.skip.split(",")) - {""}
    models = load_models(args, skip)
    order = [k for k in ("a", "b", "c", "d-loop", "d-hf") if k in models and k not in skip]
    results = run_pairs(models, order, args)
    med = print_medians(results, args)
    if "c" in med and "b" in med:
        print(f"(c) / (b) wall: {med['c'] / med['b']:.3f} (target within 5%)")
    if "d-loop" in med:
        print_loop_comparison(results, args)
    if "b" in med and results["b"][0]["flops"]:
        print_physical_reference(models["b"], results["b"][0], med["b"])
    speedup = None
    if "b" in med and "a" in med:
        ratios = [a["wall"] / b["wall"] for a, b in zip(results["a"], results["b"])]
        speedup = statistics.median(ratios)
    if args.out:
        write_record(args, models, results, speedup)
    if speedup is not None:
        print(f"speedup {speedup:.2f}")


def write_record(args: argparse.Namespace, models: dict, results: dict[str, list[dict]],
                 speedup: float | None) -> None:
    """The figures as JSON: each side's runs (wall, useful tokens, accuracy; no texts), its
    dtype and batching, and the machine that ran them."""
    import json
    from pathlib import Path

    from lm_eval_ponder import backbone as bb

    keep = ("wall", "tokens", "acc", "n", "flops")
    sides = {name: {"dtype": str(models[name].model.dtype), "batch_size": models[name].batch_size,
                    "max_rows": getattr(models[name], "max_rows", None),
                    "runs": [{k: r[k] for k in keep} for r in rs]}
             for name, rs in results.items()}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({
        "device": bb.device_description("cpu"), "threads": args.threads, "task": "arith_ponder",
        "limit": args.limit, "max_gen_toks": args.max_gen_toks, "pairs": args.pairs,
        "sides": sides, "speedup": speedup}, indent=1) + "\n")


if __name__ == "__main__":
    main()
