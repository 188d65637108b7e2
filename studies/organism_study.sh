#!/usr/bin/env bash
# Issue 64 end to end on the model organism (studies/organism.py), with the project's own
# commands, as a user with a new backbone would run them. Resumable: every step is skipped when
# its output exists, and the lm_eval runs go through the suite (--resume_within), so running the
# same command again continues where it stopped. Steps (STEPS="1 2 ..." runs a subset):
#   1  build the organism (prices itself first)
#   2  steer extract on arith train questions
#   3  the layer sweep on the arith train split (fixed +-A per layer against controller=none)
#   4  the alpha sweep on the arith train split (Direct and CoT prompts): FR's alpha
#   5  Table 1's Direct and CoT on the arith test split (greedy), the organism's acceptance,
#      and the same two on 250 train questions (how much of the fine-tune was memorised)
#   5b FR at the alpha step 4 chose
#   6  rollout caches and GRPO: {ours, paper} form x {shipped, written} recipe
#   7  FP-Direct and FP-CoT with each controller (greedy)
#   8  the fixed-depth sweeps of both forms on the test split (the verdict's comparators)
#   9  the verdict and the page's records (python studies/organism.py verdict)
#   10 the paper's protocol: T = 0.7, seeds 0-2, for 5 and 7
# Usage: LM_EVAL_PONDER_DATA=../shared/data [OUT=results/organism] [BUILD_ARGS=...] \
#        bash studies/organism_study.sh
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${OUT:-results/organism}"
steps=" ${STEPS:-1 2 3 4 5 5b 6 7 8 9} "
py="${PYTHON:-python}"
# the runs kept so far (results/<study>.tar.xz); afterwards `python scripts/records.py pack "$out"`
# rewrites the archive to commit
"$py" "$(dirname "$0")/../scripts/records.py" unpack "$out"
want() { [[ "$steps" == *" $1 "* ]]; }
mkdir -p "$out"

# BUILD_ARGS: the recipe (empty: v1); the steerable organism's is
#   --plant results/organism/steering-base --freeze-below 16 --questions-from 100 --per-level 200 --epochs 1
# shellcheck disable=SC2086
want 1 && "$py" "$here/organism.py" build ${BUILD_ARGS:-}
org="$("$py" "$here/organism.py" path)"
vec="$out/steering"
layer="${LAYER:-15}"

if want 2 && [ ! -f "$vec/steering.json" ]; then
  "$py" -m lm_eval_ponder.steer extract --pretrained "$org" --dataset arith --n-questions 256 \
      --layer "$layer" --output "$vec"
fi

if want 3 && [ ! -f "$out/selection/layer_sweep.json" ]; then
  "$py" "$here/layer_sweep.py" --split train --pretrained "$org" --steering "$vec" \
      --alpha "${LAYER_ALPHA:-0.2}" --limit 50 --out "$out/selection/layer_sweep.json"
fi

