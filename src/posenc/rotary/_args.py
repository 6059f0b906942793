"""Argument checks shared by the rotary functions (on top of ``posenc._validate``)."""

from __future__ import annotations

import math

import numpy as np

from .. import _compat
from .. import _validate as check

LAYOUTS = ("half", "interleaved")


def layout(name, value):
    return check.choice(name, value, LAYOUTS)


def host_inv_freq(name, value, xp):
    """``value`` as float64 NumPy ``[n]``: a NumPy array or sequence (host values), or an
    eager array of the namespace ``xp`` of the other arguments."""
    if check.is_array(value) and not _compat.is_numpy_array(value):
        if _compat.array_namespace(value) is not xp:
            raise TypeError(
                f"{name} must be a NumPy array, a sequence, or an array of the same namespace as the other "
                f"arguments ({xp.__name__}), got {type(value).__name__}"
            )
        if _compat.is_dask_array(value):
            value = value.compute()
        else:
            try:
                value = [float(value[i]) for i in range(int(value.shape[0]))] if value.ndim == 1 else None
            except (TypeError, ValueError) as exc:  # e.g. a jax tracer: frequencies must be concrete
                raise TypeError(f"{name} must hold concrete values (a NumPy array or an eager array), got {type(value).__name__}") from exc
            if value is None:
                raise ValueError(f"{name} must be one-dimensional")
    try:
        freqs = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name} must be a 1-D array or sequence of real numbers, got {type(value).__name__}") from exc
    if freqs.ndim != 1 or freqs.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D array, got shape {freqs.shape}")
    if not np.all(np.isfinite(freqs)):
        raise ValueError(f"{name} must be finite, got non-finite values")
    return freqs


def positions_against(name, positions, xp, batch_shape):
    """Finite integer or float ``positions`` that broadcast against ``batch_shape``."""
    check.positions(name, positions, xp)
    check.broadcast_shape(name, positions.shape, batch_shape)
    return positions


def rotary_dim(value, width):
    """A positive even rotary dimension no larger than the feature axis ``width``."""
    value = check.even_dim("rotary_dim", value)
    if value > width:
        raise ValueError(f"rotary_dim must be <= x.shape[-1] = {width}, got {value}")
    return value


def out_like(out, x, xp):
    """``out`` is None or a writable buffer of ``x``'s shape, dtype, namespace and device."""
    if out is None:
        return None
    if _compat.is_jax_array(out):
        raise TypeError("out is not supported for JAX arrays (they are immutable); use the returned array")
    return check.out(out, shape=tuple(x.shape), dtype=x.dtype, xp=xp, device=_compat.device(x), inputs=(("x", x),))


def eager_max(xp, positions):
    """``floor(max(positions)) + 1`` when ``positions`` can be read now, else ``None``."""
    if not check.is_eager(positions) or math.prod(positions.shape) == 0:
        return None
    return math.floor(float(xp.max(positions))) + 1
