#!/usr/bin/env bash
# Issue 12's full leaderboard on the embedded backbone, one dataset at a time so that each
# finishes whole (table, decoding verdicts, figures) before the next starts: the seven methods
# on the arith ladder, the decoding comparison there (Direct, CoT, FR, FP-Direct at t0.7,
# top_p0.95, top_k40), then the seven methods on GSM8K, MATH500 and GPQA Diamond.
# Resumable at every level: finished runs are skipped, and --resume_within keeps the answers of
# a run (sampled ones too: evaluation.resume) after each batch of 512 requests.
# 23.1 h of one shared core of a 2-core CPU in all (docs/results/leaderboard.md, "What it took").
# Commit results/suite.tar.xz as runs finish (`python scripts/records.py pack results/suite` keeps
# only what may be published); an unfinished run's answers_rank0.kept.jsonl.gz (refreshed every minute; never GPQA's) carries it
# to the next machine, where --resume_within restores it.
# On 2 cores, two suites side by side on one thread each with disjoint --methods finish sooner
# than one on two threads (about 1.2 against 1.4 s per answer, measured on rollout builds), e.g.
#   OMP_NUM_THREADS=1 python -m lm_eval_ponder.suite ... --tasks gsm8k --methods BoN &
#   OMP_NUM_THREADS=1 python -m lm_eval_ponder.suite ... --tasks gsm8k --methods FP-BoN &
# Usage: LM_EVAL_PONDER_DATA=../shared/data bash studies/leaderboard.sh [extra suite args]
set -euo pipefail
out="${OUT:-results/suite}"
# the runs kept so far (results/<study>.tar.xz); afterwards `python scripts/records.py pack "$out"`
# rewrites the archive to commit
python "$(dirname "$0")/../scripts/records.py" unpack "$out"
suite=(python -m lm_eval_ponder.suite --output "$out" --no_report --resume_within "$@")
"${suite[@]}" --tasks arith
"${suite[@]}" --tasks arith --methods Direct,CoT,FR,FP-Direct --decoding t0.7,top_p0.95,top_k40
for task in gsm8k math500 gpqa; do
  "${suite[@]}" --tasks "$task"
done
python -m lm_eval_ponder.report "$out" --output "$out/report"
