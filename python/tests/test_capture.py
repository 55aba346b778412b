"""lipcert.capture / lipcert.hf.capture: what is certified is what the model computes. For every
supported architecture at two sizes, lipcert's float64 forward of each captured layer at each
captured centre matches the block's own output in the model's float64 forward (recorded by
hooks on the model's own modules) to 1e-10 relative, with padding removed."""

import numpy as np
import pytest

from hf_models import ARCHS, SIZES, inputs, make_model, minilm_dir, rel_err

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
import lipcert  # noqa: E402
import lipcert.hf  # noqa: E402
from lipcert.torch_layers import UnsupportedModuleError  # noqa: E402


def _own_outputs(model, arch):
    """Hooks that record each attention sublayer's output as the model computes it, in order:
    post-LN blocks their LayerNorm's output, pre-LN blocks the residual sum (the input of the
    block's second LayerNorm), nn.MultiheadAttention its output (batch first)."""
    rec, handles = [], []

    def out_hook(_m, _a, out):
        rec.append((out[0] if isinstance(out, tuple) else out).detach().clone())

    def pre_hook(_m, args):
        rec.append(args[0].detach().clone())

    if arch in ("bert", "roberta"):
        mods = [l.attention for l in model.encoder.layer]
        handles = [m.register_forward_hook(out_hook) for m in mods]
    elif arch == "distilbert":
        handles = [l.sa_layer_norm.register_forward_hook(out_hook) for l in model.transformer.layer]
    elif arch == "gpt2":
        handles = [b.ln_2.register_forward_pre_hook(pre_hook) for b in model.h]
    elif arch == "vit":
        handles = [l.layernorm_after.register_forward_pre_hook(pre_hook) for l in model.encoder.layer]
    elif arch == "torch-mha":
        def mha_hook(m, _a, out):
            y = out[0].detach().clone()
            rec.append(y if m.batch_first else y.transpose(0, 1))
        handles = [m.register_forward_hook(mha_hook) for m in model.layers]
    return rec, handles


@pytest.mark.parametrize("size", sorted(SIZES))
@pytest.mark.parametrize("arch", ARCHS)
def test_capture_matches_the_models_own_forward(arch, size):
    model = make_model(arch, size)
    x = inputs(model, arch)
    rec, handles = _own_outputs(model, arch)
    try:
        caps = lipcert.capture(model, **x)
    finally:
        for h in handles:
            h.remove()
    n_layers = SIZES[size][3]
    assert len(caps) == n_layers and len(rec) == n_layers
    mask = x.get("attention_mask")
    checked = 0
    for c, own in zip(caps, rec):
        assert c.layer.d_model == SIZES[size][0] and c.layer.heads == SIZES[size][1]
        assert len(c.centres) == own.shape[0]
        for b, x0 in enumerate(c.centres):
            keep = own.shape[1] if mask is None else int(mask[b].sum())
            assert x0.shape == (keep, SIZES[size][0]) and x0.dtype == np.float64
            want = own[b][: keep].numpy() if mask is None else own[b][mask[b] != 0].numpy()
            assert rel_err(c.layer.forward(x0), want) < 1e-10, (arch, size, c.name, b)
            checked += 1
    assert checked == 2 * n_layers


@pytest.mark.parametrize("arch", ["bert", "gpt2", "distilbert", "roberta"])
def test_padding_removed_equals_each_sequence_alone(arch):
    model = make_model(arch, "small")
    x = inputs(model, arch, batch=2, tokens=8, pad_last=3)
    caps = lipcert.capture(model, **x)
    alone = lipcert.capture(model, input_ids=x["input_ids"][1:, :5])
    for c, a in zip(caps, alone):
        assert c.centres[1].shape == (5, 32)
        np.testing.assert_allclose(c.centres[1], a.centres[0], rtol=1e-12, atol=1e-12)


def test_attention_only_centres_are_the_input_of_mha():
    model = make_model("gpt2", "small")
    x = inputs(model, "gpt2", pad_last=0)
    seen = []
    h = model.h[1].attn.register_forward_hook(lambda m, a, out: seen.append((a[0].clone(), out[0].clone())))
    try:
        caps = lipcert.capture(model, attention_only=True, **x)
    finally:
        h.remove()
    c = caps[1]
    assert c.layer.structure == "MHA" and c.layer.causal
    x_in, y = seen[0]
    np.testing.assert_allclose(c.centres[0], x_in[0].numpy(), rtol=1e-13, atol=1e-13)
    assert rel_err(c.layer.forward(c.centres[0]), y[0].numpy()) < 1e-10


