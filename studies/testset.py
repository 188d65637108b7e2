"""Trained controllers against the fixed-alpha sweep on the test documents, through lm_eval.

    export LM_EVAL_PONDER_DATA=../shared/data
    # 1. the sweep: --model ponder alpha=c_k for every depth k of the form, greedy, on the full
    #    arith ladder (500) and the first 500 GSM8K test questions (resumable, see below)
    python studies/testset.py sweep --form ours
    # 2. controllers: trained on the headroom cache's complete prompts, one per arm and seed
    python studies/adaptation.py train --form ours --samples 4 --final
    # 3. every controller against the sweep; 4. the composition checked through lm_eval itself
    python studies/testset.py analyse --form ours --sweep results/adaptation/ours-s4/n128-...
    python studies/testset.py verify --form ours --controller DIR --limit 100
    # at the decoding the controllers were trained at (issue 52): each seed's sweep, composed
    # and averaged per document over the seeds
    python studies/testset.py analyse --form ours --dtype float32 --root results/testset-t0.7 \
        --decoding t0.7 --seeds 0,1,2 --sweep results/adaptation/ours-s4/n600-... --out DIR
    # a token-level controller generates its own answers, then joins the analysis
    python studies/testset.py evaluate --form ours --controller DIR [--tau 0.5]
    python studies/testset.py analyse --form ours ... --generated DIR [DIR@tau=0.5]
    # where a long sweep stands: each finished depth's figures so far, and where controllers go
    python studies/testset.py status --form paper [--sweep DIR] [--extra DIR ...]
    # the halting threshold tau swept for given controllers on the arith sweep (no generation)
    python studies/testset.py taus --form ours --extra DIR ... [--taus 0.05,0.1,0.2,0.3,0.5,0.8]
    # the literal reading of tau (issue 52): halt pondering once the backbone's own next-token
    # probability falls below tau; no controller, no generation beyond one probe per depth
    python studies/testset.py literal --form ours --decoding t0.7 --dtype float32 \
        --root results/testset-t0.7 --out docs/adaptation/literal-tau
    # a committed taus or literal page read against the cross-fitted and smoothed curves beside
    # its in-sample envelope (issue 65), from the page and the committed sweep alone
    python studies/testset.py comparators --root results/testset-bf16 \
        --page docs/testset/bf16/taus-ours.json

Why the controllers need no generation of their own: a prompt-level controller chooses its
depth k once, from z_0, and the answer is then generated at the fixed offset c_k, which is what
``--model ponder alpha=c_k`` generates. So the sweep's K+1 runs already hold every controller's
answers: its result on a document is the sweep's answer at the depth it chooses there (from
z_0 through the inference path, ``pondering.dynamics.ponder``), plus its own FLOPs. ``verify``
tests that claim on the first N documents by running a controller through lm_eval
(``--model ponder controller=DIR``) and comparing depth and answer text per document; its
agreement is reported next to the figures.

Every lm_eval run is one directory under ``results/testset/<form>/k<k>`` written by
``python -m lm_eval_ponder.suite`` with ``--resume_within``: finished runs are skipped and a
killed run keeps the answers it had (lm-eval's ``--use_cache``), so re-running the same command
continues. The dtype is pinned (``--dtype``, default bfloat16: the dtype the committed rollout
caches and their controllers were built in) so that a sweep resumed on another machine stays one
configuration; each dtype has its own runs (``results/testset-bf16``; float32:
``results/testset``, the first sweeps) and figures (``docs/testset/bf16``; float32:
``docs/testset``). Arith runs first at every depth, then GSM8K.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

from studylib import records as archive
from studylib.analysis import (
    COMPARATOR_HEADER,
    FOLDS,
    accuracy_at_tokens,
    bootstrap,
    comparator_cells,
    comparator_gaps,
    comparators_said,
    curve_said,
    curve_verdict,
    depth_by_level,
    final_controller_gaps,
    fixed_by_fold,
    fixed_curve,
    fixed_curve_summary,
    fold_of,
    oracle_choice,
    smoothed_curve,
)
from studylib.caches import FORMS, train_config
from studylib.pages import write_page

from lm_eval_ponder.reporting.compact import answers_digest
from lm_eval_ponder.reporting.suite_plan import seed_folder  # the suite's layout of seeds

TASKS = {"arith": 500, "gsm8k": 500}


def offsets_of(form: str) -> list[float]:
    from lm_eval_ponder.pondering.dynamics import cumulative_offsets

    return cumulative_offsets(train_config(form, 1, 256, 1).ponder).tolist()


def default_root(dtype: str) -> str:
    """Where a dtype's sweep lives: float32 kept the first sweeps' place, others get their own."""
    return "results/testset" if dtype == "float32" else f"results/testset-{short_dtype(dtype)}"


def default_out(dtype: str) -> str:
    return "docs/testset" if dtype == "float32" else f"docs/testset/{short_dtype(dtype)}"


def short_dtype(dtype: str) -> str:
    return {"bfloat16": "bf16", "float16": "fp16"}.get(dtype, dtype)


def run_dir(root: str, form: str, k: int) -> Path:
    return Path(root) / form / f"k{k}"


def task_list(spec: str) -> list[str]:
    """A comma list of this script's tasks, refused with the known ones if any is unknown."""
    tasks = spec.split(",")
    unknown = [t for t in tasks if t not in TASKS]
    if unknown:
        sys.exit(f"unknown task(s) {unknown}; known: {sorted(TASKS)}")
    return tasks


def sweep(args) -> None:
    offsets = offsets_of(args.form)
    depths = (list(range(len(offsets))) if args.depths is None
              else [int(k) for k in args.depths.split(",")])
    for task in task_list(args.tasks):
        for k in depths:
            print(f"[{args.form}] {task}, depth {k} (alpha={offsets[k]:.4f})", flush=True)
            run_fixed(args, run_dir(args.root, args.form, k), task, offsets[k],
                      args.limit or TASKS[task])


def run_fixed(args, out: Path, task: str, alpha: float, limit: int) -> None:
    """``--model ponder alpha=...`` (FR, no controller) on the first ``limit`` documents of
    ``task``, resumable, in the suite's layout under ``out``."""
    from lm_eval_ponder.reporting import suite

    code = suite.main([
        "--output", str(out), "--methods", "FR", "--alpha", repr(alpha), "--tasks", task,
        "--limit", str(limit), "--max_gen_toks", str(args.max_tokens),
        "--batch_size", str(args.batch_size), "--controller", "none", "--resume_within",
        "--no_report", "--model_args", f"dtype={args.dtype}",
        "--decoding", getattr(args, "decoding", "greedy"),
        "--seeds", getattr(args, "seeds", "0"), *(["--plan"] if getattr(args, "plan", False)
                                                 else []),
        *(["--pilot", args.pilot] if getattr(args, "pilot", None) else [])])
    if code:
        sys.exit(code)


# ----------------------------------------------------------------------------- reading
def samples_file(directory: Path, task: str) -> Path | None:
    """The run's samples log: the full one, else the compact one a committed run keeps
    (``reporting.compact``: scores, tokens, FLOPs, prompts and a digest of the answers)."""
    from lm_eval_ponder.reporting.compact import latest_log

    return latest_log(directory, f"{task}_ponder")


def parse_seeds(spec: str, decoding: str) -> tuple[int, ...]:
    """``--seeds`` as a tuple; greedy decoding draws nothing, so it has one seed only."""
    from lm_eval_ponder.errors import PonderError

    try:
        seeds = tuple(sorted({int(v) for v in spec.split(",") if v.strip()}))
    except ValueError:
        raise PonderError(f"--seeds {spec!r}: expected a comma list of integers, e.g. 0,1,2") from None
    if not seeds:
        raise PonderError("--seeds: name at least one seed")
    if decoding == "greedy" and seeds != (0,):
        raise PonderError("--seeds: greedy decoding draws nothing; its sweep has seed 0 only")
    return seeds


