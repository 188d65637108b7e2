"""Does a trained controller beat fixed steering? GRPO controllers trained on a headroom rollout
cache, cross-fitted over prompts, placed against the fixed-depth accuracy-tokens curve.

    export LM_EVAL_PONDER_DATA=../shared/data
    python studies/headroom.py build --form ours --samples 4       # the cache (resumable)
    python studies/adaptation.py train --form ours --samples 4     # resumable, see below
    python studies/adaptation.py analyse --form ours --samples 4 --out docs/adaptation
    python studies/adaptation.py train --form ours --samples 4 --final  # for testset.py
    # every arm's gap against the in-sample, cross-fitted and smoothed curves (no z_0 needed)
    python studies/adaptation.py comparators --form ours --samples 4 \
        --sweep results/adaptation/ours-s4/n600-787ccefe8d --out docs/adaptation/comparators

``train`` takes the prompts of the cache that are complete (every depth and sample), splits
them into the same 5 folds as ``headroom.py analyse`` (by key hash) and, for every arm of the
reward x seed x fold, trains a controller with the trainer's own loop
(``training.loop.optimise``: curriculum, GRPO, reward, balancing, exactly as
``python -m lm_eval_ponder.train``) on the other four folds, then records its inference-time
depths (first phi <= tau) on the held-out fold. Every prompt thus gets a depth from a controller
that never saw it. Each run has its own directory with the trainer's checkpoint, so an
interrupted sweep continues where it stopped; finished runs are skipped. Runs are keyed by the
set of complete prompts, so growing the cache starts a fresh sweep instead of mixing sets.

The arms trace the accuracy-FLOPs trade-off that a family of controllers can reach:
``balanced`` is the shipped reward (w_flops adapted toward 0.3 x E|R_acc|, the paper's
balancing); ``flops<w>`` fixes w_flops = w with no balancing (w = 0: accuracy and the small
quality terms only); ``balanced-*`` change one GRPO setting of the shipped reward (entropy
bonus x10, advantages scaled by the group's std, step size / 10). A controller helps only if
it lies above the fixed-depth curve by more than the bootstrap CI over prompts.

The perplexity reference of R_qual (median and IQR of correct answers' perplexities) is taken
from the whole cache, held-out prompts included: a normalisation constant with weight 0.05,
not a label.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

from studylib import heldout
from studylib.analysis import (
    COMPARATOR_HEADER,
    accuracy_at_tokens,
    bootstrap,
    comparator_cells,
    comparator_gaps,
    comparators_said,
    curve_said,
    depth_by_level,
    fixed_by_fold,
    fixed_curve,
    fixed_curve_summary,
    fold_of,
    outcome_matrices,
)
from studylib.caches import FORMS, PROMPTS, cache_arguments, cache_dir, cache_matrices
from studylib.pages import write_page

ARMS: dict[str, float | None] = {"balanced": None, "flops0": 0.0, "flops0.25": 0.25,
                                 "flops0.5": 0.5, "flops1": 1.0, "flops3": 3.0}
# The shipped reward with one optimisation setting changed: do the entropy bonus, advantage
# scaling or step size, rather than the reward balance, decide where a controller ends?
GRPO_ARMS: dict[str, tuple[str, float | bool]] = {
    "balanced-ent0.1": ("entropy_beta", 0.1), "balanced-std": ("scale_rewards", True),
    "balanced-lr5e-5": ("learning_rate", 5e-5)}
ARMS.update(dict.fromkeys(GRPO_ARMS))
# Issue 38: the shipped reward trained as the paper trains (temperature annealed 1 -> 0.1 over
# the curriculum, quality gates with the paper's meaning, Algorithm 1's plain step) with each
# of the three switched back to issue 13's setting: anneal{0,1} x gates{0,1} x {sgd, adam}.
PAPER_ARMS: dict[str, tuple[bool, bool, str]] = {
    f"anneal{int(a)}-gates{int(g)}-{opt}": (a, g, opt)
    for a in (True, False) for g in (True, False) for opt in ("sgd", "adam")}
ARMS.update(dict.fromkeys(PAPER_ARMS))
# Issue 52: the paper's recipe as written. Algorithm 1 skips the update through stage 1
# (stage1="paper": no imitation), halts on phi <= tau while training (its line "if a_k = 0 or
# p_k <= tau"), and anneals T over the curriculum's hand-over (the "curriculum" reading: the
# paper names no schedule); gates on. With its plain step, and with Adam (the plain step
# diverged on the paper's form in issue 38).
WRITTEN_ARMS: dict[str, str] = {"written-sgd": "sgd", "written-adam": "adam"}
ARMS.update(dict.fromkeys(WRITTEN_ARMS))
# One of them with GRPO groups per problem type (arith level, GSM8K) instead of per prompt.
TYPE_ARMS = {f"{arm}-types": arm for arm in ("anneal1-gates1-sgd", "anneal1-gates1-adam")}
ARMS.update(dict.fromkeys(TYPE_ARMS))
# Issue 75: the trainer's new default (the exact expected reward, training.expected) on the
# priced objective, at a price per 1,000 generated tokens each; 20% of the training folds'
# prompts choose its checkpoint and stop its fit
EXPECTED_ARMS: dict[str, float] = {"expected-p0.5": 0.5, "expected": 1.0, "expected-p4": 4.0}
ARMS.update(dict.fromkeys(EXPECTED_ARMS))


def issue13_training(cfg) -> None:
    """The trainer's settings before issue 38, which the arms above were trained with: constant
    temperature 1, gates at 0 (in effect off), Adam with the gradient norm clipped at 1."""
    cfg.controller_temperature_end = None
    cfg.grpo.theta_comp, cfg.grpo.theta_qual = 0.0, 0.0
    cfg.grpo.optim, cfg.grpo.max_grad_norm = "adam", 1.0


def arm_config(form: str, samples: int, arm: str, seed: int, steps: int, out: Path):
    """The trainer's config of one run: the form's pondering, the headroom cache's rollout
    settings (for the record), the arm's FLOPs weight, the seed."""
    from lm_eval_ponder.training.config import TrainConfig

    cfg = TrainConfig(output=str(out), seed=seed, val_fraction=0.0, select="last")
    if arm in EXPECTED_ARMS:  # the default recipe at the arm's price
        cfg.ponder.alpha_start = FORMS[form]
        cfg.rollout.prompts = dict(PROMPTS)
        cfg.rollout.samples = samples
        cfg.reward.price_per_1k_tokens = EXPECTED_ARMS[arm]
        cfg.val_fraction = 0.2
        return cfg.validate()
    # the GRPO recipe these records were made with (issue 75 made the priced objective and
    # the expected-reward fit the default; this study's other arms are GRPO's)
    cfg.algorithm, cfg.reward.objective = "grpo", "paper"
    cfg.ponder.alpha_start = FORMS[form]
    cfg.rollout.prompts = dict(PROMPTS)
    cfg.rollout.samples = samples
    cfg.grpo.max_steps = steps
    if arm in TYPE_ARMS:
        cfg.grpo.group_by = "type"
    if arm in PAPER_ARMS or arm in TYPE_ARMS:
        anneal, gates, optim = PAPER_ARMS[TYPE_ARMS.get(arm, arm)]
        cfg.grpo.optim = optim
        if not anneal:
            cfg.controller_temperature_end = None
        cfg.grpo.quality_gates = gates
        # the plain step as Algorithm 1 writes it (no clipping); Adam as issue 13 ran it
        cfg.grpo.max_grad_norm = None if optim == "sgd" else 1.0
    elif arm in WRITTEN_ARMS:
        cfg.grpo.optim = WRITTEN_ARMS[arm]
        cfg.grpo.max_grad_norm = None if cfg.grpo.optim == "sgd" else 1.0
        cfg.grpo.quality_gates = True
        cfg.grpo.stage1 = "paper"
        cfg.grpo.threshold_in_training = True
        cfg.grpo.temperature_schedule = "curriculum"
    else:
        issue13_training(cfg)
    if arm in GRPO_ARMS:
        setattr(cfg.grpo, *GRPO_ARMS[arm])
    weight = ARMS[arm]
    if weight is not None:
        cfg.reward.balance = ()
        cfg.reward.weights = {**cfg.reward.weights, "flops": weight}
    return cfg.validate()


