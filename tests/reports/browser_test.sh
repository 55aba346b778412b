#!/usr/bin/env bash
# A generated report in a real browser (headless Chromium, installed by scripts/install-deps.sh):
# no console errors (and a page with a deliberate error is caught, so the check can fail),
# the hover script ran, a screenshot that is not blank (pixel statistics), and every plotted
# marker's rendered position maps back to its numbers, which are the sweep's JSON numbers,
# within a pixel. LIPCERT_SKIP_BROWSER=1 skips it (exit 0, says so).
# Usage: tests/reports/browser_test.sh LIPCERT_BINARY SOURCE_DIR
set -uo pipefail
if [ "${LIPCERT_SKIP_BROWSER:-0}" = 1 ]; then echo "skipped: LIPCERT_SKIP_BROWSER=1"; exit 0; fi
bin=$1
src=$2
browser=$(command -v chromium || command -v chromium-browser || true)
if [ -z "$browser" ]; then echo "FAIL: no chromium (run scripts/install-deps.sh, or set LIPCERT_SKIP_BROWSER=1)"; exit 1; fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
check() { if eval "$2"; then echo "ok: $1"; else echo "FAIL: $1"; fail=1; fi; }
# Headless Chromium as root in a container needs --no-sandbox; its own profile in $tmp.
run_browser() {
  timeout 120 "$browser" --headless --no-sandbox --disable-gpu --disable-dev-shm-usage --no-first-run \
    --user-data-dir="$tmp/profile" --enable-logging=stderr --v=0 --window-size=1280,4000 \
    --virtual-time-budget=3000 "$@"
}

"$bin" sweep --model "$src/tests/data/checkpoints/native-dot" --model "$src/tests/data/checkpoints/native-l2" \
  --center zero --tokens 3 --set tokens --radii 0.25,1,4 --time-limit-per-point 0.3 --threads 1 \
  --validate --validation-time-limit 0.2 --quiet --out "$tmp/sw" >/dev/null
check "sweep with validation exits 0" "[ $? -eq 0 ] && [ -s '$tmp/sw/report.html' ]"

# A copy that records where each marker was rendered (relative to its <svg>) into the DOM.
python3 - "$tmp/sw/report.html" "$tmp/probe.html" <<'PY'
import sys
html = open(sys.argv[1]).read()
probe = """<script>
document.querySelectorAll('svg.lipcert-plot').forEach(function(svg){
  var r = svg.getBoundingClientRect();
  svg.setAttribute('data-rendered-width', r.width);
  svg.querySelectorAll('.pt').forEach(function(el){
    var b = el.getBoundingClientRect();
    el.setAttribute('data-rx', b.left + b.width / 2 - r.left);
    el.setAttribute('data-ry', el.tagName == 'rect' ? b.top - r.top : b.top + b.height / 2 - r.top);
  });
});
</script>"""
open(sys.argv[2], "w").write(html.replace("</body>", probe + "</body>"))
PY
run_browser --dump-dom "file://$tmp/probe.html" >"$tmp/dom.html" 2>"$tmp/dom.err"
check "chromium dumped the DOM" "[ -s '$tmp/dom.html' ]"
check "no console errors" "! grep -Ei 'CONSOLE.*(error|uncaught)|Uncaught' '$tmp/dom.err'"
check "the hover script ran" "grep -q 'data-hover=\"ready\"' '$tmp/dom.html'"

# Negative control: a page with a script error must be caught by the same check.
echo '<!DOCTYPE html><html><body><p>x</p><script>undefinedFunction();</script></body></html>' >"$tmp/broken.html"
run_browser --dump-dom "file://$tmp/broken.html" >/dev/null 2>"$tmp/broken.err"
check "a deliberate script error is detected (the check can fail)" "grep -Eqi 'Uncaught|CONSOLE.*error' '$tmp/broken.err'"

python3 - "$tmp/dom.html" "$tmp/sw/sweep.json" <<'PY'
import json, math, sys
from html.parser import HTMLParser

class Collect(HTMLParser):
    def __init__(self):
        super().__init__()
        self.plots = []
    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "svg" and "lipcert-plot" in a.get("class", ""):
            self.plots.append((a, []))
        elif tag in ("circle", "rect") and a.get("class") == "pt" and self.plots:
            self.plots[-1][1].append((tag, a))

