#!/usr/bin/env bash
# Issue 3's fixed-alpha sweep (Fractional-Reasoning-style baseline): Direct prompts steered by
# alpha * (mean residual norm at the steering layer) * h, on arith (--limit 100: 20 per level)
# and the first 50 GSM8K test questions; alpha=0 is the Direct baseline (token-identical).
# SPLIT=train reads both datasets' training splits instead (issue 52: settings chosen without
# test data); alpha 0 is the unsteered baseline.
# Usage: LM_EVAL_PONDER_DATA=../shared/data [SPLIT=train] bash studies/alpha_sweep.sh [alpha ...]
set -euo pipefail
out="${OUT:-results/alpha_sweep}"
alphas=("$@"); [ ${#alphas[@]} -gt 0 ] || alphas=(-0.4 -0.2 -0.1 0.1 0.2)
meta="{\"ponder_split\": \"${SPLIT:-test}\"}"
for a in "${alphas[@]}"; do
  /usr/bin/time -f "alpha $a wall %e s" lm_eval --model ponder --model_args "alpha=$a" \
    --apply_chat_template --batch_size "${BATCH:-32}" --log_samples --output_path "$out/alpha_$a" \
    --gen_kwargs "max_gen_toks=${MAX_TOKS:-256}" --limit "${LIMIT:-100}" --tasks arith_ponder --metadata "$meta"
  /usr/bin/time -f "alpha $a gsm8k wall %e s" lm_eval --model ponder --model_args "alpha=$a" \
    --apply_chat_template --batch_size "${BATCH:-32}" --log_samples --output_path "$out/alpha_$a" \
    --gen_kwargs "max_gen_toks=${MAX_TOKS:-256}" --limit 50 --tasks gsm8k_ponder --metadata "$meta"
done
