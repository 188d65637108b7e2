"""Latent pondering: evolve a hidden state along a steering vector until the controller halts.

Paper (Methodology, "State Evolution"): z_{k+1} = z_k + alpha_k h with alpha_k = alpha0 e^{-beta k}
(eq. evolution); the controller halts at the first k with phi(z_k) <= tau. Every step moves along
the same h, so z_k = z_0 + c_k h with known scalars c_k: one batched controller call scores all
K_max+1 candidate states, and the halting depth is the first index under tau. No Python loop
over k, ever.

Units: ``alpha0`` and ``alpha_start`` are fractions of a reference residual-stream norm, which
the caller multiplies in (``SteeringHook(scale=...)``, ``ponder(h=scale * vector)``): on
SmolLM2-135M useful offsets are ~15% of a norm of ~163, so a fraction transfers across backbones
where a raw alpha would not. ``alpha_start`` is a signed offset before any pondering (depth 0):
the paper's steps only push toward "deliberate", and a concise start lets a controller land on
either side of the unsteered model. Granularity: ``"prompt"`` ponders once on the last prompt
token (appendix algorithm), ``"token"`` at every decoding step (introduction);
``pondering.hook.SteeringHook`` implements both. docs/design/paper-gaps.md says where the paper
disagrees with itself and what we chose.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Callable, Protocol

import torch
import torch.nn as nn

from lm_eval_ponder.errors import PonderError

GRANULARITIES = ("prompt", "token")


@dataclass
class PonderConfig:
    """Pondering hyper-parameters. alpha0 and alpha_start are fractions of a reference norm."""

    tau: float = field(
        default=0.2, metadata={"help": "halt at the first k with phi(z_k) <= tau (the paper's 0.2)"})
    k_max: int = field(default=8, metadata={"help": "at most this many ponder steps"})
    # Defaults chosen from the fixed-alpha sweep on the embedded backbone (docs/results/steering.md):
    # offsets below -0.2 of the residual norm break answers, offsets above 0 lengthen them and
    # cost accuracy, -0.2 keeps accuracy with ~45% fewer tokens. Starting at -0.2 (concise) and
    # pondering toward "deliberate" with alpha0=0.05, beta=0.3 spans c_k in [-0.2, -0.025]:
    # from the most concise useful state back to about the unsteered one. The paper's form is
    # alpha_start=0 (it can only move toward +0.175, the region that measured worse).
    alpha0: float = field(
        default=0.05, metadata={"help": "first step size, as a fraction of the reference residual norm"})
    beta: float = field(
        default=0.3, metadata={"help": "step decay: alpha_k = alpha0 * exp(-beta * k)"})
    alpha_start: float = field(
        default=-0.2, metadata={"help": "signed offset before pondering, fraction of the reference norm"})
    granularity: str = field(
        default="prompt", metadata={"help": "'prompt' (ponder once per prompt) | 'token' (every step)"})

    def validate(self) -> PonderConfig:
        """Raise PonderError on settings that cannot mean anything; return self for chaining."""
        if not (0.0 < self.tau < 1.0):
            raise PonderError(f"tau must be in (0, 1), got {self.tau}")
        if not isinstance(self.k_max, int) or self.k_max < 0:
            raise PonderError(f"k_max must be an integer >= 0, got {self.k_max!r}")
        for name in ("alpha0", "beta", "alpha_start"):
            if not math.isfinite(getattr(self, name)):
                raise PonderError(f"{name} must be a finite number, got {getattr(self, name)}")
        if self.alpha0 <= 0:
            raise PonderError(f"alpha0 must be > 0 (each ponder step moves toward the "
                              f"steering direction; a sign or a start goes in alpha_start), "
                              f"got {self.alpha0}")
        if self.beta < 0:
            raise PonderError(f"beta must be >= 0 (a negative decay grows without bound), "
                              f"got {self.beta}")
        if self.granularity not in GRANULARITIES:
            raise PonderError(f"granularity must be one of {GRANULARITIES}, "
                              f"got {self.granularity!r}")
        return self


def step_size(alpha0: float, beta: float, k: int | float | torch.Tensor):
    """alpha_k = alpha0 * exp(-beta * k): the decaying step of the state evolution eq. (evolution).

    Accepts a scalar k (returns a float) or a tensor of k (returns a float64 tensor).
    """
    if isinstance(k, torch.Tensor):
        return alpha0 * torch.exp(-beta * k.to(torch.float64))
    return alpha0 * math.exp(-beta * k)


def cumulative_offsets(cfg: PonderConfig) -> torch.Tensor:
    """c_k for k = 0..k_max, so that z_k = z_0 + c_k h, shape [k_max + 1], float32.

    c_0 = alpha_start and c_k = c_0 + sum_{j<k} alpha_j (summed in float64).
    """
    cfg.validate()
    steps = step_size(cfg.alpha0, cfg.beta, torch.arange(cfg.k_max))
    sums = torch.cat([torch.zeros(1, dtype=torch.float64), torch.cumsum(steps, 0)])
    return (cfg.alpha_start + sums).to(torch.float32)


def displacement_bound(alpha0: float, beta: float, steps: int | None = None) -> float:
    """Bounded evolution (eq. bounded_evolution_discrete): the bound on ||z_T - z_start||.

    ||z_T - z_start|| <= |alpha0| (1 - e^{-beta T}) / (1 - e^{-beta}) ||h||.

    For unit h. ``steps=None`` is the T -> infinity limit |alpha0| / (1 - e^{-beta}), infinite
    for beta = 0. (The paper's prose states alpha0 / beta, which is *smaller* than the sum it
    bounds and is exceeded, e.g. at beta=0.3 after 8 steps; we use the geometric-series value.)
    Displacement is measured from the started state z_0 + alpha_start h.
    """
    a = abs(alpha0)
    if beta == 0:
        return math.inf if steps is None else a * steps
    tail = 1.0 if steps is None else -math.expm1(-beta * steps)
    return a * tail / -math.expm1(-beta)


def candidate_states(z0: torch.Tensor, h: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """All ponder states at once: z_k = z0 + c_k h, [B, d] x [d] x [K+1] -> [B, K+1, d]."""
    h = h.to(device=z0.device, dtype=z0.dtype)
    offsets = offsets.to(device=z0.device, dtype=z0.dtype)
    return z0[:, None, :] + offsets[None, :, None] * h[None, None, :]


def halting_depth(p_continue: torch.Tensor, tau: float) -> torch.Tensor:
    """First k with p_continue[:, k] <= tau, else K (the budget): [B, K+1] -> LongTensor [B]."""
    halt = p_continue <= tau
    first = halt.to(torch.uint8).argmax(dim=1)  # argmax returns the first maximal index
    budget = torch.full_like(first, p_continue.shape[1] - 1)
    return torch.where(halt.any(dim=1), first, budget)


@torch.no_grad()
def ponder(
    controller: Callable[[torch.Tensor], torch.Tensor],
    z0: torch.Tensor,
    h: torch.Tensor,
    offsets: torch.Tensor,
    tau: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy halting: (depth [B], p_continue [B, K+1]) from one batched controller call.

    ``h`` is the step for one unit of offset, i.e. ``scale * unit_vector`` when the offsets are
    fractions of a reference norm. States are built in at least float32 so a bf16 backbone
    state is not rounded before the small offsets are added. Training (sampled halts, log
    probabilities) wants gradients and lives with the trainer; this is the inference path.
    """
    dtype = torch.promote_types(z0.dtype, torch.float32)
    states = candidate_states(z0.to(dtype), h, offsets)
    p_continue = controller(states).reshape(states.shape[:2])
    return halting_depth(p_continue, tau), p_continue


