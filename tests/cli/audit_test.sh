#!/usr/bin/env bash
# lipcert audit end to end on the bundled zoo: bad input (exit 2, one line naming file,
# line and key, nothing written), thresholds that hold (0) and fail (1, each job named),
# resuming after SIGKILLs at random moments (each job exactly once, every line's checksum
# right), and with a work budget the same certificates serial, threaded, in two merged
# shards and under mpirun -np 2 (when lipcert was built with MPI).
# Usage: tests/cli/audit_test.sh LIPCERT_BINARY SOURCE_DIR
set -uo pipefail
bin=$1
src=$2
zoo="$src/models/zoo"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
check() { if eval "$2"; then echo "ok: $1"; else echo "FAIL: $1"; fail=1; fi; }

# A journal is valid: every line's checksum holds, each key once; prints the line count.
journal_lines() {
  python3 - "$1" <<'PY'
import hashlib, json, sys
keys = []
for line in open(sys.argv[1], "rb").read().decode().split("\n")[:-1]:
    head = '{"sha256":"'
    assert line.startswith(head) and line.endswith("}"), line[:80]
    payload = line[len(head) + 64 + len('","payload":'):-1]
    assert hashlib.sha256(payload.encode()).hexdigest() == line[len(head):len(head) + 64]
    keys.append(json.loads(payload)["key"])
assert len(keys) == len(set(keys)), "a job twice"
print(len(keys))
PY
}

# ---- bad input ----
cat >"$tmp/bad.toml" <<EOF
[defaults]
radii = ["1%"]
[[checkpoint]]
path = "$zoo/dot-layer0.safetensors"
centres = { file = "$zoo/dot-layer0-centres.safetensors", tensors = ["x0"] }
radius = 3
EOF
"$bin" audit "$tmp/bad.toml" --out "$tmp/bad-out" 2>"$tmp/err.txt" >/dev/null
check "unknown key: exit 2" "[ $? -eq 2 ]"
check "one line naming file, line and key" "[ \$(wc -l <'$tmp/err.txt') -eq 1 ] && grep -q 'bad.toml:6: checkpoint\[0\].radius: unknown key' '$tmp/err.txt'"
check "nothing written" "[ ! -e '$tmp/bad-out' ]"
sed -i 's/tensors = \["x0"\]/tensors = ["x7"]/; s/^radius = 3$//' "$tmp/bad.toml"
"$bin" audit "$tmp/bad.toml" --out "$tmp/bad-out" 2>"$tmp/err.txt" >/dev/null
check "missing tensor: exit 2, named" "[ $? -eq 2 ] && grep -q \"bad.toml:5: checkpoint\[0\].centres.tensors: no tensor 'x7'\" '$tmp/err.txt' && [ ! -e '$tmp/bad-out' ]"

# ---- thresholds: 0 when they hold, 1 when one is violated ----
audit_file() {  # $1: extra lines
  cat <<EOF
[defaults]
radii = ["1%"]
time_limit = 0.5
dense_limit = 0
[[checkpoint]]
path = "$zoo/dot-layer0.safetensors"
centres = { file = "$zoo/{stem}-centres.safetensors", tensors = ["x0"] }
$1
EOF
}
audit_file "thresholds = { max_upper = 1e6, min_lower = 1 }" >"$tmp/pass.toml"
"$bin" audit "$tmp/pass.toml" --out "$tmp/gate" --quiet --threads 1 >"$tmp/table.txt" 2>"$tmp/err.txt"
check "thresholds hold: exit 0" "[ $? -eq 0 ]"
check "table row with verdict pass" "grep -Eq '^dot-layer0 +0 +x0 +ball +1% +2 +layer .* pass$' '$tmp/table.txt'"
check "summary.csv and report.md" "[ \$(wc -l <'$tmp/gate/summary.csv') -eq 2 ] && grep -q '| dot-layer0 |' '$tmp/gate/report.md'"
audit_file "thresholds = { max_upper = 1 }" >"$tmp/fail.toml"
"$bin" audit "$tmp/fail.toml" --out "$tmp/gate" --quiet --threads 1 >"$tmp/table.txt" 2>"$tmp/err.txt"
check "max_upper below the witnessed lower bound: exit 1" "[ $? -eq 1 ]"
check "the job named on stderr" "grep -q 'VIOLATED: dot-layer0 layer 0 centre x0 ball radius 1% norm 2 layer' '$tmp/err.txt'"
check "thresholds are not part of the key: nothing rerun" "[ \$(journal_lines '$tmp/gate/journal.jsonl') -eq 1 ]"
audit_file "thresholds = { max_gap = 1.0001 }" >"$tmp/gap.toml"
"$bin" audit "$tmp/gap.toml" --out "$tmp/gate" --quiet >/dev/null 2>"$tmp/err.txt"
check "a gap not certified within the limit: exit 1, UNPROVEN" "[ $? -eq 1 ] && grep -q 'UNPROVEN: dot-layer0' '$tmp/err.txt'"

