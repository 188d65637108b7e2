#!/usr/bin/env bash
# Issue 38: the adaptation question again, with the controller trained as the paper trains it.
# Arms anneal{1,0} x gates{1,0} x {sgd, adam} (studies/adaptation.py PAPER_ARMS), 3 seeds,
# cross-fitted over 5 folds of the committed 600-prompt S = 4 caches of one form (no generation).
# Resumable: finished runs are read back from the sweep's pack and skipped; seeds go one at a
# time so that an interrupted sweep leaves whole seeds of every arm.
#   bash studies/paper_training.sh ours     # or paper
set -euo pipefail
form=${1:-ours}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
here="$(cd "$(dirname "$0")" && pwd)"
# the arms' names from adaptation.py itself (its folder on the path, as running it would put it)
arms=$(PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}" python -c "import adaptation; print(','.join(adaptation.PAPER_ARMS))")
for seed in ${SEEDS:-0 1 2}; do
  python "$here/adaptation.py" train --form "$form" --samples 4 --arms "$arms" --seeds "$seed" --threads 1
done
python "$here/adaptation.py" analyse --form "$form" --samples 4 --out docs/adaptation/paper-training \
    --arms "balanced,balanced-lr5e-5,$arms"
