"""lipcert.Layer: from arrays and from checkpoints, the float64 forward, save and reload."""

import numpy as np
import pytest

import lipcert
from conftest import random_layer_args, reference_forward, scale


@pytest.mark.parametrize("kind", ["dot", "l2"])
@pytest.mark.parametrize("sublayer", [None, "pre", "post"])
@pytest.mark.parametrize("causal", [False, True])
def test_forward_matches_numpy_reference(rng, kind, sublayer, causal):
    checked = 0
    for trial in range(3 * scale()):
        p = random_layer_args(rng, kind=kind, d=6, heads=2, dk=3, dv=2 + trial % 2, causal=causal, sublayer=sublayer)
        layer = lipcert.Layer.from_arrays(**p)
        x = rng.standard_normal((5, 6))
        got = layer.forward(x)
        want = reference_forward(p, x)
        assert got.shape == (5, 6)
        assert np.max(np.abs(got - want)) <= 1e-12 * max(1.0, np.max(np.abs(want)))
        checked += 1
    assert checked == 3 * scale()


def test_layer_properties_round_trip(rng):
    p = random_layer_args(rng, kind="dot", d=8, heads=2, dk=4, dv=3, sublayer="pre", causal=True)
    layer = lipcert.Layer.from_arrays(**p, names={"wq": "attn.q.weight"}, source="my-model", layer_index=3)
    assert (layer.kind, layer.d_model, layer.heads, layer.head_dim_qk, layer.head_dim_v) == ("dot", 8, 2, 4, 3)
    assert layer.causal and layer.structure == "X + MHA(LN(X))"
    for name in ("wq", "wk", "wv", "wo", "bq", "bk", "bv", "bo"):
        np.testing.assert_array_equal(getattr(layer, name), p[name])
    gamma, beta, eps = layer.layer_norm
    np.testing.assert_array_equal(gamma, p["layer_norm"][0])
    assert eps == 1e-5 and layer.post_layer_norm is None
    assert layer.tensor_names == {"wq": "attn.q.weight"}
    assert (layer.path, layer.preset, layer.layer_index) == ("my-model", "arrays", 3)
    assert len(layer.sha256) == 64 and layer.conversions == ()


def test_l2_layer_ties_keys(rng):
    p = random_layer_args(rng, kind="l2", d=4, heads=1, dk=2)
    layer = lipcert.Layer.from_arrays(**p)
    np.testing.assert_array_equal(layer.wk, layer.wq)
    assert layer.bq is None and layer.bk is None


def test_float32_and_lists_are_converted_and_recorded(rng):
    p = random_layer_args(rng, kind="dot", d=4, heads=1, dk=2, dtype=np.float32)
    layer = lipcert.Layer.from_arrays(**p)
    assert "wq: float32 -> float64" in layer.conversions
    np.testing.assert_array_equal(layer.wq, p["wq"].astype(np.float64))
    x = rng.standard_normal((3, 4)).astype(np.float32)
    np.testing.assert_array_equal(layer.forward(x), layer.forward(x.astype(np.float64)))
    q = random_layer_args(rng, kind="dot", d=4, heads=1, dk=2, biases=False)
    listed = lipcert.Layer.from_arrays(**{k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in q.items()})
    np.testing.assert_array_equal(listed.wo, q["wo"])
    assert listed.conversions == ()


def test_save_and_reload_is_the_same_layer(rng, tmp_path):
    for sublayer in (None, "pre", "post"):
        p = random_layer_args(rng, kind="dot", d=6, heads=3, dk=2, sublayer=sublayer)
        layer = lipcert.Layer.from_arrays(**p)
        path = layer.save(tmp_path / f"layer-{sublayer}.safetensors")
        back = lipcert.Layer.from_checkpoint(path)
        assert back.preset == "native" and back.structure == layer.structure
        # The in-memory layer's fingerprint is that of the file it writes.
        assert back.sha256 == layer.sha256
        x = rng.standard_normal((4, 6))
        np.testing.assert_array_equal(back.forward(x), layer.forward(x))


