#!/usr/bin/env bash
# Issue 2's baseline rows on the embedded backbone: Direct, CoT and Best-of-5 on the arith ladder
# and the first 50 GSM8K test questions, chat template, greedy (BoN: 5 samples at T=0.7).
# CPU budget: arith --limit 100 (documents are interleaved by level: 20 per level) and at most
# 256 new tokens instead of the paper's 500 (override with MAX_TOKS / ARITH_LIMIT).
# Usage: LM_EVAL_PONDER_DATA=../shared/data bash studies/baselines.sh
set -euo pipefail
out="${OUT:-results/baselines}"
common=(--model ponder --model_args controller=none --apply_chat_template --batch_size "${BATCH:-32}" --log_samples
        --output_path "$out" --gen_kwargs "max_gen_toks=${MAX_TOKS:-256}")
/usr/bin/time -f "arith wall %e s" lm_eval "${common[@]}" --limit "${ARITH_LIMIT:-100}" \
  --tasks arith_ponder,arith_ponder_cot,arith_ponder_bon
/usr/bin/time -f "gsm8k wall %e s" lm_eval "${common[@]}" --limit 50 \
  --tasks gsm8k_ponder,gsm8k_ponder_cot,gsm8k_ponder_bon
