"""The rows in flight of the generation loop, and the dynamic cache layout.

Bookkeeping whose cost follows what changes, not the batch: a decode step touches no per-row
Python state; a finished row is only marked dead (its slot decodes a pad token, masked out of
every choice) until one compaction copies the cache for many finished rows
(``DynamicRows.needs_compaction``); a group of waiting rows joins in one merge. ``pad_cols``
counts a row's leading padding columns in the cache (its keys sit at the right end). Host
lists are mirrored on the device (``*_t``), refreshed only when the batch changes. ``Rows``
owns the lists and mirrors; ``DynamicRows`` adds a ``DynamicCache`` that follows the live rows
and implements ``CacheLayout``, the one protocol the loop drives (docs/design/generation.md).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from transformers import DynamicCache, GenerationMixin
from transformers.cache_utils import DynamicLayer

from lm_eval_ponder.backbone import text_config
from lm_eval_ponder.errors import UnsupportedGeneration

# compact when at least this fraction of the batch is dead rows: they cost their share of each
# forward until then (at most 1/8), against one copy of the whole cache per compaction
DEAD_FRACTION = 0.125


def cache_shape(config) -> tuple[int, int, int] | None:
    """(layers, key/value heads, head dim) of a full-attention cache for ``config``; None when
    the config does not say."""
    config = text_config(config)
    layers = getattr(config, "num_hidden_layers", None)
    heads = getattr(config, "num_attention_heads", None)
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or (
        config.hidden_size // heads if heads and getattr(config, "hidden_size", None) else None)
    if not (layers and kv_heads and head_dim):
        return None
    return int(layers), int(kv_heads), int(head_dim)


def cache_bytes_per_token(config, dtype: torch.dtype) -> int | None:
    """Bytes of key/value cache one token position takes across all layers (a full-attention
    cache of ``num_key_value_heads`` x ``head_dim`` per layer; None when the config does not
    say). An upper bound for sliding-window and hybrid models, which keep less."""
    shape = cache_shape(config)
    if shape is None:
        return None
    layers, kv_heads, head_dim = shape
    return 2 * layers * kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()


def cache_keyword(model) -> str:
    """The name under which ``model.forward`` takes the KV cache: ``cache`` from transformers
    5.24 on (``past_key_values`` is deprecated there, removed in 5.40), ``past_key_values``
    before. Passing the current name keeps the deprecation shim and its warning out of every
    decode step."""
    params = inspect.signature(model.forward).parameters
    for name in ("cache", "past_key_values"):
        if name in params:
            return name
    raise UnsupportedGeneration(f"{type(model).__name__}.forward takes no KV cache argument "
                                "(neither cache nor past_key_values)")


def check_model_supported(model) -> None:
    """Raise ``UnsupportedGeneration`` unless ``model`` is a decoder-only LM whose generation
    cache is a ``DynamicCache`` of plain full-attention ``DynamicLayer``s and whose forward
    takes ``attention_mask`` and ``position_ids``."""
    config = model.config
    if getattr(config, "is_encoder_decoder", False):
        raise UnsupportedGeneration("encoder-decoder model")
    supports_dynamic = getattr(model, "_supports_default_dynamic_cache", None)
    if supports_dynamic is None or not supports_dynamic():
        raise UnsupportedGeneration(f"{type(model).__name__} does not use a DynamicCache")
    if getattr(model, "is_remote_code", lambda: False)():
        raise UnsupportedGeneration("remote-code model (its forward may expect cache_position)")
    prepare = getattr(type(model), "prepare_inputs_for_generation", None)
    if prepare is not GenerationMixin.prepare_inputs_for_generation:
        raise UnsupportedGeneration(
            f"{type(model).__name__} overrides prepare_inputs_for_generation")
    params = inspect.signature(model.forward).parameters
    for name in ("attention_mask", "position_ids"):
        if name not in params:
            raise UnsupportedGeneration(f"{type(model).__name__}.forward takes no {name}")
    cache_keyword(model)
    cache = DynamicCache(config=text_config(model.config))
    kinds = {type(layer).__name__ for layer in cache.layers if type(layer) is not DynamicLayer}
    if kinds:
        raise UnsupportedGeneration(f"cache layers other than full attention: {sorted(kinds)}")


def supports_logits_to_keep(model) -> bool:
    return "logits_to_keep" in inspect.signature(model.forward).parameters


@dataclass
class StepInputs:
    """What one decode forward takes besides the tokens: the cache, the attention mask and the
    new tokens' positions."""

    cache: Any
    mask: torch.Tensor
    position_ids: torch.Tensor


