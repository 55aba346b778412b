"""Attention layers from PyTorch modules: torch.nn.MultiheadAttention and the attention
blocks of HuggingFace BERT, RoBERTa, DistilBERT, GPT-2 and ViT (and models derived from them).

Blocks are recognised by their structure (which projection submodules, biases, LayerNorm,
mask buffers and flags they hold), never by class name, so architectures that reuse a
BERT- or GPT-2-shaped block work unchanged. A module whose map is not exactly one of

    MHA(X)                     bare multi-head dot-product attention (softmax scale 1/sqrt(dk))
    LN(X + MHA(X))             post-LN sublayer (BERT, RoBERTa, DistilBERT)
    X + MHA(LN(X))             pre-LN sublayer (GPT-2, ViT)

(optionally causal) is refused with an error naming the module's class and what is not
supported; nothing is approximated.

Which module to pass:
    torch.nn.MultiheadAttention                 MHA alone (self-attention, causal=... by hand)
    BERT / RoBERTa   model.encoder.layer[i].attention   (self + output.dense + output.LayerNorm)
                     or model.encoder.layer[i] (its self-attention sublayer is taken)
    DistilBERT       model.transformer.layer[i]  (attention + sa_layer_norm: post-LN);
                     model.transformer.layer[i].attention alone is MHA alone
    GPT-2            model.h[i]                  (ln_1 + attn: pre-LN, causal);
                     model.h[i].attn alone is MHA alone (causal)
    ViT              model.encoder.layer[i]      (layernorm_before + attention: pre-LN);
                     model.encoder.layer[i].attention alone is MHA alone

attention_only=True drops the sublayer's LayerNorm and residual: the layer is MHA alone and
its centre is the input of MHA (for a pre-LN block that is LN(X), not X).

Weights are read in float64 (a float32 or bfloat16 weight converts exactly).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Dict, Optional, Tuple

import numpy as np

try:
    import torch
    from torch import nn
except ImportError as e:  # pragma: no cover - torch is an optional dependency
    raise ImportError("lipcert.torch_layers needs PyTorch (pip install 'lipcert[hf]' or torch)") from e


class UnsupportedModuleError(ValueError):
    """A module lipcert recognises as attention whose map it cannot certify exactly, or a
    module it does not recognise at all. Subclasses ValueError; the message names the
    module's class and what is unsupported."""


# --------------------------------------------------------------------------------------
# What a recognised block is


@dataclass
class BlockSpec:
    """A recognised attention block: the arrays of its certified map and how to compute that
    map (and its centre) with the module's own submodules in torch.

    structure: "bare" (MHA(X)), "post_ln" (LN(X + MHA(X))) or "pre_ln" (X + MHA(LN(X))).
    arrays: keyword arguments for lipcert.Layer.from_arrays.
    torch_map(x): the certified map of one sequence x (N, D) computed by the module's own
        submodules (in x's dtype); the reference the tests compare lipcert against.
    centre_of(x): the centre lipcert certifies around, given the hidden states entering the
        block (x itself, or LN(x) for a pre-LN block with attention_only).
    """

    module: nn.Module
    family: str  # "torch-mha" | "bert" | "distilbert" | "gpt2" | "vit"
    structure: str
    heads: int
    causal: bool
    arrays: Dict[str, object]
    torch_map: Callable[[torch.Tensor], torch.Tensor]
    centre_of: Callable[[torch.Tensor], torch.Tensor]
    hidden_arg: str = "hidden_states"  # the forward argument that carries X
    notes: Tuple[str, ...] = field(default_factory=tuple)


def _cls(m: nn.Module) -> str:
    return type(m).__name__


def _refuse(m: nn.Module, what: str) -> UnsupportedModuleError:
    return UnsupportedModuleError(f"module: {_cls(m)}: {what}")


def _f64(t: Optional[torch.Tensor]) -> Optional[np.ndarray]:
    if t is None:
        return None
    return t.detach().to(device="cpu", dtype=torch.float64).numpy().copy()


def _is_dropout(m: nn.Module) -> bool:
    return isinstance(m, nn.Dropout) and type(m).forward is nn.Dropout.forward


