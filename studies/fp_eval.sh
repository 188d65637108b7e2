#!/usr/bin/env bash
# Issue 4's comparison row: FP-Direct with the shipped controller (the default of --model ponder
# on the embedded backbone), on the same subsets and settings as studies/baselines.sh and
# studies/alpha_sweep.sh (arith --limit 100 = 20 per level, the first 50 GSM8K test
# questions, 256 new tokens, batch 32, chat template), then one report over all of them.
# Usage: LM_EVAL_PONDER_DATA=../shared/data bash studies/fp_eval.sh
set -euo pipefail
out="${OUT:-results/fp}"
common=(--model ponder --apply_chat_template --batch_size "${BATCH:-32}" --log_samples
        --output_path "$out" --gen_kwargs "max_gen_toks=${MAX_TOKS:-256}")
/usr/bin/time -f "arith wall %e s" lm_eval "${common[@]}" --limit "${ARITH_LIMIT:-100}" --tasks arith_ponder
/usr/bin/time -f "gsm8k wall %e s" lm_eval "${common[@]}" --limit "${GSM8K_LIMIT:-50}" --tasks gsm8k_ponder
echo '{"method": "FP-Direct"}' > "$out/ponder_run.json"
python -m lm_eval_ponder.report "$out" results/baselines results/alpha_sweep --output results/report
