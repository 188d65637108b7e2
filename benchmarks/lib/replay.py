"""Random-initialised backbones of real architectures and recorded answer lengths to replay on
them: what ``scale.py`` (the loop against HFLM's path) and ``train_cost.py`` (the trainer's
generation) share, so both time the same work pattern.

Shapes live in ``benchmarks/shapes/*.json`` (architecture fields of the published configs: no
weights, no download). Lengths come from the committed greedy Direct suite logs.
"""

from __future__ import annotations

import heapq
import json
import resource
import sys
import time
from dataclasses import dataclass
from pathlib import Path

SHAPES = Path(__file__).resolve().parents[1] / "shapes"
REPO = Path(__file__).resolve().parents[2]


def add_replay_args(parser) -> None:
    """The options every replaying script takes: the shape, the lengths, the loop's rows, the
    seed and where the figures go (``lib.decoding.add_device_args`` adds the device's)."""
    parser.add_argument("--shape", default="qwen2.5-0.5b",
                        help="benchmarks/shapes/<name>.json or a path to a config JSON")
    parser.add_argument("--lengths", default="arith", choices=["arith", "gsm8k"],
                        help="whose recorded answer lengths to replay")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="answers capped here")
    parser.add_argument("--max-rows", type=int, default=None,
                        help="the loop's rows in flight (default: --model ponder's rule)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="write the figures as JSON here")


def shape_config(name: str):
    """A transformers config from ``benchmarks/shapes/<name>.json`` (or a path)."""
    from transformers import AutoConfig

    path = Path(name) if name.endswith(".json") else SHAPES / f"{name}.json"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in SHAPES.glob("*.json")))
        sys.exit(f"no shape {name!r} (known: {known}; or a path to a config JSON)")
    fields = {k: v for k, v in json.loads(path.read_text()).items() if not k.startswith("_")}
    return AutoConfig.for_model(**fields), path.stem


def prompt_from_price(spec, flops: float, gen_tokens: float, price, max_prompt: int = 65536
                      ) -> int | None:
    """The prompt length P of a plain generation from its logged FLOPs: the largest P whose
    ``price(spec, P, gen_tokens)`` is at most ``flops``, accepted only when nothing remains
    (the price is strictly increasing in P); None when no P prices it exactly."""
    import math

    if gen_tokens != int(gen_tokens) or flops is None or not math.isfinite(flops):
        return None
    gen_tokens = int(gen_tokens)
    lo, hi = 1, max_prompt
    if price(spec, lo, gen_tokens) > flops:
        return None
    while lo < hi:  # largest P whose price is at most flops
        mid = (lo + hi + 1) // 2
        if price(spec, mid, gen_tokens) <= flops:
            lo = mid
        else:
            hi = mid - 1
    return lo if price(spec, lo, gen_tokens) == flops else None


def unpack_records(folder: Path) -> None:
    """The committed records of a study folder unpacked (``scripts/records.py``, the
    repository's storage, which the benchmarks run rather than import)."""
    import subprocess

    subprocess.run([sys.executable, str(REPO / "scripts" / "records.py"), "unpack", str(folder)],
                   check=True, stdout=subprocess.DEVNULL)


def recorded_lengths(task: str, questions: int, cap: int) -> list[tuple[int, int]]:
    """(prompt tokens, answer tokens) of the first ``questions`` questions of the committed
    greedy Direct run on ``task``, answers capped at ``cap``. The prompt length is the one the
    logged FLOPs price (``flops.generation_flops`` of the embedded backbone is increasing in
    it), so no tokenizer and no benchmark text is needed."""
    from lm_eval_ponder.files import read_jsonl
    from lm_eval_ponder.flops import FlopsSpec, generation_flops
    unpack_records(REPO / "results" / "suite")  # committed as results/suite.tar.xz
    logs = sorted((REPO / "results" / "suite" / "greedy" / "Direct" / task).rglob(
        "samples_*.compact.jsonl.xz"))
    if not logs:
        sys.exit(f"no committed greedy Direct log for {task} under results/suite")
    spec = FlopsSpec.from_config(shape_config("smollm2-135m")[0])
    out = []
    for row in read_jsonl(logs[0])[:questions]:
        prompt = prompt_from_price(spec, row["flops"], row["gen_tokens"], generation_flops)
        if prompt is None:
            sys.exit(f"{logs[0]} question {row['doc_id']}: no prompt length prices it")
        out.append((prompt, max(1, min(int(row["gen_tokens"]), cap))))
    return out


