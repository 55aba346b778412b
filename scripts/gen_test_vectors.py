#!/usr/bin/python3
"""Writes the reference test vectors of tests/data: small random attention layers in every
checkpoint preset lipcert reads, with torch-computed (float64) forward values, a Jacobian-
vector product, a vector-Jacobian product and, for small sizes, the full Jacobian.

    PYTHONPATH=<dir with transformers> scripts/gen_test_vectors.py     # see docs/zoo.md

Presets and what the reference function of one layer is:
  native     lipcert's own naming (q/k/v/o.weight|bias, ln.*; metadata kind, heads, causal,
             ln_eps); the reference is written here from the formulas of docs/math.md.
  torch-mha  a torch.nn.MultiheadAttention(batch_first=True, bias=True) state_dict; the
             reference is the module itself, mha(x, x, x, need_weights=False)[0].
  bert       a HuggingFace BertModel state_dict (encoder.layer.{i}.attention.self.
             {query,key,value}.*, attention.output.dense.*); BERT is post-LN, so the MHA part
             is self-attention followed by output.dense, no residual and no LayerNorm.
  gpt2       a HuggingFace GPT2Model state_dict (h.{i}.attn.c_attn.* and c_proj.* in Conv1D
             layout: weight (in, out), applied as x @ W + b; causal); pre-LN, so the
             reference is x + attn(ln_1(x)).
For bert and gpt2 the reference is the transformers module (needs `transformers` importable:
`/usr/bin/python3 -m pip install --target DIR transformers==4.36.2`, then drop DIR/numpy so that
Debian's numpy is used, and PYTHONPATH=DIR); an independent re-implementation from the
documented layout is checked against it. With --mimic-hf the re-implementation alone is used
and only the attention tensors are written.

Layout: tests/data/checkpoints/<case>/model.safetensors (+ config.json) and
tests/data/vectors/<case>.safetensors: x, y, v, jv, u, jtu (and jacobian, (N*D) x (N*D)
row-major flattening i*D + a, when N*D <= 64), all F64; metadata: case, preset, layer, kind,
heads, causal, residual, reference.
"""

import argparse
import json
import math
import os
import shutil
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import st  # noqa: E402

JACOBIAN_MAX = 64  # write the full Jacobian when N * D <= this
LN_EPS = 1e-5


def f32_exact(t):
    """Rounds to float32 and back, so that a checkpoint stored in F32 holds exactly the
    values the float64 reference uses."""
    return t.float().double()


# ---------------------------------------------------------------- native (lipcert naming)

def native_reference(p, meta):
    """f(X) for a native layer, written from docs/math.md (not from models/forward.h)."""
    heads = int(meta["heads"])
    kind = meta["kind"]
    causal = meta["causal"] == "true"
    wq = p["q.weight"]
    wk = p["k.weight"] if kind == "dot" else wq
    wv, wo = p["v.weight"], p["o.weight"]
    dk, dv = wq.shape[0] // heads, wv.shape[0] // heads

    def f(x):
        n = x.shape[0]
        z = x
        if "ln.weight" in p:
            z = F.layer_norm(x, (x.shape[1],), p["ln.weight"], p["ln.bias"], float(meta["ln_eps"]))
        out = torch.zeros(n, wo.shape[0], dtype=x.dtype)
        for h in range(heads):
            sq, sv = slice(h * dk, (h + 1) * dk), slice(h * dv, (h + 1) * dv)
            q = z @ wq[sq].T
            if kind == "dot":
                if "q.bias" in p:
                    q = q + p["q.bias"][sq]
                k = z @ wk[sq].T
                if "k.bias" in p:
                    k = k + p["k.bias"][sq]
                s = q @ k.T / math.sqrt(dk)
                v = z @ wv[sv].T
            else:
                diff = q.unsqueeze(1) - q.unsqueeze(0)  # (n, n, dk)
                s = -(diff * diff).sum(-1) / math.sqrt(dk)
                a = wq[sq].T @ wq[sq] / math.sqrt(dk)
                v = z @ a @ wv[sv].T
            if "v.bias" in p:
                v = v + p["v.bias"][sv]
            if causal:
                s = s.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
            out = out + torch.softmax(s, dim=-1) @ v @ wo[:, sv].T
        if "o.bias" in p:
            out = out + p["o.bias"]
        return x + out if "ln.weight" in p else out

    return f


