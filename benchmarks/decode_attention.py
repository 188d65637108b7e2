"""What one decode step's attention and KV-cache growth cost on this CPU, per layer, at the shapes
of a long sampled run (MATH500 Best-of-5: 128 rows in flight, caches of ~700 positions).

Why: a profile of that run (``py-spy record`` on its lm_eval process, bf16, one thread) put 46%
of the time in SDPA (``_scaled_dot_product_flash_attention_for_cpu``, one query token against the
cache) and 16% in ``DynamicLayer.update``'s ``torch.cat``, against 22% in all linear layers. This
times the candidates for a faster decode step, interleaved, median of ``--repeats``:

- ``sdpa``: what transformers runs for a GQA decode step on CPU with a padding mask
  (``pack_gqa``: the query heads of one key/value head as 3 query rows, then SDPA);
- ``sdpa_strided``: the same on a view of a larger, preallocated cache (what a cache that
  grows in place without ``torch.cat`` would hand to attention);
- ``matmul``: the same attention as two batched matmuls and a float32 softmax (bf16 scores, as
  transformers' eager attention rounds them);
- ``matmul_strided``: the matmuls on that view;
- ``cat``: one step of the cache's growth by concatenation (keys or values of one layer).

Usage: python benchmarks/decode_attention.py [--rows 128] [--length 700] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=128)
    p.add_argument("--length", type=int, default=700)
    p.add_argument("--heads", type=int, default=9, help="query heads (SmolLM2-135M: 9)")
    p.add_argument("--kv-heads", type=int, default=3)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=5)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    b, h, kvh, d, n = a.rows, a.heads, a.kv_heads, a.head_dim, a.length
    g = h // kvh
    bf = torch.bfloat16
    q = torch.randn(b, h, 1, d, dtype=bf)
    k, v = torch.randn(b, kvh, n, d, dtype=bf), torch.randn(b, kvh, n, d, dtype=bf)
    big_k = torch.randn(b, kvh, n + 256, d, dtype=bf)
    big_v = torch.randn(b, kvh, n + 256, d, dtype=bf)
    lead = torch.randint(0, n // 4, (b,))
    keep = (torch.arange(n)[None, :] >= lead[:, None])[:, None, None, :]
    additive = torch.zeros(b, 1, 1, n).masked_fill(~keep, float("-inf"))

    def sdpa():
        return F.scaled_dot_product_attention(q.view(b, kvh, g, d), k, v, attn_mask=keep)

    def sdpa_strided():
        return F.scaled_dot_product_attention(q.view(b, kvh, g, d), big_k[:, :, :n],
                                              big_v[:, :, :n], attn_mask=keep)

    def matmul_on(keys, values):
        scores = torch.matmul(q.view(b, kvh, g, d), keys.transpose(-1, -2)).float()
        weights = torch.softmax(scores * d ** -0.5 + additive, dim=-1).to(bf)
        return torch.matmul(weights, values)

    def matmul():
        return matmul_on(k, v)

    def matmul_strided():
        return matmul_on(big_k[:, :, :n], big_v[:, :, :n])

    def cat():
        return torch.cat([k, k[:, :, :1]], dim=2)

    cases = [sdpa, sdpa_strided, matmul, matmul_strided, cat]
    for f in cases:
        f()
    times: dict[str, list[float]] = {f.__name__: [] for f in cases}
    for r in range(a.repeats):
        for f in (cases if r % 2 == 0 else cases[::-1]):
            t = time.perf_counter()
            for _ in range(3):
                f()
            times[f.__name__].append((time.perf_counter() - t) / 3)
    diff = (sdpa().float() - matmul().float()).abs().max().item()
    print(f"rows {b}, cache {n}, heads {h}/{kvh}x{d}, bf16, {a.threads} thread(s); "
          f"median of {a.repeats}, ms per layer and step:")
    for name, ts in times.items():
        print(f"  {name:15s} {statistics.median(ts) * 1e3:8.2f}")
    print(f"  sdpa / matmul   {statistics.median(times['sdpa']) / statistics.median(times['matmul']):8.2f}x")
    print(f"  max |sdpa - matmul| = {diff:.4f} (bf16 scores in matmul)")


if __name__ == "__main__":
    main()
