#!/usr/bin/python3
"""A tiny safetensors writer and reader (numpy only), for the scripts in this folder.

Layout (https://huggingface.co/docs/safetensors): an 8-byte little-endian u64 N, then N
bytes of UTF-8 JSON header {name: {"dtype", "shape", "data_offsets": [begin, end]}, ...,
"__metadata__": {str: str}}, then the byte buffer (offsets relative to its start).
Tensors are stored in sorted name order, little-endian, C order; the header is padded
with spaces to a multiple of 8 bytes, as the reference implementation does.

Debian ships no python3-safetensors; this module is enough for F64 / F32 / F16 / I64.
"""

import json
import struct

import numpy as np

_DTYPES = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
}
_NAMES = {v: k for k, v in _DTYPES.items()}


def _as_numpy(t):
    """Accepts numpy arrays and torch tensors (without importing torch here)."""
    if hasattr(t, "detach"):
        t = t.detach().cpu().numpy()
    return np.asarray(t)


def encode(tensors, metadata=None):
    """Returns the bytes of a safetensors file holding `tensors` (name -> array)."""
    header = {}
    chunks = []
    offset = 0
    for name in sorted(tensors):
        a = _as_numpy(tensors[name])
        dt = a.dtype.newbyteorder("<")
        if dt not in _NAMES:
            raise ValueError(f"{name}: unsupported dtype {a.dtype}")
        if not np.all(np.isfinite(a)):
            raise ValueError(f"{name}: contains NaN or Inf")
        raw = np.ascontiguousarray(a, dtype=dt).tobytes()
        header[name] = {
            "dtype": _NAMES[dt],
            "shape": [int(s) for s in a.shape],
            "data_offsets": [offset, offset + len(raw)],
        }
        chunks.append(raw)
        offset += len(raw)
    if metadata:
        for k, v in metadata.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise ValueError(f"__metadata__: {k!r} -> {v!r} is not str -> str")
        header["__metadata__"] = dict(sorted(metadata.items()))
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(chunks)


def save(path, tensors, metadata=None):
    with open(path, "wb") as f:
        f.write(encode(tensors, metadata))


def decode(data):
    """Returns (tensors: name -> numpy array, metadata: dict) from a file's bytes."""
    if len(data) < 8:
        raise ValueError("file shorter than 8 bytes")
    (n,) = struct.unpack("<Q", data[:8])
    if 8 + n > len(data):
        raise ValueError("header length past the end of the file")
    header = json.loads(data[8 : 8 + n].decode("utf-8"))
    buf = memoryview(data)[8 + n :]
    metadata = header.pop("__metadata__", {}) or {}
    tensors = {}
    for name, info in header.items():
        dt = _DTYPES[info["dtype"]]
        b, e = info["data_offsets"]
        shape = tuple(info["shape"])
        count = int(np.prod(shape, dtype=np.int64)) if shape else 1
        if not (0 <= b <= e <= len(buf)) or e - b != count * dt.itemsize:
            raise ValueError(f"{name}: data_offsets {b}..{e} inconsistent with shape {shape}")
        tensors[name] = np.frombuffer(buf[b:e], dtype=dt).reshape(shape).copy()
    return tensors, metadata


def load(path):
    with open(path, "rb") as f:
        return decode(f.read())


if __name__ == "__main__":
    # Self-check: a round trip of every dtype, metadata included.
    import sys

    rng = np.random.default_rng(0)
    t = {
        "a": rng.standard_normal((3, 4)),
        "b": rng.standard_normal(5).astype(np.float32),
        "c": np.arange(6, dtype=np.int64).reshape(2, 3),
        "d": np.array([0.5, -2.0], dtype=np.float16),
        "e": np.zeros((0, 3)),
    }
    back, meta = decode(encode(t, {"k": "v"}))
    assert meta == {"k": "v"}, meta
    for k in t:
        assert back[k].dtype == t[k].dtype and back[k].shape == t[k].shape, k
        assert np.array_equal(back[k], t[k]), k
    for paths in sys.argv[1:]:
        tensors, m = load(paths)
        print(paths, m)
        for k, v in sorted(tensors.items()):
            print(f"  {k}: {v.dtype} {list(v.shape)}")
    print("st.py: ok")
