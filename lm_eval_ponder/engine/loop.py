"""A generation loop in which a finished row stops costing compute.

Why: lm-eval's HFLM calls ``model.generate`` with a batch-wide stopping criterion, so every row
decodes until the longest is done: on arith (SmolLM2-135M, bf16, batch 64, 256 new tokens) only
46% of the decoded slots were real output. ``generate_rows`` runs the same forwards over
``generate``'s ``DynamicCache`` (appending in place: ``engine.cache``), but a row leaves the
batch as soon as it emits an EOS id, completes one of its stop strings (``engine.stops``) or
reaches ``max_new_tokens``; waiting rows are prefilled as groups (``prefill_parts``) and join as
slots free up; with ``max_cache_tokens``, rows in flight times (the widest prompt +
``max_new_tokens``) stay within that many positions, since one long prompt widens every row's
cache (GPQA's 2,899-token question, against a median of 168, took a 128-row batch of a 135M
model past 13 GiB and the kernel killed the run; ``cache_bytes_per_token`` turns a memory
budget into positions). docs/design/generation.md describes the loop, its cache layout
(``engine.rows``), its observers (``engine.observers``) and what it keeps exact.

Positions, logits processors and the merged generation config follow ``generate``
(``engine.sampling``), so greedy outputs match it token for token (tested in fp32); anything the
loop cannot reproduce exactly raises ``UnsupportedGeneration`` before any forward pass and the
caller uses ``model.generate``. A decode step's one host sync is its ``StepFlags``; tokens and
counts stay on the device until a row finishes (``benchmarks/step_cost.py`` splits a step).

Pass ``decode=`` the tokenizer's decode with ``skip_special_tokens=True``: it is what HFLM cuts
the final text with and what ``generation.accounting.count_generated_tokens`` counts with, so
stop strings, the text after the cut and the token counts agree with the ``generate`` path.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from lm_eval_ponder.backbone import text_config
from lm_eval_ponder.engine.cache import new_cache
from lm_eval_ponder.engine.config import LoopConfig
from lm_eval_ponder.engine.observers import LoopObserver, Observers
from lm_eval_ponder.engine.rows import (
    CacheLayout,
    DynamicRows,
    StepRows,
    cache_keyword,
    check_model_supported,
    empty_rows,
    supports_logits_to_keep,
)
from lm_eval_ponder.engine.sampling import ChoiceRows, SamplingConfig, TokenChooser
from lm_eval_ponder.engine.stops import (
    FINISH_LENGTH,
    EndOfText,
    LengthLimit,
    StepView,
    StopRule,
    StopStrings,
)


@dataclass(frozen=True)
class StepFlags:
    """What one step tells the host of each row of its batch, read back in one copy (the step's
    one host sync): per rule (the loop's order), 1 at each batch position it flags; each
    position's generated count; and the positions with any flag (``ended``: the rows that may
    have ended). A position whose row already ended has no flag."""

    fired: list[list[int]]
    counts: list[int]
    ended: list[int]

    @classmethod
    def read(cls, counts: torch.Tensor, alive: torch.Tensor | None,
             flags: list[torch.Tensor]) -> StepFlags:
        stacked = torch.stack(flags)
        if alive is not None:
            stacked &= alive
        # the one host sync of the step
        host = torch.cat([stacked.long(), stacked.any(dim=0)[None].long(), counts[None]]).tolist()
        return cls(host[:-2], counts=host[-1], ended=[i for i, f in enumerate(host[-2]) if f])


@dataclass
class GenerationResult:
    """``sequences``: [B, L + T], context then generated tokens, ``pad_token_id`` after each
    row's end (the form ``generate`` returns). ``gen_tokens``: each row's generated tokens up to
    and including its EOS or the token completing a stop string. ``finish_reason``: the
    ``reason`` of the rule that ended each row ("eos", "stop", "length", or an answer stop's,
    e.g. "unsure"; a rule that does not keep its token leaves the row one forward more than it
    kept tokens). The counters describe the work done."""

    sequences: torch.LongTensor
    gen_tokens: list[int]
    finish_reason: list[str]
    prefill_forwards: int = 0
    decode_forwards: int = 0
    decode_row_slots: int = 0  # sum over decode forwards of the live rows in the batch
    dead_row_slots: int = 0  # ... and of finished rows still waiting for a compaction
    joins: int = 0
    compactions: int = 0


# SDPA backends for the loop's forwards on CUDA: every one but cuDNN's, which builds and caches
# an execution plan per (batch, key length, strides), and the loop's batch changes as rows finish
# and join. Measured on an H200 (2026-11-26, benchmarks/profile_step.py): 1.1 ms of host time per
# attention call on the embedded model (516 ms in 16 steps of 64 rows, 30 layers) against 49 us
# for a cached plan; 50 ms per step for a 3 ms forward at 256 rows of the tiny model.
LOOP_SDPA_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def attention_backends(device: torch.device):
    """The SDPA backends the loop's forwards may use on ``device`` (a no-op off CUDA)."""
    if device.type != "cuda":
        return nullcontext()
    return sdpa_kernel(LOOP_SDPA_BACKENDS)


