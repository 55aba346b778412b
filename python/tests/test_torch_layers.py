"""Layer.from_module: the weight maps of nn.MultiheadAttention and the HuggingFace attention
blocks (lipcert's float64 forward against the block's own, in float64), the certified bound at
radius 0 against an independent autograd Jacobian norm, and the refusals."""

import os

import numpy as np
import pytest

from hf_models import ARCHS, SIZES, blocks, jacobian_norm, make_model, reference, rel_err

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
import lipcert  # noqa: E402
from lipcert.torch_layers import UnsupportedModuleError, describe_module  # noqa: E402

SCALE = max(1, int(os.environ.get("LIPCERT_TEST_SCALE", "1")))


def _centre(d, n, seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return scale * torch.randn(n, d, generator=g, dtype=torch.float64)


EXPECTED = {  # (structure, causal) of each architecture's block
    "bert": ("LN(X + MHA(X))", False), "roberta": ("LN(X + MHA(X))", False),
    "distilbert": ("LN(X + MHA(X))", False), "gpt2": ("X + MHA(LN(X))", True),
    "vit": ("X + MHA(LN(X))", False), "torch-mha": ("MHA", False),
}


@pytest.mark.parametrize("size", sorted(SIZES))
@pytest.mark.parametrize("arch", ARCHS)
def test_forward_matches_block(arch, size):
    model = make_model(arch, size)
    d, h = SIZES[size][:2]
    checked = 0
    for i, block in enumerate(blocks(model, arch)):
        layer = lipcert.Layer.from_module(block)
        assert (layer.d_model, layer.heads) == (d, h)
        assert (layer.structure, bool(layer.causal)) == EXPECTED[arch]
        ref = reference(block, arch)
        for s in range(2 * SCALE):
            x = _centre(d, 5 + s, seed=10 * i + s)
            with torch.no_grad():
                want = ref(x).numpy()
            got = layer.forward(x.numpy())
            assert got.shape == want.shape
            assert rel_err(got, want) < 1e-10, (arch, size, i, s)
            checked += 1
    assert checked == 2 * SCALE * SIZES[size][3]


@pytest.mark.parametrize("size", sorted(SIZES))
@pytest.mark.parametrize("arch", ARCHS)
def test_certified_bound_at_radius_zero_covers_autograd_jacobian(arch, size):
    model = make_model(arch, size)
    d = SIZES[size][0]
    block = blocks(model, arch)[-1]
    layer = lipcert.Layer.from_module(block)
    x = _centre(d, 6, seed=3)
    jac = jacobian_norm(reference(block, arch), x)
    cert = lipcert.certify(layer, x.numpy(), radius=0, time_limit=20, threads=1, progress=False)
    assert jac > 0.01
    assert cert.upper_bound >= jac, (arch, size, cert.upper_bound, jac)
    assert cert.lower_bound <= jac * (1 + 1e-9)
    # At radius 0 the centred engines evaluate the Jacobian at X0 itself: equal up to rounding.
    assert cert.upper_bound <= jac * (1 + 1e-6), (arch, size, cert.upper_bound, jac)


def test_attention_only_is_mha_alone():
    m = make_model("gpt2", "small")
    block = m.h[0]
    layer = lipcert.Layer.from_module(block, attention_only=True)
    assert layer.structure == "MHA" and layer.causal
    x = _centre(32, 6, seed=4)
    with torch.no_grad():
        want = block.attn(x.unsqueeze(0))[0][0].numpy()
    assert rel_err(layer.forward(x.numpy()), want) < 1e-10
    bert = make_model("bert", "small")
    att = bert.encoder.layer[1].attention
    layer = lipcert.Layer.from_module(att, attention_only=True)
    assert layer.structure == "MHA"
    with torch.no_grad():
        want = att.output.dense(att.self(x.unsqueeze(0))[0])[0].numpy()
    assert rel_err(layer.forward(x.numpy()), want) < 1e-10


def test_bert_layer_stands_for_its_attention_and_is_decoder_is_causal():
    m = make_model("bert", "small", is_decoder=True)
    layer = lipcert.Layer.from_module(m.encoder.layer[0])
    assert layer.structure == "LN(X + MHA(X))" and layer.causal
    x = _centre(32, 5, seed=5)
    n = x.shape[0]
    mask = torch.zeros(1, 1, n, n, dtype=torch.float64).masked_fill(
        torch.triu(torch.ones(n, n, dtype=torch.bool), 1), torch.finfo(torch.float64).min)
    with torch.no_grad():
        want = m.encoder.layer[0].attention(x.unsqueeze(0), mask)[0][0].numpy()
    assert rel_err(layer.forward(x.numpy()), want) < 1e-10


@pytest.mark.parametrize("builder", ["electra", "deit", "camembert"])
def test_derived_architectures_by_structure(builder):
    """Models derived from BERT and ViT work without a line of lipcert code for them."""
    T = transformers
    torch.manual_seed(0)
    if builder == "electra":
        m = T.ElectraModel(T.ElectraConfig(hidden_size=32, embedding_size=32, num_hidden_layers=1,
                                           num_attention_heads=4, intermediate_size=37, vocab_size=50))
        block, arch = m.encoder.layer[0].attention, "bert"
    elif builder == "camembert":
        m = T.CamembertModel(T.CamembertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                               intermediate_size=37, vocab_size=50))
        block, arch = m.encoder.layer[0].attention, "bert"
    else:
        m = T.DeiTModel(T.DeiTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                     intermediate_size=37, image_size=8, patch_size=4), add_pooling_layer=False)
        block, arch = m.encoder.layer[0], "vit"
    m = m.double().eval()
    layer = lipcert.Layer.from_module(block)
    x = _centre(32, 5, seed=6)
    with torch.no_grad():
        want = reference(block, arch)(x).numpy()
    assert rel_err(layer.forward(x.numpy()), want) < 1e-10


