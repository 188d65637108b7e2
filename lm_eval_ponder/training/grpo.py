"""GRPO for the halting controller: the paper's appendix algorithm with its equations.

A trajectory for a prompt is a run of decisions on the candidate states z_k = z_0 + c_k h
(``pondering.candidate_states``): continue with probability pi(z_k) = phi(z_k), halt
otherwise; halting at depth d (or reaching K_max) fixes the outcome. So a trajectory *is* its
depth, and log pi(trajectory) = sum_{j<d} log phi(z_j) + [d < K] log(1 - phi(z_d)).

Where the paper is silent or contradicts itself (the why and the measurements:
docs/design/training.md, "Policy" to "Optimiser"):

- training samples halts; inference halts at the first phi <= tau (``threshold_in_training``:
  the paper's threshold in training too, which gives such states zero gradient forever);
- stage 1 imitates the teacher (``stage1``) where the paper skips the update for 500 steps
  (docs/results/training.md compares the two);
- no std scaling of advantages (Dr. GRPO, ``scale_rewards``); groups per prompt or per problem
  type (``group_by``); quality gates with the paper's meaning (``quality_gate``, ``QUALITY_CUT``);
- an entropy *bonus* (``grpo_loss``), as the paper's prose says, against its eq. (grpo_loss);
- the controller's temperature anneals from soft to hard (``annealed_temperature``);
- Adam clipped at 1.0 by default: Algorithm 1's plain step (``optim="sgd"``) at eta = 5e-4
  without clipping blew up on the paper form's cache, mostly to NaN weights; a non-finite loss
  stops training with that advice (``check_finite``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Protocol

import torch
import torch.nn as nn

from lm_eval_ponder.errors import PonderError
from lm_eval_ponder.pondering.controller import continue_probability
from lm_eval_ponder.pondering.dynamics import (
    TokenPolicy,
    candidate_logits,
    halting_depth,
    sample_depths,
)
from lm_eval_ponder.training.rewards import RewardConfig, completeness_of
from lm_eval_ponder.typed import check_choice, option

STAGE1_MODES = ("imitation", "paper")
TEMPERATURE_SCHEDULES = ("geometric", "curriculum")
OPTIMISERS = ("sgd", "adam")
GROUPINGS = ("prompt", "type")
# The stages an answer must show to pass the completeness gate (the paper: "at least basic
# problem setup and computation stages").
GATE_STAGES = ("setup", "computation")
# theta_qual: R_qual = min(1, len/len_target) x fluency must exceed this. 0.1 drops answers
# shorter than a tenth of len_target at baseline fluency, or of full length with a perplexity
# more than ln(10) = 2.3 sigma_PPL above the baseline. R_qual cannot see repetition (loops have
# a *low* perplexity) nor a cut at the token limit (length factor 1): docs/design.md.
QUALITY_CUT = 0.1


@dataclass
class GRPOConfig:
    """Optimisation hyper-parameters; defaults are the paper's where it gives them."""

    num_generations: int = option(8, "G, trajectories per prompt (TRL's name)")
    prompts_per_step: int = option(8, "B / G")
    learning_rate: float = option(5e-4, "eta, the step size")
    optim: str = option("adam", (
        "'adam': Adam on the batch-mean loss (default: the plain step blew up, docs/design.md); "
        "'sgd': Algorithm 1's plain step, theta += eta sum_i A_i grad log pi_i (a batch sum)"))
    t1: int = option(500, "end of pure teacher forcing")
    t2: int = option(1500, "end of the teacher -> student transition")
    max_steps: int = option(2500, "total GRPO steps")
    teacher_min: int = option(3, "the teacher ponders teacher_min..teacher_max steps")
    teacher_max: int = option(5, "see teacher_min")
    stage1: str = option("imitation", "'imitation' (our fix) | 'paper' (no update before T1)")
    entropy_beta: float = option(0.01, "beta_ent")
    scale_rewards: bool = option(False, "divide advantages by the group std (off: Dr. GRPO)")
    quality_gates: bool = option(True, "eq. quality_gates in the autonomous stage")
    theta_comp: float | None = option(None, (
        "gate: R_comp >= theta_comp; None: the completeness score of 'setup + computation' "
        "under reward.stage_weights"))
    theta_qual: float = option(
        QUALITY_CUT, "gate: R_qual > theta_qual (0.1: a tenth of len_target, or 2.3 sigma_PPL)")
    eps_div: float = option(1e-6, "FLOPs-diversity alert threshold")
    threshold_in_training: bool = option(False, "also halt when phi <= tau while training (paper)")
    temperature_schedule: str = option("geometric", (
        "how the controller's temperature anneals (``annealed_temperature``): 'geometric' "
        "(ours: from T1 to the last step) | 'curriculum' (one reading of the paper: linear "
        "over the teacher -> student transition, T1 to T2, as p_curriculum falls)"))
    max_grad_norm: float | None = option(
        1.0, "clip the gradient's norm to this before the step; None: no clipping (paper)")
    group_by: str = option("prompt", (
        "GRPO groups: 'prompt' (G samples of one prompt) | 'type' (all samples of the batch's "
        "prompts of one problem type: arith level or dataset)"))

    def validate(self, reward: RewardConfig | None = None) -> GRPOConfig:
        """Check the settings; resolve ``theta_comp=None`` with ``reward``'s stage weights (the
        default reward's when the trainer runs without one)."""
        if self.num_generations < 2:
            raise PonderError(f"num_generations must be >= 2 (a group of one has no baseline), "
                              f"got {self.num_generations}")
        if self.prompts_per_step < 1 or self.max_steps < 1:
            raise PonderError("prompts_per_step and max_steps must be >= 1")
        if not 0 <= self.t1 <= self.t2:
            raise PonderError(f"curriculum needs 0 <= t1 <= t2, got t1={self.t1}, t2={self.t2}")
        if not 0 <= self.teacher_min <= self.teacher_max:
            raise PonderError("teacher needs 0 <= teacher_min <= teacher_max")
        check_choice("temperature_schedule", self.temperature_schedule, TEMPERATURE_SCHEDULES)
        check_choice("stage1", self.stage1, STAGE1_MODES)
        if not (self.learning_rate > 0 and math.isfinite(self.learning_rate)):
            raise PonderError(f"learning_rate must be a positive number, got {self.learning_rate}")
        check_choice("optim", self.optim, OPTIMISERS)
        check_choice("group_by", self.group_by, GROUPINGS)
        if self.max_grad_norm is not None and not self.max_grad_norm > 0:
            raise PonderError(f"max_grad_norm must be > 0 or None, got {self.max_grad_norm}")
        if self.theta_comp is None:
            self.theta_comp = completeness_threshold(reward or RewardConfig())
        return self


