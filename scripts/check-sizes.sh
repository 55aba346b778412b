#!/usr/bin/env bash
# Lists files over 700 lines and functions over 80 lines in the source folders (or in the
# folders given), and exits non-zero when there are any (scripts/check_sizes.py counts).
set -euo pipefail
cd "$(dirname "$0")/.."
dirs=("$@")
[ ${#dirs[@]} -gt 0 ] || dirs=(certify models interval kernels reports audit cli)
exec python3 scripts/check_sizes.py --file-lines 700 --function-lines 80 "${dirs[@]}"