def make_native(case, gen, out_dir):
    kind, d, heads = case["kind"], case["d"], case["heads"]
    dk = case.get("dk", d // heads)
    dv = case.get("dv", dk)
    sc = case.get("weight_scale", 1.0)
    rn = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64)  # noqa: E731
    p = {"q.weight": rn(heads * dk, d) * sc / math.sqrt(d),
         "v.weight": rn(heads * dv, d) / math.sqrt(d),
         "o.weight": rn(d, heads * dv) / math.sqrt(heads * dv)}
    if kind == "dot":
        p["k.weight"] = rn(heads * dk, d) * sc / math.sqrt(d)
    for b in case.get("biases", []):
        size = {"q": heads * dk, "k": heads * dk, "v": heads * dv, "o": d}[b]
        p[f"{b}.bias"] = 0.5 * rn(size)
    meta = {"kind": kind, "heads": str(heads), "causal": "true" if case.get("causal") else "false"}
    if case.get("ln"):
        p["ln.weight"] = 1.0 + 0.3 * rn(d)
        p["ln.bias"] = 0.3 * rn(d)
        meta["ln_eps"] = repr(LN_EPS)
    st.save(os.path.join(out_dir, "model.safetensors"), {k: v.numpy() for k, v in p.items()}, meta)
    ref = native_reference(p, meta)
    info = {"kind": kind, "heads": heads, "causal": bool(case.get("causal")), "residual": bool(case.get("ln")),
            "reference": "scripts/gen_test_vectors.py native_reference (torch float64, from docs/math.md)"}
    return ref, info


# ---------------------------------------------------------------- torch.nn.MultiheadAttention

def make_torch_mha(case, gen, out_dir):
    d, heads = case["d"], case["heads"]
    mha = nn.MultiheadAttention(d, heads, bias=True, batch_first=True, dtype=torch.float64)
    with torch.no_grad():
        for name, t in mha.named_parameters():
            scale = 0.5 if name.endswith("bias") else 1.0 / math.sqrt(d)
            t.copy_(f32_exact(torch.randn(t.shape, generator=gen, dtype=torch.float64) * scale))
    mha.eval()
    sd = {k: v.detach().float().numpy() for k, v in mha.state_dict().items()}
    st.save(os.path.join(out_dir, "model.safetensors"), sd, {"format": "pt"})
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump({"num_attention_heads": heads, "hidden_size": d, "batch_first": True}, f, indent=2)

    def ref(x):
        return mha(x.unsqueeze(0), x.unsqueeze(0), x.unsqueeze(0), need_weights=False)[0][0]

    # Independent check of the layout: in_proj_weight = [Wq; Wk; Wv], out_proj = Wo.
    w, b = mha.in_proj_weight.detach(), mha.in_proj_bias.detach()
    p = {"q.weight": w[:d], "k.weight": w[d : 2 * d], "v.weight": w[2 * d :],
         "q.bias": b[:d], "k.bias": b[d : 2 * d], "v.bias": b[2 * d :],
         "o.weight": mha.out_proj.weight.detach(), "o.bias": mha.out_proj.bias.detach()}
    alt = native_reference(p, {"kind": "dot", "heads": str(heads), "causal": "false"})
    info = {"kind": "dot", "heads": heads, "causal": False, "residual": False,
            "reference": f"torch {torch.__version__} nn.MultiheadAttention(batch_first=True), need_weights=False"}
    return ref, info, alt


# ---------------------------------------------------------------- HuggingFace BERT / GPT-2

def randomise_(module, gen, names, weight_scale, bias_scale=0.5):
    """Redraws the named parameters (HF initialises biases to 0 and weights at std 0.02,
    which would leave the bias paths untested and the softmax nearly uniform)."""
    with torch.no_grad():
        for name, t in module.named_parameters():
            if not any(n in name for n in names):
                continue
            if name.endswith("LayerNorm.weight") or name.endswith("ln_1.weight"):
                t.copy_(f32_exact(1.0 + 0.3 * torch.randn(t.shape, generator=gen, dtype=torch.float64)))
            elif name.endswith("bias"):
                t.copy_(f32_exact(bias_scale * torch.randn(t.shape, generator=gen, dtype=torch.float64)))
            else:
                t.copy_(f32_exact(weight_scale * torch.randn(t.shape, generator=gen, dtype=torch.float64)))


def save_state_dict(model, out_dir, config):
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()
          if v.dtype.is_floating_point and not k.endswith(".attn.bias") and not k.endswith(".attn.masked_bias")}
    st.save(os.path.join(out_dir, "model.safetensors"), sd, {"format": "pt"})
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
    return sd


