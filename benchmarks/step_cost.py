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
import time


def tiny_model(vocab: int, device: str, dtype):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=2048, bos_token_id=1, eos_token_id=2,
                         pad_token_id=2, tie_word_embeddings=True)
    return LlamaForCausalLM(config).to(device=device, dtype=dtype).eval()


def prompts(tok, n: int) -> list[str]:
    import random

    rng = random.Random(0)
    out = []
    for _ in range(n):
        a, b = rng.randrange(100), rng.randrange(100)
        msg = [{"role": "user", "content": f"Please solve the math problem: What is {a} + {b}?"}]
        out.append(tok.apply_chat_template(msg, tokenize=False, add_generation_prompt=True))
    return out


class ForwardClock:
    """Seconds inside ``model(...)`` calls (hooks on the top module), and their count."""

    def __init__(self, model, device) -> None:
        import torch

        self.seconds, self.calls, self.device, self.start = 0.0, 0, device, 0.0
        cuda = torch.device(device).type == "cuda"

        def before(*_):
            if cuda:
                torch.cuda.synchronize(device)
            self.start = time.perf_counter()

        def after(*_):
            if cuda:
                torch.cuda.synchronize(device)
            self.seconds += time.perf_counter() - self.start
            self.calls += 1

        self.handles = [model.register_forward_pre_hook(before),
                        model.register_forward_hook(after)]

    def close(self) -> None:
        for h in self.handles:
            h.remove()


DECODERS: dict = {}  # one decoder per tokenizer: the loop keeps its stop-token table per decoder


def run_loop(model, tok, enc, max_new: int, stop: list[str], device: str,
             max_rows: int | None = None) -> dict:
    import torch

    from lm_eval_ponder.evaluation import generation

    try:
        from lm_eval_ponder.evaluation.sampling import SamplingConfig
    except ImportError:  # before issue 36 (a baseline run on an older checkout)
        SamplingConfig = generation.SamplingConfig
    decode = DECODERS.setdefault(id(tok), lambda ids: tok.decode(ids, skip_special_tokens=True))
    kwargs = dict(max_new_tokens=max_new, eos_token_ids={tok.eos_token_id},
                  pad_token_id=tok.pad_token_id, stop=stop, decode=decode,
                  sampling=SamplingConfig(), max_rows=max_rows)
    timer = clock = None
    if hasattr(generation, "StepTimer"):
        timer = kwargs["timer"] = generation.StepTimer(sync=torch.device(device).type == "cuda")
    else:
        clock = ForwardClock(model, device)
    start = time.perf_counter()
    try:
        res = generation.generate_rows(model, enc.input_ids, enc.attention_mask, **kwargs)
    finally:
        if clock is not None:
            clock.close()
    wall = time.perf_counter() - start
    if timer is not None:
        phases, steps = dict(timer.seconds), max(timer.decode_steps, 1)
    else:  # the prefill forwards cannot be told apart: charged at a decode forward's mean
        steps = max(res.decode_forwards, 1)
        per = clock.seconds / max(clock.calls, 1)
        phases = {"prefill": per * res.prefill_forwards,
                  "forward": clock.seconds - per * res.prefill_forwards}
    decode_wall = wall - phases.get("prefill", 0.0)
    return {"wall": wall, "steps": steps, "tokens": sum(res.gen_tokens),
            "joins": res.joins, "compactions": getattr(res, "compactions", 0),
            "join_ms": phases.get("join", 0.0) * 1e3, "compact_ms": phases.get("compact", 0.0) * 1e3,
            "phases": {k: v / steps * 1e3 for k, v in phases.items() if k != "prefill"},
            "host_ms": (decode_wall - phases.get("forward", 0.0)) / steps * 1e3,
            "step_ms": decode_wall / steps * 1e3}


def run_hf(model, tok, enc, max_new: int, stop: list[str], device: str) -> dict:
    import torch
    from lm_eval.models.utils_hf import stop_sequences_criteria

    rows, width = enc.input_ids.shape
    criteria = stop_sequences_criteria(tok, stop, width, rows)
    spent = {"stop": 0.0}
    inner = list(criteria)

    class Timed:
        def __init__(self, c) -> None:
            self.c = c

        def __call__(self, *a, **k):
            t = time.perf_counter()
            try:
                return self.c(*a, **k)
            finally:
                spent["stop"] += time.perf_counter() - t

    criteria.clear()
    criteria.extend(Timed(c) for c in inner)
    clock = ForwardClock(model, device)
    try:
        start = time.perf_counter()
        with torch.no_grad():
            out = model.generate(input_ids=enc.input_ids, attention_mask=enc.attention_mask,
                                 max_new_tokens=max_new, stopping_criteria=criteria,
                                 pad_token_id=tok.pad_token_id, do_sample=False,
                                 use_cache=True)
        if torch.device(device).type == "cuda":
            torch.cuda.synchronize(device)
        wall = time.perf_counter() - start
    finally:
        clock.close()
    steps = max(clock.calls - 1, 1)
    prefill = clock.seconds / clock.calls if clock.calls else 0.0  # not separable: an average
    decode_forward = clock.seconds - prefill
    decode_wall = wall - prefill
    return {"wall": wall, "steps": steps, "tokens": int((out[:, width:] != tok.pad_token_id).sum()),
            "phases": {"forward": decode_forward / steps * 1e3,
                       "stop": spent["stop"] / steps * 1e3,
                       "choose+rest": (decode_wall - decode_forward - spent["stop"]) / steps * 1e3},
            "host_ms": (decode_wall - decode_forward) / steps * 1e3,
            "step_ms": decode_wall / steps * 1e3}


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--rows", type=int, nargs="+", default=[16, 64, 256])
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--models", nargs="+", default=["tiny", "embedded"],
                        choices=["tiny", "embedded"])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default=None, help="default: the device's native dtype")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--join-rows", type=int, default=0,
                        help="also run this many prompts with a quarter of them in flight, and "
                             "print the cost of a join and of a compaction")
    args = parser.parse_args(argv)

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lm_eval_ponder import backbone as bb

    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype or bb.native_dtype(args.device))
    path = bb.resolve_backbone(None).path
    tok = AutoTokenizer.from_pretrained(path)
    tok.padding_side = "left"
    if tok.pad_token is None:  # as HFLM does
        tok.pad_token = tok.eos_token
    stop = [tok.decode([tok.eos_token_id])]  # lm-eval's until: the EOS text
    print(f"# {bb.device_description(args.device)}, {dtype}, threads {torch.get_num_threads()}, "
          f"{args.max_new_tokens} new tokens, until {stop}, medians of {args.pairs} pairs")
    print("model     rows  path  step_ms  host_ms  phases (ms/step)")
    host_at: dict[tuple[str, int, str], dict[str, float]] = {}
    for name in args.models:
        model = tiny_model(len(tok), args.device, dtype) if name == "tiny" else \
            AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(args.device).eval()
        for rows in args.rows:
            enc = tok(prompts(tok, rows), return_tensors="pt", padding=True).to(args.device)
            runs: dict[str, list[dict]] = {"loop": [], "hf": []}
            for fn in (run_loop, run_hf):  # warm-up: kernels, allocator, the stop-token table
                fn(model, tok, enc, 2, stop, args.device)
            for pair in range(args.pairs):
                order = ("loop", "hf") if pair % 2 == 0 else ("hf", "loop")
                for path_name in order:
                    fn = run_loop if path_name == "loop" else run_hf
                    runs[path_name].append(fn(model, tok, enc, args.max_new_tokens, stop,
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
            enc = tok(prompts(tok, args.join_rows), return_tensors="pt",
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
