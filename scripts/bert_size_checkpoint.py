#!/usr/bin/python3
"""Writes a random BERT-base-sized attention layer (D = 768, 12 heads, native naming,
biases, no mask) and a random centre (N = 128 tokens) for the scale check of the certify
issue. With --pre-ln the layer is GPT-2's pre-LN sublayer X + MHA(LN(X)): a LayerNorm in
front (ln.weight about 1, ln.bias about 0, as a trained model's; eps 1e-5), the attention
weights and the centre the same as without it.
Usage: scripts/bert_size_checkpoint.py OUT_DIR [--pre-ln]   (needs numpy)."""
import os, sys
import numpy as np
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import st

args = [a for a in sys.argv[1:] if a != "--pre-ln"]
pre_ln = len(args) < len(sys.argv) - 1
if len(args) != 1:
    sys.exit("usage: scripts/bert_size_checkpoint.py OUT_DIR [--pre-ln]")
out = args[0]
os.makedirs(out, exist_ok=True)
rng = np.random.default_rng(0)
d, h, n = 768, 12, 128
w = lambda r, c: rng.normal(0, 1 / np.sqrt(c), (r, c))
b = lambda r: rng.normal(0, 0.02, (r,))
tensors = {"q.weight": w(d, d), "q.bias": b(d), "k.weight": w(d, d), "k.bias": b(d),
           "v.weight": w(d, d), "v.bias": b(d), "o.weight": w(d, d), "o.bias": b(d)}
meta = {"kind": "dot", "heads": str(h), "causal": "false"}
if pre_ln:
    # Its own generator, so the attention weights and the centre match the MHA-alone file.
    ln_rng = np.random.default_rng(1)
    tensors["ln.weight"] = ln_rng.normal(1.0, 0.1, (d,))
    tensors["ln.bias"] = ln_rng.normal(0.0, 0.05, (d,))
    meta["ln_eps"] = "1e-5"
st.save(os.path.join(out, "bert-size.safetensors"), tensors, meta)
st.save(os.path.join(out, "centre.safetensors"), {"x0": rng.normal(0, 1, (n, d))})
