#!/usr/bin/python3
"""Writes a random BERT-base-sized attention layer (D = 768, 12 heads, native naming,
biases, no mask) and a random centre (N = 128 tokens) for the scale check of the certify
issue. Usage: scripts/bert_size_checkpoint.py OUT_DIR   (needs numpy)."""
import os, sys
import numpy as np
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import st

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
rng = np.random.default_rng(0)
d, h, n = 768, 12, 128
w = lambda r, c: rng.normal(0, 1 / np.sqrt(c), (r, c))
b = lambda r: rng.normal(0, 0.02, (r,))
st.save(os.path.join(out, "bert-size.safetensors"),
        {"q.weight": w(d, d), "q.bias": b(d), "k.weight": w(d, d), "k.bias": b(d),
         "v.weight": w(d, d), "v.bias": b(d), "o.weight": w(d, d), "o.bias": b(d)},
        {"kind": "dot", "heads": str(h), "causal": "false"})
st.save(os.path.join(out, "centre.safetensors"), {"x0": rng.normal(0, 1, (n, d))})