def test_minilm_real_weights():
    """all-MiniLM-L6-v2 as HuggingFace loads it: six post-LN layers, D = 384, 12 heads."""
    from transformers import AutoModel, AutoTokenizer

    folder = minilm_dir()
    model = AutoModel.from_pretrained(folder).eval().double()
    tok = AutoTokenizer.from_pretrained(folder)
    enc = tok(["The quick brown fox jumps over the lazy dog.", "Attention layers mix tokens."], padding=True,
              return_tensors="pt")
    rec, handles = _own_outputs(model, "bert")
    try:
        caps = lipcert.hf.capture(model, **enc)
    finally:
        for h in handles:
            h.remove()
    assert len(caps) == 6
    lengths = enc["attention_mask"].sum(1).tolist()
    for c, own in zip(caps, rec):
        assert (c.layer.d_model, c.layer.heads, c.layer.structure) == (384, 12, "LN(X + MHA(X))")
        assert [x0.shape[0] for x0 in c.centres] == lengths
        for b, x0 in enumerate(c.centres):
            assert rel_err(c.layer.forward(x0), own[b][: lengths[b]].numpy()) < 1e-10
    # The float32 model captures the same centres to float32 precision, recorded as converted.
    caps32 = lipcert.hf.capture(AutoModel.from_pretrained(folder).eval(), **enc)
    assert caps32.dtype == "float32"
    assert rel_err(caps32[3].centres[0], caps[3].centres[0]) < 1e-5


def test_torch_mha_causal_mask_is_recognised():
    class Causal(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.MultiheadAttention(16, 2, batch_first=True)

        def forward(self, x, mask):
            return self.a(x, x, x, attn_mask=mask, need_weights=False)[0]

    m = Causal().double().eval()
    x = torch.randn(1, 5, 16, dtype=torch.float64)
    causal = torch.triu(torch.full((5, 5), float("-inf"), dtype=torch.float64), 1)
    caps = lipcert.capture(m, x, causal)
    assert caps[0].layer.causal
    with torch.no_grad():
        want = m(x, causal)[0].numpy()
    assert rel_err(caps[0].layer.forward(caps[0].centres[0]), want) < 1e-10
    assert not lipcert.capture(m, x, None)[0].layer.causal
    with pytest.raises(UnsupportedModuleError, match="MultiheadAttention.*attn_mask"):
        lipcert.capture(m, x, torch.eye(5, dtype=torch.bool))


def test_capture_refusals():
    m = make_model("bert", "small")
    x = inputs(m, "bert")
    m.train()
    with pytest.raises(UnsupportedModuleError, match="BertModel is in training mode"):
        lipcert.capture(m, **x)
    m.eval()
    with pytest.raises(UnsupportedModuleError, match="head_mask"):
        lipcert.capture(m, head_mask=torch.ones(2, 4, dtype=torch.float64), **x)
    with pytest.raises(UnsupportedModuleError, match="no attention block"):
        lipcert.capture(torch.nn.Sequential(torch.nn.Linear(3, 3)).eval(), torch.zeros(1, 3))
    with pytest.raises(TypeError, match="model"):
        lipcert.capture("bert-base-uncased")
    rel = make_model("bert", "small", position_embedding_type="relative_key_query")
    with pytest.raises(UnsupportedModuleError, match=r"encoder\.layer\.0\.attention.*BertSelfAttention.*relative_key_query"):
        lipcert.capture(rel, **x)
    # A BERT decoder with cross-attention: its crossattention blocks are refused when they run.
    dec = make_model("bert", "small", is_decoder=True, add_cross_attention=True)
    enc_states = torch.randn(2, 4, 32, dtype=torch.float64)
    with pytest.raises(UnsupportedModuleError, match="crossattention.*cross-attention"):
        lipcert.capture(dec, encoder_hidden_states=enc_states, **x)
    # The wrappers are gone afterwards: the model's forward is its class's again.
    assert all("forward" not in mod.__dict__ for mod in dec.modules())


def test_hf_capture_needs_inputs():
    m = make_model("bert", "small")
    with pytest.raises(ValueError, match="inputs"):
        lipcert.hf.capture(m)
