#!/usr/bin/env bash
# Installs everything lipcert needs to build and test, from Debian packages only.
# Idempotent: packages already present are skipped. Run as root (or with sudo).
# Python (always): the venv and headers scripts/python-env.sh builds the lipcert package
# with, and Debian's PyTorch and NumPy, which that venv sees (the package's tests, the test
# vectors, the zoo's training and the torch baselines use them).
set -euo pipefail
pkgs=(cmake ninja-build g++ clang libclang-rt-dev libeigen3-dev libboost-dev libmpfr-dev
      libgmp-dev libmpfrc++-dev nlohmann-json3-dev libcli11-dev libgtest-dev libgmock-dev
      libbenchmark-dev libtomlplusplus-dev libopenmpi-dev openmpi-bin ccache
      chromium  # headless browser for tests/reports/browser_test.sh
      python3-venv python3-dev python3-torch python3-numpy)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO=sudo
  echo "install-deps: installing ${missing[*]}" >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
