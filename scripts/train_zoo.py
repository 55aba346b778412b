#!/usr/bin/python3
"""Trains the two small character-level Transformer LMs of models/zoo and exports their
attention sublayers in lipcert's native safetensors naming.

    nice scripts/train_zoo.py            # writes models/zoo/*.safetensors, train-log.txt

Text: the licence texts Debian ships in /usr/share/common-licenses (read at training time,
never committed). Tokens: printable ASCII 32..126, newline, and one "other" token (97).

Model (both kinds): token + learned position embedding, D = 64, two pre-LN blocks
    x = x + attn(ln1(x));  x = x + mlp(ln2(x))     (mlp: 64 -> 256 -> 64, GELU)
then a final LayerNorm and a linear head. Attention has 4 heads (dk = dv = 16) and a
causal mask:
    dot: P^h = softmax((X Wq_h^T + bq_h)(X Wk_h^T + bk_h)^T / sqrt(dk)),  head_h = P^h (X Wv_h^T + bv_h)
    l2 (Kim et al. 2021): tied Wk = Wq, no query/key bias,
         P^h_ij ∝ exp(-||x_i Wq_h^T - x_j Wq_h^T||^2 / sqrt(dk)),
         head_h = P^h X A_h Wv_h^T + bv_h,   A_h = Wq_h^T Wq_h / sqrt(dk)
    out = [head_1 .. head_H] Wo^T + bo.

Outputs per model m in {dot, l2} and layer i in {0, 1}:
  models/zoo/{m}-layer{i}.safetensors          the sublayer X + MHA(ln1(X)): q.*, k.* (dot
                                               only), v.*, o.*, ln.* (F32, as trained);
                                               metadata kind, heads, causal, ln_eps
  models/zoo/{m}-layer{i}-centres.safetensors  x0..x3 (F64, 32 x 64): the hidden states that
                                               enter layer i for four fixed validation windows
  models/zoo/train-log.txt                     final train / validation losses
  tests/data/zoo/{m}-layer{i}-expected.safetensors   torch float64 outputs y0..y3 at the centres,
                                               and J v, J^T u at x0 (for the C++ tests)
The exported file is read back and evaluated with an independent numpy float64 forward, which
must match the torch sublayer (in float64) to 1e-12 relative on every centre.
"""

import argparse
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import st  # noqa: E402

LICENCES = [
    "Apache-2.0", "Artistic", "BSD", "CC0-1.0", "GFDL-1.2", "GFDL-1.3", "GPL-1", "GPL-2",
    "GPL-3", "LGPL-2", "LGPL-2.1", "LGPL-3", "MPL-1.1", "MPL-2.0",
]
VOCAB = 97          # 0..94: chr(32..126), 95: '\n', 96: anything else
D_MODEL = 64
HEADS = 4
CONTEXT = 32
LAYERS = 2
LN_EPS = 1e-5
SEED = 1234
N_CENTRES = 4


def encode_text(text):
    out = np.empty(len(text), dtype=np.int64)
    for i, c in enumerate(text):
        o = ord(c)
        out[i] = o - 32 if 32 <= o <= 126 else (95 if c == "\n" else 96)
    return out


def decode_tokens(tokens):
    return "".join(chr(t + 32) if t < 95 else ("\n" if t == 95 else "?") for t in tokens)


def load_corpus(folder):
    """Train / validation token arrays: the last 10% of every licence is validation."""
    train, val = [], []
    for name in LICENCES:
        path = os.path.join(folder, name)
        with open(path, encoding="utf-8", errors="replace") as f:
            toks = encode_text(f.read())
        cut = int(len(toks) * 0.9)
        train.append(toks[:cut])
        val.append(toks[cut:])
    return np.concatenate(train), val


