"""A generation loop in which a finished row stops costing compute.

Why: lm-eval's HFLM calls ``model.generate`` on a left-padded batch with a batch-wide stopping
criterion, so every row keeps decoding until the longest row is done. On our arith workload
(SmolLM2-135M, bf16, batch 64, 256 new tokens) only 46% of the decoded slots are real output
(NOTES.md, "Generation speed"). ``generate_rows`` runs the same model forward passes with the
same ``DynamicCache`` that ``generate`` uses, but

- a row leaves the running batch as soon as it emits an EOS id, completes one of its stop strings
  (searched in its own decoded generated text, so a stop string split across tokens is caught;
  ``evaluation.stops``) or reaches ``max_new_tokens``; its key/value rows are dropped from the
  cache (``DynamicCache.batch_select_indices``) once an eighth of the batch has finished, and
  cache columns that became padding for every remaining row are trimmed
  (``evaluation.rowbatch``);
- with ``max_rows`` smaller than the batch, waiting rows are prefilled as a left-padded group
  and join the running batch when enough slots are free (continuous batching): the two caches
  are aligned by left-padding keys/values and the attention mask with zeros, then concatenated
  along the batch;
- a group whose prompts differ more than twofold is prefilled in parts (``prefill_parts``),
  so short prompts are not padded to a long one's length in the prefill forward;
- with ``max_cache_tokens``, rows in flight times the widest row's prompt plus
  ``max_new_tokens`` stay within that many cache positions. Rows share one cache width, so one
  long prompt widens every row's cache to its length: GPQA's longest question (2,899 tokens,
  against a median of 168) took a 128-row batch past 13 GiB on a 135M model, and the kernel
  killed the run. ``cache_bytes_per_token`` turns a memory budget into positions.

Positions are explicit (``attention_mask.cumsum(-1) - 1`` as ``generate`` computes them, then
"real tokens so far" per row), logits are processed with transformers' own processor/warper
classes in ``generate``'s order, and settings are merged over ``model.generation_config`` the way
``generate`` merges them (``evaluation.sampling``), so greedy outputs match ``generate`` token for
token (tests check this in fp32). Anything the loop cannot reproduce exactly raises
``UnsupportedGeneration`` before any forward pass; the caller then uses ``model.generate``.

Host work per decode step does not grow with rows in Python (issue 36): tokens and counts
live in device tensors and are read back once per finished row; one small tensor of flags
(ended, maybe-stopped, count) per step is the one host sync; only rows whose new token can
complete a stop string are decoded. ``benchmarks/step_cost.py`` splits a step's time.

Integration with HFLM's ``_model_generate(context, max_length, stop, **kwargs)``::

    cfg = SamplingConfig.from_kwargs(model.generation_config, **kwargs_without_attention_mask)
    result = generate_rows(model, context, attention_mask, max_new_tokens=max_length - L,
                           eos_token_ids=set(cfg.eos_token_ids), pad_token_id=tok.pad_token_id,
                           stop=stop, decode=self.tok_decode, sampling=cfg)
    return result.sequences

Pass ``decode=self.tok_decode`` (skip_special_tokens=True): it is what HFLM cuts the final text
with and what ``evaluation.accounting.count_generated_tokens`` counts with, so the text after HFLM's cut and
the token counts agree with the ``generate`` path.
"""

from __future__ import annotations

import math
import time
from collections import deque
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Callable, Iterator, Protocol, Sequence, runtime_checkable

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import DynamicCache

from lm_eval_ponder.backbone import text_config
from lm_eval_ponder.errors import UnsupportedGeneration
from lm_eval_ponder.evaluation.rowbatch import (
    RowBatch,
    cache_keyword,
    check_model_supported,
    supports_logits_to_keep,
)
from lm_eval_ponder.evaluation.sampling import ChoiceRows, SamplingConfig, TokenChooser
from lm_eval_ponder.evaluation.static_decode import (
    StaticSlots,
    check_decode_step,
    slot_shape,
    tail_slots,
)
from lm_eval_ponder.evaluation.stops import StopStrings

