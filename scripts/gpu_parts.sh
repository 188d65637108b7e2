#!/usr/bin/env bash
# Make ../shared/gpu/bundle.py's transfers arrive while the device machine is still warm.
#
# Measured 2026-11-26 (H100 session): a transfer of a 36 MB part plus the 9.6 MiB tree took
# over 30 s to arrive, so the machine went cold between parts and part 1 was lost; parts of
# 9 MB with the tree slimmed to under 1 MiB arrived about 3 s apart, and 12 of them plus the
# machine's start cost about 75 s of device time.
#
#   python3 ../shared/gpu/bundle.py && bash scripts/gpu_parts.sh split 12
#   bash scripts/gpu_parts.sh slim      # move results/ docs/ controllers/ tests/ studies/ aside
#   ... the transfers: part K with carry [.device/parts/partK, .device/kit/stash.sh], command
#       `bash .device/kit/stash.sh K`, K = 1..N-1, back to back; the last with carry
#       [.device/parts/partN, .device/kit] and `bash .device/kit/run.sh --stash N CMD`
#   bash scripts/gpu_parts.sh restore   # put them back (git status must be clean after)
# The code travels as bundle.py's wheel (the shipped controller inside it); the command needs
# only benchmarks/ from the tree.
set -euo pipefail
cd "$(dirname "$0")/.."
aside=${GPU_PARTS_ASIDE:-/tmp/gpu_parts_aside}
case "${1:-}" in
  split)
    n=${2:-12}
    old=$(cat .device/kit/parts)
    for k in $(seq 1 "$old"); do cat ".device/parts/part$k"; done > .device/payload.tar
    rm -f .device/parts/part*
    split -n "$n" -d -a 3 .device/payload.tar .device/parts/piece
    for k in $(seq 1 "$n"); do mv ".device/parts/piece$(printf %03d $((k - 1)))" ".device/parts/part$k"; done
    for k in $(seq 1 "$n"); do cat ".device/parts/part$k"; done | cmp - .device/payload.tar
    rm .device/payload.tar
    echo "$n" > .device/kit/parts
    echo "$n parts of $(stat -c %s .device/parts/part1) bytes" ;;
  slim)
    mkdir -p "$aside"
    for d in results docs controllers tests studies; do [ -e "$d" ] && mv "$d" "$aside/"; done
    echo "moved aside to $aside: $(ls "$aside" | tr '\n' ' ')" ;;
  restore)
    for d in "$aside"/*; do mv "$d" .; done
    git status --short ;;
  *) echo "usage: gpu_parts.sh split [N] | slim | restore" >&2; exit 2 ;;
esac
