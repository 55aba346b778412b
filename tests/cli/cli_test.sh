#!/usr/bin/env bash
# End-to-end checks of the CLI on a bundled checkpoint: a certificate with the documented
# fields and a sound ordering (lower <= upper), a witness file, and bad input giving
# exit status 2, one line on stderr, and no output file.
# Usage: tests/cli/cli_test.sh LIPCERT_BINARY SOURCE_DIR
set -uo pipefail
bin=$1
src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
check() { if eval "$2"; then echo "ok: $1"; else echo "FAIL: $1"; fail=1; fi; }

"$bin" certify --model "$src/models/zoo/dot-layer0.safetensors" --center zero --tokens 4 --set tokens \
  --radius 0.5 --time-limit 3 --quiet --json "$tmp/c.json" --witness "$tmp/w.safetensors" >"$tmp/out.txt"
check "certify exits 0" "[ $? -eq 0 ]"
check "summary printed" "grep -q 'certified upper' '$tmp/out.txt'"
python3 - "$tmp/c.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
assert c["schema"] == "lipcert.certificate/1"
for k in ["model", "layer", "set", "norm", "upper_bound", "lower_bound", "gap", "engines", "numerics", "status", "elapsed_s", "invertibility"]:
    assert k in c, k
assert len(c["model"]["sha256"]) == 64
assert 0 < c["lower_bound"] <= c["upper_bound"], (c["lower_bound"], c["upper_bound"])
assert c["upper_bound"] == min(v for v in c["engines"].values() if v is not None)
assert c["status"] != "in_progress"
PY
check "certificate fields and lower <= upper" "[ $? -eq 0 ]"
check "witness written" "[ -s '$tmp/w.safetensors' ]"
"$bin" certify --model "$src/models/zoo/dot-layer0.safetensors" --center zero --tokens 4 --set box \
  --radius 0.1 --norm inf --time-limit 2 --quiet --json "$tmp/inf.json" >"$tmp/inf.txt"
check "the inf norm's certificate names only the engines that ran" "python3 -c 'import json,sys; d={e[\"name\"]: e for e in json.load(open(sys.argv[1]))[\"engine_details\"]}; assert \"centred\" not in d and d[\"block_norm\"][\"applied\"] is True and d[\"centre_norm\"][\"applied\"] is True' '$tmp/inf.json'"

# A work budget: the same certificate for any thread count (timings aside).
for t in 1 2; do
  "$bin" certify --model "$src/models/zoo/dot-layer0.safetensors" --center zero --tokens 4 --set tokens \
    --radius 0.5 --budget 2,1 --threads $t --quiet --json "$tmp/b$t.json" >/dev/null
done
check "--budget repeats across thread counts" "python3 -c '
import json, sys
a, b = (json.load(open(f)) for f in sys.argv[1:])
for c in (a, b):
    for e in c[\"engine_details\"]: e.pop(\"seconds\"); e[\"note\"] = \"\"
    for k in (\"elapsed_s\", \"run\"): c.pop(k)
assert a == b
assert a[\"status\"] in (\"work_budget\", \"tolerance_reached\", \"engines_exhausted\"), a[\"status\"]
' '$tmp/b1.json' '$tmp/b2.json'"

# SIGINT stops the run at its next check: exit 0, the certificate so far written.
"$bin" certify --model "$src/models/zoo/dot-layer0.safetensors" --center "$src/models/zoo/dot-layer0-centres.safetensors:x0" \
  --relative-radius 0.01 --time-limit 120 --tolerance 0 --quiet --json "$tmp/int.json" >"$tmp/int.txt" &
pid=$!
for _ in $(seq 100); do [ -s "$tmp/int.json" ] && break; sleep 0.1; done
kill -INT $pid
wait $pid
check "SIGINT: exit 0" "[ $? -eq 0 ]"
check "SIGINT: status interrupted, bounds sound" "python3 -c 'import json,sys; c=json.load(open(sys.argv[1])); assert c[\"status\"] == \"interrupted\" and c[\"elapsed_s\"] < 60 and c[\"lower_bound\"] <= c[\"upper_bound\"], c[\"status\"]' '$tmp/int.json'"
"$bin" inspect "$src/models/zoo/l2-layer1.safetensors" --json >"$tmp/inspect.json"
check "inspect --json" "python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d[\"layers\"][0][\"kind\"]==\"l2\"' '$tmp/inspect.json'"

"$bin" certify --model "$src/models/zoo/l2-layer0.safetensors" --center zero --tokens 3 --set tokens \
  --radius 1 --time-limit 2 --quiet --attention-only --json "$tmp/a.json" >/dev/null
check "--attention-only certifies MHA alone" "python3 -c 'import json,sys; c=json.load(open(sys.argv[1])); assert not c[\"layer\"][\"layer_norm\"] and \"invertibility\" not in c and 0 < c[\"lower_bound\"] <= c[\"upper_bound\"]' '$tmp/a.json'"

# search alone: a rigorous lower bound at least that of the centre, and its witness.
"$bin" search --model "$src/models/zoo/dot-layer0.safetensors" --center zero --tokens 4 --set tokens \
  --radius 0.5 --time-limit 2 --quiet --witness "$tmp/sw.safetensors" >"$tmp/search.txt"
check "search exits 0" "[ $? -eq 0 ]"
check "search prints a positive lower bound" "awk '/witnessed lower bound/ { exit !(\$4 > 0) }' '$tmp/search.txt' && grep -q 'witnessed lower bound' '$tmp/search.txt'"
check "search witness written" "[ -s '$tmp/sw.safetensors' ]"

# Bad input: exit 2, one line, nothing written.
printf 'not a safetensors file' >"$tmp/bad.safetensors"
"$bin" certify --model "$tmp/bad.safetensors" --center zero --tokens 4 --radius 1 --json "$tmp/bad.json" 2>"$tmp/err.txt"
check "truncated checkpoint exits 2" "[ $? -eq 2 ]"
check "one error line naming the file" "[ \$(wc -l <'$tmp/err.txt') -eq 1 ] && grep -q bad.safetensors '$tmp/err.txt'"
check "no partial certificate" "[ ! -e '$tmp/bad.json' ]"
"$bin" certify --model "$src/models/zoo/dot-layer0.safetensors" --center zero --tokens 4 --radius -1 2>/dev/null
check "negative radius exits 2" "[ $? -eq 2 ]"
exit $fail
