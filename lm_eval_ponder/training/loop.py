"""The one training loop behind ``python -m lm_eval_ponder.train``, for both granularities.

Whatever produces the outcomes: draw a global batch of training prompts, let the trainer run
one step on this rank's shard (``GRPOTrainer.step`` asks the *environment*, a
``TrainingEnvironment``, for outcomes and scores them with the reward book), gather the
outcomes, update the reward state, log every ``logging_steps`` steps with held-out figures,
keep the best weights, checkpoint atomically; at the end write the controller, its config and
card. Environments: ``environment.CachedEnvironment`` (prompt granularity: rollout-cache
lookups) and ``online.OnlineEnvironment`` (token granularity: generated with the controller in
the loop).

Distributed (``torchrun`` / ``accelerate launch``, gloo on CPU too): every rank builds its
share of the rollout cache, draws the same global batch and works on its shard; gradients are
averaged and outcomes gathered, so reward statistics stay identical everywhere. Rank 0 writes.
"""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from typing import Protocol

import torch

from lm_eval_ponder.errors import PonderError
from lm_eval_ponder.files import append_jsonl, output_folder
from lm_eval_ponder.generation.generator import SteeredGenerator
from lm_eval_ponder.generation.settings import load_steering
from lm_eval_ponder.pondering.controller import PonderController, save_controller
from lm_eval_ponder.pondering.dynamics import cumulative_offsets
from lm_eval_ponder.portable import backbone_record, expand, portable_path
from lm_eval_ponder.training import checkpoint as ckpt
from lm_eval_ponder.training.config import TrainConfig, config_dict
from lm_eval_ponder.training.distributed import Distributed
from lm_eval_ponder.training.environment import (
    CachedEnvironment,
    RewardBook,
    reward_key,
    split_prompts,
)
from lm_eval_ponder.training.expected import ExpectedRewardTrainer
from lm_eval_ponder.training.expected import describe as describe_expected
from lm_eval_ponder.training.grpo import (
    GRPOTrainer,
    completeness_threshold,
    curriculum_probability,
    curriculum_stage,
)
from lm_eval_ponder.training.online import OnlineEnvironment
from lm_eval_ponder.training.rewards import COMPONENTS
from lm_eval_ponder.training.rollouts import RolloutCache, generate_missing, prepare_cache

LOG = "train_log.jsonl"
LOGGER = logging.getLogger(__name__)


def load_backbone(cfg: TrainConfig) -> SteeredGenerator:
    """The frozen backbone's generation with the run's steering vector (``cfg.steering`` at
    ``cfg.layer``; None: the shipped vector, its default layer). It ponders no call by itself:
    the rollout cache steers each row at its depth's offset and the token-level trainer steers
    through its policy's hook, each call saying how. ``PonderLM`` loads the backbone (HFLM's
    loading, device and dtype rules, chat template) and only its generator is kept: the one
    module outside ``evaluation`` that names it (``tests/test_layout.py``)."""
    from lm_eval_ponder.evaluation.lm import PonderLM

    # HFLM's batch size is unused (the rollout cache sizes its own calls); 0 is the cache's
    # "as many as lm-eval hands over", which HFLM's batch_size does not take
    kwargs = {"batch_size": max(cfg.rollout.batch_size, 1), "dtype": cfg.dtype,
              "parallelize": cfg.parallelize}
    if cfg.device:
        kwargs["device"] = cfg.device
    generator = PonderLM(controller=None, pretrained=cfg.pretrained, gguf_file=cfg.gguf_file,
                         **kwargs).generator
    backbone = generator.backbone
    generator.steering = load_steering(cfg.steering, cfg.layer, backbone.name,
                                       generator.model.config, backbone.source_sha256)
    return generator


