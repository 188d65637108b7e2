"""How a row ends: every stopping rule behind one interface (``StopRule``), and the stop
strings, checked only where a new token can complete one.

A rule looks at one decode step on the device (``StepView``) and flags the rows it ends; the
loop reads every rule's flags back in the step's one host sync, and the first rule in order that
fires names the row's ``finish_reason``. A rule whose flags are only candidates (stop strings)
confirms each on the row's decoded text; one that does not keep the token it stopped at
(``keeps_token=False``: ``min_top_prob``'s) has it dropped, its forward still priced by the
caller. The loop always runs ``EndOfText``, ``StopStrings`` and ``LengthLimit``; a caller adds
answer stops through ``LoopConfig.stops``, so a new rule is one class here and one entry in
``generation.settings.ANSWER_STOPS`` (its model arg).

Stop strings: lm-eval ends a generation at the first occurrence of any ``until`` string in the
decoded text. Decoding every row at every step cost as much host time per step as a small
model's forward on a GPU (4,353 decodes, 0.13 s, in a 32-step profile of 128 rows). But an
occurrence the newest token completes ends inside that token's text, so only rows whose new
token's text holds the last character of some stop string are decoded. Decoding is not additive
(byte-fallback pieces decode to nothing or U+FFFD, a SentencePiece word-start drops its space
at the start of a text, special tokens decode to nothing), so a token is a candidate when its
text alone, or after a plain prefix token, holds one of those characters, or either is empty
or holds U+FFFD. The table is built once per (decoder, stop strings, vocabulary); a candidate
is confirmed on its row's decoded text, so a row never stops before a stop string is complete.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Callable, ClassVar, Protocol, Sequence

import torch

from lm_eval_ponder.errors import PonderError

Decode = Callable[[list[int]], str]
REPLACEMENT = "\ufffd"

FINISH_EOS = "eos"
FINISH_STOP = "stop"
FINISH_LENGTH = "length"
# ``TopProbBelow``: the row's top next-token probability fell below the threshold
FINISH_UNSURE = "unsure"


@dataclass(frozen=True)
class StepView:
    """What a rule may read of one decode step, per batch position, on the device: the tokens
    just chosen, the raw logits they were chosen from (before temperature or any warper), each
    row's generated count including that token, and its length limit."""

    tokens: torch.Tensor
    logits: torch.Tensor
    counts: torch.Tensor
    limit: torch.Tensor | int


class StopRule(Protocol):
    """One way a row ends. ``reason`` is its ``finish_reason``; ``keeps_token=False`` drops the
    token chosen at the stop (its forward ran: callers price it); ``needs_text`` makes the
    flags candidates, each confirmed on the row's decoded generated tokens by ``confirm``."""

    reason: str
    keeps_token: bool
    needs_text: bool

    def flags(self, step: StepView) -> torch.Tensor:
        """Bool [R] on the step's device: the rows this rule ends (or may end) here."""
        ...

    def confirm(self, generated: list[int]) -> bool:
        ...


class DeviceRule:
    """A rule decided on the device alone: nothing to confirm, the token kept."""

    reason: ClassVar[str]
    keeps_token: ClassVar[bool] = True
    needs_text: ClassVar[bool] = False

    def confirm(self, generated: list[int]) -> bool:
        return True


class EndOfText(DeviceRule):
    """The row emitted one of the end-of-text ids (the token is kept, as ``generate`` keeps it)."""

    reason = FINISH_EOS

    def __init__(self, eos_ids: torch.Tensor) -> None:
        self.eos_ids = eos_ids

    def flags(self, step: StepView) -> torch.Tensor:
        return torch.isin(step.tokens, self.eos_ids)


class LengthLimit(DeviceRule):
    """The row generated its ``max_new_tokens``."""

    reason = FINISH_LENGTH

    def flags(self, step: StepView) -> torch.Tensor:
        return step.counts >= step.limit