def environment(cache, cfg, controller_flops: float, max_prompts: int | None = None):
    import torch

    from lm_eval_ponder.training.environment import CachedEnvironment

    return CachedEnvironment(cache, cache.manifest["k_max"], cfg.rollout.samples,
                             controller_flops, cfg.reward,
                             torch.Generator().manual_seed(cfg.seed + 1), complete_only=True,
                             max_prompts=max_prompts)


def sweep_dir(root: str, directory: Path, keys: list[str]) -> Path:
    tag = hashlib.sha256("\n".join(keys).encode()).hexdigest()[:10]
    return Path(root) / directory.name / f"n{len(keys)}-{tag}"


def train_one(cache, step_vector, form: str, samples: int, arm: str, seed: int,
              fold: int | None, folds: int, steps: int, out: Path,
              max_prompts: int | None = None) -> dict:
    """One controller, trained on every fold but ``fold``; its held-out depths, to
    out/heldout.json and the sweep's pack (``studylib/heldout.py``). ``fold=None``: the arm's final
    controller, trained on every prompt and saved to out/controller as ``--model ponder
    controller=DIR`` loads it (out/final.json)."""
    import torch

    from lm_eval_ponder.errors import PonderError
    from lm_eval_ponder.pondering.controller import PonderController
    from lm_eval_ponder.training.distributed import Distributed
    from lm_eval_ponder.training.loop import LOG, optimise

    sweep = out.parent.parent.parent  # <sweep>/<arm>/seed<s>/<fold<f> | all>
    if fold is not None:
        finished = heldout.record(sweep, out)
        if finished is not None:
            return finished
    done = out / (heldout.RECORD if fold is not None else "final.json")
    # a final run is finished only with its weights: git keeps neither (2 MB of weights), so
    # in a fresh clone it is retrained (about a minute) for testset.py to read
    weights = out / "controller" / "controller.safetensors"
    if fold is None and done.is_file() and weights.is_file():
        return json.loads(done.read_text())
    out.mkdir(parents=True, exist_ok=True)
    cfg = arm_config(form, samples, arm, seed, steps, out)
    ident = cache.manifest["identity"]
    z0 = cache.states()
    torch.manual_seed(cfg.seed)
    controller = PonderController(z0.shape[1], cfg.controller_hidden, cfg.controller_temperature)
    env = environment(cache, cfg, controller.evaluation_flops(cache.manifest["k_max"] + 1),
                      max_prompts)
    keys = [p.key for p in env.prompts]
    f_of = fold_of(keys, folds) if fold is not None else [-1] * len(keys)
    train_ids = [i for i, f in enumerate(f_of) if f != fold]
    val_ids = [i for i, f in enumerate(f_of) if f == fold]
    trainer = make_trainer(controller, step_vector, ident, cfg, env.rewards)
    # val_ids=[]: nothing about the held-out fold reaches training or its log
    try:
        if arm in EXPECTED_ARMS:
            trainer, wall = fit_expected(controller, step_vector, ident, cfg, env, keys,
                                         train_ids, out)
        else:
            _, wall = optimise(cfg, trainer, env, train_ids, [], out, Distributed())
        diverged = None
    except PonderError as error:  # the plain step can blow up (issue 38): a finding, recorded
        if fold is None or "diverged" not in str(error):
            raise
        wall, diverged = float("nan"), str(error)
    log = [json.loads(line) for line in (out / LOG).read_text().splitlines() if line.strip()]
    nan = torch.full((len(val_ids), env.k_max + 1), float("nan"))
    record = {"arm": arm, "seed": seed, "fold": fold, "steps": steps,
              "train_wall_s": round(wall, 1), **({"diverged": diverged} if diverged else {}),
              "val_keys": [keys[i] for i in val_ids],
              "val_depths": ([-1] * len(val_ids) if diverged
                             else trainer.greedy_depths(env.z0[val_ids]).tolist()),
              "val_p_continue": (nan if diverged
                                 else p_continue(trainer, env.z0[val_ids])).tolist(),
              "train_depths_hist": torch.bincount(trainer.greedy_depths(env.z0[train_ids]),
                                                  minlength=env.k_max + 1).tolist(),
              "log": [{k: e.get(k) for k in ("step", "stage", "depth_mean", "depth_hist",
                                             "accuracy", "reward_mean", "R_acc", "R_flops",
                                             "weights", "balance_ratio", "advantage_abs",
                                             "entropy", "loss", "reinitialisations",
                                             "temperature", "gate_drop_comp",
                                             "gate_drop_qual")
                       if k in e}
                      for e in log if "alert" not in e]}
    if fold is None:
        save_final(trainer, cfg, ident, out / "controller", record, len(keys))
    done.write_text(json.dumps(record) + "\n")
    if fold is not None:
        heldout.pack(sweep)  # what git keeps of the run
    return record


