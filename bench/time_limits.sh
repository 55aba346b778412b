#!/usr/bin/env bash
# How well `lipcert certify` keeps its time limit: for each bundled layer, set and limit,
# the wall-clock seconds of the whole run (process start to exit) against the limit, and
# whether it ended within max(10%, 1 s) of it (the promise of the CLI). Run it on a loaded
# machine too: `LIPCERT_LOAD=2 bash bench/time_limits.sh` starts that many busy loops
# beside it for the duration.
# Usage: bash bench/time_limits.sh [LIMITS]   (default "2 5 10"; needs build/lipcert)
set -euo pipefail
cd "$(dirname "$0")/.."
limits=${1:-"2 5 10"}
pids=()
for ((i = 0; i < ${LIPCERT_LOAD:-0}; i++)); do (while :; do :; done) & pids+=($!); done
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done' EXIT
printf '| layer | set | limit s | wall s | over by | within max(10%%, 1 s) |\n| --- | --- | --- | --- | --- | --- |\n'
for m in models/zoo/dot-layer0.safetensors models/zoo/l2-layer1.safetensors; do
  c=${m%.safetensors}-centres.safetensors:x0
  for limit in $limits; do
    for set in "ball --relative-radius 0.01" "tokens --radius 1"; do
      start=$(date +%s.%N)
      # shellcheck disable=SC2086
      build/lipcert certify --model "$m" --center "$c" --set $set --time-limit "$limit" --quiet >/dev/null
      wall=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { print b - a }')
      awk -v m="$(basename "$m" .safetensors)" -v s="${set%% *}" -v l="$limit" -v w="$wall" 'BEGIN {
        slack = (0.1 * l > 1) ? 0.1 * l : 1
        printf "| %s | %s | %g | %.2f | %+.2f | %s |\n", m, s, l, w, w - l, (w <= l + slack) ? "yes" : "NO" }'
    done
  done
done