# ----------------------------------------------------------------------------- equations
def annealed_temperature(t: int, start: float, end: float | None, t1: int,
                         max_steps: int, schedule: str = "geometric", t2: int | None = None
                         ) -> float:
    """The controller's temperature at (0-based) step t: the paper's "gradually transition
    from soft to hard decision boundaries" during curriculum learning (controller section).

    ``start`` through stage 1 (t < T1) in both schedules; then
    - ``"geometric"`` (ours): geometric (T is a scale) from ``start`` at T1 to ``end`` at the
      last step, max_steps - 1;
    - ``"curriculum"`` (a reading of the paper, which names no schedule): linear from
      ``start`` at T1 to ``end`` at T2, the span over which the teacher hands over and
      p_curriculum itself falls linearly, then ``end`` through stage 3.
    ``end=None``: constant ``start``.
    """
    if end is None or end == start:
        return start
    linear = schedule == "curriculum"
    if linear and t2 is None:
        raise PonderError("the curriculum temperature schedule needs T2")
    span = (t2 if linear else max_steps - 1) - t1
    progress = 1.0 if span <= 0 else min(1.0, max(0.0, (t - t1) / span))
    return float(start + (end - start) * progress if linear else start * (end / start) ** progress)


def completeness_threshold(reward: RewardConfig) -> float:
    """theta_comp with the paper's meaning: R_comp of an answer showing exactly the
    ``GATE_STAGES`` (setup and computation), taken from the completeness reward itself."""
    return completeness_of({"stages": list(GATE_STAGES)}, reward)