def batch_metrics(window: list[dict], weights: dict[str, float], k_max: int, step: int,
                  cfg: TrainConfig, elapsed: float, reinitialisations: int) -> dict:
    """The paper's every-100-steps log over a window of steps: accuracy, FLOPs distribution,
    depths, each reward component, weights, balance ratio E|R_flops|/E|R_acc|, gate pass rate."""
    cat = {k: torch.cat([w[k] for w in window]) for k in window[0]}
    flops = cat["flops"]
    depths = cat.get("depth_mean", cat["depths"].float())
    acc_mag = float((cat["acc"] * weights["acc"]).abs().mean())
    fl_mag = float((cat["flops_reward"] * weights["flops"]).abs().mean())
    ratio = fl_mag / acc_mag if acc_mag > 0 else float("inf")
    return {
        "step": step, "elapsed_s": round(elapsed, 1),
        "stage": curriculum_stage(step, cfg.grpo.t1, cfg.grpo.t2),
        "p_teacher": curriculum_probability(step - 1, cfg.grpo.t1, cfg.grpo.t2),
        "teacher_fraction": float(cat["teacher"].float().mean()),
        "accuracy": float(cat["correct"].mean()),
        "flops_mean": float(flops.mean()), "flops_std": float(flops.std(unbiased=False)),
        "flops_p10_p50_p90": [float(q) for q in torch.quantile(
            flops, torch.tensor([0.1, 0.5, 0.9], dtype=flops.dtype))],
        "depth_mean": float(depths.mean()),
        "depth_hist": torch.bincount(cat["depths"], minlength=k_max + 1).tolist(),
        "reward_mean": float(cat["reward"].mean()),
        **{f"R_{k}": float(cat[reward_key(k)].mean()) for k in COMPONENTS},
        "weights": dict(weights),
        "balance_ratio": ratio, "balance_ok": 0.1 <= ratio <= 1.0,
        "gate_pass": float(cat["keep"].float().mean()),
        # fraction of the window's trajectories each quality gate dropped (0 before stage 3)
        "gate_drop_comp": float(cat["gate_drops"][:, 0].float().mean()),
        "gate_drop_qual": float(cat["gate_drops"][:, 1].float().mean()),
        "temperature": float(cat["temperature"][-1]),
        "loss": nan_mean(cat["loss"]),
        "min_diversity": float(cat["diversity"].min()),
        # collapse diagnostics: GRPO's signal (mean |advantage|) and the policy's entropy
        "advantage_abs": nan_mean(cat["advantage_abs"]), "entropy": nan_mean(cat["entropy"]),
        "reinitialisations": reinitialisations,
    }


def nan_mean(values: torch.Tensor) -> float | None:
    """Mean of the finite entries (None if there are none: e.g. stage 1 has no advantages)."""
    return float(torch.nanmean(values)) if torch.isfinite(values).any() else None


def window_entry(outcome: dict[str, torch.Tensor], res, dist: "Distributed") -> dict:
    """One step's contribution to the log window (the whole batch, gathered over ranks)."""
    entry = {k: outcome[k] for k in ("flops", "correct", "reward", "acc", "flops_reward",
                                     "comp", "qual", "rep")}
    entry.update({"depths": dist.gather(res.depths.reshape(-1)),
                  "teacher": dist.gather(res.teacher.reshape(-1)),
                  "keep": dist.gather(res.keep.reshape(-1)),
                  "gate_drops": dist.gather(res.gate_drops.reshape(-1, 2)),
                  "temperature": torch.tensor([res.temperature]),
                  "loss": torch.tensor([res.loss]), "diversity": torch.tensor([res.diversity]),
                  "advantage_abs": torch.tensor([res.advantage_abs]),
                  "entropy": torch.tensor([res.entropy])})
    if res.mean_depth is not None:
        entry["depth_mean"] = dist.gather(res.mean_depth.reshape(-1))
    return entry


