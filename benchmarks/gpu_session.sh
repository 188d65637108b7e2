#!/usr/bin/env bash
# Everything a GPU session should run, in one device call of at most ~9 minutes (issue 36):
# the acceptance check, the captured decode step alone (against eager, per step), then the open
# question of the static layout end to end (captured graphs, the tail moved to fewer slots or
# not). Results go to $OUT.
#
#   bash .device/kit/run.sh --stash N bash benchmarks/gpu_session.sh       # on the device
#   DEVICE=cpu SMALL=1 OUT=/tmp/gs bash benchmarks/gpu_session.sh           # the same, small, here
#
# Each part has its own time limit (env T_CHECK, T_REPLAY, T_STATIC, T_STEP, in seconds) so that
# a slow one cannot eat the others; what a part printed before its limit is kept in
# $OUT/<part>.log. PARTS (default "gpu_check replay_step static_step") picks parts; step_cost
# (the per-step split of the dynamic and the captured step; the dynamic one was measured on an
# H100 in the fifth session) is left out by default so that the call, with run.sh's first
# install, stays under the device's 600 s per command: a second call on the warm machine,
# `PARTS=step_cost bash .device/kit/run.sh bash benchmarks/gpu_session.sh`, runs it.
# Getting the checkout there: ../shared/gpu/bundle.py, then scripts/gpu_parts.sh.
set -u
D=${DEVICE:-cuda}; OUT=${OUT:?set OUT}; mkdir -p "$OUT"; t0=$(date +%s)
if [ -n "${SMALL:-}" ]; then
  CHECK="--limit 2 --skip train-prompt,train-token,hf-64"
  STATIC="--prompts 6 --max-rows 3 --max-new-tokens 6 --pairs 1 --modes captured captured-flat"
  STEP="--models tiny --rows 16 --pairs 1 --max-new-tokens 8 --decode-steps dynamic captured"
  REPLAY="--rows 4 --pairs 1 --steps 2 --cache-len 24 --check-steps 2"
else
  CHECK="--skip hf-64 --budget-s 255"
  STATIC="--prompts 512 --max-rows 256 --max-new-tokens 500 --pairs 1 --modes captured captured-flat"
  STEP="--models tiny embedded --rows 16 256 --pairs 2 --max-new-tokens 64 --decode-steps dynamic captured"
  REPLAY="--model embedded --rows 64 256 --pairs 2 --check-steps 0"
fi
part() {  # name limit command...
  local name=$1 limit=$2; shift 2
  case " ${PARTS:-gpu_check replay_step static_step} " in *" $name "*) ;; *) return 0 ;; esac
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  echo "== $name: rc $? at $(( $(date +%s) - t0 )) s"
  grep -v -E "it/s\]|s/it\]|Warning|warn\(" "$OUT/$name.log" | tail -"${TAIL:-14}"
}
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
part gpu_check "${T_CHECK:-270}" python3 benchmarks/gpu_check.py --device "$D" $CHECK --out "$OUT"
part replay_step "${T_REPLAY:-60}" python3 benchmarks/compile_step.py --device "$D" $REPLAY
part static_step "${T_STATIC:-190}" \
  python3 benchmarks/static_step.py --device "$D" $STATIC
part step_cost "${T_STEP:-90}" python3 benchmarks/step_cost.py --device "$D" $STEP