def fit_expected(controller, step_vector, ident: dict, cfg, env, keys: list[str],
                 train_ids: list[int], out: Path):
    """The expected-reward fit (the trainer's default) on the training folds: 20% of their
    prompts (by key hash, as the trainer splits) choose the checkpoint; the held-out fold is
    never seen. Returns (the trainer, wall seconds)."""
    import torch

    from lm_eval_ponder.training.environment import split_prompts
    from lm_eval_ponder.training.expected import ExpectedRewardTrainer
    from lm_eval_ponder.training.loop import LOG

    trainer = ExpectedRewardTrainer(controller, step_vector, torch.tensor(ident["offsets"]),
                                    cfg.ponder.tau, cfg.expected, cfg.seed)
    fit_ids, select_ids = split_prompts([keys[i] for i in train_ids], cfg.val_fraction)
    fit_ids = [train_ids[i] for i in fit_ids]
    select_ids = [train_ids[i] for i in select_ids]
    (out / LOG).unlink(missing_ok=True)
    table = env.expected_scores(list(range(len(keys))))
    _, wall = trainer.fit(env.z0[fit_ids], table[fit_ids], env.z0[select_ids], table[select_ids],
                          log_path=out / LOG, progress=False)
    return trainer, wall


def save_final(trainer, cfg, ident: dict, directory: Path, record: dict, n_prompts: int) -> None:
    """The controller with the config the evaluation path reads (pondering, layer, the steering
    vector it was trained with), like ``python -m lm_eval_ponder.train`` writes it."""
    from lm_eval_ponder.backbone import EMBEDDED_NAME
    from lm_eval_ponder.pondering.controller import save_controller
    from lm_eval_ponder.resources import shipped_controller_dir
    from lm_eval_ponder.training.config import config_dict

    run_config = config_dict(cfg)
    backbone = {k: ident[k] for k in ("backbone", "backbone_sha256", "layer", "steering_sha256")}
    backbone["steering_dir"] = str(shipped_controller_dir(EMBEDDED_NAME))
    backbone["steering_scale"] = ident["scale"]
    save_controller(trainer.controller, directory, extra_config={
        "backbone": backbone, "ponder": run_config["ponder"], "layer": ident["layer"],
        "train_config": run_config, "seed": cfg.seed,
        "data": {"cache": f"headroom rollout cache, {ident['samples']} samples per (prompt, "
                          f"depth), prompts sha256 {ident['prompts_sha256'][:16]}",
                 "prompts": n_prompts, "arm": record["arm"]},
        "cost": {"train_wall_s": record["train_wall_s"]}})


def step_vector_of(ident: dict):
    """One unit of offset as the cache applied it: scale x the shipped steering vector."""
    from lm_eval_ponder.steering.vector import load_vector

    return ident["scale"] * load_vector(steering_dir(ident)).vector(ident["layer"])


def make_trainer(controller, step_vector, ident: dict, cfg, rewards=None):
    """The trainer around ``controller`` at the cache's offsets, scoring with ``rewards`` (the
    environment's reward book; None: it only reads depths out)."""
    import torch

    from lm_eval_ponder.training.grpo import GRPOTrainer

    return GRPOTrainer(controller, step_vector, torch.tensor(ident["offsets"]), cfg.ponder.tau,
                       cfg.grpo, cfg.seed, cfg.controller_temperature_end, rewards=rewards)


def p_continue(trainer, z0):
    """The controller's continue probabilities on every candidate state [N, K+1]: enough to
    replay any halting rule (the shipped tau, or the sampling policy GRPO optimised)."""
    import torch

    with torch.no_grad():
        return trainer.controller.probability(trainer.logits(z0))


def steering_dir(ident: dict) -> str:
    """The shipped steering vector, refused unless it is the one the cache was built with."""
    from lm_eval_ponder.backbone import EMBEDDED_NAME
    from lm_eval_ponder.files import file_sha256
    from lm_eval_ponder.resources import shipped_controller_dir

    path = shipped_controller_dir(EMBEDDED_NAME)
    sha = file_sha256(path / "steering.safetensors")[:16] if path else "missing"
    if sha != ident["steering_sha256"]:
        sys.exit(f"the cache was built with steering vector {ident['steering_sha256']}; the "
                 f"shipped one is {sha}")
    return str(path)