class Decide(Protocol):
    """What a ``SteeringHook`` asks at each decision: the offsets (in units of the steering
    scale) to add to the rows of one forward, from their last hidden states ``z_last`` [B, d].
    ``rows``: the original row indices of those states (the generation loop's rows leave and
    join), or None when every forward holds the same rows (``model.generate``)."""

    def __call__(self, z_last: torch.Tensor, rows: torch.Tensor | None) -> torch.Tensor: ...


@dataclass
class FixedOffset:
    """One offset for every row: ``--model ponder alpha=...`` (the Fractional Reasoning
    baseline)."""

    alpha: float

    def __call__(self, z_last: torch.Tensor, rows: torch.Tensor | None) -> torch.Tensor:
        return torch.full(z_last.shape[:1], self.alpha, device=z_last.device)


class RowOffsets:
    """A fixed offset per original row: the rollout cache generates every depth of many
    prompts in one call this way."""

    def __init__(self, offsets: list[float], device) -> None:
        self.table = torch.tensor([float(c) for c in offsets], dtype=torch.float32,
                                  device=device)

    def __call__(self, z_last: torch.Tensor, rows: torch.Tensor | None) -> torch.Tensor:
        return self.table if rows is None else self.table[rows]


class ControllerDecide:
    """The ``Decide`` of inference, from a controller; records each call's depths.

    Accounting choice: the hook records what ``decide`` returned (offsets, in units of
    ``scale``); this object records the ponder depths (``self.depths``, one LongTensor [B] per
    call), which is what per-row ponder-step counts and controller FLOPs are made from.
    """

    def __init__(self, controller: nn.Module, vector: torch.Tensor, scale: float,
                 offsets: torch.Tensor, tau: float) -> None:
        self.controller = controller
        self.h = scale * vector.detach().to(torch.float32)
        self.offsets = offsets.detach().to(torch.float32)
        self.tau = tau
        self.depths: list[torch.Tensor] = []

    def __call__(self, z_last: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
        # each tensor follows the hidden state on its own: the step may arrive on the device
        # already (``Pondering.set_up`` passes it so) while the offsets do not. Once per
        # generation, so no host-to-device copy per decoded token.
        if self.h.device != z_last.device:
            self.h = self.h.to(z_last.device)
        if self.offsets.device != z_last.device:
            self.offsets = self.offsets.to(z_last.device)
        depth, _ = ponder(self.controller, z_last, self.h, self.offsets, self.tau)
        self.depths.append(depth)
        return self.offsets[depth]


# ----------------------------------------------------------------------------- training's decide
def candidate_logits(controller: nn.Module, z0: torch.Tensor, step_vector: torch.Tensor,
                     offsets: torch.Tensor) -> torch.Tensor:
    """Controller logits on every candidate state z_0 + c_k h (float32): [N, d] -> [N, K+1],
    ``step_vector`` being h (the steering vector times the residual norm)."""
    return controller.logits(candidate_states(z0.float(), step_vector, offsets))


def sample_depths(p_continue: torch.Tensor, generator: torch.Generator,
                  tau: float | None = None) -> torch.Tensor:
    """Sample halting depths [N] from continue probabilities [N, K+1] (training's halting).

    a_k ~ Bernoulli(p_k) for k < K; the depth is the first halt (K if none). With ``tau``, a
    state with p_k <= tau also halts (the paper's training rule).
    """
    n, n_states = p_continue.shape
    u = torch.rand(n, n_states - 1, generator=generator,
                   device=generator.device).to(p_continue.device)
    cont = u < p_continue[:, :-1]
    if tau is not None:
        cont &= p_continue[:, :-1] > tau
    stops = torch.cat([~cont, torch.ones(n, 1, dtype=torch.bool, device=cont.device)], dim=1)
    return stops.to(torch.uint8).argmax(dim=1)


class TokenPolicy:
    """The ``Decide`` of token-level training, beside ``ControllerDecide`` (inference's): one
    sampled halting depth per row at every decoded token, recorded with the state it was
    sampled on (``training.grpo.GRPOTrainer.token_policy`` makes one per rollout).

    Rows marked ``teacher`` ponder their fixed teacher depth at every token instead. No host
    sync per token: on first sight of the backbone's device (``to``) the policy takes a
    read-only copy there of what every decision reads, and a sampler seeded from ``generator``
    (docs/design/generation.md, "No host sync per token"); states recorded there move to the
    CPU once, in ``trajectories``. ``greedy``: halt as inference does (``halting_depth``);
    ``train_tau``: the threshold sampled halts, and the teacher's, also obey (None: none).
    """

    def __init__(self, controller: nn.Module, step_vector: torch.Tensor, offsets: torch.Tensor,
                 tau: float, teacher: torch.Tensor, teacher_depth: torch.Tensor, *,
                 generator: torch.Generator, greedy: bool = False,
                 train_tau: float | None = None) -> None:
        self.controller, self.step_vector, self.offsets = controller, step_vector, offsets
        self.tau, self.train_tau, self.greedy = tau, train_tau, greedy
        self.teacher, self.teacher_depth = teacher, teacher_depth
        self.generator = generator
        self.states: list[torch.Tensor] = []  # per decoded token: [rows, d] float32
        self.depths: list[torch.Tensor] = []  # per decoded token: [rows] long
        self.device: torch.device | None = None

    def to(self, device: torch.device) -> None:
        """Put what every decision reads on ``device`` (once per generation)."""
        self.device = device
        if device.type == "cpu":
            self.net, self.sampler = self.controller, self.generator
        else:
            self.net = copy.deepcopy(self.controller).to(device)
            self.sampler = torch.Generator(device=device).manual_seed(
                int(torch.randint(0, 2**62, (1,), generator=self.generator)))
        self.step_vector, self.offsets = self.step_vector.to(device), self.offsets.to(device)
        self.teacher, self.teacher_depth = self.teacher.to(device), self.teacher_depth.to(device)

    @torch.no_grad()
    def __call__(self, z_last: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
        if self.device != z_last.device:
            self.to(z_last.device)
        z = z_last.detach().float()
        p = self.net.probability(candidate_logits(self.net, z, self.step_vector, self.offsets))
        if self.greedy:
            depth = halting_depth(p, self.tau)
        else:
            depth = sample_depths(p, self.sampler, self.train_tau)
            teacher, teacher_depth = self.teacher, self.teacher_depth
            if rows is not None:  # rows that finished have left the batch
                teacher, teacher_depth = teacher[rows], teacher_depth[rows]
            if self.train_tau is not None:  # Algorithm 1 tests phi <= tau after the override
                teacher_depth = torch.minimum(teacher_depth, halting_depth(p, self.train_tau))
            depth = torch.where(teacher, teacher_depth, depth)
        self.states.append(z)
        self.depths.append(depth)
        return self.offsets[depth]

    def trajectories(self, used: list[int], hook=None) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(states [n_i, d], depths [n_i]) per row, keeping the decisions of the ``used[i]``
        tokens the row actually generated (under ``model.generate`` a finished row keeps
        decoding). ``hook``: the ``SteeringHook`` that ran, whose record of which rows each
        decision covered regroups the decisions by row (rows leave the generation loop)."""
        if hook is None:
            states, depths = torch.stack(self.states, 1).cpu(), torch.stack(self.depths, 1).cpu()
            return [(states[i, : max(n, 1)], depths[i, : max(n, 1)])
                    for i, n in enumerate(used)]
        states = hook.per_row(self.states, len(used))
        depths = hook.per_row(self.depths, len(used))
        return [(s[: max(n, 1)], d[: max(n, 1)]) for s, d, n in zip(states, depths, used)]