# ---- killed at random moments, resumed: each job exactly once ----
cat >"$tmp/kill.toml" <<EOF
[defaults]
radii = ["0.1%", "1%"]
time_limit = 0.3
dense_limit = 0
[[checkpoint]]
path = "$zoo/*-layer0.safetensors"
centres = { file = "$zoo/{stem}-centres.safetensors", tensors = "all" }
EOF
total=$("$bin" audit "$tmp/kill.toml" --dry-run | wc -l)
kills=0
for i in 1 2 3 4 5 6; do
  "$bin" audit "$tmp/kill.toml" --out "$tmp/kill" --quiet --jobs 2 --threads 1 >/dev/null 2>&1 &
  pid=$!
  sleep "$(python3 -c "import random; print(random.uniform(0.3, 4))")"
  if kill -KILL "$pid" 2>/dev/null; then kills=$((kills + 1)); fi
  wait "$pid" 2>/dev/null
  if [ -f "$tmp/kill/journal.jsonl" ] && ! journal_lines "$tmp/kill/journal.jsonl" >/dev/null; then
    echo "FAIL: journal invalid after kill $i"; fail=1
  fi
done
# A torn line, as a kill in the middle of a write would leave it.
printf '{"sha256":"00","payload":{"key":"torn' >>"$tmp/kill/journal.jsonl"
"$bin" audit "$tmp/kill.toml" --out "$tmp/kill" --quiet --jobs 2 --threads 1 >"$tmp/table.txt" 2>"$tmp/err.txt"
check "resumed run completes (exit 0) after $kills kills" "[ $? -eq 0 ]"
check "$total jobs in the journal, each once, checksums right" "[ \$(journal_lines '$tmp/kill/journal.jsonl') -eq $total ]"
check "a rerun runs nothing" "'$bin' audit '$tmp/kill.toml' --out '$tmp/kill' 2>&1 >/dev/null | grep -q ', 0 to run'"

# ---- a work budget: the same certificates serial, threaded, sharded, under MPI ----
cat >"$tmp/budget.toml" <<EOF
[defaults]
radii = ["1%"]
budget = { steps = 3, rounds = 1 }
dense_limit = 0
thresholds = { max_upper = 1e6 }
[[checkpoint]]
path = "$zoo/*-layer1.safetensors"
centres = { file = "$zoo/{stem}-centres.safetensors", tensors = ["x1"] }
EOF
"$bin" audit "$tmp/budget.toml" --out "$tmp/serial" --quiet --jobs 1 --threads 1 >/dev/null 2>&1
check "serial budget run: exit 0" "[ $? -eq 0 ]"
"$bin" audit "$tmp/budget.toml" --out "$tmp/threaded" --quiet --jobs 2 --threads 2 >/dev/null 2>&1
check "threaded budget run: exit 0" "[ $? -eq 0 ]"
"$bin" audit "$tmp/budget.toml" --out "$tmp/s0" --quiet --shard 0/2 >/dev/null 2>&1 &&
  "$bin" audit "$tmp/budget.toml" --out "$tmp/s1" --quiet --shard 1/2 >/dev/null 2>&1 &&
  "$bin" audit merge "$tmp/s0" "$tmp/s1" --out "$tmp/merged" >"$tmp/merged.txt" 2>&1
check "two shards merged: exit 0" "[ $? -eq 0 ]"
same() {  # the certificates of two journals, timing fields and the thread count left out, are identical
  python3 - "$1" "$2" <<'PY'
import json, sys
def load(p):
    out = {}
    for line in open(p):
        c = json.loads(line)["payload"]
        cert = c["certificate"]
        cert.pop("elapsed_s")
        cert["run"].pop("threads")  # a setting recorded, not a result
        for e in cert["engine_details"]:
            e.pop("seconds")
        out[c["key"]] = cert
    return out
a, b = load(sys.argv[1]), load(sys.argv[2])
assert len(a) == 2 and a == b, (len(a), len(b))
PY
}
check "threaded == serial (bit-identical)" "same '$tmp/serial/journal.jsonl' '$tmp/threaded/journal.jsonl'"
check "merged shards == serial" "same '$tmp/serial/journal.jsonl' '$tmp/merged/journal.jsonl'"
if command -v mpirun >/dev/null && "$bin" audit --help | grep -q 'MPI: yes'; then
  mpirun -np 2 --oversubscribe --allow-run-as-root "$bin" audit "$tmp/budget.toml" --out "$tmp/mpi" --quiet --threads 1 \
    >"$tmp/mpi.txt" 2>&1
  check "mpirun -np 2: exit 0" "[ $? -eq 0 ]"
  check "mpirun -np 2 == serial" "same '$tmp/serial/journal.jsonl' '$tmp/mpi/journal.jsonl'"
else
  echo "skip: lipcert built without MPI (or no mpirun)"
fi
exit $fail
