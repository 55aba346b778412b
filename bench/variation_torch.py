#!/usr/bin/python3
"""How far the Jacobian of a bundled sublayer really moves over a Frobenius ball: a lower
bound on sup ||J(X) - J(X0)||_2 over ||X - X0||_F <= R, found by random points and ascent.
It is the quantity the centred engine bounds from above (its `variation`, printed with
LIPCERT_DEBUG_BOUNDS=1), so the ratio of the two is the engine's looseness.

    /usr/bin/python3 bench/variation_torch.py --layer models/zoo/dot-layer0.safetensors \
        --centres models/zoo/dot-layer0-centres.safetensors --centre x0 --relative-radius 0.001

Dense Jacobians by autograd in float64 (N*D = 2048 for the zoo: a few seconds each).
Ascent: the gradient of u^T J(X) w for the top singular pair (u, w) of J(X) - J(X0)
(envelope theorem), projected back onto the ball. Floating estimates, not rigorous.
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
import search_vs_torch as base  # noqa: E402
import st  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layer", required=True)
    ap.add_argument("--centres", required=True)
    ap.add_argument("--centre", default="x0")
    ap.add_argument("--relative-radius", type=float, default=1e-3)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    f = base.make_forward(*base.load_layer(a.layer))
    centres = st.load(a.centres)[0]
    if a.centre not in centres:
        print(f"{a.centres}: centre: no tensor named {a.centre!r} (have {', '.join(sorted(centres))})", file=sys.stderr)
        sys.exit(2)
    x0 = torch.from_numpy(centres[a.centre].astype("float64"))
    n, d = x0.shape
    r = a.relative_radius * x0.norm().item()

    def flat(y):
        return f(y.reshape(1, n, d)).reshape(-1)

    def jac(x):
        return torch.autograd.functional.jacobian(flat, x.reshape(-1))

    j0 = jac(x0)
    print(f"R {r:.6g}  ||J(X0)|| {torch.linalg.matrix_norm(j0, 2).item():.6g}", flush=True)
    gen = torch.Generator().manual_seed(0)
    best, best_x = -1.0, None
    for k in range(a.samples):  # the ball's boundary; every other one moves a single token
        dx = torch.randn(n, d, generator=gen, dtype=torch.float64)
        if k % 2:
            mask = torch.zeros(n, 1, dtype=torch.float64)
            mask[torch.randint(n, (1,), generator=gen)] = 1
            dx = dx * mask
        x = x0 + r * dx / dx.norm()
        v = torch.linalg.matrix_norm(jac(x) - j0, 2).item()
        print(f"sample {k}: ||J(X) - J(X0)|| {v:.6g}", flush=True)
        if v > best:
            best, best_x = v, x
    x = best_x
    for it in range(a.steps):
        dj = jac(x) - j0
        u_, s_, vh = torch.linalg.svd(dj)
        best = max(best, s_[0].item())
        xr = x.clone().requires_grad_(True)
        _, jw = torch.autograd.functional.jvp(flat, xr.reshape(-1), vh[0], create_graph=True)
        (g,) = torch.autograd.grad((u_[:, 0] * jw).sum(), xr)
        x = x + 0.5 * r * g / g.norm()
        dx = x - x0
        x = x0 + dx * min(1.0, r / dx.norm().item())
        print(f"ascent {it}: ||J(X) - J(X0)|| {s_[0].item():.6g}", flush=True)
    print(f"variation_lower={best:.6g}")


if __name__ == "__main__":
    main()
