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

--tensor-power K instead estimates the first-order part R sup ||DJ(X0)[dX]||_2 over unit dX:
the higher-order power method on the trilinear form v^T (DJ(X0)[dX]) u (alternately
v <- DJ[dX] u, u <- DJ[dX]^T v, dX <- grad_X v^T J(X) u, each normalised) from K random
starts, with Jacobian-vector products only (seconds). Each start ends at a local maximum, so
this is also a lower estimate; a variation bound cannot be tighter than it to first order.
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
    ap.add_argument("--tensor-power", type=int, default=0, metavar="K",
                    help="estimate R sup ||DJ(X0)[dX]|| by the tensor power method from K starts")
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

    if a.tensor_power:
        tensor_power(f, x0, r, a.tensor_power)
        return

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


def tensor_power(f, x0, r, starts, iters=40):
    n, d = x0.shape

    def layer(x):
        return f(x.reshape(1, n, d)).reshape(n, d)

    def jvp(x, u, create_graph=True):  # J(x) u, differentiable in x (and u)
        return torch.autograd.functional.jvp(layer, x, u, create_graph=create_graph)[1]

    def second(dx, u):  # DJ(X0)[dx] u
        return torch.autograd.functional.jvp(lambda y: jvp(y, u), x0, dx)[1]

    gen = torch.Generator().manual_seed(0)
    best = 0.0
    for k in range(starts):
        dx, u = (torch.randn(n, d, generator=gen, dtype=torch.float64) for _ in range(2))
        dx, u = dx / dx.norm(), u / u.norm()
        for _ in range(iters):
            v = second(dx, u)
            value = v.norm().item()
            v = v / v.norm()
            ur = u.clone().requires_grad_(True)
            w = torch.autograd.functional.jvp(lambda y: jvp(y, ur), x0, dx, create_graph=True)[1]
            u = torch.autograd.grad((v * w).sum(), ur)[0]
            u = u / u.norm()
            xr = x0.clone().requires_grad_(True)
            dx = torch.autograd.grad((v * jvp(xr, u)).sum(), xr)[0]
            dx = dx / dx.norm()
        best = max(best, value)
        print(f"start {k}: ||DJ(X0)[dX]|| {value:.6g}", flush=True)
    print(f"R {r:.6g}  first_order_variation_lower={r * best:.6g}")


if __name__ == "__main__":
    main()