def test_arrays_and_checkpoint_agree_on_the_zoo(zoo, zoo_layer):
    L = zoo_layer
    assert (L.kind, L.d_model, L.heads, L.causal, L.structure) == ("dot", 64, 4, True, "X + MHA(LN(X))")
    rebuilt = lipcert.Layer.from_arrays(L.kind, heads=L.heads, wq=L.wq, wk=L.wk, wv=L.wv, wo=L.wo, bq=L.bq, bk=L.bk,
                                        bv=L.bv, bo=L.bo, causal=L.causal, layer_norm=L.layer_norm)
    x0 = lipcert.load_centre(f"{zoo}/dot-layer0-centres.safetensors:x0", L)
    assert x0.shape == (32, 64)
    y = L.forward(x0)
    np.testing.assert_array_equal(rebuilt.forward(x0), y)
    assert np.all(np.isfinite(y)) and np.linalg.norm(y - x0) > 0
    # The same certificate bits from both (8 tokens, radius 0, a tolerance met at once).
    x0 = x0[:8]
    a = lipcert.certify(L, x0, radius=0, time_limit=60, tolerance=0.5, progress=False, probabilistic=False)
    b = lipcert.certify(rebuilt, x0, radius=0, time_limit=60, tolerance=0.5, progress=False, probabilistic=False)
    assert a.upper_bound >= a.lower_bound > 0
    assert (b.upper_bound, b.lower_bound) == (a.upper_bound, a.lower_bound)


def test_attention_only_drops_the_layer_norm(zoo):
    full = lipcert.Layer.from_checkpoint(zoo / "l2-layer1.safetensors")
    mha = lipcert.Layer.from_checkpoint(zoo / "l2-layer1.safetensors", attention_only=True)
    assert full.structure == "X + MHA(LN(X))" and mha.structure == "MHA" and mha.note == ""
    x = np.random.default_rng(1).standard_normal((4, 64))
    assert not np.allclose(full.forward(x) - x, mha.forward(x))


def test_bad_layers_name_the_field(rng):
    p = random_layer_args(rng, kind="dot", d=4, heads=2, dk=2)
    with pytest.raises(ValueError, match="wo"):
        lipcert.Layer.from_arrays(**{**p, "wo": np.zeros((5, 4))})
    with pytest.raises(ValueError, match="heads"):
        lipcert.Layer.from_arrays(**{**p, "heads": 3})
    with pytest.raises(ValueError, match="heads"):
        lipcert.Layer.from_arrays(**{**p, "heads": 0})
    with pytest.raises(TypeError, match="heads"):
        lipcert.Layer.from_arrays(**{**p, "heads": 2.0})
    with pytest.raises(ValueError, match="wk"):
        lipcert.Layer.from_arrays(**{**p, "wk": None})
    with pytest.raises(ValueError, match="bq"):
        lipcert.Layer.from_arrays(**{**p, "bq": np.zeros(3)})
    with pytest.raises(ValueError, match="wq: holds NaN"):
        lipcert.Layer.from_arrays(**{**p, "wq": np.full((4, 4), np.nan)})
    with pytest.raises(TypeError, match="wv"):
        lipcert.Layer.from_arrays(**{**p, "wv": np.zeros((4, 4), dtype=np.int64)})
    with pytest.raises(ValueError, match="wv"):
        lipcert.Layer.from_arrays(**{**p, "wv": np.zeros(4)})
    with pytest.raises(ValueError, match="kind"):
        lipcert.Layer.from_arrays("softmax", **{k: v for k, v in p.items() if k != "kind"})
    with pytest.raises(ValueError):  # both LayerNorm placements
        lipcert.Layer.from_arrays(**{**p, "layer_norm": (np.ones(4), np.zeros(4), 1e-5),
                                     "post_layer_norm": (np.ones(4), np.zeros(4), 1e-5)})
    with pytest.raises(TypeError, match="layer_norm"):
        lipcert.Layer.from_arrays(**{**p, "layer_norm": (np.ones(4), np.zeros(4))})
    layer = lipcert.Layer.from_arrays(**p)
    with pytest.raises(ValueError, match="x"):
        layer.forward(np.zeros((3, 5)))


def test_bad_checkpoints_name_the_file(tmp_path, zoo):
    with pytest.raises(ValueError, match="nope.safetensors"):
        lipcert.Layer.from_checkpoint(tmp_path / "nope.safetensors")
    with pytest.raises(ValueError, match="preset"):
        lipcert.Layer.from_checkpoint(zoo / "dot-layer0.safetensors", preset="llama")
