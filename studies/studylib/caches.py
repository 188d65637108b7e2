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


def cache_matrices(directory: Path, keys: list[str], k_max: int):
    """[prompt, depth] mean accuracy and tokens over the cache's samples, in ``keys`` order,
    from its outcome files alone (no z_0: ``per_type.py`` and ``adaptation.py comparators``
    run on the committed records of a fresh clone)."""
    import numpy as np

    from lm_eval_ponder.training.rollouts import read_outcomes

    index = {k: i for i, k in enumerate(keys)}
    acc, tok, n = (np.zeros((len(keys), k_max + 1)) for _ in range(3))
    for part in sorted(directory.glob("rollouts.*.outcomes.json.xz")):
        for r in read_outcomes(part):
            i = index.get(r["key"])
            if i is not None:
                acc[i, r["depth"]] += float(r["correct"])
                tok[i, r["depth"]] += float(r["gen_tokens"])
                n[i, r["depth"]] += 1
    if (n == 0).any():
        from lm_eval_ponder.errors import PonderError

        raise PonderError(f"{directory}: {int((n == 0).sum())} (prompt, depth) cells have no "
                          "outcome; is the cache complete?")
    return acc / n, tok / n
