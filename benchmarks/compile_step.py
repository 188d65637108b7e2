"""Does a decode step captured as a CUDA graph pay? The step alone, before the loop.

One decode forward over a ``StaticCache`` of ``--cache-len`` columns with a per-row
[rows, cache-len] attention mask (rows at different lengths, as the static layout keeps them),
eager against the same forward recorded once with ``torch.cuda.graph`` and replayed
(``engine.capture.CapturedForward``, ``decode_step=captured``; on a CPU it is the eager forward,
so the ratio is 1 there). The step is where a small model's launch cost lives: on an H100 an eager
step of the embedded model was 23-27 ms whatever the rows. Two dynamo-based alternatives (dynamo's
``"cudagraphs"`` backend through a custom replay backend, and inductor's ``reduce-overhead``) were
measured here before and deleted with their decode modes (issue 53; docs/results/gpu.md).

Also checked: the static cache with per-row masks decodes the same greedy tokens as the
loop's ``DynamicCache`` from the same prefill (``--check-steps`` steps, float32 advised); the
logits agree to float rounding, not bit for bit (the attention reduces over more, masked,
columns).

    python benchmarks/compile_step.py --pairs 3                    # this CPU, tiny model
    python benchmarks/compile_step.py --device cuda --model embedded --rows 64 256

Last line: ``compiled_over_eager <step-time ratio at the largest row count>`` (below 1: the
captured step is faster).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from lib.decoding import add_device_args, tiny_model, torch_setup

PROMPT = 16  # prefill tokens per row before the timed decode steps


def synchronize(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def decode_inputs(cache_len: int, length: int, lead, device: str):
    """Mask and positions of a decode step writing column ``length``: row i attends to its
    own columns ``lead[i]..length``."""
    import torch

    cols = torch.arange(cache_len, device=device)[None, :]
    mask = ((cols >= lead[:, None]) & (cols <= length)).long()
    return mask, (length - lead)[:, None]


def same_tokens_as_dynamic(model, rows: int, steps: int, vocab: int, device: str,
                           kw: str) -> tuple[float, float]:
    """Greedy decode from one left-padded prefill with the loop's DynamicCache and with a
    StaticCache (per-row masks): the fraction of (row, step) tokens that agree, and the
    largest difference between their logits."""
    import torch
    from transformers import DynamicCache, StaticCache

    gen = torch.Generator().manual_seed(0)
    lens = torch.randint(2, PROMPT + 1, (rows,), generator=gen)
    ids = torch.randint(3, vocab, (rows, PROMPT), generator=gen)
    cols = torch.arange(PROMPT)[None, :]
    lead = (PROMPT - lens)
    mask = (cols >= lead[:, None]).long()
    ids, mask, lead = ids.to(device), mask.to(device), lead.to(device)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    dynamic = DynamicCache(config=model.config)
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, position_ids=pos,
                    **{kw: dynamic}, use_cache=True, logits_to_keep=1)
        static = StaticCache(config=model.config, max_cache_len=PROMPT + steps + 1)
        for src, dst in zip(dynamic.layers, static.layers, strict=True):
            dst.lazy_initialization(src.keys, src.values)
            dst.keys[:, :, :PROMPT] = src.keys
            dst.values[:, :, :PROMPT] = src.values
            dst.cumulative_length.fill_(PROMPT)
        tok_d = tok_s = out.logits[:, -1].argmax(-1)
        agree, worst = 0, 0.0
        for step in range(steps):
            length = PROMPT + step
            pos = (length - lead)[:, None]
            mask_d = (torch.arange(length + 1, device=device)[None, :] >= lead[:, None]).long()
            mask_s, _ = decode_inputs(PROMPT + steps + 1, length, lead, device)
            logits_d = model(input_ids=tok_d[:, None], attention_mask=mask_d, position_ids=pos,
                             **{kw: dynamic}, use_cache=True, logits_to_keep=1).logits[:, -1]
            logits_s = model(input_ids=tok_s[:, None], attention_mask=mask_s, position_ids=pos,
                             **{kw: static}, use_cache=True, logits_to_keep=1).logits[:, -1]
            worst = max(worst, float((logits_d.float() - logits_s.float()).abs().max()))
            tok_d, tok_s = logits_d.argmax(-1), logits_s.argmax(-1)
            agree += int((tok_d == tok_s).sum())
    return agree / (rows * steps), worst


def time_steps(forward, cache, rows: int, cache_len: int, steps: int, vocab: int,
               device: str, kw: str) -> float:
    """Seconds per decode step over ``steps`` steps from column PROMPT."""
    import torch

    lead = torch.zeros(rows, dtype=torch.long, device=device)
    tok = torch.randint(3, vocab, (rows, 1), device=device)
    for layer in cache.layers:
        layer.cumulative_length.fill_(PROMPT)
    synchronize(device)
    t0 = time.perf_counter()
    with torch.no_grad():
        for step in range(steps):
            mask, pos = decode_inputs(cache_len, PROMPT + step, lead, device)
            forward(input_ids=tok, attention_mask=mask, position_ids=pos, **{kw: cache},
                    use_cache=True, logits_to_keep=1)
    synchronize(device)
    return (time.perf_counter() - t0) / steps


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny", choices=["tiny", "embedded"])
    parser.add_argument("--rows", type=int, nargs="+", default=[16, 64, 256])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--cache-len", type=int, default=512)
    parser.add_argument("--check-steps", type=int, default=24)
    add_device_args(parser)
    args = parser.parse_args(argv)

    import torch
    from transformers import AutoModelForCausalLM, StaticCache

    from lm_eval_ponder import backbone as bb
    from lm_eval_ponder.engine import CapturedForward, cache_keyword

    if args.steps < 1 or args.pairs < 1 or args.cache_len < PROMPT + args.steps:
        sys.exit(f"compile_step: need --steps >= 1, --pairs >= 1 and --cache-len >= "
                 f"{PROMPT} + --steps")
    dtype = torch_setup(args)
    if args.model == "tiny":
        model = tiny_model(49152, args.device, dtype)
    else:
        model = AutoModelForCausalLM.from_pretrained(
            bb.resolve_backbone(None).path, dtype=dtype).to(args.device).eval()
    vocab = model.config.vocab_size
    kw = cache_keyword(model)
    print(f"# {bb.device_description(args.device)}, {dtype}, threads {torch.get_num_threads()}, "
          f"{args.model} model, cache {args.cache_len} columns, {args.steps} steps, "
          f"captured with torch.cuda.graph, medians of {args.pairs} interleaved pairs")
    if args.check_steps:
        agree, worst = same_tokens_as_dynamic(model, min(args.rows), args.check_steps, vocab,
                                              args.device, kw)
        print(f"static cache, per-row masks: {agree:.1%} of greedy tokens as the DynamicCache's "
              f"({min(args.rows)} rows x {args.check_steps} steps; logits differ by at most "
              f"{worst:.1e})")
    print("rows  compile_s  eager_ms  compiled_ms  compiled/eager")
    ratio = float("nan")
    for rows in args.rows:
        cache = StaticCache(config=model.config, max_cache_len=args.cache_len)
        ids = torch.randint(3, vocab, (rows, PROMPT), device=args.device)
        with torch.no_grad():
            model(input_ids=ids, **{kw: cache}, use_cache=True, logits_to_keep=1)
        compiled = CapturedForward(model)
        t0 = time.perf_counter()
        time_steps(compiled, cache, rows, args.cache_len, 3, vocab, args.device, kw)  # compile, warm
        compile_s = time.perf_counter() - t0
        time_steps(model.forward, cache, rows, args.cache_len, 3, vocab, args.device, kw)
        eager, fast = [], []
        for pair in range(args.pairs):
            order = ((model.forward, eager), (compiled, fast))
            for forward, into in (order if pair % 2 == 0 else order[::-1]):
                into.append(time_steps(forward, cache, rows, args.cache_len, args.steps, vocab,
                                       args.device, kw))
        e, c = statistics.median(eager), statistics.median(fast)
        ratio = statistics.median(f / s for f, s in zip(fast, eager))
        print(f"{rows:4d}  {compile_s:9.1f}  {1e3 * e:8.2f}  {1e3 * c:11.2f}  {ratio:14.2f}")
        print(f"      {compiled.summary()}")
    print(f"compiled_over_eager {ratio:.3f}")
    return ratio


if __name__ == "__main__":
    main()
