"""Training cost at a backbone's scale (issue 54): one prompt-level rollout-cache block and one
token-level GRPO step, on a randomly initialised backbone shape, answer lengths replayed.

- **Prompt level** (the paper's training, ``training.rollouts``): the rollout cache holds each
  training prompt's answer at every depth (K_max + 1 fixed offsets). A block is one generation
  call of prompts x depths rows, each steered at its depth's offset (``SteeringHook`` over
  ``RowOffsets``, as ``OffsetsPerRow`` sets it up for ``SteeredGenerator.generate_texts``), then the
  perplexity pass of the quality reward (``rollouts.token_perplexities``). At the defaults (64 training
  prompts, 9 depths, greedy) the whole cache is one block of 576 rows on a GPU. Training on a
  built cache only looks outcomes up (milliseconds a step), so the block is the cost.
- **Token level** (``--ponder.granularity token``, ``training.online``): one
  ``GRPOTrainer.step`` in the curriculum's last stage: P x G rows decoded with the controller
  deciding at every token (``TokenPolicy`` in a token-mode ``SteeringHook``), the perplexity
  pass, the rewards and the update. The default run is 2,500 such steps.

Rows replay recorded answer lengths (``lib.replay``: the committed greedy Direct answers);
prompts and answers are random tokens, so the work pattern is real and the text is not: the
grading and the text features of the reward see placeholder text (host work that is small
beside the generation). The loop is batched as ``--model ponder`` batches on that device
(``generation.batching``).

    python benchmarks/train_cost.py --shape qwen2.5-0.5b --device cpu       # small, ~5 min
    python benchmarks/train_cost.py --shape qwen2.5-7b --device cuda --lengths gsm8k
    python benchmarks/train_cost.py --shape tiny --prompts 2 --token-prompts 2 --generations 2 \\
        --max-new-tokens 8                                                   # a test

``--out FILE`` writes the figures as JSON. Last line: ``train_cost block_s X step_s Y``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from lib.decoding import add_device_args, device_defaults, torch_setup
from lib.replay import (
    Memory,
    add_replay_args,
    batch_of,
    build_model,
    order_of,
    recorded_lengths,
    shape_config,
)

CPU_DEFAULTS = {"prompts": 4, "max_new_tokens": 64, "token_prompts": 2, "generations": 4}
# the trainer's defaults: RolloutConfig (64 prompts, 256 new tokens), GRPOConfig (P=8, G=8)
GPU_DEFAULTS = {"prompts": 64, "max_new_tokens": 256, "token_prompts": 8, "generations": 8}


def steering_parts(model, seed: int):
    """(layer, unit vector) of a random steering direction at the default steering layer: the
    cost of steering does not depend on which direction it is."""
    import torch

    from lm_eval_ponder.backbone import decoder_layers
    from lm_eval_ponder.steering.vector import default_layer

    gen = torch.Generator().manual_seed(seed)
    vector = torch.randn(model.config.hidden_size, generator=gen)
    return default_layer(len(decoder_layers(model))), vector / vector.norm()


def answer_rows(ids, mask, result, limits) -> list[list[int]]:
    """Each row's prompt and answer tokens, as the perplexity pass reads them."""
    width = ids.shape[1]
    rows = []
    for i, n in enumerate(limits):
        prompt = ids[i][mask[i].bool()].tolist()
        rows.append(prompt + result.sequences[i, width : width + n].tolist())
    return rows


def generate(model, rows: list[tuple[int, int]], hook, loop_config, seed: int):
    """One generation call of ``rows`` (prompt, answer length) with ``hook`` steering it, then
    the perplexity pass. Returns (seconds generating, seconds scoring, order, batch limits)."""
    import torch

    from lm_eval_ponder.engine import generate_rows
    from lm_eval_ponder.training.rollouts import token_perplexities

    ids, mask, limits = batch_of(rows, model.config.vocab_size, str(model.device), seed)
    hook.expect_rows(len(limits))
    start = time.perf_counter()
    with hook, torch.no_grad():
        result = generate_rows(model, ids, mask, max_new_tokens=limits, eos_token_ids=set(),
                               pad_token_id=0, config=loop_config, observers=[hook])
    sync(model)
    gen_s = time.perf_counter() - start
    if list(result.gen_tokens) != list(limits):
        raise RuntimeError("train_cost: the loop did not replay the recorded lengths")
    start = time.perf_counter()
    token_perplexities(model, answer_rows(ids, mask, result, limits), limits, 0, model.device)
    sync(model)
    return gen_s, time.perf_counter() - start, order_of(rows), limits