def save_state(path: Path, trainer: GRPOTrainer, generators: dict, best, env,
               meta: dict) -> None:
    """The checkpoint: controller, optimiser, generators, best weights, reward state, meta."""
    ckpt.save_checkpoint(path, trainer.controller, trainer.optimizer, generators, best, {
        **meta, "stats": env.rewards.stats.state(), "weights": env.rewards.weights,
        "reinitialisations": trainer.reinitialisations})


def load_state(path: Path, trainer: GRPOTrainer, generators: dict, env, run_config: dict,
               world: int) -> tuple[dict | None, dict | None]:
    """Resume from ``save_state``'s checkpoint, if any: (meta, best weights), or (None, None).

    A checkpoint of another config or world size is refused rather than silently mixed in.
    """
    if not path.is_file():
        return None, None
    meta = ckpt.read_meta(path)
    if meta["config"] != run_config or meta.get("world", 1) != world:
        raise PonderError(f"{path.parent} holds a checkpoint of a run with another config; use "
                          "another --output or delete the checkpoint to start over")
    meta, best = ckpt.load_checkpoint(path, trainer.controller, trainer.optimizer, generators)
    env.rewards.stats.load(meta["stats"])
    env.rewards.weights = meta["weights"]
    trainer.reinitialisations = meta["reinitialisations"]
    LOGGER.info("resuming %s at step %d", path.parent, meta["step"])
    return meta, best


def trim_log(log_path: Path, start: int) -> None:
    """On resume, drop log lines written after the checkpoint (they will be written again)."""
    if log_path.is_file():
        kept = [line for line in log_path.read_text().splitlines()
                if line.strip() and json.loads(line)["step"] <= start]
        log_path.write_text("".join(line + "\n" for line in kept))


def identity_of(generator: SteeredGenerator) -> dict:
    """What a controller is trained for: backbone, steering vector, layer and scale."""
    backbone, steering, model = generator.backbone, generator.require_steering(), generator.model
    return {"backbone": backbone_record(backbone.path, backbone.name, backbone.source_sha256),
            "backbone_name": backbone.name,
            "backbone_sha256": backbone.source_sha256,
            "dtype": str(model.dtype).removeprefix("torch."),
            "steering_dir": portable_path(steering.steering_dir), "layer": steering.layer,
            "steering_scale": steering.scale, "hidden_size": model.config.hidden_size,
            "steering_sha256": steering.sha()}


class TrainingEnvironment(Protocol):
    """What the loop needs from whatever produces outcomes (see the module docstring)."""

    prompts: list
    rewards: RewardBook  # the reward and its running state (weights, FLOPs statistics)
    k_max: int

    def generators(self) -> dict[str, torch.Generator]:
        """Generators besides the trainer's that a checkpoint must restore."""

    granularity: str  # "prompt": outcomes(ids, depths) and states(ids); "token": rollout

    def types(self, prompt_ids: torch.Tensor) -> torch.Tensor:
        """Each prompt's problem type (``environment.problem_types``)."""

    def held_out(self, trainer: GRPOTrainer, train_ids: list[int],
                 val_ids: list[int]) -> dict: ...

    def selection_key(self, summary: dict) -> tuple[float, ...]: ...

    def state(self) -> dict: ...

    def restore(self, meta: dict) -> None: ...

    def final_metrics(self, trainer: GRPOTrainer, train_ids: list[int],
                      val_ids: list[int]) -> dict: ...

    def data_and_cost(self, cfg: TrainConfig, n_train: int, n_val: int) -> tuple[dict, dict]: ...


