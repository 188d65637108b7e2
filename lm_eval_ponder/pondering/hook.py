"""The steering hook: adds a per-row offset along the steering vector to one decoder layer.

Why a forward hook and not a patched model: the backbone stays a stock transformers model, so
every architecture, ``generate`` and lm-eval's HFLM work unchanged; the hook is a context manager
that always removes itself. What to add is decided by a ``decide`` callable (a fixed alpha, or a
controller through ``pondering.dynamics.ControllerDecide``), at the granularity the paper's two
descriptions disagree on (``"prompt"`` or ``"token"``, see ``pondering.dynamics``).
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn

from lm_eval_ponder.backbone import decoder_layers
from lm_eval_ponder.errors import PonderError
from lm_eval_ponder.pondering.dynamics import GRANULARITIES


class SteeringHook:
    """Context manager adding ``offset_b * scale * vector`` to row b of one decoder layer's output.

    Only the last position of each forward pass is touched: with HF's left padding that is
    every row's last prompt token in the prefill, and the new token in each cached decode step
    (the Fractional Reasoning peer steers the same positions).

    - ``mode="prompt"``: ``decide(z_last [B, d]) -> offsets [B]`` is called once, on the first
      forward pass after entering (the prefill); those offsets are reused at every later step.
    - ``mode="token"``: ``decide`` is called at every forward pass on that pass's last state.

    ``z_last`` is the unsteered layer output in the model's dtype. ``self.decisions`` holds the
    offsets each call returned (detached, on the model's device: no host sync in the hot path);
    depths, if wanted, are recorded by ``decide`` itself (see ``ControllerDecide``). The hook is
    removed on exit, also when the body raises.
    """

    def __init__(self, model: nn.Module, layer: int, vector: torch.Tensor, scale: float,
                 decide: Callable[[torch.Tensor], torch.Tensor], mode: str = "prompt") -> None:
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
        self.n_forward = 0
        self._step: torch.Tensor | None = None  # scale * vector, float32 on the model's device
        self._offsets: torch.Tensor | None = None  # prompt mode: offsets fixed at prefill
        self._handle = None

    def __enter__(self) -> SteeringHook:
        self.decisions, self.n_forward, self._offsets = [], 0, None
        self._handle = self.module.register_forward_hook(self._hook)
        return self

    def __exit__(self, *exc) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def _decide(self, z_last: torch.Tensor) -> torch.Tensor:
        offsets = torch.as_tensor(self.decide(z_last.detach()))
        offsets = offsets.to(device=z_last.device, dtype=torch.float32)
        if offsets.shape != z_last.shape[:1]:
            raise PonderError(f"decide returned shape {tuple(offsets.shape)}, expected "
                              f"({z_last.shape[0]},): one offset per row")
        self.decisions.append(offsets)
        return offsets

    def _hook(self, module: nn.Module, args, output):
        hidden = output if isinstance(output, torch.Tensor) else output[0]
        if self._step is None:  # cast once, on first sight of the model's device
            if self.vector.shape[0] != hidden.shape[-1]:
                raise PonderError(f"steering vector has size {self.vector.shape[0]}, the "
                                  f"layer's hidden size is {hidden.shape[-1]}")
            self._step = self.scale * self.vector.to(device=hidden.device, dtype=torch.float32)
        self.n_forward += 1
        if self.mode == "token" or self._offsets is None:
            offsets = self._decide(hidden[:, -1, :])
            if self.mode == "prompt":
                self._offsets = offsets
        else:
            offsets = self._offsets
            if offsets.shape[0] != hidden.shape[0]:
                raise PonderError(f"prompt-mode steering saw batch {offsets.shape[0]} at "
                                  f"prefill and {hidden.shape[0]} later: one hook per generate")
        shift = (offsets[:, None] * self._step).to(hidden.dtype)
        last = hidden[:, -1:, :] + shift[:, None, :]
        steered = torch.cat([hidden[:, :-1, :], last], dim=1)  # out of place: autograd-safe
        return steered if isinstance(output, torch.Tensor) else (steered, *output[1:])