class Attention(nn.Module):
    def __init__(self, kind):
        super().__init__()
        self.kind = kind
        self.dk = D_MODEL // HEADS
        self.q = nn.Linear(D_MODEL, D_MODEL, bias=(kind == "dot"))
        if kind == "dot":
            self.k = nn.Linear(D_MODEL, D_MODEL, bias=True)
        self.v = nn.Linear(D_MODEL, D_MODEL, bias=True)
        self.o = nn.Linear(D_MODEL, D_MODEL, bias=True)

    def forward(self, x):
        b, t, _ = x.shape
        h, dk = HEADS, self.dk
        q = self.q(x).view(b, t, h, dk).transpose(1, 2)  # (b, h, t, dk)
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        if self.kind == "dot":
            k = self.k(x).view(b, t, h, dk).transpose(1, 2)
            logits = q @ k.transpose(-1, -2) / math.sqrt(dk)
            v = self.v(x).view(b, t, h, dk).transpose(1, 2)
        else:
            sq = (q * q).sum(-1)
            dist2 = sq.unsqueeze(-1) + sq.unsqueeze(-2) - 2.0 * (q @ q.transpose(-1, -2))
            logits = -dist2 / math.sqrt(dk)
            # X A_h Wv_h^T = (X Wq_h^T) Wq_h Wv_h^T / sqrt(dk)
            wq = self.q.weight.view(h, dk, D_MODEL)
            wv = self.v.weight.view(h, dk, D_MODEL)
            m = torch.einsum("hcd,hed->hce", wq, wv) / math.sqrt(dk)  # Wq_h Wv_h^T: (h, dk, dv)
            v = torch.einsum("bhtc,hce->bhte", q, m) + self.v.bias.view(1, h, 1, dk)
        logits = logits.masked_fill(~mask, float("-inf"))
        p = torch.softmax(logits, dim=-1)
        heads = (p @ v).transpose(1, 2).reshape(b, t, D_MODEL)
        return self.o(heads)


class Block(nn.Module):
    def __init__(self, kind):
        super().__init__()
        self.ln1 = nn.LayerNorm(D_MODEL, eps=LN_EPS)
        self.attn = Attention(kind)
        self.ln2 = nn.LayerNorm(D_MODEL, eps=LN_EPS)
        self.mlp = nn.Sequential(nn.Linear(D_MODEL, 4 * D_MODEL), nn.GELU(), nn.Linear(4 * D_MODEL, D_MODEL))

    def sublayer(self, x):
        return x + self.attn(self.ln1(x))

    def forward(self, x):
        x = self.sublayer(x)
        return x + self.mlp(self.ln2(x))


class CharLM(nn.Module):
    def __init__(self, kind):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, D_MODEL)
        self.pos = nn.Embedding(CONTEXT, D_MODEL)
        self.blocks = nn.ModuleList([Block(kind) for _ in range(LAYERS)])
        self.ln_f = nn.LayerNorm(D_MODEL, eps=LN_EPS)
        self.head = nn.Linear(D_MODEL, VOCAB)

    def hidden_states(self, idx):
        """The residual stream entering each block, and the final one."""
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        states = [x]
        for blk in self.blocks:
            x = blk(x)
            states.append(x)
        return states

    def forward(self, idx):
        return self.head(self.ln_f(self.hidden_states(idx)[-1]))


def batch(data, rng, size):
    starts = rng.integers(0, len(data) - CONTEXT - 1, size=size)
    x = np.stack([data[s : s + CONTEXT] for s in starts])
    y = np.stack([data[s + 1 : s + CONTEXT + 1] for s in starts])
    return torch.from_numpy(x), torch.from_numpy(y)


def windows(data):
    """Every non-overlapping window of a token array (input, target)."""
    n = (len(data) - 1) // CONTEXT
    x = np.stack([data[i * CONTEXT : (i + 1) * CONTEXT] for i in range(n)])
    y = np.stack([data[i * CONTEXT + 1 : (i + 1) * CONTEXT + 1] for i in range(n)])
    return torch.from_numpy(x), torch.from_numpy(y)


@torch.no_grad()
def mean_loss(model, x, y):
    total, count = 0.0, 0
    for i in range(0, len(x), 256):
        logits = model(x[i : i + 256])
        total += F.cross_entropy(logits.reshape(-1, VOCAB), y[i : i + 256].reshape(-1), reduction="sum").item()
        count += y[i : i + 256].numel()
    return total / count