def load_sweep(root: str, form: str, task: str, k_max: int, decoding: str = "greedy",
               seeds: tuple[int, ...] = (0,)) -> dict | None:
    """The sweep on one task as [depth, doc] arrays, or None until every depth has finished
    for every seed (``decoding``: the suite's decoding folder, ``greedy`` or ``t0.7``).
    With several seeds each cell is the document's mean over them (its correctness becomes
    the share of seeds that answered it right): a controller's depth is chosen from z_0,
    whatever the draw, so its result on a document is that depth's mean over the draws."""
    import numpy as np

    per_seed, wall = [], 0.0
    for seed in seeds:
        per_k = []
        for k in range(k_max + 1):
            st = depth_status(root, form, task, k, seed_folder(decoding, seed))
            if st["state"] != "finished":
                return None
            per_k.append(st["samples"])
            wall += st["wall_s"] or 0.0
        per_seed.append(per_k)
    docs = sorted(per_seed[0][0])
    if any(sorted(p) != docs for per_k in per_seed for p in per_k):
        sys.exit(f"{task}: the sweep's depths or seeds answered different documents; re-run "
                 "one limit")
    first = per_seed[0][0]

    def grid(key):
        return np.array([[np.mean([float(per_k[k][d][key]) for per_k in per_seed]) for d in docs]
                         for k in range(k_max + 1)])

    return {"docs": docs, "correct": grid("exact_match"), "gen_tokens": grid("gen_tokens"),
            "flops": grid("flops"), "seeds": list(seeds),
            # the first seed's answers: what ``verify`` compares a controller's own run with
            "answers": [[answers_digest(p[d]) for d in docs] for p in per_seed[0]],
            "contexts": [first[d]["arguments"]["gen_args_0"]["arg_0"] for d in docs],
            # the cross-fitting key: the document's own id, as per_type.py folds the same sweep
            "keys": [str(first[d]["doc"].get("id", d)) for d in docs],
            "level": np.array([-1 if first[d]["doc"].get("level") is None
                               else int(first[d]["doc"]["level"]) for d in docs]),
            "wall_s": wall}


def test_states(root: str, form: str, task: str, contexts: list[str], dtype: str):
    """z_0 of every test prompt, computed as the rollout cache computes it for training prompts
    (``training.rollouts.prompt_states``: one prompt at a time, the steering layer's output at
    the last token); kept next to the sweep, keyed by the contexts."""
    import torch
    from safetensors.torch import load_file, save_file

    path = Path(root) / form / f"z0_{task}.safetensors"
    digest = hashlib.sha256("\n\0".join(contexts).encode()).hexdigest()
    if path.is_file():
        from safetensors import safe_open

        with safe_open(str(path), "pt") as f:
            meta = f.metadata() or {}
            if meta.get("contexts_sha256") == digest and meta.get("dtype") == dtype:
                return load_file(str(path))["z0"]
    from lm_eval_ponder.training.loop import load_backbone
    from lm_eval_ponder.training.rollouts import prompt_states

    cfg = train_config(form, 1, 256, 1, dtype)
    generator = load_backbone(cfg)
    with torch.no_grad():
        z0 = prompt_states(generator, contexts, generator.require_steering().layer).float()
    save_file({"z0": z0.contiguous()}, str(path),
              metadata={"contexts_sha256": digest, "dtype": dtype})
    return z0


def confidence_by_depth(model, encode, layer: int, step, offsets: list[float],
                        contexts: list[str]):
    """The backbone's top next-token probability after each prompt, steered at each depth's
    offset: [N, K+1], float32. This is what the first answer token is drawn from at depth k
    (the prompt-mode hook adds c_k x ``step`` to ``layer``'s output at the last prompt token).

    One prompt at a time, as ``test_states`` (no padding): the prompt but its last token runs
    once unsteered into a cache, which is then repeated K+1 times, and the last token runs for
    every depth in one forward with one offset per row."""
    import torch
    from transformers import DynamicCache

    from lm_eval_ponder.engine import cache_keyword
    from lm_eval_ponder.pondering.dynamics import RowOffsets
    from lm_eval_ponder.pondering.hook import SteeringHook

    device = next(model.parameters()).device
    rows, keyword = len(offsets), cache_keyword(model)
    out = []
    with torch.no_grad():
        for context in contexts:
            ids = encode(context).to(device)
            if ids.shape[1] < 2:
                raise ValueError(f"a prompt of {ids.shape[1]} token(s) has nothing to cache")
            cache = DynamicCache(config=model.config)
            model(input_ids=ids[:, :-1], use_cache=True, **{keyword: cache})
            cache.batch_repeat_interleave(rows)
            with SteeringHook(model, layer, step, 1.0, RowOffsets(offsets, device)):
                logits = model(input_ids=ids[:, -1:].expand(rows, 1), use_cache=True,
                               logits_to_keep=1, **{keyword: cache}).logits[:, -1].float()
            out.append(torch.softmax(logits, dim=-1).amax(dim=-1).cpu())
    return torch.stack(out)


