"""Speed at the scale users run (issue 54): the loop against HFLM's path on a randomly
initialised backbone of a real architecture, each request replaying a recorded answer length.

Speed does not depend on what the weights are: a random model of the same architecture runs the
same kernels at the same cost. What differs between engines is when rows stop, and that is
replayed: each request generates exactly as many tokens as the same question's greedy Direct
answer had in the committed suite logs (``results/suite/greedy/Direct/<task>``; its prompt
length too, recovered from the logged FLOPs). No stop string and no EOS end a row, so the random
tokens do not matter:

- the loop (``engine.generate_rows`` with a limit per row, batched as ``--model ponder`` batches:
  its ``max_rows`` and cache budget, ``generation.batching``) retires each row at its length;
- HFLM's path (``model.generate`` on batches sorted by prompt length as lm-eval sorts them,
  a per-row length criterion) keeps each batch until its longest row ends, as lm-eval does.
  It is timed at a few batch sizes and the best is the comparison.

Each engine runs in the same process, interleaved in pairs; the table gives medians. Shapes
live in ``benchmarks/shapes/*.json`` (architecture fields of the published configs: no weights,
no download); ``--shape`` also takes a path.

    python benchmarks/scale.py --shape qwen2.5-0.5b --device cpu          # sized to < 10 min
    python benchmarks/scale.py --shape qwen2.5-7b --device cuda --lengths gsm8k --questions 512
    python benchmarks/scale.py --shape tiny --questions 8 --max-new-tokens 16 --pairs 1  # a test

``--out FILE`` writes the figures as JSON (the per-token cost the estimate reads). Last line:
``loop_over_hf <useful tok/s of the loop over HFLM's best batch, median of pairs>``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from lib.decoding import add_device_args, device_defaults, torch_setup
from lib.replay import (
    Memory,
    add_replay_args,
    batch_of,
    build_model,
    measure_step_cost,
    order_of,
    recorded_lengths,
    run_replay,
    shape_config,
)

# On a CPU the run is sized to its machine (``size_run``): the most questions, in steps of 24,
# whose pairs the step's line prices under --budget-s, for these 2-core CPUs are five to seven
# times apart (a Qwen2.5-0.5B decode step, memory-bound, is about 0.55 s + 15 ms a row in float32
# on an AVX2 EPYC and 76 ms + 1.1 ms in bf16 on an AMX Xeon). More questions are closer to a
# user's run (500 arith) and the loop's gain grows with them: at 24 HFLM's one batch holds the
# whole run (bound 1.16x on the AMX Xeon), at 96 the bound is 1.47x. --model hf's widest batch is
# its best where a step is memory-bound, so it is the one timed. --questions turns sizing off.
CPU_DEFAULTS = {"max_new_tokens": 256, "pairs": 3, "budget_s": 420.0}
SIZE_STEP, SIZE_MAX = 24, 480
# the line leaves out prefill and a context that grows past the one it was timed at: measured
# walls were 1.3x its price (AMX Xeon, 0.5B shape, 96 questions), so the budget holds at 1.5x
SIZE_MARGIN = 1.5
GPU_DEFAULTS = {"questions": 500, "max_new_tokens": 500, "hf_batches": [64, 128, 256], "pairs": 2}


class RowLengths:
    """``generate``'s stopping criterion: row i is done once it has generated ``limits[i]``
    tokens (the batch goes on until every row is: lm-eval's batch-wide stop)."""

    def __init__(self, limits: list[int], width: int) -> None:
        import torch

        self.limits, self.width = torch.tensor(limits), width

    def __call__(self, input_ids, scores, **kwargs):
        return (input_ids.shape[1] - self.width) >= self.limits.to(input_ids.device)


def run_hf(model, ids, mask, limits, batch: int) -> dict:
    """HFLM's path: ``generate`` per batch of ``batch`` rows (longest prompts first), each
    batch stripped of its own left padding as HFLM encodes it, until its longest row ends."""
    import torch
    from transformers import StoppingCriteriaList

    start, slots = time.perf_counter(), 0
    with Memory(str(model.device)) as memory, torch.no_grad():
        for lo in range(0, len(limits), batch):
            sub_ids, sub_mask = ids[lo:lo + batch], mask[lo:lo + batch]
            keep = int(sub_mask.sum(dim=1).max())
            sub_ids, sub_mask = sub_ids[:, -keep:], sub_mask[:, -keep:]
            sub = limits[lo:lo + batch]
            out = model.generate(input_ids=sub_ids, attention_mask=sub_mask,
                                 max_new_tokens=max(sub), do_sample=False, pad_token_id=0,
                                 stopping_criteria=StoppingCriteriaList([RowLengths(sub, keep)]))
            slots += len(sub) * (out.shape[1] - keep)
    wall = time.perf_counter() - start
    return {"wall_s": wall, "useful": sum(limits), "peak_gib": memory.gib, "slots": slots}


def parse(argv: list[str] | None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--questions", type=int, default=None,
                        help="questions to replay (default: 500 on a GPU; on a CPU as many as "
                             "fit --budget-s, in steps of 24)")
    parser.add_argument("--hf-batches", type=int, nargs="*", default=None,
                        help="--model hf's batch sizes to time (default: 64 128 256 on a GPU, "
                             "all the questions on a CPU); the flag with no value: the loop alone "
                             "(a cost for the estimate, no ratio)")
    parser.add_argument("--pairs", type=int, default=None,
                        help="interleaved pairs (default: 2 on a GPU; 3 on a CPU, fewer if 24 "
                             "questions do not fit --budget-s)")
    parser.add_argument("--budget-s", type=float, default=None,
                        help="a CPU run without --questions: the seconds its pairs may take as "
                             "the decode step's line prices them (x%.1f; default 420, so the "
                             "whole run stays under 10 minutes)" % SIZE_MARGIN)
    parser.add_argument("--loop-rows", type=int, nargs="*", default=[],
                        help="also time the loop at these max_rows (the sweep that checks the "
                             "default rule; the cache budget still applies)")
    parser.add_argument("--harness", action="store_true",
                        help="also time a 1-question, 1-token lm_eval --model ponder run of the "
                             "embedded model: the start-up every run pays (imports, tasks, "
                             "model load, grading worker) that the estimate adds")
    parser.add_argument("--harness-questions", type=int, default=0,
                        help="with --harness: also run the real lm_eval on this many questions "
                             "at --max-new-tokens and replay the embedded shape on the same "
                             "recorded lengths; the seconds per token the harness spends beyond "
                             "the loop (stop strings, texts, grading in a worker on the same "
                             "cores) go into the record, and the estimate adds them")
    parser.add_argument("--step-cost-rows", type=int, nargs="*", default=None,
                        help="time a decode forward at these row counts, fit seconds = fixed + "
                             "per row x rows, and print the most any row-retiring loop could "
                             "gain over each --model hf batch under it (default: 1, each hf "
                             "batch and the loop's rows, each at most --questions; the flag with no "
                             "value: skip)")
    add_replay_args(parser)
    add_device_args(parser)
    args = parser.parse_args(argv)
    if args.budget_s is not None and args.questions is not None:
        sys.exit("scale: --budget-s sizes --questions; give one or the other")
    sizing = args.budget_s is not None
    args.pairs_given = args.pairs is not None
    device_defaults(args, CPU_DEFAULTS, GPU_DEFAULTS)
    if sizing:
        args.questions = None
    if min(1 if args.questions is None else args.questions, args.max_new_tokens, args.pairs,
           min(args.hf_batches or [1])) < 1 or (args.budget_s or 1) <= 0:
        sys.exit("scale: --questions, --max-new-tokens, --pairs and --hf-batches must be >= 1, "
                 "--budget-s > 0")
    if min(args.step_cost_rows or [1]) < 1:
        sys.exit("scale: --step-cost-rows takes row counts >= 1")
    if args.harness_questions < 0 or (args.harness_questions and not args.harness):
        sys.exit("scale: --harness-questions takes a count >= 0, and --harness with it")
    if args.out:  # before the measurement, which the record would otherwise be lost after
        from lm_eval_ponder.errors import PonderError
        from lm_eval_ponder.files import check_output

        try:
            check_output(Path(args.out), "--out", Path(args.out).parent)
        except PonderError as error:
            sys.exit(f"scale: {error}")
    return args


def main(argv: list[str] | None = None) -> float | None:
    args = parse(argv)
    import torch

    from lm_eval_ponder import backbone as bb
    from lm_eval_ponder.backbone import weight_bytes
    from lm_eval_ponder.generation.batching import Batching

    dtype = torch_setup(args)
    config, name = shape_config(args.shape)
    start = time.perf_counter()
    model = build_model(config, args.device, dtype, args.seed)
    args.load_s = time.perf_counter() - start  # building random weights: a start-up per run
    args.harness_s = harness_seconds(args.lengths, args.device, dtype) if args.harness else 0.0
    batching = Batching(args.max_rows, None, args.device)
    batching.fit(config, dtype, weight_bytes(model))
    loop_config = batching.loop_config()
    args.sized = size_run(args, model, loop_config.max_rows) if args.questions is None else None
    if args.hf_batches is None:
        args.hf_batches = [args.questions]
    lengths = recorded_lengths(f"{args.lengths}", args.questions, args.max_new_tokens)
    args.overhead = harness_overhead(args, dtype, args.harness_s) if args.harness_questions else None
    loops = loop_engines(loop_config, args.loop_rows)
    ids, mask, limits = batch_of(lengths, config.vocab_size, args.device, args.seed)
    params = sum(p.numel() for p in model.parameters())
    print(f"# {bb.device_description(args.device)}, {dtype}, threads {torch.get_num_threads()}, "
          f"shape {name} ({params / 1e9:.2f}B parameters, random), {len(limits)} {args.lengths} "
          f"questions replayed (answers {min(limits)}-{max(limits)}, mean "
          f"{statistics.fmean(limits):.1f} tokens, capped at {args.max_new_tokens}; prompts "
          f"{min(p for p, _ in lengths)}-{max(p for p, _ in lengths)}), loop max_rows "
          f"{loop_config.max_rows}, cache budget {loop_config.max_cache_tokens} positions, "
          f"medians of {args.pairs} interleaved pairs", flush=True)
    warm = [(lengths[i][0], min(limits[i], 4)) for i in range(min(4, len(limits)))]
    w_ids, w_mask, w_limits = batch_of(warm, config.vocab_size, args.device, args.seed)
    for config_ in loops.values():  # kernels, allocator
        run_replay(model, w_ids, w_mask, w_limits, config_)
    if args.hf_batches:
        run_hf(model, w_ids, w_mask, w_limits, min(args.hf_batches))
    engines = {**{k: (lambda c=c: run_replay(model, ids, mask, limits, c)) for k, c in loops.items()},
               **{f"hf-{b}": (lambda b=b: run_hf(model, ids, mask, limits, b))
                  for b in args.hf_batches}}
    runs: dict[str, list[dict]] = {name_: [] for name_ in engines}
    args.step_cost = step_cost(args, model, lengths, loop_config.max_rows)
    for pair in range(args.pairs):
        order = list(engines) if pair % 2 == 0 else list(engines)[::-1]
        for name_ in order:
            runs[name_].append(engines[name_]())
            r = runs[name_][-1]
            print(f"pair {pair}  {name_:15s}  {r['wall_s']:8.2f} s  "
                  f"{r['useful'] / r['wall_s']:9.1f} useful tok/s", flush=True)
    return report(args, name, runs, loops, limits, dtype)


def size_run(args, model, max_rows: int) -> dict:
    """Pick ``--questions`` (and, if the user left them, the pairs) for this machine: the most
    questions, in steps of 24, whose pairs the decode step's line (timed at 1 and 24 rows)
    prices under ``--budget-s`` with a margin. Why: the CPUs these runs meet are five to seven
    times apart, and one fixed size is either the loop's worst case on the fast ones (HFLM's one
    batch holding the whole run) or too long on the slow ones. 24 questions are the floor; if
    they do not fit at the default 3 pairs, the pairs go down to 1 before anything else."""
    every = recorded_lengths(args.lengths, SIZE_MAX, args.max_new_tokens)
    cost = measure_step_cost(model, [1, SIZE_STEP], step_context(every))
    loops = [max_rows, *args.loop_rows]

    def pair_s(n: int) -> float:
        tokens = [every[i][1] for i in order_of(every[:n])]
        return SIZE_MARGIN * (
            sum(cost.retiring_rows(tokens, rows) for rows in loops)
            + sum(cost.fixed_batches(tokens, b)
                  for b in ([n] if args.hf_batches is None else args.hf_batches)))

    pairs = args.pairs
    sizes = range(SIZE_STEP, len(every) + 1, SIZE_STEP)
    fits = [n for n in sizes if pairs * pair_s(n) <= args.budget_s]
    args.questions = fits[-1] if fits else SIZE_STEP
    if not fits and not args.pairs_given:
        pairs = max(1, min(pairs, int(args.budget_s // pair_s(SIZE_STEP))))
    args.pairs = pairs
    predicted = pairs * pair_s(args.questions)
    print(f"sized: {args.questions} questions x {pairs} pair{'s' * (pairs > 1)}, priced {predicted:.0f} s "
          f"(the step's line at 1 and {SIZE_STEP} rows: {cost.fixed_s * 1e3:.1f} ms + "
          f"{cost.per_row_s * 1e3:.2f} ms a row, x{SIZE_MARGIN}) against --budget-s "
          f"{args.budget_s:.0f}" + ("" if fits else f"; {SIZE_STEP} questions do not fit it, "
                                    "the floor runs anyway"),
          flush=True)
    return {"budget_s": args.budget_s, "predicted_s": predicted, "questions": args.questions,
            "pairs": pairs, "fixed_s": cost.fixed_s, "per_row_s": cost.per_row_s}


def step_context(lengths: list[tuple[int, int]]) -> int:
    """The cached positions a decode step is timed over: the mean prompt plus half the mean
    answer, the middle of an average row's decoding."""
    return round(statistics.fmean(p for p, _ in lengths) + statistics.fmean(a for _, a in lengths) / 2)


def step_cost(args, model, lengths: list[tuple[int, int]], max_rows: int):
    """The decode step's line on this device and shape (``lib.replay.StepCost``), timed
    at a context of the mean prompt plus half the mean answer; None when ``--step-cost-rows``
    is given empty or every row count is the same."""
    rows = args.step_cost_rows
    if rows is None:
        rows = [1, *args.hf_batches, max_rows]
    rows = sorted({min(n, args.questions) for n in rows})
    if len(rows) < 2:
        return None
    context = step_context(lengths)
    cost = measure_step_cost(model, rows, context)
    print(f"decode step: {cost.fixed_s * 1e3:.1f} ms + {cost.per_row_s * 1e3:.2f} ms a row "
          f"(at {context} positions; timed " + ", ".join(f"{n} rows {s * 1e3:.1f} ms" for n, s in cost.points)
          + ")", flush=True)
    return cost


def run_harness(lengths: str, device: str, dtype, questions: int, gen_kwargs: str
                ) -> tuple[float, dict]:
    """One real ``lm_eval --model ponder`` run of the embedded backbone, started as the suite
    starts its runs (lm-eval's built-in tasks not indexed): its wall seconds and results."""
    import glob
    import os
    import subprocess
    import tempfile

    from lm_eval_ponder.resources import BUILTIN_TASKS_ENV

    with tempfile.TemporaryDirectory() as out:
        argv = [sys.executable, "-m", "lm_eval", "--model", "ponder", "--device", device,
                "--model_args", f"controller=none,dtype={str(dtype).removeprefix('torch.')}",
                "--tasks", f"{lengths}_ponder", "--apply_chat_template", "--limit",
                str(questions), "--gen_kwargs", gen_kwargs, "--output_path", out]
        start = time.perf_counter()
        done = subprocess.run(argv, capture_output=True, text=True,
                              env={**os.environ, BUILTIN_TASKS_ENV: "0"})
        wall = time.perf_counter() - start
        if done.returncode != 0:
            sys.exit(f"scale: the harness run failed:\n{done.stderr[-2000:]}")
        results = json.loads(Path(sorted(glob.glob(f"{out}/*/results_*.json"))[-1]).read_text())
    return wall, results


def harness_seconds(lengths: str, device: str, dtype) -> float:
    """Wall seconds of ``lm_eval --model ponder`` on one question and one new token (the
    embedded backbone): what a run costs beyond its generation. A bigger backbone's weights
    take longer to load than the embedded one's, so at 7-8B this is a lower bound."""
    wall, _ = run_harness(lengths, device, dtype, 1, "max_gen_toks=1")
    print(f"harness start-up (lm_eval --model ponder, 1 question, 1 token): {wall:.1f} s",
          flush=True)
    return wall


def harness_overhead(args, dtype, startup_s: float) -> dict:
    """What a real run spends per generated token beyond the loop: ``lm_eval --model ponder``
    (the embedded backbone, greedy, ``--harness-questions`` questions at ``--max-new-tokens``)
    minus its start-up, per token it generated, less the loop's own seconds per token when the
    embedded shape replays the same questions' recorded lengths on this machine. On a 2-core CPU
    this is the stop-string checks, the texts and the grading worker competing for the cores;
    the estimate adds it to every shape's cost per token."""
    from lm_eval_ponder.backbone import weight_bytes
    from lm_eval_ponder.generation.batching import Batching

    n, cap = args.harness_questions, args.max_new_tokens
    wall, results = run_harness(args.lengths, args.device, dtype, n,
                                f"max_gen_toks={cap},do_sample=False")
    tokens = results["results"][f"{args.lengths}_ponder"]["gen_tokens,none"] * n
    config, _ = shape_config("smollm2-135m")
    model = build_model(config, args.device, dtype, args.seed)
    batching = Batching(args.max_rows, None, args.device)
    batching.fit(config, dtype, weight_bytes(model))
    lengths = recorded_lengths(args.lengths, n, cap)
    ids, mask, limits = batch_of(lengths, config.vocab_size, args.device, args.seed)
    loop = run_replay(model, ids, mask, limits, batching.loop_config())
    harness_s_tok = (wall - startup_s) / tokens
    loop_s_tok = loop["wall_s"] / loop["useful"]
    print(f"harness on {n} questions: {wall:.1f} s, {tokens:.0f} tokens, "
          f"{harness_s_tok * 1e3:.2f} ms/token after start-up; the embedded shape's loop on "
          f"their recorded lengths {loop_s_tok * 1e3:.2f} ms/token: overhead "
          f"{(harness_s_tok - loop_s_tok) * 1e3:.2f} ms/token", flush=True)
    del model
    return {"questions": n, "wall_s": wall, "tokens": tokens, "harness_s_per_token": harness_s_tok,
            "loop_s_per_token": loop_s_tok, "s_per_token": harness_s_tok - loop_s_tok}


def loop_engines(default, rows: list[int]) -> dict:
    """The loop's configurations to time: ``loop`` (the default rule) first, then each
    ``--loop-rows`` value."""
    from dataclasses import replace

    out = {"loop": default}
    for n in rows:
        out[f"loop-rows{n}"] = replace(default, max_rows=n)
    return out


def report(args, name: str, runs: dict, loops: dict, limits: list[int], dtype) -> float:
    n = len(limits)
    rate = {k: statistics.median(r["useful"] / r["wall_s"] for r in v) for k, v in runs.items()}
    best = max((k for k in runs if k.startswith("hf-")), key=lambda k: rate[k], default=None)
    ratio = None if best is None else statistics.median(
        a["useful"] / a["wall_s"] / (b["useful"] / b["wall_s"])
        for a, b in zip(runs["loop"], runs[best]))
    loop_config = loops["loop"]
    print("engine           rows   wall_s  useful_tok/s  peak_GiB")
    for k, v in runs.items():
        rows = loops[k].max_rows if k in loops else int(k.split("-")[1])
        print(f"{k:15s}  {rows:4d}  {statistics.median(r['wall_s'] for r in v):7.2f}  "
              f"{rate[k]:12.1f}  {max(r['peak_gib'] for r in v):8.2f}"
              + ("  (best hf)" if k == best else ""))
    bounds = {}
    if args.step_cost is not None:
        cost, rows = args.step_cost, loop_config.max_rows
        batches = {f"hf-{b}": b for b in args.hf_batches}
        bounds = {k: cost.bound(limits, b, rows) for k, b in batches.items()}
        print("modelled decode seconds (the step's line, no prefill): " + ", ".join(
            [f"loop at best {cost.retiring_rows(limits, rows):.2f}",
             *(f"{k} {cost.fixed_batches(limits, b):.2f}" for k, b in batches.items())]))
        for k, b in bounds.items():
            print(f"bound_over_{k} {b:.3f} (what retiring rows alone can gain over {k}: both "
                  f"forwards priced by the line; host work and prefill left out"
                  f"{'; the best hf' if k == best else ''})")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({
            "shape": name, "device": args.device, "dtype": str(dtype), "lengths": args.lengths,
            "questions": n, "max_new_tokens": args.max_new_tokens, "pairs": args.pairs,
            "loop_max_rows": loop_config.max_rows, "loop_cache_tokens": loop_config.max_cache_tokens,
            "useful_tok_s": rate, "best_hf": best, "loop_over_hf": ratio,
            "load_s": args.load_s, "harness_s": args.harness_s,
            "harness_overhead": args.overhead,
            "step_cost": None if args.step_cost is None else {
                "fixed_s": args.step_cost.fixed_s, "per_row_s": args.step_cost.per_row_s,
                "points": args.step_cost.points},
            "bound_over_hf": bounds, "sized": args.sized, "runs": runs}, indent=1) + "\n")
    print("loop_over_hf n/a (no --hf-batches)" if ratio is None else f"loop_over_hf {ratio:.3f}")
    return ratio


if __name__ == "__main__":
    main()
