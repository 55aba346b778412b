"""Capture the centres a model computes: run the user's own forward pass once, record the
hidden states entering every attention block lipcert recognises, and return per block the
lipcert.Layer built from its weights and the centre X0 of each sequence.

    caps = lipcert.capture(model, input_ids=ids, attention_mask=mask)
    for c in caps:
        cert = lipcert.certify(c.layer, c.centres[0], relative_radius=0.01)

The centre is what enters the certified map: for a post-LN block (BERT) the block's input X,
for a pre-LN block (GPT-2, ViT) the sublayer's input X before its LayerNorm; with
attention_only=True the input of MHA itself (LN(X) for a pre-LN block). Padding is removed
with the attention_mask passed to the model (or an nn.MultiheadAttention's key_padding_mask):
each sequence's centre holds only its real tokens, in order, as float64 (N_i, D).

Each block's forward is wrapped for the one call (an instance attribute over the class's
forward, removed afterwards), which sees positional and keyword arguments alike on every
torch version; the call runs under torch.no_grad().
"""

from __future__ import annotations

import inspect
import sys
import types
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Sequence

import numpy as np
import torch
from torch import nn

from .torch_layers import (BlockSpec, UnsupportedModuleError, _NotRecognised, _child, _cls, _match, _is_training,
                           layer_from_spec)


@dataclass
class CapturedLayer:
    """One attention block of a captured model.

    index: position among the captured blocks (model order); name: the module's path in the
    model ("encoder.layer.3.attention"); layer: the lipcert.Layer of its certified map;
    centres: one float64 array (N_i, D) per sequence, padding removed; spec: how the block
    was recognised (family, structure, torch_map for checks)."""

    index: int
    name: str
    module_class: str
    layer: Any
    centres: List[np.ndarray]
    spec: BlockSpec

    @property
    def family(self) -> str:
        return self.spec.family

    @property
    def structure(self) -> str:
        return self.spec.structure

    def __repr__(self) -> str:
        sizes = ",".join(str(c.shape[0]) for c in self.centres)
        return (f"CapturedLayer({self.index}: {self.name} [{self.module_class}, {self.spec.family} "
                f"{self.spec.structure}{', causal' if self.spec.causal else ''}, H={self.spec.heads}], "
                f"tokens {sizes})")


@dataclass
class Capture:
    """The captured blocks in model order (iterable, indexable) and the model's own output."""

    layers: List[CapturedLayer]
    output: Any = None
    model_class: str = ""
    attention_only: bool = False
    dtype: str = ""  # the dtype the hidden states had before their conversion to float64
    notes: List[str] = field(default_factory=list)

    def __iter__(self) -> Iterator[CapturedLayer]:
        return iter(self.layers)

    def __len__(self) -> int:
        return len(self.layers)

    def __getitem__(self, i: int) -> CapturedLayer:
        return self.layers[i]

    def __repr__(self) -> str:
        return f"Capture({self.model_class}, {len(self.layers)} blocks: " + \
            "; ".join(f"{c.index} {c.name}" for c in self.layers) + ")"


def find_blocks(model: nn.Module, attention_only: bool = False) -> List[tuple]:
    """The attention blocks of `model` that lipcert recognises, as (name, BlockSpec) in model
    order: a pre-order walk that takes the largest recognised unit (a GPT-2 block, not its
    attention) and skips its descendants. A recognised block lipcert cannot certify raises
    UnsupportedModuleError naming its path and class."""
    found: List[tuple] = []
    skip: Optional[str] = None
    for name, m in model.named_modules():
        if skip is not None and (name == skip or name.startswith(skip + ".")):
            continue
        skip = None
        try:
            spec = _match(m, attention_only, None, None, delegate=False)
        except _NotRecognised:
            continue
        except UnsupportedModuleError as e:
            raise UnsupportedModuleError(f"{name or '<model>'}: {e}") from None
        found.append((name, spec))
        skip = name
    return found