train_run() {  # DIR TASK LIMIT MODEL_ARGS: one lm_eval run on the train split, kept compact
  ls "$1"/*/results_*.json >/dev/null 2>&1 && return 0
  "$py" -m lm_eval --model ponder --model_args "pretrained=$org,$4" --tasks "$2" \
      --apply_chat_template --limit "$3" --log_samples --output_path "$1" \
      --metadata '{"ponder_split": "train"}'
  "$py" -c "import sys; from pathlib import Path; from lm_eval_ponder.reporting.compact import compact_tree; compact_tree(Path(sys.argv[1]))" "$1"
}
if want 4; then  # FR's fixed alpha, chosen on the first 100 arith train documents
  for a in ${ALPHAS:--0.4 -0.2 -0.1 0 0.1 0.2 0.4}; do
    for task in arith_ponder arith_ponder_cot; do
      train_run "$out/selection/alpha/$task/alpha_$a" "$task" 100 "steering=$vec,alpha=$a"
    done
  done
  "$py" "$here/organism.py" choose-alpha --root "$out/selection/alpha" --out "$out/selection/alpha.json"
fi
alpha=""
if want 5b || want 10; then  # FR's alpha is step 4's choice: no silent default
  if [ ! -f "$out/selection/alpha.json" ]; then
    echo "organism_study.sh: $out/selection/alpha.json is missing; run step 4 first" >&2; exit 2
  fi
  alpha="$("$py" -c "import json,sys; print(json.load(open(sys.argv[1]))['chosen']['alpha'])" \
      "$out/selection/alpha.json")"
fi

suite() {  # the suite on the organism's test split, one configuration
  "$py" -m lm_eval_ponder.suite --pretrained "$org" --steering "$vec" --tasks arith \
      --resume_within --no_report "$@"
}
if want 5; then
  suite --output "$out/table" --methods Direct,CoT --controller none
  for task in arith_ponder arith_ponder_cot; do  # memorised? the same rows on train questions
    train_run "$out/train-probe/$task" "$task" 250 "controller=none"
  done
  # the train-split runs also choose each level's mode for the paper-unit checks (v3)
  "$py" "$here/organism.py" accept --runs "$out/table" --organism "$org" --out "$out/accept.json" \
      --train "$out/train-probe"
fi
if want 5b; then
  suite --output "$out/table" --methods FR --alpha "$alpha" --controller none
fi

forms="ours:-0.2 paper:0.0"
recipes="${RECIPES:-shipped written}"  # "default" adds the trainer's new default (issue 75)
recipe_args() {  # "shipped": the GRPO recipe shipped until 2026-12 (issue 75 changed the default)
  case "$1" in
    shipped) echo "--recipe grpo-2026-12" ;;
    written) echo "--recipe paper" ;;
    default) echo "--recipe default" ;;
  esac
}
if want 6; then
  for fa in $forms; do
    form="${fa%%:*}"; start="${fa#*:}"
    for recipe in $recipes; do
      run="$out/controllers/$form-$recipe"
      [ -f "$run/controller.safetensors" ] && continue
      # shellcheck disable=SC2046
      "$py" -m lm_eval_ponder.train --output "$run" --pretrained "$org" --steering "$vec" \
          --ponder.alpha_start "$start" --cache_dir "$out/rollouts/$form" \
          --rollout.prompts '{"arith_ponder": 200, "arith_ponder_cot": 200}' \
          $(recipe_args "$recipe")
    done
  done
fi

if want 7; then
  for fa in $forms; do
    form="${fa%%:*}"
    for recipe in $recipes; do
      suite --output "$out/table-$form-$recipe" --methods FP-Direct,FP-CoT \
          --controller "$out/controllers/$form-$recipe"
    done
  done
fi

if want 8; then  # each form on the prompt it ponders from: paper from Direct, ours from CoT
  for ft in ${SWEEPS:-paper:arith_ponder ours:arith_ponder_cot}; do
    "$py" "$here/organism.py" sweep --form "${ft%%:*}" --tasks "${ft#*:}" --root "$out/sweep" \
        --pretrained "$org" --steering "$vec"
  done
fi

if want 9; then
  "$py" "$here/organism.py" verdict --root "$out" --out "$out/verdict"
fi

if want 10; then
  suite --output "$out/table" --methods Direct,CoT,FR --alpha "$alpha" --controller none \
      --protocol paper
  for fa in $forms; do
    form="${fa%%:*}"
    for recipe in $recipes; do
      suite --output "$out/table-$form-$recipe" --methods FP-Direct,FP-CoT \
          --controller "$out/controllers/$form-$recipe" --protocol paper
    done
  done
fi

# the organism's runs keep no texts: labels, metrics and answer digests are all its readers
# (accept, sweep, verdict, the report) need, and 150 runs of prompts were a fifth of the tree
"$py" -c "import sys; from pathlib import Path; from lm_eval_ponder.reporting.compact import drop_text_tree; drop_text_tree(Path(sys.argv[1]))" "$out"