def train(args) -> None:
    import torch

    from lm_eval_ponder.training.rollouts import RolloutCache

    torch.set_num_threads(args.threads)
    directory = cache_dir(args.root, args.form, args.samples)
    cache = RolloutCache(directory)
    ident = cache.manifest["identity"]
    step_vector = step_vector_of(ident)
    cfg0 = arm_config(args.form, args.samples, "balanced", 0, args.steps, Path("unused"))
    keys = [p.key for p in environment(cache, cfg0, 0.0, args.prompts).prompts]
    root = sweep_dir(args.out_root, directory, keys)
    print(f"{len(keys)} complete prompts -> {root}", flush=True)
    folds = [None] if args.final else range(args.folds)
    runs = [(a, s, f) for a in args.arms.split(",") for s in map(int, args.seeds.split(","))
            for f in folds]
    for arm, _, _ in runs:
        if arm not in ARMS:
            sys.exit(f"unknown arm {arm!r}; known: {sorted(ARMS)}")
    root.mkdir(parents=True, exist_ok=True)
    (root / "prompts.json").write_text(json.dumps({"cache": str(directory), "keys": keys}) + "\n")
    for n, (arm, seed, fold) in enumerate(runs, 1):
        t0 = time.time()
        name = f"fold{fold}" if fold is not None else "all"
        rec = train_one(cache, step_vector, args.form, args.samples, arm, seed, fold, args.folds,
                        args.steps, root / arm / f"seed{seed}" / name, args.prompts)
        print(f"[{n}/{len(runs)}] {arm} seed {seed} {name}: held-out depths "
              f"{sorted(set(rec['val_depths']))}, train hist {rec['train_depths_hist']} "
              f"({time.time() - t0:.0f} s)", flush=True)


def export(args) -> None:
    """A finished cross-fitted run's controller as a directory ``--model ponder`` loads
    (<run>/controller), refused unless it reproduces the held-out depths the run recorded.
    Such a controller, with depths that differ across documents, is what ``testset.py verify``
    needs to test its shortcut on batches that mix depths."""
    from safetensors import safe_open

    from lm_eval_ponder.pondering.controller import PonderController
    from lm_eval_ponder.training.rollouts import RolloutCache

    run = Path(args.run)
    rec = heldout.record(run.parent.parent.parent, run)
    if rec is None:
        sys.exit(f"{run} has no held-out record: not a finished run of a sweep")
    cache = RolloutCache(cache_dir(args.root, args.form, args.samples))
    ident = cache.manifest["identity"]
    cfg = arm_config(args.form, args.samples, rec["arm"], rec["seed"], rec["steps"], run)
    env = environment(cache, cfg, 0.0)
    row = {p.key: i for i, p in enumerate(env.prompts)}
    controller = PonderController(env.z0.shape[1], cfg.controller_hidden,
                                  cfg.controller_temperature)
    with safe_open(str(run / "checkpoint.safetensors"), "pt") as f:
        controller.load_state_dict({k.removeprefix("controller."): f.get_tensor(k)
                                    for k in f.keys() if k.startswith("controller.")})
    trainer = make_trainer(controller, step_vector_of(ident), ident, cfg)
    depths = trainer.greedy_depths(env.z0[[row[k] for k in rec["val_keys"]]]).tolist()
    if depths != rec["val_depths"]:
        sys.exit(f"{run}: the checkpoint's controller does not reproduce the recorded depths")
    save_final(trainer, cfg, ident, run / "controller", rec, sum(rec["train_depths_hist"]))
    print(f"{run / 'controller'}: held-out depths {depths}")


# ----------------------------------------------------------------------------- analysis
# How a controller's continue probabilities become depths. ``--model ponder`` halts at the first
# phi <= tau (tau=0.2, the paper's); GRPO optimises the *sampling* policy (halt at k with
# probability 1 - phi_k). Where phi sits between tau and 1 the two disagree completely, so each
# controller is scored under both, plus tau=0.5 (halt where halting is the likelier action).
RULES = ("tau=0.2", "tau=0.5", "sampled")


def depth_weights(p, rule: str):
    """[N, K+1] probability of each depth under ``rule`` (one-hot for the threshold rules)."""
    import numpy as np

    n, k1 = p.shape
    if rule == "sampled":
        reach = np.cumprod(np.concatenate([np.ones((n, 1)), p[:, :-1]], axis=1), axis=1)
        return reach * np.concatenate([1 - p[:, :-1], np.ones((n, 1))], axis=1)
    halt = p <= float(rule.split("=")[1])
    depth = np.where(halt.any(axis=1), halt.argmax(axis=1), k1 - 1)
    return np.eye(k1)[depth]


def load_runs(root: Path, keys: list[str], folds: int) -> dict[tuple[str, int], dict]:
    """(arm, seed) -> every prompt's held-out continue probabilities and the runs' records,
    for the (arm, seed) pairs whose folds are all finished."""
    import numpy as np

    index = {k: i for i, k in enumerate(keys)}
    finished = heldout.records(root)
    runs = {}
    for arm in ARMS:
        for seed in sorted({name.split("/")[1] for name in finished
                            if name.startswith(f"{arm}/")}):
            recs = [finished.get(f"{arm}/{seed}/fold{f}") for f in range(folds)]
            if None in recs:
                continue
            p = np.full((len(keys), len(recs[0]["val_p_continue"][0])), np.nan)
            covered = np.zeros(len(keys), dtype=bool)
            for r in recs:
                rows = [index[k] for k in r["val_keys"]]
                p[rows] = np.array(r["val_p_continue"], dtype=float)  # NaN: a diverged run
                covered[rows] = True
            if not covered.all():
                sys.exit(f"{root / arm / seed}: its folds do not cover every prompt")
            runs[(arm, int(seed[4:]))] = {"p": p, "records": recs}
    return runs


