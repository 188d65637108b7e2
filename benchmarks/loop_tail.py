"""Where throughput.py's (d) ratio goes: the loop's decode forwards by rows in flight, against
``model.generate`` in HFLM's fixed batches, on the same prompts (issue 36).

Not a test: a timing run. The prompts are the first ``--limit`` arith documents as the suite's
greedy Direct run sent them (chat template; read from its committed samples log), ordered as
HFLM orders them (longest first). Hooks on the model time every forward and record its rows, so
the output splits each path's wall time into prefill, decode forwards by rows in flight, and
host time, and gives the loop's forward count. ``--admit-fractions`` runs the loop once per
value, in the order given (repeat values to interleave pairs), ``--hf`` adds ``generate``.
``--requests-per-call K`` hands the loop the prompts K at a time, as ``PonderLM`` once handed
HFLM's batches (``REQUESTS_PER_ROW x max_rows`` requests per call; ``generate_until`` now hands
each request group whole): each call ends in its own tail.

    python benchmarks/loop_tail.py --threads 1 --admit-fractions 0.5 0.125 0.125 0.5
    python benchmarks/loop_tail.py --threads 1 --hf --admit-fractions 0.5
    python benchmarks/loop_tail.py --threads 1 --dtype bfloat16 --limit 256 --rows 16 \
        --max-new-tokens 128 --requests-per-call 0 64 64 0    # 0: all in one call

Last line: ``loop_forwards <forwards of the last loop run>``.
"""

from __future__ import annotations

import argparse
import collections
import json
import lzma
import statistics
import time
from pathlib import Path

from lib.decoding import embedded_tokenizer, padding_bound

SUITE_ARITH = Path(__file__).resolve().parents[1] / "results/suite/greedy/Direct/arith"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The options, ``--samples`` defaulting to the suite's committed arith Direct log."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--limit", type=int, default=100)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--rows", type=int, default=64)
    p.add_argument("--admit-fractions", type=float, nargs="*", default=[0.5])
    p.add_argument("--requests-per-call", type=int, nargs="*", default=[0],
                   help="loop runs hand it this many prompts per call (0: all); with several "
                        "values, each admit fraction runs once per value")
    p.add_argument("--hf", action="store_true", help="also run model.generate in batches of --rows")
    p.add_argument("--dtype", default="float32", help="throughput.py's (d) runs float32")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--samples", type=Path, default=None,
                   help="a samples log whose prompts to use (default: the suite's arith Direct)")
    args = p.parse_args(argv)
    if args.samples is None:
        from lib.replay import unpack_records

        unpack_records(SUITE_ARITH)  # committed as results/suite.tar.xz
        args.samples = next(iter(sorted(SUITE_ARITH.glob("*/samples_*.compact.jsonl.xz"))), None)
    if args.samples is None or not args.samples.exists():
        raise SystemExit(f"no samples log at {args.samples}: pass --samples")
    return args