def test_confidences(root: str, form: str, task: str, contexts: list[str], dtype: str,
                     offsets: list[float]):
    """``confidence_by_depth`` of every test prompt with the shipped steering, kept next to
    the sweep (keyed by the contexts, dtype and offsets), and the FLOPs of one probe (the
    layers above the steering layer and the LM head, for one token)."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    from lm_eval_ponder.flops import FlopsSpec, layers_flops, lm_head_flops

    path = Path(root) / form / f"confidence_{task}.safetensors"
    key = {"contexts_sha256": hashlib.sha256("\n\0".join(contexts).encode()).hexdigest(),
           "dtype": dtype, "offsets": json.dumps([round(c, 8) for c in offsets])}
    if path.is_file():
        with safe_open(str(path), "pt") as f:
            meta = f.metadata() or {}
        if all(meta.get(k) == v for k, v in key.items()):
            t = load_file(str(path))
            return t["confidence"], float(t["probe_flops"].mean())
    from lm_eval_ponder.backbone import decoder_layers
    from lm_eval_ponder.training.loop import load_backbone

    generator = load_backbone(train_config(form, 1, 256, 1, dtype))
    model, steering = generator.model, generator.require_steering()
    conf = confidence_by_depth(model, lambda c: generator.encode_batch([c])[0], steering.layer,
                               steering.scale * steering.vector, offsets, contexts)
    spec = FlopsSpec.from_model(model)
    above = len(decoder_layers(model)) - (steering.layer % len(decoder_layers(model))) - 1
    lengths = [int(generator.encode_batch([c])[0].shape[1]) for c in contexts]
    probe = torch.tensor([float(layers_flops(spec, above, 1, n - 1) + lm_head_flops(spec, 1))
                          for n in lengths])
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({"confidence": conf.contiguous(), "probe_flops": probe}, str(path), metadata=key)
    return conf, float(probe.mean())


def literal_depths(confidence, tau: float):
    """The literal reading of the paper's "termination threshold 0.2 ... halting generation
    when the predicted next-token probability falls below this value", as a halting rule for
    pondering: ponder while the steered backbone is at least tau sure of its next token, halt
    at the first depth where it is not (K_max if never). It is ``halting_depth`` with the
    backbone's confidence in place of the controller's phi; and the probes it needed (one per
    depth tested: d + 1, or K at the budget)."""
    from lm_eval_ponder.pondering.dynamics import halting_depth

    depth = halting_depth(confidence, tau)
    k_max = confidence.shape[1] - 1
    return depth.numpy(), (depth + 1).clamp(max=k_max).numpy()


def literal(args) -> None:
    """The literal tau rule on a finished arith sweep, composed as ``taus`` composes
    controllers: depths from ``literal_depths`` at each tau, answers from the sweep at those
    depths, against the fixed-alpha curve at equal tokens. Generates nothing beyond the probes
    (kept, so a second run is instant)."""
    import numpy as np

    offsets = offsets_of(args.form)
    s = load_sweep(args.root, args.form, "arith", len(offsets) - 1, args.decoding)
    if s is None:
        sys.exit(f"the arith sweep under {args.root} ({args.decoding}) is not finished at every "
                 "depth: run `testset.py sweep` first")
    probe_dtype = args.probe_dtype or args.dtype
    conf, probe = test_confidences(args.root, args.form, "arith", s["contexts"], probe_dtype,
                                   offsets)
    rows = {}
    for tau in [float(v) for v in args.taus.split(",")]:
        depth, probes = literal_depths(conf, tau)
        rule = f"tau={tau:g}"
        rows[rule] = controller_row(
            lambda idx, depth=depth, cost=probes * probe: composed_figures(s, depth, cost, idx),
            depth, s["level"], Path(rule), args.bootstrap)
        keep_comparators(rows[rule], s, depth, args.bootstrap)
    quantiles = [0.1, 0.25, 0.5, 0.75, 0.9]
    summary = {"form": args.form, "dtype": args.dtype, "probe_dtype": probe_dtype,
               "decoding": args.decoding, "task": "arith", "documents": len(s["docs"]),
               "rule": literal_depths.__doc__,
               "probe_flops_mean": probe,
               "confidence_quantiles": {f"k={k}": np.quantile(conf[:, k].numpy(), quantiles)
                                        .round(4).tolist() for k in range(len(offsets))},
               "rules": rows,
               "fixed": [{"depth": k, "accuracy": float(s["correct"][k].mean()),
                          "gen_tokens": float(s["gen_tokens"][k].mean())}
                         for k in range(len(offsets))],
               "curve": sweep_curve_summary(s)}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"literal-{args.form}-{args.decoding}"  # "t0.7": not a suffix to replace
    out.joinpath(f"{stem}.json").write_text(json.dumps(summary, separators=(",", ":")) + "\n")
    write_literal_markdown(out / f"{stem}.md", summary)
    print(out.joinpath(f"{stem}.md").read_text())


def write_literal_markdown(path: Path, summary: dict) -> None:
    probe, rows = summary["probe_flops_mean"], summary["rules"]
    lines = [f"# The literal tau rule on the arith test sweep, form `{summary['form']}`, "
             f"{summary['decoding']} ({summary['documents']} documents, answers in "
             f"{summary['dtype']}, probes in {summary['probe_dtype']})", "",
             "Halt pondering at the first depth where the steered backbone's top next-token "
             "probability is at most tau (K_max if never); answers from the fixed-alpha sweep at "
             "those depths; FLOPs add one probe (the layers above the steering layer and the LM "
             f"head, one token: {probe:.3g} FLOPs) per depth tested. Accuracy interval: Wilson "
             "95%. " + comparators_said("documents", FOLDS), "",
             "Top next-token probability per depth, quantiles 10/25/50/75/90%: "
             + "; ".join(f"k={k}: {'/'.join(f'{v:.2f}' for v in q)}"
                         for k, q in enumerate(summary["confidence_quantiles"].values())), "",
             *curve_lines(summary),
             f"| rule | accuracy [Wilson 95%] | tokens | FLOPs | mean depth | {COMPARATOR_HEADER} "
             "| depth histogram | Spearman(depth, level) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for rule, r in rows.items():
        flops = format(r["figures"]["flops"], ".3g")
        lines.append(f"| {rule} | {rule_cells(r, flops)}")
    lines += not_kept_lines(rows.values())
    path.write_text("\n".join(lines) + "\n")


def trained_steering(directory: Path, recorded: str) -> str:
    """The steering vector a controller was trained with: beside it where it keeps one (the
    shipped controllers do), else where its config says. A config records the path portably
    (``lm_eval_ponder.portable``): ``$LM_EVAL_PONDER_CACHE/...``, ``~/...``, or relative to the
    working directory it was trained in, this repository's root for the committed ones."""
    from lm_eval_ponder.portable import expand

    if (Path(directory) / "steering.safetensors").is_file():
        return str(directory)
    path = Path(expand(recorded))
    if not path.is_absolute() and not path.exists():
        path = Path(__file__).resolve().parents[1] / path
    return str(path)


def controller_depths(directory: Path, z0, offsets: list[float],
                      tau: float | None = None) -> tuple:
    """(depth per document, controller FLOPs per document, its config), by the inference path,
    at the controller's own tau or the given one."""
    import torch

    from lm_eval_ponder.pondering.controller import load_controller
    from lm_eval_ponder.pondering.dynamics import (
        PonderConfig,
        cumulative_offsets,
        ponder,
    )
    from lm_eval_ponder.steering.vector import load_vector

    controller, config = load_controller(directory, expected_d_model=z0.shape[1])
    pcfg = PonderConfig(**config["ponder"])
    mine = cumulative_offsets(pcfg)
    if len(mine) != len(offsets) or not torch.allclose(mine, torch.tensor(offsets)):
        sys.exit(f"{directory} ponders at offsets {mine.tolist()}, not this sweep's {offsets}: "
                 "a controller of the other form")
    steering = load_vector(trained_steering(directory, config["backbone"]["steering_dir"]))
    layer = int(config["layer"])
    h = float(steering.residual_norm(layer)) * steering.vector(layer)
    depth, _ = ponder(controller, z0, h, mine, pcfg.tau if tau is None else tau)
    return depth.numpy(), float(controller.evaluation_flops(pcfg.k_max + 1)), config


def find_controllers(sweep_root: Path | None, form: str) -> dict[str, Path]:
    """name -> directory: the final controllers of an adaptation sweep, and for our form the
    shipped one (trained with alpha_start=-0.2)."""
    from lm_eval_ponder.backbone import EMBEDDED_NAME
    from lm_eval_ponder.resources import shipped_controller_dir

    found = {}
    if form == "ours":
        shipped = shipped_controller_dir(EMBEDDED_NAME)
        if shipped is not None and (shipped / "controller.safetensors").is_file():
            found["shipped"] = shipped
    if sweep_root is not None:
        for d in sorted(sweep_root.glob("*/seed*/all/controller")):
            found[f"{d.parent.parent.parent.name}/{d.parent.parent.name}"] = d
    return found


def named_controllers(args) -> dict[str, Path]:
    """name -> directory: ``find_controllers`` plus the ``--extra`` (cross-fitted) ones."""
    controllers = find_controllers(Path(args.sweep) if args.sweep else None, args.form)
    for extra in args.extra:
        directory = Path(extra)
        run = directory.parent  # an exported cross-fitted run: <arm>/seed<s>/fold<f>/controller
        controllers[f"{run.parent.parent.name}/{run.parent.name}/{run.name}"] = directory
    return controllers


# ----------------------------------------------------------------------------- figures
def sweep_curve(s: dict, idx):
    """The fixed-alpha curve on documents ``idx`` of a [depth, document] sweep."""
    return fixed_curve(s["gen_tokens"][:, idx].T, s["correct"][:, idx].T)


def composed_figures(s: dict, depth, ctrl_flops: float, idx) -> dict:
    """A controller's figures on (a resample ``idx`` of) the documents, and its gap to the
    fixed-alpha curve at equal tokens (the curve's upper envelope, interpolated).
    ``ctrl_flops``: the halting rule's own FLOPs, one figure or one per document."""
    import numpy as np

    cols = np.arange(len(s["docs"]))[idx]
    d = depth[idx]
    acc = s["correct"][d, cols].mean()
    tok = s["gen_tokens"][d, cols].mean()
    at = accuracy_at_tokens(sweep_curve(s, idx), tok)
    extra = np.asarray(ctrl_flops)[idx].mean() if np.ndim(ctrl_flops) else ctrl_flops
    return {"accuracy": float(acc), "gen_tokens": float(tok),
            "flops": float(s["flops"][d, cols].mean() + extra), "depth": float(d.mean()),
            "fixed_curve_accuracy_at_tokens": at, "gap_accuracy_at_equal_tokens": acc - at}


