"""What steers a generation call: a loaded steering vector at one layer (``Steering``), the
pondering that adds a controller's (or a fixed alpha's) offsets to it (``Pondering``), and one
fixed offset per row (``OffsetsPerRow``, the rollout cache's). Each is a ``CallSteering``
(``pondering.hook``): ``set_up`` makes the call's hook. Loading them from their directories and
the model args that choose them are the adapter's (``generation.settings``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from lm_eval_ponder.errors import PonderError
from lm_eval_ponder.files import file_sha256
from lm_eval_ponder.hooks import RowRecords
from lm_eval_ponder.pondering.dynamics import (
    ControllerDecide,
    Decide,
    FixedOffset,
    PonderConfig,
    RowOffsets,
    cumulative_offsets,
)
from lm_eval_ponder.pondering.hook import RowSteering, SteeredCall, SteeringHook


def short_sha(path: Path) -> str:
    """The first 16 hex digits of a file's SHA-256, or "missing": artefact identities."""
    return file_sha256(path)[:16] if path.is_file() else "missing"


@dataclass
class Steering:
    """A loaded steering vector at one layer: what every steered call adds its offsets to.

    The model's own pondering holds one (``Pondering.steering``); the trainer loads one for a
    model that steers no call unless the call says how (``training.loop.load_backbone``)."""

    steering_dir: Path
    layer: int
    vector: torch.Tensor  # unit steering vector at ``layer``, float32 [d]
    scale: float  # mean residual norm at ``layer``: offsets are fractions of it

    def sha(self) -> str:
        """The vector file's identity (``short_sha``), as fingerprints and caches record it."""
        return short_sha(self.steering_dir / "steering.safetensors")

    def hook(self, model: torch.nn.Module, decide: Decide, device, mode: str) -> SteeringHook:
        """A fresh steering hook for one generation call, adding ``decide``'s offsets."""
        return SteeringHook(model, self.layer, self.vector.to(device), self.scale, decide,
                            mode=mode)


@dataclass
class OffsetsPerRow:
    """One fixed offset per row along ``steering``'s vector (fractions of the residual norm):
    how the rollout cache generates every depth of many prompts in one call."""

    steering: Steering
    offsets: list[float]

    def set_up(self, model: torch.nn.Module, device, rows: int) -> SteeredCall:
        if len(self.offsets) != rows:
            raise PonderError(f"{len(self.offsets)} offsets for {rows} rows: one per row")
        hook = self.steering.hook(model, RowOffsets(list(self.offsets), device), device, "prompt")
        return hook.set_up(model, device, rows)


@dataclass
class Pondering:
    """What a steered call does: a loaded ``Steering`` plus a controller (with its settings)
    or a fixed alpha, for one backbone."""

    steering: Steering
    controller_dir: Path | None
    controller: torch.nn.Module | None
    config: PonderConfig
    alpha: float | None  # the fixed offset, when there is no controller

    @classmethod
    def fixed(cls, steering: Steering, alpha: float) -> Pondering:
        """Pondering at one fixed offset ``alpha`` with ``steering``'s vector, no controller:
        what ``--model ponder alpha=...`` does (the Fractional Reasoning baseline)."""
        return cls(steering=steering, controller_dir=None, controller=None,
                   config=PonderConfig(), alpha=float(alpha))

    @property
    def granularity(self) -> str:
        return self.config.granularity if self.controller is not None else "prompt"

    def fingerprint(self) -> dict[str, Any]:
        return {
            "steering": self.steering.sha(),
            "layer": self.steering.layer,
            "alpha": self.alpha,
            "controller": None if self.controller_dir is None
            else short_sha(self.controller_dir / "controller.safetensors"),
            **(vars(self.config) if self.controller is not None else {}),
        }

    def set_up(self, model: torch.nn.Module, device, rows: int) -> SteeredCall:
        """A fresh steering hook for one call of ``rows`` rows and its rows' statistics: the
        depths a controller chose (a fixed alpha charges a row nothing)."""
        steering = self.steering
        if self.controller is None:
            hook = steering.hook(model, FixedOffset(self.alpha), device, "prompt")
            return hook.set_up(model, device, rows)
        # every tensor a decision reads is on the device before generation starts, so the
        # first steered forward copies nothing from the host either
        decider = ControllerDecide(self.controller, steering.vector.to(device), steering.scale,
                                   cumulative_offsets(self.config).to(device), self.config.tau)
        hook = steering.hook(model, decider, device, self.granularity)
        hook.expect_rows(rows)
        return SteeredCall(hook=hook, rows=PonderedRows(self.config, self.controller, hook, decider))


@dataclass
class PonderedRows:
    """The rows of one call that a controller steers as they end: the depths its ``decider``
    chose, by the rows its ``hook`` saw in each forward, read as the records grow
    (``hooks.RowRecords``)."""

    config: PonderConfig
    controller: torch.nn.Module
    hook: SteeringHook
    decider: ControllerDecide
    depths: RowRecords = field(default_factory=RowRecords)

    def row(self, row: int, ran: int) -> RowSteering:
        """Row ``row``'s ponder steps, controller evaluations and their FLOPs, from the depths
        its decisions chose, in order. A row that finished early under ``model.generate`` kept
        deciding for padding: only its first ``ran`` decisions count."""
        self.depths.read(self.decider.depths, self.hook.decision_rows)
        depths = self.depths.of(row)
        if len(depths) == 0:
            return RowSteering()
        evals_per_decision = self.config.k_max + 1  # all candidates, one batched call
        if self.config.granularity == "prompt":
            steps, evals = float(depths[0]), evals_per_decision
        else:
            used = depths[: max(ran, 1)]
            steps, evals = used.float().mean().item(), evals_per_decision * len(used)
        return RowSteering(steps, evals, self.controller.evaluation_flops(evals))
