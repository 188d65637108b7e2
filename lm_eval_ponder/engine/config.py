"""How the row loop batches a call: one dataclass, validated once, so every caller (the lm-eval
adapter, the trainer, the benchmarks) passes the same five numbers the same way."""

from __future__ import annotations

from dataclasses import dataclass

from lm_eval_ponder.errors import PonderError

# ``dynamic``: the DynamicCache layout, exact against ``generate`` (the default everywhere);
# ``captured``: the static layout whose decode forward a GPU records once per shape with
# torch.cuda.graph and replays (engine.slots, engine.capture); on a CPU it runs eagerly.
DECODE_STEPS = ("dynamic", "captured")


def check_decode_step(value: str | None) -> str:
    """The decode step a user named (``auto`` or nothing: ``dynamic``), or one line saying
    which exist."""
    mode = "dynamic" if value in (None, "", "auto") else str(value).strip().lower()
    if mode not in DECODE_STEPS:
        raise PonderError(f"decode_step must be one of {', '.join(DECODE_STEPS)} (or auto), "
                          f"got {value!r}")
    return mode


@dataclass(frozen=True)
class LoopConfig:
    """``max_rows``: rows in flight at most (None: the whole call). ``max_cache_tokens``: a
    row joins only while the rows in flight times (the longest prompt among them +
    ``max_new_tokens``), the cache's widest extent, stays within it (one row always runs;
    None: no budget). ``admit_fraction``: waiting rows join once at least this share of
    ``max_rows`` is free (or all remaining waiting rows fit): fewer, larger prefills.
    ``decode_step``: ``DECODE_STEPS``; the static layout applies only where nothing hooks the
    forward (``engine.loop.static_applies``). ``shrink_tail``: the static layout's live rows
    move to a quarter of the slots once no row waits and they fit (``slots.tail_slots``).
    ``min_top_prob``: a row also ends at the first position whose top next-token probability
    (the softmax of the model's raw logits, before temperature or any warper) is below it, and
    that position's token is not kept: the answer-truncation reading of the paper's tau
    (``docs/results/answer-truncation.md``). None: off."""

    max_rows: int | None = None
    max_cache_tokens: int | None = None
    admit_fraction: float = 0.5
    decode_step: str = "dynamic"
    shrink_tail: bool = True
    min_top_prob: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "decode_step", check_decode_step(self.decode_step))
        if self.max_rows is not None and int(self.max_rows) < 1:
            raise PonderError(f"max_rows must be >= 1, got {self.max_rows!r}")
        if self.max_cache_tokens is not None and int(self.max_cache_tokens) < 1:
            raise PonderError(f"max_cache_tokens must be >= 1, got {self.max_cache_tokens!r}")
        if not 0 < self.admit_fraction <= 1:
            raise PonderError(f"admit_fraction must be in (0, 1], got {self.admit_fraction!r}")
        if self.min_top_prob is not None and not 0 < float(self.min_top_prob) < 1:
            raise PonderError(f"min_top_prob must be in (0, 1), got {self.min_top_prob!r}")
