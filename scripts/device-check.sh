#!/usr/bin/env bash
# The CUDA evaluator on a lent GPU machine, in two steps (docs/kernels.md, "Device check").
#
#   scripts/device-check.sh bundle   # here: build the CUDA binaries, gather what they need
#                                    # into device-bundle/ (git-ignored, < 64 MiB), check
#                                    # that it runs from a clean environment
#   scripts/device-check.sh run      # on the device machine (only the working tree and the
#                                    # carried device-bundle/ are there): the evaluator
#                                    # suite (CUDA against the reference) and `lipcert bench
#                                    # --device cuda` at the three sizes, results under $OUT
#
# Bundle contents: bin/{lipcert,kernels_tests} built with -DLIPCERT_CUDA_GEMM=builtin (the
# tiled GEMM of kernels/cuda/gemm.cu and the static CUDA runtime: cuBLAS cannot travel,
# libcublasLt alone is over 500 MB) and -march=x86-64-v3 (the device host's CPU is unknown;
# native code for this machine could use instructions another x86 lacks); lib/ holds every
# shared library ldd lists except the driver (libcuda, the device's own) and the vDSO,
# glibc and its loader included: the binaries are started through lib/ld-linux-x86-64.so.2,
# so they run whatever glibc the device has (a bundled libc.so under a foreign loader
# would not). The driver's libcuda.so.1 is found by the bundled loader through the
# device's /etc/ld.so.cache or the directory added below.
#
# Environment: BUILD_DIR (build-cuda), BUNDLE (device-bundle), NVCC (/usr/local/cuda/bin/nvcc),
# JOBS (2); run mode: OUT (required), BENCH_BUDGET_S (420), BENCH_RUN_TIMEOUT_S (90).
set -euo pipefail
cd "$(dirname "$0")/.."

MODE="${1:-}"
BUILD_DIR="${BUILD_DIR:-build-cuda}"
BUNDLE="${BUNDLE:-device-bundle}"
MAX_BUNDLE_BYTES=$((60 * 1024 * 1024))  # 64 MiB carry limit, with room for the rest

log() { echo "[device-check $(date -u +%H:%M:%S)] $*" >&2; }

# Runs a bundled binary through the bundled loader and libraries.
bundled() {
  local bin="$1"
  shift
  "$BUNDLE/lib/ld-linux-x86-64.so.2" --library-path "$BUNDLE/lib${EXTRA_LIB_DIRS:-}" "$BUNDLE/bin/$bin" "$@"
}

bundle() {
  local nvcc="${NVCC:-/usr/local/cuda/bin/nvcc}"
  [[ -x "$nvcc" ]] || { echo "device-check: no nvcc at $nvcc (set NVCC)" >&2; exit 2; }
  log "configure $BUILD_DIR"
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CUDA_COMPILER="$nvcc" -DLIPCERT_CUDA=ON -DLIPCERT_CUDA_GEMM=builtin \
    -DLIPCERT_NATIVE=OFF -DCMAKE_CXX_FLAGS=-march=x86-64-v3 -DLIPCERT_BENCH=OFF \
    $(command -v ccache >/dev/null && echo -DCMAKE_CXX_COMPILER_LAUNCHER=ccache) >/dev/null
  log "build lipcert kernels_tests (-j${JOBS:-2})"
  cmake --build "$BUILD_DIR" -j"${JOBS:-2}" --target lipcert kernels_tests

  rm -rf "$BUNDLE"
  mkdir -p "$BUNDLE/bin" "$BUNDLE/lib"
  cp "$BUILD_DIR/lipcert" "$BUILD_DIR/tests/kernels_tests" "$BUNDLE/bin/"
  strip "$BUNDLE/bin/"*
  local lib
  for bin in "$BUNDLE/bin/"*; do
    # "libfoo.so.1 => /path/libfoo.so.1 (0x...)" and "/lib64/ld-linux-x86-64.so.2 (0x...)".
    while read -r lib; do
      case "$(basename "$lib")" in
        libcuda.so*|libnvidia*) continue ;;  # the driver: the device's own
      esac
      cp -L "$lib" "$BUNDLE/lib/$(basename "$lib")"
    done < <(ldd "$bin" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}')
  done
  [[ -e "$BUNDLE/lib/ld-linux-x86-64.so.2" ]] || { echo "device-check: no loader found by ldd" >&2; exit 1; }
  if ldd "$BUNDLE/bin/"* | grep -E "libcublas|libcudart" >/dev/null; then
    echo "device-check: the binaries still need cuBLAS / the shared CUDA runtime" >&2
    exit 1
  fi
  {
    echo "lipcert device bundle, built $(date -u +%Y-%m-%dT%H:%MZ) from $(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo '+changes')"
    echo "nvcc: $("$nvcc" --version | tail -n 1)"
    (cd "$BUNDLE" && find bin lib -type f -printf '%s %p\n' | sort -k2)
  } >"$BUNDLE/MANIFEST.txt"
  local bytes
  bytes=$(du -sb "$BUNDLE" | cut -f1)
  log "bundle: $BUNDLE, $((bytes / 1024 / 1024)) MiB ($bytes bytes)"
  ((bytes <= MAX_BUNDLE_BYTES)) || { echo "device-check: bundle over $MAX_BUNDLE_BYTES bytes" >&2; exit 1; }

  # The CPU parts from a clean environment, both ways: the system loader with the bundled
  # libraries on LD_LIBRARY_PATH (same glibc here), and the bundled loader as on the device.
  log "clean-environment check (CPU evaluator tests, lipcert bench --device cpu)"
  env -i PATH=/usr/bin:/bin LD_LIBRARY_PATH="$BUNDLE/lib" "$BUNDLE/bin/kernels_tests" \
    --gtest_filter='AllBackends/EvaluatorTest.*/cpu_dot_*:AllBackends/EvaluatorTest.*/cpu_layernorm_l2_causal_*:Evaluator*Test.*' \
    --gtest_brief=1
  env -i PATH=/usr/bin:/bin LD_LIBRARY_PATH="$BUNDLE/lib" "$BUNDLE/bin/lipcert" bench --device cpu \
    --n 16 --d 64 --heads 4 --batch 16 | tail -n 1; echo
  env -i PATH=/usr/bin:/bin bash -c "$(declare -f bundled); BUNDLE='$BUNDLE'; bundled lipcert bench --device cpu --n 16 --d 64 --heads 4 --batch 4" | tail -n 1; echo
  # Without a device the CUDA instances skip and a CUDA bench is refused with the reason.
  env -i PATH=/usr/bin:/bin bash -c "$(declare -f bundled); BUNDLE='$BUNDLE'; bundled kernels_tests --gtest_filter='AllBackends/EvaluatorTest.ForwardJvpVjpMatchReference/cuda_dot_f64'" | tail -n 3
  log "bundle ready: carry $BUNDLE to the device and run: scripts/device-check.sh run"
}