def build_environment(cfg: TrainConfig, generator: SteeredGenerator, controller: PonderController,
                      offsets: list[float], out: Path, dist: Distributed) -> TrainingEnvironment:
    """Prompt granularity: build (or finish) the rollout cache with ``generator``, then train
    on lookups. Token granularity: train online with ``generator`` in the loop."""
    if cfg.ponder.granularity == "token":
        return OnlineEnvironment(generator, cfg, controller, rank=dist.rank)
    t0 = time.time()
    cache_dir = Path(cfg.cache_dir) if cfg.cache_dir else out / "rollouts"
    if dist.rank == 0:
        cache, prompts = prepare_cache(generator, cfg.rollout, offsets, cache_dir)
    dist.barrier()  # rank 0 has written the manifest, prompts and states
    if dist.rank != 0:
        cache, prompts = prepare_cache(generator, cfg.rollout, offsets, cache_dir, write=False)
    generate_missing(generator, cache, prompts, cfg.rollout, offsets, dist.rank, dist.world)
    dist.barrier()  # every rank's share is finished
    env = CachedEnvironment(RolloutCache(cache_dir), cfg.ponder.k_max, cfg.rollout.samples,
                            controller.evaluation_flops(cfg.ponder.k_max + 1), cfg.reward,
                            torch.Generator().manual_seed(cfg.seed + 1))
    env.cache_wall = time.time() - t0
    return env


def optimise(cfg: TrainConfig, trainer: GRPOTrainer, env: TrainingEnvironment,
             train_ids: list[int], val_ids: list[int], out: Path,
             dist: Distributed) -> tuple[int, float]:
    """GRPO on ``train_ids`` for ``cfg.grpo.max_steps`` steps, resuming from ``out``'s
    checkpoint; every ``logging_steps`` a log line with figures on ``val_ids`` (the selection
    key). Leaves the selected weights (``cfg.select``) in ``trainer.controller`` and returns
    (selected step, training wall seconds). Separate from ``run`` so that experiments can train
    on their own prompt splits (``studies/adaptation.py`` cross-fits) with the same loop."""
    controller = trainer.controller
    generators = {"grpo": trainer.generator, **env.generators()}
    P = dist.check_batch(cfg.grpo.prompts_per_step)

    run_config = config_dict(cfg)
    state_path, log_path = out / ckpt.FILE, out / LOG
    start, best, best_key, best_step, train_wall = 0, None, (-math.inf,), -1, 0.0
    meta, loaded = load_state(state_path, trainer, generators, env, run_config, dist.world)
    if meta is not None:
        best, start, best_step, train_wall = loaded, meta["step"], meta["best_step"], \
            meta["train_wall"]
        best_key = tuple(meta["best_key"])
        env.restore(meta)
    if dist.rank == 0:
        trim_log(log_path, start)

    from tqdm.auto import tqdm

    window: list[dict] = []
    t_train = time.time() - train_wall
    bar = tqdm(range(start, cfg.grpo.max_steps), disable=dist.rank != 0, initial=start,
               total=cfg.grpo.max_steps,
               desc="GRPO" + (" (token level, online)" if cfg.ponder.granularity == "token"
                              else ""))
    train_tensor = torch.tensor(train_ids)
    for t in bar:
        # the global batch (the same on every rank), this rank's shard of it, then the whole
        # batch's outcomes gathered for the reward state and the log window
        ids = train_tensor[torch.randint(0, len(train_tensor), (P,), generator=trainer.generator)]
        dist.assert_equal(ids, "ranks drew different global batches (generator out of step)")
        local = ids[dist.rank :: dist.world]
        res = trainer.step(t, local, env, gradient_hook=lambda: dist.average_gradients(controller),
                           gather=dist.gather, types=env.types(local))
        outcome = {k: dist.gather(v) for k, v in res.outcome.items()}
        env.rewards.observe(outcome, t)
        window.append(window_entry(outcome, res, dist))
        if res.diversity < cfg.grpo.eps_div and dist.rank == 0:
            append_jsonl(log_path, {"step": t + 1, "alert": "flops_diversity",
                                    "value": res.diversity, "action": "controller re-initialised"})
        if (t + 1) % cfg.logging_steps and t + 1 != cfg.grpo.max_steps:
            continue
        summary = batch_metrics(window, env.rewards.weights, env.k_max, t + 1, cfg,
                                time.time() - t_train, trainer.reinitialisations)
        window = []
        if dist.rank != 0:  # held-out figures, selection and files: rank 0's job
            continue
        summary.update(env.held_out(trainer, train_ids, val_ids))
        key = env.selection_key(summary)
        if key > best_key:
            best_key, best_step = key, t + 1
            best = {k: v.detach().clone() for k, v in controller.state_dict().items()}
        summary["best_step"] = best_step
        append_jsonl(log_path, summary)
        save_state(state_path, trainer, generators, best, env, {
            "step": t + 1, "config": run_config, "world": dist.world,
            "best_key": list(best_key), "best_step": best_step,
            "train_wall": time.time() - t_train, **env.state()})
        bar.set_postfix(acc=round(summary["accuracy"], 3), depth=round(summary["depth_mean"], 2))
    train_wall = time.time() - t_train
    dist.assert_same(controller)
    chosen = cfg.grpo.max_steps
    if cfg.select == "best" and best is not None:
        controller.load_state_dict(best)
        chosen = best_step
    trainer.anneal(chosen - 1)  # the weights of step `chosen` go with its temperature
    return chosen, train_wall