def _is_causal_mask(mask: torch.Tensor, n: int) -> Optional[bool]:
    """True for exactly the causal mask of n tokens (bool: True above the diagonal; float: -inf
    above, 0 elsewhere), False for an all-allowing one, None for anything else."""
    if mask.dim() != 2 or tuple(mask.shape) != (n, n):
        return None
    upper = torch.triu(torch.ones(n, n, dtype=torch.bool, device=mask.device), diagonal=1)
    if mask.dtype == torch.bool:
        blocked = mask
    else:
        if not bool(torch.all((mask == 0) | torch.isneginf(mask))):
            return None
        blocked = torch.isneginf(mask)
    if torch.equal(blocked, upper):
        return True
    if not bool(blocked.any()):
        return False
    return None


class _Recorder:
    """Wraps one block's forward for the captured call and keeps what entered it."""

    def __init__(self, name: str, spec: BlockSpec):
        self.name = name
        self.spec = spec
        self.module = spec.module
        self.calls: List[Dict[str, Any]] = []
        self.original = None
        self.error: Optional[BaseException] = None

    def install(self) -> None:
        m = self.module
        self.original = m.forward  # the bound method (of the class, or an earlier instance wrapper)
        sig = inspect.signature(self.original)
        recorder = self

        def wrapped(*args, **kwargs):
            try:
                recorder.record(sig.bind(*args, **kwargs).arguments)
            except Exception as e:  # refused mid-forward: remember, finish the model's call, raise after
                if recorder.error is None:
                    recorder.error = e
            return recorder.original(*args, **kwargs)

        m.forward = wrapped

    def remove(self) -> None:
        if "forward" in self.module.__dict__:
            del self.module.__dict__["forward"]
        if self.original is not None and getattr(self.original, "__self__", None) is not self.module:
            self.module.forward = self.original  # an instance-level forward the user had set

    def _refuse(self, what: str) -> UnsupportedModuleError:
        return UnsupportedModuleError(f"{self.name or '<model>'}: module: {_cls(self.module)}: {what}")

    def record(self, a: Dict[str, Any]) -> None:
        spec = self.spec
        x = a.get(spec.hidden_arg)
        if not isinstance(x, torch.Tensor) or x.dim() not in (2, 3):
            raise self._refuse(f"its input '{spec.hidden_arg}' is not a (batch, tokens, width) tensor")
        for k in ("past_key_value", "layer_past", "past_key_values"):
            if a.get(k) is not None:
                raise self._refuse(f"called with cached keys ({k}); capture a forward pass without a cache")
        if a.get("head_mask") is not None:
            raise self._refuse("called with a head_mask (heads scaled or switched off); not supported")
        # A GPT-2 block with cross-attention still begins with its own self-attention sublayer,
        # the one certified; any other block given encoder_hidden_states is cross-attention.
        if a.get("encoder_hidden_states") is not None and _child(spec.module, "ln_1") is None:
            raise self._refuse("used as cross-attention (encoder_hidden_states); lipcert certifies self-attention")
        call: Dict[str, Any] = {}
        if spec.family == "torch-mha":
            m = self.module
            k, v = a.get("key"), a.get("value")
            if not (k is x or torch.equal(k, x)) or not (v is x or torch.equal(v, x)):
                raise self._refuse("called with key/value other than query (cross-attention); not supported")
            if x.dim() == 2:
                x = x.unsqueeze(0 if m.batch_first else 1)
            if not m.batch_first:
                x = x.transpose(0, 1)
            n = x.shape[1]
            causal = bool(a.get("is_causal", False))
            mask = a.get("attn_mask")
            if mask is not None:
                c = _is_causal_mask(mask, n)
                if c is None:
                    raise self._refuse("called with an attn_mask that is neither causal nor empty; not supported")
                causal = causal or c
            call["causal"] = causal
            kpm = a.get("key_padding_mask")
            if kpm is not None:
                keep = ~kpm if kpm.dtype == torch.bool else ~torch.isneginf(kpm)
                call["keep"] = keep.detach().cpu()
        else:
            if spec.hidden_arg == "query":  # an attention called as f(query, key, value)
                k, v = a.get("key"), a.get("value")
                if not (k is x or torch.equal(k, x)) or not (v is x or torch.equal(v, x)):
                    raise self._refuse("called with key/value other than query (cross-attention); not supported")
            if x.dim() == 2:
                x = x.unsqueeze(0)
        call["x"] = x.detach().to(device="cpu")
        self.calls.append(call)


