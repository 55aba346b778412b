#!/usr/bin/env bash
# lipcert sweep and lipcert report end to end: a sweep killed (kill -9) after its first point
# resumes with nothing lost or duplicated; rerunning a finished sweep recomputes nothing;
# report renders sweeps and certificates; bad input gives exit 2, one line naming the file
# and the field, and no report.
# Usage: tests/cli/sweep_test.sh LIPCERT_BINARY SOURCE_DIR
set -uo pipefail
bin=$1
src=$2
tmp=$(mktemp -d)
pid=""
trap '[ -n "$pid" ] && kill -9 "$pid" 2>/dev/null; rm -rf "$tmp"' EXIT
fail=0
check() { if eval "$2"; then echo "ok: $1"; else echo "FAIL: $1"; fail=1; fi; }

sweep=("$bin" sweep --model "$src/tests/data/checkpoints/native-dot" --model "$src/tests/data/checkpoints/native-l2"
       --center zero --tokens 3 --set tokens --radii 0.25,0.5,1,2,4 --time-limit-per-point 1 --threads 1
       --out "$tmp/sw")
"${sweep[@]}" >"$tmp/first.txt" 2>"$tmp/first.err" &
pid=$!
# Wait (bounded: 60 s) until the journal holds at least one point, then kill -9.
for _ in $(seq 600); do
  if [ -f "$tmp/sw/sweep.json" ] && python3 -c 'import json,sys; sys.exit(0 if len(json.load(open(sys.argv[1]))["points"]) >= 1 else 1)' "$tmp/sw/sweep.json" 2>/dev/null; then break; fi
  sleep 0.1
done
kill -9 "$pid" 2>/dev/null
wait "$pid" 2>/dev/null
pid=""
cp "$tmp/sw/sweep.json" "$tmp/killed.json"
check "the killed sweep left its CSV too" "[ \$(wc -l < '$tmp/sw/sweep.csv') -ge 2 ]"
check "the killed sweep left a valid journal with finished points" \
  "python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d[\"schema\"]==\"lipcert.sweep/1\" and 1 <= len(d[\"points\"]) < d[\"total_points\"] == 10 and not d[\"complete\"]' '$tmp/killed.json'"
check "no temporary files left behind but the one being written" "[ \$(ls '$tmp/sw' | grep -c '\.tmp\.') -le 1 ]"
"${sweep[@]}" >"$tmp/second.txt" 2>"$tmp/second.err"
check "the rerun exits 0" "[ $? -eq 0 ]"
check "the rerun says it resumed" "grep -q 'resuming' '$tmp/second.err'"
python3 - "$tmp/killed.json" "$tmp/sw/sweep.json" <<'PY'
import json, sys
killed, done = (json.load(open(p)) for p in sys.argv[1:3])
keys = [p["key"] for p in done["points"]]
assert len(keys) == len(set(keys)) == done["total_points"] == 10, (len(keys), len(set(keys)))
assert done["complete"]
# The points finished before the kill are kept as they were (not recomputed).
by_key = {p["key"]: p for p in done["points"]}
for p in killed["points"]:
    assert by_key[p["key"]] == p, p["key"]
for p in done["points"]:
    c = p["certificate"]
    assert c["lower_bound"] <= c["upper_bound"], p["key"]
PY
check "after the resume: every point once, the killed run's points untouched" "[ $? -eq 0 ]"
"${sweep[@]}" --quiet >"$tmp/third.txt" 2>"$tmp/third.err"
check "a finished sweep reruns without certifying" "grep -q '(0 certified now, 10 from the journal)' '$tmp/third.txt'"
check "--quiet prints nothing on stderr" "[ ! -s '$tmp/third.err' ]"
check "plain progress lines when stderr is not a terminal" "[ \$(grep -c '^sweep: \[' '$tmp/second.err') -ge 1 ]"
for f in sweep.csv report.html report.md; do check "$f written" "[ -s '$tmp/sw/$f' ]"; done
check "csv has one row per point" "[ \$(wc -l < '$tmp/sw/sweep.csv') -eq 11 ]"
check "markdown links its SVGs, which exist" \
  "for s in \$(grep -o '([a-zA-Z0-9._-]*\.svg)' '$tmp/sw/report.md' | tr -d '()'); do [ -s '$tmp/sw/'\$s ] || exit 1; done"

# report: a sweep and a certificate together.
"$bin" certify --model "$src/tests/data/checkpoints/native-dot" --center zero --tokens 3 --set ball --radius 0.5 \
  --time-limit 0.5 --threads 1 --quiet --json "$tmp/c.json" >/dev/null
"$bin" report "$tmp/sw/sweep.json" "$tmp/c.json" --html "$tmp/r.html" --markdown "$tmp/r.md" >/dev/null
check "report renders a sweep and a certificate" "[ $? -eq 0 ] && grep -q 'Certificate' '$tmp/r.html' && grep -q 'Sweep' '$tmp/r.md'"

"$bin" report "$tmp/c.json" --html "$tmp/v.html" --validate --validation-time-limit 0.2 --threads 1 >/dev/null
check "report --validate adds the validation section" "grep -q 'Validation: Kim et al.' '$tmp/v.html' && grep -q 'Validation: Castin et al.' '$tmp/v.html'"

# Bad input: exit 2, one line naming the file and the field, no report written.
echo '{"schema": "lipcert.nope/1"}' >"$tmp/unknown.json"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); del d["points"][0]["certificate"]["lower_bound"]; json.dump(d, open(sys.argv[2], "w"))' "$tmp/sw/sweep.json" "$tmp/broken.json"
echo '{"schema": "lipcert.certificate/1",' >"$tmp/malformed.json"
for case in "unknown.json:schema" "broken.json:points[0].certificate.lower_bound" "malformed.json:(json)"; do
  f=${case%%:*}
  field=${case#*:}
  "$bin" report "$tmp/c.json" "$tmp/$f" --html "$tmp/bad.html" >"$tmp/bad.out" 2>"$tmp/bad.err"
  rc=$?
  check "$f: exit 2" "[ $rc -eq 2 ]"
  check "$f: one line naming the file and the field" "[ \$(wc -l < '$tmp/bad.err') -eq 1 ] && grep -qF '$f: $field' '$tmp/bad.err'"
  check "$f: no partial report" "[ ! -e '$tmp/bad.html' ]"
done
"$bin" sweep --model "$src/tests/data/checkpoints/native-dot" --center zero --tokens 3 --set tokens --out "$tmp/x" 2>"$tmp/opt.err"
check "sweep without radii: exit 2 naming the flag" "[ $? -eq 2 ] && grep -q -- '--radii' '$tmp/opt.err'"
exit $fail
