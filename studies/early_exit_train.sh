#!/usr/bin/env bash
# Issue 65, item 6: the early-exit pilot again, on the arith *train* split. The thresholds and
# candidate layers of the published sweep (docs/results/early-exit.md) came from a pilot on the
# first 20 arith test questions; this runs the same kind of pilot on the first 20 training
# questions (4 per level), greedy, 500 new tokens, beside Direct: thresholds 0.9-0.9999 at the
# published layers 8:30:4, and two other layer sets at 0.999. Each run kept compact.
# Usage: LM_EVAL_PONDER_DATA=../shared/data bash studies/early_exit_train.sh [OUT=...]
set -euo pipefail
out="${OUT:-results/early-exit-train}"
py="${PYTHON:-python}"
# the runs kept so far (results/<study>.tar.xz); afterwards `python scripts/records.py pack "$out"`
# rewrites the archive to commit
"$py" "$(dirname "$0")/../scripts/records.py" unpack "$out"
run() {  # NAME MODEL_ARGS
  local dir="$out/$1"
  ls "$dir"/*/results_*.json >/dev/null 2>&1 && return 0
  "$py" -m lm_eval --model ponder --model_args "$2" --tasks arith_ponder --apply_chat_template \
      --limit "${LIMIT:-20}" --log_samples --output_path "$dir" \
      --gen_kwargs max_gen_toks=500,do_sample=False --metadata '{"ponder_split": "train"}'
  "$py" -c "import sys; from pathlib import Path; from lm_eval_ponder.reporting.compact import compact_tree; compact_tree(Path(sys.argv[1]))" "$dir"
}
run Direct "controller=none"
for p in 0.9 0.99 0.995 0.999 0.9999; do
  run "EE_p${p}_layers8-30-4" "controller=none,early_exit=$p,exit_layers=8:30:4"
done
run "EE_p0.999_layers1-30-1" "controller=none,early_exit=0.999"
run "EE_p0.999_layers16-30-2" "controller=none,early_exit=0.999,exit_layers=16:30:2"
"$py" studies/summarize.py "$out"/*