def build_model(config, device: str, dtype, seed: int):
    """The architecture with random weights, made on the device (an 8B model is never moved)."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.generation_config.eos_token_id = None  # rows end at their recorded lengths only
    model.generation_config.pad_token_id = 0
    return model.eval()


def order_of(lengths: list[tuple[int, int]]) -> list[int]:
    """The rows' order in a batch: longest prompt first (lm-eval's order), ties as given."""
    return sorted(range(len(lengths)), key=lambda i: -lengths[i][0])


def batch_of(lengths: list[tuple[int, int]], vocab: int, device: str, seed: int):
    """Left-padded random prompts of the recorded lengths, longest first (lm-eval's order)."""
    import torch

    order = order_of(lengths)
    width = max(p for p, _ in lengths)
    gen = torch.Generator().manual_seed(seed)
    ids = torch.zeros(len(lengths), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, i in enumerate(order):
        p = lengths[i][0]
        ids[row, width - p:] = torch.randint(1, vocab, (p,), generator=gen)
        mask[row, width - p:] = 1
    return ids.to(device), mask.to(device), [lengths[i][1] for i in order]


def run_replay(model, ids, mask, limits, config) -> dict:
    """The loop (``engine.generate_rows``) on a replayed batch, each row stopping at its
    recorded length: wall seconds, useful tokens, peak memory and decode forwards."""
    from lm_eval_ponder.engine import generate_rows

    start = time.perf_counter()
    with Memory(str(model.device)) as memory:
        result = generate_rows(model, ids, mask, max_new_tokens=limits, eos_token_ids=set(),
                               pad_token_id=0, config=config)
    wall = time.perf_counter() - start
    if list(result.gen_tokens) != list(limits):
        raise RuntimeError("scale: the loop did not replay the recorded lengths")
    return {"wall_s": wall, "useful": sum(limits), "peak_gib": memory.gib,
            "decode_forwards": result.decode_forwards}


class Memory:
    """Peak memory of one run: the GPU's allocator on CUDA; on a CPU the process's peak
    resident set (it only grows, so the first engine to need more shows it)."""

    def __init__(self, device: str) -> None:
        self.cuda = device.startswith("cuda")

    def __enter__(self):
        import torch

        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        return self

    def __exit__(self, *exc) -> None:
        import torch

        if self.cuda:
            torch.cuda.synchronize()
            self.gib = torch.cuda.max_memory_allocated() / 2**30
        else:
            self.gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


@dataclass(frozen=True)
class StepCost:
    """A decode step's seconds as ``fixed_s + per_row_s * rows``, fitted to timed forwards.

    Why: whether a loop that retires finished rows can beat ``generate`` in fixed batches
    depends on what a finished row would have cost. Where a step is memory-bound (every step
    reads all the weights) the fixed part dominates and a retired row saves little; where it is
    compute-bound the per-row part does. With the line and the replayed lengths, the best any
    row-retiring scheduler can do against a batch size is a number (``bound``), which says
    whether a speed target is reachable on a machine before anyone tunes for it.

    The line holds at the context it was timed at: a step also reads every row's cached keys
    and values, and on a 2-core AMX Xeon the embedded shape's step at 128 rows took 150 ms over
    112 cached positions and 438 ms over 300. So it explains a replay, whose context it is
    timed at, and is no price list for runs with longer answers (``suite --plan --scale``
    prices with a measured rate at a run's own size instead)."""

    fixed_s: float
    per_row_s: float
    points: tuple[tuple[int, float], ...] = ()

    @classmethod
    def fit(cls, points: list[tuple[int, float]]) -> StepCost:
        """Least squares over (rows, seconds); two distinct row counts at least."""
        if len({r for r, _ in points}) < 2:
            raise ValueError("a step cost needs timings at two row counts at least")
        n = len(points)
        mean_r = sum(r for r, _ in points) / n
        mean_s = sum(s for _, s in points) / n
        slope = sum((r - mean_r) * (s - mean_s) for r, s in points) / \
            sum((r - mean_r) ** 2 for r, _ in points)
        return cls(mean_s - slope * mean_r, slope, tuple(points))

    def step(self, rows: int) -> float:
        return self.fixed_s + self.per_row_s * rows

    def fixed_batches(self, tokens: list[int], batch: int) -> float:
        """Decode seconds of ``generate`` over ``tokens`` (in lm-eval's order) in batches of
        ``batch``: each batch steps until its longest answer ends, every row paid each step."""
        return sum(max(group) * self.step(len(group))
                   for group in (tokens[i:i + batch] for i in range(0, len(tokens), batch)))

    def retiring_rows(self, tokens: list[int], max_rows: int) -> float:
        """Decode seconds of an ideal loop over ``tokens``: at most ``max_rows`` in flight,
        each step paying only the rows still decoding, a freed row refilled at once from the
        queue (no join or prefill cost: a lower bound on the real loop's time). Every step pays
        ``fixed_s`` and every generated token ``per_row_s``, so the price is the schedule's
        steps (the longest a slot runs, queued rows taking the first free slot) times the one
        plus the tokens times the other."""
        if max_rows < 1:
            raise ValueError("max_rows must be at least 1")
        slots = [0] * min(max_rows, len(tokens))
        for length in tokens:
            heapq.heappush(slots, heapq.heappop(slots) + length)
        return self.fixed_s * max(slots, default=0) + self.per_row_s * sum(tokens)

    def bound(self, tokens: list[int], batch: int, max_rows: int) -> float:
        """The most a row-retiring loop can gain over ``generate`` at ``batch`` under this
        cost: modelled decode seconds of one over the other (prefill left out of both)."""
        return self.fixed_batches(tokens, batch) / self.retiring_rows(tokens, max_rows)


def measure_step_cost(model, rows: list[int], context: int, steps: int = 5) -> StepCost:
    """Time ``steps`` greedy decode forwards (last logits only, as the loop calls the model;
    transformers' ``DynamicCache``, as ``generate`` grows it, so both engines' steps are priced
    alike) over a cache of ``context`` positions at each row count; the median per
    step at each, fitted to a line (``StepCost``). The cache is filled with random keys and
    values, not by a prefill: a decode step costs the same (measured: the embedded shape at
    1-128 rows, within 4%), and a prefill of many rows takes longer than the steps it sets up
    on a CPU."""
    import statistics

    import torch
    from transformers import DynamicCache

    from lm_eval_ponder.backbone import text_config
    from lm_eval_ponder.engine import cache_keyword, cache_shape

    config = text_config(model.config)
    layers, kv_heads, head_dim = cache_shape(config)
    cuda = model.device.type == "cuda"
    dtype = next(model.parameters()).dtype
    points = []
    gen = torch.Generator().manual_seed(0)
    for n in rows:
        cache = DynamicCache(config=config)
        with torch.no_grad():
            for layer in range(layers):
                k = torch.randn(n, kv_heads, context, head_dim, dtype=dtype, device=model.device)
                cache.update(k, torch.randn_like(k), layer)
            nxt = torch.randint(1, config.vocab_size, (n, 1), generator=gen).to(model.device)
            times = []
            for _ in range(steps):
                if cuda:
                    torch.cuda.synchronize()
                start = time.perf_counter()
                out = model(input_ids=nxt, use_cache=True, logits_to_keep=1,
                            **{cache_keyword(model): cache})
                nxt = out.logits[:, -1].argmax(-1, keepdim=True)
                if cuda:
                    torch.cuda.synchronize()
                times.append(time.perf_counter() - start)
        del cache, out
        points.append((n, statistics.median(times)))
    return StepCost.fit(points)
