#!/usr/bin/python3
"""The norms of the three paths of J(X0) for dot-product attention alone (floating power
iteration, NOT a certificate): the values V (sum_h P_h (x) W_h), the keys K (block (i, j):
sum_h a^h_ij g^h_i^T) and the queries Q (block diagonal E_i), then K + Q and J = V + K + Q.
What the factored heads' bound (certify/centre/factored_heads.cc, docs/engines.md "Centre norm: the
heads factored") loses to its triangle inequality, and to each part's own bound.

    /usr/bin/python3 bench/factored_parts.py /tmp/bert/bert-size.safetensors - /tmp/bert/centre.safetensors x0
    /usr/bin/python3 bench/factored_parts.py build-real/model 0 build-real/centres.safetensors layer0_n64

Arguments: LAYER, BERT_LAYER (or - for a native safetensors layer), CENTRES, CENTRE.
40 power steps per operator; about 4 minutes at BERT-base size on 2 cores.
"""
import os
import sys, math, time, torch
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'scripts'))
from search_vs_torch import load_layer
import st
torch.set_default_dtype(torch.float64)
layer, bert, centres, key = sys.argv[1], (int(sys.argv[2]) if sys.argv[2] != '-' else None), sys.argv[3], sys.argv[4]
t, kind, H, causal, eps = load_layer(layer, bert)
c, _ = st.load(centres); X = torch.from_numpy(c[key].astype('float64'))
N, D = X.shape
wq, wk, wv, wo = t['q.weight'], t['k.weight'], t['v.weight'], t['o.weight']
dk = wq.shape[0] // H; dv = wv.shape[0] // H
bq, bk, bv = (t.get(k, torch.zeros(wq.shape[0])) for k in ('q.bias','k.bias','v.bias'))
Q = (X @ wq.T + bq).reshape(N,H,dk).transpose(0,1)
K = (X @ wk.T + bk).reshape(N,H,dk).transpose(0,1)
V = (X @ wv.T + bv).reshape(N,H,dv).transpose(0,1)
S = Q @ K.transpose(-1,-2) / math.sqrt(dk)
if causal: S = S.masked_fill(torch.triu(torch.ones(N,N,dtype=torch.bool),1), float('-inf'))
P = torch.softmax(S, -1)
Wh = [wo[:, h*dv:(h+1)*dv] @ wv[h*dv:(h+1)*dv] for h in range(H)]
U = [V[h] @ wo[:, h*dv:(h+1)*dv].T for h in range(H)]
Ub = [P[h] @ U[h] for h in range(H)]
G = [Q[h] @ wk[h*dk:(h+1)*dk] / math.sqrt(dk) for h in range(H)]   # N x D rows g_i
B = [K[h] @ wq[h*dk:(h+1)*dk] / math.sqrt(dk) for h in range(H)]   # N x D rows b_j
def Vop(x): return sum(P[h] @ x @ Wh[h].T for h in range(H))
def Kop(x):
    out = 0
    for h in range(H):
        Sx = P[h] * (G[h] @ x.T)
        out = out + Sx @ U[h] - Sx.sum(1, keepdim=True) * Ub[h]
    return out
def Qop(x):
    out = 0
    for h in range(H):
        s = x @ B[h].T          # s_ij = b_j . x_i
        Sx = P[h] * s
        out = out + Sx @ U[h] - Sx.sum(1, keepdim=True) * Ub[h]
    return out
def norm(op, it=40):
    x = torch.randn(N, D); x /= x.norm()
    for _ in range(it):
        x.requires_grad_(True)
        y = op(x); g, = torch.autograd.grad(0.5 * (y*y).sum(), x)
        s = math.sqrt((g*x).sum().item())
        x = (g / g.norm()).detach()
    return s
t0 = time.time()
for name, op in [('V', Vop), ('K', Kop), ('Q', Qop), ('K+Q', lambda x: Kop(x)+Qop(x)), ('J', lambda x: Vop(x)+Kop(x)+Qop(x))]:
    print(name, round(norm(op), 4), f"{time.time()-t0:.0f}s", flush=True)
