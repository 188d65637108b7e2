"""Drawing the next token when sampling, two steps of the same distribution:
``--compare draw``: ``torch.multinomial`` over the whole vocabulary against
``sampling.draw_tokens`` (drawn among the positive entries only); ``--compare top-k`` (the
default): ``TokenChooser``'s full path (float32 copy, temperature and top-k warpers over the
whole vocabulary, softmax, ``draw_tokens``) against ``TokenChooser.draw_top_k`` (the same
from each row's 2k+1 largest logits).

Not a test: a timing run, in one process, interleaved pairs, medians reported.

1. Alone: [rows, vocab] logits (``top-k``: bf16, the model's own) or probabilities after
   temperature 0.7 and top-k 50 (``draw``), what ``do_sample=True, temperature=0.7`` gets from
   SmolLM2's generation config.
2. End to end: ``generate_rows`` on the embedded SmolLM2-135M, sampled arith-style prompts,
   once each way (the older way patched in).

    python benchmarks/sampling_draw.py --pairs 5 [--compare draw]
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

    from lm_eval_ponder.engine.sampling import draw_tokens

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


def choice_alone(rows: int, vocab: int, pairs: int, reps: int = 10) -> None:
    from lm_eval_ponder.engine.sampling import ChoiceRows, SamplingConfig, TokenChooser

    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(rows, vocab, generator=g) * 3).bfloat16()
    cfg = SamplingConfig(do_sample=True, temperature=0.7, top_k=50, generator=g)
    chooser = TokenChooser(cfg, torch.device("cpu"), [0], prompt_width=1)
    assert chooser.top_k_only
    state = ChoiceRows(torch.zeros(rows, dtype=torch.long), torch.zeros(rows, dtype=torch.long),
                       None, None)
    ratios = []
    for i in range(pairs):
        old = timed(lambda: [chooser.process_and_choose(logits, state.counts, state.last, None,
                                                        None) for _ in range(reps)]) / reps
        new = timed(lambda: [chooser.choose(logits, state, 0) for _ in range(reps)]) / reps
        ratios.append(old / new)
        print(f"choice, pair {i}: full path {old * 1e3:.1f} ms, top-k path {new * 1e3:.1f} ms, "
              f"x{old / new:.1f}", flush=True)
    print(f"choice alone ({rows} x {vocab}, bf16): median speed-up x{statistics.median(ratios):.1f}")


def end_to_end(prompts: int, max_new: int, max_rows: int, dtype: str, pairs: int,
               compare: str) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import lm_eval_ponder.engine.sampling as generation
    from lm_eval_ponder import backbone as bb
    from lm_eval_ponder.engine.config import LoopConfig
    from lm_eval_ponder.engine.loop import generate_rows
    from lm_eval_ponder.engine.sampling import SamplingConfig

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
                            eos_token_ids=eos, pad_token_id=tok.pad_token_id,
                            sampling=cfg, config=LoopConfig(max_rows=max_rows))
        return time.perf_counter() - t0, sum(res.gen_tokens)

    if compare == "draw":
        owner, name, older = generation, "draw_tokens", full_draw
    else:
        owner, name, older = generation.TokenChooser, "draw_top_k", lambda self, logits: None
    real = getattr(owner, name)
    ratios = []
    for i in range(pairs):
        setattr(owner, name, older)
        try:
            old, old_tok = run(i)
        finally:
            setattr(owner, name, real)
        new, new_tok = run(i)
        # rows draw differently, so compare useful tokens per second, not wall alone
        ratio = (new_tok / new) / (old_tok / old)
        ratios.append(ratio)
        print(f"generate_rows, pair {i}: before {old_tok / old:.0f} tok/s ({old:.1f} s), "
              f"{name} {new_tok / new:.0f} tok/s ({new:.1f} s), x{ratio:.2f}", flush=True)
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
    p.add_argument("--compare", default="top-k", choices=["top-k", "draw"])
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    if args.compare == "draw":
        draw_alone(args.rows, args.vocab, args.pairs)
    else:
        choice_alone(args.rows, args.vocab, args.pairs)
    if not args.skip_end_to_end:
        end_to_end(args.prompts, args.max_new_tokens, args.max_rows, args.dtype, args.pairs,
                   args.compare)


if __name__ == "__main__":
    main()