def run(cfg: TrainConfig) -> Path:
    # a run that fails before writing anything (a missing backbone, vector or training data)
    # leaves no empty --output folder; what a run wrote (its rollout cache) is kept to resume
    with Distributed() as dist, output_folder(cfg.output):
        return train(cfg, dist)


def fit(cfg: TrainConfig, env: TrainingEnvironment, controller: PonderController,
        step_vector: torch.Tensor, offsets: torch.Tensor, out: Path, dist: Distributed):
    """Train ``controller`` on ``env``'s training prompts with the run's algorithm: the exact
    expected reward (``training.expected``, prompt granularity) or GRPO (``optimise``).
    Returns (trainer, selected step, training wall seconds, train ids, held-out ids). The
    positive control (``training.control``) trains through here on a synthetic world."""
    train_ids, val_ids = split_prompts([p.key for p in env.prompts], cfg.val_fraction)
    if cfg.algorithm == "expected":
        trainer = ExpectedRewardTrainer(controller, step_vector, offsets, cfg.ponder.tau,
                                        cfg.expected, cfg.seed)
        table = env.expected_scores(list(range(len(env.prompts))))
        val = torch.tensor(val_ids, dtype=torch.long)
        chosen, train_wall = trainer.fit(
            env.z0[train_ids], table[train_ids], env.z0[val] if val_ids else None,
            table[val] if val_ids else None,
            log_path=out / LOG if dist.rank == 0 else None, progress=dist.rank == 0)
        return trainer, chosen, train_wall, train_ids, val_ids
    trainer = GRPOTrainer(controller, step_vector, offsets, cfg.ponder.tau, cfg.grpo, cfg.seed,
                          cfg.controller_temperature_end, rewards=env.rewards)
    chosen, train_wall = optimise(cfg, trainer, env, train_ids, val_ids, out, dist)
    return trainer, chosen, train_wall, train_ids, val_ids


def train(cfg: TrainConfig, dist: Distributed) -> Path:
    out = Path(cfg.output)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(cfg.seed)
    offsets = cumulative_offsets(cfg.ponder)
    generator = load_backbone(cfg)
    identity = identity_of(generator)
    torch.manual_seed(cfg.seed)
    controller = PonderController(identity["hidden_size"], cfg.controller_hidden,
                                  cfg.controller_temperature)
    env = build_environment(cfg, generator, controller, offsets.tolist(), out, dist)
    if cfg.ponder.granularity != "token":
        del generator  # GRPO on lookups needs no backbone
    from lm_eval_ponder.steering.vector import load_vector

    vector = load_vector(expand(identity["steering_dir"])).vector(identity["layer"])
    trainer, chosen, train_wall, train_ids, val_ids = fit(
        cfg, env, controller, identity["steering_scale"] * vector, offsets, out, dist)
    if dist.rank == 0:
        run_config = config_dict(cfg)
        metrics = env.final_metrics(trainer, train_ids, val_ids)
        data, cost = env.data_and_cost(cfg, len(train_ids), len(val_ids))
        extra = {"backbone": identity, "ponder": run_config["ponder"], "layer": identity["layer"],
                 "train_config": run_config, "seed": cfg.seed, "selected_step": chosen,
                 "data": data, "figures": metrics,
                 "cost": {**cost, "train_wall_s": round(train_wall, 1)}}
        save_controller(controller, out, extra_config=extra)
        (out / "card.md").write_text(card(cfg, identity, extra))
    return out  # run's Distributed holds every rank until rank 0 has written