def generated_figures(s: dict, g: dict, idx) -> dict:
    """``composed_figures`` for a controller that generated its own answers (``g``: arrays over
    the sweep's documents); its depth is the mean ponder depth per document (per token at
    token granularity)."""
    acc = g["correct"][idx].mean()
    tok = g["gen_tokens"][idx].mean()
    at = accuracy_at_tokens(sweep_curve(s, idx), tok)
    return {"accuracy": float(acc), "gen_tokens": float(tok), "flops": float(g["flops"][idx].mean()),
            "depth": float(g["depth"][idx].mean()), "fixed_curve_accuracy_at_tokens": at,
            "gap_accuracy_at_equal_tokens": acc - at}


def load_generated(root: str, form: str, task: str, directory: Path, docs: list[int],
                   tau: float | None = None) -> dict:
    """A controller's own lm_eval answers (``evaluate``) as arrays over the sweep's documents."""
    import numpy as np

    run = controller_run_dir(root, form, "generated", directory, tau)
    real = controller_samples(run, task)
    if real is None:
        sys.exit(f"{directory} has no {task} answers in {run}: run `testset.py evaluate "
                 f"--form {form} --controller {directory}"
                 + ("" if tau is None else f" --tau {tau:g}") + "` first")
    if sorted(real) != docs:
        sys.exit(f"{run} answered {len(real)} documents, the sweep {len(docs)}: re-run "
                 "`testset.py evaluate` with the sweep's limit")
    return {key: np.array([float(real[d][field]) for d in docs])
            for key, field in (("correct", "exact_match"), ("gen_tokens", "gen_tokens"),
                               ("flops", "flops"), ("depth", "ponder_steps"))}


def depth_profile(depth, level) -> dict:
    """Depth histogram (of rounded depths: a token-level controller's are means per token),
    mean depth per level and Spearman(depth, level)."""
    import numpy as np

    out = {"depth_hist": np.bincount(np.rint(depth).astype(int), minlength=9).tolist()}
    levels = depth_by_level(depth, level)
    if levels is not None:
        out["mean_depth_by_level"], out["spearman_depth_vs_level"] = levels
    return out


def controller_row(figures, depth, level, directory: Path, n_bootstrap: int,
                   seeds: int = 1) -> dict:
    """One controller's summary: ``figures(idx)`` on all documents with a Wilson CI (one
    draw per document) or, over several seeds, the bootstrap's (a document's accuracy is then
    a mean of draws, which Wilson's binomial does not describe), paired bootstrap CIs over
    documents, and its depth profile."""
    import numpy as np

    from lm_eval_ponder.portable import cwd_relative, portable_path
    from lm_eval_ponder.reporting.measures import wilson

    n = len(depth)
    f = figures(np.arange(n))
    ci = bootstrap(figures, n, n_bootstrap)
    lo, hi = wilson(round(f["accuracy"] * n), n) if seeds == 1 else ci["accuracy"]
    return {"figures": {**f, "accuracy_ci95": [lo, hi]}, "ci95": ci,
            **depth_profile(depth, level),
            "directory": portable_path(cwd_relative(str(directory)))}  # no machine's path


def depth_status(root: str, form: str, task: str, k: int, decoding: str = "greedy") -> dict:
    """One (depth, task) run of the sweep as it stands: finished with its figures, started (a
    killed or running run keeps its answers in lm-eval's cache) or not started. Lets a sweep
    that spans sessions report what it has without waiting for the last depth."""
    from lm_eval_ponder.reporting.compact import read_samples
    from lm_eval_ponder.reporting.measures import wilson

    run = run_dir(root, form, k) / decoding / "FR" / task  # suite's layout
    path = samples_file(run, task)
    if path is None:
        return {"state": "started" if run.is_dir() else "not started"}
    samples = read_samples(path)
    n = len(samples)
    correct = sum(float(s["exact_match"]) for s in samples)
    marker = run / "ponder_run.json"
    return {"state": "finished", "documents": n, "accuracy": correct / n,
            "ci95": list(wilson(correct, n)),
            "gen_tokens": sum(float(s["gen_tokens"]) for s in samples) / n,
            "wall_s": json.loads(marker.read_text())["wall_s"] if marker.is_file() else None,
            "samples": {int(s["doc_id"]): s for s in samples}}


def status(args) -> None:
    """Print each depth's figures so far and, with ``--sweep``/``--extra``, where each controller
    goes on the test documents (from z_0 alone) and, once every depth it picks has finished, its
    composed accuracy and tokens (no gap: that needs the whole curve, see ``analyse``)."""
    import numpy as np

    from lm_eval_ponder.reporting.measures import wilson

    offsets = offsets_of(args.form)
    # controllers only when asked for: they need z_0, i.e. the backbone
    controllers = named_controllers(args) if args.sweep or args.extra else {}
    for task in task_list(args.tasks):
        print(f"{args.form}, {task}:")
        done = {}
        for k, alpha in enumerate(offsets):
            st = depth_status(args.root, args.form, task, k, args.decoding)
            if st["state"] != "finished":
                print(f"  k={k} alpha={alpha:+.4f}  {st['state']}")
                continue
            done[k] = st["samples"]
            lo, hi = st["ci95"]
            wall = "" if st["wall_s"] is None else f", {st['wall_s']:.0f} s"
            print(f"  k={k} alpha={alpha:+.4f}  {st['accuracy']:.3f} [{lo:.3f}, {hi:.3f}] "
                  f"at {st['gen_tokens']:.1f} tokens (n={st['documents']}{wall})")
        if not controllers or not done:
            continue
        first = done[min(done)]
        docs = sorted(first)
        z0 = test_states(args.root, args.form, task,
                         [first[d]["arguments"]["gen_args_0"]["arg_0"] for d in docs],
                         args.z0_dtype or args.dtype)
        for name, directory in controllers.items():
            depth = controller_depths(directory, z0, offsets)[0]
            hist = np.bincount(depth, minlength=len(offsets)).tolist()
            line = f"  {name}: depths {hist}"
            if set(depth.tolist()) <= set(done) and all(sorted(done[k]) == docs for k in done):
                picked = [done[int(k)][d] for k, d in zip(depth, docs)]
                correct = sum(float(p["exact_match"]) for p in picked)
                lo, hi = wilson(correct, len(docs))
                tokens = sum(float(p["gen_tokens"]) for p in picked) / len(docs)
                line += f"; {correct / len(docs):.3f} [{lo:.3f}, {hi:.3f}] at {tokens:.1f} tokens"
            else:
                line += "; waiting for the depths it picks"
            print(line)