__all__ = [
    "GenerationResult",
    "prefill_parts",
    "RowObserver",
    "StepTimer",
    "UnsupportedGeneration",
    "generate_rows",
]

FINISH_EOS = "eos"
FINISH_STOP = "stop"
FINISH_LENGTH = "length"
# the per-row flags a decode step reads back (bit 0 EOS, bit 1 length, bit 2 a stop string
# may be complete); the row's generated count rides above them in the same integer
EOS_BIT, LENGTH_BIT, STOP_BIT, COUNT_SHIFT = 1, 2, 4, 3


@runtime_checkable
class RowObserver(Protocol):
    """Told which requests are in each forward pass, so per-row state stays attached to them."""

    def begin_forward(self, rows: torch.LongTensor, prefill: bool) -> None:
        """``rows``: original row indices (0..B-1) of the rows in the coming forward, in batch
        order, on the model's device. ``prefill``: the forward processes a group's prompts.
        A row that finished may stay in the forwards until the batch is compacted (at most an
        eighth of it): whatever is decided for it then comes after its last token."""


@dataclass
class GenerationResult:
    """``sequences``: [B, L + T], context then generated tokens, ``pad_token_id`` after each
    row's end (the form ``generate`` returns). ``gen_tokens``: each row's generated tokens up to
    and including its EOS or the token completing a stop string. ``finish_reason``: "eos",
    "stop" or "length" per row. The counters describe the work done."""

    sequences: torch.LongTensor
    gen_tokens: list[int]
    finish_reason: list[str]
    prefill_forwards: int = 0
    decode_forwards: int = 0
    decode_row_slots: int = 0  # sum over decode forwards of the live rows in the batch
    dead_row_slots: int = 0  # ... and of finished rows still waiting for a compaction
    joins: int = 0
    compactions: int = 0
    tail_moves: int = 0  # static slots: moves of the live rows to fewer slots


@dataclass
class StepTimer:
    """Seconds spent per phase of the loop (``benchmarks/step_cost.py``): ``prefill`` and
    ``forward`` (the model), ``choose``, ``finish`` (storing tokens, the read-back, stop
    checks), ``cache`` (masks and positions), ``compact`` (dropping finished rows) and
    ``join`` (merging a prefilled group). ``sync``: wait for the device at every phase
    boundary, so a GPU's queued work is charged to the phase that queued it (it also removes
    any overlap of host and device work: for attribution only)."""

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


@contextmanager
def no_timer(name: str, device: torch.device) -> Iterator[None]:
    yield


# SDPA backends for the loop's forwards on CUDA: every one but cuDNN's. cuDNN attention builds
# an execution plan per (batch, key length, strides) and caches it; the loop's batch changes
# as rows finish and join, so nearly every decode step is a new combination. Measured on an
# H200 (2026-11-26, benchmarks/profile_step.py): 1.1 ms of host time per attention call on
# the embedded model (516 ms in 16 steps of 64 rows, 30 layers), against 49 us for a cached
# plan, and a first pass at 256 rows of the tiny model 50 ms per step for a 3 ms forward. The
# other kernels (flash, memory-efficient, math) have no plans to build.
LOOP_SDPA_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                      SDPBackend.MATH]


def attention_backends(device: torch.device):
    """The SDPA backends the loop's forwards may use on ``device`` (a no-op off CUDA)."""
    if device.type != "cuda":
        return nullcontext()
    return sdpa_kernel(LOOP_SDPA_BACKENDS)


