"""Argument checking and float64 conversion shared by the package's entry points.

Arrays arrive as numpy arrays, torch tensors (without importing torch here) or nested
lists, in any floating dtype. Each is converted to a C-ordered float64 numpy array; a
conversion from another dtype is recorded as "NAME: DTYPE -> float64", and the records end
up in the certificate's notes, so a reader knows the bound is about the float64 values of
(for instance) float32 weights.
"""

import math
import numbers

import numpy as np


def as_float64(name, value, ndim, conversions=None):
    """Returns `value` as a C-ordered float64 array with `ndim` dimensions.

    Raises TypeError naming `name` for anything that is not a real floating array or tensor
    (integer, boolean, complex or object arrays included; nested lists of numbers are
    accepted), ValueError for a wrong number of
    dimensions, an empty array, or NaN / infinity. Appends "name: dtype -> float64" to
    `conversions` when the dtype was not float64.
    """
    source_dtype = None  # recorded when not float64
    if hasattr(value, "detach") and hasattr(value, "dtype"):  # a torch tensor
        t = value.detach().cpu()
        if not t.is_floating_point():
            raise TypeError(f"{name}: expected a floating-point tensor, got {t.dtype}")
        if str(t.dtype) != "torch.float64":
            source_dtype = str(t.dtype)
        if "bfloat16" in str(t.dtype):  # numpy has no bfloat16; float32 holds every value exactly
            t = t.float()
        a = t.numpy()
    elif isinstance(value, (list, tuple)):  # nested Python numbers
        try:
            a = np.asarray(value)
        except (TypeError, ValueError) as e:
            raise TypeError(f"{name}: expected an array of floats ({e})") from None
        if a.dtype.kind not in "iuf":
            raise TypeError(f"{name}: expected an array of floats, got dtype {a.dtype}")
    elif isinstance(value, np.ndarray) or hasattr(value, "__array__"):
        a = np.asarray(value)
        if a.dtype.kind != "f":
            raise TypeError(f"{name}: expected a floating-point array, got dtype {a.dtype}")
        if a.dtype != np.float64:
            source_dtype = str(a.dtype)
    else:
        raise TypeError(f"{name}: expected an array, got {type(value).__name__}")
    if a.ndim != ndim:
        shape = "(N, D)" if ndim == 2 else "a vector" if ndim == 1 else f"{ndim} dimensions"
        raise ValueError(f"{name}: expected {shape}, got shape {tuple(a.shape)}")
    if a.size == 0:
        raise ValueError(f"{name}: is empty (shape {tuple(a.shape)})")
    out = np.ascontiguousarray(a, dtype=np.float64)
    if not np.all(np.isfinite(out)):
        raise ValueError(f"{name}: holds NaN or infinity")
    if source_dtype is not None and conversions is not None:
        conversions.append(f"{name}: {source_dtype} -> float64")
    return out


def real(name, value, *, minimum=None, strictly=False, allow_none=False):
    """A finite real number, or None when allowed; TypeError / ValueError naming `name`."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name}: expected a number, got {type(value).__name__}")
    v = float(value)
    if not math.isfinite(v):
        raise ValueError(f"{name}: must be finite, got {v}")
    if minimum is not None and (v < minimum or (strictly and v == minimum)):
        raise ValueError(f"{name}: must be {'>' if strictly else '>='} {minimum}, got {v}")
    return v


def integer(name, value, *, minimum=None):
    """An integer (bool refused); TypeError / ValueError naming `name`."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name}: expected an integer, got {type(value).__name__}")
    v = int(value)
    if minimum is not None and v < minimum:
        raise ValueError(f"{name}: must be >= {minimum}, got {v}")
    return v


def choice(name, value, allowed):
    """One of `allowed` (strings); TypeError / ValueError naming `name`."""
    if not isinstance(value, str):
        raise TypeError(f"{name}: expected one of {', '.join(allowed)}, got {type(value).__name__}")
    if value not in allowed:
        raise ValueError(f"{name}: expected one of {', '.join(allowed)}, got {value!r}")
    return value


def norm_name(value):
    """The norm as the C++ core names it: "2" or "inf" (2, "2", "inf", math.inf accepted)."""
    if isinstance(value, str):
        if value in ("2", "inf"):
            return value
    elif isinstance(value, numbers.Real) and not isinstance(value, bool):
        if value == 2:
            return "2"
        if value == math.inf:
            return "inf"
    raise ValueError(f"norm: expected 2 or 'inf', got {value!r}")


def budget_text(value):
    """A work budget as the CLI's --budget reads it: None -> "", STEPS -> "STEPS",
    (STEPS, ROUNDS) -> "STEPS,ROUNDS"; a "STEPS[,ROUNDS]" string is passed on."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, (tuple, list)):
        if len(value) != 2:
            raise ValueError(f"budget: expected STEPS or (STEPS, ROUNDS), got {value!r}")
        steps = integer("budget", value[0], minimum=1)
        rounds = integer("budget", value[1], minimum=0)
        return f"{steps},{rounds}"
    return str(integer("budget", value, minimum=1))
