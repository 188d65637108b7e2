"""The suite's runs: each planned ``Run`` through the real ``lm_eval`` CLI in a child process,
clocked, locked and resumable.

A run is one child (``run_one``): its command is the one a user would type, its attempts are
stamped every ``HEARTBEAT_S`` (``run_clocked``: a run killed mid-way still says how long it
ran), its folder is locked while a suite has it to do (``lock_runs``: two suites on one
``--output`` would run everything twice), and with ``--resume_within`` its answers are kept as
they come, with a text twin that can be committed (``refresh_twins``, ``snapshot``). A finished
run gets its summary (``ponder_run.json``) and compact log (``reporting.compact``).
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
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
from lm_eval_ponder.backbone import device_description
from lm_eval_ponder.errors import Interrupted, PonderError
from lm_eval_ponder.evaluation.resume import (
    KEPT_SUFFIX,
    export_kept,
    kept_answers,
    kept_path,
    restore_kept,
)
from lm_eval_ponder.files import HeldLock, LockHeld, acquire_lock, atomic_write_text, read_json
from lm_eval_ponder.portable import portable_record
from lm_eval_ponder.reporting.compact import compact_tree
from lm_eval_ponder.reporting.suite_plan import ATTEMPTS, DECODINGS, Run, attempts_ran_s

LOGGER = logging.getLogger("lm_eval_ponder.reporting.suite")
HEARTBEAT_S = 60.0


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


def where_it_runs() -> dict[str, Any]:
    """What an attempt ran on (runs are resumed across sessions and machines): the device's
    hardware, the commit this checkout is at (None outside a git checkout) and the threads
    the child computes with (``OMP_NUM_THREADS``, else every core). The report flags a run
    whose attempts differ in either of the first two."""
    import torch

    threads = os.environ.get("OMP_NUM_THREADS") or str(os.cpu_count())
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


def snapshot(runs: list[Run], out: Path) -> str:
    """Export the answers kept so far by every unfinished run (``--snapshot``) as text twins
    that can be committed, so a run that spans sessions survives a change of machine; a later
    ``--resume_within`` restores them. GPQA runs are never exported."""
    lines = []
    for run in runs:
        target = run.folder(out)
        dbs = sorted(target.glob("answers_rank*.db"))
        if not dbs or run.finished(out):
            continue
        if not registry.publishable(run.dataset):
            lines.append(f"{run.label} on {run.dataset}: not exported ({run.dataset} text is "
                         "never committed); its answers stay on this machine only")
            continue
        for db in dbs:
            if not kept_answers(db):
                lines.append(f"{run.label} on {run.dataset}: no answer kept yet")
                continue
            twin, n = export_kept(db)
            lines.append(f"{run.label} on {run.dataset}: {n} answer{'s' * (n != 1)} -> "
                         f"{twin} ({twin.stat().st_size / 1e6:.2f} MB)")
    return "\n".join(lines) or "no unfinished run holds kept answers"


LOCK = "ponder_suite.lock"


def resume_command(argv: list[str]) -> str:
    """The command that resumes this run, with this interpreter's full path: a bare ``python``
    fails in a shell where the virtual environment is not activated."""
    return shlex.join([sys.executable or "python", "-m", "lm_eval_ponder.suite", *argv])


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


def interrupted_in(i: int, n: int, run: Run, target: Path, resume_within: bool,
                   argv: list[str]) -> Interrupted:
    """Where Ctrl-C stopped the suite (run ``i`` of ``n``), what it kept, how to resume."""
    if resume_within:
        kept = kept_answers(target / "answers_rank0.db")
        kept_text = f"{kept:,} of its answers kept"
    else:
        kept_text = "its answers are not kept (--resume_within keeps them as they come)"
    return Interrupted(f"run {i}/{n}, {run.label} on {run.dataset} ({target}), stopped: "
                       f"{kept_text}; finished runs are kept. Resume with: {resume_command(argv)}")


def suite_controller(options: argparse.Namespace, methods: list[str]) -> str | None:
    """The controller the FP methods run: ``--controller``, else the one shipped for the
    backbone; ``none`` (or none shipped) skips the FP methods, with a warning when some were
    asked for, so a suite without one still runs the rest."""
    controller = options.controller
    if controller is None:
        from lm_eval_ponder import backbone as bb
        from lm_eval_ponder.resources import shipped_controller_dir

        name = Path(options.pretrained).name.lower() if options.pretrained else bb.EMBEDDED_NAME
        shipped = shipped_controller_dir(name)
        if shipped is not None and (shipped / "controller.safetensors").is_file():
            controller = str(shipped)
    if controller in ("none", ""):
        controller = None
    if controller is None and any(registry.method(m).needs_controller for m in methods):
        LOGGER.warning("suite: no controller for this backbone (pass --controller DIR); FP "
                       "methods are skipped")
    return controller


def launcher(command: str | None) -> list[str]:
    """How each lm_eval run starts: this Python, or e.g. ``accelerate launch --multi_gpu
    --num_processes 8`` (HFLM then splits the requests over the GPUs, one backbone per GPU).
    Its program is taken as PATH finds it, else beside this Python (``torchrun`` and
    ``accelerate`` of a virtual environment that is not activated: once a traceback of
    FileNotFoundError for each run), else refused in one line naming both places."""
    import shutil

    try:
        words = shlex.split(command or "")
    except ValueError as error:
        raise PonderError(f"--launcher {command!r}: {error}") from None
    if not words:
        return [sys.executable]
    name = words[0]
    if os.sep not in name and not shutil.which(name):
        beside = Path(sys.executable).parent / name
        if not (beside.is_file() and os.access(beside, os.X_OK)):
            raise PonderError(f"--launcher: {name!r} is neither on PATH nor beside this Python "
                              f"({beside.parent}); install it in this environment or give its "
                              "full path")
        name = str(beside)
    return [name, *words[1:]]


def run_locked(options: argparse.Namespace, runs: list[Run], out: Path, backbone: str,
               env: dict[str, str]) -> None:
    """``run_all`` with every run still to do locked for its length (``lock_runs``: a second
    suite on the same runs is refused), unless ``--force``; the logs of runs finished before
    compact logs existed are compacted first."""
    argv = list(getattr(options, "argv", None) or [])
    if out.is_dir():
        compact_tree(out)  # runs finished before compact logs existed
    todo = [run.folder(out) for run in runs if not run.finished(out)]
    if options.force:
        LOGGER.warning("suite: --force: no lock; another suite on %s may run the same runs", out)
        locks: list[HeldLock] = []
    else:
        locks = lock_runs(todo, argv)
    try:
        run_all(options, runs, out, backbone, env, argv)
    finally:
        for lock in locks:
            lock.release()


# model args the suite sets per method: --model_args must not override them
# (``--methods FP-Direct --model_args controller=none`` gave a row labelled FP-Direct that was
# Direct), each with the suite option that sets it
SUITE_MODEL_ARGS = {"controller": "--controller", "alpha": "--alpha", "steering": "--steering",
                    "pretrained": "--pretrained", "early_exit": "--exit_thresholds",
                    "exit_layers": "--exit_layers"}


def check_model_args(model_args: str | None) -> None:
    """Refuse ``--model_args`` keys that would change what a planned run is (its label)."""
    for item in (model_args or "").split(","):
        key = item.partition("=")[0].strip()
        if key in SUITE_MODEL_ARGS:
            raise PonderError(
                f"--model_args {key}=...: the suite sets {key} for each method (it is what "
                f"makes a row what its label says); use {SUITE_MODEL_ARGS[key]} instead")


def check_finished(options: argparse.Namespace, runs: list[Run], out: Path) -> None:
    """A finished run whose recorded settings differ from what is asked now (``--limit``,
    ``--max_gen_toks``) is refused before any work, naming both (the suite said
    "done, skipped" and reported the old run as the new one)."""
    asked_limit = float(options.limit) if options.limit else None
    for run in runs:
        if not run.finished(out):
            continue
        newest = max(run.folder(out).rglob("results_*.json"), key=lambda p: p.name)
        try:
            config = json.loads(newest.read_text()).get("config") or {}
        except (OSError, ValueError):
            continue  # the report names a damaged results file
        limit = float(config["limit"]) if config.get("limit") else None
        tokens = (config.get("gen_kwargs") or {}).get("max_gen_toks")
        differs = []
        if limit != asked_limit:
            differs.append(f"--limit {limit or 'none'} (asked {asked_limit or 'none'})")
        if tokens is not None and int(tokens) != int(options.max_gen_toks):
            differs.append(f"--max_gen_toks {tokens} (asked {options.max_gen_toks})")
        if differs:
            raise PonderError(
                f"{run.folder(out)} holds a finished {run.label} run made with "
                f"{', '.join(differs)}: pass the settings it was made with, another --output, "
                "or delete that folder to run it again")


def run_all(options: argparse.Namespace, runs: list[Run], out: Path, backbone: str,
            env: dict[str, str], argv: list[str]) -> None:
    """Each planned run that has no results yet, in order (``run_one``); Ctrl-C becomes
    ``Interrupted``, naming the run it stopped and the command that resumes the suite."""
    for i, run in enumerate(runs, 1):
        target = run.folder(out)
        if run.finished(out):
            LOGGER.info("[%d/%d] %s %s: done, skipped", i, len(runs), run.label, run.dataset)
            continue
        try:
            run_one(options, i, len(runs), run, target, backbone, env)
        except KeyboardInterrupt:
            raise interrupted_in(i, len(runs), run, target, options.resume_within, argv) from None


def run_one(options: argparse.Namespace, i: int, n: int, run: Run, target: Path, backbone: str,
            env: dict[str, str]) -> None:
    """One lm_eval run into ``target``, clocked, then its summary and compact log."""
    target.mkdir(parents=True, exist_ok=True)
    model_args = run.model_args + (f",pretrained={options.pretrained}" if options.pretrained else "")
    if options.steering and registry.method(run.method).steered:
        model_args += f",steering={options.steering}"
    if options.model_args:
        model_args += f",{options.model_args}"
    gen = f"max_gen_toks={options.max_gen_toks}," + DECODINGS[run.decoding]
    if registry.method(run.method).samples and run.decoding == "greedy":
        gen = f"max_gen_toks={options.max_gen_toks}"  # BoN samples by definition (task: T=0.7)
    cmd = [*launcher(options.launcher), "-m", "lm_eval", "--model", "ponder", "--model_args", model_args,
           "--tasks", run.task, *(["--apply_chat_template"] if options.chat_template else []),
           "--batch_size", str(options.batch_size), "--log_samples", "--output_path", str(target),
           "--gen_kwargs", gen, "--seed", str(run.seed)]
    if options.limit:
        cmd += ["--limit", str(options.limit)]
    if options.resume_within:  # answers are kept as rows end: a kill loses the rows in flight
        cmd += ["--use_cache", str(target / "answers")]
    LOGGER.info("[%d/%d] %s %s seed %d: %s", i, n, run.label, run.dataset, run.seed, " ".join(cmd[2:]))
    kept = 0
    if options.resume_within:
        for twin in sorted(target.glob("answers_rank*" + KEPT_SUFFIX)):
            if restored := restore_kept(twin.with_name(twin.name[:-len(KEPT_SUFFIX)] + ".db")):
                LOGGER.info("%s: %d kept answers restored from %s", run.label, restored, twin.name)
        kept = kept_answers(target / "answers_rank0.db")
    attempts = record_attempt(target, kept)
    start = time.time()
    # the kept answers' committable twin stays current, so a session cut off mid-run
    # leaves on disk all that a commit needs to carry the run to another machine
    on_beat = functools.partial(refresh_twins, target) \
        if options.resume_within and registry.publishable(run.dataset) else None
    returncode = run_clocked(cmd, target, attempts, env, on_beat)
    if returncode != 0:
        raise PonderError(f"lm_eval failed for {run.label} on {run.dataset} (exit "
                          f"{returncode}); fix the error above and re-run: finished "
                          "runs are kept")
    total, unclocked = attempts_ran_s(attempts)
    atomic_write_text(target / "ponder_run.json", json.dumps(
        {"method": run.label, "backbone": backbone, "decoding": run.decoding,
         "seed": run.seed, "protocol": options.protocol,
         "wall_s": round(time.time() - start, 1), "kept_answers": kept,
         "attempts": attempts, "ran_s_all_attempts": total,
         "unclocked_attempts": unclocked, "command": portable_record(cmd[1:]),
         "preload": env.get("LD_PRELOAD", ""),
         "malloc": allocator.malloc_settings(env)}, indent=1))
    compact_tree(target)
    for twin in target.glob("answers_rank*" + KEPT_SUFFIX):
        twin.unlink()  # the run's summary replaces its unfinished answers
    (target / ATTEMPTS).unlink(missing_ok=True)  # and its attempts, which it carries
