#!/usr/bin/env bash
# The main job on the bundled default models: installs the dependencies (Debian packages),
# builds, and certifies every bundled checkpoint (models/zoo) on its first real centre,
# balls of 0.1% and 1% of ||X0||_F, printing one summary line per certificate; then writes
# the sweep report (dot vs L2 on tokens sets around zero and on balls around real centres,
# with the validation section) to lipcert-report/ and prints where it is (docs/reports.md).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
build/lipcert zoo --dir models/zoo --time-limit "${LIPCERT_TIME_LIMIT:-10}" --report "${LIPCERT_REPORT_DIR:-lipcert-report}"