def controller_figures(mats, weights_by_seed, fixed_depths, idx) -> dict:
    """Seed-mean expected figures of one arm under one rule on (a resample ``idx`` of) the
    prompts, its gap to the fixed-depth curve at equal tokens and to the cross-fitted best fixed
    depth's score."""
    import numpy as np

    rows = np.arange(len(idx))
    m = {k: v[idx] for k, v in mats.items()}
    per = {"accuracy": [], "gen_tokens": [], "score": [], "depth": []}
    depth_axis = np.arange(m["score"].shape[1])
    for w in weights_by_seed:
        w = w[idx]
        for k in ("accuracy", "gen_tokens", "score"):
            per[k].append((m[k] * w).sum(axis=1).mean())
        per["depth"].append((w * depth_axis).sum(axis=1).mean())
    out = {k: float(np.mean(v)) for k, v in per.items()}
    out["fixed_curve_accuracy_at_tokens"] = accuracy_at_tokens(
        fixed_curve(m["gen_tokens"], m["accuracy"]), out["gen_tokens"])
    out["gap_accuracy_at_equal_tokens"] = out["accuracy"] - out["fixed_curve_accuracy_at_tokens"]
    out["gap_score_vs_best_fixed"] = out["score"] - float(
        m["score"][rows, fixed_depths[idx]].mean())
    return out


def expected_depth_profile(weights: list, prompts) -> dict:
    """Where an arm's depths go: histogram of the expected depth weights, mean expected depth by
    arith level and on GSM8K, Spearman with the arith level
    (``studylib.analysis.depth_by_level``)."""
    import numpy as np

    w = np.concatenate(weights)
    depth = (w * np.arange(w.shape[1])).sum(axis=1)
    level = np.array([p.level if p.level is not None else -1 for p in prompts] * len(weights))
    arith = np.array([p.task == "arith_ponder" for p in prompts] * len(weights))
    by_level, rho = depth_by_level(depth, np.where(arith, level, -1))
    if (~arith).any():
        by_level["gsm8k"] = float(depth[~arith].mean())
    hist = w.sum(axis=0)
    return {"depth_hist": [round(float(h), 1) for h in hist],
            "modal_depth_share": float(hist.max() / hist.sum()),
            "mean_depth_by_level": by_level, "spearman_depth_vs_level (arith)": rho}


def training_signals(records: list[dict]) -> dict:
    """From the training logs: the signals that explain a collapse, last window and stages 2-3."""
    import numpy as np

    if not any("stage" in e for rec in records for e in rec["log"]):  # the expected-reward fit
        return {"train_wall_s_per_run": float(np.mean([rec["train_wall_s"] for rec in records])),
                "runs": len(records)}
    last = [rec["log"][-1] for rec in records]
    late = [e for rec in records for e in rec["log"] if e["stage"] >= 2]

    def mean(rows, key):
        vals = [e[key] for e in rows if e.get(key) is not None]
        return float(np.mean(vals)) if vals else None

    return {"last_window": {k: mean(last, k) for k in (
                "accuracy", "depth_mean", "R_acc", "R_flops", "balance_ratio",
                "advantage_abs", "entropy")},
            "w_flops_at_end": float(np.mean([e["weights"]["flops"] for e in last])),
            "advantage_abs_stages_2_3": mean(late, "advantage_abs"),
            "gate_drop_comp_stage_3": mean([e for e in late if e["stage"] == 3], "gate_drop_comp"),
            "gate_drop_qual_stage_3": mean([e for e in late if e["stage"] == 3], "gate_drop_qual"),
            "entropy_stages_2_3": mean(late, "entropy"),
            "train_wall_s_per_run": float(np.mean([rec["train_wall_s"] for rec in records])),
            "runs": len(records)}