def objective_line(cfg: TrainConfig) -> str:
    """The card's words for what the run optimised (``rewards.OBJECTIVES``)."""
    if cfg.reward.objective == "priced":
        return (f"priced: accuracy minus {cfg.reward.price_per_1k_tokens:g} per 1,000 generated "
                "tokens (stationary; the score below is this objective)")
    adapting = ", ".join(cfg.reward.balance)
    return ("the paper's composite reward (R_flops a z-score against the running FLOPs "
            f"statistics; weights {'adapting: ' + adapting if adapting else 'fixed'})")


def score_words(cfg: TrainConfig) -> str:
    if cfg.reward.objective == "priced":
        return (f"accuracy minus {cfg.reward.price_per_1k_tokens:g} per 1,000 generated tokens, "
                "the objective the controller was trained on.")
    return ("the training reward with its initial weights and whole-cache FLOPs statistics "
            "(prompt level), a fixed ruler for an objective whose weights and statistics "
            "moved during training.")


def optimiser_line(cfg: TrainConfig) -> str:
    """The card's words for the optimiser and clipping."""
    g = cfg.grpo
    kind = ("plain SGD on the batch sum (Algorithm 1)" if g.optim == "sgd"
            else "Adam on the batch mean")
    clip = "no clipping" if g.max_grad_norm is None else f"gradient norm clipped at {g.max_grad_norm}"
    return f"{kind}, eta {g.learning_rate}, {clip}"


def temperature_line(cfg: TrainConfig) -> str:
    """The card's words for the temperature schedule (``grpo.annealed_temperature``)."""
    start, end = cfg.controller_temperature, cfg.controller_temperature_end
    if end is None or end == start:
        return f"constant {start:g}"
    if cfg.grpo.temperature_schedule == "curriculum":
        return (f"{start:g} through stage 1, annealed linearly to {end:g} at step "
                f"{cfg.grpo.t2} (T2, soft to hard), then {end:g}; shipped with the temperature "
                "of its step")
    return (f"{start:g} through stage 1, annealed geometrically to {end:g} at step "
            f"{cfg.grpo.max_steps} (soft to hard); shipped with the temperature of its step")


