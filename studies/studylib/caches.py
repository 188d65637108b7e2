"""The two pondering forms and the rollout caches ``headroom.py`` builds, which
``adaptation.py`` trains on and ``testset.py`` reads its forms' settings from: one definition,
so that a cache's directory and its trainer config cannot drift apart between scripts."""

from __future__ import annotations

import argparse
from pathlib import Path

# Forms: ``ours`` starts at alpha_start=-0.2 and ponders toward "deliberate" (the shipped
# defaults); ``paper`` starts unsteered (alpha_start=0), as FR-Ponder's appendix does.
FORMS = {"ours": -0.2, "paper": 0.0}
PROMPTS = {"arith_ponder": 400, "gsm8k_ponder": 200}


def train_config(form: str, samples: int, max_tokens: int, batch_size: int,
                 dtype: str | None = None):
    """The trainer's config a cache of ``form`` is built with (and its key identifies)."""
    from lm_eval_ponder.training.config import TrainConfig

    cfg = TrainConfig(output="unused", dtype=dtype)
    cfg.ponder.alpha_start = FORMS[form]
    cfg.rollout.prompts = dict(PROMPTS)
    cfg.rollout.samples = samples
    cfg.rollout.max_completion_length = max_tokens
    cfg.rollout.batch_size = batch_size
    return cfg.validate()


def cache_dir(root: str, form: str, samples: int) -> Path:
    return Path(root) / f"{form}-{'greedy' if samples == 1 else f's{samples}'}"


def cache_arguments(parser: argparse.ArgumentParser) -> None:
    """Which cache: form, samples per (prompt, depth), root folder (shared with adaptation.py)."""
    parser.add_argument("--form", choices=sorted(FORMS), default="ours")
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--root", default="results/headroom", help="where the caches live")
