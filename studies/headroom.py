"""Is there headroom for an adaptive controller? Rollout caches with expected outcomes per depth,
then the best fixed depth against the per-prompt oracle on held-out prompts, and a probe.

    export LM_EVAL_PONDER_DATA=../shared/data   # the benchmark data (see its README)
    # 1. build (resumable: run it again after any interruption; finished prompts are kept)
    python studies/headroom.py build --form ours  --samples 4 --batch-size 256
    python studies/headroom.py build --form ours  --samples 1      # the greedy outcomes
    python studies/headroom.py build --form paper --samples 4
    # on 2 cores, two one-thread builds of disjoint prompt blocks (64 prompts each at batch
    # 256 and 4 samples) draw exactly what one build draws (on the paper form's cache: 2.36-2.38 s
    # per answer each, 1.2 s per answer together, against 1.4 s for one build on two threads):
    #   OMP_NUM_THREADS=1 python studies/headroom.py build ... --threads 1 --blocks 6:8 &
    #   OMP_NUM_THREADS=1 python studies/headroom.py build ... --threads 1 --blocks 8:
    # 2. analyse whatever prefix of prompts is complete (every depth, every sample)
    python studies/headroom.py analyse --form ours --samples 4 --out docs/headroom  # [--prompts N]

A cache is exactly the trainer's (``python -m lm_eval_ponder.train --cache_dir DIR`` with the
same settings reuses it): the issue's prompt set (400 arith train prompts, all levels
interleaved, then 200 GSM8K train prompts), depths 0..K_max at the form's offsets, S samples at
T=0.7 (or greedy), 256 new tokens. The build goes prompt block by prompt block, each finished
at every depth and sample, so a stopped build leaves a usable prefix.

The caches under ``results/headroom`` are committed (their manifest and each block's compact
outcomes, ``rollouts.*.outcomes.json.xz``, which score exactly as the texts; ``.gitignore``
keeps out the texts, the prompts, which hold GSM8K questions, and z_0): a build spans sessions
by committing finished blocks. In a fresh clone, first restore the prompts and z_0 from the data,
which generates nothing (``build --restore-only``), then resume or analyse as above.

Forms: ``ours`` starts at alpha_start=-0.2 and ponders toward "deliberate" (the shipped
defaults); ``paper`` starts unsteered (alpha_start=0), as FR-Ponder's appendix does.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from studylib.analysis import (
    accuracy_at_tokens,
    bootstrap,
    fixed_by_fold,
    fixed_curve,
    fold_of,
    oracle_choice,
    outcome_matrices,
)
from studylib.caches import cache_arguments, cache_dir, train_config


def recorded_dtype(directory: Path) -> str | None:
    """The dtype a cache was started in. A build resumed on another machine keeps it (the
    default dtype follows the CPU's bf16 support, and a cache refuses other settings)."""
    manifest = directory / "manifest.json"
    if not manifest.is_file():
        return None
    return str(json.loads(manifest.read_text())["identity"]["dtype"]).removeprefix("torch.")


def block_range(text: str) -> range:
    """``START:STOP`` (either side may be empty, as in a slice) as a range of block indices."""
    start, sep, stop = text.partition(":")
    try:
        if not sep:
            raise ValueError
        lo = int(start) if start else 0
        hi = int(stop) if stop else sys.maxsize
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--blocks wants START:STOP, e.g. 6:8, not {text!r}") from None
    if lo < 0 or hi <= lo:
        raise argparse.ArgumentTypeError(f"--blocks {text!r} is empty or negative")
    return range(lo, hi)


def build(args) -> None:
    import torch

    from lm_eval_ponder.pondering.dynamics import cumulative_offsets
    from lm_eval_ponder.training.loop import load_backbone
    from lm_eval_ponder.training.rollouts import generate_missing, prepare_cache

    torch.set_num_threads(args.threads)
    directory = cache_dir(args.root, args.form, args.samples)
    cfg = train_config(args.form, args.samples, args.max_tokens, args.batch_size,
                       args.dtype or recorded_dtype(directory))
    offsets = cumulative_offsets(cfg.ponder).tolist()
    generator = load_backbone(cfg)
    t0 = time.time()
    cache, prompts = prepare_cache(generator, cfg.rollout, offsets, directory)
    print(f"cache {directory}: {len(prompts)} prompts x {len(offsets)} depths x "
          f"{args.samples} samples, offsets {[round(c, 4) for c in offsets]}", flush=True)
    if args.restore_only:
        print("prompts and z_0 restored; nothing generated (--restore-only)", flush=True)
        return
    generate_missing(generator, cache, prompts, cfg.rollout, offsets, blocks=args.blocks)
    with open(directory / "build_log.jsonl", "a") as f:
        f.write(json.dumps({"finished": time.strftime("%Y-%m-%dT%H:%M:%S"),
                            "wall_s": round(time.time() - t0, 1)}) + "\n")


# ----------------------------------------------------------------------------- analysis
def lagrangian_curve(acc_choose, tok_choose, acc_eval, tok_eval, lambdas):
    """Per-prompt oracle curve: for each lambda choose argmax(acc - lambda*tokens) on one set of
    samples, report mean accuracy and tokens of those choices on another. [len(lambdas), 2]."""
    import numpy as np

    rows = np.arange(acc_choose.shape[0])
    pts = []
    for lam in lambdas:
        pick = oracle_choice(acc_choose - lam * tok_choose, tok_choose)
        pts.append((tok_eval[rows, pick].mean(), acc_eval[rows, pick].mean()))
    return np.array(pts)


def crossfit_curve(halves, idx, lambdas):
    """The cross-fitted oracle's accuracy-tokens curve: for each lambda, depths chosen on one
    half of the samples and scored on the other, both directions averaged."""
    a, b = ({k: v[idx] for k, v in h.items()} for h in halves)
    return (lagrangian_curve(a["accuracy"], a["gen_tokens"], b["accuracy"], b["gen_tokens"], lambdas)
            + lagrangian_curve(b["accuracy"], b["gen_tokens"], a["accuracy"], a["gen_tokens"],
                               lambdas)) / 2


def headroom_figures(val_mats, halves, fixed: dict, lambdas, idx=None) -> dict:
    """Best fixed depths against the per-prompt oracle, on (a resample ``idx`` of) held-out
    prompts. ``fixed``: name -> each prompt's fixed depth, chosen on the other folds' prompts
    (one depth for all prompts of a fold). ``halves`` are two
    disjoint sample sets' matrices for the cross-fitted oracle: choose the depth on one half,
    score it on the other, average both directions, so the oracle is not credited for picking
    the luckiest of noisy estimates (the naive oracle is, and is an upper bound)."""
    import numpy as np

    if idx is None:
        idx = np.arange(val_mats["score"].shape[0])
    m = {k: v[idx] for k, v in val_mats.items()}
    rows = np.arange(len(idx))
    naive = oracle_choice(m["score"], m["gen_tokens"])
    out = {"oracle_naive_score": float(m["score"][rows, naive].mean()),
           "oracle_naive_accuracy": float(m["accuracy"][rows, naive].mean()),
           "oracle_naive_tokens": float(m["gen_tokens"][rows, naive].mean())}
    for name, depths in fixed.items():
        k = depths[idx]
        out[f"{name}_score"] = float(m["score"][rows, k].mean())
        out[f"{name}_accuracy"] = float(m["accuracy"][rows, k].mean())
        out[f"{name}_tokens"] = float(m["gen_tokens"][rows, k].mean())
    main = next(iter(fixed))
    out["gap_score_naive"] = out["oracle_naive_score"] - out[f"{main}_score"]
    if "by_level" in fixed:
        out["gap_score_by_level"] = out["by_level_score"] - out[f"{main}_score"]
    if halves is not None:
        a, b = ({k: v[idx] for k, v in h.items()} for h in halves)
        cf = {"score": [], "accuracy": [], "gen_tokens": []}
        for choose, ev in ((a, b), (b, a)):
            pick = oracle_choice(choose["score"], choose["gen_tokens"])
            for k in cf:
                cf[k].append(ev[k][rows, pick].mean())
        out.update({f"oracle_cf_{k}": float(np.mean(v)) for k, v in cf.items()})
        out["gap_score_cf"] = out["oracle_cf_score"] - out[f"{main}_score"]
        curve = crossfit_curve(halves, idx, lambdas)
        # The fixed-depth curve: every depth's mean on these prompts, upper envelope. Its depths
        # are not chosen on other folds (the max over 9 noisy means flatters fixed steering),
        # so a gap against it is the conservative one; a comparator chosen on other folds can
        # be a poor depth (e.g. by accuracy, where depths differ by noise) and flatter the oracle.
        fixed_depth_curve = fixed_curve(m["gen_tokens"], m["accuracy"])
        for name in fixed:
            at = accuracy_at_tokens(curve, out[f"{name}_tokens"])
            out[f"oracle_cf_accuracy_at_{name}_tokens"] = at
            out[f"gap_accuracy_at_{name}_tokens_cf"] = at - out[f"{name}_accuracy"]
            out[f"gap_accuracy_vs_fixed_curve_at_{name}_tokens_cf"] = \
                at - accuracy_at_tokens(fixed_depth_curve, out[f"{name}_tokens"])
    return out


def probe(z0, labels, seed: int = 0) -> dict:
    """Cross-validated linear probe (standardised logistic regression, 5 folds) against the
    majority class predicted from the training folds."""
    import numpy as np
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold, cross_val_predict
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    labels = np.asarray(labels)
    classes, counts = np.unique(labels, return_counts=True)
    folds = int(min(5, counts.min())) if len(classes) > 1 else 0
    if folds < 2:
        return {"n": int(len(labels)), "classes": classes.tolist(), "note": "too few per class"}
    cv = StratifiedKFold(folds, shuffle=True, random_state=seed)
    model = make_pipeline(StandardScaler(), LogisticRegression(C=0.1, max_iter=2000))
    pred = cross_val_predict(model, z0, labels, cv=cv)
    majority = []
    for train, test in cv.split(z0, labels):
        vals, cnt = np.unique(labels[train], return_counts=True)
        majority.append((labels[test] == vals[cnt.argmax()]).sum())
    return {"n": int(len(labels)), "folds": folds,
            "classes": {str(c): int(n) for c, n in zip(classes, counts)},
            "probe_accuracy": float((pred == labels).mean()),
            "majority_accuracy": float(sum(majority) / len(labels))}


def analyse(args) -> None:
    import numpy as np
    import torch
    from scipy.stats import spearmanr

    from lm_eval_ponder.pondering.controller import PonderController
    from lm_eval_ponder.training.environment import CachedEnvironment
    from lm_eval_ponder.training.rewards import RewardConfig
    from lm_eval_ponder.training.rollouts import RolloutCache

    directory = cache_dir(args.root, args.form, args.samples)
    cache = RolloutCache(directory)
    k_max = cache.manifest["k_max"]
    z0 = cache.states()
    flops_ctrl = PonderController(z0.shape[1], 512).evaluation_flops(k_max + 1)
    env = CachedEnvironment(cache, k_max, args.samples, flops_ctrl, RewardConfig(),
                            torch.Generator().manual_seed(0), complete_only=True,
                            max_prompts=args.prompts)
    prompts = env.prompts
    if len(prompts) < 20:
        sys.exit(f"only {len(prompts)} prompts are complete; build further first")
    offsets = cache.manifest["identity"]["offsets"]
    val = list(range(len(prompts)))  # every prompt is held out from its own fixed-depth choice
    mats_val = outcome_matrices(env, val)
    folds = np.array(fold_of([p.key for p in prompts], args.folds))
    fixed, chosen = {}, {}
    for name, key in (("fixed", "score"), ("fixed_acc", "accuracy")):
        fixed[name], chosen[name] = fixed_by_fold(mats_val[key], folds, args.folds)
    # what a controller that knew each prompt's difficulty could do: one depth per task and
    # level, chosen by score on the other folds (GSM8K has no level: one group)
    groups = np.array([f"{p.task}:{p.level}" for p in prompts])
    fixed["by_level"] = np.zeros(len(val), dtype=int)
    chosen["by_level"] = []
    for f in range(args.folds):
        train = folds != f
        picks = {}
        for g in sorted(set(groups)):
            sel = train & (groups == g)
            k = int(mats_val["score"][sel if sel.any() else train].mean(axis=0).argmax())
            fixed["by_level"][(folds == f) & (groups == g)] = k
            picks[str(g).replace("_ponder", "")] = k
        chosen["by_level"].append(picks)
    halves = None
    if args.samples >= 2:
        h = args.samples // 2
        halves = (outcome_matrices(env, val, list(range(h))),
                  outcome_matrices(env, val, list(range(h, 2 * h))))
    lambdas = np.concatenate([[0.0], np.geomspace(1e-6, 1.0, 61)])
    point = headroom_figures(mats_val, halves, fixed, lambdas)
    ci = bootstrap(lambda idx: headroom_figures(mats_val, halves, fixed, lambdas, idx),
                   len(val), args.bootstrap)

    # the fixed-depth curve and the per-level view
    levels = np.array([p.level if p.level is not None else 0 for p in prompts])
    tasks = np.array([p.task for p in prompts])
    per_depth = []
    for k in range(k_max + 1):
        row = {"depth": k, "offset": offsets[k],
               **{name: float(mats_val[name][:, k].mean())
                  for name in ("accuracy", "gen_tokens", "flops", "score")}}
        for task in sorted(set(tasks)):
            row[f"accuracy_{task}"] = float(mats_val["accuracy"][tasks == task, k].mean())
        for lvl in sorted(set(levels[tasks == "arith_ponder"])):
            sel = (tasks == "arith_ponder") & (levels == lvl)
            row[f"accuracy_L{lvl}"] = float(mats_val["accuracy"][sel, k].mean())
        per_depth.append(row)

    # does z_0 carry difficulty? all complete prompts (the probe is cross-validated itself)
    arith = [i for i in val if prompts[i].task == "arith_ponder"]
    z = env.z0.float().numpy()
    best_depth = oracle_choice(mats_val["score"], mats_val["gen_tokens"])
    probes = {
        "level_from_z0 (arith)": probe(z[arith], [prompts[i].level for i in arith]),
        "best_depth_from_z0": probe(z, best_depth),
        "any_depth_correct_from_z0": probe(z, (mats_val["accuracy"].max(axis=1) > 0).astype(int)),
    }
    rho = spearmanr([prompts[i].level for i in arith], best_depth[arith])
    summary = {
        "form": args.form, "samples": args.samples, "cache": str(directory),
        "manifest": cache.manifest["fingerprint"],
        "dtype": str(cache.manifest["identity"]["dtype"]).removeprefix("torch."),
        "k_max": k_max, "offsets": offsets,
        "prompts_complete": len(prompts), "prompts_in_manifest": cache.manifest["n_prompts"],
        "by_task": {t: sum(p.task == t for p in prompts) for t in sorted({p.task for p in prompts})},
        "n_val": len(val), "folds": args.folds,
        "best_fixed_depth_by_score (per fold)": chosen["fixed"],
        "best_fixed_depth_by_accuracy (per fold)": chosen["fixed_acc"],
        "depth_by_level (per fold)": chosen["by_level"],
        "headroom_val": point, "headroom_val_ci95": ci, "fixed_depths_val": per_depth,
        "probes": probes,
        "spearman_level_vs_oracle_depth (arith, all complete)": {
            "rho": float(rho.statistic), "p": float(rho.pvalue)},
        "oracle_depth_histogram (all complete)": np.bincount(best_depth, minlength=k_max + 1).tolist(),
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    # a subset (--prompts N) is its own page beside the whole cache's, never over it
    name = directory.name + (f"-n{len(prompts)}" if args.prompts is not None
                             and len(prompts) < cache.manifest["n_prompts"] else "")
    (out / f"{name}.json").write_text(json.dumps(summary, separators=(",", ":")) + "\n")
    write_markdown(out / f"{name}.md", summary)
    plot(out / f"{name}.png", summary, halves, lambdas)
    print((out / f"{name}.md").read_text())


def write_markdown(path: Path, s: dict) -> None:
    h, ci = s["headroom_val"], s["headroom_val_ci95"]

    def fmt(key: str, digits: int = 3) -> str:
        if h[key] != h[key]:
            return "n/a (the oracle curve does not reach that few tokens)"
        lo, hi = ci.get(key, (float("nan"), float("nan")))
        return f"{h[key]:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"

    lines = [f"# Headroom: form `{s['form']}`, {s['samples']} samples per (prompt, depth)", "",
             f"Cache `{s['cache']}` (manifest {s['manifest']}): {s['prompts_complete']} of "
             f"{s['prompts_in_manifest']} prompts complete ({s['by_task']}; backbone in "
             f"{s['dtype']}), every one held "
             f"out: the fixed depth of each of {s['folds']} folds (by key hash) is chosen on the "
             f"other folds. Depths 0..{s['k_max']} at offsets "
             f"{[round(c, 3) for c in s['offsets']]}.", "",
             "Held-out figures, 95% bootstrap CIs over prompts:", "",
             "| | score | accuracy | tokens |", "|---|---|---|---|",
             f"| best fixed depth by score (k per fold: {s['best_fixed_depth_by_score (per fold)']}) "
             f"| {fmt('fixed_score')} | {fmt('fixed_accuracy')} | "
             f"{fmt('fixed_tokens', 1)} |",
             f"| best fixed depth by accuracy (k per fold: "
             f"{s['best_fixed_depth_by_accuracy (per fold)']}) | "
             f"{fmt('fixed_acc_score')} | {fmt('fixed_acc_accuracy')} | "
             f"{fmt('fixed_acc_tokens', 1)} |",
             f"| one depth per level, chosen by score on the other folds | "
             f"{fmt('by_level_score')} | {fmt('by_level_accuracy')} | {fmt('by_level_tokens', 1)} |",
             f"| per-prompt oracle, naive (same samples) | {fmt('oracle_naive_score')} | "
             f"{fmt('oracle_naive_accuracy')} | {fmt('oracle_naive_tokens', 1)} |"]
    if "oracle_cf_score" in h:
        lines += [f"| per-prompt oracle by score, cross-fitted | {fmt('oracle_cf_score')} | "
                  f"{fmt('oracle_cf_accuracy')} | {fmt('oracle_cf_gen_tokens', 1)} |", "",
                  f"- gap in expected score (cross-fitted oracle - best fixed): {fmt('gap_score_cf')}",
                  f"- gap in accuracy at the best-score fixed depth's tokens (cross-fitted "
                  f"oracle curve): {fmt('gap_accuracy_at_fixed_tokens_cf')}",
                  f"- gap in accuracy at the best-accuracy fixed depth's tokens: "
                  f"{fmt('gap_accuracy_at_fixed_acc_tokens_cf')}",
                  "- the same two gaps against the fixed-depth curve (every depth's mean on the "
                  "same prompts, upper envelope; conservative, as the max of 9 noisy means "
                  "flatters fixed steering): "
                  f"{fmt('gap_accuracy_vs_fixed_curve_at_fixed_tokens_cf')} and "
                  f"{fmt('gap_accuracy_vs_fixed_curve_at_fixed_acc_tokens_cf')}"]
    lines += [f"- gap in expected score (naive oracle - best fixed, an upper bound): "
              f"{fmt('gap_score_naive')}",
              f"- gap in expected score (one depth per level - best fixed): "
              f"{fmt('gap_score_by_level')}; depths per level by fold: " + "; ".join(
                  " ".join(f"{g}={k}" for g, k in fold.items())
                  for fold in s["depth_by_level (per fold)"]), "", "Fixed depths, all complete prompts:", ""]
    cols = [c for c in s["fixed_depths_val"][0] if c not in ("depth",)]
    lines += ["| depth | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for row in s["fixed_depths_val"]:
        lines.append(f"| {row['depth']} | " + " | ".join(
            f"{row[c]:.3g}" if isinstance(row[c], float) else str(row[c]) for c in cols) + " |")
    lines += ["", "Probes from z_0 (5-fold CV, logistic regression) against the majority class:", ""]
    for name, p in s["probes"].items():
        if "probe_accuracy" in p:
            lines.append(f"- {name}: {p['probe_accuracy']:.3f} vs majority "
                         f"{p['majority_accuracy']:.3f} (n={p['n']}, classes {p['classes']})")
        else:
            lines.append(f"- {name}: {p['note']} (n={p['n']})")
    r = s["spearman_level_vs_oracle_depth (arith, all complete)"]
    lines += [f"- Spearman(level, oracle depth), arith: rho={r['rho']:.3f} (p={r['p']:.3g})",
              f"- oracle depth histogram: {s['oracle_depth_histogram (all complete)']}", ""]
    path.write_text("\n".join(lines))


def plot(path: Path, s: dict, halves, lambdas) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from lm_eval_ponder.reporting.images import save_figure

    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    rows = s["fixed_depths_val"]
    ax.plot([r["gen_tokens"] for r in rows], [r["accuracy"] for r in rows], "o-", color="C0",
            label="fixed depth (offset c_k)")
    for r in rows:
        ax.annotate(str(r["depth"]), (r["gen_tokens"], r["accuracy"]), fontsize=7,
                    textcoords="offset points", xytext=(3, 3))
    if halves is not None:
        curve = crossfit_curve(halves, np.arange(s["n_val"]), lambdas)
        order = np.argsort(curve[:, 0])
        ax.plot(curve[order, 0], curve[order, 1], "s--", ms=3, color="C3",
                label="per-prompt oracle, cross-fitted (acc - lambda tokens)")
    h = s["headroom_val"]
    ax.plot([h["oracle_naive_tokens"]], [h["oracle_naive_accuracy"]], "^", color="C1",
            label="per-prompt oracle by score, naive (upper bound)")
    ax.plot([h["by_level_tokens"]], [h["by_level_accuracy"]], "D", color="C2",
            label="one depth per level (chosen on other folds)")
    ax.set_xlabel("mean generated tokens")
    ax.set_ylabel("expected accuracy")
    ax.set_ylim(0, 1)
    ax.set_title(f"Headroom, form {s['form']}: {s['n_val']} prompts (cross-fitted), "
                 f"{s['samples']} samples", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, path, dpi=120)  # a palette PNG: a third the bytes
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    for name in ("build", "analyse"):
        cache_arguments(sub.add_parser(name))
    b = sub.choices["build"]
    b.add_argument("--max-tokens", type=int, default=256)
    b.add_argument("--batch-size", type=int, default=0,
                   help="rows per generation call, a block's prompts x depths x samples (0: 4 x "
                        "the loop's rows in flight)")
    b.add_argument("--threads", type=int, default=2)
    b.add_argument("--blocks", type=block_range, default=None, metavar="START:STOP",
                   help="only these prompt blocks (batch_size // (samples x depths) prompts "
                        "each; see rollouts.block_size), so two "
                        "one-thread builds can share a machine: --blocks 0:5 and --blocks 5:")
    b.add_argument("--dtype", default=None,
                   help="backbone dtype (default: the cache's own, else the device's native one)")
    b.add_argument("--restore-only", action="store_true",
                   help="only rebuild prompts.jsonl and states.safetensors of a cache whose "
                        "outcomes came from git (they are not committed), generate nothing")
    a = sub.choices["analyse"]
    a.add_argument("--out", default="docs/headroom", help="summary JSON, table and plot")
    a.add_argument("--folds", type=int, default=5, help="cross-fitting folds of prompts")
    a.add_argument("--prompts", type=int, default=None,
                   help="only the first N complete prompts (default: all complete ones)")
    a.add_argument("--bootstrap", type=int, default=2000)
    args = p.parse_args(argv)
    if args.samples < 1:
        sys.exit("--samples must be >= 1")
    build(args) if args.command == "build" else analyse(args)


if __name__ == "__main__":
    from lm_eval_ponder.errors import command, run_program

    run_program(command(main))  # a PonderError (a missing cache, a bad flag) is one line
