"""The suite's plan: which ``lm_eval`` runs a suite makes, where each lands, and what
``--plan`` says of them before any starts.

A ``Run`` is one (decoding, seed, method, dataset); ``plan`` lists them for the methods,
datasets, decodings and seeds asked (Best-of-N once, early exit once per threshold), and each
run's folder is ``OUT/<decoding folder>/<method>/<dataset>`` (``Run.folder``), so a suite that
is started again finds its finished runs by their results files. ``suite_run`` runs them;
``suite`` is the command line.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path

from lm_eval_ponder import registry
from lm_eval_ponder.errors import PonderError
from lm_eval_ponder.evaluation.resume import kept_answers
from lm_eval_ponder.files import read_json

# the methods and datasets are the registry's; an unpublishable dataset's answers (GPQA's) are
# never exported for committing (``--snapshot``, the heartbeat's twin), finished or not
METHODS = tuple(m.label for m in registry.METHODS if m.default)
# known to --methods but not in its default: the early-exit sweep (one run per threshold)
EXTRA_METHODS = tuple(m.label for m in registry.METHODS if not m.default)
EXIT_THRESHOLDS = (0.9, 0.95, 0.99, 0.999)
ATTEMPTS = "ponder_attempts.json"
DECODINGS = {
    "greedy": "do_sample=False",
    "t0.7": "do_sample=True,temperature=0.7",
    "top_p0.95": "do_sample=True,temperature=0.7,top_p=0.95",
    "top_k40": "do_sample=True,temperature=0.7,top_k=40",
}
# A protocol names the decoding of every method and the seeds it is run with. ``paper`` is
# the paper's one sentence ("The maximum generation length is fixed at 500 newly generated
# tokens ... Decoding employs a temperature of 0.7"), for every method, over three seeds;
# ``greedy`` is our documented variant (one seed: greedy decoding draws nothing).
PROTOCOLS = {"greedy": ("greedy", (0,)), "paper": ("t0.7", (0, 1, 2))}
# Best-of-N samples by definition (its tasks decode at T = 0.7 with N = 5 repeats): one
# configuration under every decoding, planned once, in the greedy layout where its runs live
SAMPLES_ALWAYS = tuple(m.label for m in registry.METHODS if m.samples)


@dataclass(frozen=True)
class Run:
    """One ``lm_eval`` run of a suite. ``label`` is the report's row name (``FR (alpha=-0.2)
    [t0.7]``); ``folder_name`` the method's folder when it is not the method's name (an
    early-exit threshold's, ``EE_p0.9``)."""

    decoding: str
    method: str
    label: str
    dataset: str
    task: str
    model_args: str
    seed: int = 0
    folder_name: str | None = None

    def folder(self, out: Path) -> Path:
        """``OUT/<decoding folder (seed_folder)>/<method>/<dataset>``."""
        return (out / seed_folder(self.decoding, self.seed)
                / (self.folder_name or self.method).replace(" ", "_") / self.dataset)

    def finished(self, out: Path) -> bool:
        return any(self.folder(out).rglob("results_*.json"))

    @property
    def key(self) -> tuple[str, str, str, int]:
        return (self.label, self.decoding, self.dataset, self.seed)


def seed_folder(decoding: str, seed: int) -> str:
    """The decoding folder of one seed: a seed other than 0 gets its own (``t0.7-seed1``), so a
    run's folder never holds another seed's results."""
    return decoding + (f"-seed{seed}" if seed else "")


def exit_runs(datasets: list[str], decoding: str, thresholds: tuple[float, ...],
              layers: str | None, seed: int = 0) -> list[Run]:
    """The early-exit sweep: one run per threshold (each its own directory and label), on
    the Direct prompt with ``controller=none``."""
    from lm_eval_ponder.generation.early_exit import ExitSettings, exit_label

    runs = []
    for threshold in thresholds:
        settings = ExitSettings.from_model_args(threshold, layers)
        args = f"controller=none,early_exit={threshold!r}" + (
            f",exit_layers={settings.layers}" if layers else "")
        label = exit_label(settings.fingerprint())
        tag = f"EE_p{threshold:g}" + (f"_layers{settings.layers.replace(':', '-')}"
                                      if layers else "")
        for dataset in datasets:
            runs.append(Run(decoding, "EE", label if decoding == "greedy" else
                            f"{label} [{decoding}]", dataset, registry.task_name(dataset, "EE"),
                            args, seed, folder_name=tag))
    return runs


def plan(methods: list[str], datasets: list[str], decodings: list[str], alpha: float,
         controller: str | None, seeds: tuple[int, ...] = (0,),
         exit_thresholds: tuple[float, ...] = EXIT_THRESHOLDS,
         exit_layers: str | None = None) -> list[Run]:
    """Every run: (decoding, seed, method, dataset). A Best-of-N method is one configuration
    under every decoding and is planned once, with the first seed (``SAMPLES_ALWAYS``); EE is
    one run per threshold (``exit_runs``)."""
    runs = []
    for decoding in decodings:
        for seed in seeds:
            runs += [run for run in plan_one(methods, datasets, decoding, alpha, controller,
                                             seed, exit_thresholds, exit_layers)
                     if not (run.method in SAMPLES_ALWAYS and (seed != seeds[0] or any(
                         (x.method, x.dataset) == (run.method, run.dataset) for x in runs)))]
    return runs


def plan_one(methods: list[str], datasets: list[str], decoding: str, alpha: float,
             controller: str | None, seed: int, exit_thresholds: tuple[float, ...],
             exit_layers: str | None) -> list[Run]:
    """The runs of one decoding and seed: each method on each dataset (FP methods only with a
    controller)."""
    runs = []
    for method in methods:
        row = registry.method(method)
        if row.model == "early_exit":
            runs += exit_runs(datasets, decoding, exit_thresholds, exit_layers, seed)
            continue
        if row.needs_controller:
            if controller is None:
                continue
            args = f"controller={controller}"
        elif row.model == "alpha":
            args = f"alpha={alpha}"
        else:
            args = "controller=none"
        for dataset in datasets:
            label = f"{method} (alpha={alpha:g})" if row.model == "alpha" else method
            layout = "greedy" if row.samples else decoding
            if layout != "greedy":
                label += f" [{decoding}]"
            runs.append(Run(layout, method, label, dataset, registry.task_name(dataset, method),
                            args, seed))
    return runs


def parse_thresholds(text: str) -> tuple[float, ...]:
    """``--exit_thresholds``: comma-separated top-1 probabilities in (0, 1], as the model arg
    ``early_exit`` takes them (refused here, before any run, not in the first run's lm_eval)."""
    try:
        thresholds = tuple(float(t) for t in text.split(",") if t.strip())
    except ValueError:
        thresholds = (math.nan,)
    if not all(0 < t <= 1 for t in thresholds):
        raise PonderError(f"--exit_thresholds must be comma-separated top-1 probabilities in "
                          f"(0, 1], got {text!r}")
    return thresholds


def checked_choices(options: argparse.Namespace) -> tuple[list[str], list[str], list[str],
                                                     tuple[int, ...]]:
    """(methods, datasets, decodings, seeds) as the options give them, every one checked
    before any run starts: a wrong name or a count below 1 is one line now, not a traceback
    (lm_eval's own errors for ``--limit`` and the like) or a failure hours into the suite."""
    methods = [m.strip() for m in options.methods.split(",")]
    datasets = [d.strip() for d in options.tasks.split(",")]
    if options.protocol not in PROTOCOLS:
        raise PonderError(f"unknown protocol {options.protocol!r}; choose from {list(PROTOCOLS)}")
    decoding, seeds = PROTOCOLS[options.protocol]
    # explicit decodings override the protocol's; seeds: --seeds, else --seed, else the protocol's
    decodings = ([d.strip() for d in options.decoding.split(",")] if options.decoding is not None
                 else [decoding])
    if options.seeds is not None:
        try:
            seeds = tuple(int(x) for x in options.seeds.split(","))
        except ValueError:
            raise PonderError(f"--seeds takes comma-separated integers, got {options.seeds!r}") \
                from None
    elif options.seed is not None:
        seeds = (options.seed,)
    for flag, value in (("--limit", options.limit), ("--max_gen_toks", options.max_gen_toks),
                        ("--batch_size", options.batch_size)):
        if value is not None and value < 1:
            raise PonderError(f"{flag} must be at least 1, got {value}")
    for name, given, known in (("method", methods, METHODS + EXTRA_METHODS),
                               ("dataset", datasets, registry.DATASET_NAMES),
                               ("decoding", decodings, DECODINGS)):
        bad = [x for x in given if x not in known]
        if bad:
            raise PonderError(f"unknown {name}(s) {bad}; choose from {list(known)}")
    return methods, datasets, decodings, seeds


def portable_name(pretrained: str) -> str:
    """``--pretrained`` as a name: a Hub id as given, a local directory by its last part."""
    if pretrained.startswith(("/", "~", ".")) or Path(pretrained).expanduser().is_dir():
        return Path(pretrained.rstrip("/")).name or pretrained
    return pretrained


def plan_text(runs: list[Run], out: Path, pilot: str | None, limit: int | None,
              scale: str | None = None) -> str:
    """What ``--plan`` prints: the runs, which are done, and with ``--pilot`` the estimate
    (with ``--scale``, priced at a ``benchmarks/scale.py`` cost per token)."""
    from lm_eval_ponder.reporting.budget import estimate, questions, read_pilot, render_estimate

    done = {run.key for run in runs if run.finished(out)}
    if scale:
        return scale_plan_text(runs, done, pilot, limit, scale)
    if pilot:
        rows, model = estimate(runs, read_pilot(pilot), limit, done)
        return render_estimate(rows, model)
    lines, took = [f"{len(runs)} runs ({len(done)} done):"], 0.0
    for run in runs:
        n, target = questions(run.dataset, limit), run.folder(out)
        state = "done" if run.key in done else "to run"
        spent, note = run_time(target)
        took += spent
        if state == "to run" and (kept := kept_answers(target / "answers_rank0.db")):
            state += f" ({kept:,} answers kept)"
        seed = f", seed {run.seed}" if run.seed else ""
        lines.append(f"  {run.label} on {run.dataset}{seed}: {n} questions, {state}"
                     + (f"; ran {spent:,.0f} s{note}" if spent or note else ""))
    lines.append(f"Run time so far: {took / 3600:.2f} h, summed over runs (runs side by side "
                 "overlap in wall-clock time).")
    lines.append("For a time estimate, run a pilot first (`--limit 10 --output PILOT`) and pass "
                 "`--plan --pilot PILOT`.")
    return "\n".join(lines)


def scale_plan_text(runs: list[Run], done: set, lengths: str | None, limit: int | None,
                    scale: str) -> str:
    """``--plan --scale FILE --pilot SUITE``: the runs priced at the cost per token that
    ``benchmarks/scale.py`` measured for a backbone shape and device, with the answer lengths of
    a finished suite (the committed ``results/suite`` by default), and the paper-scale training
    at the same rate."""
    from lm_eval_ponder.reporting.budget import (
        ScaleCost,
        estimate,
        read_lengths,
        render_estimate,
        training_tokens,
    )

    if not lengths:
        raise PonderError("--plan --scale needs --pilot SUITE_DIR for the answer lengths (e.g. "
                          "--pilot results/suite, the committed runs of the embedded backbone)")
    cost, runs_seen = ScaleCost.read(scale), read_lengths(lengths)
    rows, model = estimate(runs, runs_seen, limit, done, model=cost.model())
    overhead = (", the loop alone: a lower bound" if cost.overhead_s_per_token is None else
                f" + {cost.overhead_s_per_token * 1e3:.2f} ms/token the harness spends beyond "
                "the loop")
    text = render_estimate(rows, model, f"benchmarks/scale.py ({cost.shape} on {cost.device}, "
                                        f"{cost.dtype}: {cost.tok_s:,.0f} useful tok/s{overhead})")
    warning = cost.small_record(max((r["questions"] for r in rows), default=0))
    if warning:
        text = f"Warning: {warning}.\n\n{text}"
    direct = [r for r in runs_seen if r.label == "Direct" and r.dataset in ("arith", "gsm8k")]
    per_answer = sum(r.tokens for r in direct) / max(sum(r.questions for r in direct), 1)
    lines = [text, "", f"Paper-scale training at {cost.tok_s:,.0f} useful tok/s, answers of "
             f"{per_answer:.0f} tokens (the greedy Direct mean on arith and GSM8K):"]
    for name, tokens in training_tokens(per_answer).items():
        lines.append(f"  {name}: {tokens:,.0f} tokens, {tokens / cost.tok_s / 3600:.1f} h")
    lines.append("Answer lengths are the embedded backbone's; another backbone answers longer or "
                 "shorter, and the estimate moves with it.")
    return "\n".join(lines)


def attempts_ran_s(attempts: list[dict]) -> tuple[float, int]:
    """Seconds all clocked attempts ran, and how many attempts were not clocked (started
    before ``ran_s`` was stamped), so a total is never silently short."""
    clocked = [a["ran_s"] for a in attempts if "ran_s" in a]
    return round(sum(clocked), 1), len(attempts) - len(clocked)


def run_time(target: Path) -> tuple[float, str]:
    """Seconds a run has taken over all its attempts, and a note when part of it was not
    clocked: a finished run's ``wall_s`` for its last attempt, plus the ``ran_s`` of earlier
    ones; an unfinished one's clocked attempts."""
    info = target / "ponder_run.json"
    attempts_file = target / ATTEMPTS
    attempts = read_json(attempts_file) if attempts_file.is_file() else []
    if info.is_file():
        run = read_json(info)
        earlier, unclocked = attempts_ran_s(run.get("attempts", [])[:-1])
        spent = run["wall_s"] + earlier
    else:
        spent, unclocked = attempts_ran_s(attempts)
    return spent, (f" (+ {unclocked} unclocked attempt{'s' * (unclocked > 1)})"
                   if unclocked else "")
