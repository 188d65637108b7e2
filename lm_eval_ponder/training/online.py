"""Token-granularity training (``--ponder.granularity token``): GRPO on online rollouts.

Why online. With ``granularity="token"`` the controller decides afresh at every decoded token,
on a state that depends on every earlier decision, so an outcome is a function of the whole
sequence of depths and cannot be looked up per depth as ``rollouts.py`` does. Each GRPO step
therefore generates its P x G answers with the controller in the loop (``grpo.TokenPolicy``
samples a halting depth per row per token and records the state it saw), scores them with the
same reward (``environment.RewardBook``) and updates on the recorded decisions
(``grpo.step_tokens``): log pi(trajectory) is the sum of every token's halting log-probability.

Cost. One step is P prompts x (one batched generation of G rows + one perplexity pass), so the
paper's 2500 steps x 8 x 8 answers are 160k generations: a GPU job. docs/results.md gives the
measured seconds per step on this CPU. Everything else matches the prompt-level trainer: the
paper's curriculum and stage-1 choice, quality gates, the diversity alert, logs every
``logging_steps`` steps, atomic checkpoints with exact resume, the same seed giving the same
controller, and data parallelism (each rank generates its share of the batch's prompts).

Choices. Text is decoded greedily (the randomness is in the halting decisions); the teacher
ponders its drawn depth at every token of a trajectory; the held-out figures in the log and
``select=best`` use inference-time halting (first phi <= tau) on the held-out training
prompts, ranked by accuracy, then fewer FLOPs. PPL_base and sigma_PPL, unless configured, come
from the first step's answers (all ranks' correct answers, else all answers) and are then fixed.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import torch

from lm_eval_ponder.training import checkpoint as ckpt
from lm_eval_ponder.evaluation import grading
from lm_eval_ponder.pondering.controller import PonderController, save_controller
from lm_eval_ponder.training.environment import RewardBook, split_prompts
from lm_eval_ponder.flops import generation_flops
from lm_eval_ponder.training.grpo import GRPOTrainer, TokenPolicy, step_tokens
from lm_eval_ponder.pondering.dynamics import cumulative_offsets
from lm_eval_ponder.pondering.hook import SteeringHook
from lm_eval_ponder.training.rollouts import (Prompt, build_prompts, prompts_sha, relative_error,
                                     response_perplexities)
from lm_eval_ponder.training.config import TrainConfig, config_dict
from lm_eval_ponder.training.distributed import Distributed
from lm_eval_ponder.training.loop import (LOG, batch_figures, identity_of, iteration,
                                          load_backbone, load_state, save_state, trim_log)
from lm_eval_ponder.files import append_jsonl


class OnlineEnvironment(RewardBook):
    """Generates answers to training prompts with a token-level policy in the loop."""

    def __init__(self, lm, prompts: list[Prompt], cfg: TrainConfig,
                 controller: PonderController) -> None:
        ppl_ref = None
        if cfg.reward.ppl_baseline is not None and cfg.reward.sigma_ppl is not None:
            ppl_ref = (cfg.reward.ppl_baseline, cfg.reward.sigma_ppl)
        super().__init__(cfg.reward, ppl_ref)
        from lm_eval.models.utils import handle_stop_sequences

        self.lm, self.prompts = lm, prompts
        self.max_gen_toks = cfg.rollout.max_completion_length
        self.k_max = cfg.ponder.k_max
        eos = lm.tok_decode(lm.eot_token_id, skip_special_tokens=False)
        self.until = handle_stop_sequences(None, eos=eos)  # as the rollout cache: EOS only
        self.controller = controller

    @torch.no_grad()
    def rollout(self, i: int, policy: TokenPolicy):
        """G = len(policy.teacher) answers to prompt i: (records, trajectories).

        The G rows share one unpadded prompt, so every row's last position is its own last
        token, as in ``--model ponder``. Generation goes through ``PonderLM.generate_batch``
        (the call under lm-eval's ``generate_until``) with a token-mode hook driven by
        ``policy`` instead of the model's own pondering.
        """
        from lm_eval.models.utils import postprocess_generated_text

        lm, p, rows = self.lm, self.prompts[i], len(policy.teacher)
        ids, mask = lm.tok_batch_encode([p.context])
        ids, mask = ids.repeat(rows, 1).to(lm.device), mask.repeat(rows, 1).to(lm.device)
        hook = SteeringHook(lm.model, lm.steer_layer, lm.steer_vector, lm.steer_scale, policy,
                            mode="token")
        out = lm.generate_batch(ids, mask, max_new_tokens=self.max_gen_toks, stop=self.until,
                                steering=hook, do_sample=False)
        generated = out.sequences[:, ids.shape[1]:].tolist()
        used = out.gen_tokens
        texts = [postprocess_generated_text(generation=lm.tok_decode(t), stop=self.until,
                                            think_end_token=None) for t in generated]
        ppls = response_perplexities(lm, [p.context] * rows, texts)
        trajectories = policy.trajectories(used, hook)
        records = []
        for text, n, ppl, (_, depths) in zip(texts, used, ppls, trajectories):
            correct, pred = grading.grade(p.kind, text, p.gold)
            flops = generation_flops(lm.flops_spec, ids.shape[1], n) + \
                self.controller.evaluation_flops((self.k_max + 1) * len(depths))
            records.append({"key": p.key, "task": p.task, "level": p.level, "text": text,
                            "gen_tokens": n, "prompt_tokens": int(ids.shape[1]),
                            "flops": float(flops), "correct": bool(correct), "pred": pred,
                            "rel_error": relative_error(p.kind, pred, p.gold), "ppl": ppl,
                            "depth_mean": float(depths.float().mean())})
        return records, trajectories

    def evaluate(self, trainer: GRPOTrainer, ids: list[int]) -> dict[str, float]:
        """Inference-time figures (halt at the first phi <= tau) on prompts ``ids``."""
        if not ids:
            return {}
        recs = []
        for i in ids:
            policy = TokenPolicy(trainer, torch.zeros(1, dtype=torch.bool),
                                 torch.zeros(1, dtype=torch.long), greedy=True)
            recs += self.rollout(i, policy)[0]
        n = len(recs)
        return {"accuracy": sum(r["correct"] for r in recs) / n,
                "flops": sum(r["flops"] for r in recs) / n,
                "gen_tokens": sum(r["gen_tokens"] for r in recs) / n,
                "depth": sum(r["depth_mean"] for r in recs) / n}


def _rank_key(figures: dict) -> tuple[float, float]:
    return (figures.get("accuracy", -math.inf), -figures.get("flops", math.inf))


def run_online(cfg: TrainConfig) -> Path:
    from tqdm.auto import tqdm

    from lm_eval_ponder.steering.vector import load_vector

    dist = Distributed()
    out = Path(cfg.output)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(cfg.seed)
    offsets = cumulative_offsets(cfg.ponder)
    lm = load_backbone(cfg, offsets.tolist())
    identity = identity_of(lm)
    prompts = build_prompts(lm, cfg.rollout)
    torch.manual_seed(cfg.seed)
    controller = PonderController(identity["hidden_size"], cfg.controller_hidden,
                                  cfg.controller_temperature)
    env = OnlineEnvironment(lm, prompts, cfg, controller)
    vector = load_vector(identity["steering_dir"]).vector(identity["layer"])
    trainer = GRPOTrainer(controller, identity["steering_scale"] * vector, offsets,
                          cfg.ponder.tau, cfg.grpo, cfg.seed)
    gen = trainer.generator
    train_ids, val_ids = split_prompts([p.key for p in prompts], cfg.val_fraction)
    P = dist.check_batch(cfg.grpo.prompts_per_step)

    run_config = config_dict(cfg)
    state_path, log_path = out / ckpt.FILE, out / LOG
    start, best, best_key, best_step, train_wall = 0, None, (-math.inf, -math.inf), -1, 0.0
    meta, loaded = load_state(state_path, trainer, {"grpo": gen}, env, run_config, dist.world)
    if meta is not None:
        best = loaded
        start, best_key, best_step = meta["step"], tuple(meta["best_key"]), meta["best_step"]
        env.ppl_ref, train_wall = meta["ppl_ref"], meta["train_wall"]
    if dist.rank == 0:
        trim_log(log_path, start)

    def score(records: list[dict]) -> dict[str, torch.Tensor]:
        if env.ppl_ref is None:  # first step: the reference from every rank's answers
            ppl = dist.gather(torch.tensor([r["ppl"] if r["ppl"] is not None else math.nan
                                            for r in records], dtype=torch.float64))
            ok = dist.gather(torch.tensor([float(r["correct"]) for r in records])) > 0.5
            chosen = ppl[ok] if bool(ok.any()) else ppl
            env.set_ppl_reference([float(x) for x in chosen if math.isfinite(x)])
        return env.score(records, [r["flops"] for r in records])

    window: list[dict] = []
    t_train = time.time() - train_wall
    bar = tqdm(range(start, cfg.grpo.max_steps), desc="GRPO (token level, online)",
               disable=dist.rank != 0, initial=start, total=cfg.grpo.max_steps)
    train_tensor = torch.tensor(train_ids)
    for t in bar:
        def step(local, t=t):
            # per step and rank, so ranks explore independently and a resumed run draws the
            # same decisions without saving every rank's generator
            sampler = torch.Generator().manual_seed(cfg.seed * 1_000_003 + t * 1009 + dist.rank)
            return step_tokens(trainer, t, local, env.rollout, score,
                               gradient_hook=lambda: dist.average_gradients(controller),
                               gather=dist.gather, sampler=sampler)

        iteration(t, step, train_tensor, P, gen, env, dist, window, log_path, cfg)
        if (t + 1) % cfg.logging_steps == 0 or t + 1 == cfg.grpo.max_steps:
            summary = batch_figures(window, env.weights, env.k_max, t + 1, cfg,
                                    time.time() - t_train, trainer.reinitialisations)
            window = []
            if dist.rank == 0:
                summary["val_greedy"] = env.evaluate(trainer, val_ids)
                key = _rank_key(summary["val_greedy"] or {"accuracy": summary["accuracy"],
                                                          "flops": summary["flops_mean"]})
                if key >= best_key:
                    best_key, best_step = key, t + 1
                    best = {k: v.detach().clone() for k, v in controller.state_dict().items()}
                summary["best_step"] = best_step
                append_jsonl(log_path, summary)
                save_state(state_path, trainer, {"grpo": gen}, best, env, {
                    "step": t + 1, "config": run_config, "world": dist.world,
                    "ppl_ref": env.ppl_ref, "best_key": list(best_key), "best_step": best_step,
                    "train_wall": time.time() - t_train})
                bar.set_postfix(acc=round(summary["accuracy"], 3),
                                depth=round(summary["depth_mean"], 2))
    train_wall = time.time() - t_train
    dist.assert_same(controller)
    if dist.rank == 0:
        chosen = cfg.grpo.max_steps
        if cfg.select == "best" and best is not None:
            controller.load_state_dict(best)
            chosen = best_step
        figures = {"val": env.evaluate(trainer, val_ids)} if val_ids else {}
        generations = cfg.grpo.max_steps * P * cfg.grpo.num_generations
        extra = {"backbone": identity, "ponder": run_config["ponder"],
                 "layer": identity["layer"], "train_config": run_config, "seed": cfg.seed,
                 "selected_step": chosen,
                 "data": {"prompts_sha256": prompts_sha(prompts), "n_prompts": len(prompts),
                          "n_train": len(train_ids), "n_val": len(val_ids)},
                 "figures": figures, "cost": {"generations": generations,
                                              "train_wall_s": round(train_wall, 1)}}
        save_controller(controller, out, extra_config=extra)
        (out / "card.md").write_text(_card(cfg, identity, extra))
    dist.barrier()
    return out


def _card(cfg: TrainConfig, identity: dict, extra: dict) -> str:
    tasks = ", ".join(f"{k} ({v} train-split prompts)" for k, v in cfg.rollout.prompts.items())
    lines = [
        f"# Token-level ponder controller for {identity['backbone_name']}", "",
        f"- Backbone: `{identity['backbone']}` (source sha256 `{identity['backbone_sha256']}`)",
        f"- Steering vector: `{identity['steering_dir']}` (sha256 "
        f"`{identity['steering_sha256']}`), layer {identity['layer']}",
        f"- Pondering: {json.dumps(extra['ponder'])}",
        f"- Data: {tasks}; {extra['data']['n_train']} for training, {extra['data']['n_val']} "
        "held out. No test split is used.",
        f"- Online GRPO: {cfg.grpo.max_steps} steps x {cfg.grpo.prompts_per_step} prompts x "
        f"G={cfg.grpo.num_generations} = {extra['cost']['generations']} generations of at most "
        f"{cfg.rollout.max_completion_length} tokens, {extra['cost']['train_wall_s']} s; seed {cfg.seed}",
        f"- Shipped weights: step {extra['selected_step']}", "",
    ]
    if extra["figures"].get("val"):
        f = extra["figures"]["val"]
        lines += ["Held-out training prompts, inference-time halting:", "",
                  "| accuracy | gen tokens | FLOPs | mean depth per token |", "|---|---|---|---|",
                  f"| {f['accuracy']:.3f} | {f['gen_tokens']:.1f} | {f['flops']:.3e} | "
                  f"{f['depth']:.2f} |", ""]
    return "\n".join(lines)
