#!/usr/bin/env bash
# Installs the dependencies, builds, and runs every test CI runs:
#   1. the GoogleTest suites (ctest; LIPCERT_TEST_SCALE scales the property tests),
#   2. the interval tests under gcc and clang at -O0, -O2 and -O3 -march=native,
#   3. the safetensors fuzzer for a bounded time under ASan and UBSan,
#   4. the Python package's tests (pytest, in the venv scripts/python-env.sh makes).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
ctest --test-dir build --output-on-failure -j"$(nproc)" --timeout 900
bash scripts/python-env.sh
.venv/bin/python -m pytest python/tests -q
bash scripts/interval-matrix.sh
bash scripts/fuzz.sh "${LIPCERT_FUZZ_SECONDS:-60}"
