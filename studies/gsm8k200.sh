#!/usr/bin/env bash
# Issue 4's comparison extended to the first 200 GSM8K test questions: runs questions 50..199 for
# Direct, CoT, BoN-5 (controller=none), FR alpha=-0.2 and FP-Direct (shipped controller) with the
# same settings as studies/baselines.sh, alpha_sweep.sh and fp_eval.sh (chat template, batch 32,
# 256 new tokens); the report merges them by doc_id with those first-50 runs into 200 per method.
# lm-eval --samples keeps the test set's own doc_id in the samples files (checked below), and a
# run directory that already has results is skipped, so an interrupted script can be re-run.
# Usage: LM_EVAL_PONDER_DATA=../shared/data bash studies/gsm8k200.sh
set -euo pipefail
out="${OUT:-results/gsm8k200}"
first="${FIRST:-50}"; last="${LAST:-199}"
run() {  # run <dir> <model_args> <tasks> <marker-json>
  local dir="$out/$1"
  if ls "$dir"/*/results_*.json >/dev/null 2>&1; then echo "skip $dir (has results)"; else
  local samples; samples=$(python -c "import json,sys; print(json.dumps({t: list(range($first, $last + 1)) for t in sys.argv[1].split(',')}))" "$3")
  /usr/bin/time -f "$1 wall %e s" lm_eval --model ponder --model_args "$2" --apply_chat_template \
    --batch_size "${BATCH:-32}" --log_samples --output_path "$dir" \
    --gen_kwargs "max_gen_toks=${MAX_TOKS:-256}" --samples "$samples" --tasks "$3"; fi
  python - "$dir" "$first" "$last" <<'PY'
import json, pathlib, sys
d, lo, hi = pathlib.Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
for f in d.rglob("samples_*.jsonl"):
    ids = sorted(json.loads(line)["doc_id"] for line in f.open())
    assert ids == list(range(lo, hi + 1)), f"{f}: doc_ids are not {lo}..{hi}"
PY
  echo "$4" > "$dir/ponder_run.json"
}
run fp "controller=auto" gsm8k_ponder '{"method": "FP-Direct"}'
run fr "alpha=-0.2" gsm8k_ponder '{"method": "FR (alpha=-0.2)"}'
run base "controller=none" gsm8k_ponder,gsm8k_ponder_cot '{"method": "{base}"}'
run bon "controller=none" gsm8k_ponder_bon '{"method": "{base}"}'
python -m lm_eval_ponder.report "$out" results/baselines results/alpha_sweep/alpha_-0.2 results/fp \
  --output results/report_gsm8k200
