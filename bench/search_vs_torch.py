#!/usr/bin/python3
"""Baseline for lipcert's witnessed lower-bound search: projected Adam ascent on the
Jacobian norm of an attention sublayer with PyTorch autograd, the way a PyTorch user
would do it, for a fixed wall-clock budget. Prints the best value found.

    /usr/bin/python3 bench/search_vs_torch.py --layer models/zoo/dot-layer0.safetensors \
        --centres models/zoo/dot-layer0-centres.safetensors --centre x0 \
        --set tokens --radius 0.5 --norm 2 --time 600 --batch 32 --threads 2

Layer: lipcert's native safetensors naming (scripts/train_zoo.py): q.*, k.* (dot only),
v.*, o.*, ln.* / post_ln.* and metadata kind / heads / causal / ln_eps / post_ln_eps; the
pre-LN sublayer X + MHA(LN(X)) when ln.weight is present, the post-LN sublayer
LN(X + MHA(X)) when post_ln.weight is. With --bert-layer a HuggingFace BERT checkpoint
directory: MHA alone (lipcert's --preset bert --attention-only), or with --post-ln the
sublayer the checkpoint defines, LN(X + MHA(X)) with the layer's attention.output.LayerNorm
(lipcert's --preset bert). Everything runs in float64.

--norm 2:   sigma_1 of J as an (ND) x (ND) operator on Frobenius norms; power iteration on
            J^T J (JVP by the double-backward trick, VJP by autograd) warm-started from the
            previous step, and the gradient of ||J(X) v|| with v held fixed (envelope theorem).
--norm inf: max_r ||row_r(J)||_1, estimated per step by Hager's iteration (rows by VJP), and
            the gradient of <e_r, J(X) s> with r, s = sign(row_r) held fixed.
The value printed is a floating estimate (no rigorous re-evaluation).
"""

import argparse
import math
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
import st  # noqa: E402


def load_bert_attention(path, layer, post_ln=False):
    """MHA alone (lipcert's --preset bert --attention-only) of a HuggingFace BERT checkpoint
    directory (config.json + model.safetensors): encoder layer `layer`'s self-attention; with
    post_ln its output LayerNorm too, as post_ln.* (the sublayer LN(X + MHA(X)))."""
    import json
    cfg = json.load(open(os.path.join(path, "config.json")))
    raw, _ = st.load(os.path.join(path, "model.safetensors"))
    pre = next(p for p in ("encoder.layer.", "bert.encoder.layer.") if any(k.startswith(p) for k in raw))
    base = f"{pre}{layer}.attention."
    names = {"q": "self.query", "k": "self.key", "v": "self.value", "o": "output.dense"}
    t = {}
    for short, hf in names.items():
        for part in ("weight", "bias"):
            key = base + hf + "." + part
            if key not in raw:
                sys.exit(f"search_vs_torch: {path}: tensor {key} not found")
            t[f"{short}.{part}"] = torch.from_numpy(raw[key].astype("float64"))
    eps = float(cfg.get("layer_norm_eps", 1e-12))
    if post_ln:
        for part in ("weight", "bias"):
            key = base + "output.LayerNorm." + part
            if key not in raw:
                sys.exit(f"search_vs_torch: {path}: tensor {key} not found")
            t[f"post_ln.{part}"] = torch.from_numpy(raw[key].astype("float64"))
    return t, "dot", int(cfg["num_attention_heads"]), False, eps, eps


def load_layer(path, bert_layer=None, post_ln=False):
    if bert_layer is not None:
        return load_bert_attention(path, bert_layer, post_ln)
    t, meta = st.load(path)
    t = {k: torch.from_numpy(v.astype("float64")) for k, v in t.items()}
    kind = meta.get("kind", "dot")
    heads = int(meta["heads"])
    causal = meta.get("causal", "false") == "true"
    eps = float(meta.get("ln_eps", "1e-5"))
    post_eps = float(meta.get("post_ln_eps", "1e-5"))
    return t, kind, heads, causal, eps, post_eps


def layer_norm(x, w, b, eps):
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + eps) * w + b