def train(kind, train_data, val_x, val_y, steps, log):
    torch.manual_seed(SEED)
    rng = np.random.default_rng(SEED)
    model = CharLM(kind)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    warmup = 100
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps)))
    t0 = time.time()
    for step in range(steps):
        x, y = batch(train_data, rng, 64)
        loss = F.cross_entropy(model(x).reshape(-1, VOCAB), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 500 == 0 or step == steps - 1:
            print(f"[{kind}] step {step:5d} loss {loss.item():.4f} ({time.time() - t0:.0f} s)", flush=True)
    model.eval()
    # Train loss on a fixed sample of 256 training windows; validation on every window.
    ex_rng = np.random.default_rng(SEED + 1)
    tx, ty = batch(train_data, ex_rng, 256)
    train_loss = mean_loss(model, tx, ty)
    val_loss = mean_loss(model, val_x, val_y)
    log.append(f"{kind}: steps {steps}, final train loss {train_loss:.4f} nats/char, "
               f"validation loss {val_loss:.4f} nats/char, {time.time() - t0:.0f} s")
    print(log[-1], flush=True)
    return model


# ---- independent float64 forward of an exported native file (numpy) ----

def native_forward(tensors, meta, x):
    heads = int(meta["heads"])
    kind = meta["kind"]
    causal = meta["causal"] == "true"
    wq = tensors["q.weight"].astype(np.float64)
    wk = tensors["k.weight"].astype(np.float64) if kind == "dot" else wq
    wv = tensors["v.weight"].astype(np.float64)
    wo = tensors["o.weight"].astype(np.float64)
    get = lambda k: tensors[k].astype(np.float64) if k in tensors else None  # noqa: E731
    bq, bk, bv, bo = get("q.bias"), get("k.bias"), get("v.bias"), get("o.bias")
    z = x
    if "ln.weight" in tensors:
        eps = float(meta["ln_eps"])
        mu = x.mean(axis=1, keepdims=True)
        var = ((x - mu) ** 2).mean(axis=1, keepdims=True)
        z = (x - mu) / np.sqrt(var + eps) * get("ln.weight") + get("ln.bias")
    n = x.shape[0]
    dk = wq.shape[0] // heads
    dv = wv.shape[0] // heads
    out = np.zeros((n, wo.shape[0]))
    for h in range(heads):
        wqh, wkh = wq[h * dk : (h + 1) * dk], wk[h * dk : (h + 1) * dk]
        wvh = wv[h * dv : (h + 1) * dv]
        q = z @ wqh.T
        if kind == "dot":
            if bq is not None:
                q = q + bq[h * dk : (h + 1) * dk]
            k = z @ wkh.T
            if bk is not None:
                k = k + bk[h * dk : (h + 1) * dk]
            s = q @ k.T / math.sqrt(dk)
            v = z @ wvh.T
        else:
            s = -((q[:, None, :] - q[None, :, :]) ** 2).sum(-1) / math.sqrt(dk)
            a = wqh.T @ wqh / math.sqrt(dk)
            v = z @ a @ wvh.T
        if bv is not None:
            v = v + bv[h * dv : (h + 1) * dv]
        if causal:
            s = np.where(np.tril(np.ones((n, n), dtype=bool)), s, -np.inf)
        p = np.exp(s - s.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        out += (p @ v) @ wo[:, h * dv : (h + 1) * dv].T
    if bo is not None:
        out += bo
    return x + out if "ln.weight" in tensors else out


def export(kind, model, val_tokens, out_dir, expected_dir):
    """Writes the layer and centre files of one model and checks them in float64."""
    # Four fixed windows of validation text, from four different licences.
    picks = [(0, 0), (3, 200), (8, 1000), (13, 400)]  # (licence index, offset)
    idx = torch.from_numpy(np.stack([val_tokens[f][o : o + CONTEXT] for f, o in picks]))
    texts = [decode_tokens(row.tolist()) for row in idx]
    model64 = CharLM(kind)
    model64.load_state_dict(model.state_dict())
    model64 = model64.double().eval()
    with torch.no_grad():
        states = model64.hidden_states(idx)
    worst = 0.0
    for i, blk in enumerate(model.blocks):
        a = blk.attn
        t = {"q.weight": a.q.weight, "v.weight": a.v.weight, "v.bias": a.v.bias,
             "o.weight": a.o.weight, "o.bias": a.o.bias,
             "ln.weight": blk.ln1.weight, "ln.bias": blk.ln1.bias}
        if kind == "dot":
            t.update({"q.bias": a.q.bias, "k.weight": a.k.weight, "k.bias": a.k.bias})
        t = {k: v.detach().float().numpy() for k, v in t.items()}
        meta = {"kind": kind, "heads": str(HEADS), "causal": "true", "ln_eps": repr(LN_EPS),
                "layer": str(i), "model": f"{kind}-charlm",
                "source": "scripts/train_zoo.py: character-level LM on Debian licence texts"}
        layer_path = os.path.join(out_dir, f"{kind}-layer{i}.safetensors")
        st.save(layer_path, t, meta)
        centres = {f"x{c}": states[i][c].numpy().astype(np.float64) for c in range(N_CENTRES)}
        cmeta = {"layer_file": f"{kind}-layer{i}.safetensors", "layer": str(i),
                 "what": "hidden states entering the layer (residual stream) for four validation windows"}
        for c in range(N_CENTRES):
            cmeta[f"text{c}"] = texts[c]
        st.save(os.path.join(out_dir, f"{kind}-layer{i}-centres.safetensors"), centres, cmeta)

        # Read both files back; the numpy forward of the file must match torch in float64.
        lt, lm = st.load(layer_path)
        ct, _ = st.load(os.path.join(out_dir, f"{kind}-layer{i}-centres.safetensors"))
        blk64 = model64.blocks[i]
        for c in range(N_CENTRES):
            x = ct[f"x{c}"]
            with torch.no_grad():
                ref = blk64.sublayer(torch.from_numpy(x).unsqueeze(0))[0].numpy()
            got = native_forward(lt, lm, x)
            rel = np.linalg.norm(got - ref) / np.linalg.norm(ref)
            worst = max(worst, rel)
            assert rel < 1e-12, f"{layer_path}: centre x{c}: exported layer differs from torch by {rel:.3e}"
        # Expected values for the C++ tests (tests/data/zoo): the torch sublayer in float64 at
        # every centre, and a JVP / VJP at x0 along fixed random directions.
        if expected_dir:
            rng = np.random.default_rng(SEED + 10 + i)
            v = rng.standard_normal((CONTEXT, D_MODEL))
            u = rng.standard_normal((CONTEXT, D_MODEL))
            f = lambda x: blk64.sublayer(x.unsqueeze(0))[0]  # noqa: E731
            x0 = torch.from_numpy(ct["x0"])
            _, jv = torch.autograd.functional.jvp(f, x0, torch.from_numpy(v))
            _, jtu = torch.autograd.functional.vjp(f, x0, torch.from_numpy(u))
            exp = {"v": v, "u": u, "jv": jv.numpy(), "jtu": jtu.numpy()}
            with torch.no_grad():
                for c in range(N_CENTRES):
                    exp[f"y{c}"] = f(torch.from_numpy(ct[f"x{c}"])).numpy()
            st.save(os.path.join(expected_dir, f"{kind}-layer{i}-expected.safetensors"), exp,
                    {"layer_file": f"models/zoo/{kind}-layer{i}.safetensors",
                     "centres_file": f"models/zoo/{kind}-layer{i}-centres.safetensors",
                     "what": "torch float64 sublayer x + attn(ln1(x)): y{c} at centre x{c}; jv = J(x0) v, jtu = J(x0)^T u",
                     "generator": "scripts/train_zoo.py"})
    print(f"[{kind}] exported; worst relative difference numpy(file) vs torch float64: {worst:.2e}")
    return worst


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--text-dir", default="/usr/share/common-licenses", help="folder of the licence texts")
    ap.add_argument("--out", default=os.path.join(here, "..", "models", "zoo"), help="output folder")
    ap.add_argument("--expected", default=os.path.join(here, "..", "tests", "data", "zoo"),
                    help="folder for the torch reference values the C++ tests compare against ('' to skip)")
    ap.add_argument("--steps", type=int, default=1500, help="optimiser steps per model")
    ap.add_argument("--kinds", default="dot,l2", help="comma-separated subset of dot,l2")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    os.makedirs(args.out, exist_ok=True)
    if args.expected:
        os.makedirs(args.expected, exist_ok=True)
    train_data, val_parts = load_corpus(args.text_dir)
    val_x, val_y = windows(np.concatenate(val_parts))
    print(f"corpus: {len(train_data)} train chars, {sum(map(len, val_parts))} validation chars")
    log = [f"# scripts/train_zoo.py --steps {args.steps}: torch {torch.__version__}, seed {SEED}, "
           f"{len(train_data)} train / {sum(map(len, val_parts))} validation characters "
           f"(uniform guess: {math.log(VOCAB):.4f} nats/char)"]
    for kind in args.kinds.split(","):
        model = train(kind, train_data, val_x, val_y, args.steps, log)
        worst = export(kind, model, val_parts, args.out, args.expected)
        log.append(f"{kind}: exported sublayers reproduce torch (float64) to {worst:.1e} relative")
    with open(os.path.join(args.out, "train-log.txt"), "w") as f:
        f.write("\n".join(log) + "\n")


if __name__ == "__main__":
    main()
