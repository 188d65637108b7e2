"""The paper's multi-component reward, one function per equation (Section "Multi-Component
Reward Engineering"):

    R = w_acc R_acc + w_flops R_flops + w_comp R_comp + w_qual R_qual + w_rep R_rep

Choices where the paper is silent or inconsistent (docs/design/training.md, "Reward"): every
weight is applied once, in ``total_reward`` (the component functions are unweighted); the
perplexity factor of R_qual is capped at 1 (the convergence theorem assumes bounded rewards);
only w_flops adapts (Theorem 6), toward ``balance_ratio`` x mean |R_acc|, the middle of the
paper's validated band 0.1 <= E|R_flops| / E[R_acc] <= 1, since all five at one magnitude would
make the pattern-matched heuristics (stages: ``STAGE_PATTERNS``) weigh as much as correctness.

The two text-based components read an answer through a few numbers only (``text_features``:
which stages it shows, its whitespace words, its repeated n-grams), so a rollout cache kept
without its texts (``rollouts.py``) keeps those and scores exactly as with the text, for any
stage weights and betas; ``TEXT_FEATURES`` names the patterns they were taken with.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass

from lm_eval_ponder.errors import PonderError
from lm_eval_ponder.typed import check_choice, option

COMPONENTS = ("acc", "flops", "comp", "qual", "rep")
# What a run optimises: "priced" (ours, the default): accuracy minus a user-set price per 1,000
# generated tokens, the same ruler at every step; "paper": the composite reward above, whose
# FLOPs term is a z-score against the policy's own running spread (so the price of a FLOP is set
# by the policy, not the user) and whose weights adapt (docs/design/training.md, "Objective").
OBJECTIVES = ("priced", "paper")

# Reasoning stages for R_comp, detected case-insensitively. Deliberately simple and listed here
# so that a reader can see exactly what is rewarded.
STAGE_PATTERNS: dict[str, str] = {
    "setup": r"\b(given|let|we (need|have|know|are asked)|first|the problem)\b",
    "computation": r"\d\s*[-+*/×x÷]\s*\d|=\s*-?\d",
    "verification": r"\b(check|verif(y|ied|ying)|indeed|double-check|confirm|substitut)",
    "conclusion": r"(\bthe (final )?answer is\b|\btherefore\b|\bthus\b|\bso,? the\b|\\boxed)",
}
# n of the repeated n-grams R_rep counts (one beta each)
REPEAT_ORDERS = (1, 2, 3)
# What a text's features were taken with: features kept under another value are stale.
TEXT_FEATURES = hashlib.sha256(json.dumps(
    [STAGE_PATTERNS, REPEAT_ORDERS, "re.IGNORECASE", "str.split"]).encode()).hexdigest()[:12]


@dataclass
class RewardConfig:
    """Reward hyper-parameters (the paper gives the forms, not the values: ours are stated)."""

    objective: str = option("priced", (
        "'priced': accuracy minus price_per_1k_tokens per 1,000 generated tokens (stationary, "
        "the user's price) | 'paper': the composite reward of the keys below, with its "
        "running FLOPs z-score and adaptive weights"))
    price_per_1k_tokens: float = option(1.0, (
        "the 'priced' objective's price of 1,000 generated tokens, in units of one correct "
        "answer (1.0: a right answer is worth 1,000 tokens)"))
    w_exact: float = option(1.0, "R_acc for an exact match")
    w_partial: float = option(0.5, "scale of partial credit")
    theta_tol: float = option(0.1, "partial credit only under this relative error")
    eps: float = option(1e-8, "denominator guard")
    lambda_flops: float = option(0.1, "strength of the FLOPs penalty (per standard deviation)")
    ema_momentum: float = option(0.99, "running FLOPs mean/std of eq. flops_reward")
    flops_std_floor: float = option(0.01, "the FLOPs std is at least this fraction of the mean")
    stage_weights: dict[str, float] = option(lambda: {
        "setup": 0.25, "computation": 0.25, "verification": 0.25, "conclusion": 0.25},
        "R_comp weight of each stage in STAGE_PATTERNS")
    len_target: int = option(64, "tokens; shorter outputs get proportionally less R_qual")
    ppl_baseline: float | None = option(None, "None: median PPL of the cache's correct answers")
    sigma_ppl: float | None = option(None, "None: interquartile range of those PPLs")
    rep_betas: tuple[float, float, float] = option((0.02, 0.05, 0.1), "beta_1 < beta_2 < beta_3")
    weights: dict[str, float] = option(lambda: {
        "acc": 1.0, "flops": 1.0, "comp": 0.05, "qual": 0.05, "rep": 1.0},
        "w_i of R = sum_i w_i R_i (initial values; balance adapts some)")
    balance: tuple[str, ...] = option(("flops",), "which weights adapt (Theorem 6 update)")
    balance_ratio: float = option(0.3, "target mean|R_flops| / mean|R_acc|")
    balance_eta: float = option(0.05, "step of the weight update")
    balance_every: int = option(10, "steps between weight updates")

    def validate(self) -> RewardConfig:
        check_choice("reward.objective", self.objective, OBJECTIVES)
        if not (math.isfinite(self.price_per_1k_tokens) and self.price_per_1k_tokens >= 0):
            raise PonderError(f"reward.price_per_1k_tokens must be a number >= 0, got "
                              f"{self.price_per_1k_tokens}")
        if not (self.rep_betas[0] <= self.rep_betas[1] <= self.rep_betas[2]):
            raise PonderError(f"rep_betas must satisfy beta_1 <= beta_2 <= beta_3, got "
                              f"{self.rep_betas}")
        if not 0 < self.ema_momentum < 1:
            raise PonderError(f"ema_momentum must be in (0, 1), got {self.ema_momentum}")
        unknown = set(self.weights) - set(COMPONENTS) | set(self.balance) - set(COMPONENTS)
        if unknown:
            raise PonderError(f"unknown reward components {sorted(unknown)}; "
                              f"known: {COMPONENTS}")
        return self


def accuracy_reward(correct: bool, rel_error: float | None, cfg: RewardConfig) -> float:
    """Graduated accuracy, eq. (accuracy_reward).

    w_exact on an exact match; w_partial exp(-|y_hat - y| / (|y| + eps)) when the relative
    error is under theta_tol (numeric answers only: ``rel_error`` is None otherwise); else 0.
    """
    if correct:
        return cfg.w_exact
    if rel_error is not None and math.isfinite(rel_error) and rel_error < cfg.theta_tol:
        return cfg.w_partial * math.exp(-rel_error)
    return 0.0


def flops_reward(flops: float, mean_hist: float, std_hist: float, cfg: RewardConfig) -> float:
    """Efficiency, eq. (flops_reward): -lambda_flops (F - mean_hist) / (std_hist + eps).

    The standard deviation is floored at ``flops_std_floor`` x |mean_hist|, so a near-constant
    history cannot turn a small FLOPs difference into an enormous penalty.
    """
    std = max(std_hist, cfg.flops_std_floor * abs(mean_hist))
    return -cfg.lambda_flops * (flops - mean_hist) / (std + cfg.eps)


def text_features(text: str) -> dict:
    """All that R_comp and R_rep read of an answer: the stages it shows, its number of
    whitespace words and its repeated n-grams of each order in ``REPEAT_ORDERS``."""
    words = text.split()
    return {"stages": [stage for stage, pattern in STAGE_PATTERNS.items()
                       if re.search(pattern, text, flags=re.IGNORECASE)],
            "words": len(words), "repeated": [repeated_ngrams(words, n) for n in REPEAT_ORDERS]}


def record_features(record: dict) -> dict:
    """An outcome's text features: from its text, else the ones its cache kept."""
    return text_features(record["text"]) if "text" in record else record["text_features"]