def summarise(calls: list[list], name: str, wall: float, tokens: int) -> int:
    """One path's wall time split into prefill, decode forwards (by rows in flight, in
    power-of-two buckets) and host time, from the forwards the hooks recorded; returns the
    number of decode forwards."""
    prefill = [c for c in calls if c[1] > 1]
    decode = [c for c in calls if c[1] == 1]
    forward = sum(c[2] for c in calls)
    print(f"{name}: wall {wall:.1f} s, {tokens} tokens; prefill {sum(c[2] for c in prefill):.1f} "
          f"s in {len(prefill)} calls; decode forwards {sum(c[2] for c in decode):.1f} s in "
          f"{len(decode)} calls, {sum(c[0] for c in decode)} row-steps; host "
          f"{wall - forward:.1f} s", flush=True)
    buckets: dict[int, list[float]] = collections.defaultdict(list)
    for rows, _, seconds in decode:
        buckets[1 << (rows - 1).bit_length()].append(seconds)
    for b in sorted(buckets):
        print(f"    rows <= {b:4d}: {len(buckets[b]):4d} forwards, "
              f"{statistics.median(buckets[b]) * 1e3:7.1f} ms median, {sum(buckets[b]):6.1f} s")
    return len(decode)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    import torch
    from transformers import AutoModelForCausalLM

    from lm_eval_ponder import backbone as bb
    from lm_eval_ponder.engine import LoopConfig, SamplingConfig, generate_rows

    torch.set_num_threads(args.threads)
    tok = embedded_tokenizer()
    tok.padding_side = "left"
    dtype = getattr(torch, args.dtype)
    model = AutoModelForCausalLM.from_pretrained(bb.resolve_backbone(None).path,
                                                 dtype=dtype).eval()
    with lzma.open(args.samples, "rt") as f:
        docs = sorted((json.loads(line) for line in f), key=lambda r: r["doc_id"])[:args.limit]
    prompts = [d["arguments"]["gen_args_0"]["arg_0"] for d in docs]
    length = {s: len(tok(s).input_ids) for s in prompts}
    prompts.sort(key=lambda s: -length[s])  # HFLM's order: longest first
    lengths = [length[s] for s in prompts]
    print(f"# {bb.device_description('cpu')}, {dtype}, threads {args.threads}, {len(prompts)} "
          f"prompts, {args.max_new_tokens} new tokens, {args.rows} rows")

    calls: list[list] = []  # [rows, new positions, seconds]

    def before(module, a, kw):
        calls.append([kw["input_ids"].shape[0], kw["input_ids"].shape[1], time.perf_counter()])

    def after(module, a, kw, out):
        calls[-1][2] = time.perf_counter() - calls[-1][2]

    hooks = [model.register_forward_pre_hook(before, with_kwargs=True),
             model.register_forward_hook(after, with_kwargs=True)]

    forwards = 0
    try:
        runs = [("loop", (a, k)) for a in args.admit_fractions for k in args.requests_per_call]
        runs += [("hf", None)] if args.hf else []
        for kind, admit in runs:
            calls.clear()
            start = time.perf_counter()
            if kind == "loop":
                admit, per_call = admit
                chunks = [prompts[i:i + (per_call or len(prompts))]
                          for i in range(0, len(prompts), per_call or len(prompts))]
                gen_tokens, joins = [], 0
                for chunk in chunks:
                    enc = tok(chunk, return_tensors="pt", padding=True)
                    res = generate_rows(model, enc.input_ids, enc.attention_mask,
                                                   max_new_tokens=args.max_new_tokens,
                                                   eos_token_ids={tok.eos_token_id},
                                                   pad_token_id=tok.pad_token_id,
                                                   stop=[tok.decode([tok.eos_token_id])],
                                                   decode=lambda ids: tok.decode(
                                                       ids, skip_special_tokens=True),
                                                   sampling=SamplingConfig(),
                                                   config=LoopConfig(max_rows=args.rows,
                                                                     admit_fraction=admit))
                    gen_tokens += list(res.gen_tokens)
                    joins += res.joins
                forwards = summarise(calls, f"loop, admit_fraction {admit}, {len(chunks)} call(s) "
                                     f"({joins} joins)", time.perf_counter() - start,
                                     sum(gen_tokens))
                print(f"    padding bound at batch {args.rows}: "
                      f"x{padding_bound(lengths, gen_tokens, args.rows):.2f}")
            else:
                tokens = 0
                for i in range(0, len(prompts), args.rows):
                    enc = tok(prompts[i:i + args.rows], return_tensors="pt", padding=True)
                    with torch.no_grad():
                        out = model.generate(**enc, max_new_tokens=args.max_new_tokens,
                                             do_sample=False, pad_token_id=tok.pad_token_id)
                    tokens += int((out[:, enc.input_ids.shape[1]:] != tok.pad_token_id).sum())
                summarise(calls, f"generate, batch {args.rows}", time.perf_counter() - start, tokens)
    finally:
        for h in hooks:
            h.remove()
    print(f"loop_forwards {forwards}")
    return forwards


if __name__ == "__main__":
    main()