def test_torch_mha_separate_weights_and_no_bias():
    for kw in (dict(bias=False), dict(bias=True)):
        mha = torch.nn.MultiheadAttention(24, 3, **kw).double().eval()
        layer = lipcert.Layer.from_module(mha)
        assert (layer.bq is None) == (not kw["bias"])
        x = _centre(24, 4, seed=7)
        with torch.no_grad():
            want = reference(mha, "torch-mha")(x).numpy()
        assert rel_err(layer.forward(x.numpy()), want) < 1e-10
    causal = lipcert.Layer.from_module(mha, causal=True)
    assert causal.causal
    x = _centre(24, 4, seed=8)
    with torch.no_grad():
        mask = torch.triu(torch.ones(4, 4, dtype=torch.bool), 1)
        want = mha(x.unsqueeze(1), x.unsqueeze(1), x.unsqueeze(1), attn_mask=mask, need_weights=False)[0][:, 0].numpy()
    assert rel_err(causal.forward(x.numpy()), want) < 1e-10


# ---- refusals: the error names the module's class and what is unsupported ----


def _refused(module, *words, exc=UnsupportedModuleError, **kw):
    with pytest.raises(exc) as e:
        lipcert.Layer.from_module(module, **kw)
    msg = str(e.value)
    for w in words:
        assert w in msg, (w, msg)
    return msg


def test_refuses_torch_mha_options():
    _refused(torch.nn.MultiheadAttention(16, 2, add_bias_kv=True).eval(), "MultiheadAttention", "add_bias_kv")
    _refused(torch.nn.MultiheadAttention(16, 2, add_zero_attn=True).eval(), "MultiheadAttention", "add_zero_attn")
    _refused(torch.nn.MultiheadAttention(16, 2, kdim=8, vdim=8).eval(), "MultiheadAttention", "cross-attention")


