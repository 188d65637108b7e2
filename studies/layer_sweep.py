"""Which decoder layer to steer by default: fixed offsets per layer against no steering at all.

For each layer, fixed offsets of -A and +A (fractions of that layer's mean residual norm) on
the first N arith documents (interleaved levels), greedy, chat template, at most T new tokens,
compared with the unsteered backbone (``controller=none``: no offset anywhere; until issue 65 the
"none" row loaded the shipped controller, whose depth 0 is alpha = -0.2 at layer 15, so it
repeated that row). A useful steering layer moves output length in the vector's direction
(+: longer, more deliberate; -: shorter) without wrecking accuracy at -A.
Usage: python studies/layer_sweep.py [--layers 6 10 15 20 25] [--alpha 0.2] [--limit 25]
       [--split train] [--pretrained DIR --steering DIR] [--out record.json]
``--out`` keeps every row's accuracy, mean tokens and correct count as a JSON record, which the
printed table is rebuilt from (``--table record.json``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def evaluate(lm, limit: int, max_toks: int, split: str = "test") -> dict:
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    from lm_eval_ponder.resources import tasks_dir

    out = simple_evaluate(model=lm, tasks=["arith_ponder"], limit=limit,
                          gen_kwargs=f"max_gen_toks={max_toks}", apply_chat_template=True,
                          task_manager=TaskManager(include_path=tasks_dir(),
                                                   metadata={"ponder_split": split}))
    metrics = out["results"]["arith_ponder"]
    return {"accuracy": metrics["exact_match,none"], "tokens": metrics["gen_tokens,none"]}


def table(record: dict) -> str:
    """The markdown table of a sweep record: the unsteered row, then each layer at -A and +A."""
    a, base = record["alpha"], record["unsteered"]
    lines = [f"arith {record['split']} split, first {record['limit']} docs, max "
             f"{record['max_toks']} new tokens, alpha +-{a}"
             + (f", backbone {record['backbone']}" if record.get("backbone") else ""),
             "| layer | acc (-A) | tokens (-A) | acc (+A) | tokens (+A) |",
             "| --- | --- | --- | --- | --- |",
             f"| unsteered (controller=none) | {base['accuracy']:.2f} | {base['tokens']:.1f} | "
             f"{base['accuracy']:.2f} | {base['tokens']:.1f} |"]
    for row in record["layers"]:
        lo, hi = row["minus"], row["plus"]
        lines.append(f"| {row['layer']} | {lo['accuracy']:.2f} | {lo['tokens']:.1f} | "
                     f"{hi['accuracy']:.2f} | {hi['tokens']:.1f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[6, 10, 15, 20, 25])
    parser.add_argument("--alpha", type=float, default=0.2)
    parser.add_argument("--limit", type=int, default=25)
    parser.add_argument("--max-toks", type=int, default=128)
    parser.add_argument("--split", choices=["test", "train"], default="test",
                        help="arith split (train: the re-selection of issue 52, no test data)")
    parser.add_argument("--pretrained", default=None, help="backbone (default: the embedded one)")
    parser.add_argument("--steering", default=None,
                        help="steering-vector directory (default: the one shipped for it)")
    parser.add_argument("--out", default=None, help="also write the sweep as a JSON record")
    parser.add_argument("--table", default=None, help="print the table of a kept record and stop")
    args = parser.parse_args()
    if args.table:
        print(table(json.loads(Path(args.table).read_text())))
        return

    from lm_eval_ponder.evaluation.lm import PonderLM

    common = {"batch_size": args.limit}
    if args.pretrained:
        common["pretrained"] = args.pretrained
    steered = {"steering": args.steering} if args.steering else {}
    start = time.perf_counter()
    plain = PonderLM(controller=None, **common)
    record = {"split": args.split, "limit": args.limit, "max_toks": args.max_toks,
              "alpha": args.alpha, "backbone": args.pretrained, "steering": args.steering,
              "device": plain.device_info(),  # where it ran: the figures depend on the dtype
              "unsteered": evaluate(plain, args.limit, args.max_toks, args.split), "layers": []}
    del plain
    for layer in args.layers:
        row = {"layer": layer}
        for side, alpha in (("minus", -args.alpha), ("plus", args.alpha)):
            lm = PonderLM(alpha=alpha, layer=layer, **common, **steered)
            row[side] = evaluate(lm, args.limit, args.max_toks, args.split)
            del lm
        record["layers"].append(row)
        print(f"layer {layer} done", file=sys.stderr, flush=True)
    record["wall_s"] = round(time.perf_counter() - start)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
    print(table(record))
    print(f"wall {record['wall_s']} s")


if __name__ == "__main__":
    main()
