"""Confidence-based early exit on the frozen backbone: CALM's softmax test, with no retraining.

The paper's abstract says FR-Ponder compares favourably to early-exit baselines; this is ours,
in the style of CALM (Schuster et al., 2022, "Confident Adaptive Language Modeling"), on the
backbone as shipped. docs/design/early-exit.md says what exits (decode steps only: the prompt
runs every layer, so its cache is complete), the test (after each candidate layer the state
goes through the final norm and LM head; the first candidate whose top-1 probability reaches
``threshold`` exits, and its logits choose the token), the skipped layers' cache (CALM's state
propagation: computed from the exit state) and the FLOPs (``flops.early_exit_step_flops``).

Batched rows exit at different layers, so one forward cannot stop early: a row that exited
rides through the remaining layers with its output reset to the exit state after each layer,
so each skipped layer's keys and values come from it and the final norm and LM head give the
exit layer's logits. On an accelerator a test is computed for every row and masked for rows
that exited (selecting them would read the mask back at every layer); on the CPU only the
running rows are tested (``ExitHook.running_probability``). The hook follows rows through the
generation loop (``begin_forward``) and ``model.generate``, records each decode forward's exit
layers on the device, and ``exit_accounting`` cuts each row's record to its own tokens.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn

from lm_eval_ponder.backbone import decoder_layers, final_norm, text_config
from lm_eval_ponder.engine import LoopObserver
from lm_eval_ponder.errors import PonderError
from lm_eval_ponder.flops import FlopsSpec, early_exit_generation_flops
from lm_eval_ponder.generation.settings import PonderArgs, absent
from lm_eval_ponder.hooks import RowRecords, block_hidden, regroup_by_row, with_block_hidden
from lm_eval_ponder.pondering.hook import RowSteering, SteeredCall


@dataclass(frozen=True)
class ExitSettings:
    """``early_exit=<threshold>`` and ``exit_layers=<start>[:<stop>[:<step>]]``.

    Layers are counted as layers run: an exit at 12 ran layers 1..12 of the backbone's L.
    Candidates are ``range(start, stop, step)`` below L (``stop`` unset: L). The model arg
    takes thresholds in (0, 1]; built directly, a threshold above 1 is never reached (no test
    runs), and one below every top-1 probability exits at the first candidate always (a fixed
    truncation).
    """

    threshold: float
    start: int = 1
    stop: int | None = None
    step: int = 1

    @classmethod
    def from_model_args(cls, early_exit: Any, exit_layers: Any = None,
                        ponder: PonderArgs | None = None) -> ExitSettings | None:
        """The settings, or None when ``early_exit`` is not given; refuses bad values and any
        combination with steering (a controller, ``alpha``, or the shipped controller that an
        unset ``controller=`` loads), before the backbone is loaded."""
        if absent(early_exit):
            if not absent(exit_layers):
                raise PonderError("exit_layers= needs early_exit=<threshold>")
            return None
        try:
            threshold = float(early_exit)
        except ValueError:
            threshold = math.nan
        if not 0 < threshold <= 1:  # NaN too
            raise PonderError(f"early_exit must be a top-1 probability threshold in (0, 1], "
                              f"got {early_exit!r} (above 1 no token ever exits, at 0 every "
                              "token exits at the first candidate layer)")
        if ponder is not None and (ponder.controller is not None or ponder.alpha is not None
                                   or ponder.controller_auto):
            raise PonderError("early_exit= is a baseline on the plain backbone: pass it with "
                              "controller=none, without alpha= or a controller")
        return cls(threshold, *parse_layers(exit_layers))

    def candidates(self, n_layers: int) -> tuple[int, ...]:
        """The layer counts after which a token is tested (empty above threshold 1)."""
        if self.stop is not None and self.stop > n_layers:
            raise PonderError(f"exit_layers stops at {self.stop}, but the backbone has "
                              f"{n_layers} layers")
        if self.start >= n_layers:
            raise PonderError(f"exit_layers starts at {self.start}: the backbone has {n_layers} "
                              "layers, and the last one is the full model, not an exit")
        if self.threshold > 1:
            return ()
        return tuple(range(self.start, n_layers if self.stop is None else self.stop, self.step))

    @property
    def layers(self) -> str:
        """The candidate layers as ``exit_layers=`` spells them."""
        return f"{self.start}:{'' if self.stop is None else self.stop}" + (
            f":{self.step}" if self.step != 1 else "")

    def fingerprint(self) -> dict[str, Any]:
        return {"threshold": self.threshold, "layers": self.layers}

    def set_up(self, model: nn.Module, device: Any, rows: int) -> SteeredCall:
        """Early exit steers nothing; its hook lets tokens exit and records where
        (``CallSteering``)."""
        hook = ExitHook(model, self)
        return SteeredCall(hook=hook, rows=ExitRows(hook, self))


def parse_layers(spec: Any) -> tuple[int, int | None, int]:
    """``start[:stop[:step]]`` (unset: every layer) as ``(start, stop, step)``."""
    if absent(spec):
        return 1, None, 1
    parts = str(spec).strip().split(":")
    try:
        numbers = [None if p.strip() == "" else int(p) for p in parts]
    except ValueError:
        numbers = []
    if not numbers or len(parts) > 3:
        raise PonderError(f"exit_layers must be start[:stop[:step]] in layers run (e.g. 16:30:2), "
                          f"got {spec!r}")
    start, stop, step = numbers + [None] * (3 - len(numbers))
    start = 1 if start is None else start
    step = 1 if step is None else step
    if start < 1 or step < 1 or (stop is not None and stop <= start):
        raise PonderError(f"exit_layers {spec!r}: need 1 <= start < stop and step >= 1")
    return start, stop, step


def exit_label(fingerprint: dict[str, Any]) -> str:
    """The report's method label of an early-exit run, from its fingerprint's ``early_exit``."""
    label = f"EE (p>={float(fingerprint['threshold']):g}"
    layers = fingerprint.get("layers")
    return label + (f", layers {layers})" if layers not in (None, "1:") else ")")


def exit_tests(candidates: Sequence[int], exit_layer: int) -> int:
    """How many tests a token went through: every candidate up to its exit (all of them when it
    never exited)."""
    return sum(1 for c in candidates if c <= exit_layer)


def exit_accounting(spec: FlopsSpec, settings: ExitSettings, exits: torch.Tensor,
                    prompt_tokens: int, gen_tokens: int,
                    logits_to_keep: int = 1) -> dict[str, float]:
    """A row's ``exit_layer`` (the mean number of layers that produced its generated tokens,
    the first, from the prefill, at the full depth) and ``flops`` (``flops.
    early_exit_generation_flops``, the prefill's logits kept as ``logits_to_keep`` says), from
    the exit layers of its decode steps in order. Records after its last token (a finished row
    waiting for the batch) are cut off."""
    steps = [int(e) for e in exits[: max(gen_tokens - 1, 0)].tolist()]
    if len(steps) < gen_tokens - 1:
        raise RuntimeError(f"internal: {len(steps)} exit records for {gen_tokens} tokens")
    candidates = settings.candidates(spec.n_layers)
    flops = early_exit_generation_flops(spec, prompt_tokens,
                                        [(e, exit_tests(candidates, e)) for e in steps],
                                        logits_to_keep)
    mean = (spec.n_layers + sum(steps)) / (1 + len(steps)) if gen_tokens else spec.n_layers
    return {"exit_layer": float(mean), "flops": float(flops)}


@dataclass
class ExitRows:
    """The rows of one early-exit call as they end: each decode step's exit layer, by the rows
    its ``hook`` saw, read as the records grow (``hooks.RowRecords``); each row prices itself
    (``exit_accounting``)."""

    hook: ExitHook
    settings: ExitSettings
    exits: RowRecords = field(default_factory=RowRecords)

    def row(self, row: int, ran: int) -> RowSteering:
        self.exits.read(self.hook.exits, self.hook.exit_rows)
        layers = self.exits.of(row)
        return RowSteering(own_accounting=lambda spec, prompt, gen, logits: exit_accounting(
            spec, self.settings, layers, prompt, gen, logits))


class ExitHook(LoopObserver):
    """Context manager: forward hooks on every decoder layer that let decode tokens exit.

    ``exits``/``exit_rows``: per decode forward, each row's exit layer ([B] long, L for no exit)
    and the original rows it covers (None: rows 0..B-1), on the model's device. The hooks are
    removed on exit, also when the body raises.
    """

    def __init__(self, model: nn.Module, settings: ExitSettings) -> None:
        self.layers = decoder_layers(model)
        self.n_layers = len(self.layers)
        self.candidates = frozenset(settings.candidates(self.n_layers))
        self.threshold = float(settings.threshold)
        self.norm = final_norm(model)
        self.head = model.get_output_embeddings()
        if self.head is None:
            raise PonderError(f"early exit needs the LM head of {type(model).__name__}")
        self.softcap = getattr(text_config(model.config), "final_logit_softcapping", None)
        self.exits: list[torch.Tensor] = []
        self.exit_rows: list[torch.Tensor | None] = []
        self.n_forward = 0
        self._rows: torch.Tensor | None = None
        self._prefill = False
        self._decoding = False
        self._handles: list[Any] = []
        self._exited: torch.Tensor | None = None  # this forward: rows that exited, [B] bool
        self._exit_layer: torch.Tensor | None = None  # ... and where, [B] long
        self._exit_state: torch.Tensor | None = None  # ... and their state there, [B, d]

    def __enter__(self) -> ExitHook:
        self.exits, self.exit_rows, self.n_forward = [], [], 0
        self._rows, self._prefill = None, False
        self._handles = [self.layers[0].register_forward_pre_hook(self._start_forward)]
        for index, layer in enumerate(self.layers):
            self._handles.append(layer.register_forward_hook(
                lambda module, args, output, k=index + 1: self._after_layer(k, output)))
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    # ------------------------------------------------------------------ the loop's protocol
    def begin_forward(self, rows: torch.Tensor, prefill: bool) -> None:
        """The original row indices of the coming forward, and whether it is a prefill."""
        self._rows, self._prefill = rows, prefill

    def per_row(self, n_rows: int) -> list[torch.Tensor]:
        """Each row's exit layers, one per decode forward it rode in, in order (CPU)."""
        return regroup_by_row(self.exits, self.exit_rows, n_rows)

    # ------------------------------------------------------------------ the hooks
    def _start_forward(self, module: nn.Module, args: Any) -> None:
        # model.generate: the same rows throughout, the first forward is the prefill
        prefill = self._prefill if self._rows is not None else self.n_forward == 0
        self.n_forward += 1
        self._decoding = not prefill
        self._exited = self._exit_layer = self._exit_state = None

    def top1_probability(self, state: torch.Tensor) -> torch.Tensor:
        """[B] top-1 probability of the logits that ``state`` [B, d] would give as the last
        layer's output."""
        logits = self.head(self.norm(state))
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        # one fused float32 softmax: half the time of a float copy, max and logsumexp (on this
        # CPU, 74 ms against 142 for 50 rows of SmolLM2's 49,152 logits)
        return torch.softmax(logits, dim=-1, dtype=torch.float32).amax(dim=-1)

    def running_probability(self, state: torch.Tensor) -> torch.Tensor:
        """[B] top-1 probability of the rows that have not exited (others: 0). On an
        accelerator every row is tested and the result masked, since selecting rows would read
        the mask back to the host at every layer; on the CPU, where that read costs nothing and
        a test costs 7.5 layers of SmolLM2, only the running rows are tested."""
        if state.device.type != "cpu":
            return self.top1_probability(state).masked_fill(self._exited, 0.0)
        running = (~self._exited).nonzero().squeeze(1)
        probability = torch.zeros(state.shape[0], dtype=torch.float32, device=state.device)
        if len(running):
            probability[running] = self.top1_probability(state.index_select(0, running))
        return probability

    def _after_layer(self, k: int, output: Any) -> Any:
        if not self._decoding:
            return None
        hidden = block_hidden(output)
        if hidden.shape[1] != 1:
            raise RuntimeError(f"internal: a decode forward of {hidden.shape[1]} positions")
        state = hidden[:, -1, :]
        if self._exited is None:  # the first layer of this forward
            self._exited = torch.zeros(state.shape[0], dtype=torch.bool, device=state.device)
            self._exit_layer = torch.full((state.shape[0],), self.n_layers, dtype=torch.long,
                                          device=state.device)
        replaced = self._exit_state is not None
        if replaced:  # rows that exited at an earlier layer ride on with their exit state
            state = torch.where(self._exited[:, None], self._exit_state, state)
        if k in self.candidates:
            passed = (self.running_probability(state) >= self.threshold) & ~self._exited
            self._exit_state = state if self._exit_state is None else \
                torch.where(passed[:, None], state, self._exit_state)
            self._exit_layer = torch.where(passed, k, self._exit_layer)
            self._exited = self._exited | passed
        if k == self.n_layers:
            self.exits.append(self._exit_layer)
            self.exit_rows.append(self._rows)
        return with_block_hidden(output, state[:, None, :]) if replaced else None
