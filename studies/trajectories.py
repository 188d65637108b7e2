"""The paper's per-problem pondering trajectories: a controller's continue probability at each
ponder step, for test problems of every difficulty level (issue 37).

For each problem, z_0 is the steering layer's output at the last prompt token (as the steering
hook hands it to the controller; ``training.rollouts.prompt_states``), the candidate states are
z_k = z_0 + c_k h (``pondering.dynamics.candidate_states``), and the controller gives
phi(z_k) for every k in one call (``pondering.dynamics.ponder``). The figure draws phi against
k, one line per problem coloured by level, with tau; the halting depth is the first k at which
the line reaches tau. No generation: a forward per prompt.

    python studies/trajectories.py --per-level 4 --out docs/figures
    python studies/trajectories.py --controller runs/x --per-level 4 --out docs/figures

Writes ``trajectories_<name>.png`` and ``.json`` (per problem: level, id, phi per step, depth).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--controller", default="auto",
                        help="controller directory (default: the one shipped for the backbone)")
    parser.add_argument("--per-level", type=int, default=4, help="test problems per level")
    parser.add_argument("--out", default="docs/figures")
    parser.add_argument("--name", default=None, help="file name part (default: controller's)")
    parser.add_argument("--device", default=None)
    args = parser.parse_args(argv)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import torch
    from lm_eval.tasks import TaskManager

    from lm_eval_ponder import data
    from lm_eval_ponder.evaluation.lm import PonderLM
    from lm_eval_ponder.pondering.dynamics import cumulative_offsets, ponder
    from lm_eval_ponder.reporting.images import save_figure
    from lm_eval_ponder.training.rollouts import prompt_states

    kwargs = {"controller": args.controller} if args.controller != "auto" else {}
    if args.device:
        kwargs["device"] = args.device
    lm = PonderLM(**kwargs)
    if lm.controller is None:
        raise SystemExit("this backbone has no controller: pass --controller DIR")
    task = TaskManager(include_defaults=False).load(["arith_ponder"])["tasks"]["arith_ponder"]
    docs = []
    for level in data.ARITH_LEVELS:
        docs += [d for d in data.arith_ladder("test", per_level=args.per_level)
                 if d["level"] == level][: args.per_level]
    contexts = [task.fewshot_context(d, 0, apply_chat_template=True,
                                     chat_template=lm.apply_chat_template) for d in docs]
    config = lm.ponder_config
    steering = lm.generator.require_steering()
    z0 = prompt_states(lm.generator, contexts, steering.layer).to(lm.device)
    offsets = cumulative_offsets(config).to(lm.device)
    step = (steering.scale * steering.vector).to(lm.device)
    with torch.no_grad():
        depth, phi = ponder(lm.controller, z0, step, offsets, config.tau)
    rows = [{"level": d["level"], "id": d["id"], "phi": [round(float(p), 4) for p in ph],
             "depth": int(k)} for d, ph, k in zip(docs, phi.cpu(), depth.cpu())]

    name = args.name or (Path(lm.ponder.controller_dir).name if lm.ponder.controller_dir
                         else "controller")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    # a linear panel (what tau cuts) and a log one (where probabilities far under tau still
    # differ between problems)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    cmap = plt.get_cmap("viridis", len(data.ARITH_LEVELS))
    floor = 1e-6
    for ax, log in zip(axes, (False, True)):
        seen = set()
        for r in rows:
            level = r["level"]
            ax.plot(range(len(r["phi"])), [max(p, floor) if log else p for p in r["phi"]],
                    "-o", ms=3, lw=0.9, color=cmap(data.ARITH_LEVELS.index(level)),
                    label=None if level in seen else f"level {level}")
            seen.add(level)
        ax.axhline(config.tau, color="black", ls="--", lw=0.8, label=f"tau = {config.tau:g}")
        ax.set(xlabel="ponder step k", ylabel="continue probability phi(z_k)")
        if log:
            ax.set_yscale("log")
            ax.set_ylim(floor, 1)
            ax.set_title(f"log scale (values under {floor:g} drawn at it)", fontsize=9)
        else:
            ax.set_ylim(0, 1)
            ax.set_title(f"pondering trajectories, {name}", fontsize=9)
    axes[1].legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    save_figure(fig, out / f"trajectories_{name}.png", dpi=110, bbox_inches="tight")
    depths = {}
    for r in rows:
        depths.setdefault(r["level"], []).append(r["depth"])
    summary = {"controller": name, "tau": config.tau, "k_max": config.k_max,
               "offsets": [round(float(c), 6) for c in offsets.cpu()],
               "depth_by_level": {str(k): v for k, v in sorted(depths.items())}, "rows": rows}
    (out / f"trajectories_{name}.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps({k: v for k, v in summary.items() if k != "rows"}))


if __name__ == "__main__":
    main()