def analyse(args) -> None:
    import numpy as np

    from lm_eval_ponder.reporting.measures import wilson

    offsets = offsets_of(args.form)
    k_max = len(offsets) - 1
    controllers = named_controllers(args)
    for extra in args.generated:  # each must have answers on some task, or it was never run
        directory, tau, run = generated_run(args.root, args.form, extra)
        if all(controller_samples(run, task) is None for task in TASKS):
            sys.exit(f"{directory} has no answers in {run}: run `testset.py evaluate --form "
                     f"{args.form} --controller {directory}"
                     + ("" if tau is None else f" --tau {tau:g}") + "` first")
    seeds = parse_seeds(args.seeds, args.decoding)
    summary = {"form": args.form, "dtype": args.dtype, "decoding": args.decoding,
               "seeds": list(seeds), "z0_dtype": args.z0_dtype or args.dtype,
               "offsets": offsets, "sweep": args.sweep, "tasks": {}}
    for task in TASKS:
        s = load_sweep(args.root, args.form, task, k_max, args.decoding, seeds)
        if s is None:
            print(f"{task}: the sweep is not finished at every depth for seeds "
                  f"{','.join(map(str, seeds))}; skipped", flush=True)
            continue
        n = len(s["docs"])
        z0 = test_states(args.root, args.form, task, s["contexts"], args.z0_dtype or args.dtype)
        fixed = []
        for k in range(k_max + 1):
            lo, hi = (wilson(s["correct"][k].sum(), n) if len(seeds) == 1 else
                      bootstrap(lambda idx, row=s["correct"][k]: {"a": row[idx].mean()}, n,
                                args.bootstrap)["a"])
            fixed.append({"depth": k, "alpha": offsets[k], "accuracy": float(s["correct"][k].mean()),
                          "ci95": [lo, hi], "gen_tokens": float(s["gen_tokens"][k].mean()),
                          "flops": float(s["flops"][k].mean())})
        rows = {}
        # the out-of-sample comparators (issue 52): one depth, one depth per level and the
        # fixed curve at the controller's tokens, each chosen on the other folds of documents
        fold = np.array(fold_of(s["keys"], FOLDS))
        groups = np.array([f"L{v}" for v in s["level"].tolist()])
        for name, directory in controllers.items():
            depth, ctrl_flops, _ = controller_depths(directory, z0, offsets)
            rows[name] = controller_row(
                lambda idx, depth=depth, ctrl_flops=ctrl_flops, s=s:
                    composed_figures(s, depth, ctrl_flops, idx),
                depth, s["level"], directory, args.bootstrap, len(seeds))
            # each document's depth, one digit per document in the sweep's order: the page's
            # figures rebuild from this and the committed sweep, without the controller
            rows[name]["depths"] = "".join(str(int(k)) for k in depth)
            rows[name]["cross_fitted"] = final_controller_gaps(
                s["correct"].T, s["gen_tokens"].T, groups, depth, fold, FOLDS, args.bootstrap)
        for extra in args.generated:
            directory, tau, run = generated_run(args.root, args.form, extra)
            if controller_samples(run, task) is None:  # evaluated on other tasks only
                print(f"{task}: {extra} has no {task} answers (`testset.py evaluate --tasks "
                      f"{task}`); not in this task's table", flush=True)
                continue
            g = load_generated(args.root, args.form, task, directory, s["docs"], tau)
            rows[f"generated/{directory.name}" + (f" tau={tau:g}" if tau else "")] = \
                controller_row(lambda idx, g=g, s=s: generated_figures(s, g, idx), g["depth"],
                               s["level"], directory, args.bootstrap, len(seeds))
        # the naive per-document oracle: the cheapest depth that is right, knowing the answers
        pick = oracle_choice(s["correct"].T, s["gen_tokens"].T)
        oracle = composed_figures(s, pick, 0.0, np.arange(n))
        single, per_fold = fixed_by_fold(s["correct"].T, fold, FOLDS)
        cols = np.arange(n)
        summary["tasks"][task] = {"documents": n, "fixed": fixed, "controllers": rows,
                                  "one_depth_cross_fitted": {
                                      "depth_per_fold": per_fold,
                                      "accuracy": float(s["correct"][single, cols].mean()),
                                      "gen_tokens": float(s["gen_tokens"][single, cols].mean())},
                                  "oracle (upper bound)": {**oracle,
                                                           **depth_profile(pick, s["level"])},
                                  "sweep_wall_s": s["wall_s"]}
    for path in sorted(Path(args.root, args.form, "verify").glob("*/verify.json")):
        summary.setdefault("verify", {})[path.parent.name] = json.loads(path.read_text())
    if not summary["tasks"]:
        sys.exit("no task has finished the sweep at every depth: run `testset.py sweep` first")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    # compact, as taus's: the .md beside it is the readable form, and the tree must travel
    (out / f"{args.form}.json").write_text(json.dumps(summary, separators=(",", ":")) + "\n")
    write_markdown(out / f"{args.form}.md", summary)
    plot(out / f"{args.form}.png", summary)
    print((out / f"{args.form}.md").read_text())


def rule_cells(r: dict, flops: str | None = None) -> str:
    """The table cells of one halting rule's row (``controller_row``): accuracy [Wilson],
    tokens, (FLOPs,) mean depth, the gaps at equal tokens against the three comparators
    (``gap_cells``), histogram, Spearman."""
    f = r["figures"]
    lo, hi = f["accuracy_ci95"]
    return (f"{f['accuracy']:.3f} [{lo:.3f}, {hi:.3f}] | {f['gen_tokens']:.1f} | "
            + (f"{flops} | " if flops is not None else "") + f"{f['depth']:.2f} | "
            f"{gap_cells(r)} | "
            f"{r['depth_hist']} | {r.get('spearman_depth_vs_level', float('nan')):.2f} |")


def gap_cells(r: dict) -> str:
    """A composed row's ``COMPARATOR_HEADER`` cells: all three gaps where its per-document
    depths are known (``keep_comparators``); else the in-sample gap with its interval, "record
    not kept" for the cross-fitted one (it needs each document's depth) and the smoothed gap
    as a point without interval (it needs only the row's accuracy and tokens)."""
    c = r.get("comparators", {})
    if "gaps" in c:
        return comparator_cells(c)
    f, ci = r["figures"], r["ci95"]["gap_accuracy_at_equal_tokens"]
    smooth = (f"{c['smoothed_point']:+.3f} (no CI)" if "smoothed_point" in c else "-")
    return (f"{f['gap_accuracy_at_equal_tokens']:+.3f} [{ci[0]:+.3f}, {ci[1]:+.3f}] | "
            f"record not kept | {smooth} | {curve_verdict(ci)} / - / -")


def not_kept_lines(rows) -> list[str]:
    """The note under a table with rows whose per-document depths were not kept."""
    if all("gaps" in r.get("comparators", {}) for r in rows):
        return []
    return ["", "record not kept: the rows without a cross-fitted gap were composed before "
            "their per-document depths were kept, from controllers or probes that are not "
            "committed; their gap is in-sample only, optimistic, and the smoothed one a point "
            "without interval (`testset.py comparators`)."]


def curve_lines(summary: dict) -> list[str]:
    """``curve_said`` of the page's sweep, where the page has it."""
    return [curve_said(summary["curve"]), ""] if "curve" in summary else []


def sweep_curve_summary(s: dict) -> dict:
    """``studylib.analysis.fixed_curve_summary`` of a [depth, document] sweep."""
    import numpy as np

    return fixed_curve_summary(s["correct"].T, s["gen_tokens"].T,
                               np.array(fold_of(s["keys"], FOLDS)), FOLDS)


def keep_comparators(row: dict, s: dict, depth, n_bootstrap: int) -> None:
    """Add to a composed row (``controller_row``) its per-document depths, one digit each in
    the sweep's order (so its figures rebuild from the committed sweep), and its gaps against
    the three comparators (``studylib.analysis.comparator_gaps``, folds by document id)."""
    import numpy as np

    depth = np.asarray(depth, dtype=int)
    k1 = s["correct"].shape[0]
    row["depths"] = "".join(str(int(k)) for k in depth)
    row["comparators"] = comparator_gaps(s["correct"].T, s["gen_tokens"].T, [np.eye(k1)[depth]],
                                         np.array(fold_of(s["keys"], FOLDS)), FOLDS, n_bootstrap)


def known_depths(row: dict, n: int):
    """A committed row's per-document depths: its ``depths`` digits, or, for a row composed
    before they were kept, its histogram where every document sits at one depth; else None."""
    import numpy as np

    if row.get("depths"):
        return np.array([int(c) for c in row["depths"]])
    hist = row["depth_hist"]
    if max(hist) == n == sum(hist):
        return np.full(n, hist.index(n))
    return None


def smoothed_point(s: dict, figures: dict) -> float:
    """A row's gap to the smoothed curve (``studylib.analysis.smoothed_curve``) at its tokens,
    from its accuracy and tokens alone: what can still be said of a row whose per-document
    depths are not kept (no interval: that needs them)."""
    curve = smoothed_curve(s["gen_tokens"].T, s["correct"].T)
    return float(figures["accuracy"] - accuracy_at_tokens(curve, figures["gen_tokens"]))


def page_rows(page: dict) -> list[dict]:
    """Every composed row of a ``taus`` or ``literal`` page."""
    if "rules" in page:
        return list(page["rules"].values())
    return [r for by_tau in page["controllers"].values() for r in by_tau.values()]


