"""Throughput of generation with pondering off and on, same prompts, same forced length.

On: token granularity with a controller that always runs K_max steps (its last bias is set so
the continue probability is ~1), i.e. the worst case: every generated token scores all K_max+1
candidate states. Batch 16 on the embedded backbone by default. The last line is
`ratio <on/off throughput>` (target >= 0.95 on CPU).

Usage: python benchmarks/ponder_overhead.py [--tokens 64] [--batch 16] [--repeats 5]
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--k-max", type=int, default=8)
    args = parser.parse_args()

    from lm_eval_ponder.data import load_arith
    from lm_eval_ponder.evaluation.lm import PonderLM
    from lm_eval_ponder.pondering.controller import PonderController, save_controller

    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        lm_probe = PonderLM(batch_size=args.batch)
        controller = PonderController(lm_probe.model.config.hidden_size)
        with torch.no_grad():
            [m for m in controller.modules() if isinstance(m, torch.nn.Linear)][-1].bias.fill_(20.0)
        save_controller(controller, tmp)
        lm = PonderLM(batch_size=args.batch, controller=tmp, granularity="token", k_max=args.k_max)
    questions = [d["question"] for d in load_arith("train", per_level=20)][: args.batch]
    chats = [lm.tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                              add_generation_prompt=True) for q in questions]
    enc = lm.tokenizer(chats, return_tensors="pt", padding=True, padding_side="left")
    gen = dict(max_new_tokens=args.tokens, min_new_tokens=args.tokens, do_sample=False,
               pad_token_id=lm.tokenizer.pad_token_id)

    def run(pondering: bool) -> float:
        hook, decider = lm.ponder.hook(lm.model, lm.device) if pondering else (None, None)
        start = time.perf_counter()
        with torch.no_grad():
            if hook is None:
                out = lm.model.generate(**enc, **gen)
            else:
                with hook:
                    out = lm.model.generate(**enc, **gen)
        elapsed = time.perf_counter() - start
        assert out.shape[1] - enc["input_ids"].shape[1] == args.tokens
        if decider is not None:
            assert len(decider.depths) == args.tokens
            assert all(int(d.min()) == args.k_max for d in decider.depths)
        return args.batch * args.tokens / elapsed

    run(False)  # warm-up
    results = {"off": [], "on": []}
    for _ in range(args.repeats):  # interleaved, so machine load affects both alike
        results["off"].append(run(False))
        results["on"].append(run(True))
    # Median of the interleaved pairs' ratios: robust to load that drifts during the run.
    ratios = sorted(on / off for on, off in zip(results["on"], results["off"]))
    print(f"batch {args.batch}, {args.tokens} forced new tokens, k_max {args.k_max}, "
          f"{args.repeats} interleaved pairs, threads {torch.get_num_threads()}")
    print(f"off tokens/s: {', '.join(f'{x:.1f}' for x in results['off'])}")
    print(f"on  tokens/s: {', '.join(f'{x:.1f}' for x in results['on'])}")
    print(f"pair ratios: {', '.join(f'{r:.3f}' for r in ratios)}")
    print(f"ratio {ratios[len(ratios) // 2]:.3f}")


if __name__ == "__main__":
    main()