def capture(model: nn.Module, *args, attention_only: bool = False, **kwargs) -> Capture:
    """Runs model(*args, **kwargs) once under torch.no_grad() and returns the Capture of every
    attention block lipcert recognises (see the module docstring). kwargs["attention_mask"]
    (batch, tokens), when given, removes padding from the centres.

    Raises TypeError when model is not an nn.Module, UnsupportedModuleError (a ValueError)
    naming the block's path and class for a block lipcert cannot certify, for a model in
    training mode, and when no block is recognised."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(attention_only, bool):
        raise TypeError(f"attention_only: expected a bool, got {type(attention_only).__name__}")
    if _is_training(model):
        raise UnsupportedModuleError(f"model: {_cls(model)} is in training mode (dropout is random there); "
                                     "call model.eval() first")
    blocks = find_blocks(model, attention_only)
    if not blocks:
        hints = sorted({_cls(m) for _, m in model.named_modules() if "attention" in _cls(m).lower()})
        extra = f" (attention modules of other kinds: {', '.join(hints)})" if hints else ""
        raise UnsupportedModuleError(f"model: {_cls(model)} has no attention block lipcert recognises{extra}; "
                                     "see docs/python.md for the supported structures")
    recorders = [_Recorder(name, spec) for name, spec in blocks]
    try:
        for r in recorders:
            r.install()
        with torch.no_grad():
            output = model(*args, **kwargs)
    finally:
        for r in recorders:
            r.remove()
    for r in recorders:
        if r.error is not None:
            raise r.error
    mask = kwargs.get("attention_mask")
    if mask is not None and not isinstance(mask, torch.Tensor):
        mask = torch.as_tensor(np.asarray(mask))
    captured: List[CapturedLayer] = []
    dtypes = set()
    source = str(getattr(model, "name_or_path", "") or _cls(model))
    for r in recorders:
        if not r.calls:
            continue  # a block the forward pass did not use (e.g. a pooler-only branch)
        spec = r.spec
        if spec.family == "torch-mha":
            flags = {c["causal"] for c in r.calls}
            if len(flags) > 1:
                raise UnsupportedModuleError(f"{r.name}: module: {_cls(r.module)}: called both with and without "
                                             "a causal mask; capture one kind of call")
            if flags == {True}:
                spec = _match(r.module, attention_only, None, True, delegate=False)
        centres: List[np.ndarray] = []
        for c in r.calls:
            x = c["x"]
            dtypes.add(str(x.dtype).replace("torch.", ""))
            keep = c.get("keep")
            if keep is None and mask is not None:
                if tuple(mask.shape) != tuple(x.shape[:2]):
                    raise ValueError(f"attention_mask: shape {tuple(mask.shape)} does not match the "
                                     f"(batch, tokens) {tuple(x.shape[:2])} entering {r.name}")
                keep = mask.detach().cpu() != 0
            with torch.no_grad():
                x64 = spec.centre_of(x.to(torch.float64))
            for b in range(x64.shape[0]):
                rows = x64[b] if keep is None else x64[b][keep[b]]
                if rows.shape[0] == 0:
                    raise ValueError(f"attention_mask: sequence {b} has no real token")
                centres.append(rows.numpy().copy())
        layer = layer_from_spec(spec, name_prefix=r.name, source=source, layer_index=len(captured))
        captured.append(CapturedLayer(len(captured), r.name, _cls(r.module), layer, centres, spec))
    if not captured:
        raise UnsupportedModuleError(f"model: {_cls(model)}: the forward pass used none of its recognised "
                                     "attention blocks")
    return Capture(captured, output, _cls(model), attention_only, ",".join(sorted(dtypes)))


__all__ = ["Capture", "CapturedLayer", "capture", "find_blocks"]


class _CallableModule(types.ModuleType):
    """Importing lipcert.capture (this module) sets the attribute lipcert.capture to the module,
    over the package's lazy function of the same name; calling the module calls capture(), so
    `lipcert.capture(model, ...)` works either way."""

    def __call__(self, model, *args, **kwargs):
        return capture(model, *args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
