"""Long generations under glibc's malloc against a caching allocator (tcmalloc) preloaded.

Why: a profile of MATH500 Best-of-5 (bf16, 128 rows in flight, caches of ~700 positions) showed
25-30% of the process's CPU time in the kernel (``stime`` in ``/proc/PID/stat``) and 175 million
minor page faults in 26 minutes. Every decode step grows each layer's key/value cache with
``torch.cat`` into a fresh tensor of tens of MB; glibc serves blocks over 32 MB (its largest
mmap threshold) with a new ``mmap`` and returns them on ``free``, so each step faults in and
zeroes the whole cache again. A benchmark since retired (``docs/results/history.md``) timed
one such ``cat`` at 17 ms under glibc and 2.5 ms with tcmalloc, which keeps freed blocks.

This runs the same greedy ``generate_rows`` job (the embedded model, bf16, long prompts, every
row forced to ``--new`` tokens) in child processes with and without ``LD_PRELOAD`` of the
allocator, interleaved with the order alternating, and reports the median ratio of walls and
the children's user/system CPU. Greedy outputs are compared by hash: an allocator must not
change a token.

    python benchmarks/allocator.py --pairs 3 [--library /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4]

``--library none`` compares glibc against glibc with only the ``--setting`` environment, e.g.
its tunables (issue 36: a fresh mapping per large block also costs the loop's logits):

    python benchmarks/allocator.py --library none --setting MALLOC_MMAP_THRESHOLD_=4294967296 \
        --setting MALLOC_TRIM_THRESHOLD_=4294967296
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path


def worker(rows: int, prompt_tokens: int, new: int, threads: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lm_eval_ponder import backbone as bb
    from lm_eval_ponder.engine import LoopConfig, SamplingConfig, cache_bytes_per_token, generate_rows

    torch.set_num_threads(threads)
    Path("/proc/self/oom_score_adj").write_text("1000")  # if memory runs out, this goes first
    path = bb.resolve_backbone(None, None).path
    tok = AutoTokenizer.from_pretrained(path)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).eval()
    g = torch.Generator().manual_seed(0)
    # long prompts of random ordinary tokens, lengths spread over [prompt_tokens/2, prompt_tokens]
    lengths = torch.randint(prompt_tokens // 2, prompt_tokens + 1, (rows,), generator=g)
    ids = torch.full((rows, prompt_tokens), tok.pad_token_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, n in enumerate(lengths.tolist()):
        ids[i, -n:] = torch.randint(1000, 20000, (n,), generator=g)
        mask[i, -n:] = 1
    cfg = SamplingConfig.from_kwargs(model.generation_config, do_sample=False,
                                     min_new_tokens=new)
    before = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    res = generate_rows(model, ids, mask, max_new_tokens=new, eos_token_ids={tok.eos_token_id},
                        pad_token_id=tok.pad_token_id, sampling=cfg,
                        config=LoopConfig(max_rows=rows))
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_SELF)
    return {"wall_s": wall, "user_s": after.ru_utime - before.ru_utime,
            "sys_s": after.ru_stime - before.ru_stime,
            "minor_faults": after.ru_minflt - before.ru_minflt,
            "peak_rss_gb": after.ru_maxrss / 2**20,  # kB on Linux
            "cache_gb": rows * (prompt_tokens + new)
            * cache_bytes_per_token(model.config, torch.bfloat16) / 2**30,
            "tokens": sum(res.gen_tokens),
            "sha256": hashlib.sha256(res.sequences.numpy().tobytes()).hexdigest()[:16]}


def child(args: argparse.Namespace, library: str | None) -> dict:
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    if library:
        if library != "none":
            env["LD_PRELOAD"] = library
        for setting in args.setting:  # e.g. TCMALLOC_AGGRESSIVE_DECOMMIT=true
            key, _, value = setting.partition("=")
            env[key] = value
    cmd = [sys.executable, __file__, "--worker", "--rows", str(args.rows),
           "--prompt-tokens", str(args.prompt_tokens), "--new", str(args.new),
           "--threads", str(args.threads)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--rows", type=int, default=128)
    p.add_argument("--prompt-tokens", type=int, default=400)
    p.add_argument("--new", type=int, default=96)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--library", default="/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4")
    p.add_argument("--setting", action="append", default=[], metavar="KEY=VALUE",
                   help="environment for the preloaded run, e.g. TCMALLOC_RELEASE_RATE=10")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        print(json.dumps(worker(a.rows, a.prompt_tokens, a.new, a.threads)))
        return
    if a.library != "none" and not Path(a.library).is_file():
        sys.exit(f"{a.library} not found (Debian: apt install libtcmalloc-minimal4)")
    ratios = []
    for i in range(a.pairs):
        order = [None, a.library] if i % 2 == 0 else [a.library, None]
        got = {lib: child(a, lib) for lib in order}
        base, alt = got[None], got[a.library]
        ratio = base["wall_s"] / alt["wall_s"]
        ratios.append(ratio)
        same = base["sha256"] == alt["sha256"]
        alt_name = Path(a.library).name if a.library != "none" else "glibc " + " ".join(a.setting)
        for name, r in (("glibc", base), (alt_name, alt)):
            print(f"pair {i} {name:28s} wall {r['wall_s']:7.1f} s  user {r['user_s']:7.1f} s  "
                  f"sys {r['sys_s']:6.1f} s  minor faults {r['minor_faults']:>11,}  "
                  f"peak RSS {r['peak_rss_gb']:5.2f} GB (cache at most {r['cache_gb']:.2f})  "
                  f"tokens {r['tokens']}", flush=True)
        print(f"pair {i}: glibc / alternative wall x{ratio:.2f}; same tokens: {same}", flush=True)
    print(f"{a.rows} rows, prompts {a.prompt_tokens // 2}-{a.prompt_tokens} tokens, {a.new} new "
          f"tokens each, bf16, {a.threads} thread(s): median speed-up "
          f"x{statistics.median(ratios):.2f} over {a.pairs} pairs")


if __name__ == "__main__":
    main()
