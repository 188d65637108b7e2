"""Drawing the next token when sampling: ``torch.multinomial`` over the whole vocabulary against
``sampling.draw_tokens`` (the same distribution, drawn among the positive entries only).

Not a test: a timing run, in one process, interleaved pairs, medians reported.

1. The draw alone: [rows, vocab] probabilities after temperature 0.7 and top-k 50 (what
   ``do_sample=True, temperature=0.7`` gets from SmolLM2's generation config).
2. End to end: ``generate_rows`` on the embedded SmolLM2-135M, sampled arith-style prompts,
   once with ``draw_tokens`` and once with the full-vocabulary draw patched in.

    python benchmarks/sampling_draw.py --pairs 5
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from lib.decoding import ONE_AND_TWO_DIGITS, arith_chat_prompts


def full_draw(probs: torch.Tensor, generator: torch.Generator | None = None,
              expected_support: int | None = None) -> torch.Tensor:
    return torch.multinomial(probs, num_samples=1, generator=generator).squeeze(1)


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def draw_alone(rows: int, vocab: int, pairs: int, reps: int = 10) -> None:
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper

    from lm_eval_ponder.evaluation.sampling import draw_tokens

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(rows, vocab, generator=g) * 3
    scores = TopKLogitsWarper(50)(None, TemperatureLogitsWarper(0.7)(None, logits))
    probs = torch.softmax(scores, dim=-1)
    ratios = []
    for i in range(pairs):
        old = timed(lambda: [full_draw(probs, g) for _ in range(reps)]) / reps
        new = timed(lambda: [draw_tokens(probs, g, 50) for _ in range(reps)]) / reps
        ratios.append(old / new)
        print(f"draw, pair {i}: multinomial {old * 1e3:.1f} ms, draw_tokens {new * 1e3:.1f} ms, "
              f"x{old / new:.1f}", flush=True)
    print(f"draw alone ({rows} x {vocab}): median speed-up x{statistics.median(ratios):.1f}")


def end_to_end(prompts: int, max_new: int, max_rows: int, dtype: str, pairs: int) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import lm_eval_ponder.evaluation.sampling as generation
    from lm_eval_ponder import backbone as bb
    from lm_eval_ponder.evaluation.generation import generate_rows
    from lm_eval_ponder.evaluation.sampling import SamplingConfig

    path = bb.resolve_backbone(None, None).path
    tok = AutoTokenizer.from_pretrained(path)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).eval()
    enc = tok(arith_chat_prompts(tok, prompts, bounds=ONE_AND_TWO_DIGITS), return_tensors="pt", padding=True)
    eos = {tok.eos_token_id}

    def run(seed: int) -> tuple[float, int]:
        cfg = SamplingConfig.from_kwargs(model.generation_config, do_sample=True,
                                         temperature=0.7,
                                         generator=torch.Generator().manual_seed(seed))
        t0 = time.perf_counter()
        res = generate_rows(model, enc.input_ids, enc.attention_mask, max_new_tokens=max_new,
                            eos_token_ids=eos, pad_token_id=tok.pad_token_id, sampling=cfg,
                            max_rows=max_rows)
        return time.perf_counter() - t0, sum(res.gen_tokens)

    real = generation.draw_tokens
    ratios = []
    for i in range(pairs):
        generation.draw_tokens = full_draw
        try:
            old, old_tok = run(i)
        finally:
            generation.draw_tokens = real
        new, new_tok = run(i)
        # rows draw differently, so compare useful tokens per second, not wall alone
        ratio = (new_tok / new) / (old_tok / old)
        ratios.append(ratio)
        print(f"generate_rows, pair {i}: full draw {old_tok / old:.0f} tok/s ({old:.1f} s), "
              f"draw_tokens {new_tok / new:.0f} tok/s ({new:.1f} s), x{ratio:.2f}", flush=True)
    print(f"generate_rows ({prompts} prompts, {max_rows} rows in flight, {max_new} new tokens, "
          f"{dtype}, T=0.7): median speed-up in tokens/s x{statistics.median(ratios):.2f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=5)
    p.add_argument("--rows", type=int, default=128)
    p.add_argument("--vocab", type=int, default=49152)
    p.add_argument("--prompts", type=int, default=128)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--max-rows", type=int, default=128)
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--skip-end-to-end", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    draw_alone(args.rows, args.vocab, args.pairs)
    if not args.skip_end_to_end:
        end_to_end(args.prompts, args.max_new_tokens, args.max_rows, args.dtype, args.pairs)


if __name__ == "__main__":
    main()
