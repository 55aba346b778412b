#!/usr/bin/python3
"""Feasibility probe (floating point, NOT a certificate) for a deflated super-block bound on
||J(X0)||_2 at radius 0 (docs/engines.md, "Deflation: measured, not built").

With V the first k Lanczos vectors of J^T J and P = I - V V^T, J = J V V^T + J P and

    ||J||^2 <= lambda_max([[alpha, beta], [beta, gamma]]),
    alpha = ||J V||^2, beta = ||(I - V V^T) J^T J V||, gamma = ||[ ||(J P)_IK|| ]||^2

(G x G token groups). The probe forms J densely in PyTorch (float64), so it is for
N*D up to about 12288 (1.2 GB). Block norms by 40 power iterations (estimates).

    /usr/bin/python3 bench/deflation_probe.py --layer build-real/model --bert-layer 0 \\
        --centres build-real/centres.safetensors --centre layer0_n32 --k 50,150,250 --groups 4
"""
import argparse
import math
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
from search_vs_torch import load_layer, make_forward  # noqa: E402
import st  # noqa: E402


def block_norm_bound(m, n_tokens, d, groups, gen):
    g = n_tokens // groups
    b = torch.zeros(groups, groups)
    for i in range(groups):
        for k in range(groups):
            blk = m[i * g * d:(i + 1) * g * d, k * g * d:(k + 1) * g * d]
            v = torch.randn(blk.shape[1], generator=gen)
            for _ in range(40):
                v = blk.T @ (blk @ v)
                v /= v.norm()
            b[i, k] = (blk @ v).norm()
    return torch.linalg.matrix_norm(b, 2).item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layer", required=True)
    ap.add_argument("--bert-layer", type=int)
    ap.add_argument("--centres", required=True)
    ap.add_argument("--centre", required=True)
    ap.add_argument("--k", default="50,150,250")
    ap.add_argument("--groups", type=int, default=4)
    a = ap.parse_args()
    torch.set_default_dtype(torch.float64)
    gen = torch.Generator().manual_seed(1)
    t, kind, heads, causal, eps = load_layer(a.layer, a.bert_layer)
    f = make_forward(t, kind, heads, causal, eps)
    c, _ = st.load(a.centres)
    x0 = torch.from_numpy(c[a.centre].astype("float64"))
    n_tokens, d = x0.shape
    n = n_tokens * d
    t0 = time.time()
    j = torch.autograd.functional.jacobian(lambda x: f(x.reshape(1, n_tokens, d)).reshape(-1), x0.reshape(-1),
                                           vectorize=True)
    ks = [int(s) for s in a.k.split(",")]
    kmax = max(ks)
    q = torch.zeros(n, kmax + 1)
    q[:, 0] = torch.randn(n, generator=gen)
    q[:, 0] /= q[:, 0].norm()
    for s in range(kmax):
        w = j.T @ (j @ q[:, s])
        for _ in range(2):
            w -= q[:, :s + 1] @ (q[:, :s + 1].T @ w)
        q[:, s + 1] = w / w.norm()
    sigma1 = None
    print(f"N = {n_tokens}, N*D = {n}, groups {a.groups}: J and {kmax} Lanczos steps in {time.time() - t0:.0f} s")
    print("| k | ||J V|| | beta | block norm of J P | deflated bound |")
    print("| --- | --- | --- | --- | --- |")
    for k in ks:
        v = q[:, :k]
        y = j @ v
        alpha = torch.linalg.eigvalsh(y.T @ y)[-1].item()
        z = j.T @ y
        beta = torch.linalg.matrix_norm(z - v @ (v.T @ z), 2).item()
        gamma = block_norm_bound(j - y @ v.T, n_tokens, d, a.groups, gen) ** 2
        lam = (alpha + gamma) / 2 + math.sqrt(((alpha - gamma) / 2) ** 2 + beta ** 2)
        sigma1 = math.sqrt(alpha) if sigma1 is None else max(sigma1, math.sqrt(alpha))
        print(f"| {k} | {math.sqrt(alpha):.4f} | {beta:.4f} | {math.sqrt(gamma):.4f} | {math.sqrt(lam):.4f} |", flush=True)
    print(f"block norm of J itself: {block_norm_bound(j, n_tokens, d, a.groups, gen):.4f}")


if __name__ == "__main__":
    main()