def sync(model) -> None:
    import torch

    if model.device.type == "cuda":
        torch.cuda.synchronize()


def rollout_block(model, lengths, layer, vector, loop_config, seed: int) -> dict:
    """One prompt-level rollout-cache block: every prompt at every depth's offset."""
    from lm_eval_ponder.pondering.dynamics import PonderConfig, RowOffsets, cumulative_offsets
    from lm_eval_ponder.pondering.hook import SteeringHook

    offsets = cumulative_offsets(PonderConfig()).tolist()
    rows = [length for length in lengths for _ in offsets]
    depth_of = [k for _ in lengths for k in range(len(offsets))]
    order = order_of(rows)
    decide = RowOffsets([offsets[depth_of[i]] for i in order], model.device)
    hook = SteeringHook(model, layer, vector.to(model.device), 1.0, decide, mode="prompt")
    with Memory(str(model.device)) as memory:
        gen_s, ppl_s, _, limits = generate(model, rows, hook, loop_config, seed)
    return {"rows": len(rows), "depths": len(offsets), "useful": sum(limits), "gen_s": gen_s,
            "ppl_s": ppl_s, "wall_s": gen_s + ppl_s, "peak_gib": memory.gib}


class ReplayEnvironment:
    """``GRPOTrainer.step``'s token-level environment (``training.online.OnlineEnvironment``'s
    interface) on replayed lengths: the generation, the perplexity pass and the rewards are
    real; the text is a placeholder and correctness a seeded coin."""

    granularity = "token"

    def __init__(self, model, lengths, layer, vector, loop_config, controller, seed: int):
        from lm_eval_ponder.flops import FlopsSpec
        from lm_eval_ponder.training.environment import RewardBook
        from lm_eval_ponder.training.rewards import RewardConfig

        self.model, self.lengths, self.loop_config = model, lengths, loop_config
        self.layer, self.vector, self.controller, self.seed = layer, vector, controller, seed
        self.rewards = RewardBook(RewardConfig())
        self.spec = FlopsSpec.from_config(model.config)
        self.timing: dict[str, float] = {}

    def decision_sampler(self, t: int):
        import torch

        return torch.Generator().manual_seed(self.seed * 1_000_003 + t)

    def rollout(self, ids: list[int], group: int, policy):
        import random

        from lm_eval_ponder.flops import generation_flops
        from lm_eval_ponder.pondering.hook import SteeringHook

        rows = [self.lengths[i] for i in ids for _ in range(group)]
        hook = SteeringHook(self.model, self.layer, self.vector.to(self.model.device), 1.0,
                            policy, mode="token")
        gen_s, ppl_s, order, limits = generate(self.model, rows, hook, self.loop_config,
                                               self.seed)
        self.timing = {"gen_s": gen_s, "ppl_s": ppl_s, "useful": sum(limits)}
        sorted_trajectories = policy.trajectories(limits, hook)
        trajectories = [None] * len(rows)
        for batch_row, row in enumerate(order):
            trajectories[row] = sorted_trajectories[batch_row]
        coin = random.Random(self.seed)
        k = len(policy.offsets)
        records = [{"key": str(i), "task": "replay", "level": None, "gen_tokens": n,
                    "text": "step " * n, "prompt_tokens": p, "correct": coin.random() < 0.5,
                    "pred": None, "rel_error": None, "ppl": 2.0 + coin.random(),
                    "flops": float(generation_flops(self.spec, p, n, 1)
                                   + self.controller.evaluation_flops(k * n))}
                   for i, (p, n) in enumerate(rows)]
        return records, trajectories