class StepRows(Protocol):
    """The rows of one forward as the loop's step reads and writes them: a prefilled group, or
    the layout in flight. Per batch position: the row's original index (``rows``, mirrored as
    ``rows_t``), the token it fed (``last``), its token history and that history's leading pad
    columns where a repetition penalty needs them, and, once a row has finished, which
    positions are alive (``alive_mask``, ``alive_index``; None while every row is). The step
    ``feed``s the tokens it chose and ``retire``s the rows that ended."""

    rows: list[int]
    rows_t: torch.LongTensor
    last: torch.LongTensor
    history: torch.LongTensor | None
    history_pad_t: torch.LongTensor | None
    alive_mask: torch.Tensor | None
    alive_index: torch.LongTensor | None

    def feed(self, tokens: torch.LongTensor) -> None: ...

    def retire(self, positions: list[int]) -> None: ...


class CacheLayout(StepRows, Protocol):
    """The rows in flight and their cache, as the loop drives them: how many are alive or dead
    (``n_alive``, ``n_dead``, ``live_rows``), prefilled groups ``admit``, finished rows
    ``retire`` (masked until the layout drops them), each decode step takes its ``inputs`` and
    then ``advance``s one column. The layout's own upkeep runs at two points: ``make_room``
    before a group is prefilled and ``compact_after`` after a decode step; its counters go to
    ``work`` (``GenerationResult``'s fields). ``tests/engine/test_loop_protocol.py`` checks that
    the loop touches nothing of a layout that these two protocols do not name."""

    @property
    def n_alive(self) -> int: ...

    @property
    def n_dead(self) -> int: ...

    def live_rows(self) -> list[int]: ...

    def make_room(self, work: Any) -> None: ...

    def admit(self, group: DynamicRows, pad_token_id: int, work: Any) -> None: ...

    def compact_after(self, joining: bool, work: Any) -> None: ...

    def inputs(self) -> StepInputs: ...

    def advance(self) -> None: ...


class Rows:
    """The rows of one batch, in batch order: their original indices, leading padding, the
    token each feeds next, a token history where a repetition penalty needs it, and which are
    still alive. Host lists, mirrored on ``device`` by ``refresh``."""

    def __init__(self, rows: list[int], pad_cols: list[int], last: torch.LongTensor,
                 device: torch.device, history: torch.LongTensor | None = None,
                 history_pad: list[int] | None = None) -> None:
        self.rows, self.pad_cols, self.last = rows, pad_cols, last
        self.history, self.history_pad = history, history_pad
        self.alive: list[bool] | None = None  # None: every row is alive
        self.device = device
        self.pad_cols_t = self.rows_t = self.history_pad_t = None
        self.alive_mask: torch.Tensor | None = None  # bool [R]; None: every row is alive
        self.alive_index: torch.LongTensor | None = None  # positions of the live rows
        self.refresh()

    @property
    def n_alive(self) -> int:
        return len(self.rows) if self.alive is None else sum(self.alive)

    @property
    def n_dead(self) -> int:
        return len(self.rows) - self.n_alive

    def live_rows(self) -> list[int]:
        return self.rows if self.alive is None else \
            [r for r, a in zip(self.rows, self.alive) if a]

    def refresh(self) -> None:
        device = self.device
        self.pad_cols_t = torch.tensor(self.pad_cols, dtype=torch.long, device=device)
        self.rows_t = torch.tensor(self.rows, dtype=torch.long, device=device)
        if self.history_pad is not None:
            self.history_pad_t = torch.tensor(self.history_pad, dtype=torch.long, device=device)
        self.refresh_alive()

    def refresh_alive(self) -> None:
        if self.alive is None or all(self.alive):
            self.alive, self.alive_mask, self.alive_index = None, None, None
            return
        self.alive_mask = torch.tensor(self.alive, dtype=torch.bool, device=self.device)
        self.alive_index = torch.tensor([i for i, a in enumerate(self.alive) if a],
                                        dtype=torch.long, device=self.device)

    def feed(self, tokens: torch.LongTensor) -> None:
        """The tokens just chosen become what each row feeds next, and join its history."""
        self.last = tokens
        if self.history is not None:
            self.history = torch.cat([self.history, tokens[:, None]], dim=1)

    def retire(self, positions: list[int]) -> None:
        """Mark rows at these batch positions finished: they stay, masked, until the layout
        drops them."""
        if not positions:
            return
        if self.alive is None:
            self.alive = [True] * len(self.rows)
        for i in positions:
            self.alive[i] = False
        self.refresh_alive()


