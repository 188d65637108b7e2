#!/usr/bin/env bash
# Issue 13's study for one form, end to end, on the embedded backbone in bf16: the headroom
# cache (600 train prompts: 400 arith + 200 GSM8K, every depth, 4 samples at T = 0.7), its
# headroom analysis, cross-fitted controllers (7 arms x 3 seeds x 5 folds), final controllers
# (7 arms x 3 seeds, every prompt), the fixed-alpha sweep on the 500 arith test documents
# through lm_eval, and the final controllers against that sweep.
# Every step resumes (in a fresh clone too: the build first restores the prompts and z_0 that
# git does not keep): the build keeps each finished batch, `adaptation.py train` skips finished
# runs, `testset.py sweep` skips finished depths and keeps answers within a depth. A stopped
# study is continued by running the same command. Commit results/ and docs/ as steps finish.
# Usage: LM_EVAL_PONDER_DATA=../shared/data bash studies/adaptation_study.sh ours|paper
#        (THREADS=2 when it has the machine to itself; TASKS=arith,gsm8k adds the GSM8K test
#        sweep, about 3 h of one thread per form)
# Wall times on a 2-core CPU: docs/results/adaptation.md, "What the study costs".
set -euo pipefail
form="${1:?usage: adaptation_study.sh ours|paper}"
threads="${THREADS:-1}"
tasks="${TASKS:-arith}"
arms="balanced,flops0,flops0.5,flops1,balanced-ent0.1,balanced-std,balanced-lr5e-5"
here="$(cd "$(dirname "$0")" && pwd)"
export OMP_NUM_THREADS="$threads"

python "$here/headroom.py" build --form "$form" --samples 4 --batch-size 256 --threads "$threads"
python "$here/headroom.py" analyse --form "$form" --samples 4 --out docs/headroom/bf16
python "$here/adaptation.py" train --form "$form" --samples 4 --arms "$arms" --seeds 0,1,2
python "$here/adaptation.py" analyse --form "$form" --samples 4 --out docs/adaptation/bf16/n600
python "$here/adaptation.py" train --form "$form" --samples 4 --arms "$arms" --seeds 0,1,2 --final
python "$here/testset.py" sweep --form "$form" --tasks "$tasks" --batch-size 64
final=$(ls -d results/adaptation/"$form"-s4/n600-* | head -n 1)
# the composition (a controller's answers are the sweep's at its depths) checked through lm_eval
# itself on 100 documents, with the arm whose deterministic depths spread on our form
python "$here/testset.py" verify --form "$form" --limit 100 --batch-size 64 \
    --controller "$final/balanced-lr5e-5/seed0/all/controller"
python "$here/testset.py" analyse --form "$form" --sweep "$final"
