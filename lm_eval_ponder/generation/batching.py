"""How ``--model ponder`` batches: rows in flight and their key/value cache budget.

Not part of a run's fingerprint, but not without effect either: in float32 on the CPUs
measured no greedy answer moved with the batching, in bf16 59.5% of them did (docs/results/
speed.md, "Batch invariance"), since a row's matmuls and attention reduce in an order that
depends on the rows beside it. ``PonderLM.get_model_info`` records the batching beside the
fingerprint (``ponder_batching``), and ``batch_invariant=true`` runs one row at a time: each
answer is then computed alone, the same whatever ``max_rows``, ``max_cache_gib`` and the other
requests are, at the cost of batching (measured on the speed page). The engine takes them as
one ``engine.config.LoopConfig``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from lm_eval_ponder.engine import LoopConfig, StopRule, cache_bytes_per_token
from lm_eval_ponder.errors import PonderError
from lm_eval_ponder.generation.settings import model_arg_flag, model_arg_number

# requests per row in flight in a call its caller cuts (``Batching.requests_per_call``)
REQUESTS_PER_ROW = 4


def default_max_rows(device: str) -> int:
    """Rows in flight when the user gives none. 128 on CPU: measured end to end on arith
    (``benchmarks/max_rows.py``: 16, 32, 64, 128 rows took 158, 113, 101, 90 s in float32;
    docs/results). 256 on CUDA, where wide batches keep a GPU busy: not measured yet."""
    return 256 if str(device).startswith("cuda") else 128


def total_memory_bytes(device: str) -> int | None:
    """The memory generation runs in: the GPU's for CUDA, else the machine's RAM or the
    container's limit (cgroup), whichever is smaller; None when it cannot be read."""
    device = str(device)
    if device.startswith("cuda") and torch.cuda.is_available():
        index = torch.device(device).index
        return int(torch.cuda.get_device_properties(index or 0).total_memory)
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        ram = None
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            limit = Path(path).read_text().strip()
        except OSError:
            continue
        if limit.isdigit() and (ram is None or int(limit) < ram):
            ram = int(limit)
    return ram


AUTO = "auto"  # max_cache_gib's default: set by ``default_cache_gib`` once the weights are known
# On CPU the cache may take this many times the weights' bytes (and at least CPU_CACHE_FLOOR)
CPU_CACHE_PER_WEIGHT = 3
CPU_CACHE_FLOOR = 0.5 * 2**30


def parse_cache_gib(value: float | str | None) -> float | str | None:
    """``max_cache_gib``: a number of GiB, ``auto``/unset (``AUTO``: ``default_cache_gib``,
    once the model has loaded) or ``none`` (no budget: ``max_rows`` alone bounds the batch)."""
    if value is None or str(value).strip().lower() in ("", AUTO):
        return AUTO
    if str(value).strip().lower() == "none":
        return None
    try:
        gib = float(value)
    except ValueError:
        gib = float("nan")
    if not gib > 0:
        raise PonderError(f"max_cache_gib must be a positive number of GiB, auto or none; "
                          f"got {value!r}")
    return gib


def default_cache_gib(device: str, weight_bytes: int) -> float | None:
    """The key/value cache budget of the rows in flight when the user gives none.

    On a GPU, a third of its memory (the weights and activations need the rest). On CPU,
    three times the weights' bytes (at least 0.5 GiB), and at most a sixth of the memory. A
    sixth alone (3.92 GiB of a 24 GiB machine) let the whole arith ladder on the embedded
    model peak at 2.5-2.7 GiB resident for 0.25 GiB of bf16 weights; at 0.75 GiB (three
    times the weights) it peaked at 1.73-1.82 GiB and took 1.11-1.13x as long (one thread,
    AMD EPYC, two pairs run side by side; ``benchmarks/memory.py``, docs/results/speed.md):
    on a CPU the rows a larger cache admits buy little. From the total and the weights, not
    the free memory, so the batches, and with them bf16 outputs, do not depend on other jobs."""
    total = total_memory_bytes(device)
    if total is None:
        return None
    if str(device).startswith("cuda"):
        return total / 3 / 2**30
    return min(total / 6, max(CPU_CACHE_PER_WEIGHT * weight_bytes, CPU_CACHE_FLOOR)) / 2**30


class Batching:
    """The batching model args, parsed before the model loads (``max_rows``,
    ``max_cache_gib``), and the ``LoopConfig`` they make once the model's cache size per token
    is known (``loop_config``)."""

    def __init__(self, max_rows: Any, max_cache_gib: Any, device: str,
                 batch_invariant: Any = False) -> None:
        self.batch_invariant = model_arg_flag("batch_invariant", batch_invariant)
        given = max_rows not in (None, "", "auto")
        self.max_rows = model_arg_number("max_rows", max_rows, int) if given \
            else 1 if self.batch_invariant else default_max_rows(device)
        if self.max_rows < 1:
            raise PonderError(f"max_rows must be >= 1, got {max_rows!r}")
        if self.batch_invariant and self.max_rows != 1:
            raise PonderError(f"batch_invariant=true runs one row at a time; max_rows={max_rows} "
                              "contradicts it: drop one of them")
        self.device = device
        self.max_cache_gib: float | str | None = parse_cache_gib(max_cache_gib)
        self.max_cache_tokens: int | None = None

    def fit(self, model_config, dtype: torch.dtype, weight_bytes: int) -> None:
        """The cache budget in token positions, for a model of this config, dtype and size
        (the default budget follows the weights: ``default_cache_gib``)."""
        if self.max_cache_gib == AUTO:
            self.max_cache_gib = default_cache_gib(self.device, weight_bytes)
        per_token = cache_bytes_per_token(model_config, dtype)
        self.max_cache_tokens = None if self.max_cache_gib is None or per_token is None \
            else max(1, int(self.max_cache_gib * 2**30 // per_token))

    @property
    def requests_per_call(self) -> int:
        """Requests a caller that cuts its own calls (the trainer's rollout blocks) puts in
        one: ``REQUESTS_PER_ROW`` per row in flight, so rows that finish are replaced by
        waiting ones instead of leaving the batch to shrink. ``generate_until`` cuts none: the
        loop gets each request group whole."""
        return REQUESTS_PER_ROW * self.max_rows

    def check_row(self, positions: int) -> str | None:
        """A warning where one row (the longest prompt plus ``max_gen_toks``: ``positions``)
        passes the cache budget on its own: the loop then runs rows one at a time, each past
        it."""
        if self.max_cache_tokens is None or self.max_cache_tokens >= positions:
            return None
        return (f"max_cache_gib={self.max_cache_gib:g} holds {self.max_cache_tokens:,} cached "
                f"positions, less than one row of this run ({positions:,}: the longest prompt "
                "plus max_gen_toks): rows run one at a time, each past the budget; raise "
                "max_cache_gib or leave it out")

    def loop_config(self, stops: tuple[StopRule, ...] = ()) -> LoopConfig:
        """The engine's config; the answer ``stops`` are the model's (they change what is
        generated, so they live in the fingerprint, not here)."""
        return LoopConfig(max_rows=self.max_rows, max_cache_tokens=self.max_cache_tokens,
                          stops=stops)

    def info(self) -> dict[str, Any]:
        return {"max_rows": self.max_rows, "max_cache_gib": self.max_cache_gib,
                "max_cache_tokens": self.max_cache_tokens, "batch_invariant": self.batch_invariant}