def make_forward(t, kind, heads, causal, eps, post_eps):
    wq = t["q.weight"]
    wk = t["k.weight"] if kind == "dot" else wq
    wv, wo = t["v.weight"], t["o.weight"]
    bq, bk, bv, bo = (t.get(k) for k in ("q.bias", "k.bias", "v.bias", "o.bias"))
    dk = wq.shape[0] // heads
    dv = wv.shape[0] // heads
    ln = "ln.weight" in t
    post_ln = "post_ln.weight" in t
    if ln and post_ln:
        sys.exit("search_vs_torch: a layer has ln.* or post_ln.*, not both")

    def f(x):  # (B, N, D) -> (B, N, D)
        B, N, D = x.shape
        z = x
        if ln:
            z = layer_norm(x, t["ln.weight"], t["ln.bias"], eps)
        q = (z @ wq.T).reshape(B, N, heads, dk).transpose(1, 2)  # (B, H, N, dk)
        if kind == "dot":
            if bq is not None:
                q = q + bq.reshape(heads, 1, dk)
            k = (z @ wk.T).reshape(B, N, heads, dk).transpose(1, 2)
            if bk is not None:
                k = k + bk.reshape(heads, 1, dk)
            s = q @ k.transpose(-1, -2) / math.sqrt(dk)
            v = (z @ wv.T).reshape(B, N, heads, dv).transpose(1, 2)
        else:
            sq = (q * q).sum(-1)
            s = -(sq[..., :, None] + sq[..., None, :] - 2 * q @ q.transpose(-1, -2)) / math.sqrt(dk)
            # head_h = P X A_h Wv_h^T with A_h = Wq_h^T Wq_h / sqrt(dk)
            vs = []
            for h in range(heads):
                wqh = wq[h * dk:(h + 1) * dk]
                a = wqh.T @ wqh / math.sqrt(dk)
                vs.append(z @ a @ wv[h * dv:(h + 1) * dv].T)
            v = torch.stack(vs, 1)
        if bv is not None:
            v = v + bv.reshape(heads, 1, dv)
        if causal:
            mask = torch.ones(N, N, dtype=torch.bool).tril()
            s = s.masked_fill(~mask, float("-inf"))
        p = torch.softmax(s, -1)
        out = (p @ v).transpose(1, 2).reshape(B, N, heads * dv) @ wo.T
        if bo is not None:
            out = out + bo
        if post_ln:
            return layer_norm(x + out, t["post_ln.weight"], t["post_ln.bias"], post_eps)
        return x + out if ln else out

    return f


def jvp_vjp(f, x, create_graph):
    """Returns (J v as a function of v, J^T u as a function of u) at x (batched)."""
    y = f(x)
    u0 = torch.zeros_like(y, requires_grad=True)
    g = torch.autograd.grad(y, x, u0, create_graph=True)[0]  # J^T u0, linear in u0

    def jv(v):
        return torch.autograd.grad(g, u0, v, retain_graph=True, create_graph=create_graph)[0]

    def jtu(u):
        return torch.autograd.grad(y, x, u, retain_graph=True)[0]

    return jv, jtu


def bnorm(t):
    return t.flatten(1).norm(dim=1)[:, None, None]


def project(x, x0, kind, r):
    d = x - x0
    if kind == "ball":
        n = bnorm(d)
        d = d * torch.clamp(r / torch.clamp(n, min=1e-300), max=1.0)
    elif kind == "tokens":
        n = d.norm(dim=-1, keepdim=True)
        d = d * torch.clamp(r / torch.clamp(n, min=1e-300), max=1.0)
    else:
        d = d.clamp(-r, r)
    return x0 + d