def check_finite(loss: torch.Tensor, t: int, cfg: GRPOConfig) -> None:
    """Stop at a diverged update: NaN weights would ship a controller that halts at K_max
    everywhere (phi = NaN is never <= tau) and samples depth 0 (u < NaN is False)."""
    if not bool(torch.isfinite(loss.detach())):
        raise PonderError(
            f"GRPO diverged at step {t + 1} (loss {float(loss.detach())}) with optim="
            f"{cfg.optim}, learning_rate={cfg.learning_rate}, max_grad_norm={cfg.max_grad_norm}: "
            "lower the learning rate, set grpo.max_grad_norm, or use grpo.optim=adam")


def make_optimizer(params, cfg: GRPOConfig) -> torch.optim.Optimizer:
    """The controller's optimiser: plain SGD (Algorithm 1; the batch sum comes from
    ``GRPOTrainer.batch_sum_scale``) or Adam, both at ``learning_rate``."""
    if cfg.optim == "sgd":
        return torch.optim.SGD(params, lr=cfg.learning_rate)
    return torch.optim.Adam(params, lr=cfg.learning_rate)


def curriculum_stage(t: int, t1: int, t2: int) -> int:
    """The curriculum stage of (0-based) step t: 1 teacher forcing (t < T1), 2 the teacher ->
    student transition (T1 <= t < T2), 3 autonomous (t >= T2), as eq. (curriculum_schedule)."""
    return 1 if t < t1 else 2 if t < t2 else 3


def curriculum_probability(t: int, t1: int, t2: int) -> float:
    """p_curriculum(t), eq. (curriculum_schedule): 1 before T1, linear to 0 at T2, then 0."""
    if t < t1:
        return 1.0
    if t >= t2:
        return 0.0
    return 1.0 - (t - t1) / (t2 - t1)


def curriculum_sources(n: int, t: int, cfg: GRPOConfig, generator: torch.Generator) -> torch.Tensor:
    """source(t) ~ Bernoulli(p_curriculum(t)) per trajectory (eq. curriculum_sampling): True
    where the teacher acts. Always draws ``n`` numbers, so the generator stays in step."""
    return torch.rand(n, generator=generator) < curriculum_probability(t, cfg.t1, cfg.t2)


def group_advantages(rewards: torch.Tensor, keep: torch.Tensor | None = None,
                     scale_std: bool = False, groups: torch.Tensor | None = None) -> torch.Tensor:
    """A_i = r_i - b_G(i), eq. (advantage), for rewards [prompts, G].

    ``groups`` (one label per row, [prompts]): rows with the same label form one group, the
    paper's "grouping by problem type"; None: each row (the G samples of a prompt) is a group.
    ``keep`` (bool [prompts, G]) marks trajectories that passed the quality gates: baselines are
    over kept ones, dropped ones get A = 0, and groups with < 2 kept get A = 0.
    """
    keep = torch.ones_like(rewards, dtype=torch.bool) if keep is None else keep
    if groups is None:
        labels = torch.arange(rewards.shape[0]).repeat_interleave(rewards.shape[1])
    else:
        labels = torch.unique(groups, return_inverse=True)[1].repeat_interleave(rewards.shape[1])
    r, k = rewards.reshape(-1), keep.reshape(-1).to(rewards.dtype)
    n_groups = int(labels.max()) + 1 if len(labels) else 0

    def per_group(x: torch.Tensor) -> torch.Tensor:
        return torch.zeros(n_groups, dtype=x.dtype).index_add_(0, labels, x)[labels]

    n = per_group(k)
    baseline = per_group(r * k) / n.clamp(min=1)
    adv = (r - baseline) * k
    if scale_std:
        var = per_group((r - baseline) ** 2 * k) / (n - 1).clamp(min=1)
        adv = adv / (var.sqrt() + 1e-8)
    return torch.where(n >= 2, adv, torch.zeros_like(adv)).view_as(rewards)


