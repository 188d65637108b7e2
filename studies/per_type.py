"""Does one ponder depth per problem type beat one depth for all, held out, under the decoding
the controllers were trained at? (issue 52)

    export LM_EVAL_PONDER_DATA=../shared/data
    # the training prompts' rollout caches (T = 0.7, 4 samples per prompt and depth), with the
    # cross-fitted controllers of an adaptation sweep judged on the same held-out prompts
    python studies/per_type.py caches --form ours --sweep results/adaptation/ours-s4/n600-787ccefe8d
    # a fixed-depth sweep of the test documents (testset.py sweep), greedy or sampled
    python studies/per_type.py sweep --root results/testset-bf16 --form ours --decoding greedy

Every policy is chosen on some items and scored on others (5 folds by key hash):
- ``single``: the one depth with the best mean accuracy on the other folds;
- ``per_type``: one depth per arith level and one for GSM8K, each chosen the same way. z_0
  predicts the arith level with 0.998 accuracy (docs/results/headroom.md), so this is what a controller
  reading z_0 could at least learn; a controller that sees only the type is a fair upper
  reference for it.
The per-type headroom over ``single`` comes with a bootstrap interval over items and a null:
the same procedure with the type labels shuffled, which shows what choosing per group buys by
chance. The in-sample envelope (the best depth chosen on the items it is scored on, what the
earlier "fixed curve" comparisons used) is printed beside them as the optimistic bound it is.
Accuracy on the caches is the mean of the 4 sampled answers per (prompt, depth): the expected
accuracy at T = 0.7. Nothing here generates; seconds per run.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from studylib import records as archive
from studylib.analysis import FOLDS, controller_gaps, fold_of, per_type_headroom
from studylib.caches import FORMS, cache_dir, cache_matrices, train_config


class TemplateOnly:
    """What ``build_prompts`` needs of a model, HFLM's chat template, from the tokenizer alone:
    the prompts' keys and levels are rebuilt without loading weights or computing z_0."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer

    def apply_chat_template(self, chat_history, add_generation_prompt: bool = True) -> str:
        return self.tokenizer.apply_chat_template(
            chat_history, tokenize=False, add_generation_prompt=add_generation_prompt,
            continue_final_message=not add_generation_prompt)


def prompt_types(form: str, keys: list[str]) -> list[str]:
    """The problem type of each training prompt (``arith:L<level>``, ``gsm8k``), from the
    prompts rebuilt as the cache built them (``training.rollouts.build_prompts``)."""
    from transformers import AutoTokenizer

    from lm_eval_ponder import backbone as bb
    from lm_eval_ponder.errors import PonderError
    from lm_eval_ponder.training.rollouts import build_prompts

    cfg = train_config(form, 4, 256, 1)
    lm = TemplateOnly(AutoTokenizer.from_pretrained(bb.resolve_backbone(None).path))
    built = {p.key: p for p in build_prompts(lm, cfg.rollout)}
    missing = [k for k in keys if k not in built]
    if missing:
        raise PonderError(f"{len(missing)} cache keys are not among the rebuilt prompts "
                          f"(e.g. {missing[0]}): another prompt set or chat template")
    return [type_of(built[k].task, built[k].level) for k in keys]


def type_counts(groups) -> dict[str, int]:
    return {str(g): int((groups == g).sum()) for g in sorted(set(groups.tolist()))}


def type_of(task: str, level) -> str:
    dataset = task.split("_ponder")[0]
    return f"{dataset}:L{level}" if level is not None else dataset


def sweep_runs(sweep: Path, keys: list[str], k_max: int) -> dict[str, list[dict]]:
    """Arm -> its runs' held-out items and depths (at the controller's own tau), from the
    sweep's packed records (``studylib.heldout``)."""
    from studylib.heldout import records

    index = {k: i for i, k in enumerate(keys)}
    arms: dict[str, list[dict]] = {}
    for name, rec in sorted(records(sweep).items()):
        arm = name.split("/")[0]
        if "/fold" not in name:  # a final controller trained on every prompt: not held out
            continue
        arms.setdefault(arm, []).append({"val": [index[k] for k in rec["val_keys"]],
                                         "depth": [min(int(d), k_max) for d in rec["val_depths"]]})
    return arms