def _check_children(m: nn.Module, allowed: Dict[str, Callable[[nn.Module], bool]], what: str) -> None:
    """Every child of m must be one of `allowed` (name -> predicate): a submodule we do not know
    (rotary embeddings, relative position tables, a gate, a norm on q/k) may change the map."""
    for name, child in m.named_children():
        if name not in allowed:
            raise _refuse(m, f"unexpected submodule '{name}' ({_cls(child)}) in {what}; lipcert certifies "
                             "only plain softmax dot-product attention and cannot tell what it changes")
        if not allowed[name](child):
            raise _refuse(m, f"submodule '{name}' is a {_cls(child)}, not the plain layer {what} expects")


def _check_buffers(m: nn.Module, allowed: Tuple[str, ...], what: str) -> None:
    for name, _ in m.named_buffers(recurse=False):
        if name not in allowed:
            raise _refuse(m, f"unexpected buffer '{name}' in {what} (position tables or masks change the "
                             "attention logits; not supported)")


def _check_params(m: nn.Module, what: str) -> None:
    for name, _ in m.named_parameters(recurse=False):
        raise _refuse(m, f"unexpected parameter '{name}' in {what}; not supported")


def _plain_linear(m: nn.Module) -> bool:
    return isinstance(m, nn.Linear) and type(m).forward is nn.Linear.forward


def _conv1d_like(m: nn.Module) -> bool:
    """HuggingFace Conv1D: weight (in, out), forward x @ W + b (recognised by its nf attribute
    and shapes; its forward is addmm, checked by the tests on GPT-2)."""
    w = getattr(m, "weight", None)
    b = getattr(m, "bias", None)
    return (isinstance(w, torch.Tensor) and w.dim() == 2 and getattr(m, "nf", None) == w.shape[1]
            and isinstance(b, torch.Tensor) and b.shape == (w.shape[1],)
            and not list(m.children()))


def _plain_layer_norm(m: nn.Module, d: int) -> bool:
    return (isinstance(m, nn.LayerNorm) and type(m).forward is nn.LayerNorm.forward
            and tuple(m.normalized_shape) == (d,))


def _ln_arrays(m: nn.LayerNorm) -> Tuple[np.ndarray, np.ndarray, float]:
    d = m.normalized_shape[0]
    gamma = _f64(m.weight) if m.weight is not None else np.ones(d)
    beta = _f64(getattr(m, "bias", None)) if getattr(m, "bias", None) is not None else np.zeros(d)
    return gamma, beta, float(m.eps)


def _ln64(m: nn.LayerNorm, x: torch.Tensor) -> torch.Tensor:
    """The LayerNorm m applied in x's dtype (float64 for centres), with m's own parameters."""
    w = m.weight.to(x.dtype) if m.weight is not None else None
    b = m.bias.to(x.dtype) if getattr(m, "bias", None) is not None else None
    return torch.nn.functional.layer_norm(x, m.normalized_shape, w, b, m.eps)


def _linear_arrays(m: nn.Module) -> Tuple[np.ndarray, Optional[np.ndarray]]:
    return _f64(m.weight), _f64(m.bias)


def _check_heads(m: nn.Module, heads: int, rows_qk: int, rows_v: int, d_model: int, requested: Optional[int],
                 source: str) -> None:
    if requested is not None:
        if not isinstance(requested, (int, np.integer)) or isinstance(requested, bool) or requested <= 0:
            raise ValueError(f"heads: expected a positive integer, got {requested!r}")
        if requested != heads:
            raise ValueError(f"heads: {requested} disagrees with the module's {heads} heads ({_cls(m)}.{source})")
    if heads <= 0 or rows_qk % heads or rows_v % heads:
        raise _refuse(m, f"{heads} heads ({source}) do not divide the projection widths "
                         f"(query/key {rows_qk}, value {rows_v})")


def _is_training(m: nn.Module) -> bool:
    return any(sub.training for sub in m.modules())


# --------------------------------------------------------------------------------------
# Attention cores: the projections and heads of MHA itself