def trajectory_log_prob(logits: torch.Tensor, depths: torch.Tensor,
                        temperature: float = 1.0) -> torch.Tensor:
    """log pi(trajectory) = sum_{j<d} log phi(z_j) + [d < K] log(1 - phi(z_d)).

    ``logits`` [N, K+1] are the controller's pre-temperature logits on z_0..z_K; ``depths``
    [N]. log phi = logsigmoid(l / T) and log(1 - phi) = logsigmoid(-l / T), stable in float32.
    """
    n_states = logits.shape[1]
    k = torch.arange(n_states, device=logits.device)[None, :]
    d = depths[:, None]
    scaled = logits / temperature
    cont = (k < d).to(logits.dtype)
    halt = ((k == d) & (d < n_states - 1)).to(logits.dtype)
    return (nn.functional.logsigmoid(scaled) * cont
            + nn.functional.logsigmoid(-scaled) * halt).sum(dim=1)


def trajectory_entropy(logits: torch.Tensor, depths: torch.Tensor,
                       temperature: float = 1.0) -> torch.Tensor:
    """Sum of the Bernoulli entropies H[pi(.|z_k)] over the decisions a trajectory made."""
    n_states = logits.shape[1]
    k = torch.arange(n_states, device=logits.device)[None, :]
    visited = ((k <= depths[:, None]) & (k < n_states - 1)).to(logits.dtype)
    scaled = logits / temperature
    p = continue_probability(logits, temperature)
    h = -(p * nn.functional.logsigmoid(scaled) + (1 - p) * nn.functional.logsigmoid(-scaled))
    return (h * visited).sum(dim=1)


def grpo_loss(log_probs: torch.Tensor, advantages: torch.Tensor, entropy: torch.Tensor,
              keep: torch.Tensor, entropy_beta: float) -> torch.Tensor:
    """L_GRPO, eq. (grpo_loss): -mean over kept trajectories of (log pi(tau) A + beta_ent H)."""
    k = keep.to(log_probs.dtype)
    return -((log_probs * advantages + entropy_beta * entropy) * k).sum() / k.sum().clamp(min=1)


def imitation_loss(log_probs: torch.Tensor) -> torch.Tensor:
    """Stage-1 fix: -mean log pi(teacher trajectory), i.e. behaviour cloning of the teacher."""
    return -log_probs.mean()


def quality_gate(comp: torch.Tensor, qual: torch.Tensor, theta_comp: float,
                 theta_qual: float) -> torch.Tensor:
    """Q(tau) = 1[R_comp >= theta_comp] 1[R_qual > theta_qual], eq. (quality_gates).

    The paper writes R_comp > theta_comp but sets theta_comp "to require at least" setup and
    computation; with theta_comp = their score, ">" would demand a third stage, so the
    completeness condition is inclusive (``gate_conditions``)."""
    comp_ok, qual_ok = gate_conditions(comp, qual, theta_comp, theta_qual)
    return comp_ok & qual_ok