def prefill_parts(rows: list[int], lengths: Sequence[int]) -> list[list[int]]:
    """Split a group of rows joining at once into prefill forwards in which no prompt is
    shorter than half the longest: a prefill pads every row to its longest, and GPQA's first
    group holds its 2,899-token question beside rows of 300-800. A group within a factor of 2
    stays one forward, in its order (arith and GSM8K groups: their batches are unchanged)."""
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
    """One ``generate_rows`` call: the waiting rows, the layout in flight and the outputs."""

    def __init__(self, model, input_ids: torch.LongTensor, attention_mask: torch.Tensor | None,
                 *, max_new_tokens: int | Sequence[int], eos_token_ids: set[int], pad_token_id: int,
                 stop: list[str] | None, decode: Callable[[list[int]], str] | None,
                 sampling: SamplingConfig | None, config: LoopConfig, observers: Observers) -> None:
        if pad_token_id is None:
            raise ValueError("pad_token_id is required")
        check_model_supported(model)
        self.model, self.config, self.observers = model, config, observers
        self.device = device = model.device if hasattr(model, "device") else input_ids.device
        self.input_ids = input_ids.to(device)
        self.mask = (torch.ones_like(self.input_ids) if attention_mask is None
                     else attention_mask.to(device))
        self.n_rows, self.width = self.input_ids.shape
        # one limit for every row, or one per row (a benchmark replaying answer lengths)
        self.limits = None
        if isinstance(max_new_tokens, int):
            self.max_new = int(max_new_tokens)
        else:
            limits = [int(n) for n in max_new_tokens]
            if len(limits) != self.n_rows or min(limits, default=1) < 1:
                raise ValueError(f"max_new_tokens: one limit >= 1 per row ({self.n_rows}), "
                                 f"got {len(limits)}")
            self.max_new = max(limits, default=0)
            self.limits = torch.tensor(limits, dtype=torch.long, device=device)
        self.pad = int(pad_token_id)
        self.max_rows = self.n_rows if config.max_rows is None else int(config.max_rows)
        self.admit_at = max(1, math.ceil(config.admit_fraction * self.max_rows))
        self.phase = observers.phase
        eos_ids = sorted({int(e) for e in eos_token_ids})
        self.eos_t = torch.tensor(eos_ids, dtype=torch.long, device=device)
        self.chooser = TokenChooser(sampling or SamplingConfig(), device, eos_ids, self.width)
        self.text_config = text_config(model.config)  # before vocab_size() reads it
        # every way a row ends, in the order that names it: the caller's answer stops first
        # (one that drops its token must win over the others), then the loop's own
        strings = StopStrings(stop, decode, self.vocab_size(), device)
        self.rules: list[StopRule] = [*config.stops, EndOfText(self.eos_t),
                                      *([strings] if strings else []), LengthLimit()]
        self.keep_logits = {"logits_to_keep": 1} if supports_logits_to_keep(model) else {}
        self.cache_arg = cache_keyword(model)
        # per original row: generated tokens (a last column that dead rows write to), counts
        self.tokens = torch.full((self.n_rows, self.max_new + 1), self.pad, dtype=torch.long,
                                 device=device)
        self.counts = torch.zeros(self.n_rows, dtype=torch.long, device=device)
        self.real_len = self.mask.sum(dim=1).tolist()
        self.reason = [FINISH_LENGTH] * self.n_rows
        self.result = GenerationResult(self.input_ids, [0] * self.n_rows, self.reason)
        self.waiting = deque(range(self.n_rows))
        self.layout: CacheLayout = empty_rows(device)

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
        while self.waiting or self.layout.n_alive:
            admit = self.admissible()
            if admit:
                self.admit(admit)
                continue  # re-check admission (the group may have finished at once)
            self.decode_one()
        return self.outputs()

    def admissible(self) -> int:
        """How many waiting rows join now: once at least ``admit_fraction`` of the slots are
        free (or all waiting rows fit), as many as fit ``max_rows`` and ``max_cache_tokens``
        (rows in flight times the widest prompt among them plus ``max_new_tokens``; one row
        always runs). Where the cache budget binds, its rows count as the slots."""
        in_flight = self.layout.n_alive
        free = self.max_rows - in_flight
        if not self.waiting or free <= 0 or (
                in_flight and free < min(self.admit_at, len(self.waiting))):
            return 0
        n = min(free, len(self.waiting))
        budget = self.config.max_cache_tokens
        if budget is None:
            return n
        widest = max((int(self.real_len[r]) for r in self.layout.live_rows()), default=0)
        k = 0
        while k < n:
            widest = max(widest, int(self.real_len[self.waiting[k]]))
            if (in_flight + k + 1) * (widest + self.max_new) > budget:
                break
            k += 1
        if in_flight == 0:
            return max(k, 1)
        # where the budget, not max_rows, binds: wait as for max_rows until admit_fraction of
        # what it holds is free. Else each finished row let one row in, a prefill and a merge
        # (a copy of the whole cache) per row (measured: "prefilling 1 rows" at every step)
        if k < n and k < math.ceil(self.config.admit_fraction * (in_flight + k)):
            return 0
        return k

    def admit(self, n: int) -> None:
        """Prefill ``n`` waiting rows in parts (``prefill_parts``) and hand each part, its
        first tokens chosen, to the layout."""
        group = [self.waiting.popleft() for _ in range(n)]
        with self.phase("compact", self.device):
            self.layout.make_room(self.result)
        for part in prefill_parts(group, self.real_len):
            joined = self.prefill(part)
            with self.phase("join", self.device):
                if joined.n_dead:
                    joined.compact()
                if joined.rows:
                    self.layout.admit(joined, self.pad, self.result)

    # ------------------------------------------------------------------ forwards
    def prefill(self, rows: list[int]) -> DynamicRows:
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
            cache = new_cache(self.text_config)
        with self.phase("prefill", device), attention_backends(device):
            self.observers.begin_forward(index, True)
            out = self.model(input_ids=ids, attention_mask=mask, position_ids=position_ids,
                             **{self.cache_arg: cache}, use_cache=True, return_dict=True,
                             **self.keep_logits)
            logits = out.logits[:, -1]
            del out
        self.result.prefill_forwards += 1
        pad_cols = [span - n for n in lens]
        history = ids.clone() if self.chooser.uses_history else None
        batch = DynamicRows(cache, span, list(rows), pad_cols, ids[:, -1], device, history,
                            list(pad_cols) if history is not None else None)
        self.after_forward(batch, logits)
        return batch

    def decode_one(self) -> None:
        """One decode step of every row in flight, through the layout's inputs."""
        layout, device = self.layout, self.device
        with self.phase("cache", device):
            inputs = layout.inputs()
        with self.phase("forward", device), attention_backends(device):
            self.observers.begin_forward(layout.rows_t, False)
            out = self.model(input_ids=layout.last[:, None], attention_mask=inputs.mask,
                             position_ids=inputs.position_ids, **{self.cache_arg: inputs.cache},
                             use_cache=True, return_dict=True, **self.keep_logits)
            logits = out.logits[:, -1]
            del out
        layout.advance()
        self.result.decode_forwards += 1
        self.result.decode_row_slots += layout.n_alive
        self.result.dead_row_slots += layout.n_dead
        self.observers.decoded()
        self.after_forward(layout, logits)
        with self.phase("compact", device):
            layout.compact_after(bool(self.waiting) and bool(self.admissible()), self.result)

    # ------------------------------------------------------------------ after a forward
    def after_forward(self, batch: StepRows, logits: torch.Tensor) -> None:
        """Choose every row's next token, store it, and retire the rows that ended."""
        device = self.device
        with self.phase("choose", device):
            counts = self.counts.index_select(0, batch.rows_t)
            nxt = self.chooser.choose(logits, ChoiceRows(
                counts, batch.last, batch.history, batch.history_pad_t, batch.alive_mask,
                batch.alive_index), self.pad)
        with self.phase("finish", device):
            alive = batch.alive_mask
            column = counts if alive is None else torch.where(alive, counts, self.max_new)
            self.tokens.index_put_((batch.rows_t, column), nxt)
            counts = counts + (1 if alive is None else alive.long())
            self.counts.index_copy_(0, batch.rows_t, counts)
            batch.feed(nxt)
            limit = self.max_new if self.limits is None else \
                self.limits.index_select(0, batch.rows_t)
            step = StepView(nxt, logits, counts, limit)
            self.retire(batch, StepFlags.read(counts, alive, [r.flags(step) for r in self.rules]))

    def ending_rule(self, i: int, flags: StepFlags, texts: dict[int, list[int]]) -> StopRule | None:
        """The first rule that ends batch position ``i`` (a text rule only once its row's
        decoded tokens confirm it), or None."""
        for rule, fired in zip(self.rules, flags.fired):
            if fired[i] and (not rule.needs_text or rule.confirm(texts[i][:flags.counts[i]])):
                return rule
        return None

    def retire(self, batch: StepRows, flags: StepFlags) -> None:
        """Each row that ended, with why (its rule's ``reason``), to the result and the observers."""
        candidates = flags.ended
        if not candidates:
            return
        # rows a text rule flagged before any sure rule: their tokens, read back in one copy
        to_read = [i for i in candidates if self.text_first(i, flags)]
        texts = {}
        if to_read:
            index = torch.tensor([batch.rows[i] for i in to_read], dtype=torch.long, device=self.device)
            texts = dict(zip(to_read, self.tokens.index_select(0, index).tolist()))
        ended: list[int] = []
        for i in candidates:
            rule = self.ending_rule(i, flags, texts)
            if rule is None:
                continue
            row, count = batch.rows[i], flags.counts[i]
            self.reason[row] = rule.reason
            if not rule.keeps_token:  # its forward ran; the token it chose is not kept
                count -= 1
                self.tokens[row, count] = self.pad
            self.result.gen_tokens[row] = count
            ended.append(i)
            # one read-back per finished row, only when an observer asks for the tokens
            tokens = self.tokens[row, :count].tolist() if self.observers.wants_tokens else None
            self.observers.row_finished(row, tokens, self.reason[row])
        batch.retire(ended)

    def text_first(self, i: int, flags: StepFlags) -> bool:
        """Whether a text rule flags position ``i`` before the first device rule that does."""
        return next((rule.needs_text for rule, fired in zip(self.rules, flags.fired) if fired[i]),
                    False)

    def outputs(self) -> GenerationResult:
        steps = max(self.result.gen_tokens, default=0)
        self.result.sequences = torch.cat([self.input_ids, self.tokens[:, :steps]], dim=1)
        return self.result


