#!/usr/bin/env bash
# Configures and builds lipcert in build/ (Release). The CLI lands at build/lipcert.
# Uses ccache when it is installed (faster rebuilds; nothing else changes).
set -euo pipefail
cd "$(dirname "$0")/.."
# ccache shares objects between checkouts when paths are rewritten relative to the tree.
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}"
launcher=()
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" "$@" >/dev/null
cmake --build build -j"$(nproc)"
