"""Profile of decode steps (torch.profiler) on our loop and on HFLM's path: which ops, syncs
and copies cost host and device time. A diagnostic beside ``step_cost.py``, which times the
phases of the same runs (``lib.decoding``).

    python benchmarks/profile_step.py --device cuda --rows 256 --model tiny
"""

from __future__ import annotations

import argparse

from lib.decoding import arith_chat_prompts, run_hf, run_loop, tiny_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--model", default="tiny", choices=["tiny", "embedded"])
    parser.add_argument("--top", type=int, default=18)
    args = parser.parse_args()

    import torch
    from torch.profiler import ProfilerActivity, profile
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lm_eval_ponder import backbone as bb

    dtype = getattr(torch, bb.native_dtype(args.device))
    path = bb.resolve_backbone(None).path
    tok = AutoTokenizer.from_pretrained(path)
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model = tiny_model(len(tok), args.device, dtype) if args.model == "tiny" else \
        AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(args.device).eval()
    enc = tok(arith_chat_prompts(tok, args.rows), return_tensors="pt", padding=True).to(args.device)
    stop = [tok.decode([tok.eos_token_id])]
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA]
                                           if args.device.startswith("cuda") else [])
    sort = "self_cuda_time_total" if args.device.startswith("cuda") else "self_cpu_time_total"
    for name, fn in (("loop", run_loop), ("hf", run_hf)):
        fn(model, tok, enc, 2, stop, args.device)  # warm-up
        with profile(activities=activities) as prof:
            out = fn(model, tok, enc, args.tokens, stop, args.device)
        print(f"\n### {name}: {args.model}, {args.rows} rows, {args.tokens} tokens: step "
              f"{out['step_ms']:.2f} ms, host {out['host_ms']:.2f} ms, "
              + ", ".join(f"{k} {v:.2f}" for k, v in out["phases"].items()))
        table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.top,
                                          max_name_column_width=42)
        print(table)
        if sort != "self_cpu_time_total":
            print(prof.key_averages().table(sort_by=sort, row_limit=10,
                                            max_name_column_width=42))


if __name__ == "__main__":
    main()
