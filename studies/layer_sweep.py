"""Which decoder layer to steer by default: a small sweep on the embedded backbone.

For each layer, fixed offsets of -A and +A (fractions of that layer's mean residual norm) on
the first N arith documents (interleaved levels), greedy, chat template, at most T new tokens,
compared with no steering. A useful steering layer moves output length in the vector's
direction (+: longer, more deliberate; -: shorter) without wrecking accuracy at -A.
Usage: python studies/layer_sweep.py [--layers 6 10 15 20 25] [--alpha 0.2] [--limit 25]
       [--split train]
"""

from __future__ import annotations

import argparse
import time


def evaluate(lm, limit: int, max_toks: int, split: str = "test") -> tuple[float, float]:
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    import lm_eval_ponder_autoload

    out = simple_evaluate(model=lm, tasks=["arith_ponder"], limit=limit,
                          gen_kwargs=f"max_gen_toks={max_toks}", apply_chat_template=True,
                          task_manager=TaskManager(include_path=lm_eval_ponder_autoload.tasks_dir(),
                                                   metadata={"ponder_split": split}))
    metrics = out["results"]["arith_ponder"]
    return metrics["exact_match,none"], metrics["gen_tokens,none"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[6, 10, 15, 20, 25])
    parser.add_argument("--alpha", type=float, default=0.2)
    parser.add_argument("--limit", type=int, default=25)
    parser.add_argument("--max-toks", type=int, default=128)
    parser.add_argument("--split", choices=["test", "train"], default="test",
                        help="arith split (train: the re-selection of issue 52, no test data)")
    args = parser.parse_args()

    from lm_eval_ponder.evaluation.lm import PonderLM

    start = time.perf_counter()
    base_acc, base_tok = evaluate(PonderLM(batch_size=args.limit), args.limit, args.max_toks,
                                  args.split)
    print(f"arith {args.split} split, first {args.limit} docs, max {args.max_toks} new tokens, "
          f"alpha +-{args.alpha}")
    print("| layer | acc (-A) | tokens (-A) | acc (+A) | tokens (+A) |")
    print("| --- | --- | --- | --- | --- |")
    print(f"| none | {base_acc:.2f} | {base_tok:.1f} | {base_acc:.2f} | {base_tok:.1f} |", flush=True)
    for layer in args.layers:
        cells = []
        for alpha in (-args.alpha, args.alpha):
            lm = PonderLM(batch_size=args.limit, alpha=alpha, layer=layer)
            acc, tok = evaluate(lm, args.limit, args.max_toks, args.split)
            cells += [f"{acc:.2f}", f"{tok:.1f}"]
            del lm
        print(f"| {layer} | " + " | ".join(cells) + " |", flush=True)
    print(f"wall {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
