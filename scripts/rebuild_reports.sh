#!/usr/bin/env bash
# Rebuild every published leaderboard and report figure from the committed compact logs under
# results/suite (no generation: seconds per report). Each line is the command behind one
# published artefact; docs/results/ links each table to its line here.
#   bash scripts/rebuild_reports.sh            # all of them
#   ONLY=gsm8k bash scripts/rebuild_reports.sh # the ones whose name contains "gsm8k"
set -euo pipefail
cd "$(dirname "$0")/.."
py="${PYTHON:-python}"
"$py" scripts/records.py unpack  # the committed records (results/*.tar.xz)
s=results/suite
seven="{Direct,CoT,BoN,FR,FP-Direct,FP-CoT,FP-BoN}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

report() {  # name, output, runs...
  local name="$1" out="$2"
  shift 2
  if [[ -n "${ONLY:-}" && "$name" != *"$ONLY"* ]]; then return; fi
  echo "== $name -> $out"
  # shellcheck disable=SC2068  # the run patterns are globbed on purpose
  "$py" -m lm_eval_ponder.report $@ --output "$out" --link-figures >/dev/null
}

figure() {  # a report's figure copied under docs/figures: source, target
  if [[ -f "$1" ]]; then cp "$1" "$2"; fi
}

# Table 1, greedy (our documented protocol): one page per dataset and all four together
for t in arith gsm8k math500 gpqa; do
  report "greedy-$t" "docs/leaderboard/$t" $(eval echo "$s/greedy/$seven/$t")
done
report greedy-full docs/leaderboard/full $(eval echo "$s/greedy/$seven/'*'")
# four decodings on the arith ladder (seed 0 of each)
report decoding-arith docs/leaderboard/arith-decoding \
  $(eval echo "$s/{greedy,t0.7,top_p0.95,top_k40}/{Direct,CoT,FR,FP-Direct}/arith")
# Table 1 under the paper's protocol (T = 0.7, seeds 0-2; Best-of-5 and FP-BoN one seed)
report paper-arith "$tmp/paper" "$s/t0.7" "$s/t0.7-seed1" "$s/t0.7-seed2" \
  "$s/greedy/BoN/arith" "$s/greedy/FP-BoN/arith"
figure "$tmp/paper/pareto_arith_t0.7.png" docs/figures/paper_pareto_arith_t0.7.png
figure "$tmp/paper/savings_by_level_arith_t0.7.png" docs/figures/paper_savings_by_level_arith_t0.7.png
figure "$tmp/paper/relative_to_cot_arith_t0.7.png" docs/figures/paper_relative_to_cot_arith_t0.7.png
# Table 1's rows for the paper's form (issue 52 item 2, studies/paper_form_rows.sh): its own
# trained controller beside the unsteered rows and our form's, arith at T = 0.7 (seeds 0-2)
# and GSM8K greedy; the two forms' FP rows are told apart by their identity (alpha_start)
p=results/suite-paper-form
four="{Direct,CoT,FP-Direct,FP-CoT}"
report paper-form-arith docs/leaderboard/paper-form-arith \
  $(eval echo "$s/{t0.7,t0.7-seed1,t0.7-seed2}/$four/arith") \
  $(eval echo "$p/{t0.7,t0.7-seed1,t0.7-seed2}/{FP-Direct,FP-CoT}/arith")
report paper-form-gsm8k docs/leaderboard/paper-form-gsm8k \
  $(eval echo "$s/greedy/$four/gsm8k") $(eval echo "$p/greedy/{FP-Direct,FP-CoT}/gsm8k")
# early exit against Direct, FR and FP-Direct (greedy, four thresholds)
for t in arith gsm8k; do
  report "early-exit-$t" "$tmp/ee-$t" $(eval echo "$s/greedy/{Direct,FR,FP-Direct}/$t") \
    "$s"/greedy/EE_*/"$t"
  figure "$tmp/ee-$t/pareto_$t.png" "docs/figures/early_exit_${t/arith/arith500}.png"
done
# the model organism (issue 64, a constructed positive control): Table 1, greedy, and the
# paper's protocol's Pareto figure (T = 0.7, seeds 0-2)
o=results/organism/steerable
report organism docs/leaderboard/organism "$o"/table/greedy/*/arith "$o"/table-*/greedy/*/arith
report organism-t0.7 "$tmp/organism-t0.7" "$o"/table/t0.7*/*/arith "$o"/table-*/t0.7*/*/arith
figure "$tmp/organism-t0.7/pareto_arith_t0.7.png" docs/figures/organism_pareto_arith_t0.7.png
# the answer-truncation reading of tau (issue 65): against Direct and fixed steering
for d in greedy t0.7; do
  for t in arith gsm8k; do
    base=()  # the suite's Direct, FR and FP-Direct runs that exist (no FR of GSM8K at T = 0.7)
    for m in Direct FR FP-Direct; do [ -d "$s/$d/$m/$t" ] && base+=("$s/$d/$m/$t"); done
    report "answer-truncation-$d-$t" "$tmp/at-$d-$t" "${base[@]}" \
        results/answer-truncation/"$d"/AT_p*/"$t"
    if [ "$d" = greedy ]; then pareto="pareto_$t.png"; else pareto="pareto_${t}_$d.png"; fi
    figure "$tmp/at-$d-$t/$pareto" "docs/figures/answer_truncation_${t}_$d.png"
  done
done
