"""Runs of one configuration with several seeds: one row, the mean over seeds, and an interval
that counts both sources of variation.

Under the paper's protocol every method samples (T = 0.7), so one seed is one draw of the
answers: a row must show the configuration, not the luck of a seed. A question's outcome is
averaged over the seeds that answered it (all of them: questions some seed lacks are left out,
so every seed weighs the same), and the 95% interval is a percentile bootstrap over questions
of those per-question means: resampling questions keeps each question's seeds together, so the
interval covers the spread of questions and, through each mean, that of seeds. It is
deterministic (a fixed generator), so a report rebuilds to the same metrics.
"""

from __future__ import annotations

import hashlib
import math

# the sampling seed lm-eval records in a results JSON's ``config`` (``--seed``), in the order
# that names the one torch sampling reads
SEED_KEYS = ("torch_seed", "random_seed")
BOOTSTRAP_ITERS = 2000
BOOTSTRAP_SEED = 0
# per-question metrics averaged over seeds; everything else comes from the first seed
MEANS = ("exact_match", "gen_tokens", "flops", "ponder_steps")


def run_seed(results: dict) -> int | None:
    """The sampling seed of one lm-eval run (None: not recorded)."""
    config = results.get("config") or {}
    for key in SEED_KEYS:
        if isinstance(config.get(key), int):
            return int(config[key])
    return None


def merge_seeds(by_seed: dict[int | None, list[dict]]) -> list[dict]:
    """One sample per question answered under every seed: ``MEANS`` averaged, ``n_seeds`` set,
    the rest (document, answers) from the lowest seed; the answers digest covers all seeds."""
    seeds = sorted(by_seed, key=lambda s: (s is None, s))
    indexed = [{s["doc_id"]: s for s in by_seed[seed]} for seed in seeds]
    common = set.intersection(*(set(i) for i in indexed))
    out = []
    for doc_id in sorted(common):
        rows = [i[doc_id] for i in indexed]
        merged = dict(rows[0])
        for key in MEANS:
            values = [float(r[key]) for r in rows if r.get(key) is not None]
            if values:
                merged[key] = sum(values) / len(values)
        merged["n_seeds"] = len(rows)
        merged["resps_sha256"] = hashlib.sha256("".join(
            str(r.get("resps_sha256") or r.get("resps")) for r in rows).encode()).hexdigest()
        out.append(merged)
    return out


def bootstrap_interval(values: list[float], confidence: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of ``values`` (one per question)."""
    import numpy as np

    if not values:
        return math.nan, math.nan
    data = np.asarray(values, dtype=float)
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    means = data[rng.integers(0, len(data), size=(BOOTSTRAP_ITERS, len(data)))].mean(axis=1)
    tail = (1 - confidence) / 2
    return float(np.quantile(means, tail)), float(np.quantile(means, 1 - tail))