@dataclass(frozen=True)
class TopProbBelow(DeviceRule):
    """The answer-truncation reading of the paper's tau (``docs/results/answer-truncation.md``):
    a row ends at the first position whose top next-token probability (the softmax of the
    model's raw logits) is below ``threshold``, and that position's token is not kept. Model
    arg ``min_top_prob``."""

    threshold: float
    reason: ClassVar[str] = FINISH_UNSURE
    keeps_token: ClassVar[bool] = False

    def __post_init__(self) -> None:
        if not 0 < float(self.threshold) < 1:
            raise PonderError(f"min_top_prob must be a probability in (0, 1), got "
                              f"{self.threshold!r} (at 0 no answer stops, at 1 every answer "
                              "stops at its first token)")

    def flags(self, step: StepView) -> torch.Tensor:
        return torch.softmax(step.logits.float(), dim=-1).amax(dim=-1) < self.threshold


# owner of the decoder (a model wrapper, a tokenizer) -> (decoder, stops, vocab) -> table;
# weak, so a cached table never keeps a model alive
TABLES: "weakref.WeakKeyDictionary[object, dict]" = weakref.WeakKeyDictionary()


def candidate_table(decode: Decode, stops: tuple[str, ...], vocab_size: int) -> torch.Tensor:
    """Bool [vocab_size] on the CPU: which tokens can complete one of ``stops`` (built once per
    decoder, stop strings and vocabulary: 0.3 s for SmolLM2's 49,152 tokens)."""
    owner = getattr(decode, "__self__", decode)
    key = (getattr(decode, "__func__", decode), stops, vocab_size)
    try:
        tables = TABLES.setdefault(owner, {})
    except TypeError:  # not weak-referenceable: build every time
        tables = {}
    if key not in tables:
        tables[key] = build_table(decode, stops, vocab_size)
    return tables[key]


def build_table(decode: Decode, stops: tuple[str, ...], vocab_size: int) -> torch.Tensor:
    ends = {s[-1] for s in stops if s}
    prefix = next((t for t in range(vocab_size) if decode([t]).strip().isalnum()), 0)
    head = decode([prefix])
    out = torch.zeros(vocab_size, dtype=torch.bool)
    for token in range(vocab_size):
        try:
            alone = decode([token])
            after = decode([prefix, token])
        except Exception:  # noqa: BLE001 - an id the tokenizer cannot decode: check it on the host
            out[token] = True
            continue
        after = after[len(head):] if after.startswith(head) else after
        texts = (alone, after)
        if any(not t or REPLACEMENT in t or any(c in t for c in ends) for t in texts):
            out[token] = True
    return out


class StopStrings:
    """Per-row stop-string checks for the generation loop (a ``StopRule``).

    ``candidates(tokens)`` marks, on the device, the rows whose newest token can complete a stop
    string; ``confirm(generated)`` checks one row on its decoded text (a window of its last
    tokens first: 4 tokens per stop character plus 4, then the whole text if the window hits).
    """

    reason = FINISH_STOP
    keeps_token = True
    needs_text = True

    def __init__(self, stop: Sequence[str] | None, decode: Decode | None, vocab_size: int,
                 device: torch.device) -> None:
        self.stops = [s for s in (stop or []) if s]
        if self.stops and decode is None:
            raise ValueError("stop strings need a decode callable (list[int] -> str)")
        self.decode = decode
        self.window = max((4 * len(s) + 4 for s in self.stops), default=0)
        self.table = None
        if self.stops:
            self.table = candidate_table(decode, tuple(sorted(set(self.stops))),
                                         int(vocab_size)).to(device)  # once per call

    def __bool__(self) -> bool:
        return bool(self.stops)

    def candidates(self, tokens: torch.Tensor) -> torch.Tensor:
        """Bool [R]: rows whose token can complete a stop string (all False without stops)."""
        if self.table is None:
            return torch.zeros_like(tokens, dtype=torch.bool)
        # a token id beyond the tokenizer's vocabulary (padded embedding rows) decodes to
        # nothing: a candidate, checked on the host like any other
        inside = tokens < self.table.numel()
        return ~inside | self.table[tokens.clamp(max=self.table.numel() - 1)]

    def flags(self, step: StepView) -> torch.Tensor:
        return self.candidates(step.tokens)

    def confirm(self, generated: list[int]) -> bool:
        assert self.decode is not None
        tail = self.decode(generated[-self.window:])
        if not any(s in tail for s in self.stops):
            return False
        text = tail if len(generated) <= self.window else self.decode(generated)
        return any(s in text for s in self.stops)