p = Collect()
p.feed(open(sys.argv[1]).read())
assert len(p.plots) >= 5, f"only {len(p.plots)} plots"

def mapping(root, axis):
    log = root[f"data-{axis}-scale"] == "log"
    lo, hi = float(root[f"data-{axis}-min"]), float(root[f"data-{axis}-max"])
    p0, p1 = float(root[f"data-px-{axis}0"]), float(root[f"data-px-{axis}1"])
    f = (lambda v: math.log10(v)) if log else (lambda v: v)
    return lambda v: p0 + (f(v) - f(lo)) / (f(hi) - f(lo)) * (p1 - p0)

markers = 0
worst = 0.0
plotted = set()
for root, pts in p.plots:
    assert abs(float(root["data-rendered-width"]) - float(root["width"])) < 0.5, "svg scaled"
    mx, my = mapping(root, "x"), mapping(root, "y")
    for tag, a in pts:
        y = float(a["data-y"])
        ry = float(a["data-ry"])
        if tag == "circle":
            x = float(a["data-x"])
            dx = abs(mx(x) - float(a["data-rx"]))
            worst = max(worst, dx)
            assert dx <= 1.0, ("x", a)
            plotted.add((a["data-series"], x, y))
        dy = abs(my(y) - ry)
        worst = max(worst, dy)
        assert dy <= 1.0, ("y", dy, a)
        markers += 1
assert markers >= 50, markers
# The sweep's numbers are what is plotted: every point's certified upper and witnessed lower
# appears as a marker at its radius.
sweep = json.load(open(sys.argv[2]))
found = 0
for pt in sweep["points"]:
    c = pt["certificate"]
    for series, v in (("upper", c["upper_bound"]), ("lower", c["lower_bound"])):
        if v is None or v <= 0:
            continue
        assert (series, pt["radius_request"], v) in plotted, (series, pt["key"], v)
        found += 1
assert found == 2 * len(sweep["points"]) == 12, found
print(f"markers checked: {markers}, worst pixel error {worst:.3f}, sweep numbers found: {found}")
PY
check "every marker maps back to its numbers within a pixel, and they are the JSON's" "[ $? -eq 0 ]"

run_browser --screenshot="$tmp/shot.png" "file://$tmp/sw/report.html" >/dev/null 2>"$tmp/shot.err"
python3 - "$tmp/shot.png" <<'PY'
import struct, sys, zlib
data = open(sys.argv[1], "rb").read()
assert data[:8] == b"\x89PNG\r\n\x1a\n"
pos, idat, w, h, ctype = 8, b"", 0, 0, 0
while pos < len(data):
    n, kind = struct.unpack(">I4s", data[pos:pos + 8])
    body = data[pos + 8:pos + 8 + n]
    if kind == b"IHDR":
        w, h, depth, ctype = struct.unpack(">IIBB", body[:10])
        assert depth == 8 and ctype in (2, 6), (depth, ctype)
    elif kind == b"IDAT":
        idat += body
    pos += 12 + n
bpp = 3 if ctype == 2 else 4
raw = zlib.decompress(idat)
stride = w * bpp
prev = bytearray(stride)
nonwhite = 0
colours = set()
for y in range(h):
    f = raw[y * (stride + 1)]
    line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
    for i in range(stride):
        a = line[i - bpp] if i >= bpp else 0
        b = prev[i]
        c = prev[i - bpp] if i >= bpp else 0
        if f == 1: line[i] = (line[i] + a) & 255
        elif f == 2: line[i] = (line[i] + b) & 255
        elif f == 3: line[i] = (line[i] + (a + b) // 2) & 255
        elif f == 4:
            pa, pb, pc = abs(b - c), abs(a - c), abs(a + b - 2 * c)
            line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
    if y % 4 == 0:
        for x in range(0, w, 4):
            px = tuple(line[x * bpp:x * bpp + 3])
            colours.add(px)
            if px != (255, 255, 255): nonwhite += 1
    prev = line
sampled = (h // 4 + 1) * (w // 4 + 1)
frac = nonwhite / sampled
print(f"screenshot {w}x{h}: {len(colours)} colours, {100 * frac:.1f}% non-white")
assert len(colours) >= 8 and frac > 0.01, (len(colours), frac)
PY
check "the screenshot is not blank" "[ $? -eq 0 ]"
exit $fail