class DynamicRows(Rows):
    """A ``DynamicCache`` whose batch is the rows in flight and whose columns reach back to the
    longest live row: finished rows are dropped (``compact``), joining groups are merged in
    (``merge``), padding columns no row needs are trimmed. A prefilled group is one too."""

    def __init__(self, cache: DynamicCache, length: int, rows: list[int], pad_cols: list[int],
                 last: torch.LongTensor, device: torch.device,
                 history: torch.LongTensor | None = None, history_pad: list[int] | None = None
                 ) -> None:
        self.cache, self.length = cache, length  # length: cache columns
        super().__init__(rows, pad_cols, last, device, history, history_pad)

    # ------------------------------------------------------------------ the layout protocol
    def make_room(self, work: Any) -> None:
        """Before a group joins: drop the dead rows (a merge copies the cache anyway)."""
        if self.n_dead:
            self.compact()
            work.compactions += 1

    def admit(self, group: DynamicRows, pad_token_id: int, work: Any) -> None:
        if not self.rows:
            self.take(group)
            return
        self.merge(group, pad_token_id)
        work.joins += 1

    def compact_after(self, joining: bool, work: Any) -> None:
        """After a step: compact once enough rows are dead, unless rows are about to join
        (``make_room`` compacts then)."""
        if self.needs_compaction() and not joining:
            self.compact()
            work.compactions += 1

    def inputs(self) -> StepInputs:
        # the new token's position is the row's count of real tokens already cached
        return StepInputs(self.cache, self.decode_mask(),
                          (self.length - self.pad_cols_t)[:, None])

    def advance(self) -> None:
        self.length += 1

    # ------------------------------------------------------------------ upkeep
    def take(self, group: DynamicRows) -> None:
        """Become ``group`` (the first rows of an empty batch)."""
        self.cache, self.length = group.cache, group.length
        self.rows, self.pad_cols, self.last = group.rows, group.pad_cols, group.last
        self.history, self.history_pad, self.alive = group.history, group.history_pad, group.alive
        self.refresh()

    def needs_compaction(self) -> bool:
        dead = self.n_dead
        return dead > 0 and (dead == len(self.rows) or dead >= DEAD_FRACTION * len(self.rows))

    def compact(self) -> None:
        """Drop the dead rows from the batch and its cache, then trim the padding columns."""
        if self.alive is None:
            return
        keep = [i for i, a in enumerate(self.alive) if a]
        index = torch.tensor(keep, dtype=torch.long, device=self.device)
        self.cache.batch_select_indices(index)
        self.rows = [self.rows[i] for i in keep]
        self.pad_cols = [self.pad_cols[i] for i in keep]
        self.last = self.last.index_select(0, index)
        if self.history is not None:
            self.history = self.history.index_select(0, index)
            self.history_pad = [self.history_pad[i] for i in keep]
        self.alive = None
        self.trim()
        self.refresh()

    def trim(self) -> None:
        """Drop leading cache columns that are padding for every row."""
        if not self.rows:
            return
        cut = min(self.pad_cols)
        if cut > 0:
            for layer in self.cache.layers:
                if layer.is_initialized and layer.keys.numel():
                    layer.keys = layer.keys[:, :, cut:, :]
                    layer.values = layer.values[:, :, cut:, :]
            self.pad_cols = [p - cut for p in self.pad_cols]
            self.length -= cut
        if self.history is not None:
            hcut = min(self.history_pad)
            if hcut > 0:
                self.history = self.history[:, hcut:]
                self.history_pad = [p - hcut for p in self.history_pad]

    def merge(self, group: DynamicRows, pad_token_id: int) -> None:
        """Append ``group``'s rows (both compacted): align cache lengths by left-padding K/V
        with zeros (those columns are masked: their ``pad_cols`` grows), then concatenate."""
        length = max(self.length, group.length)
        da, db = length - self.length, length - group.length
        for la, lb in zip(self.cache.layers, group.cache.layers, strict=True):
            la.keys = torch.cat([left_pad(la.keys, da, 2), left_pad(lb.keys, db, 2)], dim=0)
            la.values = torch.cat([left_pad(la.values, da, 2), left_pad(lb.values, db, 2)],
                                  dim=0)
        self.rows += group.rows
        self.pad_cols = [p + da for p in self.pad_cols] + [p + db for p in group.pad_cols]
        self.length = length
        self.last = torch.cat([self.last, group.last])
        if self.history is not None and group.history is not None:
            ha, hb = self.history.shape[1], group.history.shape[1]
            width = max(ha, hb)
            self.history = torch.cat([left_pad(self.history, width - ha, 1, pad_token_id),
                                      left_pad(group.history, width - hb, 1, pad_token_id)],
                                     dim=0)
            self.history_pad = ([p + width - ha for p in self.history_pad]
                                + [p + width - hb for p in group.history_pad])
        self.refresh()

    def decode_mask(self) -> torch.Tensor:
        """The attention mask of the next decode step: row i attends to columns >= pad_cols[i]."""
        width = self.length + 1
        return (torch.arange(width, device=self.pad_cols_t.device)[None, :]
                >= self.pad_cols_t[:, None]).long()


def empty_rows(device: torch.device) -> DynamicRows:
    """A dynamic layout with no rows yet: the first admitted group becomes it."""
    return DynamicRows(None, 0, [], [], torch.empty(0, dtype=torch.long, device=device), device)


def left_pad(x: torch.Tensor, n: int, dim: int, value: int | float = 0) -> torch.Tensor:
    if n == 0:
        return x
    shape = list(x.shape)
    shape[dim] = n
    return torch.cat([x.new_full(shape, value), x], dim=dim)
