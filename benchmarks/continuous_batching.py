"""Our generation loop against transformers' own continuous batching (``generate_batch``) on the
same prompts, greedy, with the embedded backbone on CPU (issue 67: why the project keeps its
own loop).

    python benchmarks/continuous_batching.py --prompts 8 --max-new-tokens 16 --pairs 2 \
        --out results/scale/continuous-batching-epyc.json

The prompts are arith-style chat prompts (``What is a + 3a?``); each pair times
``generate_rows`` then ``model.generate_batch`` (float32, one thread), and the record gives the
median ratio, whether the greedy tokens agree, and the hidden-state shapes a forward hook on
the steering layer sees under ``generate_batch``: its requests are packed into one sequence
([1, tokens, d]), so a hook cannot tell which row a position belongs to, and the steering hook
(one offset per row) has nothing to attach to.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--pairs", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    if min(args.prompts, args.max_new_tokens, args.pairs, args.threads) < 1:
        sys.exit("continuous_batching: every count must be >= 1")
    if args.out:
        from lm_eval_ponder.files import check_output

        check_output(Path(args.out), "--out", Path(args.out).parent)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from lm_eval_ponder import backbone as bb
    from lm_eval_ponder.engine import SamplingConfig, generate_rows

    torch.set_num_threads(args.threads)
    path = bb.resolve_backbone(None).path
    tok = AutoTokenizer.from_pretrained(path)
    tok.padding_side = "left"
    prompts = [list(tok.apply_chat_template([{"role": "user", "content": f"What is {a} + {3 * a}?"}],
                                            tokenize=True, add_generation_prompt=True)["input_ids"])
               for a in range(args.prompts)]
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    enc = tok.pad([{"input_ids": ids} for ids in prompts], return_tensors="pt")
    config = GenerationConfig(max_new_tokens=args.max_new_tokens, do_sample=False,
                              eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    shapes: set[tuple[int, ...]] = set()
    layer = bb.decoder_layers(model)[len(bb.decoder_layers(model)) // 2]
    pairs, same = [], None
    for _ in range(args.pairs):
        start = time.perf_counter()
        ours = generate_rows(model, enc.input_ids, enc.attention_mask,
                             max_new_tokens=args.max_new_tokens, eos_token_ids={tok.eos_token_id},
                             pad_token_id=tok.pad_token_id, stop=[],
                             decode=lambda ids: tok.decode(ids, skip_special_tokens=True),
                             sampling=SamplingConfig.from_kwargs(model.generation_config,
                                                                 do_sample=False))
        loop_s = time.perf_counter() - start
        handle = layer.register_forward_hook(lambda m, a, out: shapes.add(
            tuple((out[0] if isinstance(out, tuple) else out).shape)))
        start = time.perf_counter()
        theirs = model.generate_batch(inputs=prompts, generation_config=config,
                                      progress_bar=False)
        batch_s = time.perf_counter() - start
        handle.remove()
        pairs.append({"loop_s": round(loop_s, 2), "generate_batch_s": round(batch_s, 2)})
        width = enc.input_ids.shape[1]
        got = [ours.sequences[i, width:width + ours.gen_tokens[i]].tolist()
               for i in range(len(prompts))]
        outs = [list(v.generated_tokens) for _, v in sorted(theirs.items(), key=lambda kv:
                int(str(kv[0]).rsplit("_", 1)[-1]) if str(kv[0]).rsplit("_", 1)[-1].isdigit()
                else 0)]
        same = sum(o[:len(g)] == g for o, g in zip(outs, got))
    record = {"machine": bb.device_description("cpu"), "threads": args.threads,
              "dtype": "float32", "prompts": args.prompts, "max_new_tokens": args.max_new_tokens,
              "pairs": pairs, "median_ratio": round(statistics.median(
                  x["generate_batch_s"] / x["loop_s"] for x in pairs), 2),
              "same_greedy_tokens": f"{same} of {len(prompts)}",
              "hook_shapes_under_generate_batch": sorted(shapes)[:6]}
    print(json.dumps(record, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