def token_step(model, lengths, generations: int, layer, vector, loop_config, seed: int) -> dict:
    """One token-level GRPO step (stage 3: the student samples every decision)."""
    import torch

    from lm_eval_ponder.pondering.controller import PonderController
    from lm_eval_ponder.pondering.dynamics import PonderConfig, cumulative_offsets
    from lm_eval_ponder.training.grpo import GRPOConfig, GRPOTrainer

    cfg = GRPOConfig(prompts_per_step=len(lengths), num_generations=generations)
    ponder = PonderConfig()
    torch.manual_seed(seed)
    controller = PonderController(model.config.hidden_size)
    env = ReplayEnvironment(model, lengths, layer, vector, loop_config, controller, seed)
    trainer = GRPOTrainer(controller, vector, cumulative_offsets(ponder), ponder.tau, cfg, seed,
                          rewards=env.rewards)
    with Memory(str(model.device)) as memory:
        start = time.perf_counter()
        result = trainer.step(cfg.t2, torch.arange(len(lengths)), env)
        wall = time.perf_counter() - start
    if not result.updated:
        raise RuntimeError("train_cost: the step did not update the controller")
    return {"rows": len(lengths) * cfg.num_generations, "useful": env.timing["useful"],
            "gen_s": env.timing["gen_s"], "ppl_s": env.timing["ppl_s"],
            "update_s": wall - env.timing["gen_s"] - env.timing["ppl_s"], "wall_s": wall,
            "peak_gib": memory.gib}


def parse(argv: list[str] | None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=None,
                        help="prompts of the rollout-cache block (x 9 depths rows)")
    parser.add_argument("--token-prompts", type=int, default=None, help="P of a token step")
    parser.add_argument("--generations", type=int, default=None, help="G of a token step")
    add_replay_args(parser)
    add_device_args(parser)
    args = parser.parse_args(argv)
    device_defaults(args, CPU_DEFAULTS, GPU_DEFAULTS)
    if min(args.prompts, args.token_prompts, args.generations, args.max_new_tokens) < 1:
        sys.exit("train_cost: --prompts, --token-prompts, --generations and --max-new-tokens "
                 "must be >= 1")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse(argv)
    import torch

    from lm_eval_ponder import backbone as bb
    from lm_eval_ponder.backbone import weight_bytes
    from lm_eval_ponder.generation.batching import Batching
    from lm_eval_ponder.training.grpo import GRPOConfig

    dtype = torch_setup(args)
    config, name = shape_config(args.shape)
    lengths = recorded_lengths(args.lengths, max(args.prompts, args.token_prompts),
                               args.max_new_tokens)
    model = build_model(config, args.device, dtype, args.seed)
    batching = Batching(args.max_rows, None, args.device)
    batching.fit(config, dtype, weight_bytes(model))
    loop_config = batching.loop_config()
    layer, vector = steering_parts(model, args.seed)
    params = sum(p.numel() for p in model.parameters())
    print(f"# {bb.device_description(args.device)}, {dtype}, threads {torch.get_num_threads()}, "
          f"shape {name} ({params / 1e9:.2f}B parameters, random), {args.lengths} answer "
          f"lengths replayed (capped at {args.max_new_tokens}), loop max_rows "
          f"{loop_config.max_rows}", flush=True)
    rollout_block(model, lengths[:1], layer, vector, loop_config, args.seed)  # warm-up
    block = rollout_block(model, lengths[: args.prompts], layer, vector, loop_config, args.seed)
    print(f"rollout-cache block: {args.prompts} prompts x {block['depths']} depths = "
          f"{block['rows']} rows, {block['useful']} tokens: generation {block['gen_s']:.2f} s, "
          f"perplexities {block['ppl_s']:.2f} s, {block['useful'] / block['wall_s']:.1f} "
          f"tok/s, peak {block['peak_gib']:.2f} GiB", flush=True)
    grpo = GRPOConfig()
    step = token_step(model, lengths[: args.token_prompts], args.generations, layer, vector,
                      loop_config, args.seed)
    hours = step["wall_s"] * grpo.max_steps / 3600
    print(f"token-level GRPO step: P={args.token_prompts} x G={args.generations} = "
          f"{step['rows']} rows, {step['useful']} tokens: generation {step['gen_s']:.2f} s, "
          f"perplexities {step['ppl_s']:.2f} s, rewards and update {step['update_s']:.2f} s; "
          f"{grpo.max_steps} steps at this size: {hours:.1f} h", flush=True)
    record = {"shape": name, "device": args.device, "dtype": str(dtype),
              "lengths": args.lengths, "max_new_tokens": args.max_new_tokens,
              "loop_max_rows": loop_config.max_rows, "block": block, "token_step": step,
              "token_steps": grpo.max_steps, "token_level_hours": hours}
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
    print(f"train_cost block_s {block['wall_s']:.3f} step_s {step['wall_s']:.3f}")
    return record


if __name__ == "__main__":
    main()
