"""Does appending a decode step's keys in place (``engine.cache.GrowingLayer``) beat
transformers' ``DynamicLayer``, which copies the whole cache with ``torch.cat`` every step?

The loop replays recorded answer lengths on a random-weight model of a real shape (as
``scale.py`` does) twice per pair, interleaved in one process: with the loop's own cache and
with plain ``DynamicCache`` layers swapped in (``engine.loop.new_cache`` replaced for the run).
Same forwards, same tokens; only the append differs.

    python benchmarks/cache_append.py --shape smollm2-135m --questions 256 --max-new-tokens 500
    python benchmarks/cache_append.py --shape qwen2.5-0.5b --questions 96

Last line: ``growing_over_cat <useful tok/s with GrowingLayer over DynamicLayer, median of
pairs>``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from unittest import mock

from lib.decoding import add_device_args, torch_setup
from lib.replay import (
    add_replay_args,
    batch_of,
    build_model,
    recorded_lengths,
    run_replay,
    shape_config,
)


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--questions", type=int, default=96)
    parser.add_argument("--pairs", type=int, default=3)
    add_replay_args(parser)
    add_device_args(parser)
    args = parser.parse_args(argv)
    if args.questions < 1 or args.pairs < 1:
        sys.exit("cache_append: --questions and --pairs must be >= 1")
    args.max_new_tokens = args.max_new_tokens or 256
    from transformers import DynamicCache

    from lm_eval_ponder import backbone as bb
    from lm_eval_ponder.engine import loop
    from lm_eval_ponder.generation.batching import Batching

    dtype = torch_setup(args)
    config, name = shape_config(args.shape)
    lengths = recorded_lengths(args.lengths, args.questions, args.max_new_tokens)
    model = build_model(config, args.device, dtype, args.seed)
    batching = Batching(args.max_rows, None, args.device)
    batching.fit(config, dtype, bb.weight_bytes(model))
    loop_config = batching.loop_config()
    ids, mask, limits = batch_of(lengths, config.vocab_size, args.device, args.seed)
    print(f"# {bb.device_description(args.device)}, {dtype}, shape {name}, {len(limits)} "
          f"{args.lengths} questions replayed (mean {statistics.fmean(limits):.1f} tokens, "
          f"cap {args.max_new_tokens}), max_rows {loop_config.max_rows}", flush=True)

    def plain(text_config):
        return DynamicCache(config=text_config)

    def growing():
        return run_replay(model, ids, mask, limits, loop_config)

    def cat():
        with mock.patch.object(loop, "new_cache", plain):
            return run_replay(model, ids, mask, limits, loop_config)

    engines = {"growing": growing, "cat": cat}
    warm = batch_of(lengths[:4], config.vocab_size, args.device, args.seed)
    run_replay(model, *warm[:2], [min(n, 4) for n in warm[2]], loop_config)
    runs: dict[str, list[dict]] = {k: [] for k in engines}
    for pair in range(args.pairs):
        for k in (list(engines) if pair % 2 == 0 else list(engines)[::-1]):
            runs[k].append(engines[k]())
            print(f"pair {pair}  {k:8s} {runs[k][-1]['wall_s']:8.2f} s  "
                  f"{runs[k][-1]['useful'] / runs[k][-1]['wall_s']:8.1f} useful tok/s", flush=True)
    ratios = [c["wall_s"] / g["wall_s"] for g, c in zip(runs["growing"], runs["cat"])]
    ratio = statistics.median(ratios)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({
            "shape": name, "device": bb.device_description(args.device), "dtype": str(dtype),
            "questions": len(limits), "max_new_tokens": args.max_new_tokens,
            "max_rows": loop_config.max_rows, "ratios": ratios, "growing_over_cat": ratio,
            "runs": runs}, indent=1) + "\n")
    print(f"pairs: {', '.join(f'{r:.3f}' for r in ratios)}")
    print(f"growing_over_cat {ratio:.3f}")
    return ratio


if __name__ == "__main__":
    main()