def analyse(args) -> None:
    import numpy as np

    from lm_eval_ponder.pondering.controller import PonderController
    from lm_eval_ponder.training.rollouts import RolloutCache

    directory = cache_dir(args.root, args.form, args.samples)
    cache = RolloutCache(directory)
    cfg0 = arm_config(args.form, args.samples, "balanced", 0, args.steps, Path("unused"))
    k_max = cache.manifest["k_max"]
    flops_ctrl = PonderController(cache.states().shape[1], 512).evaluation_flops(k_max + 1)
    env = environment(cache, cfg0, flops_ctrl, args.prompts)
    prompts = env.prompts
    keys = [p.key for p in prompts]
    root = sweep_dir(args.out_root, directory, keys)
    runs = load_runs(root, keys, args.folds)
    if not runs:
        sys.exit(f"no finished sweep under {root}: run `adaptation.py train` first")
    ids = np.arange(len(prompts))
    mats = outcome_matrices(env, list(ids))
    fixed_depths, fold_depths = fixed_by_fold(mats["score"], np.array(fold_of(keys, args.folds)),
                                              args.folds)
    arms, missing = {}, []
    chosen = args.arms.split(",") if args.arms else list(ARMS)
    for arm in chosen:
        finished = sorted(s for a, s in runs if a == arm)
        if not finished and args.arms:  # named, but never trained here: say so, not a gap
            missing.append(arm)
        # a run whose weights went NaN (the plain step can diverge) has no depths to score
        diverged = {s: [r["fold"] for r in runs[(arm, s)]["records"]
                        if np.isnan(np.array(r["val_p_continue"], dtype=float)).any()]
                    for s in finished}
        seeds = [s for s in finished if not diverged[s]]
        if not finished:
            continue
        if not seeds:
            arms[arm] = {"seeds": [], "diverged": {str(s): f for s, f in diverged.items()}}
            continue
        entry = {"seeds": seeds,
                 "diverged": {str(s): f for s, f in diverged.items() if f},
                 "training": training_signals([r for s in seeds
                                               for r in runs[(arm, s)]["records"]])}
        for rule in RULES:
            ws = [depth_weights(runs[(arm, s)]["p"], rule) for s in seeds]
            entry[rule] = {
                "figures": controller_figures(mats, ws, fixed_depths, ids),
                "ci95": bootstrap(lambda idx, ws=ws: controller_figures(mats, ws, fixed_depths, idx),
                                  len(ids), args.bootstrap),
                "per_seed": {str(s): controller_figures(mats, [w], fixed_depths, ids)
                             for s, w in zip(seeds, ws)},
                **expected_depth_profile(ws, prompts)}
        arms[arm] = entry
    curve = fixed_curve(mats["gen_tokens"][ids], mats["accuracy"][ids])
    summary = {
        "form": args.form, "samples": args.samples, "cache": str(directory),
        "manifest": cache.manifest["fingerprint"], "sweep": str(root),
        "prompts": len(prompts), "by_task": {t: sum(p.task == t for p in prompts)
                                             for t in sorted({p.task for p in prompts})},
        "folds": args.folds, "steps": args.steps, "rules": list(RULES),
        "fixed_curve": [{"depth": k, "gen_tokens": float(curve[k, 0]),
                         "accuracy": float(curve[k, 1]),
                         "score": float(mats["score"][:, k].mean())} for k in range(k_max + 1)],
        "best_fixed_by_score (cross-fitted)": {
            "depth per fold": fold_depths,
            "accuracy": float(mats["accuracy"][ids, fixed_depths].mean()),
            "gen_tokens": float(mats["gen_tokens"][ids, fixed_depths].mean()),
            "score": float(mats["score"][ids, fixed_depths].mean())},
        "arms": arms,
        **({"arms without finished runs here": missing} if missing else {}),
    }
    if missing:
        print(f"no finished runs under {root} for {', '.join(missing)} (held-out records of "
              "some sweeps are not committed: train them first); left out of the table",
              file=sys.stderr, flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = directory.name
    # compact: the .md beside it is the readable form, and the tree must travel (< 10 MiB)
    (out / f"{name}.json").write_text(json.dumps(summary, separators=(",", ":")) + "\n")
    write_markdown(out / f"{name}.md", summary)
    plot(out / f"{name}.png", summary)
    print((out / f"{name}.md").read_text())


def write_markdown(path: Path, s: dict) -> None:
    def fmt(r: dict, key: str, digits: int = 3) -> str:
        v, (lo, hi) = r["figures"][key], r["ci95"].get(key, (float("nan"),) * 2)
        return f"{v:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"

    b = s["best_fixed_by_score (cross-fitted)"]
    lines = [f"# Trained controllers against fixed depths: form `{s['form']}`, "
             f"{s['samples']} samples per (prompt, depth)", "",
             f"Cache `{s['cache']}` (manifest {s['manifest']}): {s['prompts']} complete prompts "
             f"({s['by_task']}). Each prompt's depth comes from controllers trained on the other "
             f"{s['folds'] - 1} of {s['folds']} folds ({s['steps']} GRPO steps, the trainer's "
             "loop, curriculum and reward); figures are expected values over the cached "
             "samples, seed means with 95% bootstrap CIs over prompts. Rules: `tau=0.2` is what "
             "`--model ponder` does (halt at the first phi <= 0.2); `sampled` is the stochastic "
             "policy GRPO optimised; `tau=0.5` halts where halting is the likelier action.", "",
             f"Best fixed depth by score, chosen on the other folds (depth per fold "
             f"{b['depth per fold']}): accuracy {b['accuracy']:.3f}, {b['gen_tokens']:.1f} "
             f"tokens, score {b['score']:.4f}. Fixed depths (all prompts): " + ", ".join(
                 f"k={r['depth']}: {r['accuracy']:.3f} / {r['gen_tokens']:.0f} tok"
                 for r in s["fixed_curve"]) + ".", "",
             *([f"Named but without finished runs here, so not in this table: "
                f"{', '.join(s['arms without finished runs here'])}.", ""]
               if s.get("arms without finished runs here") else []),
             "| arm | rule | accuracy | tokens | mean depth | accuracy - fixed curve at equal "
             "tokens (in-sample envelope, optimistic; `comparators` gives the cross-fitted and "
             "smoothed ones) | score - best fixed | depth histogram (all seeds) | "
             "Spearman(depth, level) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for arm, a in s["arms"].items():
        if a.get("diverged"):
            lines.append(f"| {arm} | diverged (NaN weights), left out: seed -> folds "
                         f"{a['diverged']} | | | | | | | |")
        if not a["seeds"]:
            continue
        for rule in s["rules"]:
            r = a[rule]
            lines.append(
                f"| {arm} ({len(a['seeds'])} seeds) | {rule} | {fmt(r, 'accuracy')} | "
                f"{fmt(r, 'gen_tokens', 1)} | {r['figures']['depth']:.2f} | "
                f"{fmt(r, 'gap_accuracy_at_equal_tokens')} | "
                f"{fmt(r, 'gap_score_vs_best_fixed', 4)} | "
                f"{[round(h) for h in r['depth_hist']]} | "
                f"{r['spearman_depth_vs_level (arith)']:.2f} |")
    lines += ["", "Depth by level under `tau=0.2` and the training signals (mean over runs; last "
              "log window unless stated):", "",
              "| arm | mean depth by level (tau=0.2) | w_flops at end | E|w R_flops|/E|R_acc| "
              "| mean abs advantage, stages 2-3 | policy entropy, stages 2-3 / last | "
              "sampled depth, last | gates dropped in stage 3 (comp / qual) | s/run |",
              "|---|---|---|---|---|---|---|---|---|"]
    for arm, a in s["arms"].items():
        if not a["seeds"]:
            continue
        t = a["training"]
        lw = t.get("last_window") or {}  # the expected-reward fit logs no GRPO window
        lvl = ", ".join(f"{k} {v:.1f}" for k, v in a["tau=0.2"]["mean_depth_by_level"].items())

        def g(v):
            return "-" if v is None else f"{v:.3g}"

        lines.append(f"| {arm} | {lvl} | {g(t.get('w_flops_at_end'))} | "
                     f"{g(lw.get('balance_ratio'))} | "
                     f"{g(t.get('advantage_abs_stages_2_3'))} | {g(t.get('entropy_stages_2_3'))} / "
                     f"{g(lw.get('entropy'))} | {g(lw.get('depth_mean'))} | "
                     f"{g(t.get('gate_drop_comp_stage_3'))} / {g(t.get('gate_drop_qual_stage_3'))} | "
                     f"{t['train_wall_s_per_run']:.0f} |")
    lines += ["", "Per seed, `tau=0.2` (accuracy, tokens, gap at equal tokens):", ""]
    for arm, a in s["arms"].items():
        if not a["seeds"]:
            continue
        lines.append(f"- {arm}: " + "; ".join(
            f"seed {k}: {v['accuracy']:.3f}, {v['gen_tokens']:.1f}, "
            f"{v['gap_accuracy_at_equal_tokens']:+.3f}"
            for k, v in a["tau=0.2"]["per_seed"].items()))
    lines.append("")
    path.write_text("\n".join(lines))


def arm_comparators(accuracy, tokens, runs: dict, arms: list[str], fold, folds: int,
                    draws: int) -> dict:
    """Each arm's gap at equal tokens under every rule against the three comparators
    (``studylib.analysis.comparator_gaps``: the in-sample envelope that ``analyse`` prints,
    the curve chosen on the other folds, the smoothed curve), seed means over the seeds whose
    folds all finished without NaN weights, as ``analyse`` keeps them."""
    import numpy as np

    out = {}
    for arm in arms:
        seeds = [s for a, s in sorted(runs) if a == arm and not np.isnan(runs[(a, s)]["p"]).any()]
        if not seeds:
            continue
        out[arm] = {"seeds": seeds, **{
            rule: comparator_gaps(accuracy, tokens,
                                  [depth_weights(runs[(arm, s)]["p"], rule) for s in seeds],
                                  fold, folds, draws)
            for rule in RULES}}
    return out


def fixed_depth_comparators(accuracy, tokens, depths: list[int], fold, folds: int,
                            draws: int) -> dict:
    """Every prompt at one depth, against the three comparators: the figures of any arm whose
    readout is that depth on every prompt, which a page can quote even where the arm's own
    held-out records were not kept (its depths are then known from its histogram)."""
    import numpy as np

    n, k1 = accuracy.shape
    return {str(k): comparator_gaps(accuracy, tokens, [np.eye(k1)[np.full(n, k)]], fold, folds,
                                    draws) for k in depths}


def comparators(args) -> None:
    """``analyse``'s gaps at equal tokens read against all three comparators, from committed
    records alone (the cache's outcomes and the sweep's held-out pack; no z_0, no training):
    the in-sample envelope is optimistic, the cross-fitted curve pessimistic where depths are
    near-tied, the smoothed curve neither (issue 65)."""
    import numpy as np

    from lm_eval_ponder.errors import PonderError

    directory = cache_dir(args.root, args.form, args.samples)
    sweep = Path(args.sweep)
    if not (sweep / "prompts.json").is_file() or not (directory / "manifest.json").is_file():
        raise PonderError(f"--sweep {sweep} needs its prompts.json and {directory} its "
                          "manifest.json (adaptation.py train; headroom.py build)")
    keys = json.loads((sweep / "prompts.json").read_text())["keys"]
    k_max = json.loads((directory / "manifest.json").read_text())["k_max"]
    acc, tok = cache_matrices(directory, keys, k_max)
    fold = np.array(fold_of(keys, args.folds))
    runs = load_runs(sweep, keys, args.folds)
    index = {k: i for i, k in enumerate(keys)}
    for (arm, seed), run in runs.items():  # the comparators' folds are the runs' own
        for rec in run["records"]:
            if any(fold[index[k]] != rec["fold"] for k in rec["val_keys"]):
                raise PonderError(f"{sweep}: {arm} seed {seed} fold {rec['fold']} held out "
                                  "prompts of another fold; not this sweep's folds")
    chosen = args.arms.split(",") if args.arms else list(ARMS)
    missing = [a for a in chosen if not any(r == a for r, _ in runs)]
    summary = {"form": args.form, "samples": args.samples, "cache": str(directory),
               "sweep": str(sweep), "prompts": len(keys), "folds": args.folds,
               "curve": fixed_curve_summary(acc, tok, fold, args.folds),
               "arms": arm_comparators(acc, tok, runs, chosen, fold, args.folds, args.bootstrap),
               "without held-out records": missing,
               "fixed_depths": fixed_depth_comparators(
                   acc, tok, [int(k) for k in args.fixed_depths.split(",") if k.strip()], fold,
                   args.folds, args.bootstrap)}
    write_page(Path(args.out), directory.name, summary, write_comparators_markdown)


def write_comparators_markdown(path: Path, s: dict) -> None:
    arms, curve = s["arms"], s["curve"]
    lines = [f"# Gaps at equal tokens against three comparators: form `{s['form']}`, "
             f"{s['samples']} samples per (prompt, depth)", "",
             f"The cross-fitted controllers of `{s['sweep']}` on the {s['prompts']} prompts of "
             f"`{s['cache']}`, seed means; the cross-fitted comparator's folds are the ones the "
             "controllers were trained on. " + comparators_said("prompts", s["folds"]), ""]
    lines += [curve_said(curve), "",
              f"| arm (seeds) | rule | accuracy | tokens | {COMPARATOR_HEADER} |",
              "|---|---|---|---|---|---|---|---|"]
    for arm, a in arms.items():
        for rule in RULES:
            c = a[rule]
            lines.append(f"| {arm} ({len(a['seeds'])}) | {rule} | {c['accuracy']:.3f} | "
                         f"{c['tokens']:.1f} | {comparator_cells(c)} |")
    for k, c in s.get("fixed_depths", {}).items():
        lines.append(f"| every prompt at depth {k} | - | {c['accuracy']:.3f} | "
                     f"{c['tokens']:.1f} | {comparator_cells(c)} |")
    if s["without held-out records"]:
        lines += ["", "Arms without held-out records in this sweep (never trained on it, or "
                  "their records were not committed: a page's gap for them is in-sample only, "
                  "optimistic): " + ", ".join(s["without held-out records"]) + "."]
    path.write_text("\n".join(lines) + "\n")


def plot(path: Path, s: dict) -> None:
    """The fixed-depth curve with each arm as a point (seed mean, 95% CI of its accuracy; x:
    single seeds), under the inference rule and the sampled policy. Whether a point is above
    the curve beyond noise is the table's paired gap, not these unpaired bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from lm_eval_ponder.reporting.images import save_figure

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.4), sharey=True)
    for ax, rule in zip(axes, ("tau=0.2", "sampled")):
        rows = s["fixed_curve"]
        ax.plot([r["gen_tokens"] for r in rows], [r["accuracy"] for r in rows], "o-", color="k",
                label="fixed depth k (offset c_k)")
        for r in rows:
            ax.annotate(str(r["depth"]), (r["gen_tokens"], r["accuracy"]), fontsize=7,
                        textcoords="offset points", xytext=(3, -9))
        for n, (arm, a) in enumerate(s["arms"].items()):
            if not a["seeds"]:
                continue
            r = a[rule]
            for v in r["per_seed"].values():
                ax.plot(v["gen_tokens"], v["accuracy"], "x", color=f"C{n}", alpha=0.6)
            f, ci = r["figures"], r["ci95"]["accuracy"]
            ax.errorbar([f["gen_tokens"]], [f["accuracy"]],
                        yerr=[[f["accuracy"] - ci[0]], [ci[1] - f["accuracy"]]], fmt="o",
                        color=f"C{n}", capsize=3, label=f"{arm} (mean of seeds; x: seeds)")
        ax.set_xlabel("mean generated tokens")
        ax.set_title(f"rule {rule}", fontsize=9)
    axes[0].set_ylabel("expected accuracy")
    axes[0].legend(fontsize=7)
    fig.suptitle(f"Controllers vs fixed depth, form {s['form']}: {s['prompts']} prompts, "
                 "cross-fitted", fontsize=10)
    fig.tight_layout()
    save_figure(fig, path, dpi=120)  # a palette PNG: a third the bytes
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    for name in ("train", "analyse"):
        s = sub.add_parser(name)
        cache_arguments(s)
        s.add_argument("--out-root", default="results/adaptation", help="where runs go")
        s.add_argument("--folds", type=int, default=5, help="cross-fitting folds of prompts")
        s.add_argument("--steps", type=int, default=2500, help="GRPO steps per controller")
        s.add_argument("--prompts", type=int, default=None,
                       help="only the first N complete prompts (default: all complete ones)")
    t = sub.choices["train"]
    t.add_argument("--arms", default=",".join(ARMS), help=f"comma list of {sorted(ARMS)}")
    t.add_argument("--seeds", default="0,1,2")
    t.add_argument("--final", action="store_true",
                   help="train each arm and seed once on every complete prompt and save it as "
                        "a controller directory (<run>/all/controller) for lm_eval; see "
                        "studies/testset.py")
    t.add_argument("--threads", type=int, default=1, help="torch threads (a tiny MLP)")
    a = sub.choices["analyse"]
    a.add_argument("--out", default="docs/adaptation", help="summary JSON, table and plot")
    a.add_argument("--bootstrap", type=int, default=2000)
    a.add_argument("--arms", default=None,
                   help="comma list of the arms to summarise (default: every finished one)")
    c = sub.add_parser("comparators", help="every arm's gaps against the in-sample, "
                       "cross-fitted and smoothed curves, from committed records (no z_0)")
    cache_arguments(c)
    c.add_argument("--sweep", required=True,
                   help="an adaptation sweep directory (its prompts.json and held-out pack)")
    c.add_argument("--folds", type=int, default=5, help="cross-fitting folds of prompts")
    c.add_argument("--arms", default=None, help="comma list (default: every arm of ARMS)")
    c.add_argument("--fixed-depths", default="0,8",
                   help="comma list: rows with every prompt at that depth (an arm whose readout "
                        "is one depth everywhere has these figures)")
    c.add_argument("--out", default="docs/adaptation/comparators", help="<cache>.json and .md")
    c.add_argument("--bootstrap", type=int, default=2000)
    e = sub.add_parser("export", help="a cross-fitted run's controller, for lm_eval")
    cache_arguments(e)
    e.add_argument("run", help="a finished run directory (<sweep>/<arm>/seed<s>/fold<f>)")
    args = p.parse_args(argv)
    if args.samples < 1 or getattr(args, "folds", 2) < 2:
        sys.exit("--samples must be >= 1 and --folds >= 2")
    {"train": train, "analyse": analyse, "export": export,
     "comparators": comparators}[args.command](args)


if __name__ == "__main__":
    from lm_eval_ponder.errors import command, run_program

    run_program(command(main))  # a PonderError (a missing cache, a bad flag) is one line
