"""The static layout end to end: ``generate_rows`` with ``decode_step=dynamic`` against
``captured``, on the same prompts, in one process (issues 36, 54).

``gpu_check.py`` times whole lm-eval runs, so a captured step's recording and its tail (static
slots decode every slot until the last long answer ends) hide in one wall time. Here a warm-up
call of the same shape pays the recording first (reported), then interleaved
pairs time the decode alone: wall, useful tokens/s, decode forwards and the tokens that match
the dynamic loop's. Prompts are arith questions in the embedded tokenizer's chat template, more
than ``--max-rows`` so that rows join as others finish.

    python benchmarks/static_step.py --pairs 3 --threads 1   # this CPU: the layout, eagerly
    python benchmarks/static_step.py --device cuda --prompts 512 --max-rows 256 \\
        --max-new-tokens 500

``captured-flat`` keeps every slot to the end (``LoopConfig(shrink_tail=False)``); ``captured``
moves the tail to fewer slots (``slots.tail_slots``), as ``--model ponder`` does.

Last line: ``static_over_dynamic <wall ratio of the first mode, median of pairs>`` (below 1:
the static mode is faster).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import traceback
from typing import Any

from lib.decoding import (
    ONE_AND_TWO_DIGITS,
    add_device_args,
    arith_chat_prompts,
    embedded_tokenizer,
    torch_setup,
)


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modes", nargs="+", default=["captured", "captured-flat"],
                        choices=["captured", "captured-flat"])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=96)
    parser.add_argument("--max-rows", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    add_device_args(parser)
    args = parser.parse_args(argv)

    import torch
    from transformers import AutoModelForCausalLM

    from lm_eval_ponder import backbone as bb
    from lm_eval_ponder.engine import LoopConfig, decode_forward, generate_rows

    dtype = torch_setup(args)
    tok = embedded_tokenizer()
    model = AutoModelForCausalLM.from_pretrained(bb.resolve_backbone(None).path,
                                                 dtype=dtype).to(args.device).eval()
    enc = tok(arith_chat_prompts(tok, args.prompts, bounds=ONE_AND_TWO_DIGITS),
              return_tensors="pt", padding=True).to(args.device)
    stop = [tok.decode([tok.eos_token_id])]

    def run(mode: str) -> tuple[float, list[list[int]], Any]:
        """Wall seconds, each row's generated tokens, and the ``GenerationResult``."""
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        start = time.perf_counter()
        res = generate_rows(model, enc.input_ids, enc.attention_mask,
                            max_new_tokens=args.max_new_tokens,
                            eos_token_ids={tok.eos_token_id},
                            pad_token_id=tok.pad_token_id, stop=stop,
                            decode=lambda ids: tok.decode(ids, skip_special_tokens=True),
                            config=LoopConfig(max_rows=args.max_rows,
                                              decode_step=mode.removesuffix("-flat"),
                                              shrink_tail=not mode.endswith("-flat")))
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        wall = time.perf_counter() - start
        width = enc.input_ids.shape[1]
        rows = [row[width:width + n] for row, n in zip(res.sequences.tolist(), res.gen_tokens)]
        return wall, rows, res

    print(f"# {bb.device_description(args.device)}, {dtype}, threads {torch.get_num_threads()}, "
          f"{args.prompts} prompts, {args.max_rows} rows in flight, {args.max_new_tokens} new "
          f"tokens, medians of {args.pairs} interleaved pairs")
    warm, failed = {}, {}
    for mode in ("dynamic", *args.modes):  # warm-up: kernels, and a graph mode's capture
        try:
            warm[mode] = run(mode)[0]
        except Exception as e:  # a mode that fails on this device must not hide the others
            if mode == "dynamic":
                raise
            traceback.print_exc()  # the whole log comes back with the device call's files
            failed[mode] = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
            print(f"{mode} failed: {failed[mode]}", flush=True)
    print("warm-up s: " + ", ".join(f"{m} {s:.1f}" for m, s in warm.items()))
    print(f"captured: {decode_forward(model).summary()}")
    print("mode             wall_s  dynamic_s  ratio  useful_tok/s  forwards  dead_slots  "
          "tail_moves  same_tokens")
    first = float("nan")
    for mode in [m for m in args.modes if m not in failed]:
        ratios, walls, dyn_walls = [], [], []
        for pair in range(args.pairs):
            order = ("dynamic", mode) if pair % 2 == 0 else (mode, "dynamic")
            got = {m: run(m) for m in order}
            ratios.append(got[mode][0] / got["dynamic"][0])
            walls.append(got[mode][0])
            dyn_walls.append(got["dynamic"][0])
        d_rows, s_rows = got["dynamic"][1], got[mode][1]
        mine, dyn = got[mode][2], got["dynamic"][2]
        same = sum(a == b for a, b in zip(d_rows, s_rows)) / len(d_rows)
        ratio = statistics.median(ratios)
        first = ratio if first != first else first
        print(f"{mode:15s}  {statistics.median(walls):6.2f}  {statistics.median(dyn_walls):9.2f}"
              f"  {ratio:5.2f}  {sum(mine.gen_tokens) / statistics.median(walls):12.1f}  "
              f"{mine.decode_forwards:8d}  {mine.dead_row_slots:10d}  {mine.tail_moves:10d}  "
              f"{same:11.1%}  (dynamic: {dyn.decode_forwards} forwards, "
              f"{sum(dyn.gen_tokens) / statistics.median(dyn_walls):.1f} tok/s)", flush=True)
    print(f"static_over_dynamic {first:.3f}")
    return first


if __name__ == "__main__":
    main()
    sys.exit(0)