def bert_alt(sd, layer, heads):
    pre = f"encoder.layer.{layer}.attention."
    t = lambda k: torch.from_numpy(sd[pre + k]).double()  # noqa: E731
    p = {"q.weight": t("self.query.weight"), "q.bias": t("self.query.bias"),
         "k.weight": t("self.key.weight"), "k.bias": t("self.key.bias"),
         "v.weight": t("self.value.weight"), "v.bias": t("self.value.bias"),
         "o.weight": t("output.dense.weight"), "o.bias": t("output.dense.bias")}
    return native_reference(p, {"kind": "dot", "heads": str(heads), "causal": "false"})


def gpt2_alt(sd, layer, heads, eps):
    pre = f"h.{layer}."
    t = lambda k: torch.from_numpy(sd[pre + k]).double()  # noqa: E731
    w, b = t("attn.c_attn.weight"), t("attn.c_attn.bias")  # Conv1D: (D, 3D), y = x @ W + b
    d = w.shape[0]
    p = {"q.weight": w[:, :d].T, "k.weight": w[:, d : 2 * d].T, "v.weight": w[:, 2 * d :].T,
         "q.bias": b[:d], "k.bias": b[d : 2 * d], "v.bias": b[2 * d :],
         "o.weight": t("attn.c_proj.weight").T, "o.bias": t("attn.c_proj.bias"),
         "ln.weight": t("ln_1.weight"), "ln.bias": t("ln_1.bias")}
    return native_reference(p, {"kind": "dot", "heads": str(heads), "causal": "true", "ln_eps": repr(eps)})


