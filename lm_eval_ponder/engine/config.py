"""How the row loop batches a call, and which answer stops it adds: one dataclass, validated
once, so every caller (the lm-eval adapter, the trainer, the benchmarks) passes them the same
way."""

from __future__ import annotations

from dataclasses import dataclass

from lm_eval_ponder.engine.stops import StopRule
from lm_eval_ponder.errors import PonderError


@dataclass(frozen=True)
class LoopConfig:
    """``max_rows``: rows in flight at most (None: the whole call). ``max_cache_tokens``: a
    row joins only while the rows in flight times (the longest prompt among them +
    ``max_new_tokens``), the cache's widest extent, stays within it (one row always runs;
    None: no budget). ``admit_fraction``: waiting rows join once at least this share of
    ``max_rows`` is free (or all remaining waiting rows fit): fewer, larger prefills.
    ``stops``: answer stops beyond end of text, stop strings and the length limit, checked
    before them in this order (``engine.stops``: e.g. ``TopProbBelow``, the answer-truncation
    reading of the paper's tau)."""

    max_rows: int | None = None
    max_cache_tokens: int | None = None
    admit_fraction: float = 0.5
    stops: tuple[StopRule, ...] = ()

    def __post_init__(self) -> None:
        if self.max_rows is not None and int(self.max_rows) < 1:
            raise PonderError(f"max_rows must be >= 1, got {self.max_rows!r}")
        if self.max_cache_tokens is not None and int(self.max_cache_tokens) < 1:
            raise PonderError(f"max_cache_tokens must be >= 1, got {self.max_cache_tokens!r}")
        if not 0 < self.admit_fraction <= 1:
            raise PonderError(f"admit_fraction must be in (0, 1], got {self.admit_fraction!r}")