def test_refuses_relative_positions_and_gpt2_scalings():
    T = transformers
    rel = T.BertModel(T.BertConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=8,
                                   vocab_size=30, position_embedding_type="relative_key")).eval()
    _refused(rel.encoder.layer[0].attention, "BertSelfAttention", "relative_key")
    for flag, word in ((dict(scale_attn_by_inverse_layer_idx=True), "scale_attn_by_inverse_layer_idx"),
                       (dict(scale_attn_weights=False), "scale_attn_weights")):
        g = T.GPT2Model(T.GPT2Config(n_embd=16, n_layer=1, n_head=2, vocab_size=30, n_positions=16, **flag)).eval()
        _refused(g.h[0], "GPT2Attention", word)


def test_refuses_cross_attention_training_mode_and_unknown_modules():
    T = transformers
    g = T.GPT2Model(T.GPT2Config(n_embd=16, n_layer=1, n_head=2, vocab_size=30, n_positions=16,
                                 add_cross_attention=True)).eval()
    _refused(g.h[0].crossattention, "GPT2Attention", "cross-attention")
    lipcert.Layer.from_module(g.h[0])  # the block's own self-attention sublayer is fine
    b = make_model("bert", "small")
    b.train()
    _refused(b.encoder.layer[0].attention, "BertAttention", "training mode")
    _refused(torch.nn.Linear(4, 4), "Linear", "not an attention block")
    with pytest.raises(TypeError, match="module"):
        lipcert.Layer.from_module("encoder.layer.0")


def test_refuses_structures_that_change_the_map():
    b = make_model("bert", "small")
    att = b.encoder.layer[0].attention
    att.self.rotary_emb = torch.nn.Linear(8, 8).eval()  # a submodule the plain map does not have
    _refused(att, "BertSelfAttention", "rotary_emb")
    b = make_model("bert", "small")
    att = b.encoder.layer[0].attention
    att.self.key = torch.nn.Linear(32, 16).double().eval()  # two key heads shared by four query heads
    _refused(att, "BertSelfAttention", "grouped")
    g = make_model("gpt2", "small")
    n = g.h[0].attn.bias.shape[-1]
    band = torch.tril(torch.ones(n, n, dtype=torch.bool)) & ~torch.tril(torch.ones(n, n, dtype=torch.bool), -4)
    g.h[0].attn.bias.copy_(band.view(1, 1, n, n))  # a sliding window of 4 tokens
    _refused(g.h[0], "GPT2Attention", "sliding window")
    img = transformers.ImageGPTModel(transformers.ImageGPTConfig(n_embd=16, n_layer=1, n_head=2, vocab_size=20,
                                                                 n_positions=16)).eval()
    _refused(img.h[0], "ImageGPTBlock", "ln_1")  # its LayerNorm has no mean subtraction


def test_mismatched_heads_refused():
    b = make_model("bert", "small")
    with pytest.raises(ValueError, match="heads: 3 disagrees with the module's 4 heads"):
        lipcert.Layer.from_module(b.encoder.layer[0].attention, heads=3)
    layer = lipcert.Layer.from_module(b.encoder.layer[0].attention, heads=4)
    assert layer.heads == 4
    b.encoder.layer[0].attention.self.num_attention_heads = 5  # does not divide D = 32
    _refused(b.encoder.layer[0].attention, "BertSelfAttention", "5 heads")


def test_describe_names_the_tensors():
    g = make_model("gpt2", "small")
    spec = describe_module(g.h[1])
    names = spec.arrays["names"]
    assert names["wq"] == "attn.c_attn.weight[:, 0:32]^T"
    assert names["ln.weight"] == "ln_1.weight"
    # Conv1D is transposed: wq is the first third of c_attn.weight's columns, transposed.
    np.testing.assert_array_equal(spec.arrays["wq"], g.h[1].attn.c_attn.weight.detach().numpy()[:, :32].T)