def prefill_parts(rows: list[int], lengths: Sequence[int]) -> list[list[int]]:
    """Split a group of rows joining at once into prefill forwards in which no prompt is
    shorter than half the longest. A prefill pads every row to its longest: GPQA's first group
    holds its 2,899-token question beside rows of 300-800, and one forward of that group spent
    most of its compute on padding. A group within a factor of 2 stays one forward, in its
    order (arith and GSM8K groups: their batches are unchanged)."""
    lens = [int(lengths[r]) for r in rows]
    if not rows or max(lens) <= 2 * max(min(lens), 1):
        return [list(rows)]
    parts: list[list[int]] = []
    for r in sorted(rows, key=lambda r: -int(lengths[r])):
        if parts and 2 * int(lengths[r]) >= int(lengths[parts[-1][0]]):
            parts[-1].append(r)
        else:
            parts.append([r])
    return parts


class RowLoop:
    """One ``generate_rows`` call: the waiting rows, the batch in flight and the outputs.

    The call reads top to bottom in ``run``: admit waiting rows while slots are free (prefill
    them as groups and merge them into the batch), else decode one step for every row in
    flight, then read back which rows ended and retire them.
    """

    def __init__(self, model, input_ids: torch.LongTensor, attention_mask: torch.Tensor | None,
                 *, max_new_tokens: int, eos_token_ids: set[int], pad_token_id: int,
                 stop: list[str] | None, decode: Callable[[list[int]], str] | None,
                 sampling: SamplingConfig | None, max_rows: int | None,
                 max_cache_tokens: int | None, steering: RowObserver | None,
                 admit_fraction: float, on_finish: Callable[[int], None] | None,
                 timer: StepTimer | None,
                 on_tokens: Callable[[int, list[int]], None] | None = None,
                 decode_step: str = "dynamic",
                 on_unhooked_forward: Callable[[int], None] | None = None,
                 shrink_tail: bool = True) -> None:
        if pad_token_id is None:
            raise ValueError("pad_token_id is required")
        check_model_supported(model)
        self.model = model
        self.device = device = model.device if hasattr(model, "device") else input_ids.device
        self.input_ids = input_ids.to(device)
        self.mask = (torch.ones_like(self.input_ids) if attention_mask is None
                     else attention_mask.to(device))
        self.n_rows, self.width = self.input_ids.shape
        self.max_new = int(max_new_tokens)
        self.pad = int(pad_token_id)
        self.max_rows = self.n_rows if max_rows is None else max(1, int(max_rows))
        self.admit_at = max(1, math.ceil(admit_fraction * self.max_rows))
        self.max_cache_tokens = max_cache_tokens
        self.steering, self.on_finish, self.on_tokens = steering, on_finish, on_tokens
        self.on_unhooked_forward = on_unhooked_forward
        self.phase = timer.phase if timer is not None else no_timer
        self.timer = timer
        self.eos_ids = {int(e) for e in eos_token_ids}
        self.eos_t = torch.tensor(sorted(self.eos_ids), dtype=torch.long, device=device)
        self.chooser = TokenChooser(sampling or SamplingConfig(), device, sorted(self.eos_ids),
                                    self.width)
        self.stops = StopStrings(stop, decode, self.vocab_size(), device)
        self.keep_logits = {"logits_to_keep": 1} if supports_logits_to_keep(model) else {}
        self.cache_arg = cache_keyword(model)
        self.text_config = text_config(model.config)
        # per original row: generated tokens (a last column that dead slots write to), counts;
        # one more row for static slots no row has taken yet
        self.tokens = torch.full((self.n_rows + 1, self.max_new + 1), self.pad,
                                 dtype=torch.long, device=device)
        self.counts = torch.zeros(self.n_rows + 1, dtype=torch.long, device=device)
        self.real_len = self.mask.sum(dim=1).tolist()
        self.slots = self.static_slots(check_decode_step(decode_step))
        self.shrink_tail = shrink_tail
        self.reason = [FINISH_LENGTH] * self.n_rows
        self.result = GenerationResult(self.input_ids, [0] * self.n_rows, self.reason)
        self.waiting = deque(range(self.n_rows))
        self.batch: RowBatch | None = None

    def static_slots(self, mode: str) -> StaticSlots | None:
        """The fixed-shape layout of ``evaluation.static_decode``, where it applies: not with
        a steering observer (its hooks keep per-call state a graph cannot replay), a
        repetition penalty's history, or a cache budget the static cache would exceed."""
        if mode == "dynamic" or self.n_rows == 0 or self.max_new <= 0:
            return None
        if self.steering is not None or self.chooser.uses_history:
            return None
        rows = min(self.max_rows, self.n_rows)
        slots, width = slot_shape(mode, rows, max(max(self.real_len), 1), self.max_new)
        if self.max_cache_tokens is not None and slots * width > self.max_cache_tokens:
            return None
        return StaticSlots(self.model, mode, slots, width, self.text_config)

    def vocab_size(self) -> int:
        head = self.model.get_output_embeddings() if hasattr(
            self.model, "get_output_embeddings") else None
        if head is not None and getattr(head, "weight", None) is not None:
            return int(head.weight.shape[0])
        return int(self.text_config.vocab_size)

    # ------------------------------------------------------------------ the call
    @torch.no_grad()
    def run(self) -> GenerationResult:
        if self.max_new <= 0 or self.n_rows == 0:
            return self.result
        while self.waiting or (self.batch is not None and self.batch.n_alive):
            admit = self.admissible()
            if admit:
                self.admit(admit)
                continue  # re-check admission (the group may have finished at once)
            self.decode_step()
        return self.outputs()

    def in_flight(self) -> int:
        return 0 if self.batch is None else self.batch.n_alive

    def admissible(self) -> int:
        """How many waiting rows join now: once at least ``admit_fraction`` of the slots are
        free (or all waiting rows fit), as many as fit ``max_rows`` and ``max_cache_tokens``
        (rows in flight times the widest prompt among them plus ``max_new_tokens``; one row
        always runs)."""
        in_flight = self.in_flight()
        free = self.max_rows - in_flight
        if not self.waiting or free <= 0 or (
                in_flight and free < min(self.admit_at, len(self.waiting))):
            return 0
        n = min(free, len(self.waiting))
        if self.max_cache_tokens is None:
            return n
        widest = max((int(self.real_len[r]) for r in self.batch.live_rows()), default=0) \
            if in_flight else 0
        k = 0
        while k < n:
            widest = max(widest, int(self.real_len[self.waiting[k]]))
            if (in_flight + k + 1) * (widest + self.max_new) > self.max_cache_tokens:
                break
            k += 1
        return max(k, 1) if in_flight == 0 else k

    def admit(self, n: int) -> None:
        group = [self.waiting.popleft() for _ in range(n)]
        if self.slots is not None:
            return self.admit_to_slots(group)
        if self.batch is not None and self.batch.n_dead:
            with self.phase("compact", self.device):
                self.batch.compact(self.device)
                self.result.compactions += 1
        for part in prefill_parts(group, self.real_len):
            joined = self.prefill(part)
            with self.phase("join", self.device):
                if joined.n_dead:
                    joined.compact(self.device)
                if not joined.rows:
                    continue
                if self.batch is None or not self.batch.rows:
                    self.batch = joined
                else:
                    self.batch.merge(joined, self.pad, self.device)
                    self.result.joins += 1

    def admit_to_slots(self, group: list[int]) -> None:
        """Prefill the group as the dynamic loop does, then copy its cache into free slots
        (``StaticSlots.place``), its keys ending at the current column."""
        slots, device = self.slots, self.device
        if self.batch is None:
            self.batch = RowBatch(slots.cache, [self.n_rows] * slots.slots, [0] * slots.slots,
                                  0, torch.full((slots.slots,), self.pad, dtype=torch.long,
                                                device=device), None, None,
                                  [False] * slots.slots)
            self.batch.refresh(device)
        batch = self.batch
        for part in prefill_parts(group, self.real_len):
            joined = self.prefill(part)
            with self.phase("join", device):
                if joined.n_dead:
                    joined.compact(device)
                if not joined.rows:
                    continue
                span = joined.length
                if span > slots.col:
                    by = span - slots.col
                    slots.shift(by)
                    batch.lead = [p + by for p in batch.lead]
                free = [i for i, a in enumerate(batch.alive_flags())
                        if not a][:len(joined.rows)]
                if len(free) < len(joined.rows):
                    raise AssertionError("admitted more rows than free slots")
                index = torch.tensor(free, dtype=torch.long, device=device)
                slots.place(index, joined.cache, span)
                for i, row, lead in zip(free, joined.rows, joined.lead):
                    batch.rows[i], batch.lead[i] = row, slots.col - span + lead
                    batch.alive[i] = True
                batch.last = batch.last.index_copy(0, index, joined.last)
                batch.length = slots.col
                batch.refresh(device)
                self.result.joins += 1

    def shift_slots_left(self) -> None:
        """The cache is full: drop the columns no live row attends to."""
        batch, slots = self.batch, self.slots
        cut = min(p for p, a in zip(batch.lead, batch.alive_flags()) if a)
        if cut < 1:
            raise AssertionError("a live row spans the whole static cache")
        slots.shift(-cut)
        batch.lead = [max(p - cut, 0) for p in batch.lead]
        batch.length = slots.col
        batch.refresh(self.device)
        self.result.compactions += 1

    def move_tail(self, n_slots: int) -> None:
        """No row waits and the live rows fit ``n_slots``: move them into a static cache of
        that many slots, so the tail's steps run (or replay) for them and not for every slot."""
        batch, old, device = self.batch, self.slots, self.device
        live = [i for i, a in enumerate(batch.alive_flags()) if a]
        index = torch.tensor(live, dtype=torch.long, device=device)
        new = StaticSlots(self.model, old.mode, n_slots, old.width, self.text_config)
        new.take(old, index)
        free = n_slots - len(live)
        self.batch = RowBatch(new.cache, [batch.rows[i] for i in live] + [self.n_rows] * free,
                              [batch.lead[i] for i in live] + [0] * free, new.col,
                              torch.cat([batch.last.index_select(0, index),
                                         batch.last.new_full((free,), self.pad)]),
                              None, None, [True] * len(live) + [False] * free)
        self.batch.refresh(device)
        self.slots = new
        self.result.tail_moves += 1

    # ------------------------------------------------------------------ forwards
    def prefill(self, rows: list[int]) -> RowBatch:
        """A group's prompts in one forward, its own padding beyond its longest row stripped
        (rows of a left-padded batch have their real tokens at the right end)."""
        device = self.device
        with self.phase("cache", device):
            index = torch.tensor(rows, dtype=torch.long, device=device)
            lens = [int(self.real_len[r]) for r in rows]
            span = max(max(lens), 1)
            ids = self.input_ids.index_select(0, index)[:, self.width - span:]
            mask = self.mask.index_select(0, index)[:, self.width - span:]
            position_ids = (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 0)
            cache = DynamicCache(config=self.text_config)
        with self.phase("prefill", device), attention_backends(device):
            if self.steering is not None:
                self.steering.begin_forward(index, True)
            out = self.model(input_ids=ids, attention_mask=mask, position_ids=position_ids,
                             **{self.cache_arg: cache}, use_cache=True, return_dict=True,
                             **self.keep_logits)
            logits = out.logits[:, -1]
            del out
        self.result.prefill_forwards += 1
        lead = [span - n for n in lens]
        history = ids.clone() if self.chooser.uses_history else None
        batch = RowBatch(cache, list(rows), lead, span, ids[:, -1], history,
                         list(lead) if history is not None else None)
        batch.refresh(device)
        self.step(batch, logits)
        return batch

    def decode_step(self) -> None:
        """One decode step of every row in flight: through the ``DynamicCache``, or through the
        static slots' (graph) forward when the call has them."""
        batch, slots, device = self.batch, self.slots, self.device
        assert batch is not None
        with self.phase("cache", device):
            if slots is None:
                mask = batch.decode_mask()
                # the new token's position is the row's count of real tokens already cached
                position_ids = (batch.length - batch.lead_t)[:, None]
                forward, cache = self.model, batch.cache
            else:
                smaller = None if self.waiting or not self.shrink_tail else tail_slots(
                    slots.mode, slots.slots, batch.n_alive)
                if smaller is not None:
                    self.move_tail(smaller)
                    batch, slots = self.batch, self.slots
                if slots.col >= slots.width:
                    self.shift_slots_left()
                mask, position_ids = slots.mask_and_positions(batch.lead_t)
                forward, cache = slots.forward, slots.cache
        with self.phase("forward", device), attention_backends(device):
            if self.steering is not None:
                self.steering.begin_forward(batch.rows_t, False)
            out = forward(input_ids=batch.last[:, None], attention_mask=mask,
                          position_ids=position_ids, **{self.cache_arg: cache},
                          use_cache=True, return_dict=True, **self.keep_logits)
            logits = out.logits[:, -1]
            del out
        batch.length += 1
        if slots is not None:
            slots.col += 1
            if slots.mode != "static" and self.on_unhooked_forward is not None:
                self.on_unhooked_forward(slots.slots)
        self.result.decode_forwards += 1
        self.result.decode_row_slots += batch.n_alive
        self.result.dead_row_slots += batch.n_dead
        if self.timer is not None:
            self.timer.decode_steps += 1
        self.step(batch, logits)
        if slots is None and batch.needs_compaction() and not (
                self.waiting and self.admissible()):
            with self.phase("compact", device):  # (a join compacts anyway)
                batch.compact(device)
                self.result.compactions += 1

    # ------------------------------------------------------------------ after a forward
    def step(self, batch: RowBatch, logits: torch.Tensor) -> None:
        """Choose every row's next token, store it, and retire the rows that ended."""
        device = self.device
        with self.phase("choose", device):
            counts = self.counts.index_select(0, batch.rows_t)
            nxt = self.chooser.choose(logits, ChoiceRows(
                counts, batch.last, batch.hist, batch.hist_lead_t, batch.alive_mask,
                batch.alive_index), self.pad)
        with self.phase("finish", device):
            alive = batch.alive_mask
            column = counts if alive is None else torch.where(alive, counts, self.max_new)
            self.tokens.index_put_((batch.rows_t, column), nxt)
            counts = counts + (1 if alive is None else alive.long())
            self.counts.index_copy_(0, batch.rows_t, counts)
            batch.last = nxt
            if batch.hist is not None:
                batch.hist = torch.cat([batch.hist, nxt[:, None]], dim=1)
            flags = (torch.isin(nxt, self.eos_t).long() * EOS_BIT
                     + (counts >= self.max_new).long() * LENGTH_BIT
                     + self.stops.candidates(nxt).long() * STOP_BIT)
            if alive is not None:
                flags = flags * alive.long()
            packed = (flags + (counts << COUNT_SHIFT)).tolist()  # the one host sync
            self.retire(batch, packed)

    def retire(self, batch: RowBatch, packed: list[int]) -> None:
        ended: list[int] = []
        maybe_stop = [i for i, p in enumerate(packed) if p & STOP_BIT and not p & EOS_BIT]
        stopped = set(self.confirm_stops(batch, maybe_stop, packed)) if maybe_stop else set()
        for i, p in enumerate(packed):
            flags = p & ((1 << COUNT_SHIFT) - 1)
            if not flags:
                continue
            row = batch.rows[i]
            if flags & EOS_BIT:
                self.reason[row] = FINISH_EOS
            elif i in stopped:
                self.reason[row] = FINISH_STOP
            elif flags & LENGTH_BIT:
                self.reason[row] = FINISH_LENGTH
            else:
                continue
            self.result.gen_tokens[row] = count = p >> COUNT_SHIFT
            ended.append(i)
            if self.on_tokens is not None:  # one read-back per finished row, only when asked
                self.on_tokens(row, self.tokens[row, :count].tolist())
            if self.on_finish is not None:
                self.on_finish(row)
        batch.kill(ended, self.device)

    def confirm_stops(self, batch: RowBatch, positions: list[int], packed: list[int]) -> list[int]:
        """Of these batch positions, the rows whose decoded text now holds a stop string."""
        rows = torch.tensor([batch.rows[i] for i in positions], dtype=torch.long,
                            device=self.device)
        texts = self.tokens.index_select(0, rows).tolist()
        return [i for i, generated in zip(positions, texts)
                if self.stops.hit(generated[:packed[i] >> COUNT_SHIFT])]

    def outputs(self) -> GenerationResult:
        steps = max(self.result.gen_tokens, default=0)
        out = torch.cat([self.input_ids, self.tokens[:self.n_rows, :steps]], dim=1)
        self.result.sequences = out
        return self.result


