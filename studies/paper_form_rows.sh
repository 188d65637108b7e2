#!/usr/bin/env bash
# Issue 52 item 2: Table 1's rows for the paper's form (steering
# toward "think step by step" from alpha_start = 0) with its own trained controller, under the
# paper's protocol (every method sampled at T = 0.7, 500 new tokens, seeds 0, 1, 2) on arith
# and greedily on GSM8K (the leaderboard's decoding there).
#
# Its trained controller: the `balanced` arm (the shipped controller's reward and GRPO
# settings) trained once on every prompt of the paper form's 600-prompt S = 4 cache
# (`adaptation.py train --final`, seed 0), copied to controllers/ so that the rows name a
# committed controller. Every paper-form final controller trained so far halts at depth 0
# (offset 0, the unsteered model) on every arith test document (docs/results/testset.md), so
# expect rows labelled "(depth 0 on every question)" that draw Direct's and CoT's answers at
# a controller's extra cost; the run is what checks that (it did: docs/results/paper-protocol.md).
#
# Cost: the cache's z_0 in bf16 (27 min on one thread where bf16 is emulated, minutes where it
# is native), one controller (about a minute), then six T = 0.7 arith runs and two greedy
# GSM8K runs (the paper-protocol arith runs took 7-15 min each on 2 cores with native bf16).
# Run it where bf16 is native (the suite's other rows are bf16); on an AVX2-only CPU pass
# MODEL_ARGS=dtype=float32 and re-run Direct and CoT the same way, or the rows mix dtypes.
# Resumable: every step skips what is done.
#   bash studies/paper_form_rows.sh
set -euo pipefail
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
here="$(cd "$(dirname "$0")" && pwd)"
out=results/suite-paper-form  # where scripts/rebuild_reports.sh reads it
# the runs kept so far (results/<study>.tar.xz); afterwards `python scripts/records.py pack "$out"`
# rewrites the archive to commit
python "$(dirname "$0")/../scripts/records.py" unpack "$out"
ctrl=controllers/smollm2-135m-instruct-paper-form
sweep=$(ls -d results/adaptation/paper-s4/n600-* | head -n 1)
# The controller's weights (2.1 MiB) are kept in git history, not in the tree (the tree must
# travel: docs/design/repository.md); restore the committed ones, checked by their sha256
weights=1f73f90:controllers/smollm2-135m-instruct-paper-form/controller.safetensors
if [ ! -f "$ctrl/controller.safetensors" ] && git cat-file -e "$weights" 2>/dev/null; then
  git show "$weights" > "$ctrl/controller.safetensors"
  sha256sum "$ctrl/controller.safetensors" | grep -q '^4a9df0880aa464d8' \
    || { echo "restored $ctrl/controller.safetensors does not match sha256 4a9df0880aa464d8" >&2; exit 1; }
fi
if [ ! -f "$ctrl/controller.safetensors" ]; then  # no history (an archive): train it again
  python "$here/headroom.py" build --form paper --samples 4 --restore-only --threads 1
  python "$here/adaptation.py" train --form paper --samples 4 --arms balanced --seeds 0 --final --threads 1
  mkdir -p "$ctrl"
  cp "$sweep/balanced/seed0/all/controller/"* "$ctrl/"
fi
python -m lm_eval_ponder.suite --output "$out" --protocol paper --tasks arith \
    --methods FP-Direct,FP-CoT --controller "$ctrl" --resume_within --no_report \
    ${MODEL_ARGS:+--model_args "$MODEL_ARGS"}
python -m lm_eval_ponder.suite --output "$out" --protocol greedy --tasks gsm8k \
    --methods FP-Direct,FP-CoT --controller "$ctrl" --resume_within --no_report \
    ${MODEL_ARGS:+--model_args "$MODEL_ARGS"}
# beside the shipped form's rows: the report keys rows by configuration, so the two forms'
# FP rows stay apart (reporting.identity); docs/leaderboard/paper-form-{arith,gsm8k}
ONLY=paper-form bash "$here/../scripts/rebuild_reports.sh"
