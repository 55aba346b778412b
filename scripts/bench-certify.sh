#!/usr/bin/env bash
# Tightness and speed table of the certify issue: for each bundled checkpoint, set and
# radius, every engine's bound, the witnessed lower bound, the gap and the time. The
# tokens sets around zero (Castin's B_R^N) certify the attention alone (--attention-only):
# around zero the LayerNorm in front has a Lipschitz constant of about max|gamma|/sqrt(eps).
# Usage: bash scripts/bench-certify.sh [OUT.md]   (needs build/lipcert; minutes of CPU)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-/dev/stdout}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
run() {  # model centre set radius-flag radius time-limit
  local name; name=$(basename "$1" .safetensors)-$3-$5
  build/lipcert certify --model "$1" --center "$2" --set "$3" "$4" "$5" --time-limit "$6" \
      --quiet --json "$tmp/$name.json" >/dev/null
}
for m in models/zoo/*-layer?.safetensors; do
  c=${m%.safetensors}-centres.safetensors:x0
  run "$m" "$c" ball --relative-radius 0.001 "${LIPCERT_BENCH_T1:-10}"
  run "$m" "$c" ball --relative-radius 0.01 "${LIPCERT_BENCH_T2:-60}"
  for r in 0.5 1 2 4; do
    build/lipcert certify --model "$m" --center zero --tokens 32 --set tokens --radius "$r" --attention-only \
        --time-limit "${LIPCERT_BENCH_T3:-20}" --quiet --json "$tmp/$(basename "$m" .safetensors)-zero-tokens-$r.json" >/dev/null
  done
done
# The same trained weights without the causal mask, where the closed forms apply
# (scripts/unmask.py; needs a python with numpy: LIPCERT_PYTHON, default /usr/bin/python3).
if "${LIPCERT_PYTHON:-/usr/bin/python3}" -c 'import numpy' 2>/dev/null; then
  for m in models/zoo/*-layer0.safetensors; do
    u="$tmp/$(basename "$m" .safetensors)-unmasked.safetensors"
    "${LIPCERT_PYTHON:-/usr/bin/python3}" scripts/unmask.py "$m" "$u"
    c=${m%.safetensors}-centres.safetensors:x0
    run "$u" "$c" ball --relative-radius 0.001 "${LIPCERT_BENCH_T1:-10}"
    run "$u" "$c" ball --relative-radius 0.01 "${LIPCERT_BENCH_T2:-60}"
  done
else
  echo "bench-certify: no numpy; the unmasked rows are skipped" >&2
fi
python3 - "$tmp" > "$out" <<'PY'
import glob, json, os, sys
rows = []
for f in sorted(glob.glob(os.path.join(sys.argv[1], "*.json"))):
    c = json.load(open(f))
    e = c["engines"]
    fmt = lambda v: "n/a" if v is None else f"{v:.4g}"
    rows.append("| {} | {} | {} | {:.4g} | {} | {} | {} | {} | {} | {} | {} | {:.1f} |".format(
        os.path.basename(c["model"]["path"]), c["set"]["centre"].split(":")[-1], c["set"]["kind"], c["set"]["radius"],
        fmt(e.get("closed_form/castin", e.get("closed_form/kim"))), fmt(e.get("block_norm")), fmt(e.get("centre_norm", e.get("centred"))),
        fmt(e.get("branch_and_bound")), fmt(c["upper_bound"]), fmt(c["lower_bound"]), fmt(c["gap"]), c["elapsed_s"])
        + (" |" if c["layer"]["layer_norm"] else " MHA alone |"))
print("| model | centre | set | radius | closed form | block_norm | centre_norm | b&b | upper | lower | gap | s | |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
print("\n".join(rows))
PY
