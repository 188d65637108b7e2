"""Progress of a generation call that keeps many rows in flight: a bar that moves per finished
row with a rate that means something, and a status line while nothing finishes.

Why: the loop (``engine.loop``) decodes up to ``max_rows`` rows at once, so the first row
finishes only after most of the first wave's work. A bar that extrapolates from finished rows
then shows ``1/300 [01:33<7:44:00]`` for a run on course for under an hour, and at the end stays
frozen at ``45/50`` while the last long answers decode for minutes. Both generation paths are
counted (the loop and ``generate``, of which only the first tells ``LoopObserver``s anything)
from two things visible outside either: finished rows (``finish``, the ``on_finish`` callback)
and forward passes (``watch``: a pre-hook on the model). A pass over an empty cache is a
prefill (its rows start, each yields a token); any other is a decode step, one token per row in
flight (started minus finished). Under ``generate`` rows finish only with the batch, so its
tokens include what finished rows keep decoding.

The bar shows finished/total requests, rows in flight, tokens and tokens per second, and a time
left only once as many rows have finished as were ever in flight at once (before that, each
finished row is one of the shortest). With no row finished for ``STATUS_EVERY_S``, a status
line at most every ``STATUS_EVERY_S`` says the same. Bar and line read the same counters at the
same moment (``figures``): once they showed different token counts side by side. It cannot say
how far along each row in flight is, nor how many tokens a row will need.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from lm_eval_ponder.engine import Callbacks, LoopObserver

STATUS_EVERY_S = 30.0


def duration(seconds: float) -> str:
    """``4321.5`` as ``1:12:02``, ``95`` as ``1:35``: tqdm's own way of showing times."""
    seconds = int(round(max(seconds, 0.0)))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class RowProgress:
    """The bar and status lines of one generation call over ``total`` requests.

    Use: ``with RowProgress(total, desc) as progress, progress.watch(model): generate(...,
    observers=[progress.observer()])``. ``clock`` and ``write`` are seams for tests.
    """

    def __init__(self, total: int, desc: str, *, unit: str = "request", disable: bool = False,
                 status_every: float = STATUS_EVERY_S,
                 clock: Callable[[], float] = time.monotonic,
                 write: Callable[[str], None] | None = None) -> None:
        from tqdm import tqdm

        self.total, self.desc, self.disabled = total, desc, disable
        self.status_every, self.clock = status_every, clock
        self.write = write or (lambda line: tqdm.write(line, file=sys.stderr))
        self.finished = self.started = self.tokens = self.peak_in_flight = 0
        self.prefilling = 0  # rows of the prefill forward running now (0: none)
        self.watched = False
        self.start = self.last_finish = self.last_status = clock()
        self.bar = tqdm(total=total, desc=desc, unit=unit, disable=disable,
                        bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]")
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None
        if not disable and status_every > 0:
            self.thread = threading.Thread(target=self.watch_tail, daemon=True,
                                           name="lm-eval-ponder progress")
            self.thread.start()

    # ------------------------------------------------------------------ what is counted
    @property
    def in_flight(self) -> int:
        return max(self.started - self.finished, 0)

    def finish(self, _row: int | None = None) -> None:
        """``on_finish``: one more row (request) has finished."""
        self.finished += 1
        self.last_finish = self.clock()
        self.bar.set_postfix_str(self.postfix(), refresh=False)
        self.bar.update(1)

    def forward(self, rows: int, prefill: bool) -> None:
        """One forward pass of ``rows`` rows (``watch`` calls this)."""
        if prefill:
            self.started += rows
            self.tokens += rows
            self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        else:
            self.tokens += min(rows, self.in_flight) if self.started else rows

    def observer(self) -> LoopObserver:
        """The bar as the generation loop's observer: a tick per finished row."""
        return Callbacks(on_finish=self.finish)

    @contextlib.contextmanager
    def watch(self, model: Any) -> Iterator[None]:
        """Count the forward passes of ``model`` while the block runs (nothing when the bar is
        disabled: no hook, no cost)."""
        if self.disabled:
            yield
            return

        def pre_hook(module, args, kwargs):
            ids = kwargs.get("input_ids", args[0] if args else None)
            if ids is None:
                ids = kwargs.get("inputs_embeds")
            if ids is None or not hasattr(ids, "shape"):
                return
            cache = kwargs.get("cache", kwargs.get("past_key_values"))
            length = getattr(cache, "get_seq_length", None)
            prefill = cache is None or (length is not None and length() == 0)
            self.forward(int(ids.shape[0]), prefill)
            if prefill:  # said at once: a prefill of many rows runs for many seconds
                self.prefilling = int(ids.shape[0])
                self.bar.set_postfix_str(self.postfix())

        def post_hook(module, args, output):
            self.prefilling = 0

        handles = [model.register_forward_pre_hook(pre_hook, with_kwargs=True),
                   model.register_forward_hook(post_hook)]
        self.watched = True
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    # ------------------------------------------------------------------ what is shown
    def figures(self) -> list[str]:
        """Rows in flight, tokens so far and the token rate since the call began: what the bar
        and the status line both show."""
        if not self.watched:
            return []
        elapsed = max(self.clock() - self.start, 1e-9)
        prefilling = [f"prefilling {self.prefilling} rows"] if self.prefilling else []
        return [*prefilling, f"{self.in_flight} in flight", f"{self.tokens:,} tokens",
                f"{self.tokens / elapsed:.1f} tok/s"]

    def postfix(self) -> str:
        parts = self.figures()
        if self.finished and self.finished >= max(self.peak_in_flight, 1) \
                and self.finished < self.total:
            elapsed = max(self.clock() - self.start, 1e-9)
            left = (self.total - self.finished) * elapsed / self.finished
            parts.append(f"~{duration(left)} left")
        return ", ".join(parts)

    def status_line(self) -> str:
        line = ", ".join([f"{self.desc}: {self.finished}/{self.total} finished",
                          *self.figures()])
        if not self.finished:
            return line + f"; no row finished yet ({duration(self.clock() - self.start)} in)"
        return line + f"; last row finished {duration(self.clock() - self.last_finish)} ago"

    def check_tail(self) -> None:
        """Redraw the bar with the counters of now; write a status line if no row finished,
        and no line was written, for ``status_every`` seconds."""
        now = self.clock()
        self.bar.set_postfix_str(self.postfix())
        if self.finished >= self.total or now - self.last_finish < self.status_every \
                or now - self.last_status < self.status_every:
            return
        self.write(self.status_line())
        self.last_status = now

    def watch_tail(self) -> None:
        """Redraw every second (the bar is live from the first forward, not from the first
        finished row), with a status line at most every ``status_every`` seconds."""
        while not self.stop.wait(min(self.status_every / 6, 1.0)):
            self.check_tail()

    # ------------------------------------------------------------------ lifetime
    def close(self) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join()
        self.bar.close()

    def __enter__(self) -> RowProgress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
