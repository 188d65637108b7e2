"""What a training run has to show for itself: the line a finished run prints, and where an
interrupted one stopped.

Both read the run's files (``config.json``, ``checkpoint.safetensors``, the rollout cache), not
the trainer's memory: what is on disk is exactly what a re-run of the same command resumes
from, so that is what the user is told.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from lm_eval_ponder.files import read_json
from lm_eval_ponder.flops import readable_flops
from lm_eval_ponder.generation.progress import duration
from lm_eval_ponder.training import checkpoint as ckpt
from lm_eval_ponder.training.config import TrainConfig
from lm_eval_ponder.training.rollouts import MANIFEST, RolloutCache


def resume_command(argv: list[str]) -> str:
    """The command that resumes this run, with this interpreter's full path: a bare ``python``
    fails in a shell where the virtual environment is not activated."""
    return shlex.join([sys.executable or "python", "-m", "lm_eval_ponder.train", *argv])


def summary_line(out: Path, wall_s: float) -> str:
    """One line at the end of ``train``: where the controller is, its held-out figures (the
    inference-time choices on held-out training prompts) and the wall time."""
    config = read_json(out / "config.json")
    figures, cost, data = config.get("figures", {}), config.get("cost", {}), config.get("data", {})
    val = figures.get("val") or {}
    if val:
        parts = [f"score {val['score']:.4f}"] if "score" in val else []
        parts += [f"accuracy {val['accuracy']:.3f}", f"{val['gen_tokens']:.1f} tokens",
                  readable_flops(val["flops"]), f"mean depth {val['depth']:.2f}"]
        held = f"held-out ({data.get('n_val', '?')} prompts): " + ", ".join(parts)
    else:
        held = "no held-out prompts (val_fraction 0): evaluate it with lm_eval"
    phases = [f"{name} {duration(cost[key])}" for key, name in
              (("cache_wall_s", "rollout cache"), ("train_wall_s", "GRPO")) if key in cost]
    # GRPO's time counts every attempt of a resumed run; this process's wall only its own
    resumed = cost.get("train_wall_s", 0) + cost.get("cache_wall_s", 0) > wall_s + 1
    times = (f"wall {duration(wall_s)} in this run" + (
        f"; {', '.join(phases)} over all its attempts" if phases else "")) if resumed else (
        f"wall {duration(wall_s)}" + (f" ({', '.join(phases)})" if phases else ""))
    return (f"controller: {out} (controller.safetensors, config.json, card.md); {held}; "
            + times)


def stopped_at(cfg: TrainConfig) -> str:
    """Where an interrupted run stands on disk: its checkpoint's step, else how much of the
    rollout cache is built, else nothing kept yet."""
    out = Path(cfg.output)
    state = out / ckpt.FILE
    if state.is_file():
        step = ckpt.read_meta(state)["step"]
        return (f"GRPO stopped after its checkpoint at step {step} of {cfg.grpo.max_steps} "
                f"({state}; later steps run again)")
    cache_dir = Path(cfg.cache_dir) if cfg.cache_dir else out / "rollouts"
    if cfg.ponder.granularity != "token" and (cache_dir / MANIFEST).is_file():
        cache = RolloutCache(cache_dir)
        total = int(cache.manifest.get("n_prompts", 0)) * \
            (int(cache.manifest.get("k_max", cfg.ponder.k_max)) + 1) * cfg.rollout.samples
        return (f"rollout cache stopped at {len(cache.done()):,} of {total:,} answers, kept in "
                f"{cache_dir} (the block in flight runs again)")
    return f"stopped before anything was kept in {out}"


def interrupted_message(cfg: TrainConfig, argv: list[str]) -> str:
    return f"{stopped_at(cfg)}. Resume with: {resume_command(argv)}"
