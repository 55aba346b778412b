#!/usr/bin/env bash
# Throughput of the evaluator's top-singular-value search against the PyTorch autograd
# baseline (power iteration, 30 steps, float32, 2 threads) at three sizes.
#
# Usage: bench/torch_compare.sh [BUILD_DIR]        (default BUILD_DIR: build)
# Environment overrides:
#   LIPCERT_BASELINE  path of torch_jacobian_baseline.py (default bench/torch_jacobian_baseline.py, the baseline the targets are measured against)
#   LIPCERT_PYTHON    a python with torch (default /usr/bin/python3)
#   LIPCERT_BENCH     the bench command (default BUILD_DIR/bench/kernels_bench)
#   LIPCERT_SIZES     "N,D,H,BATCH;..." (default "16,64,4,64;32,256,8,32;128,768,12,8")
#   LIPCERT_THREADS   threads for both sides (default 2)
# Columns: the baseline's points/s; ours with Lanczos to rel_tol 1e-6 (residual criterion,
# our default); ours with exactly 30 power-iteration steps (the baseline's work); and the
# speed-ups of each over the baseline.
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build}"
baseline="${LIPCERT_BASELINE:-bench/torch_jacobian_baseline.py}"
python="${LIPCERT_PYTHON:-/usr/bin/python3}"
bench="${LIPCERT_BENCH:-$build/bench/kernels_bench}"
threads="${LIPCERT_THREADS:-2}"
sizes="${LIPCERT_SIZES:-16,64,4,64;32,256,8,32;128,768,12,8}"

[[ -f "$baseline" ]] || { echo "torch_compare: baseline not found: $baseline" >&2; exit 1; }
[[ -x "${bench%% *}" ]] || { echo "torch_compare: bench not built: $bench" >&2; exit 1; }

last_pps() { sed -n 's/^points_per_s=//p' | tail -1; }
field() { sed -n "s/^$1 *: //p" | head -1; }

echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(nproc) cpus, load average $(cut -d' ' -f1-3 /proc/loadavg), threads $threads, float32"
printf '%-14s %6s %12s %12s %8s %10s %12s %8s %10s\n' "N,D,H" batch "torch pts/s" "lanczos" iters "speed-up" "power30" iters "speed-up"
IFS=';' read -ra cases <<<"$sizes"
for c in "${cases[@]}"; do
  IFS=',' read -r n d h b <<<"$c"
  tout="$("$python" "$baseline" "$n" "$d" "$h" "$b" "$threads")"
  # points/s from the elapsed time (the baseline prints samples/s with one decimal only)
  tel="$(sed -n 's/.*elapsed=\([0-9.eE+-]*\)s.*/\1/p' <<<"$tout")"
  tpps="$(awk -v b="$b" -v e="$tel" 'BEGIN{print b/e}')"
  common=(--n "$n" --d "$d" --heads "$h" --batch "$b" --dtype f32 --device cpu --threads "$threads")
  lout="$($bench "${common[@]}" --method lanczos --rel-tol 1e-6)"
  pout="$($bench "${common[@]}" --method power --rel-tol 0 --max-iters 30)"
  lpps="$(last_pps <<<"$lout")"; ppps="$(last_pps <<<"$pout")"
  lit="$(field iterations <<<"$lout" | awk '{print $2}' | tr -d ,)"
  pit="$(field iterations <<<"$pout" | awk '{print $2}' | tr -d ,)"
  printf '%-14s %6s %12.4g %12.4g %8s %9.1fx %12.4g %8s %9.1fx\n' "$n,$d,$h" "$b" "$tpps" "$lpps" "$lit" \
    "$(awk -v a="$lpps" -v t="$tpps" 'BEGIN{print a/t}')" "$ppps" "$pit" \
    "$(awk -v a="$ppps" -v t="$tpps" 'BEGIN{print a/t}')"
  echo "  torch: $tout" >&2
  echo "  lanczos: $(field 'gemm flops' <<<"$lout")" >&2
done
echo "# load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
