"""Decode steps of one fixed shape, so that a GPU can replay them as a CUDA graph.

Why: on an H100 (2026-11-26, ``benchmarks/step_cost.py --device cuda``) a decode step of the
embedded 135M model at 256 rows took 28.5 ms, of which the forward was 27.1 ms and the loop's
own host work 1.4 ms; the memory floor of that forward is about 1 ms. The rest is Python
launching some 600 small kernels per step. ``benchmarks/compile_step.py --device cuda`` timed
the same forward over a ``StaticCache`` replayed as a CUDA graph at 8.9 ms (256 rows) and 3.6 ms
(64 rows), against 28.3 and 25.6 eager. A graph replays fixed shapes at fixed addresses, which
the loop's ``DynamicCache`` (rows dropped, joined, columns trimmed) never has.

So in this layout (``StaticSlots``):
- the batch is ``slots`` rows, always: a finished row's slot keeps decoding a pad token,
  masked out of every choice, until a joining row takes it;
- one ``StaticCache`` of ``width`` columns; every row's keys end at the current column ``col``,
  row i attends to columns ``lead[i]..col`` (its own keys; a per-row mask);
- a joining group is prefilled as before (eager, its own ``DynamicCache``), then its keys are
  copied into free slots ending at ``col`` (every row first shifts right if the group's prompts
  are wider than ``col``);
- when ``col`` reaches ``width``, every row shifts left by the smallest ``lead`` of the live
  rows: ``width`` holds the widest prompt plus ``max_new_tokens``, so a live row always leaves
  room;
- once no row waits and the live rows fit a quarter of the slots (``tail_slots``), they move
  into a static cache of that many slots (``StaticSlots.take``), and so on down. On an H100 the
  dynamic run's tail (its last 69 rows) took half the wall time of a 500-document run at one
  launch-bound step per token, and a replayed step of 64 rows cost 3.6 ms against 8.9 at 256,
  so a tail decoded at the width of the whole batch wastes most of each step on dead slots. The
  ladder (e.g. 256, 64, 16, 8) keeps the shapes, and so the graphs to capture, few.

Modes (``DECODE_STEPS``; the loop's default is ``dynamic``): ``static`` runs this layout
eagerly (it is what the tests check on a CPU, token for token against ``dynamic``);
``captured`` records the eager forward with ``torch.cuda.graph`` once per shape
(``evaluation.graph_capture``: no dynamo, so a shape costs two forwards, not a trace);
``cudagraphs`` captures the forward with ``torch.compile(backend=ReplayBackend())`` (dynamo's graph
of the model's own kernels replayed by CUDA graph trees, no kernel generation; not dynamo's
``"cudagraphs"`` backend, which copies the weights and the cache at every replay:
``evaluation.graph_replay``); ``inductor`` compiles it with
``mode="reduce-overhead"`` (inductor's kernels in CUDA graphs: about 30 s to compile the
embedded model on an H100). Compiled forwards and their caches are kept per model and shape,
so later calls of the same shape reuse them.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable

import torch
from transformers import StaticCache

from lm_eval_ponder.errors import PonderError
from lm_eval_ponder.evaluation.graph_capture import CapturedForward
from lm_eval_ponder.evaluation.graph_replay import ReplayBackend, ReplayPlan

DECODE_STEPS = ("dynamic", "static", "captured", "cudagraphs", "inductor")
GRAPH_MODES = ("captured", "cudagraphs", "inductor")
# compiled shapes are rounded up (rows to ROWS_ROUND, columns to WIDTH_ROUND) so that calls with
# similar prompts share one graph instead of compiling their own
ROWS_ROUND = 8
WIDTH_ROUND = 64
# the tail moves into this fraction of the slots (the ladder's step)
TAIL_FACTOR = 4

_KEPT: "weakref.WeakKeyDictionary[Any, dict[tuple, Any]]" = weakref.WeakKeyDictionary()


def check_decode_step(value: str | None) -> str:
    mode = "dynamic" if value in (None, "", "auto") else str(value).strip().lower()
    if mode not in DECODE_STEPS:
        raise PonderError(f"decode_step must be one of {', '.join(DECODE_STEPS)} (or auto), "
                          f"got {value!r}")
    return mode


def round_up(n: int, step: int) -> int:
    return -(-n // step) * step


def slot_shape(mode: str, rows: int, widest: int, max_new: int) -> tuple[int, int]:
    """Slots and columns for a call: every row in flight, and the widest prompt plus
    ``max_new_tokens`` plus the column the next token writes."""
    slots, width = rows, widest + max_new + 1
    if mode in GRAPH_MODES:
        slots, width = round_up(slots, ROWS_ROUND), round_up(width, WIDTH_ROUND)
    return slots, width


def tail_slots(mode: str, slots: int, alive: int) -> int | None:
    """The slot count the live rows move to once no row waits, or None to stay: a quarter of
    ``slots`` (graph modes round it up to ``ROWS_ROUND``, so the ladder ends there), when the
    ``alive`` rows fit in it."""
    smaller = slots // TAIL_FACTOR
    if mode in GRAPH_MODES:
        smaller = round_up(smaller, ROWS_ROUND)
    if smaller < 1 or smaller >= slots or alive > smaller:
        return None
    return smaller


def decode_forward(model, mode: str) -> Callable[..., Any]:
    """The forward a static decode step calls: the model's own, or its graph-captured form
    (one per model and mode, kept while the model lives)."""
    if mode not in GRAPH_MODES:
        return model  # the module call: its hooks (the progress bar's) see every step
    kept = _KEPT.setdefault(model, {})
    if ("forward", mode) not in kept:
        if mode == "captured":
            kept["forward", mode] = CapturedForward(model)
        elif mode == "cudagraphs":
            kept["backend", mode] = backend = ReplayBackend()
            kept["forward", mode] = torch.compile(model.forward, backend=backend,
                                                  fullgraph=True, dynamic=False)
        else:
            kept["forward", mode] = torch.compile(model.forward, mode="reduce-overhead",
                                                  fullgraph=True, dynamic=False)
    return kept["forward", mode]


def replay_plans(model) -> list[ReplayPlan]:
    """The plans of the graphs ``decode_step=cudagraphs`` compiled for ``model`` so far (which
    replay, which run eagerly and why: ``evaluation.graph_replay``)."""
    backend = _KEPT.get(model, {}).get(("backend", "cudagraphs"))
    return list(backend.plans) if backend is not None else []


def kept_caches(model) -> list[tuple]:
    """(mode, slots, width) of the static caches kept for ``model``."""
    return [k[1:] for k in _KEPT.get(model, {}) if k[0] == "cache"]


class StaticSlots:
    """The static cache of a call and the column its next decode step writes (see the module
    docstring). Host state (``col``) mirrors the cache layers' ``cumulative_length``, which
    each forward advances by one and which is reset after every shift."""

    def __init__(self, model, mode: str, slots: int, width: int, text_config) -> None:
        self.mode, self.slots, self.width = mode, slots, width
        self.device = model.device
        key = ("cache", mode, slots, width)
        kept = _KEPT.setdefault(model, {}) if mode in GRAPH_MODES else {}
        if key not in kept:  # a graph holds its cache's addresses: reuse the cache with it
            # one width per mode (its tail ladder's slot counts beside it): a call of another
            # width frees the last one's (GiBs on a GPU; a later call of that width allocates
            # and records again)
            for old in [k for k in kept if k[:2] == ("cache", mode) and k[3] != width]:
                del kept[old]
            kept[key] = StaticCache(config=text_config, max_cache_len=width)
        self.cache = kept[key]
        self.forward = decode_forward(model, mode)
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

    def take(self, other: "StaticSlots", index: torch.LongTensor) -> None:
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

    def mask_and_positions(self, lead: torch.LongTensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Row i attends to its own columns ``lead[i]..col``; its new token's position is the
        count of its real tokens already cached (as the dynamic loop computes it)."""
        mask = ((self.columns >= lead[:, None]) & (self.columns <= self.col)).long()
        return mask, (self.col - lead)[:, None]