run() {
  [[ -n "${OUT:-}" ]] || { echo "device-check: OUT is not set" >&2; exit 2; }
  [[ -x "$BUNDLE/lib/ld-linux-x86-64.so.2" ]] || { echo "device-check: no $BUNDLE (run the bundle mode first and carry it)" >&2; exit 2; }
  mkdir -p "$OUT"
  exec 2> >(tee -a "$OUT/run.log" >&2)
  # Where the driver's libcuda.so.1 is, in case the device's ld.so.cache does not list it.
  EXTRA_LIB_DIRS=""
  local d
  for d in /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/local/nvidia/lib64 /usr/lib/wsl/lib; do
    if compgen -G "$d/libcuda.so.1" >/dev/null; then EXTRA_LIB_DIRS=":$d"; break; fi
  done
  {
    echo "== date"; date -u
    echo "== uname"; uname -a
    echo "== nvidia-smi"; (nvidia-smi 2>&1 || echo "no nvidia-smi")
    echo "== libcuda dir"; echo "${EXTRA_LIB_DIRS#:}"
    echo "== bundle"; cat "$BUNDLE/MANIFEST.txt"
  } >"$OUT/env.txt"

  log "evaluator suite (every back end; CUDA against the dense reference)"
  local t0=$SECONDS rc=0
  timeout 300 bash -c "$(declare -f bundled); BUNDLE='$BUNDLE'; EXTRA_LIB_DIRS='$EXTRA_LIB_DIRS'; \
    bundled kernels_tests --gtest_output=xml:'$OUT/evaluator_tests.xml'" >"$OUT/evaluator_tests.txt" 2>&1 || rc=$?
  log "evaluator suite: exit $rc in $((SECONDS - t0)) s; $(grep -E '^\[  (PASSED|FAILED|SKIPPED) +\] [0-9]+ test' "$OUT/evaluator_tests.txt" | tr '\n' ' ')"

  # lipcert bench --device cuda: the three sizes, batch 1 to 4096 in powers of 4; a size
  # stops growing its batch once a run times out, and the whole loop keeps to a budget.
  local budget="${BENCH_BUDGET_S:-420}" per_run="${BENCH_RUN_TIMEOUT_S:-90}" start=$SECONDS
  echo -e "n\td\theads\tbatch\tdtype\trc\tseconds\tpoints_per_s\titerations\tgflops" >"$OUT/bench.tsv"
  : >"$OUT/bench.txt"
  local size n dd h batch dtype out r t1 pps it gf
  for dtype in f32 f64; do
    for size in "16 64 4" "32 256 8" "128 768 12"; do
      read -r n dd h <<<"$size"
      for batch in 1 4 16 64 256 1024 4096; do
        if ((SECONDS - start > budget)); then
          log "bench budget of $budget s spent: stopping before $dtype N=$n D=$dd H=$h batch=$batch"
          break 3
        fi
        t1=$SECONDS
        r=0
        out=$(timeout "$per_run" bash -c "$(declare -f bundled); BUNDLE='$BUNDLE'; EXTRA_LIB_DIRS='$EXTRA_LIB_DIRS'; \
          bundled lipcert bench --device cuda --dtype $dtype --n $n --d $dd --heads $h --batch $batch" 2>&1) || r=$?
        { echo "== $dtype N=$n D=$dd H=$h batch=$batch: exit $r in $((SECONDS - t1)) s"; echo "$out"; } >>"$OUT/bench.txt"
        pps=$(echo "$out" | sed -n 's/^points_per_s=//p')
        it=$(echo "$out" | sed -n 's/^iterations  : mean \([0-9.]*\).*/\1/p')
        gf=$(echo "$out" | sed -n 's/.*, \([0-9.]*\) GFLOP\/s achieved.*/\1/p')
        echo -e "$n\t$dd\t$h\t$batch\t$dtype\t$r\t$((SECONDS - t1))\t${pps:-}\t${it:-}\t${gf:-}" >>"$OUT/bench.tsv"
        log "bench $dtype N=$n D=$dd H=$h batch=$batch: exit $r, points_per_s=${pps:-none}"
        ((r == 0)) || break  # larger batches of this size would only take longer
      done
    done
  done
  log "done: $(ls "$OUT" | tr '\n' ' ')"
}

case "$MODE" in
  bundle) bundle ;;
  run) run ;;
  *) echo "usage: scripts/device-check.sh bundle|run" >&2; exit 2 ;;
esac
