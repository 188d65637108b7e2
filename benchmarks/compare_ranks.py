"""Do two lm-eval runs give the same per-sample results? The manual check that a multi-rank
``--model ponder`` evaluation equals a one-rank one (issue 11; it needs two GPUs: on a CPU,
HFLM gives every rank every document, so there is nothing to split or compare).

On a node with at least two GPUs, from the repository root:

    export LM_EVAL_PONDER_DATA=../shared/data
    ARGS="--model ponder --tasks arith_ponder --limit 40 --apply_chat_template --log_samples"
    python -m lm_eval $ARGS --output_path results/ranks/one
    accelerate launch --multi_gpu --num_processes 2 -m lm_eval $ARGS --output_path results/ranks/two
    python benchmarks/compare_ranks.py results/ranks/one results/ranks/two

Documents are matched by (task, doc_id); for each it compares the response, the grade, the
generated tokens, FLOPs and ponder steps. Prints the agreement and every difference; exits 1
on any difference or on a document that only one run has. Greedy decoding in the same dtype
is expected to agree exactly; batch composition differs between the runs, so a bf16 run may
differ on a few near-tie tokens (the printout says which).
"""

from __future__ import annotations

import sys
from pathlib import Path

from lm_eval_ponder.reporting.compact import read_samples

FIELDS = ("filtered_resps", "exact_match", "gen_tokens", "flops", "ponder_steps")


def load(root: Path) -> dict[tuple[str, int], dict]:
    out = {}
    files = sorted(root.rglob("samples_*.jsonl"))
    if not files:
        sys.exit(f"no samples_*.jsonl under {root} (was the run made with --log_samples?)")
    for path in files:
        task = path.name[len("samples_"):].rsplit("_", 1)[0]
        out.update({(task, int(s["doc_id"])): s for s in read_samples(path)})
    return out


def compare(a: dict, b: dict) -> tuple[int, list[str]]:
    """(number of documents that agree, a line per difference)."""
    problems = [f"{k}: only in the first run" for k in sorted(a.keys() - b.keys())]
    problems += [f"{k}: only in the second run" for k in sorted(b.keys() - a.keys())]
    same = 0
    for key in sorted(a.keys() & b.keys()):
        diff = [f for f in FIELDS if a[key].get(f) != b[key].get(f)]
        if diff:
            problems.append(f"{key}: differs in {', '.join(diff)}")
        else:
            same += 1
    return same, problems


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        sys.exit("usage: python benchmarks/compare_ranks.py RUN_DIR_ONE_RANK RUN_DIR_N_RANKS")
    a, b = load(Path(argv[0])), load(Path(argv[1]))
    same, problems = compare(a, b)
    for p in problems:
        print(p)
    print(f"{same} of {len(a.keys() | b.keys())} documents identical in {', '.join(FIELDS)}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
