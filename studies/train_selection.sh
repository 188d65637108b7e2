#!/usr/bin/env bash
# Issue 52, item 4: the steering layer and alpha_start chosen again, on the training splits
# only, by the procedures that first chose them on test documents (issues 3 and 5):
#   - studies/layer_sweep.py: offsets of -0.2 and +0.2 at five layers on the first 25 arith
#     training documents (a useful layer moves the length with the sign without wrecking
#     accuracy at -0.2);
#   - studies/alpha_sweep.sh: six alphas (0 = unsteered) on the first 100 arith training
#     documents (20 per level) and the first 50 GSM8K training questions, 256 new tokens
#     (alpha_start: the alpha that keeps accuracy within the interval at the fewest tokens).
# alpha0 and beta were never swept (they were set with alpha_start, for a ponder curve that
# reaches about the same offset range), so there is nothing to re-select for them.
# Writes $DOC (default docs/settings/train-split.md): both tables, from the runs under $OUT.
# Usage: LM_EVAL_PONDER_DATA=../shared/data PYTHONPATH=. bash studies/train_selection.sh
set -euo pipefail
out="${OUT:-results/selection-train}"; doc="${DOC:-docs/settings/train-split.md}"
# the runs kept so far (results/<study>.tar.xz); afterwards `python scripts/records.py pack "$out"`
# rewrites the archive to commit
python "$(dirname "$0")/../scripts/records.py" unpack "$out"
mkdir -p "$out" "$(dirname "$doc")"
# the record beside the page (issue 65: the runs behind the page are kept); its "unsteered" row is
# controller=none (before issue 65 it loaded the shipped controller: alpha = -0.2 at layer 15)
[ -s "$out/layer_sweep.md" ] || python studies/layer_sweep.py --split train \
    --out "$(dirname "$doc")/layer-sweep-train.json" > "$out/layer_sweep.tmp"
[ -s "$out/layer_sweep.md" ] || mv "$out/layer_sweep.tmp" "$out/layer_sweep.md"
for a in -0.4 -0.2 -0.1 0 0.1 0.2; do  # one alpha at a time, so a stopped run resumes
  [ -n "$(ls "$out/alpha/alpha_$a"/*/results_*.json 2>/dev/null | head -2 | sed -n 2p)" ] && continue
  rm -rf "$out/alpha/alpha_$a"
  SPLIT=train OUT="$out/alpha" bash studies/alpha_sweep.sh "$a"
done
{
  echo "# Settings chosen on the training splits (issue 52)"
  echo
  echo "Made by \`bash studies/train_selection.sh\` (the runs: \`$out\`, committed as results JSON"
  echo "and compact samples logs; the verdicts on the committed page are written by hand). The layer sweep:"
  echo
  python studies/layer_sweep.py --table "$(dirname "$doc")/layer-sweep-train.json"
  echo
  echo "(The verdict on the layer is written by hand below the table: see the committed page.)"
  echo
  echo "The alpha sweep (accuracy with its Wilson 95% interval, mean generated tokens):"
  echo
  echo '```'
  python studies/summarize.py "$out"/alpha/alpha_*
  echo '```'
} > "$doc"
echo "wrote $doc"
