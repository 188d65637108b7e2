"""Token-granularity training (``--ponder.granularity token``): GRPO on online rollouts.

Why online. With ``granularity="token"`` the controller decides afresh at every decoded token,
on a state that depends on every earlier decision, so an outcome is a function of the whole
sequence of depths and cannot be looked up per depth as ``rollouts.py`` does. Each GRPO step
therefore generates its P x G answers with the controller in the loop (``pondering.dynamics.TokenPolicy``
samples a halting depth per row per token and records the state it saw), scores them with the
same reward (``environment.RewardBook``) and updates on the recorded decisions
(``GRPOTrainer.step``): log pi(trajectory) is the sum of every token's halting log-probability.

Cost. One step is one batched generation of its P x G rows and one perplexity pass, so the
default 2500 steps x 8 prompts x G = 8 are 160k generations: a GPU job (G, T1 and T2 are the
paper's; the steps and the batch, which it does not state, are ours: 2500 gives stage 3 as many
steps as stage 2). docs/results/token-level.md gives the measured seconds per step on this CPU.
The loop is the prompt-level one (``training.loop``): curriculum, stage-1 choice, quality
gates, the diversity alert, logs, atomic checkpoints with exact resume, the same seed giving
the same controller, and data parallelism (each rank generates its share of the prompts).

Choices. Text is decoded greedily (the randomness is in the halting decisions); the teacher
ponders its drawn depth at every token of a trajectory; the held-out figures in the log and
``select=best`` use inference-time halting (first phi <= tau) on the held-out training
prompts, ranked by accuracy, then fewer FLOPs. PPL_base and sigma_PPL, unless configured, come
from the first step's answers (all ranks' correct answers, else all answers) and are then fixed.
"""

from __future__ import annotations

import math

import torch

from lm_eval_ponder.flops import generation_flops
from lm_eval_ponder.generation.generator import SteeredGenerator
from lm_eval_ponder.pondering.controller import PonderController
from lm_eval_ponder.pondering.dynamics import TokenPolicy
from lm_eval_ponder.scoring import grading
from lm_eval_ponder.training.config import TrainConfig
from lm_eval_ponder.training.environment import RewardBook, problem_types
from lm_eval_ponder.training.grpo import GRPOTrainer
from lm_eval_ponder.training.rollouts import (
    Prompt,
    build_prompts,
    prompts_sha,
    relative_error,
    response_perplexities,
)


