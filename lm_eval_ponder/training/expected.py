"""The exact expected reward over the rollout cache: the default trainer at prompt granularity.

Why not GRPO here (docs/design/training.md, "Objective and algorithm"). At prompt
granularity the rollout cache holds every depth's outcome of every training prompt, so the
controller's whole objective is known in closed form: its halting distribution over depths,

    P(d | z_0) = prod_{j<d} phi(z_j) * (1 - phi(z_d))   (d < K),   P(K | z_0) = prod_{j<K} phi(z_j),

times each depth's mean reward R(i, d) over the cached samples, summed. Nothing is sampled, so
the policy cannot lose a mode it no longer samples, which is how the GRPO recipe shipped until
2026-12 lost the one cell that paid on the model organism. GRPO stays for token granularity
(no cache) and the paper's recipe.

How it is maximised (``method``):

- ``"advantage"`` (default): policy iteration on the halting decisions. Continuing at state k
  of prompt i is worth A(i, k) = V(i, k+1) - R(i, k), what continuing earns under the current
  policy (``continuation_values``, held fixed for the step) minus halting now. A logistic loss
  fits phi(z_k) to 1[A > 0], weighted by |A| times tau where continuing pays and 1 - tau where
  halting does. Pooled over prompts the controller cannot tell apart, the fitted phi is then
  <= tau exactly where the mean advantage of continuing is <= 0: the inference rule (halt at
  the first phi <= tau) halts where halting earns at least as much on average, and the
  gradient does not vanish where phi is near 0 or 1.
- ``"gradient"``: ascend the expected reward itself. Its gradient on a decision carries
  phi (1 - phi) and the chance of reaching it, so it vanishes on a saturated policy: on the
  positive control's clean world (docs/results/training.md) it sends every context to depth 8
  within 20 steps and never leaves (the levels where direct pays lose their gradient first).
  Kept to show that.

Per-prompt outcomes are noisy, and 300 prompts can be fitted exactly by a 0.5M-parameter
controller: what generalises is what the prompts of one kind share. So the fit pools: AdamW's
decoupled weight decay, and early stopping on held-out training prompts, scored by the
inference rule on the objective the fit maximises; the best held-out weights ship. At the
optimum the distribution is a point mass (the objective is linear in P), where the rule and
the distribution's mode agree; the log says how often they do (``agreement``).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn as nn

from lm_eval_ponder.errors import PonderError
from lm_eval_ponder.files import append_jsonl
from lm_eval_ponder.pondering.dynamics import halting_depth
from lm_eval_ponder.training.grpo import ControllerTrainer
from lm_eval_ponder.typed import check_choice, option

METHODS = ("advantage", "gradient")


@dataclass
class ExpectedConfig:
    """The expected-reward fit's settings (ours: the paper trains with GRPO)."""

    learning_rate: float = option(1e-3, "AdamW's step size")
    weight_decay: float = option(0.1, "AdamW's decoupled weight decay: pools the fit across prompts")
    max_steps: int = option(600, "full-batch steps at most (each: every training prompt's K+1 states)")
    eval_every: int = option(20, "steps between held-out evaluations (selection, early stopping, the log)")
    patience: int = option(10, "stop after this many held-out evaluations without a better score; 0: never")
    method: str = option("advantage", (
        "'advantage': policy iteration, a logistic fit of each halting decision to its "
        "advantage | 'gradient': ascend the expected reward (vanishes when saturated)"))

    def validate(self) -> ExpectedConfig:
        if not (math.isfinite(self.learning_rate) and self.learning_rate > 0):
            raise PonderError(f"expected.learning_rate must be > 0, got {self.learning_rate}")
        if not (math.isfinite(self.weight_decay) and self.weight_decay >= 0):
            raise PonderError(f"expected.weight_decay must be >= 0, got {self.weight_decay}")
        check_choice("expected.method", self.method, METHODS)
        if self.max_steps < 1 or self.eval_every < 1 or self.patience < 0:
            raise PonderError("expected.max_steps and expected.eval_every must be >= 1, "
                              "expected.patience >= 0")
        return self


