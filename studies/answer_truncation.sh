#!/usr/bin/env bash
# Issue 65, item 4: the answer-truncation reading of the paper's tau ("halts generation when the
# predicted next-token probability falls below 0.2") as a method of its own. An answer stops at
# its first generated position whose top next-token probability under the backbone is below tau
# (model arg min_top_prob; the forward that found it is priced, its token not kept). On the
# Direct prompt with controller=none, so it is compared with Direct and fixed steering on the
# very runs the suite kept (results/suite/<decoding>/{Direct,FR,FP-Direct}/<dataset>): the same
# command shape (chat template, 500 new tokens, seed 0), one folder per tau. Resumable: a run
# with a results file is skipped, and --use_cache keeps every answer as its row ends.
# Usage: LM_EVAL_PONDER_DATA=../shared/data bash studies/answer_truncation.sh
#        [TAUS="0.1 0.2 0.3"] [DATASETS="arith gsm8k"] [DECODINGS="greedy t0.7"] [OUT=...]
set -euo pipefail
out="${OUT:-results/answer-truncation}"
py="${PYTHON:-python}"
# the runs kept so far (results/<study>.tar.xz); afterwards `python scripts/records.py pack "$out"`
# rewrites the archive to commit
"$py" "$(dirname "$0")/../scripts/records.py" unpack "$out"
for decoding in ${DECODINGS:-greedy t0.7}; do
  case "$decoding" in
    greedy) gen="max_gen_toks=500,do_sample=False" ;;
    t0.7) gen="max_gen_toks=500,do_sample=True,temperature=0.7" ;;
    *) echo "unknown decoding $decoding (greedy or t0.7)" >&2; exit 2 ;;
  esac
  for dataset in ${DATASETS:-arith gsm8k}; do
    for tau in ${TAUS:-0.1 0.2 0.3}; do
      run="$out/$decoding/AT_p$tau/$dataset"
      ls "$run"/*/results_*.json >/dev/null 2>&1 && continue
      mkdir -p "$run"
      limit=()  # GSM8K: the first GSM8K_LIMIT questions (tau = 0.1 stops few answers, so a
      # run costs nearly Direct's 47 min on one core; the report pairs them with Direct's)
      [ "$dataset" = gsm8k ] && limit=(--limit "${GSM8K_LIMIT:-200}")
      "$py" -m lm_eval --model ponder --model_args "controller=none,min_top_prob=$tau" \
          --tasks "${dataset}_ponder" --apply_chat_template --batch_size 32 --log_samples \
          "${limit[@]}" \
          --output_path "$run" --gen_kwargs "$gen" --seed 0 --use_cache "$run/answers"
      "$py" -c "import sys; from pathlib import Path; from lm_eval_ponder.reporting.compact import compact_tree; compact_tree(Path(sys.argv[1]))" "$run"
      rm -f "$run"/answers*
      # the marker the report reads a run's label and decoding from, as the suite writes it
      suffix=""; [ "$decoding" = greedy ] || suffix=" [$decoding]"
      printf '{"method": "Direct (answer stop p<%s)%s", "backbone": "smollm2-135m-instruct", "decoding": "%s", "seed": 0}\n' \
          "$tau" "$suffix" "$decoding" > "$run/ponder_run.json"
    done
  done
done
# the reports and their Pareto figures (docs/figures/answer_truncation_*), as the docs rebuild them
ONLY=answer-truncation PYTHON="$py" bash "$(dirname "$0")/../scripts/rebuild_reports.sh"
