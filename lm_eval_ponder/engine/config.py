"""How the row loop batches a call: one dataclass, validated once, so every caller (the lm-eval
adapter, the trainer, the benchmarks) passes the same four numbers the same way."""

from __future__ import annotations

from dataclasses import dataclass

from lm_eval_ponder.errors import PonderError


@dataclass(frozen=True)
class LoopConfig:
    """``max_rows``: rows in flight at most (None: the whole call). ``max_cache_tokens``: a
    row joins only while the rows in flight times (the longest prompt among them +
    ``max_new_tokens``), the cache's widest extent, stays within it (one row always runs;
    None: no budget). ``admit_fraction``: waiting rows join once at least this share of
    ``max_rows`` is free (or all remaining waiting rows fit): fewer, larger prefills.
    ``min_top_prob``: a row also ends at the first position whose top next-token probability
    (the softmax of the model's raw logits, before temperature or any warper) is below it, and
    that position's token is not kept: the answer-truncation reading of the paper's tau
    (``docs/results/answer-truncation.md``). None: off."""

    max_rows: int | None = None
    max_cache_tokens: int | None = None
    admit_fraction: float = 0.5
    min_top_prob: float | None = None

    def __post_init__(self) -> None:
        if self.max_rows is not None and int(self.max_rows) < 1:
            raise PonderError(f"max_rows must be >= 1, got {self.max_rows!r}")
        if self.max_cache_tokens is not None and int(self.max_cache_tokens) < 1:
            raise PonderError(f"max_cache_tokens must be >= 1, got {self.max_cache_tokens!r}")
        if not 0 < self.admit_fraction <= 1:
            raise PonderError(f"admit_fraction must be in (0, 1], got {self.admit_fraction!r}")
        if self.min_top_prob is not None and not 0 < float(self.min_top_prob) < 1:
            raise PonderError(f"min_top_prob must be in (0, 1), got {self.min_top_prob!r}")
