"""The trainer's positive control: a synthetic world with no language model, where the right
answer is known, trained on by the real trainer with whatever recipe the flags name.

    lm-eval-ponder train --control clean --output runs/control-clean      # a shipped world
    lm-eval-ponder train --control my-world.json --recipe paper --output runs/control-paper
    lm-eval-ponder train --control-from runs/smollm2/rollouts --output runs/control-mine

Why. A learning component is done when it passes a positive control with its shipped settings
and objective. A world plants what a controller should learn (each context's level is linearly
readable from its state z_0; per level, one answer mode pays more than the other) and what it
costs to learn it (per-context noise: a few Bernoulli draws per context and mode). It is written
as a rollout cache held in memory (``WorldCache``), so the trainer, the reward book and the
readout are exactly the ones a real run uses; only the backbone is missing.

A world (JSON; ``worlds/`` holds the shipped ones, ``world_from_cache`` makes one from a real
rollout cache's outcome table):

- ``contexts``, ``held_out``: how many contexts, and how many of them (the last) are never
  trained on; the levels are interleaved, so every level is in both parts;
- ``width``, ``state_norm``, ``separation``: z_0 in R^width is a common mean of norm
  ``state_norm``, plus its level's centroid, plus unit Gaussian noise per coordinate, the
  centroids placed so that neighbouring levels are ``separation`` noise standard deviations
  apart (4: a linear probe errs on about 2% of contexts); the step direction h is a random unit
  vector, scaled by ``state_norm`` as the real steering scale is the residual norm;
- ``modes``: which depths are which answer mode ({"direct": [0, 2], "steps": [3, 8]}: inclusive
  ranges that cover 0..K_max);
- ``levels``: per level and mode the accuracy and the mean generated tokens;
- ``features``: per mode what the reward book's text terms read of an answer (stages, words,
  repeated n-grams, perplexity), so the paper's completeness gate sees what real answers give;
- ``draws``: outcomes per (context, mode), each a Bernoulli draw of the accuracy (the rollout
  cache's ``samples``);
- ``price_per_1k_tokens``: the ruler every recipe is scored on, R = accuracy - price x tokens /
  1000 in expectation (a recipe whose own objective is the priced one trains on this price
  unless ``--reward.price_per_1k_tokens`` says otherwise);
- ``flops_per_token``, ``prompt_tokens``: what the FLOPs of an answer are (for R_flops);
- ``seed``: the world's draws (the trainer's seed is ``--seed``).

The report, on the held-out contexts and in the world's true expected reward (per level and
mode, not the draws): the fraction of contexts in their level's best mode, the reward of depth
0, of the best fixed depth (the best on the held-out truth: the strongest fixed competitor), of
the per-level oracle, of the trained controller, and the fraction of the oracle's gain over the
best fixed depth that the controller captures, with bootstrap intervals over held-out contexts.
Beside it the ceiling: the same controller fitted to the world's true expected rewards of the
training contexts (what the trainer could reach without per-context noise).
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from lm_eval_ponder.errors import PonderError
from lm_eval_ponder.training.config import WORLDS, config_dict, shipped_worlds
from lm_eval_ponder.training.rewards import TEXT_FEATURES
from lm_eval_ponder.training.rollouts import Prompt

TASK = "control"  # the task name of a world's contexts (their problem type is their level)
BOOTSTRAP = 2000


@dataclass
class World:
    """A synthetic landscape for the trainer (module docstring)."""

    name: str
    levels: dict[str, dict[str, dict[str, float]]]
    modes: dict[str, list[int]]
    features: dict[str, dict]
    contexts: int = 400
    held_out: int = 100
    width: int = 576
    state_norm: float = 160.0
    separation: float = 4.0
    draws: int = 1
    price_per_1k_tokens: float = 4.0
    flops_per_token: float = 2.7e8
    prompt_tokens: int = 60
    seed: int = 0
    about: str = ""

    @property
    def level_names(self) -> list[str]:
        return list(self.levels)

    @property
    def n_depths(self) -> int:
        return max(hi for _, hi in self.modes.values()) + 1

    def mode_of(self, depth: int) -> str:
        for mode, (lo, hi) in self.modes.items():
            if lo <= depth <= hi:
                return mode
        raise PonderError(f"world {self.name!r}: depth {depth} is in no mode")

    def truth(self, level: str, mode: str) -> float:
        """The true expected reward of a (level, mode): accuracy - price x tokens / 1000."""
        cell = self.levels[level][mode]
        return cell["accuracy"] - self.price_per_1k_tokens * cell["tokens"] / 1000.0

    def validate(self) -> World:
        where = f"world {self.name!r}"
        if not self.levels or not self.modes:
            raise PonderError(f"{where}: needs 'levels' and 'modes'")
        covered = sorted(d for lo, hi in self.modes.values() for d in range(lo, hi + 1))
        if covered != list(range(self.n_depths)):
            raise PonderError(f"{where}: 'modes' must cover depths 0..K once each, got "
                              f"{self.modes}")
        for level, cells in self.levels.items():
            for mode in self.modes:
                cell = cells.get(mode)
                if not cell or not 0 <= cell.get("accuracy", -1) <= 1 or cell.get("tokens", -1) < 0:
                    raise PonderError(f"{where}: level {level} needs, for mode {mode!r}, an "
                                      "accuracy in [0, 1] and tokens >= 0")
        if set(self.features) != set(self.modes):
            raise PonderError(f"{where}: 'features' must name each mode: {sorted(self.modes)}")
        if not 0 < self.held_out < self.contexts or self.draws < 1:
            raise PonderError(f"{where}: needs 0 < held_out < contexts and draws >= 1")
        if self.contexts - self.held_out < 2 * len(self.levels):
            raise PonderError(f"{where}: too few training contexts for {len(self.levels)} "
                              "levels")
        return self


def world_path(name: str) -> Path:
    """A world by file path, or by the name of a shipped one (``clean``, ``organism``, ...)."""
    path = Path(name)
    if path.suffix == ".json" or path.exists():
        if not path.is_file():
            raise PonderError(f"no world file {path}")
        return path
    candidate = WORLDS / f"{name}.json"
    if not candidate.is_file():
        raise PonderError(f"no world {name!r}: give a world file (.json) or one of "
                          f"{', '.join(shipped_worlds())}")
    return candidate


def load_world(name: str, **overrides) -> World:
    """A world from its file (or shipped name), with keys overridden (``contexts``, ``draws``:
    the CI test's small versions)."""
    path = world_path(name)
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise PonderError(f"cannot read world {path}: {error}") from None
    known = set(World.__dataclass_fields__)
    unknown = sorted(set(data) - known)
    if unknown:
        raise PonderError(f"world {path}: unknown keys {unknown}; the keys are {sorted(known)}")
    data.setdefault("name", path.stem)
    data.update({k: v for k, v in overrides.items() if v is not None})
    try:
        world = World(**data)
    except TypeError as error:
        raise PonderError(f"world {path}: {error}") from None
    return world.validate()


def world_from_cache(cache_dir: str, cfg) -> World:
    """A world with a real rollout cache's landscape: one mode per depth, per level (the
    prompts' problem types) and depth the cache's accuracy and mean tokens, per depth the
    answers' typical text features, as many contexts as the cache has prompts (a quarter
    held out), its samples as draws, priced at ``cfg``'s price. Written to
    ``<output>/world.json``, so the run can be repeated and the world edited."""
    from collections import Counter

    from lm_eval_ponder.training.rewards import record_features
    from lm_eval_ponder.training.rollouts import RolloutCache

    cache = RolloutCache(cache_dir)
    prompts, table = cache.prompts(), cache.table()
    k_max = int(cache.manifest.get("k_max", cfg.ponder.k_max))
    names = {p.key: (p.task if p.level is None else f"{p.task} level {p.level}") for p in prompts}
    levels: dict[str, dict] = {}
    features: dict[str, dict] = {}
    draws = min((len(table.get((p.key, k), [])) for p in prompts for k in range(k_max + 1)),
                default=0)
    if not draws:
        raise PonderError(f"rollout cache {cache_dir} is incomplete: finish it first (run the "
                          "trainer that builds it)")
    for k in range(k_max + 1):
        mode = f"d{k}"
        rows = [r for p in prompts for r in table[(p.key, k)]]
        feats = [record_features(r) for r in rows]
        stages = Counter(tuple(f["stages"]) for f in feats).most_common(1)[0][0]
        ppl = sorted(r["ppl"] for r in rows if r.get("ppl") is not None) or [2.0]
        features[mode] = {"stages": list(stages),
                          "words": round(statistics.mean(f["words"] for f in feats), 1),
                          "repeated": [round(statistics.mean(f["repeated"][n] for f in feats))
                                       for n in range(3)],
                          "ppl": ppl[len(ppl) // 2]}
        for name in sorted(set(names.values())):
            cell = [r for p in prompts if names[p.key] == name for r in table[(p.key, k)]]
            levels.setdefault(name, {})[mode] = {
                "accuracy": round(statistics.mean(float(r["correct"]) for r in cell), 4),
                "tokens": round(statistics.mean(r["gen_tokens"] for r in cell), 2)}
    states = cache.states()
    flops = statistics.mean(float(r["flops"]) / max(r["gen_tokens"], 1) for rows in table.values()
                            for r in rows)
    world = World(name=f"from-{Path(cache_dir).name}", levels=levels,
                  modes={f"d{k}": [k, k] for k in range(k_max + 1)}, features=features,
                  contexts=len(prompts), held_out=max(len(levels), len(prompts) // 4),
                  width=int(states.shape[1]), state_norm=float(states.norm(dim=1).mean()),
                  draws=draws, price_per_1k_tokens=cfg.reward.price_per_1k_tokens,
                  flops_per_token=flops, prompt_tokens=0,
                  about=f"made by --control-from {cache_dir}: its per-level, per-depth outcomes")
    world.validate()
    out = Path(cfg.output)
    out.mkdir(parents=True, exist_ok=True)
    (out / "world.json").write_text(json.dumps(asdict(world), indent=2) + "\n")
    return world


# ----------------------------------------------------------------------------- the world as a cache
@dataclass
class Realised:
    """A world drawn: its contexts as prompts, their states, the outcome table, the step
    direction, and which contexts are held out."""

    prompts: list[Prompt]
    z0: torch.Tensor
    table: dict[tuple[str, int], list[dict]]
    direction: torch.Tensor
    train: list[int]
    held_out: list[int]
    levels: list[str]  # each context's level


def realise(world: World) -> Realised:
    """Draw the world's contexts, states and outcomes (all from ``world.seed``)."""
    gen = torch.Generator().manual_seed(world.seed)
    d, names = world.width, world.level_names
    mean = torch.randn(d, generator=gen)
    mean = mean / mean.norm() * world.state_norm
    # centroids: independent random directions, so neighbouring ones are |c| sqrt(2) apart
    centroids = torch.randn(len(names), d, generator=gen)
    centroids = centroids / centroids.norm(dim=1, keepdim=True) * (world.separation / math.sqrt(2))
    direction = torch.randn(d, generator=gen)
    direction = direction / direction.norm()
    levels = [names[i % len(names)] for i in range(world.contexts)]
    index = {name: i for i, name in enumerate(names)}
    z0 = mean + centroids[[index[lv] for lv in levels]] + torch.randn(world.contexts, d,
                                                                      generator=gen)
    prompts, table = [], {}
    modes = list(world.modes)
    for i, level in enumerate(levels):
        key = f"{world.name}-{world.seed}-{i:05d}"
        prompts.append(Prompt(key, TASK, str(i), index[level] + 1, "", "", "numeric"))
        per_mode = {}
        for mode in modes:
            cell = world.levels[level][mode]
            draws = (torch.rand(world.draws, generator=gen) < cell["accuracy"]).tolist()
            per_mode[mode] = [outcome(world, mode, cell, bool(c)) for c in draws]
        for depth in range(world.n_depths):
            rows = per_mode[world.mode_of(depth)]
            table[(key, depth)] = [{**r, "key": key, "depth": depth, "sample": s}
                                   for s, r in enumerate(rows)]
    n_train = world.contexts - world.held_out
    return Realised(prompts, z0, table, direction, list(range(n_train)),
                    list(range(n_train, world.contexts)), levels)


def outcome(world: World, mode: str, cell: dict, correct: bool) -> dict:
    """One cached record: what the reward book reads of an answer."""
    f = world.features[mode]
    tokens = int(round(cell["tokens"]))
    return {"correct": correct, "gen_tokens": tokens, "rel_error": None,
            "flops": world.flops_per_token * (world.prompt_tokens + tokens),
            "ppl": f.get("ppl", 2.0),
            "text_features": {"stages": list(f.get("stages", [])), "words": f.get("words", tokens),
                              "repeated": list(f.get("repeated", [0, 0, 0]))}}


class WorldCache:
    """A realised world with a rollout cache's reading interface (``CachedEnvironment``'s
    ``prompts``, ``states``, ``table``, ``manifest``, ``dir``)."""

    def __init__(self, world: World, realised: Realised, ids: list[int]) -> None:
        self.world, self.realised, self.ids = world, realised, ids
        self.dir = Path(f"<world {world.name}>")
        self.manifest = {"world": asdict(world), "text_features": TEXT_FEATURES}

    def prompts(self) -> list[Prompt]:
        return [self.realised.prompts[i] for i in self.ids]

    def states(self) -> torch.Tensor:
        return self.realised.z0[self.ids]

    def table(self) -> dict[tuple[str, int], list[dict]]:
        keys = {p.key for p in self.prompts()}
        return {k: v for k, v in self.realised.table.items() if k[0] in keys}


# ----------------------------------------------------------------------------- scoring
def truth_table(world: World, levels: list[str]) -> torch.Tensor:
    """The true expected reward of every depth of each context [N, K+1] (float64)."""
    return torch.tensor([[world.truth(lv, world.mode_of(k)) for k in range(world.n_depths)]
                         for lv in levels], dtype=torch.float64)


def bootstrap(values: torch.Tensor, gen: torch.Generator, ratio_of: torch.Tensor | None = None
              ) -> tuple[float, float]:
    """95% percentile interval of the mean of ``values`` over contexts (of mean(values) /
    mean(ratio_of) when given), resampling contexts."""
    n = len(values)
    idx = torch.randint(0, n, (BOOTSTRAP, n), generator=gen)
    means = values[idx].mean(1)
    if ratio_of is not None:
        means = means / ratio_of[idx].mean(1)
    finite = means[torch.isfinite(means)]
    if not len(finite):
        return math.nan, math.nan
    lo, hi = torch.quantile(finite, torch.tensor([0.025, 0.975], dtype=finite.dtype))
    return float(lo), float(hi)


def score(world: World, levels: list[str], depths: torch.Tensor, seed: int = 0) -> dict:
    """A policy's held-out figures in the world's true expected reward (module docstring)."""
    truth = truth_table(world, levels)
    n = len(levels)
    rows = torch.arange(n)
    policy = truth[rows, depths]
    fixed = truth.mean(0)
    best_fixed = int(fixed.argmax())
    oracle = truth.max(1).values
    gain = oracle - truth[:, best_fixed]
    gen = torch.Generator().manual_seed(seed)
    over_fixed = policy - truth[:, best_fixed]
    best_modes = {lv: max(world.modes, key=lambda m, lv=lv: world.truth(lv, m)) for lv in
                  set(levels)}
    in_best = [world.mode_of(int(d)) == best_modes[lv] for d, lv in zip(depths, levels)]
    per_level = {}
    for lv in world.level_names:
        sel = [i for i, x in enumerate(levels) if x == lv]
        if sel:
            per_level[lv] = {"depth": float(depths[sel].float().mean()),
                             "in_best_mode": sum(in_best[i] for i in sel) / len(sel),
                             "best_mode": best_modes[lv]}
    captured = float(over_fixed.mean() / gain.mean()) if float(gain.mean()) > 0 else math.nan
    return {
        "n": n, "reward": float(policy.mean()), "depth_0": float(truth[:, 0].mean()),
        "best_fixed_depth": best_fixed, "best_fixed": float(fixed[best_fixed]),
        "oracle": float(oracle.mean()), "in_best_mode": sum(in_best) / n,
        "gain_over_best_fixed": float(over_fixed.mean()),
        "gain_interval": bootstrap(over_fixed, gen),
        "oracle_gain": float(gain.mean()),
        "captured": captured,
        "captured_interval": bootstrap(over_fixed, gen, gain) if float(gain.mean()) > 0
        else (math.nan, math.nan),
        "depth_per_level": per_level,
    }


def summary_table(results: list[dict]) -> str:
    """The report as a Markdown table, one row per (recipe, seed), the ceiling after."""
    head = ("| run | in best mode | reward | depth 0 | best fixed (depth) | oracle | gain over "
            "best fixed [95% CI] | captured [95% CI] |")
    lines = [head, "|" + "---|" * 8]
    for r in results:
        s = r["score"]
        lo, hi = s["gain_interval"]
        clo, chi = s["captured_interval"]
        lines.append(
            f"| {r['label']} | {s['in_best_mode']:.3f} | {s['reward']:.4f} | {s['depth_0']:.4f} "
            f"| {s['best_fixed']:.4f} ({s['best_fixed_depth']}) | {s['oracle']:.4f} | "
            f"{s['gain_over_best_fixed']:+.4f} [{lo:+.4f}, {hi:+.4f}] | "
            f"{s['captured']:.2f} [{clo:.2f}, {chi:.2f}] |")
    return "\n".join(lines)


def passed(result: dict) -> bool:
    """The control's bar: the trained controller beats the best fixed depth held out, the
    interval of its gain above 0."""
    return result["score"]["gain_interval"][0] > 0


# ----------------------------------------------------------------------------- the run
def run_control(cfg, world: World, seeds: list[int], *, price_given: bool = False,
                ceiling: bool = True, progress: bool = True) -> dict:
    """Train the recipe ``cfg`` names on ``world`` once per seed (each in
    ``<output>/seed<N>/``), score each on the held-out contexts, fit the ceiling, and write
    ``<output>/control.json``. Returns what it wrote."""
    import copy

    from lm_eval_ponder.files import atomic_write_text
    from lm_eval_ponder.pondering.controller import PonderController
    from lm_eval_ponder.pondering.dynamics import cumulative_offsets
    from lm_eval_ponder.training.distributed import Distributed
    from lm_eval_ponder.training.environment import CachedEnvironment, split_prompts
    from lm_eval_ponder.training.expected import ExpectedRewardTrainer
    from lm_eval_ponder.training.loop import fit

    cfg = copy.deepcopy(cfg)
    if not price_given:
        cfg.reward.price_per_1k_tokens = world.price_per_1k_tokens
    if cfg.ponder.k_max != world.n_depths - 1:
        raise PonderError(f"world {world.name!r} has depths 0..{world.n_depths - 1}; run it with "
                          f"--ponder.k_max {world.n_depths - 1} (got {cfg.ponder.k_max})")
    if cfg.ponder.granularity != "prompt":
        raise PonderError("the positive control is a prompt-granularity world: drop "
                          "--ponder.granularity token")
    out = Path(cfg.output)
    out.mkdir(parents=True, exist_ok=True)
    realised = realise(world)
    offsets = cumulative_offsets(cfg.ponder)
    step_vector = world.state_norm * realised.direction
    held = torch.tensor(realised.held_out)
    held_levels = [realised.levels[i] for i in realised.held_out]
    results = []
    for seed in seeds:
        run = copy.deepcopy(cfg)
        run.seed, run.output = seed, str(out / f"seed{seed}")
        Path(run.output).mkdir(parents=True, exist_ok=True)
        for stale in ("train_log.jsonl", "checkpoint.safetensors"):
            (Path(run.output) / stale).unlink(missing_ok=True)  # a control run starts afresh
        torch.manual_seed(seed)
        controller = PonderController(world.width, cfg.controller_hidden,
                                      cfg.controller_temperature)
        env = CachedEnvironment(WorldCache(world, realised, realised.train), cfg.ponder.k_max,
                                world.draws, controller.evaluation_flops(cfg.ponder.k_max + 1),
                                cfg.reward, torch.Generator().manual_seed(seed + 1))
        trainer, chosen, wall, _, _ = fit(run, env, controller, step_vector, offsets,
                                          Path(run.output), Distributed())
        depths = trainer.greedy_depths(realised.z0[held])
        results.append({"label": f"{cfg.recipe} ({cfg.algorithm}), seed {seed}", "seed": seed,
                        "selected_step": chosen, "wall_s": round(wall, 1),
                        "score": score(world, held_levels, depths, seed)})
    report = {"world": asdict(world), "recipe": cfg.recipe, "config": config_dict(cfg),
              "results": results, "passed": all(passed(r) for r in results)}
    if ceiling:
        torch.manual_seed(0)
        controller = PonderController(world.width, cfg.controller_hidden,
                                      cfg.controller_temperature)
        fitter = ExpectedRewardTrainer(controller, step_vector, offsets, cfg.ponder.tau,
                                       cfg.expected, 0)
        train_levels = [realised.levels[i] for i in realised.train]
        keys = [realised.prompts[i].key for i in realised.train]
        tr, va = split_prompts(keys, cfg.val_fraction)
        truth = truth_table(world, train_levels).float()
        z = realised.z0[realised.train]
        chosen, wall = fitter.fit(z[tr], truth[tr], z[va] if va else None,
                                  truth[va] if va else None, progress=progress)
        report["ceiling"] = {"label": "ceiling: the expected-reward fit to the true rewards",
                             "selected_step": chosen, "wall_s": round(wall, 1),
                             "score": score(world, held_levels,
                                            fitter.greedy_depths(realised.z0[held]), 0)}
    atomic_write_text(out / "control.json", json.dumps(report, indent=2, sort_keys=True) + "\n")
    return report


def report_text(report: dict) -> str:
    """What the command prints: the world, one row per run, the ceiling, and the verdict."""
    world = report["world"]
    rows = report["results"] + ([report["ceiling"]] if "ceiling" in report else [])
    levels = ", ".join(
        f"{lv}: " + "/".join(f"{m} {world['levels'][lv][m]['accuracy']:.2f}@"
                              f"{world['levels'][lv][m]['tokens']:g}" for m in world["modes"])
        for lv in world["levels"])
    verdict = ("PASSED: every run beats the best fixed depth, interval above 0"
               if report["passed"] else
               "FAILED: a run does not beat the best fixed depth with its interval above 0")
    per_level = "; ".join(
        f"{r['label']}: " + ", ".join(f"L{lv} {v['depth']:.1f} ({v['in_best_mode']:.0%} "
                                      f"{v['best_mode']})"
                                      for lv, v in r["score"]["depth_per_level"].items())
        for r in rows)
    return "\n".join([
        f"world {world['name']}: {world['contexts'] - world['held_out']} training contexts, "
        f"{world['held_out']} held out, {world['draws']} draw(s) per context and mode, price "
        f"{report['config']['reward']['price_per_1k_tokens']:g} per 1k tokens; "
        f"accuracy@tokens per level: {levels}",
        "held-out contexts, the world's true expected reward:", summary_table(rows),
        f"mean depth per level (in the best mode): {per_level}", verdict])
