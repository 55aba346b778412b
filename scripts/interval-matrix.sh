#!/usr/bin/env bash
# Builds and runs ONLY the interval/ tests under gcc {-O0, -O2} and clang {-O0, -O3 -march=native}
# (separate build trees under build-matrix/; gcc -O3 -march=native is the main build's own
# configuration, whose interval_tests ctest runs, and clang -O2 sits between two that run), and checks that interval/rounding.h refuses
# to compile under -ffast-math or without LIPCERT_ROUNDING_MATH. Then the hostile build:
# CMAKE_CXX_FLAGS="-ffast-math -Ofast" must configure with a warning, link without
# crtfastmath.o and pass interval_tests; and a program linked with -ffast-math by hand
# (FTZ/DAZ on from start-up) must get exact results through the run-time guard.
# Exits non-zero on any failure. Usage: scripts/interval-matrix.sh
#   LIPCERT_MATRIX_JOBS  parallel build jobs (default 2)
#   LIPCERT_MATRIX_FULL  set: also gcc -O3 -march=native and clang -O2 (six configurations)
#   LIPCERT_TEST_SCALE   scales the property-test counts (default 1; 0.25 for the -O0 builds)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
jobs="${LIPCERT_MATRIX_JOBS:-2}"
# ccache (installed by scripts/install-deps.sh) makes reruns of the matrix cheap.
launcher=()
if command -v ccache >/dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
fail=0
mkdir -p build-matrix

# 1. The rounding model must refuse builds without its flags.
for variant in "-ffast-math -DLIPCERT_ROUNDING_MATH=1" "-frounding-math"; do
  for cxx in g++ clang++; do
    command -v "$cxx" >/dev/null || continue
    if echo '#include "interval/rounding.h"' | "$cxx" -std=c++20 -I. $variant -x c++ -fsyntax-only - 2>/dev/null; then
      echo "interval-matrix: FAIL: $cxx $variant compiled interval/rounding.h (must #error)"
      fail=1
    else
      echo "interval-matrix: ok: $cxx $variant is refused"
    fi
  done
done

# 2. Build and run interval_tests per compiler and flag set.
configs=("gcc|g++|-O0" "gcc|g++|-O2" "clang|clang++|-O0" "clang|clang++|-O3 -march=native")
# LIPCERT_MATRIX_FULL=1 adds the two configurations CI leaves out.
if [[ -n "${LIPCERT_MATRIX_FULL:-}" ]]; then configs+=("gcc|g++|-O3 -march=native" "clang|clang++|-O2"); fi
for c in "${configs[@]}"; do
  IFS='|' read -r name cxx flags <<<"$c"
  if ! command -v "$cxx" >/dev/null; then echo "interval-matrix: skip $name (no $cxx)"; continue; fi
  dir="build-matrix/${name}$(echo "$flags" | tr -d ' =-')"
  echo "=== $name $flags -> $dir"
  if ! cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=None -DCMAKE_CXX_COMPILER="$cxx" \
        -DCMAKE_CXX_FLAGS="$flags" -DLIPCERT_NATIVE=OFF -DLIPCERT_BENCH=OFF -DLIPCERT_CUDA=OFF "${launcher[@]}" >"$dir.configure.log" 2>&1; then
    echo "interval-matrix: FAIL: configure ($dir.configure.log)"; fail=1; continue
  fi
  if ! cmake --build "$dir" --target interval_tests -j"$jobs" >"$dir.build.log" 2>&1; then
    echo "interval-matrix: FAIL: build ($dir.build.log)"; tail -20 "$dir.build.log"; fail=1; continue
  fi
  # -O0 binaries are ~3x slower: a quarter of the property-test counts unless set.
  scale="${LIPCERT_TEST_SCALE:-1}"
  if [[ "$flags" == "-O0" && -z "${LIPCERT_TEST_SCALE:-}" ]]; then scale=0.25; fi
  if ! LIPCERT_TEST_SCALE="$scale" "$dir/tests/interval_tests" --gtest_brief=1; then
    echo "interval-matrix: FAIL: tests under $name $flags"; fail=1
  fi
done
# 3. The hostile build (gcc, one configuration): fast-math flags are stripped at configure
#    time, so neither the compile nor the link sees them (docs/rounding-model.md).
if command -v g++ >/dev/null; then
  dir="build-matrix/gcc-fastmath"
  echo "=== gcc -ffast-math -Ofast -> $dir"
  if ! cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER=g++ \
        -DCMAKE_CXX_FLAGS="-ffast-math -Ofast" -DLIPCERT_NATIVE=OFF -DLIPCERT_BENCH=OFF \
        -DLIPCERT_CUDA=OFF "${launcher[@]}" >"$dir.configure.log" 2>&1; then
    echo "interval-matrix: FAIL: configure ($dir.configure.log)"; fail=1
  fi
  if [[ -f "$dir/build.ninja" ]]; then
    # The first configure warns and rewrites the cache entry; later ones find it clean.
    if grep -E "^CMAKE_CXX_FLAGS:" "$dir/CMakeCache.txt" | grep -qE -- "-ffast-math|-Ofast"; then
      echo "interval-matrix: FAIL: fast-math left in CMAKE_CXX_FLAGS of $dir"; fail=1
    fi
    if ! cmake --build "$dir" --target interval_tests -j"$jobs" >"$dir.build.log" 2>&1; then
      echo "interval-matrix: FAIL: build ($dir.build.log)"; tail -20 "$dir.build.log"; fail=1
    else
      if nm "$dir/tests/interval_tests" | grep -q set_fast_math; then
        echo "interval-matrix: FAIL: $dir/tests/interval_tests links crtfastmath.o"; fail=1
      else
        echo "interval-matrix: ok: no crtfastmath.o in the -ffast-math -Ofast build"
      fi
      if ! "$dir/tests/interval_tests" --gtest_brief=1; then
        echo "interval-matrix: FAIL: tests under gcc -ffast-math -Ofast"; fail=1
      fi
      # A program linked with -ffast-math by hand: the guard must repair FTZ/DAZ.
      probe="$dir/fastmath_link_probe"
      if g++ -std=c++20 -O2 -I. -frounding-math -fno-fast-math -DLIPCERT_ROUNDING_MATH=1 \
           -c tests/interval/fastmath_link_probe.cc -o "$probe.o" &&
         g++ -ffast-math "$probe.o" "$dir/liblipcert_interval.a" -pthread -o "$probe"; then
        set +e; "$probe"; rc=$?; set -e
        if ((rc == 77)); then echo "interval-matrix: skip: -ffast-math link left FTZ/DAZ off here"
        elif ((rc != 0)); then echo "interval-matrix: FAIL: guard under a -ffast-math link"; fail=1
        else echo "interval-matrix: ok: guard repairs FTZ/DAZ of a -ffast-math link"; fi
      else
        echo "interval-matrix: FAIL: could not build the -ffast-math link probe"; fail=1
      fi
    fi
  fi
fi

if ((fail)); then echo "interval-matrix: FAILED"; exit 1; fi
echo "interval-matrix: all configurations passed"