def make_bert(case, gen, out_dir, mimic):
    d, heads, layer, n = case["d"], case["heads"], case["layer"], case["n"]
    config = {"model_type": "bert", "hidden_size": d, "num_attention_heads": heads, "num_hidden_layers": 2,
              "intermediate_size": 2 * d, "vocab_size": 11, "max_position_embeddings": max(n, 8),
              "type_vocab_size": 2, "layer_norm_eps": 1e-12, "hidden_act": "gelu",
              "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1, "architectures": ["BertModel"]}
    if mimic:
        sd = {}
        for i in range(2):
            pre = f"encoder.layer.{i}.attention."
            for k in ["self.query", "self.key", "self.value", "output.dense"]:
                sd[pre + k + ".weight"] = (torch.randn(d, d, generator=gen, dtype=torch.float64) / math.sqrt(d)).float().numpy()
                sd[pre + k + ".bias"] = (0.5 * torch.randn(d, generator=gen, dtype=torch.float64)).float().numpy()
            sd[pre + "output.LayerNorm.weight"] = np.ones(d, np.float32)
            sd[pre + "output.LayerNorm.bias"] = np.zeros(d, np.float32)
        st.save(os.path.join(out_dir, "model.safetensors"), sd, {"format": "pt"})
        with open(os.path.join(out_dir, "config.json"), "w") as f:
            json.dump(config, f, indent=2, sort_keys=True)
        ref = bert_alt(sd, layer, heads)
        info = {"reference": "mimic: scripts/gen_test_vectors.py bert_alt (no transformers)"}
        alt = None
    else:
        import transformers
        from transformers import BertConfig, BertModel

        cfg = BertConfig(**{k: v for k, v in config.items() if k not in ("model_type",)})
        cfg._attn_implementation = "eager"
        model = BertModel(cfg).double()
        randomise_(model, gen, [f"encoder.layer.{i}.attention." for i in range(2)], 1.0 / math.sqrt(d))
        # Everything else (embeddings, MLP) only needs float32-exact values.
        with torch.no_grad():
            for t in model.parameters():
                t.copy_(f32_exact(t))
        model.eval()
        sd = save_state_dict(model, out_dir, json.loads(cfg.to_json_string()))
        att = model.encoder.layer[layer].attention

        def ref(x):
            return att.output.dense(att.self(x.unsqueeze(0))[0])[0]

        alt = bert_alt(sd, layer, heads)
        info = {"reference": f"transformers {transformers.__version__} BertSelfAttention + BertSelfOutput.dense"}
    info.update({"kind": "dot", "heads": heads, "causal": False, "residual": False})
    return ref, info, alt


def make_gpt2(case, gen, out_dir, mimic):
    d, heads, layer, n = case["d"], case["heads"], case["layer"], case["n"]
    eps = 1e-5
    config = {"model_type": "gpt2", "n_embd": d, "n_head": heads, "n_layer": 2, "n_positions": max(n, 8),
              "n_inner": None, "vocab_size": 13, "layer_norm_epsilon": eps, "activation_function": "gelu_new",
              "architectures": ["GPT2Model"]}
    if mimic:
        sd = {}
        for i in range(2):
            pre = f"h.{i}."
            sd[pre + "ln_1.weight"] = (1 + 0.3 * torch.randn(d, generator=gen, dtype=torch.float64)).float().numpy()
            sd[pre + "ln_1.bias"] = (0.3 * torch.randn(d, generator=gen, dtype=torch.float64)).float().numpy()
            sd[pre + "attn.c_attn.weight"] = (torch.randn(d, 3 * d, generator=gen, dtype=torch.float64) / math.sqrt(d)).float().numpy()
            sd[pre + "attn.c_attn.bias"] = (0.5 * torch.randn(3 * d, generator=gen, dtype=torch.float64)).float().numpy()
            sd[pre + "attn.c_proj.weight"] = (torch.randn(d, d, generator=gen, dtype=torch.float64) / math.sqrt(d)).float().numpy()
            sd[pre + "attn.c_proj.bias"] = (0.5 * torch.randn(d, generator=gen, dtype=torch.float64)).float().numpy()
        st.save(os.path.join(out_dir, "model.safetensors"), sd, {"format": "pt"})
        with open(os.path.join(out_dir, "config.json"), "w") as f:
            json.dump(config, f, indent=2, sort_keys=True)
        ref = gpt2_alt(sd, layer, heads, eps)
        info = {"reference": "mimic: scripts/gen_test_vectors.py gpt2_alt (no transformers)"}
        alt = None
    else:
        import transformers
        from transformers import GPT2Config, GPT2Model

        cfg = GPT2Config(**{k: v for k, v in config.items() if k not in ("model_type",)})
        cfg._attn_implementation = "eager"
        model = GPT2Model(cfg).double()
        randomise_(model, gen, [f"h.{i}.attn." for i in range(2)] + [f"h.{i}.ln_1." for i in range(2)],
                   1.0 / math.sqrt(d))
        with torch.no_grad():
            for t in model.parameters():
                t.copy_(f32_exact(t))
        model.eval()
        sd = save_state_dict(model, out_dir, json.loads(cfg.to_json_string()))
        blk = model.h[layer]

        def ref(x):
            return x + blk.attn(blk.ln_1(x.unsqueeze(0)))[0][0]

        alt = gpt2_alt(sd, layer, heads, eps)
        info = {"reference": f"transformers {transformers.__version__} GPT2Block: x + attn(ln_1(x))"}
    info.update({"kind": "dot", "heads": heads, "causal": True, "residual": True})
    return ref, info, alt


# ---------------------------------------------------------------- cases

CASES = [
    {"name": "native-dot", "preset": "native", "kind": "dot", "n": 5, "d": 8, "heads": 2,
     "biases": ["q", "k", "v", "o"]},
    {"name": "native-dot-nobias", "preset": "native", "kind": "dot", "n": 3, "d": 4, "heads": 2},
    {"name": "native-dot-rect", "preset": "native", "kind": "dot", "n": 4, "d": 6, "heads": 2, "dk": 3, "dv": 5,
     "biases": ["q", "v"]},
    {"name": "native-dot-causal", "preset": "native", "kind": "dot", "n": 6, "d": 6, "heads": 2, "causal": True,
     "biases": ["q", "k", "v", "o"]},
    {"name": "native-dot-ln", "preset": "native", "kind": "dot", "n": 4, "d": 8, "heads": 2, "ln": True,
     "biases": ["q", "k", "v", "o"], "x_shift": 1.5},
    {"name": "native-l2", "preset": "native", "kind": "l2", "n": 5, "d": 8, "heads": 2},
    {"name": "native-l2-causal", "preset": "native", "kind": "l2", "n": 4, "d": 6, "heads": 2, "causal": True,
     "biases": ["v", "o"]},
    {"name": "native-l2-ln", "preset": "native", "kind": "l2", "n": 4, "d": 8, "heads": 2, "ln": True,
     "biases": ["v", "o"], "x_shift": -1.0},
    {"name": "torch-mha", "preset": "torch-mha", "kind": "dot", "n": 5, "d": 8, "heads": 2},
    {"name": "bert", "preset": "bert", "kind": "dot", "n": 4, "d": 12, "heads": 2, "layer": 0},
    {"name": "gpt2", "preset": "gpt2", "kind": "dot", "n": 6, "d": 8, "heads": 2, "layer": 1},
    {"name": "native-dot-ln-large", "preset": "native", "kind": "dot", "n": 16, "d": 32, "heads": 4, "ln": True,
     "causal": True, "biases": ["q", "k", "v", "o"]},
    {"name": "gpt2-large", "preset": "gpt2", "kind": "dot", "n": 16, "d": 32, "heads": 4, "layer": 1},
]


def write_case(case, seed, root, mimic):
    name, preset = case["name"], case["preset"]
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)  # transformers initialises the non-attention parameters from the global RNG
    ckpt_dir = os.path.join(root, "checkpoints", name)
    shutil.rmtree(ckpt_dir, ignore_errors=True)
    os.makedirs(ckpt_dir)
    alt = None
    if preset == "native":
        ref, info = make_native(case, gen, ckpt_dir)
    elif preset == "torch-mha":
        ref, info, alt = make_torch_mha(case, gen, ckpt_dir)
    elif preset == "bert":
        ref, info, alt = make_bert(case, gen, ckpt_dir, mimic)
    elif preset == "gpt2":
        ref, info, alt = make_gpt2(case, gen, ckpt_dir, mimic)
    else:
        raise ValueError(preset)
    n, d = case["n"], case["d"]
    x = torch.randn(n, d, generator=gen, dtype=torch.float64) + case.get("x_shift", 0.0)
    v = torch.randn(n, d, generator=gen, dtype=torch.float64)
    u = torch.randn(n, d, generator=gen, dtype=torch.float64)
    with torch.no_grad():
        y = ref(x)
    y1, jv = torch.autograd.functional.jvp(ref, x, v)
    y2, jtu = torch.autograd.functional.vjp(ref, x, u)
    assert torch.equal(y, y1.detach()) and torch.equal(y, y2.detach())
    out = {"x": x, "y": y, "v": v, "jv": jv, "u": u, "jtu": jtu}
    if n * d <= JACOBIAN_MAX:
        jac = torch.autograd.functional.jacobian(ref, x).reshape(n * d, n * d)
        assert torch.allclose(jac @ v.reshape(-1), jv.reshape(-1), rtol=1e-12, atol=1e-12)
        assert torch.allclose(jac.T @ u.reshape(-1), jtu.reshape(-1), rtol=1e-12, atol=1e-12)
        out["jacobian"] = jac
    # Finite-difference sanity of the JVP (catches a reference that is not the function).
    h = 1e-6
    with torch.no_grad():
        fd = (ref(x + h * v) - ref(x - h * v)) / (2 * h)
    fd_err = (fd - jv).norm() / jv.norm()
    assert fd_err < 1e-7, f"{name}: central difference vs jvp {fd_err:.2e}"
    alt_err = None
    if alt is not None:  # the documented layout reproduces the real module
        with torch.no_grad():
            alt_err = ((alt(x) - y).norm() / y.norm()).item()
        assert alt_err < 1e-13, f"{name}: layout re-implementation differs from the module by {alt_err:.2e}"
    meta = {"case": name, "preset": preset, "layer": str(case.get("layer", 0)), "kind": info["kind"],
            "heads": str(info["heads"]), "causal": "true" if info["causal"] else "false",
            "residual": "true" if info["residual"] else "false", "reference": info["reference"],
            "seed": str(seed), "generator": "scripts/gen_test_vectors.py"}
    st.save(os.path.join(root, "vectors", name + ".safetensors"),
            {k: t.detach().numpy().astype(np.float64) for k, t in out.items()}, meta)
    extra = f", layout re-implementation {alt_err:.1e}" if alt_err is not None else ""
    print(f"{name:22s} preset {preset:9s} N={n:2d} D={d:2d} H={info['heads']} "
          f"jacobian={'yes' if 'jacobian' in out else 'no '} fd {fd_err:.1e}{extra}")


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(here, "..", "tests", "data"), help="tests/data folder")
    ap.add_argument("--mimic-hf", action="store_true",
                    help="without transformers: write bert/gpt2 from the layout re-implementation only")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if not args.mimic_hf:
        try:
            import transformers  # noqa: F401
        except ImportError:
            sys.exit("gen_test_vectors.py: transformers is not importable; see the docstring, or pass --mimic-hf")
    os.makedirs(os.path.join(args.out, "vectors"), exist_ok=True)
    for i, case in enumerate(CASES):
        write_case(case, 1000 + i, args.out, args.mimic_hf)


if __name__ == "__main__":
    main()
