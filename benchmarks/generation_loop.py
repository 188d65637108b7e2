"""generate_rows vs model.generate on the embedded SmolLM2-135M (bf16), arith-style prompts.

Not a test: a timing run. In one process, several interleaved rounds of
  - HF ``model.generate`` (greedy, batch = all prompts, HFLM's stop criterion on the EOS string),
  - ``generate_rows`` on the same batch (rows leave when done),
  - ``generate_rows`` with ``--max-rows`` in flight and waiting rows joining at each
    ``--admit-fractions`` value (1.0 = no joining: the next chunk starts when the batch is empty).
Per round it prints wall time, useful generated tokens/s (each row's tokens up to and including
its EOS, counted on HF's output), the speed ratio over ``generate`` and the fraction of rows
whose generated tokens are identical to ``generate``'s; then the median ratios.

    python benchmarks/generation_loop.py --pairs 3

The brief's machine had AVX-512 with native bf16; a VM with only AVX2 runs bf16 matmuls several
times slower than fp32 (measured: 0.9 vs 54 GFLOP/s at 1024^2), hence ``--dtype``. On a shared
machine, ``--omp-passive`` sets OMP_WAIT_POLICY=PASSIVE before torch loads: spinning OpenMP
threads that lose their core to another process slow every parallel region down many-fold.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from lib.decoding import ONE_AND_TWO_DIGITS, arith_chat_prompts


def rows_until_eos(tokens: list[list[int]], eos: set[int]) -> list[list[int]]:
    out = []
    for row in tokens:
        cut = next((i + 1 for i, t in enumerate(row) if t in eos), len(row))
        out.append(row[:cut])
    return out


def parse_args() -> argparse.Namespace:
    """The options; ``--omp-passive`` takes effect here, before torch is imported."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--max-rows", type=int, default=32,
                        help="rows in flight for the joining runs (0: skip them)")
    parser.add_argument("--admit-fractions", type=float, nargs="*", default=[0.5, 1.0],
                        help="join when this fraction of --max-rows slots is free (1.0: no join)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--omp-passive", action="store_true",
                        help="OMP_WAIT_POLICY=PASSIVE (set before torch is imported)")
    parser.add_argument("--noise-baseline", action="store_true",
                        help="also run generate in chunks of --max-rows once, to show how much "
                             "batch composition alone changes greedy tokens in this dtype")
    args = parser.parse_args()
    if args.omp_passive:
        if "torch" in sys.modules:
            raise SystemExit("--omp-passive must be applied before torch is imported")
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    return args


def time_round(order: list, run_hf, run_loop, n_rows: int) -> tuple[dict, dict, dict]:
    """Each side once, in ``order``: (wall seconds, generated tokens per row, what each did:
    generate's steps, the loop's forwards, row-slots and joins)."""
    times, outs, infos = {}, {}, {}
    for name, kw in order:
        t = time.perf_counter()
        if kw is None:
            outs[name], steps = run_hf()
            infos[name] = f"{steps} steps x {n_rows} rows"
        else:
            outs[name], res = run_loop(**kw)
            infos[name] = (f"{res.decode_forwards} decode fwd, {res.decode_row_slots} "
                           f"row-slots, {res.prefill_forwards} prefill, {res.joins} joins")
        times[name] = time.perf_counter() - t
    return times, outs, infos


def print_round(pair: int, names: list[str], times: dict, outs: dict, infos: dict, n_rows: int,
                ratios: dict[str, list[float]]) -> None:
    """One round's line per side: wall, useful tokens/s and, against ``generate``, the speed
    ratio (kept in ``ratios``) and the rows whose tokens are identical."""
    ref = outs["generate"]
    useful = sum(len(r) for r in ref)
    print(f"\npair {pair + 1}: {useful} useful tokens "
          f"({useful / (n_rows * max(len(r) for r in ref)):.0%} of generate's "
          f"decoded slots)")
    for name in names:
        line = f"  {name:28s} {times[name]:7.2f} s  {useful / times[name]:7.1f} tok/s"
        if name != "generate":
            ratio = times["generate"] / times[name]
            ratios[name].append(ratio)
            same = sum(a == b for a, b in zip(outs[name], ref)) / len(ref)
            line += f"  x{ratio:.2f}  identical {same:.0%}"
        print(f"{line}  [{infos[name]}]")