@dataclass
class _Core:
    heads: int
    wq: np.ndarray
    wk: np.ndarray
    wv: np.ndarray
    wo: np.ndarray
    bq: Optional[np.ndarray]
    bk: Optional[np.ndarray]
    bv: Optional[np.ndarray]
    bo: Optional[np.ndarray]
    names: Dict[str, str]
    causal: bool = False


def _core_torch_mha(m: nn.MultiheadAttention, requested: Optional[int]) -> _Core:
    if m.bias_k is not None or m.bias_v is not None:
        raise _refuse(m, "add_bias_kv=True (an extra learned key/value token) is not supported")
    if m.add_zero_attn:
        raise _refuse(m, "add_zero_attn=True (an extra zero key/value token) is not supported")
    d = m.embed_dim
    if m.kdim != d or m.vdim != d:
        raise _refuse(m, f"kdim={m.kdim}, vdim={m.vdim} differ from embed_dim={d}: keys/values of another "
                         "width are cross-attention; lipcert certifies self-attention")
    if m.in_proj_weight is not None:
        w = _f64(m.in_proj_weight)
        wq, wk, wv = w[:d], w[d:2 * d], w[2 * d:]
        names = {"wq": f"in_proj_weight[0:{d}]", "wk": f"in_proj_weight[{d}:{2 * d}]",
                 "wv": f"in_proj_weight[{2 * d}:{3 * d}]"}
    else:
        wq, wk, wv = _f64(m.q_proj_weight), _f64(m.k_proj_weight), _f64(m.v_proj_weight)
        names = {"wq": "q_proj_weight", "wk": "k_proj_weight", "wv": "v_proj_weight"}
    bq = bk = bv = None
    if m.in_proj_bias is not None:
        b = _f64(m.in_proj_bias)
        bq, bk, bv = b[:d], b[d:2 * d], b[2 * d:]
        names.update({"bq": f"in_proj_bias[0:{d}]", "bk": f"in_proj_bias[{d}:{2 * d}]",
                      "bv": f"in_proj_bias[{2 * d}:{3 * d}]"})
    wo, bo = _linear_arrays(m.out_proj)
    names["wo"] = "out_proj.weight"
    if bo is not None:
        names["bo"] = "out_proj.bias"
    _check_heads(m, m.num_heads, wq.shape[0], wv.shape[0], d, requested, "num_heads")
    return _Core(m.num_heads, wq, wk, wv, wo, bq, bk, bv, bo, names)


def _child(m: Optional[nn.Module], name: str) -> Optional[nn.Module]:
    c = getattr(m, name, None) if m is not None else None
    return c if isinstance(c, nn.Module) else None


def _is_qkv_core(m: Optional[nn.Module]) -> bool:
    """BERT/RoBERTa/ViT self-attention: query, key, value nn.Linear and num_attention_heads."""
    return m is not None and all(_plain_linear(_child(m, n)) for n in ("query", "key", "value")) \
        and hasattr(m, "num_attention_heads")