def comparators(args) -> None:
    """A committed ``taus`` or ``literal`` page read against the cross-fitted and smoothed
    curves beside its in-sample envelope (issue 65), with no controller, probe or generation:
    rows whose per-document depths are known (``known_depths``) get all three gaps; the others
    keep their in-sample gap, labelled, and get the smoothed gap as a point. The page's JSON and
    markdown are rewritten in place, refused unless the sweep under ``--root`` reproduces the
    page's fixed depths and each recomputed row its in-sample gap."""
    import numpy as np

    from lm_eval_ponder.errors import PonderError

    path = Path(args.page)
    page = json.loads(path.read_text())
    k_max = len(offsets_of(page["form"])) - 1
    decoding = page.get("decoding", "greedy")
    s = load_sweep(args.root, page["form"], page.get("task", "arith"), k_max, decoding)
    if s is None:
        raise PonderError(f"{args.root}: no finished {decoding} sweep of form {page['form']}")
    for row in page["fixed"]:
        k = row["depth"]
        if not (np.isclose(row["accuracy"], s["correct"][k].mean())
                and np.isclose(row["gen_tokens"], s["gen_tokens"][k].mean())):
            raise PonderError(f"{path}: depth {k} of the sweep under {args.root} is not the "
                              "page's (another root, decoding or seed?)")
    n = len(s["docs"])
    for row in page_rows(page):
        depth = known_depths(row, n)
        if depth is None:
            row["comparators"] = {"smoothed_point": smoothed_point(s, row["figures"]),
                                  "record": "per-document depths not kept"}
            continue
        again = composed_figures(s, depth, 0.0, np.arange(n))["gap_accuracy_at_equal_tokens"]
        if not np.isclose(again, row["figures"]["gap_accuracy_at_equal_tokens"]):
            raise PonderError(f"{path}: a row's depths do not give its own gap on this sweep")
        keep_comparators(row, s, depth, args.bootstrap)
    page["curve"] = sweep_curve_summary(s)
    page.setdefault("decoding", decoding)
    path.write_text(json.dumps(page, separators=(",", ":")) + "\n")
    (write_literal_markdown if "rules" in page else write_taus_markdown)(
        path.with_suffix(".md"), page)
    print(path.with_suffix(".md").read_text())


def taus(args) -> None:
    """The paper's "termination threshold 0.2, chosen following extensive empirical
    evaluation", re-examined: each controller's depths at every tau of ``--taus`` (the same
    inference path, ``pondering.dynamics.ponder``), composed with the finished arith sweep as
    ``analyse`` composes them, against the fixed-alpha curve at equal tokens. No generation."""

    offsets = offsets_of(args.form)
    s = load_sweep(args.root, args.form, "arith", len(offsets) - 1, args.decoding)
    if s is None:
        sys.exit("the arith sweep is not finished at every depth: run `testset.py sweep` first")
    z0 = test_states(args.root, args.form, "arith", s["contexts"], args.z0_dtype or args.dtype)
    values = [float(v) for v in args.taus.split(",")]
    rows = {}
    for name, directory in named_controllers(args).items():
        for tau in values:
            depth, ctrl_flops, config = controller_depths(directory, z0, offsets, tau)
            row = controller_row(lambda idx, depth=depth, ctrl_flops=ctrl_flops:
                                 composed_figures(s, depth, ctrl_flops, idx),
                                 depth, s["level"], directory, args.bootstrap)
            row["temperature"] = config.get("temperature")
            keep_comparators(row, s, depth, args.bootstrap)
            rows.setdefault(name, {})[f"{tau:g}"] = row
    summary = {"form": args.form, "dtype": args.dtype, "decoding": args.decoding, "task": "arith",
               "documents": len(s["docs"]), "taus": values, "controllers": rows,
               "fixed": [{"depth": k, "accuracy": float(s["correct"][k].mean()),
                          "gen_tokens": float(s["gen_tokens"][k].mean())}
                         for k in range(len(offsets))],
               "curve": sweep_curve_summary(s)}
    write_page(Path(args.out), f"taus-{args.form}", summary, write_taus_markdown)


