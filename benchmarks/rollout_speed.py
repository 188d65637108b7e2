"""Rollout cache build vs the evaluation loop: useful tokens per second at equal rows and tokens.

Not a test: a timing run (issue 35, "rollouts at loop speed"). In one process, interleaved
pairs of
  - a rollout cache build (``training.rollouts.build_cache``) of ``--prompts`` arith train
    prompts at every one of the K_max + 1 depths: ``prompts x depths`` rows, one generation
    call per block (``generate_texts`` with one offset per row), plus the perplexity pass and
    grading that every cached answer needs;
  - the evaluation loop (``PonderLM.generate``, lm-eval's ``generate_until``) on the same
    ``prompts x depths`` rendered prompts at one fixed offset, with the same rows in flight and
    ``max_gen_toks``.
  - and, for reference, the way the cache was built before: one ``PonderLM.generate`` call
    per depth over the block's prompts (generation only).
Per pair it prints wall time, generated tokens and tokens/s of each, and the ratio
build / eval; the cache's generation alone (without perplexities and grading) is timed inside
the build. Last line: ``rollout_speed_ratio <median>``.

    python benchmarks/rollout_speed.py --pairs 3            # embedded SmolLM2-135M, this CPU
    python benchmarks/rollout_speed.py --device cuda --prompts 64 --max-rows 256
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path


def through_lm_eval(lm, contexts: list[str], gen: dict, alpha: float | None = None) -> list:
    """Contexts as lm-eval requests through ``generate_until`` (its grouping and order), at
    the model's own pondering or one fixed ``alpha``: the path an evaluation takes."""
    from contextlib import nullcontext

    from lm_eval.api.instance import Instance

    from lm_eval_ponder.evaluation.settings import Pondering

    requests = [Instance("generate_until", {}, (c, dict(gen)), i) for i, c in enumerate(contexts)]
    steered = nullcontext() if alpha is None else lm.steered(
        Pondering.fixed(lm.require_steering(), alpha))
    with steered:
        return lm.generate_until(requests, disable_tqdm=True)


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=16, help="arith train prompts")
    parser.add_argument("--max-tokens", type=int, default=64, help="max_gen_toks")
    parser.add_argument("--max-rows", type=int, default=64, help="rows in flight, both sides")
    parser.add_argument("--device", default=None)
    parser.add_argument("--dtype", default=None, help="default: the device's native dtype")
    parser.add_argument("--pretrained", default=None, help="default: the embedded SmolLM2")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    from lm_eval_ponder.evaluation.lm import PonderLM
    from lm_eval_ponder.pondering.dynamics import PonderConfig, cumulative_offsets
    from lm_eval_ponder.training import rollouts

    offsets = cumulative_offsets(PonderConfig()).tolist()
    kwargs = {"max_rows": args.max_rows, "alpha": offsets[0]}
    for key in ("device", "dtype", "pretrained"):
        if getattr(args, key):
            kwargs[key] = getattr(args, key)
    lm = PonderLM(**kwargs)
    cfg = rollouts.RolloutConfig(prompts={"arith_ponder": args.prompts},
                                 max_completion_length=args.max_tokens)
    prompts = rollouts.build_prompts(lm, cfg)
    contexts = [p.context for p in prompts for _ in offsets]
    gen = rollouts.generation_kwargs(cfg)
    from lm_eval_ponder.backbone import device_description

    print(f"# {device_description(str(lm.device))}, {lm.model.dtype}, {lm.backbone_info.name}, "
          f"{len(prompts)} prompts x "
          f"{len(offsets)} depths = {len(contexts)} rows, max_rows {lm.max_rows}, "
          f"max_gen_toks {args.max_tokens}, threads {torch.get_num_threads()}")

    timed: dict[str, float] = {}
    generate_texts = lm.generate_texts

    def timed_generation(*a, **k):  # the build's generation calls alone
        start = time.perf_counter()
        try:
            return generate_texts(*a, **k)
        finally:
            timed["generation_s"] = timed.get("generation_s", 0.0) + time.perf_counter() - start

    lm.generate_texts = timed_generation  # type: ignore[method-assign]
    ratios, gen_ratios, old_ratios = [], [], []
    print("pair  build_s  build_tok  build_tok/s  gen_only_tok/s  eval_s  eval_tok  "
          "eval_tok/s  ratio  gen_only_ratio  per_depth_ratio")
    for pair in range(args.pairs):
        timed.clear()
        with tempfile.TemporaryDirectory() as tmp:
            start = time.perf_counter()
            cache = rollouts.build_cache(lm, cfg, offsets, Path(tmp) / "cache", progress=False)
            build_s = time.perf_counter() - start
            build_tok = sum(r["gen_tokens"] for r in cache.records())
        start = time.perf_counter()
        texts = through_lm_eval(lm, contexts, gen)
        eval_s = time.perf_counter() - start
        eval_tok = sum(t.stats["gen_tokens"] for t in texts)
        start, old_tok = time.perf_counter(), 0
        for offset in offsets:
            old_tok += sum(t.stats["gen_tokens"] for t in
                           through_lm_eval(lm, [p.context for p in prompts], gen, offset))
        old_rate = old_tok / (time.perf_counter() - start)
        build_rate, eval_rate = build_tok / build_s, eval_tok / eval_s
        gen_rate = build_tok / timed["generation_s"]
        ratios.append(build_rate / eval_rate)
        gen_ratios.append(gen_rate / eval_rate)
        old_ratios.append(old_rate / eval_rate)
        print(f"{pair:4d}  {build_s:7.1f}  {build_tok:9d}  {build_rate:11.1f}  {gen_rate:14.1f}  "
              f"{eval_s:6.1f}  {eval_tok:8d}  {eval_rate:10.1f}  {ratios[-1]:5.2f}  "
              f"{gen_ratios[-1]:14.2f}  {old_ratios[-1]:15.2f}")
    print(f"median build/eval {statistics.median(ratios):.2f}, generation only "
          f"{statistics.median(gen_ratios):.2f}, one call per depth (before) "
          f"{statistics.median(old_ratios):.2f}, over {args.pairs} pairs")
    print(f"rollout_speed_ratio {statistics.median(ratios):.3f}")
    return statistics.median(ratios)


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
