#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan + UBSan, the models library instrumented too) in
# build-fuzz/ and runs them for a bounded time on a scratch copy of the seed corpus.
#   scripts/fuzz.sh [seconds] [target ...]     default: 60 s, safetensors_fuzz
# Targets: safetensors_fuzz, npy_fuzz. Exits non-zero on a finding (crash, sanitizer report,
# an exception other than InputError); the reproducer is left in build-fuzz/findings/.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-60}"
shift || true
targets=("$@")
((${#targets[@]})) || targets=(safetensors_fuzz)

build=build-fuzz
san="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
# Every translation unit (the models library included) gets coverage instrumentation and the
# sanitizers; the fuzz targets themselves link with -fsanitize=fuzzer (CMakeLists.txt).
CC=clang CXX=clang++ cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DLIPCERT_FUZZ=ON -DLIPCERT_TESTS=OFF -DLIPCERT_BENCH=OFF -DLIPCERT_CUDA=OFF \
  -DCMAKE_C_FLAGS="-fsanitize=fuzzer-no-link $san" -DCMAKE_CXX_FLAGS="-fsanitize=fuzzer-no-link $san" >/dev/null
cmake --build "$build" --target "${targets[@]}" -j"${FUZZ_JOBS:-2}"

export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
status=0
for t in "${targets[@]}"; do
  name="${t%_fuzz}"
  work="$build/corpus/$name"
  findings="$build/findings/$name"
  rm -rf "$work"
  mkdir -p "$work" "$findings"
  cp fuzz/corpus/"$name"/* "$work"/ 2>/dev/null || true
  dict=()
  [[ -f "fuzz/$name.dict" ]] && dict=(-dict="fuzz/$name.dict")
  echo "fuzz.sh: running $t for $seconds s" >&2
  if ! "$build/fuzz/$t" "$work" "${dict[@]}" -max_total_time="$seconds" -max_len=4096 -timeout=10 \
       -rss_limit_mb=2048 -artifact_prefix="$findings/" -print_final_stats=1; then
    echo "fuzz.sh: $t found a problem; reproducer(s) in $findings/" >&2
    status=1
  fi
done
exit $status
