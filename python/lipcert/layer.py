"""lipcert.Layer: one attention layer, from arrays, a checkpoint or a torch module.

The layer is the C++ AttentionLayer (models/attention_layer.h), validated by the same
ValidateLayer the CLI uses. Row convention: an input X is (N, D), token i is row i; weights
follow nn.Linear: wq, wk are (H*dk, D), wv is (H*dv, D), wo is (D, H*dv).
"""

import os

from . import _arrays
from . import _core


def _layer_norm(name, value, conversions):
    if value is None:
        return None, None, 1e-5
    if not isinstance(value, (tuple, list)) or len(value) != 3:
        raise TypeError(f"{name}: expected None or (gamma, beta, eps)")
    gamma, beta, eps = value
    return (_arrays.as_float64(f"{name}.gamma", gamma, 1, conversions),
            _arrays.as_float64(f"{name}.beta", beta, 1, conversions),
            _arrays.real(f"{name}.eps", eps, minimum=0, strictly=True))


class Layer:
    """An attention layer lipcert can certify.

    Build one with Layer.from_arrays, Layer.from_checkpoint or Layer.from_module (torch).
    `conversions` lists the dtype conversions made on the way in ("wq: float32 -> float64");
    certificates of this layer repeat them in their notes.
    """

    def __init__(self, core, conversions=()):
        if not isinstance(core, _core.Layer):
            raise TypeError("Layer: build one with Layer.from_arrays, from_checkpoint or from_module")
        self._core = core
        self.conversions = tuple(conversions)

    # ---- constructors ----

    @classmethod
    def from_arrays(cls, kind="dot", *, heads, wq, wk=None, wv, wo, bq=None, bk=None, bv=None, bo=None,
                    causal=False, layer_norm=None, post_layer_norm=None, names=None, source="arrays",
                    layer_index=0):
        """The layer from weight arrays (numpy or torch, any float dtype, converted to float64).

        kind: "dot" (softmax of scaled dot products) or "l2" (tied wq = wk; wk may be None).
        layer_norm=(gamma, beta, eps): the pre-LN sublayer X + MHA(LayerNorm(X)) (GPT-2, ViT).
        post_layer_norm=(gamma, beta, eps): the post-LN sublayer LayerNorm(X + MHA(X)) (BERT).
        names: where each parameter came from ({"wq": "encoder.layer.0...query.weight"}).
        source: the model it came from (the certificate's model path); layer_index its index.
        Raises TypeError / ValueError naming the bad argument or field.
        """
        _arrays.choice("kind", kind, ("dot", "l2"))
        heads = _arrays.integer("heads", heads, minimum=1)
        conv = []
        mats = {n: _arrays.as_float64(n, v, 2, conv) for n, v in (("wq", wq), ("wv", wv), ("wo", wo))}
        wk_a = None if wk is None else _arrays.as_float64("wk", wk, 2, conv)
        vecs = {n: None if v is None else _arrays.as_float64(n, v, 1, conv)
                for n, v in (("bq", bq), ("bk", bk), ("bv", bv), ("bo", bo))}
        ln = _layer_norm("layer_norm", layer_norm, conv)
        post = _layer_norm("post_layer_norm", post_layer_norm, conv)
        if names is None:
            names = {}
        if not isinstance(names, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in names.items()):
            raise TypeError("names: expected a dict of str -> str")
        if not isinstance(source, str):
            raise TypeError("source: expected a str")
        layer_index = _arrays.integer("layer_index", layer_index)
        core = _core.Layer.from_arrays(kind, heads, mats["wq"], wk_a, mats["wv"], mats["wo"], vecs["bq"], vecs["bk"],
                                       vecs["bv"], vecs["bo"], bool(causal), ln[0], ln[1], ln[2], post[0], post[1],
                                       post[2], dict(names), source, layer_index)
        return cls(core, conv)

    @classmethod
    def from_checkpoint(cls, path, preset="auto", layer=-1, heads=0, attention_only=False):
        """A layer of a safetensors checkpoint, read by the CLI's loader (models/loader.h).

        preset: the tensor naming (auto, native, torch-mha, bert, gpt2); layer: the checkpoint's
        layer index (-1: its only layer); heads: when the checkpoint does not say (0: from the
        file or config.json); attention_only: certify MHA alone (drop the LayerNorm sublayer).
        """
        path = os.fspath(path)
        _arrays.choice("preset", preset, ["auto"] + list(_core.known_presets()))
        layer = _arrays.integer("layer", layer, minimum=-1)
        heads = _arrays.integer("heads", heads, minimum=0)
        return cls(_core.Layer.from_checkpoint(path, preset, layer, heads, bool(attention_only)))

    @classmethod
    def from_module(cls, module, **kwargs):
        """The layer of a torch attention module (nn.MultiheadAttention, HuggingFace blocks).

        Needs the [hf] extra (torch); see lipcert.torch_layers.
        """
        from . import torch_layers  # torch is optional: imported only here
        return torch_layers.from_module(module, **kwargs)

    # ---- what the layer is ----

    kind = property(lambda self: self._core.kind, doc='"dot" or "l2"')
    d_model = property(lambda self: self._core.d_model, doc="D")
    heads = property(lambda self: self._core.heads, doc="H")
    head_dim_qk = property(lambda self: self._core.head_dim_qk, doc="dk")
    head_dim_v = property(lambda self: self._core.head_dim_v, doc="dv")
    causal = property(lambda self: self._core.causal)
    wq = property(lambda self: self._core.wq, doc="(H*dk, D), a copy")
    wk = property(lambda self: self._core.wk, doc="(H*dk, D), a copy (= wq for l2)")
    wv = property(lambda self: self._core.wv, doc="(H*dv, D), a copy")
    wo = property(lambda self: self._core.wo, doc="(D, H*dv), a copy")
    bq = property(lambda self: self._core.bq, doc="None when absent")
    bk = property(lambda self: self._core.bk, doc="None when absent")
    bv = property(lambda self: self._core.bv, doc="None when absent")
    bo = property(lambda self: self._core.bo, doc="None when absent")
    layer_norm = property(lambda self: self._core.layer_norm, doc="(gamma, beta, eps) of the pre-LN sublayer, or None")
    post_layer_norm = property(lambda self: self._core.post_layer_norm,
                               doc="(gamma, beta, eps) of the post-LN sublayer, or None")
    tensor_names = property(lambda self: self._core.tensor_names, doc="parameter -> where it came from")
    path = property(lambda self: self._core.path, doc="the checkpoint (or source) it came from")
    preset = property(lambda self: self._core.preset, doc='the tensor naming read ("arrays" when built from arrays)')
    sha256 = property(lambda self: self._core.sha256,
                      doc="the checkpoint's SHA-256, or for arrays that of the file save() writes")
    layer_index = property(lambda self: self._core.layer_index)
    note = property(lambda self: self._core.note, doc="set when attention_only did not apply")

    @property
    def structure(self):
        """The sublayer in words: "MHA", "X + MHA(LN(X))" or "LN(X + MHA(X))"."""
        if self.layer_norm is not None:
            return "X + MHA(LN(X))"
        if self.post_layer_norm is not None:
            return "LN(X + MHA(X))"
        return "MHA"

    # ---- what it computes ----

    def forward(self, x):
        """The layer's output at x, (N, D) -> (N, D), in float64 (models/forward.h)."""
        return self._core.forward(_arrays.as_float64("x", x, 2))

    __call__ = forward

    def save(self, path):
        """Writes the layer as a native safetensors checkpoint (float64) that
        `lipcert certify --model PATH` and Layer.from_checkpoint read back. Returns path."""
        path = os.fspath(path)
        self._core.save(path)
        return path

    def __repr__(self):
        flags = ", causal" if self.causal else ""
        return (f"Layer({self.kind}, D={self.d_model}, H={self.heads}, dk={self.head_dim_qk}, "
                f"dv={self.head_dim_v}{flags}, {self.structure}, from {self.path!r} layer {self.layer_index})")