def _qkv_core(m: nn.Module, dense: nn.Module, dense_name: str, requested: Optional[int]) -> _Core:
    what = "a BERT-style self-attention (query, key, value)"
    pe = getattr(m, "position_embedding_type", "absolute")
    if pe not in (None, "absolute"):
        raise _refuse(m, f"position_embedding_type='{pe}' adds position terms to the attention logits; "
                         "only 'absolute' (positions added to the embeddings) is supported")
    if getattr(m, "is_cross_attention", False):
        raise _refuse(m, "cross-attention (keys and values from another sequence) is not supported")
    for flag in ("sliding_window", "window_size", "attention_window"):
        v = getattr(m, flag, None)
        if v not in (None, 0, False):
            raise _refuse(m, f"{flag}={v!r}: windowed attention is not supported")
    _check_children(m, {"query": _plain_linear, "key": _plain_linear, "value": _plain_linear,
                        "dropout": _is_dropout}, what)
    _check_buffers(m, (), what)
    _check_params(m, what)
    heads = int(m.num_attention_heads)
    head_size = int(getattr(m, "attention_head_size", m.query.out_features // max(heads, 1)))
    wq, bq = _linear_arrays(m.query)
    wk, bk = _linear_arrays(m.key)
    wv, bv = _linear_arrays(m.value)
    if wk.shape != wq.shape:
        raise _refuse(m, f"key projection {tuple(wk.shape)} differs from query projection {tuple(wq.shape)} "
                         "(grouped or multi-query keys are not supported)")
    _check_heads(m, heads, wq.shape[0], wv.shape[0], wq.shape[1], requested, "num_attention_heads")
    if heads * head_size != wq.shape[0]:
        raise _refuse(m, f"attention_head_size {head_size} x {heads} heads != query width {wq.shape[0]}")
    wo, bo = _linear_arrays(dense)
    names = {"wq": "query.weight", "wk": "key.weight", "wv": "value.weight", "wo": f"{dense_name}.weight"}
    for k, b, n in (("bq", bq, "query"), ("bk", bk, "key"), ("bv", bv, "value"), ("bo", bo, dense_name)):
        if b is not None:
            names[k] = f"{n}.bias"
    # BertModel turns config.is_decoder into a causal mask on the self-attention.
    return _Core(heads, wq, wk, wv, wo, bq, bk, bv, bo, names, causal=bool(getattr(m, "is_decoder", False)))


def _is_distil_core(m: nn.Module) -> bool:
    return all(isinstance(getattr(m, n, None), nn.Module) for n in ("q_lin", "k_lin", "v_lin", "out_lin")) \
        and hasattr(m, "n_heads")


def _distil_core(m: nn.Module, requested: Optional[int]) -> _Core:
    what = "a DistilBERT-style self-attention (q_lin, k_lin, v_lin, out_lin)"
    _check_children(m, {"q_lin": _plain_linear, "k_lin": _plain_linear, "v_lin": _plain_linear,
                        "out_lin": _plain_linear, "dropout": _is_dropout}, what)
    _check_buffers(m, (), what)
    _check_params(m, what)
    if getattr(m, "is_causal", False):
        raise _refuse(m, "is_causal=True on a DistilBERT-style attention is not a configuration lipcert knows")
    heads = int(m.n_heads)
    wq, bq = _linear_arrays(m.q_lin)
    wk, bk = _linear_arrays(m.k_lin)
    wv, bv = _linear_arrays(m.v_lin)
    wo, bo = _linear_arrays(m.out_lin)
    if wk.shape != wq.shape:
        raise _refuse(m, f"key projection {tuple(wk.shape)} differs from query projection {tuple(wq.shape)} "
                         "(grouped or multi-query keys are not supported)")
    _check_heads(m, heads, wq.shape[0], wv.shape[0], wq.shape[1], requested, "n_heads")
    names = {"wq": "q_lin.weight", "wk": "k_lin.weight", "wv": "v_lin.weight", "wo": "out_lin.weight"}
    for k, b, n in (("bq", bq, "q_lin"), ("bk", bk, "k_lin"), ("bv", bv, "v_lin"), ("bo", bo, "out_lin")):
        if b is not None:
            names[k] = f"{n}.bias"
    return _Core(heads, wq, wk, wv, wo, bq, bk, bv, bo, names)


def _is_gpt2_core(m: nn.Module) -> bool:
    return isinstance(getattr(m, "c_attn", None), nn.Module) and isinstance(getattr(m, "c_proj", None), nn.Module) \
        and hasattr(m, "num_heads")


def _gpt2_core(m: nn.Module, requested: Optional[int]) -> _Core:
    what = "a GPT-2-style attention (c_attn, c_proj)"
    if getattr(m, "is_cross_attention", False) or hasattr(m, "q_attn"):
        raise _refuse(m, "cross-attention (is_cross_attention, q_attn) is not supported")
    if not getattr(m, "scale_attn_weights", True):
        raise _refuse(m, "scale_attn_weights=False (logits not scaled by 1/sqrt(dk)) is not supported")
    if getattr(m, "scale_attn_by_inverse_layer_idx", False):
        raise _refuse(m, "scale_attn_by_inverse_layer_idx=True (logits also divided by layer_idx + 1) "
                         "is not supported")
    _check_children(m, {"c_attn": lambda c: _conv1d_like(c) or _plain_linear(c),
                        "c_proj": lambda c: _conv1d_like(c) or _plain_linear(c),
                        "attn_dropout": _is_dropout, "resid_dropout": _is_dropout}, what)
    _check_buffers(m, ("bias", "masked_bias"), what)
    _check_params(m, what)

    def as_linear(c: nn.Module) -> Tuple[np.ndarray, Optional[np.ndarray]]:
        # Conv1D computes x W + b with W (in, out): the nn.Linear weight is W^T.
        if _plain_linear(c):
            return _linear_arrays(c)
        return _f64(c.weight).T.copy(), _f64(c.bias)

    w, b = as_linear(m.c_attn)
    d = w.shape[1]
    if w.shape[0] != 3 * d:
        raise _refuse(m, f"c_attn maps {d} to {w.shape[0]} features, not 3 x {d} (grouped or multi-query keys "
                         "are not supported)")
    if getattr(m, "split_size", d) != d:
        raise _refuse(m, f"split_size {m.split_size} != embedding width {d} (pruned heads are not supported)")
    wo, bo = as_linear(m.c_proj)
    heads = int(m.num_heads)
    _check_heads(m, heads, d, d, d, requested, "num_heads")
    if getattr(m, "head_dim", d // heads) * heads != d:
        raise _refuse(m, f"head_dim {m.head_dim} x {heads} heads != width {d}")
    bias = getattr(m, "bias", None)
    if isinstance(bias, torch.Tensor) and bias.dim() == 4:
        n = bias.shape[-1]
        if not torch.equal(bias[0, 0].bool().cpu(), torch.tril(torch.ones(n, n, dtype=torch.bool))):
            raise _refuse(m, "its mask buffer 'bias' is not the causal lower triangle (a local or sliding window "
                             "attention); not supported")
    t = "weight[:, {}:{}]^T" if not _plain_linear(m.c_attn) else "weight[{}:{}]"
    names = {"wq": "c_attn." + t.format(0, d), "wk": "c_attn." + t.format(d, 2 * d),
             "wv": "c_attn." + t.format(2 * d, 3 * d),
             "wo": "c_proj.weight^T" if not _plain_linear(m.c_proj) else "c_proj.weight"}
    bq = bk = bv = None
    if b is not None:
        bq, bk, bv = b[:d], b[d:2 * d], b[2 * d:]
        names.update({"bq": f"c_attn.bias[0:{d}]", "bk": f"c_attn.bias[{d}:{2 * d}]",
                      "bv": f"c_attn.bias[{2 * d}:{3 * d}]"})
    if bo is not None:
        names["bo"] = "c_proj.bias"
    # GPT-2's attention is always causal (its mask buffer, checked above).
    return _Core(heads, w[:d], w[d:2 * d], w[2 * d:], wo, bq, bk, bv, bo, names, causal=True)


# --------------------------------------------------------------------------------------
# torch maps of the cores (the module's own forward, one sequence at a time)


def _causal_mask(n: int, device) -> torch.Tensor:
    return torch.triu(torch.ones(n, n, dtype=torch.bool, device=device), diagonal=1)


def _mha_torch(m: nn.MultiheadAttention, causal: bool) -> Callable[[torch.Tensor], torch.Tensor]:
    def f(x: torch.Tensor) -> torch.Tensor:
        xb = x.unsqueeze(0) if m.batch_first else x.unsqueeze(1)
        mask = _causal_mask(x.shape[0], x.device) if causal else None
        y = m(xb, xb, xb, need_weights=False, attn_mask=mask)[0]
        return y[0] if m.batch_first else y[:, 0]
    return f


def _bert_self_torch(attn: nn.Module, causal: bool) -> Callable[[torch.Tensor], torch.Tensor]:
    """BERT-style attention block (self + output): block(x, mask)[0]."""
    def f(x: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]
        mask = None
        if causal:
            mask = torch.zeros(1, 1, n, n, dtype=x.dtype, device=x.device)
            mask = mask.masked_fill(_causal_mask(n, x.device), torch.finfo(x.dtype).min)
        return attn(x.unsqueeze(0), mask)[0][0]
    return f


def _distil_torch(attn: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    def f(x: torch.Tensor) -> torch.Tensor:
        xb = x.unsqueeze(0)
        mask = torch.ones(1, x.shape[0], dtype=torch.long, device=x.device)
        return attn(query=xb, key=xb, value=xb, mask=mask)[0][0]
    return f


def _gpt2_torch(attn: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    def f(x: torch.Tensor) -> torch.Tensor:
        return attn(x.unsqueeze(0))[0][0]
    return f


# --------------------------------------------------------------------------------------
# Blocks


def _bert_output_parts(out: nn.Module, d: int) -> Tuple[nn.Module, Optional[nn.LayerNorm]]:
    """The output half of a BERT/ViT attention block: dense [+ LayerNorm] (+ dropout)."""
    what = "an attention output (dense, LayerNorm, dropout)"
    ln = getattr(out, "LayerNorm", None)
    allowed = {"dense": _plain_linear, "dropout": _is_dropout}
    if ln is not None:
        allowed["LayerNorm"] = lambda c: _plain_layer_norm(c, d)
    _check_children(out, allowed, what)
    _check_buffers(out, (), what)
    _check_params(out, what)
    return out.dense, ln


def _is_bert_attention(m: Optional[nn.Module]) -> bool:
    return _is_qkv_core(_child(m, "self")) and _child(_child(m, "output"), "dense") is not None


def _is_vit_attention(m: Optional[nn.Module]) -> bool:
    return _is_qkv_core(_child(m, "attention")) and _child(_child(m, "output"), "dense") is not None


def _spec_bert_attention(m: nn.Module, self_name: str, requested: Optional[int], attention_only: bool) -> BlockSpec:
    """BERT/RoBERTa BertAttention (self + output with LayerNorm: post-LN) or ViTAttention
    (attention + output without LayerNorm: bare MHA)."""
    core_mod = getattr(m, self_name)
    d = core_mod.query.in_features
    dense, ln = _bert_output_parts(m.output, d)
    allowed = {self_name: lambda c: True, "output": lambda c: True}
    _check_children(m, allowed, "an attention block (self-attention and its output)")
    _check_params(m, "an attention block")
    core = _qkv_core(core_mod, dense, "output.dense", requested)
    core.names = {k: (v if v.startswith("output.") else f"{self_name}.{v}") for k, v in core.names.items()}
    family = "bert" if ln is not None else "vit"
    ref = _bert_self_torch(m, core.causal)
    if ln is not None and not attention_only:
        return _make_spec(m, family, "post_ln", core, ref, post_ln=ln, ln_name="output.LayerNorm")
    if ln is not None:  # attention_only: MHA alone = dense(self(x)), without residual and LayerNorm
        def mha_only(x: torch.Tensor, m=m) -> torch.Tensor:
            n = x.shape[0]
            mask = None
            if core.causal:
                mask = torch.zeros(1, 1, n, n, dtype=x.dtype, device=x.device).masked_fill(
                    _causal_mask(n, x.device), torch.finfo(x.dtype).min)
            return m.output.dense(getattr(m, self_name)(x.unsqueeze(0), mask)[0])[0]
        return _make_spec(m, family, "bare", core, mha_only)
    return _make_spec(m, family, "bare", core, ref)


def _make_spec(m, family, structure, core: _Core, ref, pre_ln=None, post_ln=None, ln_name="",
               centre_of=None, hidden_arg="hidden_states") -> BlockSpec:
    arrays = dict(kind="dot", heads=core.heads, wq=core.wq, wk=core.wk, wv=core.wv, wo=core.wo,
                  bq=core.bq, bk=core.bk, bv=core.bv, bo=core.bo, causal=core.causal,
                  layer_norm=None, post_layer_norm=None, names=dict(core.names))
    if pre_ln is not None:
        arrays["layer_norm"] = _ln_arrays(pre_ln)
        arrays["names"].update({"ln.weight": f"{ln_name}.weight", "ln.bias": f"{ln_name}.bias",
                                "ln.eps": f"{ln_name}.eps"})
    if post_ln is not None:
        arrays["post_layer_norm"] = _ln_arrays(post_ln)
        arrays["names"].update({"post_ln.weight": f"{ln_name}.weight", "post_ln.bias": f"{ln_name}.bias",
                                "post_ln.eps": f"{ln_name}.eps"})
    return BlockSpec(module=m, family=family, structure=structure, heads=core.heads, causal=core.causal,
                     arrays=arrays, torch_map=ref, centre_of=centre_of or (lambda x: x), hidden_arg=hidden_arg)


def _pre_ln_spec(m, family, core, core_map, ln, ln_name, attention_only, hidden_arg="hidden_states") -> BlockSpec:
    if attention_only:
        return _make_spec(m, family, "bare", core, core_map, centre_of=lambda x: _ln64(ln, x), hidden_arg=hidden_arg)

    def sub(x: torch.Tensor) -> torch.Tensor:
        return x + core_map(ln(x))
    return _make_spec(m, family, "pre_ln", core, sub, pre_ln=ln, ln_name=ln_name, hidden_arg=hidden_arg)


class _NotRecognised(UnsupportedModuleError):
    """The module has none of the structures lipcert recognises (capture walks past it)."""


def describe_module(module: nn.Module, attention_only: bool = False, heads: Optional[int] = None,
                    causal: Optional[bool] = None) -> BlockSpec:
    """Recognises `module` and returns its BlockSpec; raises UnsupportedModuleError (a ValueError)
    naming the module's class and the reason when lipcert cannot certify it exactly, TypeError
    when `module` is not a torch.nn.Module, ValueError when `heads` disagrees with the module.

    causal applies to torch.nn.MultiheadAttention only (whose mask is a call argument, not part
    of the module); every other block carries its own causality."""
    if not isinstance(module, nn.Module):
        raise TypeError(f"module: expected a torch.nn.Module, got {type(module).__name__}")
    if not isinstance(attention_only, bool):
        raise TypeError(f"attention_only: expected a bool, got {type(attention_only).__name__}")
    spec = _match(module, attention_only, heads, causal, delegate=True)
    if _is_training(module):
        raise _refuse(module, "is in training mode (dropout is random there); call model.eval() first")
    return spec


def _match(m: nn.Module, attention_only: bool, heads: Optional[int], causal: Optional[bool],
           delegate: bool) -> BlockSpec:
    """describe_module without the argument checks. delegate: a BERT layer (attention +
    intermediate + output) stands for its attention block (capture hooks the block itself)."""

    # torch.nn.MultiheadAttention (self-attention: query = key = value).
    if isinstance(m, nn.MultiheadAttention):
        core = _core_torch_mha(m, heads)
        core.causal = bool(causal)
        return _make_spec(m, "torch-mha", "bare", core, _mha_torch(m, core.causal), hidden_arg="query")
    if causal is not None:
        raise ValueError(f"causal: only for torch.nn.MultiheadAttention; {_cls(m)} carries its own mask")

    # BERT / RoBERTa attention block (self + output [+ LayerNorm]); ViTAttention (attention + output).
    if _is_bert_attention(m):
        return _spec_bert_attention(m, "self", heads, attention_only)
    if _is_vit_attention(m) and _child(m, "layernorm_before") is None:
        return _spec_bert_attention(m, "attention", heads, attention_only)

    # ViT layer: layernorm_before + attention (ViTAttention): pre-LN X + MHA(LN(X)).
    lnb = _child(m, "layernorm_before")
    att = _child(m, "attention")
    if lnb is not None and _is_vit_attention(att):
        inner = _spec_bert_attention(att, "attention", heads, True)
        core_d = att.attention.query.in_features
        if not _plain_layer_norm(lnb, core_d):
            raise _refuse(m, f"layernorm_before is a {_cls(lnb)}, not a LayerNorm over {core_d} features")
        core = _Core(inner.heads, **{k: inner.arrays[k] for k in ("wq", "wk", "wv", "wo", "bq", "bk", "bv", "bo")},
                     names={k: f"attention.{v}" for k, v in inner.arrays["names"].items()}, causal=inner.causal)
        return _pre_ln_spec(m, "vit", core, inner.torch_map, lnb, "layernorm_before", attention_only)

    # BERT layer (attention [+ crossattention] + intermediate + output): its self-attention sublayer.
    if delegate and _is_bert_attention(att):
        spec = _spec_bert_attention(att, "self", heads, attention_only)
        spec.arrays["names"] = {k: f"attention.{v}" for k, v in spec.arrays["names"].items()}
        return spec

    # DistilBERT: TransformerBlock (attention + sa_layer_norm: post-LN), or its attention alone.
    if _is_distil_core(m):
        core = _distil_core(m, heads)
        return _make_spec(m, "distilbert", "bare", core, _distil_torch(m), hidden_arg="query")
    sa_ln = _child(m, "sa_layer_norm")
    if att is not None and _is_distil_core(att) and sa_ln is not None:
        core = _distil_core(att, heads)
        core.names = {k: f"attention.{v}" for k, v in core.names.items()}
        d = att.q_lin.in_features
        if not _plain_layer_norm(sa_ln, d):
            raise _refuse(m, f"sa_layer_norm is a {_cls(sa_ln)}, not a LayerNorm over {d} features")
        amap = _distil_torch(att)
        if attention_only:
            return _make_spec(m, "distilbert", "bare", core, amap, hidden_arg="x")

        def post(x: torch.Tensor) -> torch.Tensor:
            return sa_ln(amap(x) + x)
        return _make_spec(m, "distilbert", "post_ln", core, post, post_ln=sa_ln, ln_name="sa_layer_norm",
                          hidden_arg="x")

    # GPT-2: block (ln_1 + attn: pre-LN, causal), or its attention alone.
    if _is_gpt2_core(m):
        core = _gpt2_core(m, heads)
        return _make_spec(m, "gpt2", "bare", core, _gpt2_torch(m))
    attn, ln_1 = _child(m, "attn"), _child(m, "ln_1")
    if attn is not None and _is_gpt2_core(attn) and ln_1 is not None:
        core = _gpt2_core(attn, heads)
        core.names = {k: f"attn.{v}" for k, v in core.names.items()}
        d = core.wq.shape[1]
        if not _plain_layer_norm(ln_1, d):
            raise _refuse(m, f"ln_1 is a {_cls(ln_1)}, not a LayerNorm over {d} features")
        return _pre_ln_spec(m, "gpt2", core, _gpt2_torch(attn), ln_1, "ln_1", attention_only)

    raise _NotRecognised(
        f"module: {_cls(m)} is not an attention block lipcert recognises (torch.nn.MultiheadAttention, or a "
        "HuggingFace BERT/RoBERTa attention block, DistilBERT TransformerBlock, GPT-2 block or ViT layer "
        "by their structure); see docs/python.md")


def layer_from_module(module: nn.Module, attention_only: bool = False, heads: Optional[int] = None,
                      causal: Optional[bool] = None):
    """lipcert.Layer of a PyTorch attention module (see the module docstring for which module to
    pass). heads, when given, must agree with the module. causal: torch.nn.MultiheadAttention only."""
    spec = describe_module(module, attention_only=attention_only, heads=heads, causal=causal)
    return layer_from_spec(spec)


def layer_from_spec(spec: BlockSpec, name_prefix: str = "", source: Optional[str] = None,
                    layer_index: Optional[int] = None):
    """The lipcert.Layer of a BlockSpec; name_prefix goes before every tensor name (the block's
    path in its model), source and layer_index into the layer's provenance."""
    from . import Layer  # the core's Layer (lipcert/__init__.py)

    arrays = dict(spec.arrays)
    if name_prefix:
        arrays["names"] = {k: f"{name_prefix}.{v}" for k, v in arrays["names"].items()}
    if source is not None:
        arrays["source"] = source
    if layer_index is not None:
        arrays["layer_index"] = layer_index
    return Layer.from_arrays(**arrays)


# Layer.from_module (lipcert/layer.py) calls this name.
from_module = layer_from_module


__all__ = ["BlockSpec", "UnsupportedModuleError", "describe_module", "from_module", "layer_from_module",
           "layer_from_spec"]
