"""Does ``suite --plan --scale`` predict a real run's wall time within 25%? (issue 54)

The estimate a user reads before a long suite is a start-up plus seconds per generated token,
both from ``benchmarks/scale.py`` (``--harness``), times the answer lengths of a finished suite
(the committed greedy runs of the embedded backbone). This script makes the three steps one
command and keeps what the comparison rests on, so the figure in docs/usage.md has an artefact:

1. ``scale.py --shape smollm2-135m --lengths arith --questions 256 --max-new-tokens 500
   --hf-batches --harness --harness-questions 128``: the cost per token on this machine
   (``--scale-questions`` changes the 256; ``--run`` prices a run already measured again,
   from another record, and runs nothing);
2. the estimate of the full arith Direct run (500 questions, 500 new tokens), from that cost and
   the lengths of ``--lengths-from`` (default: the committed ``results/suite``);
3. the run itself through ``python -m lm_eval_ponder.suite`` (nothing else should run beside it),
   then its measured wall against the estimate, and against the estimate priced at the run's own
   answer lengths (which separates the cost model's error from the lengths' drift: a bf16 run
   answers a little differently from the float32 runs the lengths came from).

Each step is skipped when its output exists (a finished run is never re-run), so an interrupted
check resumes. About 25-35 minutes on a 2-core CPU. The record (``--out``, JSON) names the
machine's CPU and its native dtype (``backbone.device_description``)::

    python benchmarks/estimate_check.py --tag cpu-amx
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path


def compare(scale: Path, lengths_from: Path, out: Path, tag: str) -> dict:
    """The estimate of the full arith Direct run (500 questions) at ``lengths_from``'s answer
    lengths and at the run's own, against the run under ``out`` as it was clocked."""
    from lm_eval_ponder.backbone import device_description, native_dtype
    from lm_eval_ponder.reporting.budget import ScaleCost, read_lengths
    from lm_eval_ponder.reporting.suite_plan import run_time

    cost = ScaleCost.read(scale)
    model = cost.model()

    def direct_arith(root: Path):
        return next(r for r in read_lengths(root) if (r.label, r.decoding, r.dataset)
                    == ("Direct", "greedy", "arith"))

    pilot, mine = direct_arith(lengths_from), direct_arith(out)
    measured, note = run_time(out / "greedy" / "Direct" / "arith")
    predicted = model.wall(500 * pilot.tokens / pilot.questions)
    at_own = model.wall(mine.tokens)
    return {
        "cpu": device_description("cpu"), "tag": tag, "dtype": native_dtype("cpu"),
        "scale_record": str(scale), "scale_questions": cost.questions, "run": str(out),
        "startup_s": model.startup_s, "s_per_token": model.s_per_token,
        "pilot_tokens_per_question": pilot.tokens / pilot.questions,
        "run_tokens_per_question": mine.tokens / mine.questions,
        "predicted_s": predicted, "predicted_at_run_lengths_s": at_own, "measured_s": measured,
        "measured_over_predicted": measured / predicted,
        "measured_over_predicted_at_run_lengths": measured / at_own,
        "within_25pct": abs(measured / predicted - 1) <= 0.25, "note": note,
    }


def run(argv: list[str]) -> None:
    print("+", " ".join(argv), flush=True)
    subprocess.run(argv, check=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tag", required=True, help="names this machine in the outputs, e.g. cpu-amx")
    p.add_argument("--lengths-from", default="results/suite",
                   help="a finished suite whose answer lengths the estimate uses")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: all)")
    p.add_argument("--scale-questions", type=int, default=256,
                   help="questions scale.py replays for the cost per token, which holds at the "
                        "rows in flight they make (fewer than the loop's 128 rows: too slow a "
                        "rate, and the plan warns)")
    p.add_argument("--run", default=None,
                   help="the measured run's suite folder (default results/estimate/TAG; give an "
                        "existing one to price it again from another record, run nothing)")
    a = p.parse_args()
    scale = Path(f"results/scale/smollm2-135m-{a.tag}-arith.json")
    out = Path(a.run or f"results/estimate/{a.tag}")
    record = Path(f"results/scale/estimate-check-{a.tag}.json")
    threads = [] if a.threads is None else ["--threads", str(a.threads)]
    if not scale.is_file():
        run([sys.executable, "benchmarks/scale.py", "--shape", "smollm2-135m", "--device", "cpu",
             "--lengths", "arith", "--questions", str(a.scale_questions), "--max-new-tokens", "500",
             "--hf-batches", "--harness", "--harness-questions", "128", *threads,
             "--out", str(scale)])
    suite = [sys.executable, "-m", "lm_eval_ponder.suite", "--output", str(out), "--tasks",
             "arith", "--methods", "Direct", "--controller", "none"]
    run([*suite, "--plan", "--pilot", a.lengths_from, "--scale", str(scale)])
    if not (out / "greedy" / "Direct" / "arith" / "ponder_run.json").is_file():
        run([*suite, "--resume_within", "--no_report"])

    result = compare(scale, Path(a.lengths_from), out, a.tag)
    record.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    print(f"measured_over_predicted {result['measured_over_predicted']:.3f}")


if __name__ == "__main__":
    main()
