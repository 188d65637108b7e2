"""Training environments: (prompt, ponder decisions) -> outcome -> reward.

``RewardBook`` turns outcomes into the paper's reward (``rewards.py``) and keeps its running
state (FLOPs statistics, adaptive weights, perplexity reference). Each environment holds one
(``rewards``): ``CachedEnvironment`` here (the rollout cache's (prompt, depth) lookups, and a
controller's inference-time choices, first phi <= tau, evaluated on any prompt subset) and
``online.OnlineEnvironment`` (token level). The FLOPs of an outcome are the backbone's
(prefill and decode, from the cache) plus the controller's K_max+1 evaluations, exactly what
``--model ponder`` logs.
"""

from __future__ import annotations

import hashlib
import math
from collections import defaultdict
from typing import Callable

import torch

from lm_eval_ponder.errors import PonderError
from lm_eval_ponder.training.rewards import (
    COMPONENTS,
    RewardConfig,
    RunningStats,
    balance_targets,
    balance_weights,
    priced_reward,
    quality_reference,
    reward_components,
    total_reward,
)
from lm_eval_ponder.training.rollouts import RolloutCache


def reward_key(component: str) -> str:
    """The key of a reward component's values in a scored outcome: its name, except for
    R_flops ("flops_reward"), since "flops" holds the FLOPs counts themselves."""
    return "flops_reward" if component == "flops" else component


def problem_types(prompts: list) -> torch.Tensor:
    """Each prompt's problem type as an integer label [N]: its task and level (arith level;
    datasets without levels are one type each), for ``grpo.group_by="type"``."""
    names = [(p.task, -1 if p.level is None else int(p.level)) for p in prompts]
    index = {name: i for i, name in enumerate(sorted(set(names)))}
    return torch.tensor([index[name] for name in names], dtype=torch.long)