def depth_log_probabilities(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log P(d | z_0) for every depth d = 0..K from the logits on z_0..z_K: [N, K+1] -> [N, K+1].

    The halting distribution of the sampled policy (``grpo.trajectory_log_prob`` at every
    depth at once): continue through j < d with phi(z_j), halt at d with 1 - phi(z_d), and
    depth K is reached by continuing through all K decisions."""
    scaled = logits / temperature
    log_cont = nn.functional.logsigmoid(scaled)
    log_halt = nn.functional.logsigmoid(-scaled)
    before = torch.cumsum(log_cont, dim=1) - log_cont  # sum_{j<d} log phi(z_j)
    halt = torch.cat([log_halt[:, :-1], torch.zeros_like(log_halt[:, -1:])], dim=1)
    return before + halt


def continuation_values(p_continue: torch.Tensor, rewards: torch.Tensor) -> torch.Tensor:
    """V(i, j) for j = 0..K: the expected reward of a prompt that has reached state j and
    follows the policy from there (V(K) = R(K), V(j) = (1 - phi_j) R(j) + phi_j V(j+1))."""
    values = [rewards[:, -1]]
    for j in range(rewards.shape[1] - 2, -1, -1):
        values.append((1 - p_continue[:, j]) * rewards[:, j] + p_continue[:, j] * values[-1])
    return torch.stack(values[::-1], dim=1)


def advantage_loss(logits: torch.Tensor, rewards: torch.Tensor, tau: float,
                   temperature: float = 1.0) -> torch.Tensor:
    """The ``"advantage"`` method's loss (module docstring): a logistic fit of each halting
    decision k < K to 1[A(i, k) > 0], weighted |A| x (tau if continuing pays, else 1 - tau),
    summed over decisions and averaged over prompts. The advantages are held fixed."""
    scaled = logits / temperature
    with torch.no_grad():
        values = continuation_values(torch.sigmoid(scaled), rewards.to(logits.dtype))
        advantage = values[:, 1:] - rewards[:, :-1].to(logits.dtype)
        target = (advantage > 0).to(logits.dtype)
        weight = advantage.abs() * torch.where(advantage > 0, tau, 1 - tau)
    loss = nn.functional.binary_cross_entropy_with_logits(scaled[:, :-1], target, weight=weight,
                                                          reduction="sum")
    return loss / len(logits)


def expected_reward(logits: torch.Tensor, rewards: torch.Tensor,
                    temperature: float = 1.0) -> torch.Tensor:
    """E_{d ~ P(.|z_0)}[R(i, d)] per prompt [N]: the objective this trainer maximises."""
    log_p = depth_log_probabilities(logits, temperature)
    return (log_p.exp() * rewards.to(log_p.dtype)).sum(dim=1)


class ExpectedRewardTrainer(ControllerTrainer):
    """Owns the controller and its optimiser; ``fit`` maximises the mean expected reward of the
    training prompts (full batch), keeping the weights that score best held out."""

    def __init__(self, controller: nn.Module, step_vector: torch.Tensor, offsets: torch.Tensor,
                 tau: float, cfg: ExpectedConfig, seed: int) -> None:
        super().__init__(controller, step_vector, offsets, tau, seed)
        self.cfg = cfg.validate()
        self.optimizer = torch.optim.AdamW(controller.parameters(), lr=cfg.learning_rate,
                                           weight_decay=cfg.weight_decay)

    @torch.no_grad()
    def readout(self, z0: torch.Tensor, rewards: torch.Tensor) -> dict[str, float]:
        """Held-out figures of the inference rule on a reward table [N, K+1]: its mean reward,
        the sampled policy's expected reward, and how often the rule picks the distribution's
        most likely depth."""
        logits = self.logits(z0)
        depths = halting_depth(self.controller.probability(logits), self.tau)
        log_p = depth_log_probabilities(logits, self.controller.temperature)
        chosen = rewards.gather(1, depths[:, None]).squeeze(1)
        return {"score": float(chosen.mean()),
                "expected": float((log_p.exp() * rewards).sum(1).mean()),
                "agreement": float((log_p.argmax(1) == depths).float().mean()),
                "depth": float(depths.float().mean())}

    def step(self, z0: torch.Tensor, rewards: torch.Tensor) -> float:
        """One AdamW step of the configured method; returns the mean expected reward."""
        self.optimizer.zero_grad(set_to_none=False)
        logits = self.logits(z0)
        value = expected_reward(logits, rewards, self.controller.temperature).mean()
        if self.cfg.method == "gradient":
            (-value).backward()
        else:
            advantage_loss(logits, rewards, self.tau, self.controller.temperature).backward()
        self.optimizer.step()
        if not math.isfinite(float(value.detach())):
            raise PonderError("the expected-reward fit diverged (a non-finite objective): "
                              "lower expected.learning_rate")
        return float(value.detach())

    def fit(self, z_train: torch.Tensor, r_train: torch.Tensor, z_val: torch.Tensor | None,
            r_val: torch.Tensor | None, log_path: Path | None = None,
            progress: bool = True,
            on_eval: Callable[[int, dict], None] | None = None) -> tuple[int, float]:
        """Maximise the training prompts' mean expected reward for at most ``max_steps``
        full-batch steps; every ``eval_every`` steps score the inference rule on the held-out
        prompts, keep the best weights and stop after ``patience`` evaluations without a
        better one. Without held-out prompts: every step runs and the last weights ship.
        Returns (the selected step, wall seconds)."""
        cfg, t0 = self.cfg, time.time()
        z_train, r_train = z_train.float(), r_train.float()
        held = z_val is not None and len(z_val) > 0
        if held:
            z_val, r_val = z_val.float(), r_val.float()
        best_key, best_step, best, stale = (-math.inf,), 0, None, 0
        from tqdm.auto import tqdm

        bar = tqdm(range(cfg.max_steps), desc="expected-reward fit", disable=not progress)
        for t in bar:
            value = self.step(z_train, r_train)
            last = t + 1 == cfg.max_steps
            if (t + 1) % cfg.eval_every and not last:
                continue
            line = {"step": t + 1, "elapsed_s": round(time.time() - t0, 1),
                    "train_expected": value,
                    "train": self.readout(z_train, r_train)}
            if held:
                line["val"] = self.readout(z_val, r_val)
                # the held-out score of the inference rule, ties to the earlier (fewer steps)
                key = (round(line["val"]["score"], 12),)
                if key > best_key:
                    best_key, best_step, stale = key, t + 1, 0
                    best = {k: v.detach().clone() for k, v in self.controller.state_dict().items()}
                else:
                    stale += 1
                line["best_step"] = best_step
            if log_path is not None:
                append_jsonl(log_path, line)
            if on_eval is not None:
                on_eval(t + 1, line)
            bar.set_postfix(train=round(line["train"]["score"], 4),
                            val=round(line["val"]["score"], 4) if held else None)
            if held and cfg.patience and stale >= cfg.patience:
                break
        bar.close()
        if best is not None:
            self.controller.load_state_dict(best)
            return best_step, time.time() - t0
        return t + 1, time.time() - t0


def describe(cfg: ExpectedConfig) -> str:
    """The card's line for this trainer."""
    how = ("policy iteration, each halting decision fitted to its advantage"
           if cfg.method == "advantage" else "its gradient ascended")
    return (f"the exact expected reward over the cached depths, {how} (AdamW, "
            f"lr {cfg.learning_rate}, weight decay {cfg.weight_decay}, at most {cfg.max_steps} "
            f"full-batch steps, held-out selection every {cfg.eval_every} steps, patience "
            f"{cfg.patience})")
