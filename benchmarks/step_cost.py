"""Where a decode step's time goes: the model's forward, token choice, stop checks and
accounting, cache bookkeeping; our generation loop against HFLM's path (``model.generate``
with lm-eval's stop criterion), at 16, 64 and 256 rows.

Not a test: a timing run (issue 36). In one process, for each model and row count, interleaved
pairs of
  - ``generate_rows`` with a ``StepTimer`` (phases: ``forward`` = the model call, ``choose``,
    ``finish`` = storing tokens, the flags read-back and stop checks, ``cache`` = masks,
    positions, compaction, joins; ``prefill`` = the prefill forwards);
  - HFLM's ``_model_generate`` path: ``model.generate`` with ``stop_sequences_criteria``; the
    forward is timed by hooks on the model, the stop criterion by wrapping it, the rest is
    ``generate``'s own per-step work (logits processing, choice, bookkeeping).
Host time per step = wall time of the decode steps minus their forwards, over decode steps.
The prompts are arith questions in the embedded tokenizer's chat template; ``until`` is the
EOS text, as lm-eval sets it. The tiny model (a 2-layer random Llama with the embedded
tokenizer's 49,152-token vocabulary) makes the forward cheap, as a small model is on a GPU, so
host work shows. On CUDA every phase boundary synchronises (attribution, not speed).

    python benchmarks/step_cost.py --pairs 3                # this CPU, both models
    python benchmarks/step_cost.py --device cuda --models tiny embedded

Last line: ``host_ms_per_step <our loop, 256 rows, tiny model>``.
"""

from __future__ import annotations

import argparse
import statistics
import sys

from lib.decoding import (
    add_device_args,
    arith_chat_prompts,
    embedded_tokenizer,
    run_hf,
    run_loop,
    tiny_model,
    torch_setup,
)


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--rows", type=int, nargs="+", default=[16, 64, 256])
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--models", nargs="+", default=["tiny", "embedded"],
                        choices=["tiny", "embedded"])
    add_device_args(parser)
    parser.add_argument("--join-rows", type=int, default=0,
                        help="also run this many prompts with a quarter of them in flight, and "
                             "print the cost of a join and of a compaction")
    args = parser.parse_args(argv)

    import torch
    from transformers import AutoModelForCausalLM

    from lm_eval_ponder import backbone as bb

    dtype = torch_setup(args)
    path = bb.resolve_backbone(None).path
    tok = embedded_tokenizer()
    stop = [tok.decode([tok.eos_token_id])]  # lm-eval's until: the EOS text
    print(f"# {bb.device_description(args.device)}, {dtype}, threads {torch.get_num_threads()}, "
          f"{args.max_new_tokens} new tokens, until {stop}, medians of {args.pairs} pairs")
    print("model     rows  path  step_ms  host_ms  phases (ms/step)")
    host_at: dict[tuple[str, int, str], dict[str, float]] = {}
    for name in args.models:
        model = tiny_model(len(tok), args.device, dtype) if name == "tiny" else \
            AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(args.device).eval()
        for rows in args.rows:
            enc = tok(arith_chat_prompts(tok, rows), return_tensors="pt",
                      padding=True).to(args.device)
            runners = {"loop": run_loop, "hf": run_hf}
            runs: dict[str, list[dict]] = {path: [] for path in runners}
            run_hf(model, tok, enc, 2, stop, args.device)  # warm-up: kernels, allocator, ...
            run_loop(model, tok, enc, 2, stop, args.device)  # ... and the stop-token table
            for pair in range(args.pairs):
                order = list(runs) if pair % 2 == 0 else list(runs)[::-1]
                for path_name in order:
                    runs[path_name].append(runners[path_name](model, tok, enc,
                                                              args.max_new_tokens, stop,
                                                              args.device))
            for path_name, rs in runs.items():
                med = {k: statistics.median(r[k] for r in rs) for k in ("step_ms", "host_ms")}
                phases = {k: statistics.median(r["phases"].get(k, 0.0) for r in rs)
                          for k in rs[0]["phases"]}
                host_at[(name, rows, path_name)] = med
                print(f"{name:8s} {rows:5d}  {path_name:4s}  {med['step_ms']:7.2f}  "
                      f"{med['host_ms']:7.2f}  "
                      + "  ".join(f"{k} {v:.2f}" for k, v in phases.items()), flush=True)
            ratio = host_at[(name, rows, "loop")]["host_ms"] / host_at[(name, rows, "hf")]["host_ms"]
            print(f"{name:8s} {rows:5d}  host time, loop / hf: {ratio:.2f}", flush=True)
        del model
    if args.join_rows:  # rows joining a running batch: what a join and a compaction cost
        for name in args.models:
            model = tiny_model(len(tok), args.device, dtype) if name == "tiny" else \
                AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(args.device).eval()
            enc = tok(arith_chat_prompts(tok, args.join_rows), return_tensors="pt",
                      padding=True).to(args.device)
            r = run_loop(model, tok, enc, args.max_new_tokens, stop, args.device,
                         max_rows=args.join_rows // 4)
            print(f"{name:8s} {args.join_rows} rows, {args.join_rows // 4} in flight: "
                  f"{r['joins']} joins, {r['join_ms'] / max(r['joins'], 1):.2f} ms each; "
                  f"{r['compactions']} compactions, "
                  f"{r['compact_ms'] / max(r['compactions'], 1):.2f} ms each; "
                  f"step {r['step_ms']:.2f} ms", flush=True)
            del model
    key = ("tiny", max(args.rows), "loop")
    value = host_at.get(key, {}).get("host_ms", float("nan"))
    print(f"host_ms_per_step {value:.3f}")
    return value


if __name__ == "__main__":
    main()
    sys.exit(0)
