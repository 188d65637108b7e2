#!/usr/bin/env bash
# Everything a GPU session should run, in one device call of at most ~9 minutes (issue 54; the
# parts of issue 36 stay selectable). Results go to $OUT.
#
#   bash .device/kit/run.sh --stash N bash benchmarks/gpu_session.sh       # on the device
#   DEVICE=cpu SMALL=1 OUT=/tmp/gs bash benchmarks/gpu_session.sh           # the same, small, here
#
# Default parts (PARTS picks others; each has its own time limit so a slow one cannot eat the
# rest, and what it printed before its limit is kept in $OUT/<part>.log):
#   gpu_check  the embedded model on the full arith ladder, --model ponder controller=none: the
#              8,000 useful tok/s target on the small model (T_CHECK, 180 s);
#   scale_7b   benchmarks/scale.py on a random Qwen2.5-7B built on the device, replayed GSM8K
#              lengths: the loop (max_rows at the default, 128 and 512) against --model hf's
#              path at batch 64 and 256, peak memory of each (T_SCALE, 180 s);
#   train_7b   benchmarks/train_cost.py on the same shape: one prompt-level rollout-cache block
#              (64 prompts x 9 depths) and one token-level GRPO step (P=8 x G=8) (T_TRAIN, 80 s);
#   scale_8b   a random Llama-3-8B built on the device: the loop at the default rows and cache
#              budget (no out-of-memory) and at 384 rows, against hf at 256 (T_8B, 70 s).
# Issue 36's part: step_cost (its graph-step parts went with the captured layout, 2026-12-04).
# Getting the checkout there: ../shared/gpu/bundle.py, then scripts/gpu_parts.sh.
set -u
D=${DEVICE:-cuda}; OUT=${OUT:?set OUT}; mkdir -p "$OUT"; t0=$(date +%s)
if [ -n "${SMALL:-}" ]; then
  CHECK="--limit 2 --skip ponder,hf-64,hf-256,sync-prompt,sync-token,train-prompt,train-token"
  BIG="--shape tiny"; EIGHT="--shape tiny"
  SCALE="--questions 6 --max-new-tokens 8 --pairs 1 --hf-batches 2 6 --loop-rows 3"
  TRAIN="--prompts 2 --token-prompts 2 --generations 2 --max-new-tokens 8"
  SCALE8="--questions 6 --max-new-tokens 8 --pairs 1 --hf-batches 6 --loop-rows 3"
  STEP="--models tiny --rows 16 --pairs 1 --max-new-tokens 8"
else
  CHECK="--skip ponder,hf-64,hf-256,sync-prompt,sync-token,train-prompt,train-token"
  BIG="--shape qwen2.5-7b"; EIGHT="--shape llama-3-8b"
  SCALE="--questions 512 --max-new-tokens 500 --pairs 1 --hf-batches 64 256 --loop-rows 128 512"
  TRAIN=""
  SCALE8="--questions 384 --max-new-tokens 500 --pairs 1 --hf-batches 256 --loop-rows 384"
  STEP="--models tiny embedded --rows 16 256 --pairs 2 --max-new-tokens 64"
fi
part() {  # name limit command...
  local name=$1 limit=$2; shift 2
  case " ${PARTS:-gpu_check scale_7b train_7b scale_8b} " in *" $name "*) ;; *) return 0 ;; esac
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  echo "== $name: rc $? at $(( $(date +%s) - t0 )) s"
  grep -v -E "it/s\]|s/it\]|Warning|warn\(" "$OUT/$name.log" | tail -"${TAIL:-14}"
}
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
part gpu_check "${T_CHECK:-180}" python3 benchmarks/gpu_check.py --device "$D" $CHECK --out "$OUT"
part scale_7b "${T_SCALE:-180}" python3 benchmarks/scale.py --device "$D" $BIG --lengths gsm8k \
  $SCALE --out "$OUT/scale_7b.json"
part train_7b "${T_TRAIN:-80}" python3 benchmarks/train_cost.py --device "$D" $BIG --lengths gsm8k \
  $TRAIN --out "$OUT/train_7b.json"
part scale_8b "${T_8B:-70}" python3 benchmarks/scale.py --device "$D" $EIGHT --lengths gsm8k \
  $SCALE8 --out "$OUT/scale_8b.json"
part step_cost "${T_STEP:-90}" python3 benchmarks/step_cost.py --device "$D" $STEP