def card(cfg: TrainConfig, identity: dict, extra: dict) -> str:
    """The controller's card: what it was trained for, on what, at what cost, and its
    inference-time figures on training-split prompts (never test data)."""
    def row(name: str, f: dict) -> str:
        score = f"{f['score']:.4f}" if "score" in f else "-"
        return (f"| {name} | {f['accuracy']:.3f} | {f['gen_tokens']:.1f} | {f['flops']:.3e} | "
                f"{f['depth']:.2f} | {score} |")

    token = cfg.ponder.granularity == "token"
    theta_comp = (cfg.grpo.theta_comp if cfg.grpo.theta_comp is not None
                  else completeness_threshold(cfg.reward))
    tasks = ", ".join(f"{k} ({v} train-split prompts)" for k, v in cfg.rollout.prompts.items())
    cost, data, metrics = extra["cost"], extra["data"], extra["figures"]
    lines = [
        f"# {'Token-level p' if token else 'P'}onder controller for {identity['backbone_name']}",
        "",
        f"- Backbone: `{portable_path(identity['backbone'])}` (source sha256 "
        f"`{identity['backbone_sha256']}`), hidden size {identity['hidden_size']}, "
        f"{identity['dtype']}",
        f"- Steering vector: `{portable_path(identity['steering_dir'])}` (sha256 "
        f"`{identity['steering_sha256']}`), layer {identity['layer']}, scale "
        f"{identity['steering_scale']:.2f}",
        f"- Pondering: {json.dumps(extra['ponder'])}",
        f"- Data: {tasks}; {data['n_train']} for training, {data['n_val']} held out for "
        "choosing the checkpoint. No test split is used.",
    ]
    if token:
        lines.append(f"- Online rollouts: {cost['generations']} generations (steps x prompts x "
                     f"G) of at most {cfg.rollout.max_completion_length} tokens")
    else:
        lines.append(
            f"- Rollouts: {cost['generations']} generations (prompts x depths x samples), max "
            f"{cfg.rollout.max_completion_length} new tokens, "
            f"{'greedy' if cfg.rollout.samples == 1 else f'{cfg.rollout.samples} samples'}; "
            f"cache phase {cost['cache_wall_s']} s in this run (building what was missing, or "
            "only loading the backbone and checking the cache)")
    lines.append(f"- Objective: {objective_line(cfg)}")
    if cfg.algorithm == "expected":
        lines.append(f"- Trainer (recipe {cfg.recipe}): {describe_expected(cfg.expected)}; "
                     f"seed {cfg.seed}; {cost['train_wall_s']} s")
    else:
        lines += [
            f"- GRPO (recipe {cfg.recipe}): {cfg.grpo.max_steps} steps, "
            f"G={cfg.grpo.num_generations}, {cfg.grpo.prompts_per_step} prompts/step, lr "
            f"{cfg.grpo.learning_rate}, T1={cfg.grpo.t1}, T2={cfg.grpo.t2}, stage 1 = "
            f"{cfg.grpo.stage1}; seed {cfg.seed}; {cost['train_wall_s']} s",
            f"- Optimiser: {optimiser_line(cfg)}; groups: "
            f"{'per prompt' if cfg.grpo.group_by == 'prompt' else 'per problem type'}",
            "- Quality gates (stage 3): "
            + (f"R_comp >= {theta_comp:g} and R_qual > {cfg.grpo.theta_qual:g}"
               if cfg.grpo.quality_gates else "off"),
            f"- Controller temperature: {temperature_line(cfg)}",
        ]
    lines += [
        f"- Shipped weights: step {extra['selected_step']} ("
        f"{'the final weights' if cfg.select == 'last' else 'the best held-out figures'})", "",
    ]
    rows = [row(name, metrics[key]) for key, name in (("train", "train"), ("val", "held-out"))
            if metrics.get(key)]
    if metrics.get("val_oracle"):
        o = metrics["val_oracle"]
        rows.append(f"| held-out, best fixed depth ({int(o['best_fixed_depth'])}) | "
                    f"{o['best_fixed_accuracy']:.3f} | {o['best_fixed_gen_tokens']:.1f} | "
                    f"{o['best_fixed_flops']:.3e} | {o['best_fixed_depth']:.2f} | "
                    f"{o['best_fixed_score']:.4f} |")
    if not rows:  # no held-out prompts and no cache (a token-level run, val_fraction 0)
        lines += ["No inference-time figures: this run held out no prompts (val_fraction 0). "
                  "Evaluate it with lm_eval (`--model_args controller=<this dir>`).", ""]
        return "\n".join(lines)
    lines += ["Inference-time choices (halt at the first phi <= tau)"
              + (" at every token" if token else " on cached outcomes") + ":", "",
              "| prompts | accuracy | gen tokens | FLOPs | mean depth | score |",
              "|---|---|---|---|---|---|", *rows,
              "", f"Score: {score_words(cfg)} These are training-split outcomes, not "
              "benchmark results: see docs/results/index.md for lm-eval runs on test splits.",
              ""]
    return "\n".join(lines)