class OnlineEnvironment:
    """Generates answers to training prompts with a token-level policy in the loop; scores
    them with its ``rewards``, whose perplexity reference comes from the config or, unless
    configured, from the first step's answers."""

    granularity = "token"

    def __init__(self, generator: SteeredGenerator, cfg: TrainConfig, controller: PonderController,
                 prompts: list[Prompt] | None = None, rank: int = 0) -> None:
        ppl_ref = None
        if cfg.reward.ppl_baseline is not None and cfg.reward.sigma_ppl is not None:
            ppl_ref = (cfg.reward.ppl_baseline, cfg.reward.sigma_ppl)
        self.rewards = RewardBook(cfg.reward, ppl_ref)
        self.generator, self.train_cfg = generator, cfg
        self.prompts = build_prompts(generator, cfg.rollout) if prompts is None else prompts
        self.k_max = cfg.ponder.k_max
        # as the rollout cache: greedy, EOS only (generate_texts adds the EOS text as lm-eval does)
        self.generation = {"until": [], "max_gen_toks": cfg.rollout.max_completion_length,
                           "do_sample": False}
        self.controller = controller
        self.rank = rank

    @torch.no_grad()
    def rollout(self, ids: list[int], group: int, policy: TokenPolicy):
        """``group`` answers to each prompt in ``ids``, all in one generation: (records,
        trajectories), rows prompt-major (prompt j's answers are rows j*group..j*group+group-1).

        One call for a whole step's P x G rows keeps the batch full (the generation loop holds
        ``max_rows`` rows in flight and lets finished rows leave), instead of P calls of G rows
        each. Generation goes through ``SteeredGenerator.generate_texts`` (the contexts read
        and answered as lm-eval's ``generate_until`` reads and answers them) with a token-mode
        hook driven by ``policy``.
        """
        generator = self.generator
        prompts = [self.prompts[i] for i in ids for _ in range(group)]
        if len(policy.teacher) != len(prompts):
            raise ValueError(f"internal: policy for {len(policy.teacher)} rows, "
                             f"{len(prompts)} rows to generate")
        hook = generator.require_steering().hook(generator.model, policy, generator.device,
                                                 "token")
        out = generator.generate_texts([p.context for p in prompts], self.generation, steer=hook)
        texts = [str(t) for t in out]
        used = [int(t.stats["gen_tokens"]) for t in out]
        ppls = response_perplexities(generator, [p.context for p in prompts], texts)
        trajectories = policy.trajectories(used, hook)
        records, pricing = [], generator.pricing
        for p, n_prompt, text, n, ppl, (_, depths) in zip(
                prompts, [t.stats["prompt_tokens"] for t in out], texts, used, ppls, trajectories):
            correct, pred = grading.grade(p.kind, text, p.gold)
            flops = generation_flops(pricing.spec, n_prompt, n, pricing.prefill_logits) + \
                self.controller.evaluation_flops((self.k_max + 1) * len(depths))
            records.append({"key": p.key, "task": p.task, "level": p.level, "text": text,
                            "gen_tokens": n, "prompt_tokens": int(n_prompt),
                            "flops": float(flops), "correct": bool(correct), "pred": pred,
                            "rel_error": relative_error(p.kind, pred, p.gold), "ppl": ppl,
                            "depth_mean": float(depths.float().mean())})
        return records, trajectories

    def evaluate(self, trainer: GRPOTrainer, ids: list[int]) -> dict[str, float]:
        """Inference-time figures (halt at the first phi <= tau) on prompts ``ids``, generated
        ``max_rows`` prompts per call."""
        if not ids:
            return {}
        recs = []
        rows = self.generator.batching.max_rows
        for start in range(0, len(ids), rows):
            chunk = ids[start : start + rows]
            policy = trainer.token_policy(torch.zeros(len(chunk), dtype=torch.bool),
                                           torch.zeros(len(chunk), dtype=torch.long), greedy=True)
            recs += self.rollout(chunk, 1, policy)[0]
        n = len(recs)
        return {"accuracy": sum(r["correct"] for r in recs) / n,
                "flops": sum(r["flops"] for r in recs) / n,
                "gen_tokens": sum(r["gen_tokens"] for r in recs) / n,
                "depth": sum(r["depth_mean"] for r in recs) / n}


    # ------------------------------------------------------------- the training loop's interface
    def generators(self) -> dict[str, torch.Generator]:
        return {}

    def decision_sampler(self, t: int) -> torch.Generator:
        """The generator of step ``t``'s per-token decisions: seeded per step and rank, so
        ranks explore independently and a resumed run draws the same decisions without saving
        every rank's generator."""
        return torch.Generator().manual_seed(self.train_cfg.seed * 1_000_003 + t * 1009
                                             + self.rank)

    def types(self, prompt_ids: torch.Tensor) -> torch.Tensor:
        return problem_types(self.prompts)[prompt_ids]

    def held_out(self, trainer: GRPOTrainer, train_ids: list[int], val_ids: list[int]) -> dict:
        """Inference-time figures on the held-out prompts (generation: the costly part)."""
        return {"val_greedy": self.evaluate(trainer, val_ids)}

    def selection_key(self, summary: dict) -> tuple[float, ...]:
        """Held-out accuracy, then fewer FLOPs (the batch's figures without held-out prompts)."""
        figures = summary.get("val_greedy") or {"accuracy": summary["accuracy"],
                                                "flops": summary["flops_mean"]}
        return (figures.get("accuracy", -math.inf), -figures.get("flops", math.inf))

    def state(self) -> dict:
        return {"ppl_ref": self.rewards.ppl_ref}

    def restore(self, meta: dict) -> None:
        self.rewards.ppl_ref = meta["ppl_ref"]

    def final_metrics(self, trainer: GRPOTrainer, train_ids: list[int],
                      val_ids: list[int]) -> dict:
        return {"val": self.evaluate(trainer, val_ids)} if val_ids else {}

    def data_and_cost(self, cfg: TrainConfig, n_train: int, n_val: int) -> tuple[dict, dict]:
        data = {"prompts_sha256": prompts_sha(self.prompts), "n_prompts": len(self.prompts),
                "n_train": n_train, "n_val": n_val}
        return data, {"generations": cfg.grpo.max_steps * cfg.grpo.prompts_per_step
                      * cfg.grpo.num_generations}
