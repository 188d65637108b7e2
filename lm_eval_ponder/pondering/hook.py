"""The steering hook: adds a per-row offset along the steering vector to one decoder layer.

Why a forward hook and not a patched model: the backbone stays a stock transformers model, so
every architecture, ``generate`` and lm-eval's HFLM work unchanged; the hook is a context manager
that always removes itself. What to add is decided by a ``Decide`` (``pondering.dynamics``: a
fixed offset, one offset per row, a controller, or the trainer's sampling policy), at the
granularity the paper's two descriptions disagree on (``"prompt"`` or ``"token"``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
import torch.nn as nn

from lm_eval_ponder.backbone import decoder_layers
from lm_eval_ponder.engine import LoopObserver
from lm_eval_ponder.errors import PonderError
from lm_eval_ponder.flops import FlopsSpec
from lm_eval_ponder.hooks import block_hidden, regroup_by_row, with_block_hidden
from lm_eval_ponder.pondering.dynamics import GRANULARITIES, Decide


@dataclass(frozen=True)
class RowSteering:
    """What a call's steering did to one row, read as the row ends: its ponder steps (the
    depth; at token granularity the mean), the controller's evaluations and their FLOPs (zeros
    where no controller decides), and for a row that prices itself (early exit: each token's
    exit layer sets its cost) its accounting from (the backbone's ``FlopsSpec``, prompt tokens,
    generated tokens, prefill logits kept)."""

    ponder_steps: float = 0.0
    controller_evals: int = 0
    controller_flops: int = 0
    own_accounting: Callable[[FlopsSpec, int, int, int], dict[str, float]] | None = None


class RowStatistics(Protocol):
    """A steered call's statistics per row, read from its hook's records as each row ends (so
    an answer kept the moment it ends carries them): ``row(row, ran)``, row ``row`` having run
    a forward for ``ran`` tokens."""

    def row(self, row: int, ran: int) -> RowSteering: ...


class NoRowStatistics:
    """Steering that decides nothing a row is charged for (none, fixed offsets, a caller's hook)."""

    def row(self, row: int, ran: int) -> RowSteering:
        return RowSteering()


@dataclass(frozen=True)
class SteeredCall:
    """One generation call's steering once set up (``CallSteering.set_up``): its forward
    ``hook`` (a context manager and loop observer; None: nothing is added) and the statistics
    it keeps per row (``rows``), from which ``generation.pricing`` prices each row."""

    hook: LoopObserver | None = None
    rows: RowStatistics = field(default_factory=NoRowStatistics)


class CallSteering(Protocol):
    """A way of steering a generation call: a ``Pondering`` (the model's own, or a fixed
    alpha), one fixed offset per row (``OffsetsPerRow``: the rollout cache), a ``SteeringHook``
    the caller built (the token-level trainer's policy), an early exit, or ``UNSTEERED``. One
    method (``set_up``) sets up the call's hooks for ``rows`` rows."""

    def set_up(self, model: nn.Module, device: Any, rows: int) -> SteeredCall: ...


class Unsteered:
    """Nothing added: the plain backbone."""

    def set_up(self, model: nn.Module, device: Any, rows: int) -> SteeredCall:
        return SteeredCall()


UNSTEERED = Unsteered()


class SteeringHook(LoopObserver):
    """Context manager adding ``offset_b * scale * vector`` to row b of one decoder layer's output.

    Only the last position of each forward pass is touched: with HF's left padding that is
    every row's last prompt token in the prefill, and the new token in each cached decode step
    (the Fractional Reasoning peer steers the same positions).

    - ``mode="prompt"``: ``decide(z_last [B, d]) -> offsets [B]`` is called on the prefill;
      those offsets are reused at every later step.
    - ``mode="token"``: ``decide`` is called at every forward pass on that pass's last state.

    Rows that leave or join: under ``model.generate`` every forward holds the same rows, the
    first being the prefill; the generation loop tells the hook (``begin_forward``) the original
    rows of each forward, so a row's prompt-mode offset (decided at its own prefill) and its
    decisions stay attached to it (docs/design/generation.md, "Steering follows its rows").
    ``expect_rows(n)`` sizes the per-row offset table once, so no host sync is needed.

    ``z_last`` is the unsteered layer output in the model's dtype. ``decisions`` holds the
    offsets each call returned and ``decision_rows`` the rows it covered (None: all rows), on
    the model's device; depths, if wanted, are recorded by ``decide`` itself
    (``ControllerDecide``), and ``per_row`` regroups any per-call record by row. The hook is
    removed on exit, also when the body raises.
    """

    def __init__(self, model: nn.Module, layer: int, vector: torch.Tensor, scale: float,
                 decide: Decide, mode: str = "prompt") -> None:
        if mode not in GRANULARITIES:
            raise PonderError(f"steering mode must be one of {GRANULARITIES}, got {mode!r}")
        layers = decoder_layers(model)
        if not -len(layers) <= layer < len(layers):
            raise PonderError(f"steering layer {layer} out of range: the model has "
                              f"{len(layers)} decoder layers")
        if vector.dim() != 1:
            raise PonderError(f"steering vector must be 1-D [d], got shape {tuple(vector.shape)}")
        self.module = layers[layer]
        self.vector = vector.detach()
        self.scale = float(scale)
        self.decide = decide
        self.mode = mode
        self.decisions: list[torch.Tensor] = []
        self.decision_rows: list[torch.Tensor | None] = []
        self.n_forward = 0
        self._step: torch.Tensor | None = None  # scale * vector, float32 on the model's device
        self._offsets: torch.Tensor | None = None  # prompt mode: offsets fixed at prefill
        self._n_rows: int | None = None
        self._rows: torch.Tensor | None = None  # rows of the coming forward (loop only)
        self._prefill = False
        self._handle = None

    def __enter__(self) -> SteeringHook:
        self.decisions, self.decision_rows, self.n_forward, self._offsets = [], [], 0, None
        self._rows, self._prefill = None, False
        self._handle = self.module.register_forward_hook(self._hook)
        return self

    def __exit__(self, *exc) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def set_up(self, model: nn.Module, device: Any, rows: int) -> SteeredCall:
        """A hook the caller built steers the call as it is (``CallSteering``)."""
        self.expect_rows(rows)
        return SteeredCall(hook=self)

    # ------------------------------------------------------------------ the loop's protocol
    def expect_rows(self, n_rows: int) -> None:
        """The number of rows (requests) of the coming generation call."""
        self._n_rows = int(n_rows)

    def begin_forward(self, rows: torch.Tensor, prefill: bool) -> None:
        """The original row indices of the coming forward, and whether it is a prefill."""
        self._rows, self._prefill = rows, prefill

    def per_row(self, values: list[torch.Tensor], n_rows: int) -> list[torch.Tensor]:
        """Regroup one-tensor-per-decision records (offsets, depths) by original row: row r's
        values in decision order. Call after generation (it moves the records to the CPU)."""
        if len(values) != len(self.decision_rows):
            raise RuntimeError("internal: records do not match the hook's decisions")
        return regroup_by_row(values, self.decision_rows, n_rows)

    # ------------------------------------------------------------------ the forward hook
    def _decide(self, z_last: torch.Tensor, rows: torch.Tensor | None) -> torch.Tensor:
        offsets = torch.as_tensor(self.decide(z_last.detach(), rows))
        offsets = offsets.to(device=z_last.device, dtype=torch.float32)
        if offsets.shape != z_last.shape[:1]:
            raise PonderError(f"decide returned shape {tuple(offsets.shape)}, expected "
                              f"({z_last.shape[0]},): one offset per row")
        self.decisions.append(offsets)
        self.decision_rows.append(rows)
        return offsets

    def _prompt_offsets(self, hidden: torch.Tensor) -> torch.Tensor:
        rows = self._rows
        if rows is None:  # model.generate: the same rows throughout, prefill first
            if self._offsets is None:
                self._offsets = self._decide(hidden[:, -1, :], None)
            elif self._offsets.shape[0] != hidden.shape[0]:
                raise PonderError(f"prompt-mode steering saw batch {self._offsets.shape[0]} at "
                                  f"prefill and {hidden.shape[0]} later: one hook per generate")
            return self._offsets
        if self._offsets is None:
            if self._n_rows is None:
                raise PonderError("internal: expect_rows() must precede a row-tracked generation")
            self._offsets = torch.zeros(self._n_rows, device=hidden.device, dtype=torch.float32)
        if self._prefill:
            offsets = self._decide(hidden[:, -1, :], rows)
            self._offsets[rows] = offsets
            return offsets
        return self._offsets[rows]

    def _hook(self, module: nn.Module, args, output):
        hidden = block_hidden(output)
        if self._step is None:  # cast once, on first sight of the model's device
            if self.vector.shape[0] != hidden.shape[-1]:
                raise PonderError(f"steering vector has size {self.vector.shape[0]}, the "
                                  f"layer's hidden size is {hidden.shape[-1]}")
            self._step = self.scale * self.vector.to(device=hidden.device, dtype=torch.float32)
        self.n_forward += 1
        if self.mode == "token":
            offsets = self._decide(hidden[:, -1, :], self._rows)
        else:
            offsets = self._prompt_offsets(hidden)
        shift = (offsets[:, None] * self._step).to(hidden.dtype)
        if not (torch.is_grad_enabled() and hidden.requires_grad):
            hidden[:, -1, :] += shift  # the backbone is frozen: no copy of the [B, T, d] output
            return output
        last = hidden[:, -1:, :] + shift[:, None, :]
        steered = torch.cat([hidden[:, :-1, :], last], dim=1)  # out of place: autograd-safe
        return with_block_hidden(output, steered)
