"""``python -m lm_eval_ponder.suite``: every method on every dataset through lm-eval, then the
report.

    python -m lm_eval_ponder.suite --output results/suite --limit 20
    python -m lm_eval_ponder.suite --pretrained Qwen/Qwen2.5-0.5B-Instruct --tasks gsm8k,math500 \
        --controller controllers/qwen --decoding greedy,t0.7 --output results/qwen

Each (decoding, method, dataset) is one ``lm_eval`` run in its own directory, written by the
real CLI (so the files are exactly what users get) with a ``ponder_run.json`` naming the method.
A run whose directory already holds results is skipped, so an interrupted suite continues
where it stopped (``--resume_within``: mid-dataset). Methods, protocols (``--protocol paper``:
every method at T = 0.7 over seeds 0, 1, 2), resuming, and what a repository keeps of a run:
docs/usage.md, "Suite and report".

This module is the command line; ``suite_plan`` says which runs there are and where they land,
``suite_run`` runs them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lm_eval_ponder import allocator, registry
from lm_eval_ponder.backbone import EMBEDDED_NAME
from lm_eval_ponder.errors import command, program_name, run_program
from lm_eval_ponder.files import check_output
from lm_eval_ponder.portable import cwd_relative
from lm_eval_ponder.reporting.suite_plan import (
    DECODINGS,
    EXIT_THRESHOLDS,
    EXTRA_METHODS,
    METHODS,
    checked_choices,
    parse_thresholds,
    plan,
    plan_text,
    portable_name,
)
from lm_eval_ponder.reporting.suite_run import (
    check_finished,
    check_model_args,
    launcher,
    run_locked,
    snapshot,
    suite_controller,
)
from lm_eval_ponder.resources import BUILTIN_TASKS_ENV


def run_suite(options: argparse.Namespace) -> Path:
    out = Path(options.output)
    methods, datasets, decodings, seeds = checked_choices(options)
    controller = suite_controller(options, methods)
    # the row label the report shows: a name, never a directory of this machine
    backbone = portable_name(options.pretrained) if options.pretrained else EMBEDDED_NAME
    controller = cwd_relative(controller) if controller else controller
    thresholds = parse_thresholds(options.exit_thresholds)
    runs = plan(methods, datasets, decodings, options.alpha, controller, seeds, thresholds,
                options.exit_layers)
    preload = allocator.resolve(options.allocator)
    # the runs name only our tasks: lm-eval's ~15,000 built-in ones need not be indexed
    env = {BUILTIN_TASKS_ENV: "0", **allocator.child_environment(preload)}
    if options.plan:
        print(plan_text(runs, out, options.pilot, options.limit, options.scale))
        return out
    if options.snapshot:
        print(snapshot(runs, out))
        return out
    launcher(options.launcher)  # a launcher that is nowhere: one line before any run
    check_model_args(options.model_args)
    check_finished(options, runs, out)
    check_output(out)  # before the first run, not when its results are saved
    run_locked(options, runs, out, backbone, env)
    if options.report:
        from lm_eval_ponder.reporting.report import report

        print(report([out], out / "report"))
    return out


def parser() -> argparse.ArgumentParser:
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
                        "full run), 'auto' (preload an installed tcmalloc on CPU: about 1.2x less "
                        "CPU time, but far more resident memory; lm_eval_ponder.allocator) or a "
                        "path to a shared library")
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
    return p


@command
def main(argv: list[str] | None = None) -> int:
    options = parser().parse_args(argv)
    options.argv = list(sys.argv[1:] if argv is None else argv)  # the command that resumes it
    run_suite(options)
    return 0


if __name__ == "__main__":
    run_program(main)