def completeness_reward(text: str, cfg: RewardConfig) -> float:
    """Reasoning completeness, eq. (completeness_reward): sum of w_s over detected stages."""
    return completeness_of(text_features(text), cfg)


def completeness_of(features: dict, cfg: RewardConfig) -> float:
    """``completeness_reward`` from an answer's ``text_features``."""
    return sum(w for stage, w in cfg.stage_weights.items() if stage in features["stages"])


def quality_reward(n_tokens: int, ppl: float | None, ppl_baseline: float, sigma_ppl: float,
                   cfg: RewardConfig) -> float:
    """Output quality, eq. (quality_reward), unweighted and in [0, 1]:
    min(1, len / len_target) * min(1, exp(-(PPL - PPL_base) / sigma_PPL)). 0 for no output."""
    if n_tokens <= 0 or ppl is None or not math.isfinite(ppl):
        return 0.0
    length = min(1.0, n_tokens / cfg.len_target)
    exponent = -(ppl - ppl_baseline) / max(sigma_ppl, cfg.eps)
    fluency = math.exp(min(0.0, exponent))  # capped at 1 (see module docstring)
    return length * fluency


def repeated_ngrams(words: list[str], n: int) -> int:
    """Occurrences of order-n n-grams beyond each one's first: |repeated_n(y)|."""
    grams = [tuple(words[i : i + n]) for i in range(len(words) - n + 1)]
    return len(grams) - len(set(grams))


def repetition_reward(text: str, cfg: RewardConfig) -> float:
    """Anti-repetition, eq. (antirepetition_reward): -sum_n beta_n |repeated_n| / |y|, n=1..3,
    over whitespace words."""
    return repetition_of(text_features(text), cfg)


def repetition_of(features: dict, cfg: RewardConfig) -> float:
    """``repetition_reward`` from an answer's ``text_features``."""
    if not features["words"]:
        return 0.0
    return -sum(beta * repeated / features["words"]
                for repeated, beta in zip(features["repeated"], cfg.rep_betas))


