#!/usr/bin/env bash
# Seconds per GRPO step of token-level training (online rollouts) on the embedded backbone, on a
# small step (P=2 prompts x G=4 answers, 64 new tokens, no held-out evaluation), to extrapolate
# the paper's configuration (P=8, G=8, 256-500 tokens, 2500 steps). The controller at
# initialisation ponders ~K_max steps at every token, so this is the expensive end.
# Usage: LM_EVAL_PONDER_DATA=../shared/data bash benchmarks/token_step_cost.sh
set -euo pipefail
out="${OUT:-results/token_cost}"
rm -rf "$out"
/usr/bin/time -f "token-level training wall %e s" python -m lm_eval_ponder.train --output "$out" \
  --ponder.granularity token --grpo.max_steps "${STEPS:-3}" --logging_steps 1 \
  --grpo.prompts_per_step 2 --grpo.num_generations 4 --rollout.max_completion_length "${MAX_TOKS:-64}" \
  --val_fraction 0
python - "$out" <<'PY'
import json, sys
logs = [json.loads(l) for l in open(f"{sys.argv[1]}/train_log.jsonl") if "alert" not in l]
times = [b["elapsed_s"] - a["elapsed_s"] for a, b in zip(logs, logs[1:])]
print("elapsed per step:", [l["elapsed_s"] for l in logs], "s/step after the first:", times)
print("mean GFLOPs per answer:", [round(l["flops_mean"] / 1e9, 2) for l in logs],
      "mean depth per token:", [round(l["depth_mean"], 2) for l in logs])
PY