def write_taus_markdown(path: Path, summary: dict) -> None:
    rows = summary["controllers"]
    lines = [f"# Halting threshold tau on the arith test sweep, form `{summary['form']}` "
             f"({summary['documents']} documents, {summary['dtype']})", "",
             "Depths from each controller's continue probabilities at each tau (halt at the "
             "first phi <= tau), answers from the fixed-alpha sweep at those depths. "
             + comparators_said("documents", FOLDS), "",
             *curve_lines(summary),
             "| controller | T | tau | accuracy [Wilson 95%] | tokens | mean depth | "
             f"{COMPARATOR_HEADER} | depth histogram | Spearman(depth, level) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, by_tau in rows.items():
        for tau, r in by_tau.items():
            lines.append(f"| {name} | {r['temperature']:g} | {tau} | {rule_cells(r)}")
    lines += not_kept_lines([r for by_tau in rows.values() for r in by_tau.values()])
    path.write_text("\n".join(lines) + "\n")


def write_markdown(path: Path, s: dict) -> None:
    seeds = s.get("seeds", [0])
    draws = (f"Seeds {', '.join(map(str, seeds))}: every figure is each document's mean over "
             "the seeds, then averaged over documents. " if len(seeds) > 1 else "")
    interval = ("Wilson for accuracies" if len(seeds) == 1 else
                "a percentile bootstrap over documents for accuracies (a document's accuracy "
                "is a mean of draws, which Wilson's binomial does not describe)")
    lines = [f"# Controllers against the fixed-alpha sweep on test documents: form `{s['form']}`",
             "", f"Decoding {s.get('decoding', 'greedy')}, through `lm_eval --model ponder` "
             f"(256 new tokens, {s.get('dtype', 'float32')}"
             + (f"; the controllers read z_0 in {s['z0_dtype']}, their cache's dtype"
                if s.get("z0_dtype", s.get("dtype")) != s.get("dtype") else "")
             + f"). {draws}A "
             "controller's answers are the sweep's answers at the depth it chooses per document "
             "(see `studies/testset.py`; `verify` below checks this through lm_eval). CIs: "
             f"{interval}, paired bootstrap over documents for the gap.", ""]
    for task, t in s["tasks"].items():
        lines += [f"## {task} ({t['documents']} documents; sweep wall {t['sweep_wall_s'] / 3600:.1f} h)",
                  "", "| depth k | alpha | accuracy [95% CI] | tokens | FLOPs |", "|---|---|---|---|---|"]
        for r in t["fixed"]:
            lines.append(f"| {r['depth']} | {r['alpha']:.4f} | {r['accuracy']:.3f} "
                         f"[{r['ci95'][0]:.3f}, {r['ci95'][1]:.3f}] | {r['gen_tokens']:.1f} | "
                         f"{r['flops']:.3e} |")
        one = t.get("one_depth_cross_fitted")
        if one is not None:
            lines += ["", f"One depth for all, cross-fitted ({FOLDS} folds of documents by id; "
                      f"depth chosen per fold: {one['depth_per_fold']}): {one['accuracy']:.3f} at "
                      f"{one['gen_tokens']:.1f} tokens. The controllers' gaps below are against "
                      "comparators chosen on the other folds (one depth, one depth per level, "
                      "the fixed curve at the controller's tokens) and, last, against the "
                      "in-sample envelope of the nine depths (the optimistic bound: chosen on "
                      "the documents it is scored on)."]
        lines += ["", "| controller | accuracy [95% CI] | tokens | FLOPs | mean depth | minus one "
                  "depth, cross-fitted [95% CI] | minus one depth per level, cross-fitted | "
                  "minus the fixed curve at its tokens, cross-fitted | minus the in-sample "
                  "envelope at equal tokens (optimistic) [95% CI] | depth histogram | mean depth "
                  "by level | Spearman(depth, level) |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]

        def gap(c, name):
            if c is None:
                return "-"
            lo, hi = c[f"gap_{name}_ci95"]
            return f"{c[f'gap_{name}']:+.3f} [{lo:+.3f}, {hi:+.3f}]"

        for name, r in t["controllers"].items():
            f, ci = r["figures"], r["ci95"]["gap_accuracy_at_equal_tokens"]
            c = r.get("cross_fitted")
            lvl = ", ".join(f"{k} {v:.1f}" for k, v in r.get("mean_depth_by_level", {}).items())
            lines.append(
                f"| {name} | {f['accuracy']:.3f} [{f['accuracy_ci95'][0]:.3f}, "
                f"{f['accuracy_ci95'][1]:.3f}] | {f['gen_tokens']:.1f} | {f['flops']:.3e} | "
                f"{f['depth']:.2f} | {gap(c, 'single')} | {gap(c, 'per_type')} | "
                f"{gap(c, 'budget')} | {f['gap_accuracy_at_equal_tokens']:+.3f} [{ci[0]:+.3f}, "
                f"{ci[1]:+.3f}] | {r['depth_hist']} | {lvl or '-'} | "
                f"{r.get('spearman_depth_vs_level', float('nan')):.2f} |")
        o = t["oracle (upper bound)"]
        gap = o["gap_accuracy_at_equal_tokens"]
        lines += ["", f"Per-document oracle (the cheapest right depth, chosen knowing the answers; "
                  f"an upper bound no controller can reach): accuracy {o['accuracy']:.3f} at "
                  f"{o['gen_tokens']:.1f} tokens, " + (
                      "fewer tokens than any fixed depth." if gap != gap else
                      f"{gap:+.3f} over the fixed curve at equal tokens."), ""]
    for name, v in s.get("verify", {}).items():
        lines.append(f"Verify ({name}): `{v['controller']}` through lm_eval on "
                     f"{v['documents']} documents, share of documents that agree: "
                     f"{json.dumps(v['agreement'])}")
    path.write_text("\n".join(lines) + "\n")


def plot(path: Path, s: dict) -> None:
    """Per task, the fixed-alpha curve (Wilson CIs) with each controller as a point."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from lm_eval_ponder.reporting.images import save_figure

    tasks = list(s["tasks"])
    # one colour per arm across every panel
    arms = sorted({name.split("/")[0] for t in s["tasks"].values() for name in t["controllers"]})
    # the default cycle repeats after ten colours: more arms than that take tab20's twenty
    palette = plt.get_cmap("tab20") if len(arms) > 10 else None

    def colour(i: int):
        return palette(i % 20) if palette is not None else f"C{i}"

    fig, axes = plt.subplots(1, len(tasks), figsize=(7.5 * len(tasks), 4.4), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        t = s["tasks"][task]
        x = [r["gen_tokens"] for r in t["fixed"]]
        y = [r["accuracy"] for r in t["fixed"]]
        err = [[r["accuracy"] - r["ci95"][0] for r in t["fixed"]],
               [r["ci95"][1] - r["accuracy"] for r in t["fixed"]]]
        ax.errorbar(x, y, yerr=err, fmt="o-", color="k", capsize=2, label="fixed alpha (depth k)")
        for r in t["fixed"]:
            ax.annotate(str(r["depth"]), (r["gen_tokens"], r["accuracy"]), fontsize=7,
                        textcoords="offset points", xytext=(3, -9))
        labelled = set()
        for name, r in t["controllers"].items():
            f = r["figures"]
            extra = name.count("/") == 2  # an exported cross-fitted run (--extra)
            generated = name.startswith("generated/")
            key = ("cross-fitted runs (--extra)" if extra else
                   "own lm_eval answers (--generated)" if generated else name.split("/")[0])
            marker = "P" if extra else "D" if generated else "x" if "/" in name else "*"
            ax.plot(f["gen_tokens"], f["accuracy"], marker,
                    ms=8, color="grey" if extra else colour(arms.index(name.split("/")[0])),
                    label=None if key in labelled else key)
            labelled.add(key)
        ax.set_xlabel("mean generated tokens")
        ax.set_ylabel("accuracy")
        ax.set_title(f"{task}, {t['documents']} test documents", fontsize=9)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    seeds = s.get("seeds", [0])
    fig.suptitle(f"Controllers vs fixed alpha, form {s['form']} ({s.get('decoding', 'greedy')}"
                 + (f", mean of seeds {','.join(map(str, seeds))}" if len(seeds) > 1 else "")
                 + ", lm_eval)", fontsize=10)
    fig.tight_layout()
    save_figure(fig, path, dpi=120)  # a palette PNG: a third the bytes
    plt.close(fig)


# ----------------------------------------------------------------------------- running controllers
def controller_run_dir(root: str, form: str, kind: str, directory: Path,
                       tau: float | None = None) -> Path:
    """Where ``kind`` (verify | generated) keeps its lm_eval runs of the controller in
    ``directory``: named by a hash of the directory's absolute path, plus the halting
    threshold where it overrides the controller's own."""
    name = hashlib.sha256(str(directory.resolve()).encode()).hexdigest()[:8]
    return Path(root) / form / kind / (name if tau is None else f"{name}-tau{tau:g}")


def run_controller(args, directory: Path, out: Path, task: str, limit: int,
                   tau: float | None = None) -> dict:
    """``--model ponder controller=DIR`` (FP-Direct) on the first ``limit`` documents of
    ``task``, resumable; its samples by document id."""
    from lm_eval_ponder.reporting import suite

    model_args = f"dtype={args.dtype}" + ("" if tau is None else f",tau={tau!r}")
    code = suite.main([
        "--output", str(out), "--methods", "FP-Direct", "--controller", str(directory),
        "--tasks", task, "--limit", str(limit), "--max_gen_toks", str(args.max_tokens),
        "--batch_size", str(args.batch_size), "--resume_within", "--no_report",
        "--model_args", model_args])
    if code:
        sys.exit(code)
    (out / "controller.txt").write_text(str(directory.resolve()) + "\n")
    return controller_samples(out, task)


def generated_run(root: str, form: str, extra: str) -> tuple[Path, float | None, Path]:
    """(controller directory, tau, its evaluate run) of ``--generated DIR`` or ``DIR@tau=X``."""
    directory, _, tau = extra.partition("@tau=")
    value = float(tau) if tau else None
    return Path(directory), value, controller_run_dir(root, form, "generated", Path(directory),
                                                      value)


def controller_samples(out: Path, task: str) -> dict | None:
    """A controller run's answers on ``task`` by document id (suite's layout), or None."""
    return samples_by_doc(out / "greedy" / "FP-Direct" / task, task)


def samples_by_doc(directory: Path, task: str) -> dict | None:
    """The answers of the run in ``directory`` on ``task`` by document id, or None."""
    from lm_eval_ponder.reporting.compact import read_samples

    path = samples_file(directory, task)
    return None if path is None else {int(r["doc_id"]): r for r in read_samples(path)}


def evaluate(args) -> None:
    """Generate a controller's own answers through lm_eval on the sweep's documents: what a
    token-level controller needs (it decides at every token, so the sweep cannot compose its
    answers). ``analyse --generated DIR`` then places it against the fixed curve."""
    directory = Path(args.controller)
    out = controller_run_dir(args.root, args.form, "generated", directory, args.tau)
    for task in task_list(args.tasks):
        real = run_controller(args, directory, out, task, args.limit or TASKS[task], args.tau)
        print(f"{task}: {len(real)} documents in {out}", flush=True)


# ----------------------------------------------------------------------------- verification
def verify(args) -> None:
    """Run one controller through lm_eval on the first N documents of each task and compare,
    per document, its depth with the composed one and its answer with the sweep's answer at
    that depth."""
    import numpy as np

    offsets = offsets_of(args.form)
    directory = Path(args.controller)
    out = controller_run_dir(args.root, args.form, "verify", directory)
    agreement, n_docs = {}, 0
    for task in TASKS:
        s = load_sweep(args.root, args.form, task, len(offsets) - 1)
        if s is None:
            continue
        real = run_controller(args, directory, out, task, args.limit)
        z0 = test_states(args.root, args.form, task, s["contexts"], args.dtype)
        depth, _, _ = controller_depths(directory, z0, offsets)
        col = {d: i for i, d in enumerate(s["docs"])}
        same_depth = same_text = same_text_own = 0
        for d, r in real.items():
            i, k_real = col[d], round(float(r["ponder_steps"]))
            answer = answers_digest(r)  # the sweep keeps digests of its answers, not texts
            same_depth += k_real == depth[i]
            same_text += answer == s["answers"][depth[i]][i]
            same_text_own += answer == s["answers"][k_real][i]
        n = len(real)
        n_docs += n
        cols = [col[d] for d in real]
        agreement[task] = {"documents": n, "depth": float(same_depth / n),
                           "text_at_composed_depth": float(same_text / n),
                           "text_at_its_own_depth": float(same_text_own / n),
                           "real_accuracy": float(np.mean([float(r["exact_match"])
                                                           for r in real.values()])),
                           "composed_accuracy": float(np.mean(
                               [s["correct"][depth[i]][i] for i in cols])),
                           "fixed_rerun": fixed_rerun(args, out, task, s, depth[cols], col)}
        print(task, agreement[task], flush=True)
    if not agreement:
        sys.exit("no task has finished the sweep at every depth: run `testset.py sweep` first")
    (out / "verify.json").write_text(json.dumps(
        {"controller": str(directory), "documents": n_docs, "agreement": agreement}, indent=1))


def fixed_rerun(args, out: Path, task: str, s: dict, depths, col: dict) -> dict:
    """The noise floor of the composition: the controller's most common depth, re-run at that
    fixed alpha on the same ``--limit`` documents, against the sweep's answers at that depth.

    A run on fewer documents batches them differently (lm_eval sorts by length), and in bf16 a
    different batch changes the padded matmuls' rounding, so greedy texts can fork with no
    controller involved. The controller's text agreement is only a defect where it falls below
    this one."""
    import numpy as np

    k = int(np.bincount(np.asarray(depths, dtype=int)).argmax())
    where = out / f"fixed-k{k}"
    run_fixed(args, where, task, offsets_of(args.form)[k], args.limit)
    rows = samples_by_doc(where / "greedy" / "FR" / task, task)
    if rows is None:
        sys.exit(f"{where}: the fixed re-run left no samples log")
    same = sum(answers_digest(r) == s["answers"][k][col[d]] for d, r in rows.items())
    return {"depth": k, "documents": len(rows), "text_agrees_with_sweep": same / len(rows),
            "rerun_accuracy": float(np.mean([float(r["exact_match"]) for r in rows.values()])),
            "sweep_accuracy": float(np.mean([s["correct"][k][col[d]] for d in rows]))}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    for name in ("sweep", "analyse", "verify", "evaluate", "status", "taus", "literal",
                 "comparators"):
        s = sub.add_parser(name)
        s.add_argument("--form", choices=sorted(FORMS), default="ours")
        s.add_argument("--root", default=None,
                       help="where the lm_eval runs go (default: results/testset-bf16 for "
                            "bfloat16, results/testset for float32)")
        s.add_argument("--dtype", default="bfloat16",
                       help="backbone dtype of every run (default: bfloat16, the rollout "
                            "caches' dtype)")
        s.add_argument("--max-tokens", type=int, default=256)
        s.add_argument("--batch-size", type=int, default=32)
    sw = sub.choices["sweep"]
    sw.add_argument("--tasks", default=",".join(TASKS))
    sw.add_argument("--depths", default=None, help="comma list (default: all)")
    sw.add_argument("--limit", type=int, default=None, help="documents per task (default: 500)")
    sw.add_argument("--decoding", default="greedy",
                    help="the suite's decoding: greedy (the first sweeps) or t0.7, the one the "
                         "controllers' rollouts were sampled at (issue 52)")
    sw.add_argument("--seeds", default="0", help="comma list of seeds (sampled decodings)")
    sw.add_argument("--plan", action="store_true", help="print the runs (suite --plan); run none")
    sw.add_argument("--pilot", default=None,
                    help="with --plan: a finished pilot sweep root whose times price the runs")
    a = sub.choices["analyse"]
    a.add_argument("--generated", nargs="*", default=[],
                   help="controller directories whose own answers `evaluate` generated "
                        "(token-level controllers); DIR@tau=X for a run with `evaluate --tau X`")
    a.add_argument("--out", default=None,
                   help="where the figures go (default: docs/testset/bf16 for bfloat16, "
                        "docs/testset for float32)")
    a.add_argument("--bootstrap", type=int, default=2000)
    a.add_argument("--seeds", default="0",
                   help="comma list: compose each seed's sweep and average per document (a "
                        "sampled decoding; every depth must have finished for every seed)")
    v = sub.choices["verify"]
    v.add_argument("--controller", required=True)
    v.add_argument("--limit", type=int, default=100)
    e = sub.choices["evaluate"]
    e.add_argument("--controller", required=True)
    e.add_argument("--tasks", default="arith")
    e.add_argument("--limit", type=int, default=None, help="documents per task (default: 500)")
    e.add_argument("--tau", type=float, default=None,
                   help="halting threshold instead of the controller's own (its own run dir)")
    st = sub.choices["status"]
    st.add_argument("--tasks", default=",".join(TASKS))
    tu = sub.choices["taus"]
    tu.add_argument("--taus", default="0.05,0.1,0.2,0.3,0.5,0.8")
    tu.add_argument("--out", default=None, help="default: as analyse")
    tu.add_argument("--bootstrap", type=int, default=2000)
    li = sub.choices["literal"]
    li.add_argument("--taus", default="0.05,0.1,0.2,0.3,0.5,0.8")
    li.add_argument("--out", default=None, help="default: as analyse")
    li.add_argument("--bootstrap", type=int, default=2000)
    li.add_argument("--probe-dtype", default=None,
                    help="the probes' backbone dtype (default: --dtype); float32 where bf16 is "
                         "emulated and slow, said in the table's title")
    li.add_argument("--decoding", default="greedy",
                    help="which sweep's answers to compose: greedy, or t0.7 (seed 0)")
    co = sub.choices["comparators"]
    co.add_argument("--page", required=True,
                    help="a taus-<form>.json or literal-<form>-<decoding>.json page, rewritten "
                         "in place (with its .md) with the cross-fitted and smoothed gaps")
    co.add_argument("--bootstrap", type=int, default=2000)
    for name in ("analyse", "status", "taus"):
        sub.choices[name].add_argument(
            "--decoding", default="greedy",
            help="which sweep's answers to compose: greedy, or t0.7 (seed 0; issue 52)")
        sub.choices[name].add_argument(
            "--sweep", default=None,
            help="an adaptation sweep directory holding final controllers "
                 "(adaptation.py train --final)")
        sub.choices[name].add_argument(
            "--z0-dtype", default=None,
            help="the backbone dtype the controllers' z_0 is computed in (default: --dtype): "
                 "the dtype of the cache they were trained on, e.g. bfloat16 for a float32 "
                 "sweep composed with controllers trained on a bf16 cache")
        sub.choices[name].add_argument(
            "--extra", nargs="*", default=[],
            help="more controller directories, e.g. cross-fitted runs exported with "
                 "adaptation.py export (<run>/controller)")
    args = p.parse_args(argv)
    args.root = args.root or default_root(args.dtype)
    archive.ensure(args.root)  # the committed sweep (results/<root>.tar.xz)
    if args.command in ("analyse", "taus", "literal"):
        args.out = args.out or default_out(args.dtype)
    {"sweep": sweep, "analyse": analyse, "verify": verify, "evaluate": evaluate,
     "status": status, "taus": taus, "literal": literal,
     "comparators": comparators}[args.command](args)


if __name__ == "__main__":
    from lm_eval_ponder.errors import command, run_program

    run_program(command(main))  # a PonderError (a missing cache, a bad flag) is one line