def caches(args) -> dict:
    import numpy as np

    directory = cache_dir(args.root, args.form, args.samples)
    from lm_eval_ponder.errors import PonderError

    if not (directory / "manifest.json").is_file():
        raise PonderError(f"no rollout cache at {directory} (its manifest.json): build one with "
                          "studies/headroom.py build, or pass --root")
    if args.sweep and not (Path(args.sweep) / "prompts.json").is_file():
        raise PonderError(f"--sweep {args.sweep} holds no prompts.json: pass an adaptation "
                          "sweep directory (studies/adaptation.py train)")
    manifest = json.loads((directory / "manifest.json").read_text())
    k_max = manifest["k_max"]
    sweep = Path(args.sweep) if args.sweep else None
    keys = json.loads((sweep / "prompts.json").read_text())["keys"] if sweep else None
    if keys is None:
        from lm_eval_ponder.training.rollouts import read_outcomes

        keys = sorted({r["key"] for p in directory.glob("rollouts.*.outcomes.json.xz")
                       for r in read_outcomes(p)})
    acc, tok = cache_matrices(directory, keys, k_max)
    groups = np.array(prompt_types(args.form, keys))
    fold = np.array(fold_of(keys, FOLDS))
    out = {"what": "training prompts' rollout cache", "cache": str(directory),
           "decoding": manifest["identity"]["generation"], "dtype": manifest["identity"]["dtype"],
           "form": args.form, "types": type_counts(groups),
           **per_type_headroom(acc, tok, groups, fold, FOLDS, args.bootstrap, args.nulls)}
    if sweep:
        out["controllers"] = {arm: controller_gaps(acc, tok, groups, runs, args.bootstrap)
                              for arm, runs in sweep_runs(sweep, keys, k_max).items()}
        out["sweep"] = str(sweep)
    return out


def sweep_matrix(root: Path, form: str, decoding: str, k_max: int):
    """[document, depth] accuracy and tokens of a test-set sweep (mean over each depth's
    seeds: depths may have different numbers of them), with each document's type and key,
    and the number of seeds per depth."""
    import numpy as np

    from lm_eval_ponder.reporting.compact import read_samples

    per_depth = []
    for k in range(k_max + 1):
        logs = sorted((root / form / f"k{k}").glob(f"{decoding}*/FR/*/*/samples_*.compact.jsonl.xz"))
        if not logs:
            from lm_eval_ponder.errors import PonderError

            raise PonderError(f"{root / form / f'k{k}'}: no finished {decoding} run (run "
                              f"studies/testset.py sweep --decoding {decoding} first)")
        seeds = [{s["doc_id"]: s for s in read_samples(log)} for log in logs]
        per_depth.append(seeds)
    docs = sorted(set.intersection(*(set(s) for seeds in per_depth for s in seeds)))
    acc = np.array([[np.mean([s[d]["exact_match"] for s in seeds]) for seeds in per_depth]
                    for d in docs])
    tok = np.array([[np.mean([s[d]["gen_tokens"] for s in seeds]) for seeds in per_depth]
                    for d in docs])
    first = per_depth[0][0]
    groups = np.array([type_of("arith_ponder", first[d]["doc"].get("level")) for d in docs])
    keys = [str(first[d]["doc"].get("id", d)) for d in docs]
    return acc, tok, groups, keys, [len(seeds) for seeds in per_depth]


def sweep(args) -> dict:
    import numpy as np

    k_max = train_config(args.form, 1, 256, 1).ponder.k_max
    acc, tok, groups, keys, seeds = sweep_matrix(Path(args.root), args.form, args.decoding, k_max)
    fold = np.array(fold_of(keys, FOLDS))
    return {"what": "test documents' fixed-depth sweep", "root": args.root, "form": args.form,
            "decoding": args.decoding, "seeds": seeds,
            "types": type_counts(groups),
            **per_type_headroom(acc, tok, groups, fold, FOLDS, args.bootstrap, args.nulls)}