def priced_reward(correct: bool | float, gen_tokens: float, price_per_1k_tokens: float) -> float:
    """The stationary objective (ours, not the paper's): R = 1[correct] - price x tokens / 1000.

    One ruler for the whole run and for the card: the price of compute is the user's, stated in
    the config, where the paper's R_flops prices a FLOP by the policy's own running spread."""
    return float(correct) - price_per_1k_tokens * float(gen_tokens) / 1000.0


def total_reward(components: dict[str, float], weights: dict[str, float]) -> float:
    """R = sum_i w_i R_i (the paper's composite reward)."""
    return sum(weights.get(name, 0.0) * value for name, value in components.items())


def balance_targets(mean_abs: dict[str, float], cfg: RewardConfig) -> dict[str, float]:
    """Target magnitudes of the adapting weights: ``balance_ratio`` x mean |w_acc R_acc| (no
    target, hence no change, before any accuracy reward has been seen)."""
    acc = mean_abs.get("acc", 0.0)
    return {k: cfg.balance_ratio * acc for k in cfg.balance if acc > 0}


def balance_weights(weights: dict[str, float], mean_abs: dict[str, float],
                    targets: dict[str, float], eta: float) -> dict[str, float]:
    """Adaptive weight balancing (Theorem 6): w_i <- w_i exp(eta (log R_target,i - log mean|R_i|)).

    ``mean_abs`` holds mean |w_i R_i| (the weighted magnitude); components without a target, or
    with a zero magnitude (nothing to scale), keep their weight.
    """
    out = dict(weights)
    for name, target in targets.items():
        magnitude = mean_abs.get(name, 0.0)
        if magnitude > 0 and target > 0:
            out[name] = weights[name] * math.exp(eta * (math.log(target) - math.log(magnitude)))
    return out


class RunningStats:
    """Exponential moving mean and standard deviation (the 'history' of eq. flops_reward).

    Initialised from the first batch it sees, so the first penalties are not measured against
    zero.
    """

    def __init__(self, momentum: float) -> None:
        self.momentum = momentum
        self.mean: float | None = None
        self.var: float = 0.0

    def update(self, values: list[float]) -> None:
        if not values:
            return
        m = sum(values) / len(values)
        v = sum((x - m) ** 2 for x in values) / len(values)
        if self.mean is None:
            self.mean, self.var = m, v
            return
        a = self.momentum
        delta = m - self.mean
        self.mean = a * self.mean + (1 - a) * m
        self.var = a * self.var + (1 - a) * (v + a * delta * delta)

    @property
    def std(self) -> float:
        return math.sqrt(max(self.var, 0.0))

    def state(self) -> dict[str, float | None]:
        return {"mean": self.mean, "var": self.var}

    def load(self, state: dict) -> None:
        self.mean, self.var = state["mean"], float(state["var"])


def quality_reference(ppls: list[float]) -> tuple[float, float]:
    """(PPL_baseline, sigma_PPL) from reference perplexities: median and interquartile range."""
    finite = sorted(p for p in ppls if p is not None and math.isfinite(p))
    if not finite:
        return 1.0, 1.0
    def q(f: float) -> float:
        return finite[min(len(finite) - 1, int(f * (len(finite) - 1) + 0.5))]
    return q(0.5), max(q(0.75) - q(0.25), 1e-3)


def reward_components(record: dict, flops: float, stats: RunningStats, ppl_ref: tuple[float, float],
                      cfg: RewardConfig) -> dict[str, float]:
    """All five unweighted components of one outcome (a rollout-cache record)."""
    mean = stats.mean if stats.mean is not None else flops
    context = RewardContext(record, flops, mean, stats.std, ppl_ref, cfg)
    return {name: fn(context) for name, fn in REWARD_FUNCTIONS}


@dataclass
class RewardContext:
    """What the reward components of one outcome read: the record, its FLOPs, the FLOPs
    history, the perplexity reference and the config."""

    record: dict
    flops: float
    flops_mean: float
    flops_std: float
    ppl_ref: tuple[float, float]
    cfg: RewardConfig

    @functools.cached_property
    def features(self) -> dict:
        """The record's text features, taken once for both text-based components."""
        return record_features(self.record)


# The reward as a list of named functions (TRL's ``reward_funcs`` shape): each component is
# computed, logged (``R_<name>`` in train_log.jsonl) and weighted under its name.
REWARD_FUNCTIONS: list[tuple[str, Callable[[RewardContext], float]]] = [
    ("acc", lambda c: accuracy_reward(c.record["correct"], c.record.get("rel_error"), c.cfg)),
    ("flops", lambda c: flops_reward(c.flops, c.flops_mean, c.flops_std, c.cfg)),
    ("comp", lambda c: completeness_of(c.features, c.cfg)),
    ("qual", lambda c: quality_reward(c.record["gen_tokens"], c.record.get("ppl"), *c.ppl_ref,
                                      c.cfg)),
    ("rep", lambda c: repetition_of(c.features, c.cfg)),
]
assert tuple(name for name, _ in REWARD_FUNCTIONS) == COMPONENTS
