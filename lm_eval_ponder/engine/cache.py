"""A key/value cache layer that appends a decode step's column in place.

Why: transformers' ``DynamicLayer.update`` appends with ``torch.cat``, copying each layer's whole
cache every decode step. Without that copy the loop ran 1.20x as fast on the embedded shape (256
arith questions, 500 new tokens; a 2-core AMX Xeon in bf16) and 1.02x on the Qwen2.5-0.5B shape
(96 questions), end to end (``benchmarks/cache_append.py``). ``GrowingLayer`` keeps
``SPARE_COLUMNS`` free columns at the end of its buffers, writes each new column there and
exposes the filled part as a view; it copies only when the buffer is full or the loop assigns
a new tensor (compaction, trim, merge), which becomes the buffer with no spare column. The
attention reads the numbers ``torch.cat`` would give (tested token for token against
``generate`` in float32). Memory: at most 16 positions a row beyond the loop's cache budget,
against the 300-1,000 a row is budgeted on our tasks.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

# free columns a grown buffer keeps: a copy of the cache every this many decode steps instead of
# every step, for this many extra positions per row
SPARE_COLUMNS = 16


class GrowingLayer(DynamicLayer):
    """A full-attention ``DynamicLayer`` whose appends write into spare buffer columns."""

    def __init__(self) -> None:
        # each buffer with its own filled length: the loop assigns keys, then values
        # (``layer.values = layer.values[...]`` must still see the old length)
        self._keys: torch.Tensor | None = None
        self._values: torch.Tensor | None = None
        self._filled = {"keys": 0, "values": 0}
        super().__init__()

    # the filled part of each buffer; assigning one makes it the buffer (no spare column)
    keys = property(lambda self: self._view("keys"), lambda self, v: self._assign("keys", v))
    values = property(lambda self: self._view("values"), lambda self, v: self._assign("values", v))

    def _assign(self, name: str, value: torch.Tensor | None) -> None:
        setattr(self, f"_{name}", value)
        self._filled[name] = value.shape[-2] if value is not None and value.dim() == 4 else 0

    def _view(self, name: str) -> torch.Tensor | None:
        buffer, filled = getattr(self, f"_{name}"), self._filled[name]
        if buffer is None or buffer.dim() != 4 or buffer.shape[-2] == filled:
            return buffer
        return buffer[:, :, :filled]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
               ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start = self._filled["keys"]
        end = start + key_states.shape[-2]
        if not (self._fits("keys", key_states, start, end)
                and self._fits("values", value_states, start, end)):
            shape = (*key_states.shape[:2], end + SPARE_COLUMNS, key_states.shape[-1])
            keys, values = key_states.new_empty(shape), value_states.new_empty(shape)
            if start:
                keys[:, :, :start].copy_(self.keys)
                values[:, :, :start].copy_(self.values)
            self._keys, self._values = keys, values
        self._keys[:, :, start:end].copy_(key_states)
        self._values[:, :, start:end].copy_(value_states)
        self._filled = {"keys": end, "values": end}
        return self.keys, self.values

    def _fits(self, name: str, states: torch.Tensor, start: int, end: int) -> bool:
        """Whether ``states`` can be written into the buffer's columns ``start:end``."""
        buffer = getattr(self, f"_{name}")
        return (buffer is not None and buffer.dim() == 4 and self._filled[name] == start
                and end <= buffer.shape[-2] and buffer.shape[:2] == states.shape[:2]
                and buffer.shape[-1] == states.shape[-1])


def new_cache(config) -> DynamicCache:
    """A ``DynamicCache`` for ``config`` (a text config) whose layers are ``GrowingLayer``s.
    Only for models whose cache is all plain ``DynamicLayer``s (``rows.check_model_supported``
    refuses others), so each layer is replaced one for one."""
    cache = DynamicCache(config=config)
    if any(type(layer) is not DynamicLayer for layer in cache.layers):
        return cache
    cache.layers = [GrowingLayer() for _ in cache.layers]
    return cache
