#!/usr/bin/env bash
# The BERT-base-size rows: a random layer of BERT-base's shape (D = 768, 12 heads, N = 128,
# scripts/bert_size_checkpoint.py), MHA alone and GPT-2's pre-LN sublayer X + MHA(LN(X))
# with the same attention weights and centre, at radius 0 and on balls of relative radius r,
# norm 2: lipcert certify's bound, its witness, the gap, the winner, wall seconds and peak
# memory, and the pre-LN sublayer's gap over MHA alone's.
# Usage: bash scripts/bench-bert-size.sh [OUT.md]   (needs build/lipcert and numpy in .venv
# (bash scripts/python-env.sh) or LIPCERT_PYTHON; about 2 minutes a row)
#   LIPCERT_BERT_RADII   relative radii (default "0 0.001")
#   LIPCERT_BERT_LIMIT   --time-limit per run in seconds (default 120)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-/dev/stdout}
radii=${LIPCERT_BERT_RADII:-0 0.001}
limit=${LIPCERT_BERT_LIMIT:-120}
[[ -x build/lipcert ]] || { echo "bench-bert-size: build/lipcert is missing (bash scripts/build.sh)" >&2; exit 2; }
py=${LIPCERT_PYTHON:-.venv/bin/python}
dir=build-real/bert-size
mkdir -p "$dir/mha" "$dir/pre-ln"
[[ -s $dir/mha/bert-size.safetensors ]] || "$py" scripts/bert_size_checkpoint.py "$dir/mha" >/dev/null
[[ -s $dir/pre-ln/bert-size.safetensors ]] || "$py" scripts/bert_size_checkpoint.py "$dir/pre-ln" --pre-ln >/dev/null
for block in mha pre-ln; do
  for r in $radii; do
    name="${block}_r$r"
    /usr/bin/time -f "%e %M" -o "$dir/$name.time" \
      build/lipcert certify --model "$dir/$block/bert-size.safetensors" --center "$dir/$block/centre.safetensors:x0" \
        --set ball --relative-radius "$r" --time-limit "$limit" --threads 2 --quiet --json "$dir/$name.json" >/dev/null
    echo "bench-bert-size: $name done" >&2
  done
done
"$py" - "$dir" "$radii" > "$out" <<'PY'
import json, sys
d, radii = sys.argv[1], sys.argv[2].split()
print("BERT-base size (D = 768, H = 12, N = 128, random weights), ball sets (relative radius), norm 2, 2 threads\n")
print("| block | radius | certified upper | witnessed lower | gap | winner | s | peak MB |")
print("| --- | --- | --- | --- | --- | --- | --- | --- |")
gaps = {}
for block, label in (("mha", "MHA alone"), ("pre-ln", "X + MHA(LN(X))")):
    for r in radii:
        c = json.load(open(f"{d}/{block}_r{r}.json"))
        secs, kb = open(f"{d}/{block}_r{r}.time").read().split()[-2:]
        up = c["upper_bound"] if c["upper_bound"] is not None else float("inf")
        gap = c["gap"] if c["gap"] is not None else float("inf")
        gaps[(block, r)] = gap
        print("| {} | {} | {:.6g} | {:.6g} | {:.4g} | {} | {:.0f} | {:.0f} |".format(
            label, r, up, c["lower_bound"], gap, c.get("winner", {}).get("engine", ""), float(secs), float(kb) / 1024))
print("\nThe pre-LN sublayer's gap over MHA alone's: " + ", ".join(
    "radius {}: {:.3g}".format(r, gaps[("pre-ln", r)] / gaps[("mha", r)]) for r in radii))
PY
