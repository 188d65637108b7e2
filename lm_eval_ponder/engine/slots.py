"""The static cache layout: decode steps of one fixed shape, which a GPU replays as a CUDA graph
(``decode_step=captured``; ``engine.capture``).

Why: on an H100 (2026-11-26, ``benchmarks/step_cost.py --device cuda``) a decode step of the
embedded 135M model at 256 rows took 28.5 ms, of which the forward was 27.1 ms and the loop's
own host work 1.4 ms; the memory floor of that forward is about 1 ms. The rest is Python
launching some 600 small kernels per step. ``benchmarks/compile_step.py --device cuda`` timed
the same forward over a ``StaticCache`` replayed as a CUDA graph at 8.9 ms (256 rows) and 3.6 ms
(64 rows), against 28.3 and 25.6 eager. A graph replays fixed shapes at fixed addresses, which
the dynamic layout (rows dropped, joined, columns trimmed) never has.

So in this layout (``SlotRows`` over a ``StaticSlots`` cache):
- the batch is ``slots`` rows, always: a finished row's slot keeps decoding a pad token,
  masked out of every choice, until a joining row takes it;
- one ``StaticCache`` of ``width`` columns; every row's keys end at the current column ``col``,
  row i attends to columns ``pad_cols[i]..col`` (its own keys; a per-row mask);
- a joining group is prefilled as before (eager, its own ``DynamicCache``), then its keys are
  copied into free slots ending at ``col`` (every row first shifts right if the group's prompts
  are wider than ``col``);
- when ``col`` reaches ``width``, every row shifts left by the smallest ``pad_cols`` of the live
  rows: ``width`` holds the widest prompt plus ``max_new_tokens``, so a live row always leaves
  room;
- once no row waits and the live rows fit a quarter of the slots (``tail_slots``), they move
  into a static cache of that many slots (``StaticSlots.take``), and so on down. On an H100 the
  dynamic run's tail (its last 69 rows) took half the wall time of a 500-document run at one
  launch-bound step per token, and a replayed step of 64 rows cost 3.6 ms against 8.9 at 256,
  so a tail decoded at the width of the whole batch wastes most of each step on dead slots. The
  ladder (e.g. 256, 64, 16, 8) keeps the shapes, and so the graphs to capture, few.

Shapes are rounded up (rows to ``ROWS_ROUND``, columns to ``WIDTH_ROUND``) so that calls with
similar prompts share one graph, and caches (with their graphs) are kept per model and shape.
On a CPU the same layout runs eagerly: that is what the tests check, token for token against
the dynamic layout. Two other graph mechanisms were built and measured before (dynamo's
``cudagraphs`` backend and inductor's ``reduce-overhead``); both lost to the eager dynamic loop
on the only GPU run and were deleted (``docs/results/``, the GPU sessions).
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from transformers import StaticCache

from lm_eval_ponder.engine.capture import CapturedForward
from lm_eval_ponder.engine.rows import DynamicRows, Rows, StepInputs

# compiled shapes are rounded up (rows to ROWS_ROUND, columns to WIDTH_ROUND) so that calls with
# similar prompts share one graph instead of compiling their own
ROWS_ROUND = 8
WIDTH_ROUND = 64
# the tail moves into this fraction of the slots (the ladder's step)
TAIL_FACTOR = 4

_KEPT: "weakref.WeakKeyDictionary[Any, dict[tuple, Any]]" = weakref.WeakKeyDictionary()


def round_up(n: int, step: int) -> int:
    return -(-n // step) * step


def slot_shape(n_rows: int, widest: int, max_new: int) -> tuple[int, int]:
    """Slots and columns for a call: every row in flight, and the widest prompt plus
    ``max_new_tokens`` plus the column the next token writes, rounded up."""
    return round_up(n_rows, ROWS_ROUND), round_up(widest + max_new + 1, WIDTH_ROUND)


def tail_slots(slots: int, alive: int) -> int | None:
    """The slot count the live rows move to once no row waits, or None to stay: a quarter of
    ``slots`` rounded up to ``ROWS_ROUND`` (so the ladder ends there), when the ``alive`` rows
    fit in it."""
    smaller = round_up(slots // TAIL_FACTOR, ROWS_ROUND)
    if smaller < 1 or smaller >= slots or alive > smaller:
        return None
    return smaller


def decode_forward(model) -> CapturedForward:
    """The forward a static decode step calls: the model's forward captured per shape (one per
    model, kept while the model lives)."""
    kept = _KEPT.setdefault(model, {})
    if "forward" not in kept:
        kept["forward"] = CapturedForward(model)
    return kept["forward"]


def kept_caches(model) -> list[tuple]:
    """(slots, width) of the static caches kept for ``model``."""
    return [k[1:] for k in _KEPT.get(model, {}) if k[0] == "cache"]


class StaticSlots:
    """A static cache and the column its next decode step writes (see the module docstring).
    Host state (``col``) mirrors the cache layers' ``cumulative_length``, which each forward
    advances by one and which is reset after every shift. Kept per model and shape: a graph
    holds its cache's addresses, so the cache is reused with it."""

    def __init__(self, model, slots: int, width: int, text_config) -> None:
        self.slots, self.width = slots, width
        self.device = model.device
        key = ("cache", slots, width)
        kept = _KEPT.setdefault(model, {})
        if key not in kept:
            # one width (its tail ladder's slot counts beside it): a call of another width
            # frees the last one's (GiBs on a GPU; a later call of that width allocates and
            # records again)
            for old in [k for k in kept if k[0] == "cache" and k[2] != width]:
                del kept[old]
            kept[key] = StaticCache(config=text_config, max_cache_len=width)
        self.cache = kept[key]
        self.forward = decode_forward(model)
        self.col = 0
        self.columns = torch.arange(width, device=self.device)[None, :]

    def allocate(self, like_keys: torch.Tensor, like_values: torch.Tensor) -> None:
        for layer in self.cache.layers:
            if not layer.is_initialized:
                shape = (self.slots, *like_keys.shape[1:2], 1, like_keys.shape[-1])
                vshape = (self.slots, *like_values.shape[1:2], 1, like_values.shape[-1])
                layer.lazy_initialization(like_keys.new_empty(shape),
                                          like_values.new_empty(vshape))

    def set_column(self, col: int) -> None:
        self.col = col
        for layer in self.cache.layers:
            layer.cumulative_length.fill_(col)

    def shift(self, by: int) -> None:
        """Move every slot's columns ``by`` to the right (negative: to the left)."""
        w = self.width
        for layer in self.cache.layers:
            if not layer.is_initialized:  # nothing placed yet
                continue
            for t in (layer.keys, layer.values):
                if by > 0:
                    t[:, :, by:] = t[:, :, :w - by].clone()
                else:
                    t[:, :, :w + by] = t[:, :, -by:].clone()
        self.set_column(self.col + by)

    def place(self, slots: torch.LongTensor, group_cache, span: int) -> None:
        """Copy a prefilled group's cache (``span`` columns, rows in ``slots`` order) so that
        its keys end at the current column."""
        first = next(layer for layer in group_cache.layers if layer.is_initialized)
        self.allocate(first.keys, first.values)
        if span > self.col:
            raise AssertionError("shift right before placing a wider group")
        lo, hi = self.col - span, self.col
        for dst, src in zip(self.cache.layers, group_cache.layers, strict=True):
            dst.keys[slots, :, lo:hi] = src.keys
            dst.values[slots, :, lo:hi] = src.values
        self.set_column(self.col)

    def take(self, other: StaticSlots, index: torch.LongTensor) -> None:
        """Copy ``other``'s slots ``index`` (in that order) into this cache's first slots, at
        the same columns (the tail's move to fewer slots; both caches have the same width)."""
        if other.width != self.width or len(index) > self.slots:
            raise AssertionError("a tail moves to fewer slots of the same width")
        first = next((layer for layer in other.cache.layers if layer.is_initialized), None)
        if first is not None:
            self.allocate(first.keys, first.values)
            n = len(index)
            for dst, src in zip(self.cache.layers, other.cache.layers, strict=True):
                dst.keys[:n] = src.keys.index_select(0, index)
                dst.values[:n] = src.values.index_select(0, index)
        self.set_column(other.col)

    def mask_and_positions(self, pad_cols: torch.LongTensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Row i attends to its own columns ``pad_cols[i]..col``; its new token's position is the
        count of its real tokens already cached (as the dynamic layout computes it)."""
        mask = ((self.columns >= pad_cols[:, None]) & (self.columns <= self.col)).long()
        return mask, (self.col - pad_cols)[:, None]


class SlotRows(Rows):
    """The rows in flight over a ``StaticSlots`` cache: the static ``CacheLayout``. Every
    slot is a row of the batch; a slot no row holds (``rows[i] == free_row``) is dead."""

    def __init__(self, model, slots: StaticSlots, pad_token_id: int, free_row: int,
                 shrink_tail: bool, text_config) -> None:
        self.model, self.slots, self.free_row, self.pad = model, slots, free_row, pad_token_id
        self.shrink_tail, self.text_config = shrink_tail, text_config
        n = slots.slots
        super().__init__([free_row] * n, [0] * n,
                         torch.full((n,), pad_token_id, dtype=torch.long, device=slots.device),
                         slots.device, alive=[False] * n)

    @property
    def length(self) -> int:
        return self.slots.col

    # ------------------------------------------------------------------ the layout protocol
    def make_room(self, work: Any) -> None:
        """Nothing: a joining group takes the dead slots."""

    def admit(self, group: DynamicRows, pad_token_id: int, work: Any) -> None:
        """Copy a prefilled group's cache into free slots (``StaticSlots.place``), its keys
        ending at the current column (every slot shifts right first if the group is wider)."""
        slots = self.slots
        span = group.length
        if span > slots.col:
            by = span - slots.col
            slots.shift(by)
            self.pad_cols = [p + by for p in self.pad_cols]
        free = [i for i, a in enumerate(self.alive_flags()) if not a][:len(group.rows)]
        if len(free) < len(group.rows):
            raise AssertionError("admitted more rows than free slots")
        index = torch.tensor(free, dtype=torch.long, device=self.device)
        slots.place(index, group.cache, span)
        alive = self.alive_flags()
        for i, row, pad_cols in zip(free, group.rows, group.pad_cols):
            self.rows[i], self.pad_cols[i] = row, slots.col - span + pad_cols
            alive[i] = True
        self.alive = alive
        self.last = self.last.index_copy(0, index, group.last)
        self.refresh()
        work.joins += 1

    def tidy(self, waiting: bool, work: Any) -> None:
        """Before a step: once no row waits, move the live rows into fewer slots when they fit
        (``tail_slots``); when the cache is full, drop the columns no live row attends to."""
        if not waiting and self.shrink_tail:
            smaller = tail_slots(self.slots.slots, self.n_alive)
            if smaller is not None:
                self.move_tail(smaller)
                work.tail_moves += 1
        if self.slots.col >= self.slots.width:
            self.shift_left()
            work.compactions += 1

    def compact_after(self, joining: bool, work: Any) -> None:
        """Nothing: a dead slot stays until a joining row takes it."""

    def inputs(self, model) -> StepInputs:
        mask, position_ids = self.slots.mask_and_positions(self.pad_cols_t)
        return StepInputs(self.slots.forward, self.slots.cache, mask, position_ids)

    def advance(self) -> None:
        self.slots.col += 1

    # ------------------------------------------------------------------ upkeep
    def shift_left(self) -> None:
        """The cache is full: drop the columns no live row attends to."""
        cut = min(p for p, a in zip(self.pad_cols, self.alive_flags()) if a)
        if cut < 1:
            raise AssertionError("a live row spans the whole static cache")
        self.slots.shift(-cut)
        self.pad_cols = [max(p - cut, 0) for p in self.pad_cols]
        self.refresh()

    def move_tail(self, n_slots: int) -> None:
        """Move the live rows into a static cache of ``n_slots`` slots, so the tail's steps run
        (or replay) for them and not for every slot."""
        old = self.slots
        live = [i for i, a in enumerate(self.alive_flags()) if a]
        index = torch.tensor(live, dtype=torch.long, device=self.device)
        new = StaticSlots(self.model, n_slots, old.width, self.text_config)
        new.take(old, index)
        free = n_slots - len(live)
        self.rows = [self.rows[i] for i in live] + [self.free_row] * free
        self.pad_cols = [self.pad_cols[i] for i in live] + [0] * free
        self.last = torch.cat([self.last.index_select(0, index),
                               self.last.new_full((free,), self.pad)])
        self.alive = [True] * len(live) + [False] * free
        self.slots = new
        self.refresh()