def markdown(s: dict) -> str:
    lines = [f"# One depth per type against one for all: {s['what']} (form `{s['form']}`)", "",
             f"Decoding: {s['decoding']}; {s['n']} items, {s['folds']} folds by key hash; "
             f"types {s['types']}. Every policy below except the last two rows is chosen on "
             "the other folds and scored held out; 95% bootstrap CIs over items.", "",
             *([("Seeds per depth (a depth's accuracy and tokens are the mean over its "
                 "seeds): " + ", ".join(f"k={k}: {n}" for k, n in enumerate(s["seeds"]))
                 + "."), ""] if isinstance(s.get("seeds"), list) and max(s["seeds"]) > 1
               else []),
             "| policy | accuracy | tokens |", "|---|---|---|",
             f"| one depth for all, cross-fitted | {s['single']['accuracy']:.4f} | "
             f"{s['single']['tokens']:.1f} |",
             f"| one depth per type, cross-fitted | {s['per_type']['accuracy']:.4f} | "
             f"{s['per_type']['tokens']:.1f} |",
             f"| best depth in sample (k = {s['envelope_in_sample']['depth']}; optimistic) | "
             f"{s['envelope_in_sample']['accuracy']:.4f} | "
             f"{s['envelope_in_sample']['tokens']:.1f} |",
             f"| per-item best depth in sample (noisy upper bound) | "
             f"{s['oracle_per_item_in_sample']:.4f} | |", "",
             f"**Per-type headroom over one depth: {s['headroom']:+.4f} "
             f"[{s['headroom_ci95'][0]:+.4f}, {s['headroom_ci95'][1]:+.4f}]**; null (type labels "
             f"shuffled, {s['null']['draws']} draws): mean {s['null']['mean']:+.4f}, 95th "
             f"percentile {s['null']['q95']:+.4f}, p = {s['null']['p']:.3f}.", ""]
    if s.get("controllers"):
        lines += ["Cross-fitted controllers on the same held-out prompts (depth at the "
                  "controller's own tau; per prompt averaged over its seeds):", "",
                  "| arm | accuracy | tokens | minus the fixed curve at its tokens (cross-fitted) "
                  "| minus one depth (cross-fitted) | minus one depth per type (cross-fitted) |",
                  "|---|---|---|---|---|---|"]

        def gap(c, name):
            lo, hi = c[f"gap_{name}_ci95"]
            return f"{c[f'gap_{name}']:+.4f} [{lo:+.4f}, {hi:+.4f}]"

        for arm, c in s["controllers"].items():
            lines.append(f"| {arm} | {c['accuracy']:.4f} | {c['tokens']:.1f} | "
                         f"{gap(c, 'budget')} | {gap(c, 'single')} | {gap(c, 'per_type')} |")
        lines.append("")
    acc, tok = s["per_depth"]["accuracy"], s["per_depth"]["tokens"]
    lines += ["Every depth, all items: " + ", ".join(
        f"k={k}: {a:.3f} / {t:.0f} tok" for k, (a, t) in enumerate(zip(acc, tok))), ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("caches")
    c.add_argument("--form", choices=sorted(FORMS), default="ours")
    c.add_argument("--root", default="results/headroom")
    c.add_argument("--samples", type=int, default=4)
    c.add_argument("--sweep", default=None, help="an adaptation sweep (its prompts and controllers)")
    s = sub.add_parser("sweep")
    s.add_argument("--form", choices=sorted(FORMS), default="ours")
    s.add_argument("--root", default="results/testset-bf16")
    s.add_argument("--decoding", default="greedy")
    for q in (c, s):
        q.add_argument("--bootstrap", type=int, default=2000)
        q.add_argument("--nulls", type=int, default=200)
        q.add_argument("--out", default=None, help="write <out>.json and <out>.md")
    args = p.parse_args(argv)
    archive.ensure(args.root)  # a committed sweep (results/<root>.tar.xz)
    summary = {"caches": caches, "sweep": sweep}[args.command](args)
    text = markdown(summary)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out + ".json").write_text(json.dumps(summary, separators=(",", ":")) + "\n")
        Path(args.out + ".md").write_text(text)
    print(text)


if __name__ == "__main__":
    from lm_eval_ponder.errors import command, run_program

    run_program(command(main))  # a PonderError (a missing cache, a bad flag) is one line