def generate_rows(model, input_ids: torch.LongTensor, attention_mask: torch.Tensor | None, *,
                  max_new_tokens: int | Sequence[int], eos_token_ids: set[int], pad_token_id: int,
                  stop: list[str] | None = None, decode: Callable[[list[int]], str] | None = None,
                  sampling: SamplingConfig | None = None, config: LoopConfig | None = None,
                  observers: Sequence[LoopObserver] = ()) -> GenerationResult:
    """Generate for a left-padded batch, dropping each row from the batch as soon as it ends.

    ``input_ids``/``attention_mask``: [B, L], left-padded, as lm-eval encodes a batch.
    ``max_new_tokens``: one limit, or one per row (``benchmarks/scale.py`` replays recorded
    answer lengths this way).
    ``config``: how the rows are batched (``LoopConfig``: rows in flight, cache budget,
    admission, the answer-truncation threshold). ``observers`` are told which rows each forward
    holds, each row as it ends (with its tokens if one asks), and the time of each phase
    (``engine.observers``).
    """
    return RowLoop(model, input_ids, attention_mask, max_new_tokens=max_new_tokens,
                   eos_token_ids=eos_token_ids, pad_token_id=pad_token_id, stop=stop,
                   decode=decode, sampling=sampling, config=config or LoopConfig(),
                   observers=Observers(observers)).run()
