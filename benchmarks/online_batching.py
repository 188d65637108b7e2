"""Token-level training: one generation for a step's P x G rows against P calls of G rows.

    LM_EVAL_PONDER_DATA=../shared/data python benchmarks/online_batching.py --pairs 3

One process, the embedded backbone and vector, a freshly initialised controller (it ponders
about K_max steps per token: the expensive end), teacher-free sampled halting as in stage 3.
Each pair runs (a) ``OnlineEnvironment.rollout`` once per prompt, as the trainer did before,
and (b) once for all prompts, which ``GRPOTrainer.step`` does now; the order alternates.
Prints every run and the median wall ratio (a)/(b).
"""

from __future__ import annotations

import argparse
import statistics
import time


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--prompts", type=int, default=8, help="P, the paper's prompts per step")
    p.add_argument("--group", type=int, default=8, help="G, the paper's answers per prompt")
    p.add_argument("--max-tokens", type=int, default=64)
    args = p.parse_args()

    import torch

    from lm_eval_ponder.pondering.controller import PonderController
    from lm_eval_ponder.pondering.dynamics import TokenPolicy, cumulative_offsets
    from lm_eval_ponder.training.config import TrainConfig
    from lm_eval_ponder.training.grpo import GRPOTrainer
    from lm_eval_ponder.training.loop import load_backbone
    from lm_eval_ponder.training.online import OnlineEnvironment

    torch.set_num_threads(2)
    cfg = TrainConfig(output="unused")
    cfg.ponder.granularity = "token"
    cfg.rollout.prompts = {"arith_ponder": args.prompts}
    cfg.rollout.max_completion_length = args.max_tokens
    cfg.validate()
    offsets = cumulative_offsets(cfg.ponder)
    lm = load_backbone(cfg)
    torch.manual_seed(0)
    ctrl = PonderController(lm.model.config.hidden_size, cfg.controller_hidden)
    trainer = GRPOTrainer(ctrl, lm.steer_scale * lm.steer_vector, offsets, cfg.ponder.tau,
                          cfg.grpo, seed=0)
    env = OnlineEnvironment(lm, cfg, ctrl)
    ids, G = list(range(len(env.prompts))), args.group

    def policy(rows: int) -> TokenPolicy:
        return trainer.token_policy(torch.zeros(rows, dtype=torch.bool),
                                    torch.zeros(rows, dtype=torch.long),
                                    generator=torch.Generator().manual_seed(1))

    def per_prompt() -> int:
        return sum(r["gen_tokens"] for i in ids for r in env.rollout([i], G, policy(G))[0])

    def one_call() -> int:
        return sum(r["gen_tokens"] for r in env.rollout(ids, G, policy(len(ids) * G))[0])

    ratios = []
    for pair in range(args.pairs):
        walls = {}
        for name, fn in (("per_prompt", per_prompt), ("one_call", one_call))[:: 1 if pair % 2 == 0 else -1]:
            t0 = time.perf_counter()
            tokens = fn()
            walls[name] = time.perf_counter() - t0
            print(f"pair {pair} {name}: {walls[name]:.1f} s, {tokens} tokens", flush=True)
        ratios.append(walls["per_prompt"] / walls["one_call"])
    print(f"P={len(ids)} G={G} max_tokens={args.max_tokens}: per-prompt/one-call wall ratio "
          f"median {statistics.median(ratios):.2f} (pairs {', '.join(f'{r:.2f}' for r in ratios)})")


if __name__ == "__main__":
    main()