def generate_rows(
    model,
    input_ids: torch.LongTensor,
    attention_mask: torch.Tensor | None,
    *,
    max_new_tokens: int,
    eos_token_ids: set[int],
    pad_token_id: int,
    stop: list[str] | None = None,
    decode: Callable[[list[int]], str] | None = None,
    sampling: SamplingConfig | None = None,
    max_rows: int | None = None,
    max_cache_tokens: int | None = None,
    steering: RowObserver | None = None,
    admit_fraction: float = 0.5,
    on_finish: Callable[[int], None] | None = None,
    timer: StepTimer | None = None,
    on_tokens: Callable[[int, list[int]], None] | None = None,
    decode_step: str = "dynamic",
    on_unhooked_forward: Callable[[int], None] | None = None,
    shrink_tail: bool = True,
) -> GenerationResult:
    """Generate for a left-padded batch, dropping each row from the batch as soon as it ends.

    ``input_ids``/``attention_mask``: [B, L], left-padded, as HFLM passes them to
    ``_model_generate``. ``max_rows``: at most this many rows in flight; waiting rows join the
    running batch (prefilled as a group) once at least ``admit_fraction * max_rows`` slots are
    free (or all remaining waiting rows fit). ``max_cache_tokens``: a row joins only while the
    rows in flight times (the longest prompt among them + ``max_new_tokens``), the cache's
    widest extent, stays within it (one row always runs). ``steering.begin_forward`` is called
    before every forward with the original indices of the rows in it (finished rows awaiting a
    compaction included: their decisions come after their last token); ``on_finish`` with a
    row's original index as soon as it ends (progress bars), ``on_tokens`` with that index and
    the row's generated tokens (keeping each answer as it ends); ``timer`` collects the seconds
    of each phase. ``decode_step``: ``dynamic`` (the default), or a fixed-shape step that a GPU
    replays as a CUDA graph (``evaluation.static_decode``: ``static``, ``captured``,
    ``cudagraphs``, ``inductor``); calls with a steering observer or a repetition penalty stay
    dynamic. A replayed forward runs no module hooks: ``on_unhooked_forward(rows)`` is told of
    each.
    ``shrink_tail``: a static step's live rows move to a quarter of the slots once no row waits
    and they fit there (``static_decode.tail_slots``); False keeps every slot to the end.
    """
    return RowLoop(model, input_ids, attention_mask, max_new_tokens=max_new_tokens,
                   eos_token_ids=eos_token_ids, pad_token_id=pad_token_id, stop=stop,
                   decode=decode, sampling=sampling, max_rows=max_rows,
                   max_cache_tokens=max_cache_tokens, steering=steering,
                   admit_fraction=admit_fraction, on_finish=on_finish, timer=timer,
                   on_tokens=on_tokens, decode_step=decode_step,
                   on_unhooked_forward=on_unhooked_forward, shrink_tail=shrink_tail).run()
