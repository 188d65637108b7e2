"""Reading and replacing a decoder block's output: the one place that knows its shape.

Decoder blocks return a tensor in some transformers versions and architectures and a tuple
``(hidden, ...)`` in others (steering-vectors' ``untuple_tensor`` handles the same split). The
steering hook, the extractor and the rollout cache all read the block output, and the hook
also replaces it, so both directions live here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn as nn


def block_hidden(output: Any) -> torch.Tensor:
    """The hidden states [B, T, d] of a decoder block's output (a tensor, or a tuple's first)."""
    return output[0] if isinstance(output, (tuple, list)) else output


def regroup_by_row(values: list[torch.Tensor], rows: list[torch.Tensor | None],
                   n_rows: int) -> list[torch.Tensor]:
    """One-tensor-per-forward records regrouped by original row: row r's values in forward
    order. ``rows[i]``: the original rows of ``values[i]``, in batch order (None: rows 0..B-1,
    as under ``model.generate``). Hooks that follow rows through the generation loop (steering
    decisions, early-exit layers) record this way, on the device; this is their one read-back,
    after generation."""
    records = RowRecords()
    records.read(values, rows)
    return [records.of(r) for r in range(n_rows)]


class RowRecords:
    """``regroup_by_row`` read while generation runs: each ``read`` moves to the CPU only the
    records added since the last one, so reading rows one by one as they finish (to keep each
    answer with its accounting the moment it ends) costs one pass over the records in all."""

    def __init__(self) -> None:
        self.by_row: dict[int, list[torch.Tensor]] = {}
        self.seen = 0

    def read(self, values: list[torch.Tensor], rows: list[torch.Tensor | None]) -> None:
        if len(values) != len(rows):
            raise RuntimeError("internal: records do not match the rows they cover")
        for value, covered in zip(values[self.seen:], rows[self.seen:]):
            value = value.detach().cpu()
            covered = range(len(value)) if covered is None else covered.cpu().tolist()
            for v, r in zip(value, covered):
                self.by_row.setdefault(r, []).append(v)
        self.seen = len(values)

    def of(self, row: int) -> torch.Tensor:
        values = self.by_row.get(row)
        return torch.stack(values) if values else torch.zeros(0)


def with_block_hidden(output: Any, hidden: torch.Tensor) -> Any:
    """``output`` with its hidden states replaced, in the same container shape."""
    if isinstance(output, (tuple, list)):
        return type(output)((hidden, *output[1:]))
    return hidden


@contextlib.contextmanager
def last_token_capture(module: nn.Module) -> Iterator[list[torch.Tensor]]:
    """Record ``module``'s output at the last position of every forward pass (float32, CPU).

    Yields the list the states are appended to, one [B, d] tensor per forward; the hook is
    removed on exit, also when the body raises.
    """
    captured: list[torch.Tensor] = []

    def hook(_module, _inputs, output):
        captured.append(block_hidden(output)[:, -1, :].detach().float().cpu())

    handle = module.register_forward_hook(hook)
    try:
        yield captured
    finally:
        handle.remove()