def print_noise_baseline(args: argparse.Namespace, run_hf, ref: list[list[int]]) -> None:
    """``generate`` in chunks of ``--max-rows`` against one batch: how much batch composition
    alone changes greedy tokens in this dtype (the floor under "identical")."""
    chunks = [list(range(i, min(i + args.max_rows, args.prompts)))
              for i in range(0, args.prompts, args.max_rows)]
    chunked = [row for c in chunks for row in run_hf(c)[0]]
    same = sum(a == b for a, b in zip(chunked, ref)) / len(ref)
    print(f"\nnoise baseline: generate in chunks of {args.max_rows} vs one batch of "
          f"{args.prompts}: identical {same:.0%}")


def main() -> None:
    args = parse_args()
    import torch

    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)

    from lm_eval.models.utils_hf import stop_sequences_criteria
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lm_eval_ponder import backbone as bb
    from lm_eval_ponder.engine.config import LoopConfig
    from lm_eval_ponder.engine.loop import generate_rows
    from lm_eval_ponder.engine.sampling import SamplingConfig

    t0 = time.perf_counter()
    resolved = bb.resolve_backbone(None, None)
    model = AutoModelForCausalLM.from_pretrained(resolved.path, dtype=dtype).eval()
    tok = AutoTokenizer.from_pretrained(resolved.path)
    tok.padding_side = "left"
    print(f"loaded {resolved.name} {args.dtype} in {time.perf_counter() - t0:.1f}s; torch threads "
          f"{torch.get_num_threads()}, cpu {torch.backends.cpu.get_cpu_capability()}, "
          f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'default')}")

    enc = tok(arith_chat_prompts(tok, args.prompts, bounds=ONE_AND_TWO_DIGITS), return_tensors="pt",
              padding=True, add_special_tokens=False)
    ids, mask = enc.input_ids, enc.attention_mask
    width = ids.shape[1]
    until = [tok.eos_token]  # HFLM with `until: []` stops on the EOS string only
    cfg = SamplingConfig.from_kwargs(model.generation_config, do_sample=False)
    eos = set(cfg.eos_token_ids) or {tok.eos_token_id}
    pad = tok.pad_token_id

    def decode(tokens: list[int]) -> str:
        return tok.decode(tokens, skip_special_tokens=True)

    def run_hf(rows=None):
        sub_ids, sub_mask = (ids, mask) if rows is None else (ids[rows], mask[rows])
        crit = stop_sequences_criteria(tok, until, width, sub_ids.shape[0])
        out = model.generate(input_ids=sub_ids, attention_mask=sub_mask,
                             max_length=width + args.max_new_tokens, stopping_criteria=crit,
                             pad_token_id=pad, use_cache=True, do_sample=False)
        return rows_until_eos(out[:, width:].tolist(), eos), out.shape[1] - width

    def run_loop(max_rows=None, admit=0.5):
        res = generate_rows(model, ids, mask, max_new_tokens=args.max_new_tokens,
                            eos_token_ids=eos, pad_token_id=pad, stop=until,
                            decode=decode, sampling=cfg,
                            config=LoopConfig(max_rows=max_rows, admit_fraction=admit))
        gen = [res.sequences[i, width: width + n].tolist() for i, n in enumerate(res.gen_tokens)]
        return gen, res

    variants = [("loop", {})]
    if args.max_rows and args.max_rows < args.prompts:
        variants += [(f"loop rows={args.max_rows} admit={a:g}",
                      {"max_rows": args.max_rows, "admit": a}) for a in args.admit_fractions]
    ratios: dict[str, list[float]] = {name: [] for name, _ in variants}
    with torch.no_grad():
        run_loop(max_rows=8)  # warm-up (allocator, oneDNN kernels) outside the timings
        for pair in range(args.pairs):
            order = [("generate", None)] + variants
            if pair % 2:  # alternate which side runs first
                order = order[1:] + order[:1]
            times, outs, infos = time_round(order, run_hf, run_loop, ids.shape[0])
            print_round(pair, ["generate", *(name for name, _ in variants)], times, outs, infos,
                        ids.shape[0], ratios)
        if args.noise_baseline and args.max_rows and args.max_rows < args.prompts:
            print_noise_baseline(args, run_hf, outs["generate"])
    print("\nmedian speedup over generate:")
    for name, vals in ratios.items():
        listed = ", ".join(f"{v:.2f}" for v in vals)
        print(f"  {name:28s} x{statistics.median(vals):.2f}  ({listed})")


if __name__ == "__main__":
    main()
