"""Prefill in parts (``generation.prefill_parts``) against one padded prefill, on a batch with
one long prompt among short ones (GPQA's shape: its longest question is 2,899 tokens, the
median 168).

    python benchmarks/prefill_parts.py --long 1200 --short 15 --pairs 3

One process, the embedded backbone at its default dtype, one thread. Prompts are random token
ids (no benchmark text): one of ``--long`` tokens and ``--short`` of 120-350, left-padded as
HFLM pads them, ``--new`` greedy tokens each, all rows in one group. Each pair runs both ways
(the order swapped in odd pairs) and says whether they generate the same tokens (in bfloat16 they may
part at near-ties: the padding changes the kernels' blocking; in float32 they agree); prints each
wall and the median ratio one-forward / in-parts.
"""

from __future__ import annotations

import argparse
import statistics
import time


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--long", type=int, default=1200)
    p.add_argument("--short", type=int, default=15)
    p.add_argument("--new", type=int, default=4)
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--dtype", default=None, help="default: the backbone's native dtype")
    args = p.parse_args()

    import torch

    from lm_eval_ponder.engine import loop as generation
    from lm_eval_ponder.engine.config import LoopConfig
    from lm_eval_ponder.evaluation.lm import PonderLM

    torch.set_num_threads(1)
    lm = PonderLM(controller="none", dtype=args.dtype)
    gen = torch.Generator().manual_seed(0)
    lengths = [args.long] + torch.randint(120, 351, (args.short,), generator=gen).tolist()
    width = max(lengths)
    pad = lm.tokenizer.pad_token_id
    ids = torch.full((len(lengths), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, n in enumerate(lengths):
        ids[i, width - n:] = torch.randint(1000, 40000, (n,), generator=gen)
        mask[i, width - n:] = 1
    in_parts = generation.prefill_parts

    def run(split: bool) -> tuple[float, torch.Tensor]:
        generation.prefill_parts = in_parts if split else (lambda rows, _lens: [list(rows)])
        try:
            t = time.perf_counter()
            out = generation.generate_rows(lm.model, ids, mask, max_new_tokens=args.new,
                                           eos_token_ids=set(), pad_token_id=pad,
                                           config=LoopConfig(max_rows=len(lengths)))
            return time.perf_counter() - t, out.sequences
        finally:
            generation.prefill_parts = in_parts

    ratios = []
    for pair in range(args.pairs):
        walls, seqs = {}, {}
        for split in (False, True) if pair % 2 == 0 else (True, False):
            walls[split], seqs[split] = run(split)
        same = bool(seqs[False].equal(seqs[True]))
        ratios.append(walls[False] / walls[True])
        print(f"pair {pair + 1}: one forward {walls[False]:6.1f} s, in parts {walls[True]:6.1f} s, "
              f"ratio {ratios[-1]:.2f}, same tokens: {same}", flush=True)
    real = sum(lengths)
    print(f"\n{len(lengths)} prompts ({args.long} + {args.short} of 120-350 tokens: {real} real, "
          f"{len(lengths) * width} padded), {args.new} new tokens, {lm.model.dtype}: median "
          f"ratio one forward / in parts {statistics.median(ratios):.2f} over {args.pairs} pairs")


if __name__ == "__main__":
    main()