def gate_conditions(comp: torch.Tensor, qual: torch.Tensor, theta_comp: float,
                    theta_qual: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The two conditions of ``quality_gate`` apart, so the log can say what each drops."""
    return comp >= theta_comp, qual > theta_qual


def flops_diversity(flops: torch.Tensor) -> float:
    """D_t = Var(F) / Mean(F)^2 over the batch (the appendix algorithm's diversity check)."""
    mean = flops.double().mean()
    if mean == 0:
        return 0.0
    return float(flops.double().var(unbiased=False) / mean**2)


def teacher_depths(n: int, cfg: GRPOConfig, k_max: int, generator: torch.Generator) -> torch.Tensor:
    """The teacher's depths: uniform on teacher_min..teacher_max (clipped to K_max)."""
    lo, hi = min(cfg.teacher_min, k_max), min(cfg.teacher_max, k_max)
    return torch.randint(lo, hi + 1, (n,), generator=generator)


# ----------------------------------------------------------------------------- one step
def batch_outcome(outcome: dict[str, torch.Tensor], t: int, cfg: GRPOConfig, n_prompts: int,
                  gather: Callable[[torch.Tensor], torch.Tensor] | None
                  ) -> tuple[torch.Tensor, float, torch.Tensor, torch.Tensor]:
    """(rewards [P, G], FLOPs diversity over all ranks' batch, quality-gate mask [P, G], each
    gate's drops [P, G, 2]: completeness, quality; all False where the gates are off)."""
    P, G = n_prompts, cfg.num_generations
    rewards = outcome["reward"].float().view(P, G)
    diversity = flops_diversity(gather(outcome["flops"]) if gather else outcome["flops"])
    keep = torch.ones(P, G, dtype=torch.bool)
    dropped = torch.zeros(P, G, 2, dtype=torch.bool)
    if (cfg.quality_gates and curriculum_stage(t, cfg.t1, cfg.t2) == 3
            and "comp" in outcome and "qual" in outcome):
        comp_ok, qual_ok = gate_conditions(outcome["comp"], outcome["qual"], cfg.theta_comp,
                                           cfg.theta_qual)
        keep = (comp_ok & qual_ok).view(P, G)
        dropped = torch.stack([~comp_ok, ~qual_ok], -1).view(P, G, 2)
    return rewards, diversity, keep, dropped


class RewardScorer(Protocol):
    """What the trainer scores outcomes with: ``environment.RewardBook`` (a stand-in in
    synthetic tests). A book without a perplexity reference takes it from the first batch."""

    ppl_ref: tuple[float, float] | None

    def score(self, records: list, flops: list[float] | None) -> dict[str, torch.Tensor]: ...

    def set_reference_from_batch(self, records: list[dict],
                                 gather: Callable[[torch.Tensor], torch.Tensor]) -> None: ...


@dataclass
class Trajectories:
    """One step's P x G trajectories, prompt-major, with their scored outcomes: what the update
    reads, at either granularity. ``chunks`` yields (prompt rows, log pi, entropy) with
    gradients, a group of rows at a time; ``share`` weights a chunk's loss within the batch."""

    teacher: torch.Tensor  # bool [P, G]: the teacher acted
    depths: torch.Tensor  # long [P, G] (token level: each trajectory's mean depth, rounded)
    outcome: dict[str, torch.Tensor]  # the reward book's scores, each [P * G]

    mean_depth = None  # token level: each trajectory's mean depth [P, G]

    def chunks(self, trainer: "GRPOTrainer", temp: float):
        raise NotImplementedError

    def share(self, loss: torch.Tensor, kept: torch.Tensor, norm: int) -> torch.Tensor:
        """A chunk's loss as its part of the batch's (one chunk: the loss itself)."""
        return loss

    def mean_entropy(self, entropies: list[torch.Tensor]) -> float:
        raise NotImplementedError


@dataclass
class PromptTrajectories(Trajectories):
    """Prompt level: one decision per trajectory, on the logits of its prompt's z_0 [P*G, K+1];
    the whole batch is one chunk."""

    logits: torch.Tensor | None = None  # [P*G, K+1], with gradients

    def chunks(self, trainer: "GRPOTrainer", temp: float):
        depths = self.depths.view(-1)
        yield (slice(None), trajectory_log_prob(self.logits, depths, temp),
               trajectory_entropy(self.logits, depths, temp))

    def mean_entropy(self, entropies: list[torch.Tensor]) -> float:
        return float(entropies[0].detach().mean())  # per trajectory


@dataclass
class TokenTrajectories(Trajectories):
    """Token level: a decision at every decoded token, (states [n, d], depths [n]) per
    trajectory, grouped by prompt; a chunk is one prompt's G trajectories (a whole batch's
    states need not fit in memory at once), its loss weighted by its share of the batch."""

    per_prompt: list | None = None  # P lists of G (states, depths)
    mean_depth: torch.Tensor | None = None

    def chunks(self, trainer: "GRPOTrainer", temp: float):
        for j, group in enumerate(self.per_prompt):  # each term a sum over the decoded tokens
            lp, ent = [], []
            for states, depths in group:
                logits = trainer.logits(states)
                lp.append(trajectory_log_prob(logits, depths, temp).sum())
                ent.append(trajectory_entropy(logits, depths, temp).sum())
            yield j, torch.stack(lp), torch.stack(ent)

    def share(self, loss: torch.Tensor, kept: torch.Tensor, norm: int) -> torch.Tensor:
        return loss * kept.sum().clamp(min=1) / norm

    def mean_entropy(self, entropies: list[torch.Tensor]) -> float:
        decisions = sum(len(d) for group in self.per_prompt for _, d in group)
        return sum(float(e.detach().sum()) for e in entropies) / max(decisions, 1)  # per token


@dataclass
class StepResult:
    depths: torch.Tensor  # [P, G]
    teacher: torch.Tensor  # bool [P, G]
    outcome: dict[str, torch.Tensor]  # the scored outcomes, each [P * G]
    keep: torch.Tensor  # bool [P, G]
    loss: float
    updated: bool
    diversity: float
    mean_depth: torch.Tensor | None = None  # token level: each trajectory's mean depth [P, G]
    # collapse diagnostics (stages 2-3): mean |A| over kept trajectories and mean policy
    # entropy of a trajectory (token level: per decoded token); nan where not computed
    advantage_abs: float = float("nan")
    entropy: float = float("nan")
    # what each quality gate dropped (completeness, quality), bool [P, G, 2]; a trajectory may
    # fail both
    gate_drops: torch.Tensor | None = None
    temperature: float = 1.0  # the controller's temperature at this step


class ControllerTrainer:
    """What the loop, the environments and the cards read of a trainer, either algorithm: the
    controller, its logits on the candidate states and its inference-time depths."""

    def __init__(self, controller: nn.Module, step_vector: torch.Tensor, offsets: torch.Tensor,
                 tau: float, seed: int) -> None:
        self.controller = controller
        self.step_vector = step_vector.detach().float()  # h of z_k = z_0 + c_k h
        self.offsets = offsets.detach().float()
        self.tau = tau
        self.generator = torch.Generator().manual_seed(seed)
        self.reinitialisations = 0

    def logits(self, z0: torch.Tensor) -> torch.Tensor:
        """Controller logits on all candidate states: [P, d] -> [P, K+1]."""
        return candidate_logits(self.controller, z0, self.step_vector, self.offsets)

    @torch.no_grad()
    def greedy_depths(self, z0: torch.Tensor) -> torch.Tensor:
        """Inference-time depths (first phi <= tau), as ``--model ponder`` will choose them."""
        return halting_depth(self.controller.probability(self.logits(z0)), self.tau)


class GRPOTrainer(ControllerTrainer):
    """Owns the controller, its optimiser, one generator and the reward book; ``step`` is one
    iteration of the appendix algorithm at either granularity (TRL's shape: sample, ask the
    environment, score, update).

    The environment (``env``) is asked for outcomes: at prompt level ``states(ids)`` (z_0 of
    each prompt) and ``outcomes(ids, depths)`` (records and FLOPs of each (prompt, depth),
    e.g. rollout-cache lookups); at token level ``rollout(ids, G, policy)`` (online answers
    with ``policy`` deciding at every token) and ``decision_sampler(t)``. ``rewards`` scores
    the outcomes (``environment.RewardBook``): at least ``reward`` and ``flops`` (and
    ``comp``/``qual`` for the quality gates), each a float tensor [N]. ``temperature_end``: the
    controller's temperature at the end of ``annealed_temperature`` (None: constant).
    """

    def __init__(self, controller: nn.Module, step_vector: torch.Tensor, offsets: torch.Tensor,
                 tau: float, cfg: GRPOConfig, seed: int,
                 temperature_end: float | None = None,
                 rewards: RewardScorer | None = None) -> None:
        super().__init__(controller, step_vector, offsets, tau, seed)
        self.k_max = len(offsets) - 1
        self.cfg = cfg.validate()
        self.optimizer = make_optimizer(controller.parameters(), cfg)
        self.temperature_start = float(controller.temperature)
        self.temperature_end = temperature_end
        self.rewards = rewards

    def anneal(self, t: int) -> float:
        """Set the controller's temperature for (0-based) step t and return it."""
        temp = annealed_temperature(t, self.temperature_start, self.temperature_end,
                                    self.cfg.t1, self.cfg.max_steps,
                                    self.cfg.temperature_schedule, self.cfg.t2)
        self.controller.temperature = temp
        return temp

    def batch_sum_scale(self, n_local: float,
                        gather: Callable[[torch.Tensor], torch.Tensor] | None) -> float:
        """The factor on this rank's mean loss that makes the update Algorithm 1's *sum* over
        the batch (``optim="sgd"``): its n_local trajectories, times the ranks whose gradients
        are then averaged. 1 for Adam, which is invariant to the loss's scale."""
        if self.cfg.optim != "sgd":
            return 1.0
        world = len(gather(torch.zeros(1))) if gather is not None else 1
        return float(n_local) * world

    def reinitialise(self) -> None:
        """The diversity alert's remedy: fresh weights (from our generator) and optimiser."""
        seed = int(torch.randint(0, 2**31 - 1, (1,), generator=self.generator))
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            for module in self.controller.modules():
                if module is not self.controller and hasattr(module, "reset_parameters"):
                    module.reset_parameters()
        self.optimizer = make_optimizer(self.controller.parameters(), self.cfg)
        self.reinitialisations += 1

    def step(self, t: int, prompt_ids: torch.Tensor, env,
             gradient_hook: Callable[[], None] | None = None,
             gather: Callable[[torch.Tensor], torch.Tensor] | None = None,
             types: torch.Tensor | None = None) -> StepResult:
        """One iteration of the appendix algorithm on P prompts x G trajectories, either
        granularity: sample the trajectories and their outcomes, score them, then GRPO.

        Data parallel: ``gradient_hook`` averages gradients across ranks and ``gather``
        concatenates a tensor over ranks, so the diversity check (and with it a
        re-initialisation) sees the whole batch and happens on every rank or none.
        ``types``: each prompt's problem type (an integer label, [P]), needed for
        ``group_by="type"``.
        """
        cfg, temp = self.cfg, self.anneal(t)
        P, G = len(prompt_ids), cfg.num_generations
        sample = self.sample_tokens if env.granularity == "token" else self.sample_prompts
        batch = sample(t, prompt_ids, env, gather)
        rewards, diversity, keep, drops = batch_outcome(batch.outcome, t, cfg, P, gather)
        imitate = curriculum_stage(t, cfg.t1, cfg.t2) == 1
        updated = not imitate or cfg.stage1 == "imitation"
        adv = None if imitate else group_advantages(rewards, keep, cfg.scale_rewards,
                                                    self.groups_of(types))
        norm = P * G if imitate else max(int(keep.sum()), 1)  # the loss's normaliser
        scale = self.batch_sum_scale(norm, gather) if updated else 1.0
        total, entropies = 0.0, []
        if updated:  # zero, backward chunk by chunk (token level: a prompt's G), average, clip, step
            self.optimizer.zero_grad(set_to_none=False)
            for rows, log_probs, entropy in batch.chunks(self, temp):
                entropies.append(entropy)
                kept = torch.ones_like(keep[rows]) if imitate else keep[rows]
                loss = imitation_loss(log_probs) if imitate else grpo_loss(
                    log_probs, adv[rows].reshape(-1), entropy, kept.reshape(-1),
                    cfg.entropy_beta)
                loss = batch.share(loss, kept, norm)
                (loss * scale).backward()
                total += float(loss.detach())
            check_finite(torch.tensor(total), t, cfg)
            if gradient_hook is not None:
                gradient_hook()
            if cfg.max_grad_norm is not None:
                nn.utils.clip_grad_norm_(self.controller.parameters(), cfg.max_grad_norm)
            self.optimizer.step()
        if diversity < cfg.eps_div:  # the diversity alert's remedy, after the update
            self.reinitialise()
        adv_abs = ent = float("nan")  # the collapse diagnostics (stages 2-3)
        if not imitate:
            adv_abs = float(adv[keep].abs().mean()) if keep.any() else 0.0
            ent = batch.mean_entropy(entropies)
        return StepResult(batch.depths, batch.teacher, batch.outcome, keep,
                          total if updated else float("nan"), updated, diversity,
                          batch.mean_depth, advantage_abs=adv_abs, entropy=ent,
                          gate_drops=drops, temperature=temp)

    def sample_prompts(self, t: int, prompt_ids: torch.Tensor, env,
                       gather=None) -> PromptTrajectories:
        """Prompt level: sample each trajectory's depth from the policy on its prompt's
        candidate states (the teacher's where the curriculum draws it), then look the
        outcomes up in ``env``."""
        cfg = self.cfg
        P, G = len(prompt_ids), cfg.num_generations
        logits = self.logits(env.states(prompt_ids)).repeat_interleave(G, dim=0)  # [P*G, K+1]
        p = self.controller.probability(logits.detach())
        student = sample_depths(p, self.generator, self.tau if cfg.threshold_in_training else None)
        teacher = curriculum_sources(P * G, t, cfg, self.generator)
        forced = teacher_depths(P * G, cfg, self.k_max, self.generator)
        if cfg.threshold_in_training:  # Algorithm 1 tests p_k <= tau after the teacher's override
            forced = torch.minimum(forced, halting_depth(p, self.tau))
        depths = torch.where(teacher, forced, student)
        records, flops = env.outcomes(prompt_ids.repeat_interleave(G), depths)
        return PromptTrajectories(teacher.view(P, G), depths.view(P, G),
                                  self.score(records, flops, gather), logits=logits)

    def sample_tokens(self, t: int, prompt_ids: torch.Tensor, env,
                      gather=None) -> TokenTrajectories:
        """Token level: draw which trajectories the teacher drives (and its depth), then let
        ``env`` generate every answer with the policy deciding at each token.

        The per-token decisions are drawn by ``env.decision_sampler(t)``, not the trainer's
        generator: their number depends on each rank's answer lengths, and the trainer's
        generator has to stay identical on every rank (batch draws, re-initialisation)."""
        cfg = self.cfg
        P, G = len(prompt_ids), cfg.num_generations
        teacher = curriculum_sources(P * G, t, cfg, self.generator)
        teacher_depth = teacher_depths(P * G, cfg, self.k_max, self.generator)
        policy = self.token_policy(teacher, teacher_depth, generator=env.decision_sampler(t))
        records, flat = env.rollout(prompt_ids.tolist(), G, policy)
        per_prompt = [flat[j * G : (j + 1) * G] for j in range(P)]
        mean_depth = torch.tensor([[float(d.float().mean()) for _, d in group]
                                   for group in per_prompt])
        flops = [r["flops"] for r in records]
        return TokenTrajectories(teacher.view(P, G), mean_depth.round().long(),
                                 self.score(records, flops, gather), per_prompt=per_prompt,
                                 mean_depth=mean_depth)

    def token_policy(self, teacher: torch.Tensor, teacher_depth: torch.Tensor, *,
                     greedy: bool = False, generator: torch.Generator | None = None
                     ) -> TokenPolicy:
        """The ``Decide`` that samples this controller's depths at every token of a rollout
        (``pondering.dynamics.TokenPolicy``), under this trainer's halting rule."""
        return TokenPolicy(self.controller, self.step_vector, self.offsets, self.tau, teacher,
                           teacher_depth, generator=self.generator if generator is None
                           else generator, greedy=greedy,
                           train_tau=self.tau if self.cfg.threshold_in_training else None)

    def score(self, records: list, flops: list[float] | None,
              gather: Callable[[torch.Tensor], torch.Tensor] | None) -> dict[str, torch.Tensor]:
        """The reward book's scores of a batch (its perplexity reference, if still unset,
        from the whole batch first: every rank's answers)."""
        if self.rewards.ppl_ref is None:
            self.rewards.set_reference_from_batch(records, gather or (lambda x: x))
        return self.rewards.score(records, flops)

    def groups_of(self, types: torch.Tensor | None) -> torch.Tensor | None:
        """The GRPO group label of each prompt: None (per prompt) or its problem type."""
        if self.cfg.group_by == "prompt":
            return None
        if types is None:
            raise PonderError("group_by='type' needs each prompt's problem type; this "
                              "environment gives none")
        return types