def sample(x0, kind, r, batch, gen):
    B, (N, D) = batch, x0.shape
    g = torch.randn(B, N, D, generator=gen, dtype=torch.float64)
    if kind == "ball":
        d = g / bnorm(g) * r * torch.rand(B, 1, 1, generator=gen, dtype=torch.float64) ** (1.0 / (N * D))
    elif kind == "tokens":
        d = g / g.norm(dim=-1, keepdim=True) * r * torch.rand(B, N, 1, generator=gen, dtype=torch.float64) ** (1.0 / D)
    else:
        d = (2 * torch.rand(B, N, D, generator=gen, dtype=torch.float64) - 1) * r
    out = x0 + d
    out[0] = x0  # the centre is always one of the starts
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layer", required=True, help="native safetensors file, or with --bert-layer a BERT checkpoint dir")
    ap.add_argument("--bert-layer", type=int, default=None,
                    help="encoder layer of a HuggingFace BERT checkpoint directory: its attention alone")
    ap.add_argument("--post-ln", action="store_true",
                    help="with --bert-layer: the post-LN sublayer LN(X + MHA(X)) with the layer's "
                         "attention.output.LayerNorm (lipcert's --preset bert without --attention-only)")
    ap.add_argument("--centres", required=True)
    ap.add_argument("--centre", default="x0")
    ap.add_argument("--set", choices=["ball", "tokens", "box"], default="tokens")
    ap.add_argument("--radius", type=float, default=0.5)
    ap.add_argument("--relative-radius", type=float, default=None,
                    help="radius as a fraction of ||X0||_F (as lipcert's --relative-radius); overrides --radius")
    ap.add_argument("--norm", choices=["2", "inf"], default="2")
    ap.add_argument("--time", type=float, default=600.0, help="seconds")
    ap.add_argument("--batch", type=int, default=32, help="ascent starts, run as one batch")
    ap.add_argument("--power-iters", type=int, default=5, help="power iterations per step (warm)")
    ap.add_argument("--lr", type=float, default=None, help="Adam step (default radius/20)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    if a.post_ln and a.bert_layer is None:
        sys.exit("search_vs_torch: --post-ln needs --bert-layer (a native file says post_ln.* itself)")
    t, kind, heads, causal, eps, post_eps = load_layer(a.layer, a.bert_layer, a.post_ln)
    ct, _ = st.load(a.centres)
    if a.centre not in ct:
        sys.exit(f"search_vs_torch: {a.centres}: tensor {a.centre} not found")
    x0 = torch.from_numpy(ct[a.centre].astype("float64"))
    if a.relative_radius is not None:
        a.radius = a.relative_radius * x0.norm().item()
    f = make_forward(t, kind, heads, causal, eps, post_eps)
    gen = torch.Generator().manual_seed(a.seed)
    B = a.batch
    x = sample(x0, a.set, a.radius, B, gen).requires_grad_(True)
    opt = torch.optim.Adam([x], lr=a.lr if a.lr else a.radius / 20)
    v = torch.randn(x.shape, generator=gen, dtype=torch.float64)
    v = v / bnorm(v)
    row = None
    best, best_at = -1.0, 0.0
    t0 = time.perf_counter()
    steps = 0
    while time.perf_counter() - t0 < a.time:
        jv, jtu = jvp_vjp(f, x, create_graph=True)
        if a.norm == "2":
            for _ in range(a.power_iters):
                w = jv(v).detach()
                g = jtu(w).detach()
                v = g / torch.clamp(bnorm(g), min=1e-300)
            val = bnorm(jv(v))[:, 0, 0]  # differentiable in x
        else:
            n_out = x[0].numel()
            if row is None:
                row = torch.zeros(B, dtype=torch.long)
            for _ in range(2):  # Hager steps on J^T: rows by VJP, the next row by JVP
                e = torch.zeros(B, n_out, dtype=torch.float64)
                e[torch.arange(B), row] = 1
                y = jtu(e.reshape(x.shape)).detach()
                s = torch.sign(y) + (y == 0)
                z = jv(s).detach().flatten(1)
                row = z.abs().argmax(1)
            e = torch.zeros(B, n_out, dtype=torch.float64)
            e[torch.arange(B), row] = 1
            s = torch.sign(jtu(e.reshape(x.shape)).detach())
            val = (jv(s).flatten(1) * e).sum(1)  # <e_r, J s> = ||row_r||_1, differentiable in x
        vmax, imax = val.detach().max(0)
        if vmax.item() > best:
            best, best_at = vmax.item(), time.perf_counter() - t0
        opt.zero_grad()
        (-val.sum()).backward()
        opt.step()
        with torch.no_grad():
            x.copy_(project(x, x0, a.set, a.radius))
        steps += 1
    el = time.perf_counter() - t0
    what = "sublayer" if ("ln.weight" in t or "post_ln.weight" in t) else "mha"
    print(f"layer={os.path.basename(a.layer)} bert_layer={a.bert_layer} {what} centre={a.centre} set={a.set} radius={a.radius} "
          f"norm={a.norm} batch={B} steps={steps} elapsed={el:.1f}s best={best:.6f} "
          f"(reached at {best_at:.1f}s)")


if __name__ == "__main__":
    main()
