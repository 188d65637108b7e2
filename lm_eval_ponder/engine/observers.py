"""What the row loop tells the code around it, through one protocol: which rows are in each
forward (steering and early-exit hooks keep per-row state by it), each row as it finishes (a
progress bar; an answer kept as it ends) and the time of each phase (benchmarks).

An observer overrides what it needs; ``LoopObserver`` answers everything with nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch


class LoopObserver:
    """The loop's events, each a no-op here."""

    wants_tokens: bool = False  # ``row_finished`` gets the row's tokens (one read-back each)

    def begin_forward(self, rows: torch.LongTensor, prefill: bool) -> None:
        """``rows``: original row indices (0..B-1) of the rows in the coming forward, in batch
        order, on the model's device. ``prefill``: the forward processes a group's prompts.
        A row that finished may stay in the forwards until the layout drops it: whatever is
        decided for it then comes after its last token."""

    def row_finished(self, row: int, tokens: list[int] | None, reason: str = "") -> None:
        """Row ``row`` ended; ``tokens``: its generated tokens if ``wants_tokens``;
        ``reason``: why (the ending rule's ``reason``, ``engine.stops``; "" where the caller
        cannot say)."""

    def phase(self, name: str, device: torch.device) -> Any:
        """A context around one phase of the loop (``StepTimer``)."""
        return nullcontext()


@dataclass
class Callbacks(LoopObserver):
    """Plain functions as an observer: ``on_finish(row)``, ``on_tokens(row, tokens, reason)``."""

    on_finish: Callable[[int], None] | None = None
    on_tokens: Callable[[int, list[int], str], None] | None = None

    @property
    def wants_tokens(self) -> bool:  # type: ignore[override]
        return self.on_tokens is not None

    def row_finished(self, row: int, tokens: list[int] | None, reason: str = "") -> None:
        if self.on_tokens is not None:
            self.on_tokens(row, tokens, reason)
        if self.on_finish is not None:
            self.on_finish(row)


@dataclass
class StepTimer(LoopObserver):
    """Seconds spent per phase of the loop (``benchmarks/step_cost.py``): ``prefill`` and
    ``forward`` (the model), ``choose``, ``finish`` (storing tokens, the read-back, stop
    checks), ``cache`` (masks and positions, the layout's upkeep), ``compact`` (dropping
    finished rows) and ``join`` (merging a prefilled group). ``sync``: wait for the device at
    every phase boundary, so a GPU's queued work is charged to the phase that queued it (it
    also removes any overlap of host and device work: for attribution only)."""

    sync: bool = False
    seconds: dict[str, float] = field(default_factory=dict)
    decode_steps: int = 0

    @contextmanager
    def phase(self, name: str, device: torch.device) -> Iterator[None]:
        if self.sync and device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        try:
            yield
        finally:
            if self.sync and device.type == "cuda":
                torch.cuda.synchronize(device)
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start


class Observers:
    """Several observers as one, for the loop: events fan out in order, each to the observers
    that define it (a subclass of ``LoopObserver`` or any object with the same methods); the
    first observer that times phases times them."""

    def __init__(self, observers: Sequence[Any]) -> None:
        self.all = [o for o in observers if o is not None]
        self.row_watchers = [o for o in self.all if defines(o, "begin_forward")]
        self.finishers = [o for o in self.all if defines(o, "row_finished")]
        self.wants_tokens = any(getattr(o, "wants_tokens", False) for o in self.all)
        timers = [o for o in self.all if defines(o, "phase")]
        self.phase = timers[0].phase if timers else LoopObserver().phase
        self.timers = [o for o in timers if isinstance(o, StepTimer)]

    def begin_forward(self, rows: torch.LongTensor, prefill: bool) -> None:
        for o in self.row_watchers:
            o.begin_forward(rows, prefill)

    def row_finished(self, row: int, tokens: list[int] | None, reason: str = "") -> None:
        for o in self.finishers:
            o.row_finished(row, tokens, reason)

    def decoded(self) -> None:
        """One decode step ran (``StepTimer.decode_steps``)."""
        for t in self.timers:
            t.decode_steps += 1


def defines(observer: Any, event: str) -> bool:
    """Whether ``observer`` does something on ``event`` (not ``LoopObserver``'s no-op)."""
    method = getattr(type(observer), event, None)
    return method is not None and method is not getattr(LoopObserver, event)
