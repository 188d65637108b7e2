"""``python -m lm_eval_ponder.suite``: every method on every dataset through lm-eval, then the
report.

    python -m lm_eval_ponder.suite --output results/suite --limit 20
    python -m lm_eval_ponder.suite --pretrained Qwen/Qwen2.5-0.5B-Instruct --tasks gsm8k,math500 \
        --controller controllers/qwen --decoding greedy,t0.7 --output results/qwen

Each (decoding, method, dataset) is one ``lm_eval`` run in its own directory, written by the
real CLI (so the files are exactly what users get) with a ``ponder_run.json`` naming the method.
A run whose directory already holds results is skipped, so an interrupted suite continues
where it stopped; with ``--resume_within`` a run also keeps its answers as they come (lm-eval's
``--use_cache``, stamped with the model's settings; sampled answers too, ``evaluation.resume``),
so a long run resumes mid-dataset.
Every finished run also gets a compact log of its samples (``reporting.compact``: one small xz
file, no benchmark text): that, its ``results_*.json`` and ``ponder_run.json`` are what a
repository keeps of a run, and all the report needs.
Methods: Direct, CoT, BoN (``controller=none``), FR (fixed ``alpha``), FP-Direct, FP-CoT,
FP-BoN (the controller: ``--controller`` or the one shipped for the backbone; skipped, with a
message, when there is none). Not run unless named: EE, the early-exit baseline
(``evaluation.early_exit``) on the Direct prompt, one run per ``--exit_thresholds`` value.

Protocols: ``--protocol greedy`` (default; our documented variant) decodes greedily, one seed;
``--protocol paper`` samples every method at T = 0.7 with 500 new tokens over seeds 0, 1, 2,
as the paper's experimental setup states. Seeds are recorded (``ponder_run.json``, and lm-eval's
results JSON) and the report averages a configuration's seeds (``reporting.seeds``).
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import math
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lm_eval_ponder import allocator, registry
from lm_eval_ponder.backbone import EMBEDDED_NAME, device_description
from lm_eval_ponder.errors import Interrupted, PonderError, command, program_name, run_program
from lm_eval_ponder.evaluation.resume import (
    KEPT_SUFFIX,
    export_kept,
    kept_answers,
    kept_path,
    restore_kept,
)
from lm_eval_ponder.files import (
    HeldLock,
    LockHeld,
    acquire_lock,
    atomic_write_text,
    check_output,
    read_json,
)
from lm_eval_ponder.reporting import archive
from lm_eval_ponder.reporting.compact import compact_tree
from lm_eval_ponder_autoload import BUILTIN_TASKS_ENV

LOGGER = logging.getLogger(__name__)

# the methods and datasets are the registry's; an unpublishable dataset's answers (GPQA's) are
# never exported for committing (``--snapshot``, the heartbeat's twin), finished or not
METHODS = tuple(m.label for m in registry.METHODS if m.default)
# known to --methods but not in its default: the early-exit sweep (one run per threshold)
EXTRA_METHODS = tuple(m.label for m in registry.METHODS if not m.default)
EXIT_THRESHOLDS = (0.9, 0.95, 0.99, 0.999)
ATTEMPTS = "ponder_attempts.json"
HEARTBEAT_S = 60.0
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


def record_attempt(target: Path, kept: int) -> list[dict]:
    """Append this start of a run to ``ponder_attempts.json`` in its directory and return them
    all. A resumed run's ``wall_s`` covers only its last attempt: with ``kept_answers`` > 0
    the earlier attempts produced the rest, so the report and the cost model must not read
    ``wall_s`` as the time of every answer."""
    path, finished = target / ATTEMPTS, target / "ponder_run.json"
    # a finished run's summary carries its attempts (the attempts file goes with it, one small
    # file less a run in the tree); a run started again after it keeps counting from them
    if path.is_file():
        attempts = read_json(path)
    elif finished.is_file():
        attempts = read_json(finished).get("attempts", [])
    else:
        attempts = []
    attempts.append({"started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "kept_answers": kept,
                     **where_it_runs()})
    atomic_write_text(path, json.dumps(attempts, indent=1))
    return attempts


def where_it_runs(env: dict[str, str] | None = None) -> dict[str, Any]:
    """What an attempt ran on (runs are resumed across sessions and machines): the device's
    hardware, the commit this checkout is at (None outside a git checkout) and the threads
    the child computes with (``OMP_NUM_THREADS``, else every core). The report flags a run
    whose attempts differ in either of the first two."""
    import torch

    env = os.environ if env is None else env
    threads = env.get("OMP_NUM_THREADS") or str(os.cpu_count())
    return {"machine": device_description("cuda" if torch.cuda.is_available() else "cpu"),
            "commit": checkout_commit(Path(__file__).resolve().parents[2]),
            "threads": int(threads) if threads.isdigit() else threads}


def checkout_commit(root: Path) -> str | None:
    """The commit ``root``'s git checkout is at, read from ``.git`` itself (HEAD, then the
    loose ref or ``packed-refs``): no ``git`` process, which the suite's children would
    otherwise race with; None for an installed package or anything unreadable."""
    git = root / ".git"
    try:
        head = (git / "HEAD").read_text().strip()
        if not head.startswith("ref: "):
            return head[:12] or None
        ref = head[5:]
        if (git / ref).is_file():
            return (git / ref).read_text().strip()[:12]
        for line in (git / "packed-refs").read_text().splitlines():
            if line.endswith(" " + ref):
                return line.split()[0][:12]
    except OSError:
        return None
    return None


def run_clocked(cmd: list[str], target: Path, attempts: list[dict],
                env: dict[str, str] | None = None,
                on_beat: Callable[[], None] | None = None) -> int:
    """Run one attempt and stamp its ``ran_s`` into ``ponder_attempts.json`` every
    ``HEARTBEAT_S`` and at its end, so an attempt that is killed (out of memory, out of session)
    still says, to within a minute, how long it ran: a run spread over several sessions then
    has a total run time, not just its last attempt's. ``on_beat`` runs at each stamp too (the
    suite refreshes the kept answers' text twin there); a failure of it is logged, never fatal
    to the run. A SIGTERM to the suite (a scheduler's time limit, ``timeout``) stops the lm_eval
    child too instead of orphaning it."""
    path, start = target / ATTEMPTS, time.time()
    failed: set[str] = set()

    def stamp() -> None:
        attempts[-1]["ran_s"] = round(time.time() - start, 1)
        atomic_write_text(path, json.dumps(attempts, indent=1))
        if on_beat is not None:
            try:
                on_beat()
            except Exception as error:  # noqa: BLE001 - the run matters more than its twin
                if str(error) not in failed:
                    failed.add(str(error))
                    LOGGER.warning("suite: %s (the run goes on)", error)

    def on_term(signum, frame):  # a scheduler's or `timeout`'s SIGTERM: end like Ctrl-C
        raise SystemExit(128 + signum)

    # Ctrl-C reaches the whole foreground process group: the child ignores it (its traceback
    # would bury the suite's one line) and is ended below, as a SIGTERM ends it
    proc = subprocess.Popen(cmd, env=env, preexec_fn=ignore_interrupts)
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, on_term) if main_thread else None
    try:
        while True:
            try:
                return proc.wait(timeout=HEARTBEAT_S)
            except subprocess.TimeoutExpired:
                stamp()
    except BaseException:  # stopped or failed here: leave no orphaned lm_eval behind
        proc.terminate()
        proc.wait()
        raise
    finally:
        stamp()
        if main_thread:
            signal.signal(signal.SIGTERM, previous)


def ignore_interrupts() -> None:
    """In the lm_eval child, before it starts: ignore SIGINT. Python keeps an ignored SIGINT
    ignored (it installs its KeyboardInterrupt handler only over the default), so Ctrl-C in
    the terminal stops the suite alone, which then ends the child with SIGTERM."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def attempts_ran_s(attempts: list[dict]) -> tuple[float, int]:
    """Seconds all clocked attempts ran, and how many attempts were not clocked (started
    before ``ran_s`` was stamped), so a total is never silently short."""
    clocked = [a["ran_s"] for a in attempts if "ran_s" in a]
    return round(sum(clocked), 1), len(attempts) - len(clocked)


def exit_runs(datasets: list[str], decoding: str, thresholds: tuple[float, ...],
              layers: str | None, seed: int = 0) -> list[dict]:
    """The early-exit sweep: one run per threshold (each its own directory and label), on
    the Direct prompt with ``controller=none``."""
    from lm_eval_ponder.evaluation.early_exit import ExitSettings, exit_label

    runs = []
    for threshold in thresholds:
        settings = ExitSettings.from_model_args(threshold, layers)
        args = f"controller=none,early_exit={threshold!r}" + (
            f",exit_layers={settings.layers}" if layers else "")
        label = exit_label(settings.fingerprint())
        tag = f"EE_p{threshold:g}" + (f"_layers{settings.layers.replace(':', '-')}"
                                      if layers else "")
        for dataset in datasets:
            runs.append({"decoding": decoding, "method": "EE", "dir": tag,
                         "label": label if decoding == "greedy" else f"{label} [{decoding}]",
                         "dataset": dataset, "task": registry.task_name(dataset, "EE"),
                         "model_args": args, "seed": seed})
    return runs


def plan(methods: list[str], datasets: list[str], decodings: list[str], alpha: float,
         controller: str | None, seeds: tuple[int, ...] = (0,),
         exit_thresholds: tuple[float, ...] = EXIT_THRESHOLDS,
         exit_layers: str | None = None) -> list[dict]:
    """Every run: (decoding, seed, method, dataset). A Best-of-N method is one configuration
    under every decoding and is planned once, with the first seed (``SAMPLES_ALWAYS``); EE is
    one run per threshold (``exit_runs``)."""
    runs = []
    for decoding in decodings:
        for seed in seeds:
            runs += [r for r in plan_one(methods, datasets, decoding, alpha, controller, seed,
                                         exit_thresholds, exit_layers)
                     if not (r["method"] in SAMPLES_ALWAYS and (seed != seeds[0] or any(
                         x["method"] == r["method"] and x["dataset"] == r["dataset"]
                         for x in runs)))]
    return runs


def plan_one(methods: list[str], datasets: list[str], decoding: str, alpha: float,
             controller: str | None, seed: int,
             exit_thresholds: tuple[float, ...] = EXIT_THRESHOLDS,
             exit_layers: str | None = None) -> list[dict]:
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
            runs.append({"decoding": layout, "method": method, "label": label,
                         "dataset": dataset, "task": registry.task_name(dataset, method),
                         "model_args": args, "seed": seed})
    return runs


def portable_path(path: str) -> str:
    """A directory under the working directory as a relative path (the shipped controller is
    found as an absolute one): the run's command and model args are published with its
    results, and should not name a directory of the machine that ran it."""
    try:
        relative = os.path.relpath(path)
    except ValueError:
        return path
    return path if relative.startswith("..") else relative


def portable_name(pretrained: str) -> str:
    """``--pretrained`` as a name: a Hub id as given, a local directory by its last part."""
    if pretrained.startswith(("/", "~", ".")) or Path(pretrained).expanduser().is_dir():
        return Path(pretrained.rstrip("/")).name or pretrained
    return pretrained


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


def launcher(command: str | None) -> list[str]:
    """How each lm_eval run starts: this Python, or e.g. ``accelerate launch --multi_gpu
    --num_processes 8`` (HFLM then splits the requests over the GPUs, one backbone per GPU)."""
    if not command:
        return [sys.executable]
    return shlex.split(command)


def seed_folder(decoding: str, seed: int) -> str:
    """The decoding folder of one seed: a seed other than 0 gets its own (``t0.7-seed1``), so a
    run's folder never holds another seed's results."""
    return decoding + (f"-seed{seed}" if seed else "")


def run_dir(out: Path, r: dict) -> Path:
    """``OUT/<decoding folder>/<method>/<dataset>`` (an EE run: its threshold's folder; the
    decoding folder: ``seed_folder``)."""
    return (out / seed_folder(r["decoding"], r.get("seed", 0))
            / r.get("dir", r["method"]).replace(" ", "_") / r["dataset"])


def plan_text(runs: list[dict], out: Path, pilot: str | None, limit: int | None,
              scale: str | None = None) -> str:
    """What ``--plan`` prints: the runs, which are done, and with ``--pilot`` the estimate
    (with ``--scale``, priced at a ``benchmarks/scale.py`` cost per token)."""
    from lm_eval_ponder.reporting.budget import estimate, questions, read_pilot, render_estimate

    done = {(r["label"], r["decoding"], r["dataset"], r.get("seed", 0)) for r in runs
            if list(run_dir(out, r).rglob("results_*.json"))}
    if scale:
        return scale_plan_text(runs, done, pilot, limit, scale)
    if pilot:
        rows, model = estimate(runs, read_pilot(pilot), limit, done)
        return render_estimate(rows, model)
    lines, took = [f"{len(runs)} runs ({len(done)} done):"], 0.0
    for r in runs:
        n, target = questions(r["dataset"], limit), run_dir(out, r)
        state = "done" if (r["label"], r["decoding"], r["dataset"], r.get("seed", 0)) in done \
            else "to run"
        spent, note = run_time(target)
        took += spent
        if state == "to run" and (kept := kept_answers(target / "answers_rank0.db")):
            state += f" ({kept:,} answers kept)"
        seed = f", seed {r['seed']}" if r.get("seed", 0) else ""
        lines.append(f"  {r['label']} on {r['dataset']}{seed}: {n} questions, {state}"
                     + (f"; ran {spent:,.0f} s{note}" if spent or note else ""))
    lines.append(f"Run time so far: {took / 3600:.2f} h, summed over runs (runs side by side "
                 "overlap in wall-clock time).")
    lines.append("For a time estimate, run a pilot first (`--limit 10 --output PILOT`) and pass "
                 "`--plan --pilot PILOT`.")
    return "\n".join(lines)


def scale_plan_text(runs: list[dict], done: set, lengths: str | None, limit: int | None,
                    scale: str) -> str:
    """``--plan --scale FILE --pilot SUITE``: the runs priced at the cost per token that
    ``benchmarks/scale.py`` measured for a backbone shape and device, with the answer lengths of
    a finished suite (the committed ``results/suite`` by default), and the paper-scale training
    at the same rate (issue 54)."""
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


def refresh_twins(target: Path) -> list[Path]:
    """Re-export the text twin of each ``--use_cache`` file in ``target`` that changed since its
    twin was written (answers are committed as their rows end); return the twins written."""
    written = []
    for db in sorted(target.glob("answers_rank*.db")):
        twin = kept_path(db)
        if twin.is_file() and twin.stat().st_mtime >= db.stat().st_mtime:
            continue
        if kept_answers(db):
            written.append(export_kept(db)[0])
    return written


def snapshot(runs: list[dict], out: Path) -> str:
    """Export the answers kept so far by every unfinished run (``--snapshot``) as text twins
    that can be committed, so a run that spans sessions survives a change of machine; a later
    ``--resume_within`` restores them. GPQA runs are never exported."""
    lines = []
    for r in runs:
        target = run_dir(out, r)
        dbs = sorted(target.glob("answers_rank*.db"))
        if not dbs or list(target.rglob("results_*.json")):
            continue
        if not registry.publishable(r["dataset"]):
            lines.append(f"{r['label']} on {r['dataset']}: not exported ({r['dataset']} text is "
                         "never committed); its answers stay on this machine only")
            continue
        for db in dbs:
            if not kept_answers(db):
                lines.append(f"{r['label']} on {r['dataset']}: no answer kept yet")
                continue
            twin, n = export_kept(db)
            lines.append(f"{r['label']} on {r['dataset']}: {n} answer{'s' * (n != 1)} -> "
                         f"{twin} ({twin.stat().st_size / 1e6:.2f} MB)")
    return "\n".join(lines) or "no unfinished run holds kept answers"


LOCK = "ponder_suite.lock"


def resume_command(argv: list[str]) -> str:
    return shlex.join(["python", "-m", "lm_eval_ponder.suite", *argv])


def lock_runs(targets: list[Path], argv: list[str]) -> list[HeldLock]:
    """Lock every run directory this suite is about to run (``LOCK`` in each), or refuse, naming
    the live suite that holds one: two suites on one ``--output`` would both run everything (a
    23-hour suite twice). Suites with disjoint runs (``--methods``/``--tasks``) share an
    ``--output``. A lock whose process died is taken over, with a line that says so."""
    holder = {"pid": os.getpid(), "host": socket.gethostname(),
              "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "command": resume_command(argv)}
    held: list[HeldLock] = []
    try:
        for target in targets:
            target.mkdir(parents=True, exist_ok=True)
            try:
                lock = acquire_lock(target / LOCK, holder)
            except LockHeld as busy:
                h = busy.holder
                raise PonderError(
                    f"{target} is being run by another suite: process {h.get('pid', '?')} on "
                    f"{h.get('host', '?')}, started {h.get('started', '?')} "
                    f"(`{h.get('command', '?')}`). Wait for it or stop it; pass --force to run "
                    "anyway (both would then run the same runs)") from None
            except OSError as error:  # a file system without flock: run unguarded, say so
                LOGGER.warning("suite: cannot lock %s (%s); nothing stops a second suite from "
                               "running the same runs", target, error)
                continue
            if lock.previous is not None:
                LOGGER.warning("suite: %s was locked by process %s, which is no longer running; "
                               "taken over", target, lock.previous.get("pid", "?"))
            held.append(lock)
    except BaseException:
        for lock in held:
            lock.release()
        raise
    return held


def interrupted_in(i: int, n: int, r: dict, target: Path, resume_within: bool,
                   argv: list[str]) -> Interrupted:
    """Where Ctrl-C stopped the suite (run ``i`` of ``n``), what it kept, how to resume."""
    if resume_within:
        kept = kept_answers(target / "answers_rank0.db")
        kept_text = f"{kept:,} of its answers kept"
    else:
        kept_text = "its answers are not kept (--resume_within keeps them as they come)"
    return Interrupted(f"run {i}/{n}, {r['label']} on {r['dataset']} ({target}), stopped: "
                       f"{kept_text}; finished runs are kept. Resume with: {resume_command(argv)}")


def suite_seeds(a: argparse.Namespace, protocol_seeds: tuple[int, ...]) -> tuple[int, ...]:
    """The seeds to run: ``--seeds`` (a list), else ``--seed`` (one), else the protocol's."""
    if a.seeds is not None:
        try:
            return tuple(int(x) for x in a.seeds.split(","))
        except ValueError:
            raise PonderError(f"--seeds takes comma-separated integers, got {a.seeds!r}") \
                from None
    if a.seed is not None:
        return (a.seed,)
    return protocol_seeds


def checked_choices(a: argparse.Namespace) -> tuple[list[str], list[str], list[str],
                                                     tuple[int, ...]]:
    """(methods, datasets, decodings, seeds) as the options give them, every one checked
    before any run starts: a wrong name or a count below 1 is one line now, not a traceback
    (lm_eval's own errors for ``--limit`` and the like) or a failure hours into the suite."""
    methods = [m.strip() for m in a.methods.split(",")]
    datasets = [d.strip() for d in a.tasks.split(",")]
    if a.protocol not in PROTOCOLS:
        raise PonderError(f"unknown protocol {a.protocol!r}; choose from {list(PROTOCOLS)}")
    decoding, protocol_seeds = PROTOCOLS[a.protocol]
    if a.decoding is not None:  # an explicit decoding list overrides the protocol's
        decodings = [d.strip() for d in a.decoding.split(",")]
    else:
        decodings = [decoding]
    seeds = suite_seeds(a, protocol_seeds)
    for flag, value in (("--limit", a.limit), ("--max_gen_toks", a.max_gen_toks),
                        ("--batch_size", a.batch_size)):
        if value is not None and value < 1:  # (lm_eval's own errors for these are tracebacks)
            raise PonderError(f"{flag} must be at least 1, got {value}")
    for name, given, known in (("method", methods, METHODS + EXTRA_METHODS),
                               ("dataset", datasets, registry.DATASET_NAMES),
                               ("decoding", decodings, DECODINGS)):
        bad = [x for x in given if x not in known]
        if bad:
            raise PonderError(f"unknown {name}(s) {bad}; choose from {list(known)}")
    return methods, datasets, decodings, seeds


def suite_controller(a: argparse.Namespace, methods: list[str]) -> str | None:
    """The controller the FP methods run: ``--controller``, else the one shipped for the
    backbone; ``none`` (or none shipped) skips the FP methods, with a warning when some were
    asked for, so a suite without one still runs the rest."""
    controller = a.controller
    if controller is None:
        from lm_eval_ponder import backbone as bb
        from lm_eval_ponder.resources import shipped_controller_dir

        name = Path(a.pretrained).name.lower() if a.pretrained else bb.EMBEDDED_NAME
        shipped = shipped_controller_dir(name)
        if shipped is not None and (shipped / "controller.safetensors").is_file():
            controller = str(shipped)
    if controller in ("none", ""):
        controller = None
    if controller is None and any(registry.method(m).needs_controller for m in methods):
        LOGGER.warning("suite: no controller for this backbone (pass --controller DIR); FP "
                       "methods are skipped")
    return controller


def run_suite(a: argparse.Namespace) -> Path:
    out = Path(a.output)
    archive.ensure(out)  # a committed study's runs count as done (results/*.tar.xz)
    methods, datasets, decodings, seeds = checked_choices(a)
    controller = suite_controller(a, methods)
    # the row label the report shows: a name, never a directory of this machine
    backbone = portable_name(a.pretrained) if a.pretrained else EMBEDDED_NAME
    controller = portable_path(controller) if controller else controller
    thresholds = parse_thresholds(a.exit_thresholds)
    runs = plan(methods, datasets, decodings, a.alpha, controller, seeds, thresholds,
                a.exit_layers)
    preload = allocator.resolve(a.allocator)
    # the runs name only our tasks: lm-eval's ~15,000 built-in ones need not be indexed
    env = {BUILTIN_TASKS_ENV: "0", **allocator.child_environment(preload)}
    if a.plan:
        print(plan_text(runs, out, a.pilot, a.limit, a.scale))
        return out
    if a.snapshot:
        print(snapshot(runs, out))
        return out
    check_output(out)  # before the first run, not when its results are saved
    run_locked(a, runs, out, backbone, env)
    if a.report:
        from lm_eval_ponder.reporting.report import report

        print(report([out], out / "report"))
    return out


def run_locked(a: argparse.Namespace, runs: list[dict], out: Path, backbone: str,
               env: dict[str, str]) -> None:
    """``run_all`` with every run still to do locked for its length (``lock_runs``: a second
    suite on the same runs is refused), unless ``--force``; the logs of runs finished before
    compact logs existed are compacted first."""
    argv = list(getattr(a, "argv", None) or [])
    if out.is_dir():
        compact_tree(out)  # runs finished before compact logs existed
    todo = [run_dir(out, r) for r in runs if not list(run_dir(out, r).rglob("results_*.json"))]
    if a.force:
        LOGGER.warning("suite: --force: no lock; another suite on %s may run the same runs", out)
        locks: list[HeldLock] = []
    else:
        locks = lock_runs(todo, argv)
    try:
        run_all(a, runs, out, backbone, env, argv)
    finally:
        for lock in locks:
            lock.release()


def run_all(a: argparse.Namespace, runs: list[dict], out: Path, backbone: str,
            env: dict[str, str], argv: list[str]) -> None:
    """Each planned run that has no results yet, in order (``run_one``); Ctrl-C becomes
    ``Interrupted``, naming the run it stopped and the command that resumes the suite."""
    for i, r in enumerate(runs, 1):
        target = run_dir(out, r)
        if list(target.rglob("results_*.json")):
            LOGGER.info("[%d/%d] %s %s: done, skipped", i, len(runs), r["label"], r["dataset"])
            continue
        try:
            run_one(a, i, len(runs), r, target, backbone, env)
        except KeyboardInterrupt:
            raise interrupted_in(i, len(runs), r, target, a.resume_within, argv) from None


def run_one(a: argparse.Namespace, i: int, n: int, r: dict, target: Path, backbone: str,
            env: dict[str, str]) -> None:
    """One lm_eval run into ``target``, clocked, then its summary and compact log."""
    target.mkdir(parents=True, exist_ok=True)
    model_args = r["model_args"] + (f",pretrained={a.pretrained}" if a.pretrained else "")
    if a.steering and registry.method(r["method"]).steered:
        model_args += f",steering={a.steering}"
    if a.model_args:
        model_args += f",{a.model_args}"
    gen = f"max_gen_toks={a.max_gen_toks}," + DECODINGS[r["decoding"]]
    if registry.method(r["method"]).samples and r["decoding"] == "greedy":
        gen = f"max_gen_toks={a.max_gen_toks}"  # BoN samples by definition (task: T=0.7)
    cmd = [*launcher(a.launcher), "-m", "lm_eval", "--model", "ponder", "--model_args", model_args,
           "--tasks", r["task"], *(["--apply_chat_template"] if a.chat_template else []),
           "--batch_size", str(a.batch_size),
           "--log_samples", "--output_path", str(target), "--gen_kwargs", gen,
           "--seed", str(r["seed"])]
    if a.limit:
        cmd += ["--limit", str(a.limit)]
    if a.resume_within:  # answers are kept as rows end: a kill loses the rows in flight
        cmd += ["--use_cache", str(target / "answers")]
    LOGGER.info("[%d/%d] %s %s seed %d: %s", i, n, r["label"], r["dataset"], r["seed"],
                " ".join(cmd[2:]))
    if a.resume_within:
        for twin in sorted(target.glob("answers_rank*" + KEPT_SUFFIX)):
            db = twin.with_name(twin.name[:-len(KEPT_SUFFIX)] + ".db")
            restored = restore_kept(db)
            if restored:
                LOGGER.info("%s: %d kept answers restored from %s", r["label"], restored,
                            twin.name)
    kept = kept_answers(target / "answers_rank0.db") if a.resume_within else 0
    attempts = record_attempt(target, kept)
    start = time.time()
    # the kept answers' committable twin stays current, so a session cut off mid-run
    # leaves on disk all that a commit needs to carry the run to another machine
    on_beat = functools.partial(refresh_twins, target) \
        if a.resume_within and registry.publishable(r["dataset"]) else None
    returncode = run_clocked(cmd, target, attempts, env, on_beat)
    if returncode != 0:
        raise PonderError(f"lm_eval failed for {r['label']} on {r['dataset']} (exit "
                          f"{returncode}); fix the error above and re-run: finished "
                          "runs are kept")
    total, unclocked = attempts_ran_s(attempts)
    atomic_write_text(target / "ponder_run.json", json.dumps(
        {"method": r["label"], "backbone": backbone, "decoding": r["decoding"],
         "seed": r["seed"], "protocol": a.protocol,
         "wall_s": round(time.time() - start, 1), "kept_answers": kept,
         "attempts": attempts, "ran_s_all_attempts": total,
         "unclocked_attempts": unclocked, "command": cmd[1:],
         "preload": env.get("LD_PRELOAD", ""),
         "malloc": allocator.malloc_settings(env)}, indent=1))
    compact_tree(target)
    for twin in target.glob("answers_rank*" + KEPT_SUFFIX):
        twin.unlink()  # the run's summary replaces its unfinished answers
    (target / ATTEMPTS).unlink(missing_ok=True)  # and its attempts, which it carries


@command
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=program_name("python -m lm_eval_ponder.suite"),
                                description="Run every method on every dataset, then report.")
    p.add_argument("--output", required=True)
    p.add_argument("--pretrained", default=None, help="Hub id or local dir (default: embedded)")
    p.add_argument("--controller", default=None, help="controller dir (default: shipped one)")
    p.add_argument("--steering", default=None, help="steering dir (default: shipped one)")
    p.add_argument("--no_chat_template", dest="chat_template", action="store_false",
                   help="do not pass --apply_chat_template (base models)")
    p.add_argument("--tasks", default=",".join(registry.DATASET_NAMES),
                   help="datasets, comma-separated")
    p.add_argument("--methods", default=",".join(METHODS),
                   help=f"comma-separated, of {list(METHODS + EXTRA_METHODS)} (default: "
                        "all but EE, the early-exit sweep)")
    p.add_argument("--protocol", default="greedy",
                   help="paper: every method samples at T = 0.7, 500 new tokens, seeds 0,1,2 "
                        "(the paper's setting); greedy: greedy decoding, one seed (our "
                        "variant, the default)")
    p.add_argument("--decoding", default=None,
                   help=f"comma-separated, overrides the protocol's: {list(DECODINGS)}")
    p.add_argument("--seeds", default=None,
                   help="comma-separated seeds, overrides the protocol's (a seed s > 0 runs in "
                        "OUT/<decoding>-seed<s>/...)")
    p.add_argument("--alpha", type=float, default=-0.2, help="the FR baseline's fixed alpha")
    p.add_argument("--exit_thresholds", default=",".join(f"{t:g}" for t in EXIT_THRESHOLDS),
                   help="EE: the top-1 probability thresholds, one run each")
    p.add_argument("--exit_layers", default=None,
                   help="EE: the layers that may exit, start[:stop[:step]] in layers run "
                        "(default: every layer)")
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--batch_size", type=int, default=32)
    p.add_argument("--max_gen_toks", type=int, default=500)
    p.add_argument("--seed", type=int, default=None, help="one seed (same as --seeds S)")
    p.add_argument("--model_args", default="",
                   help="extra model args for every run, e.g. dtype=bfloat16,parallelize=True")
    p.add_argument("--resume_within", action="store_true",
                   help="keep each run's answers as they come (lm-eval's --use_cache, in the run's "
                        "directory; sampled answers too), so an interrupted run resumes "
                        "mid-dataset, losing only the rows in flight; their text twin "
                        "(answers_rank0.kept.jsonl.gz, never GPQA) is refreshed every minute, "
                        "ready to commit")
    p.add_argument("--no_report", dest="report", action="store_false",
                   help="run only; make the report later with python -m lm_eval_ponder.report")
    p.add_argument("--plan", action="store_true",
                   help="print the runs (and, with --pilot, how long they will take); run none")
    p.add_argument("--scale", default=None, metavar="FILE",
                   help="with --plan and --pilot SUITE: price the runs at the cost per token "
                        "benchmarks/scale.py --out measured for a backbone shape and device")
    p.add_argument("--pilot", default=None, metavar="DIR",
                   help="with --plan: a finished pilot suite (e.g. --limit 10) whose wall times "
                        "and tokens per question price the full runs")
    p.add_argument("--allocator", default=allocator.SYSTEM,
                   help="memory allocator of the lm_eval runs: 'system' (glibc's malloc), "
                        "'glibc-large' (glibc keeping large freed blocks for reuse: about 1.2x "
                        "faster long generations on CPU, about twice the resident memory in a "
                        "full run), 'auto' "
                        "(preload an installed tcmalloc on CPU: about 1.2x less CPU time, but "
                        "far more resident memory; lm_eval_ponder.allocator) or a path to a "
                        "shared library")
    p.add_argument("--snapshot", action="store_true",
                   help="write the answers kept so far by unfinished runs as text beside their "
                        "--use_cache files (answers_rank0.kept.jsonl.gz, GPQA excepted) to "
                        "commit; a later --resume_within restores them; run none")
    p.add_argument("--launcher", default=None,
                   help="start each run with this, e.g. 'accelerate launch --multi_gpu "
                        "--num_processes 8' (default: this Python, one process)")
    p.add_argument("--force", action="store_true",
                   help="run even while another suite runs the same runs in --output (each run "
                        "directory is locked while a suite has it to do; without --force a "
                        "second suite is refused)")
    a = p.parse_args(argv)
    a.argv = list(sys.argv[1:] if argv is None else argv)  # the command that resumes this one
    run_suite(a)
    return 0


if __name__ == "__main__":
    run_program(main)
