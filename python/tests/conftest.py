"""Shared fixtures of the Python tests: the repository's zoo, the installed CLI, a numpy
reference forward pass and small random layers."""

import os
import pathlib
import shutil
import sysconfig

import numpy as np
import pytest

import lipcert

ROOT = pathlib.Path(__file__).resolve().parents[2]
ZOO = ROOT / "models" / "zoo"


def scale():
    """LIPCERT_TEST_SCALE scales the property tests (default 1)."""
    return max(1, int(float(os.environ.get("LIPCERT_TEST_SCALE", "1"))))


@pytest.fixture(scope="session")
def zoo():
    return ZOO


@pytest.fixture(scope="session")
def cli():
    """The lipcert executable the wheel installed beside this Python (else build/lipcert)."""
    for candidate in (pathlib.Path(sysconfig.get_path("scripts")) / "lipcert", ROOT / "build" / "lipcert"):
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which("lipcert")
    if found is None:
        pytest.fail("no lipcert executable: pip install . installs it beside the Python")
    return found


def _layer_norm(x, gamma, beta, eps):
    mean = x.mean(axis=1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


def _softmax(s):
    s = s - s.max(axis=1, keepdims=True)
    e = np.exp(s)
    return e / e.sum(axis=1, keepdims=True)


def reference_forward(p, x):
    """The layer of docs/math.md in plain numpy (p: the arguments of Layer.from_arrays)."""
    h = p["heads"]
    wq, wv, wo = p["wq"], p["wv"], p["wo"]
    wk = p.get("wk")
    if wk is None:
        wk = wq
    dk, dv = wq.shape[0] // h, wv.shape[0] // h
    n = x.shape[0]
    ln = p.get("layer_norm")
    z = _layer_norm(x, *ln) if ln is not None else x
    out = np.zeros_like(x)
    zero = lambda k: np.zeros(wq.shape[0] if k in ("bq", "bk") else wv.shape[0] if k == "bv" else x.shape[1])
    b = {k: (p.get(k) if p.get(k) is not None else zero(k)) for k in ("bq", "bk", "bv", "bo")}
    for i in range(h):
        q = z @ wq[i * dk:(i + 1) * dk].T + b["bq"][i * dk:(i + 1) * dk]
        if p["kind"] == "dot":
            k = z @ wk[i * dk:(i + 1) * dk].T + b["bk"][i * dk:(i + 1) * dk]
            s = q @ k.T / np.sqrt(dk)
            v = z @ wv[i * dv:(i + 1) * dv].T
        else:
            s = -((q[:, None, :] - q[None, :, :]) ** 2).sum(axis=2) / np.sqrt(dk)
            a = wq[i * dk:(i + 1) * dk].T @ wq[i * dk:(i + 1) * dk] / np.sqrt(dk)
            v = z @ (wv[i * dv:(i + 1) * dv] @ a).T
        v = v + b["bv"][i * dv:(i + 1) * dv]
        if p.get("causal"):
            s = np.where(np.tril(np.ones((n, n), bool)), s, -np.inf)
        out += _softmax(s) @ v @ wo[:, i * dv:(i + 1) * dv].T
    out += b["bo"]
    if ln is not None:
        return x + out
    post = p.get("post_layer_norm")
    if post is not None:
        return _layer_norm(x + out, *post)
    return out


def random_layer_args(rng, kind="dot", d=6, heads=2, dk=3, dv=None, biases=True, causal=False, sublayer=None,
                      dtype=np.float64):
    """Arguments of Layer.from_arrays for a random layer (sublayer: None, "pre" or "post")."""
    dv = dk if dv is None else dv
    g = lambda *shape: rng.standard_normal(shape).astype(dtype) / np.sqrt(d)
    p = {"kind": kind, "heads": heads, "wq": g(heads * dk, d), "wv": g(heads * dv, d), "wo": g(d, heads * dv),
         "causal": causal}
    if kind == "dot":
        p["wk"] = g(heads * dk, d)
    if biases:
        if kind == "dot":
            p["bq"], p["bk"] = g(heads * dk), g(heads * dk)
        p["bv"], p["bo"] = g(heads * dv), g(d)
    ln = (1 + 0.2 * rng.standard_normal(d).astype(dtype), 0.2 * rng.standard_normal(d).astype(dtype), 1e-5)
    if sublayer == "pre":
        p["layer_norm"] = ln
    elif sublayer == "post":
        p["post_layer_norm"] = ln
    return p


@pytest.fixture
def rng():
    return np.random.default_rng(20261206)


@pytest.fixture(scope="session")
def zoo_layer():
    return lipcert.Layer.from_checkpoint(ZOO / "dot-layer0.safetensors")
