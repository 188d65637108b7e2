"""Stop strings, checked only where a new token can complete one.

lm-eval ends a generation at the first occurrence of any ``until`` string in the decoded text
(EOS's own text is always among them). Decoding every row's text at every step to look for
them cost as much host time per step as a small model's forward on a GPU (4,353
decodes, 0.13 s, in a 32-step profile of 128 rows). But an occurrence that the newest token
completes must end inside that token's text: the text before it held no occurrence. So only a
token whose text holds the last character of some stop string can complete one, and only rows
that just emitted such a token are decoded.

Decoding is not additive (a byte-fallback piece decodes to nothing or to U+FFFD alone, a
SentencePiece word-start drops its space at the start of a text, special tokens decode to
nothing), so a token is a candidate when its text alone, or its text after a plain prefix
token, contains one of those last characters, or either is empty or holds U+FFFD. The table
is built once per (decoder, stop strings, vocabulary) and kept. A candidate row is confirmed
on its own decoded text, as before: a row never stops before a stop string is complete.
"""

from __future__ import annotations

import weakref
from typing import Callable, Sequence

import torch

Decode = Callable[[list[int]], str]
REPLACEMENT = "\ufffd"


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
    """Per-row stop-string checks for the generation loop.

    ``candidates(tokens)`` marks, on the device, the rows whose newest token can complete a stop
    string; ``hit(generated)`` confirms one row on its decoded text (a window of its last
    tokens first: 4 tokens per stop character plus 4, then the whole text if the window hits).
    """

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

    def hit(self, generated: list[int]) -> bool:
        assert self.decode is not None
        tail = self.decode(generated[-self.window:])
        if not any(s in tail for s in self.stops):
            return False
        text = tail if len(generated) <= self.window else self.decode(generated)
        return any(s in text for s in self.stops)