def split_prompts(keys: list[str], val_fraction: float) -> tuple[list[int], list[int]]:
    """Deterministic train/validation split of prompts by key hash (same split on every rank)."""
    train, val = [], []
    for i, key in enumerate(keys):
        u = int(hashlib.sha256(key.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
        (val if u < val_fraction else train).append(i)
    if not train:
        raise PonderError("no training prompts left after the validation split")
    return train, val


class RewardBook:
    """The reward's running state, shared by the cached (prompt) and online (token) trainers:
    FLOPs statistics of eq. flops_reward, the adaptive weights and the perplexity reference.

    ``score`` turns outcomes (records with text, grade and reward inputs) into the reward and
    its components with the *current* state; ``observe`` then updates the state from the whole
    batch, so every rank of a data-parallel run scores with identical statistics.
    """

    def __init__(self, reward_cfg: RewardConfig,
                 ppl_ref: tuple[float, float] | None = None) -> None:
        self.cfg = reward_cfg.validate()
        self.ppl_ref = ppl_ref
        self.stats = RunningStats(self.cfg.ema_momentum)
        self.weights = dict(self.cfg.weights)
        self._magnitudes: dict[str, list[float]] = defaultdict(list)

    def set_ppl_reference(self, ppls: list[float | None]) -> None:
        """PPL_base and sigma_PPL: the config's values, else median and IQR of ``ppls``."""
        base, sigma = quality_reference(ppls)
        self.ppl_ref = (self.cfg.ppl_baseline if self.cfg.ppl_baseline is not None else base,
                        self.cfg.sigma_ppl if self.cfg.sigma_ppl is not None else sigma)

    def set_reference_from_batch(self, records: list[dict],
                                 gather: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """The reference from a batch of answers (``gather``: concatenated over ranks): every
        rank's correct answers, else all of them (online training's first step)."""
        ppl = gather(torch.tensor([r["ppl"] if r["ppl"] is not None else math.nan
                                   for r in records], dtype=torch.float64))
        ok = gather(torch.tensor([float(r["correct"]) for r in records])) > 0.5
        chosen = ppl[ok] if bool(ok.any()) else ppl
        self.set_ppl_reference(chosen.tolist())  # NaN (no perplexity) is left out there

    def score(self, records: list[dict], flops: list[float]) -> dict[str, torch.Tensor]:
        """Rewards and reward inputs of each outcome, each a float64 tensor [N]."""
        if self.ppl_ref is None:
            raise RuntimeError("internal: score() before the perplexity reference is set")
        comps = [reward_components(r, f, self.stats, self.ppl_ref, self.cfg)
                 for r, f in zip(records, flops)]
        out = {reward_key(name): torch.tensor([c[name] for c in comps], dtype=torch.float64)
               for name in COMPONENTS}
        if self.cfg.objective == "priced":
            rewards = [self.priced(r) for r in records]
        else:
            rewards = [total_reward(c, self.weights) for c in comps]
        out["reward"] = torch.tensor(rewards, dtype=torch.float64)
        out["flops"] = torch.tensor(flops, dtype=torch.float64)
        out["correct"] = torch.tensor([float(r["correct"]) for r in records], dtype=torch.float64)
        out["gen_tokens"] = torch.tensor([float(r["gen_tokens"]) for r in records],
                                         dtype=torch.float64)
        return out

    def priced(self, record: dict) -> float:
        """The 'priced' objective of one outcome (``rewards.priced_reward``)."""
        return priced_reward(record["correct"], record["gen_tokens"],
                             self.cfg.price_per_1k_tokens)

    def reference_score(self, record: dict, flops: float, stats: RunningStats) -> float:
        """An outcome's score on a fixed ruler (model selection, cards, the expected-reward
        trainer): the 'priced' objective itself, or the paper's reward with the *initial*
        weights and the given (frozen) FLOPs statistics."""
        if self.cfg.objective == "priced":
            return self.priced(record)
        return total_reward(reward_components(record, flops, stats, self.ppl_ref, self.cfg),
                            self.cfg.weights)

    def observe(self, outcome: dict[str, torch.Tensor], step: int) -> None:
        """After a step: update the FLOPs history and, every few steps, the adaptive weights.

        ``outcome`` must be the whole (all ranks') batch so every rank stays identical.
        """
        self.stats.update(outcome["flops"].tolist())
        for name in COMPONENTS:
            self._magnitudes[name].append(
                float((outcome[reward_key(name)].abs() * self.weights[name]).mean()))
        if (self.cfg.objective == "paper" and self.cfg.balance
                and (step + 1) % self.cfg.balance_every == 0):
            mean_abs = {k: sum(v) / len(v) for k, v in self._magnitudes.items()}
            self.weights = balance_weights(self.weights, mean_abs,
                                           balance_targets(mean_abs, self.cfg),
                                           self.cfg.balance_eta)
            self._magnitudes.clear()


class CachedEnvironment:
    """Prompt granularity: outcomes are rollout-cache lookups by (prompt, depth), so a GRPO
    step costs no generation. Implements the training loop's ``TrainingEnvironment``; scores
    with its ``rewards`` (a ``RewardBook`` whose perplexity reference is the cache's)."""

    def __init__(self, cache: RolloutCache, k_max: int, samples: int, controller_flops: float,
                 reward_cfg: RewardConfig, generator: torch.Generator,
                 complete_only: bool = False, max_prompts: int | None = None) -> None:
        """``complete_only``: keep only the prompts that have every depth and sample (an
        analysis of a cache that is still being built); training refuses an incomplete cache.
        ``max_prompts``: only the first that many (complete) prompts, so an analysis of a
        growing cache can be repeated on the prefix it was first made on."""
        self.rewards = RewardBook(reward_cfg)
        self.cache = cache
        self.cache_wall = 0.0  # seconds the training run spent building/checking the cache
        self.prompts = cache.prompts()
        self.z0 = cache.states()
        table = cache.table()
        self.k_max, self.samples = k_max, samples
        self.generator = generator
        missing = [(p.key, k) for p in self.prompts for k in range(k_max + 1)
                   if len(table.get((p.key, k), [])) < samples]
        if missing and complete_only:
            gone = {key for key, _ in missing}
            keep = [i for i, p in enumerate(self.prompts) if p.key not in gone]
            if not keep:
                raise PonderError(f"rollout cache {cache.dir} has no prompt with all "
                                  f"{k_max + 1} depths x {samples} samples yet")
            self.prompts = [self.prompts[i] for i in keep]
            self.z0 = self.z0[keep]
            missing = []
        if max_prompts is not None:
            self.prompts, self.z0 = self.prompts[:max_prompts], self.z0[:max_prompts]
            kept = {p.key for p in self.prompts}
            missing = [(key, k) for key, k in missing if key in kept]
        if missing:
            raise PonderError(f"rollout cache {cache.dir} is incomplete ({len(missing)} of "
                              f"{len(self.prompts) * (k_max + 1)} prompt x depth outcomes "
                              "missing): run the trainer again to finish building it")
        self.records = [[table[(p.key, k)][:samples] for k in range(k_max + 1)]
                        for p in self.prompts]
        self.controller_flops = float(controller_flops)
        every = [r for rows in self.records for depth in rows for r in depth]
        correct_ppl = [r["ppl"] for r in every if r["correct"] and r.get("ppl") is not None]
        self.rewards.set_ppl_reference(correct_ppl or [r.get("ppl") for r in every])
        # Frozen reference for model selection: the same reward with whole-cache FLOPs stats.
        self.reference_stats = RunningStats(self.rewards.cfg.ema_momentum)
        self.reference_stats.update([self.flops(r) for r in every])

    def flops(self, record: dict) -> float:
        return float(record["flops"]) + self.controller_flops

    def _record(self, i: int, depth: int) -> dict:
        rows = self.records[i][depth]
        if len(rows) == 1:
            return rows[0]
        return rows[int(torch.randint(0, len(rows), (1,), generator=self.generator))]

    def states(self, prompt_ids: torch.Tensor) -> torch.Tensor:
        """z_0 of each prompt [P, d]: the state its one halting decision is made on."""
        return self.z0[prompt_ids]

    def outcomes(self, prompt_ids: torch.Tensor,
                 depths: torch.Tensor) -> tuple[list[dict], list[float]]:
        """The outcome of each (prompt, depth) pair: its cached record (a drawn sample, where
        the cache holds several) and FLOPs."""
        recs = [self._record(int(i), int(d)) for i, d in zip(prompt_ids, depths)]
        return recs, [self.flops(r) for r in recs]

    def __call__(self, prompt_ids: torch.Tensor, depths: torch.Tensor) -> dict[str, torch.Tensor]:
        """Rewards and reward inputs of each (prompt, depth) pair, scored by ``rewards``."""
        return self.rewards.score(*self.outcomes(prompt_ids, depths))

    def expected(self, i: int, depth: int, samples: list[int] | None = None) -> dict[str, float]:
        """Expected outcome of prompt ``i`` at ``depth``: the mean over its samples (or the
        given sample indices) of correctness, FLOPs, tokens and the selection score (the
        reward with initial weights and whole-cache FLOPs statistics)."""
        rows = self.records[i][depth]
        if samples is not None:
            rows = [rows[s] for s in samples]
        score = [self.rewards.reference_score(r, self.flops(r), self.reference_stats)
                 for r in rows]
        n = len(rows)
        return {"accuracy": sum(r["correct"] for r in rows) / n,
                "flops": sum(self.flops(r) for r in rows) / n,
                "gen_tokens": sum(r["gen_tokens"] for r in rows) / n,
                "score": sum(score) / n}

    def expected_scores(self, ids: list[int]) -> torch.Tensor:
        """The selection score of every depth of each prompt, averaged over its samples
        [len(ids), K+1] (float64): the table the expected-reward trainer optimises."""
        return torch.tensor([[self.expected(i, k)["score"] for k in range(self.k_max + 1)]
                             for i in ids], dtype=torch.float64)

    def evaluate(self, ids: list[int], depths: torch.Tensor) -> dict[str, float]:
        """Deterministic metrics of given depths, averaged over prompts (see ``expected``)."""
        if not ids:
            return {}
        per = [self.expected(i, int(d)) for i, d in zip(ids, depths)]
        n = len(ids)
        out = {k: sum(e[k] for e in per) / n for k in ("accuracy", "flops", "gen_tokens")}
        return {**out, "depth": float(depths.float().mean()), "score": sum(e["score"] for e in per) / n}

    def oracle(self, ids: list[int]) -> dict[str, float]:
        """Best fixed depth and per-prompt best depth by the selection score (for the card)."""
        best_fixed = max(
            ((k, self.evaluate(ids, torch.full((len(ids),), k))) for k in range(self.k_max + 1)),
            key=lambda kv: kv[1]["score"])
        return {"best_fixed_depth": best_fixed[0], **{f"best_fixed_{k}": v for k, v in
                                                      best_fixed[1].items()}}


    # ------------------------------------------------------------- the training loop's interface
    granularity = "prompt"

    def generators(self) -> dict[str, torch.Generator]:
        return {"env": self.generator}

    def types(self, prompt_ids: torch.Tensor) -> torch.Tensor:
        if getattr(self, "_types", None) is None or len(self._types) != len(self.prompts):
            self._types = problem_types(self.prompts)
        return self._types[prompt_ids]

    def held_out(self, trainer, train_ids: list[int], val_ids: list[int]) -> dict:
        out = {"train_greedy": self.evaluate(train_ids, trainer.greedy_depths(self.z0[train_ids]))}
        if val_ids:
            out["val_greedy"] = self.evaluate(val_ids, trainer.greedy_depths(self.z0[val_ids]))
        return out

    def selection_key(self, summary: dict) -> tuple[float, ...]:
        return ((summary.get("val_greedy") or summary["train_greedy"])["score"],)

    def state(self) -> dict:
        return {}

    def restore(self, meta: dict) -> None:
        pass

    def final_metrics(self, trainer, train_ids: list[int], val_ids: list[int]) -> dict:
        metrics = {"train": self.evaluate(train_ids, trainer.greedy_depths(self.z0[train_ids]))}
        if val_ids:
            metrics["val"] = self.evaluate(val_ids, trainer.greedy_depths(self.z0[val_ids]))
            metrics["val_oracle"] = self.oracle(val_ids)
        return metrics

    def data_and_cost(self, cfg, n_train: int, n_val: int) -> tuple[dict, dict]:
        data = {"rollout_manifest": self.cache.manifest, "n_prompts": len(self.prompts),
                "n_train": n_train, "n_val": n_val}
        cost = {"generations": len(self.prompts) * (self.k_max + 1) * self.samples,
                "cache_wall_s": round(self.cache_wall, 1)}
        return data, cost
