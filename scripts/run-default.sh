#!/usr/bin/env bash
# The main job on the bundled default models: installs the dependencies (Debian packages),
# builds, and certifies every bundled checkpoint (models/zoo) on its first real centre,
# balls of 0.1% and 1% of ||X0||_F, printing one summary line per certificate.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
build/lipcert zoo --dir models/zoo --time-limit "${LIPCERT_TIME_LIMIT:-10}"
