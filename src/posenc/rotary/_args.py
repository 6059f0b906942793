"""Argument checks shared by the rotary functions (on top of ``posenc._validate``)."""

from __future__ import annotations

import math
import numbers

import numpy as np

from .. import _compat
from .. import _validate as check
from .._xp import is_integer, namespace, trace_constant

LAYOUTS = ("half", "interleaved")


def layout(name, value):
    return check.layout(name, value, LAYOUTS)


def inv_freq(name, value, xp):
    """Frequencies ``[n]``: a tuple of host float64 numbers, or, when they cannot be read
    now or carry a gradient (a traced JAX value, a torch tensor while torch compiles or one
    that requires grad), the array itself, to compute with inside the graph."""
    if check.is_array(value) and not isinstance(value, np.ndarray):
        if namespace(value) is not xp:
            raise TypeError(
                f"{name} must be a NumPy array, a sequence, or an array of the same namespace as the other "
                f"arguments ({xp.__name__}), got {type(value).__name__}"
            )
        if not check.is_eager(value) or (getattr(value, "requires_grad", False) and _grad_enabled()):
            check.float_array(name, value, xp)
            if value.ndim != 1 or value.shape[0] == 0:
                raise ValueError(f"{name} must be a non-empty 1-D array, got shape {tuple(value.shape)}")
            return value
        if _compat.is_dask_array(value):
            value = value.compute()
    return _host_floats(name, value)


def _grad_enabled():
    import torch  # only asked about a tensor that requires grad: torch is loaded

    return torch.is_grad_enabled()


@trace_constant
def _host_floats(name, value):
    """``value`` (a NumPy array, a sequence or an eager 1-D array) as a tuple of float64 numbers."""
    if check.is_array(value) and not isinstance(value, np.ndarray):
        if value.ndim != 1:
            raise ValueError(f"{name} must be a non-empty 1-D array, got shape {tuple(value.shape)}")
        value = [float(value[i]) for i in range(int(value.shape[0]))]
    try:
        freqs = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name} must be a 1-D array or sequence of real numbers, got {type(value).__name__}") from exc
    if freqs.ndim != 1 or freqs.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D array, got shape {freqs.shape}")
    if not np.all(np.isfinite(freqs)):
        raise ValueError(f"{name} must be finite, got non-finite values")
    return tuple(freqs.tolist())


def host_inv_freq(name, value, xp):
    """Frequencies that must be host values (a kernel takes them): float64 NumPy ``[n]``."""
    freqs = inv_freq(name, value, xp)
    if not isinstance(freqs, tuple):
        raise TypeError(f"{name} must hold concrete values (a NumPy array or an eager array), got a traced {type(freqs).__name__}")
    return np.asarray(freqs)


def positions_array(value):
    """``rope``'s ``positions`` must be an array; a number is most likely meant as ``offset``."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        raise TypeError(
            f"positions must be an array of token positions, got the number {value!r}: to number the tokens "
            f"from {value!r}, pass offset={value!r} (positions=None gives offset + arange along seq_axis)"
        )
    check.array("positions", value)


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
    if out is x:  # in place: x's own shape, dtype, namespace, device and memory
        return out
    return check.out(out, shape=tuple(x.shape), dtype=x.dtype, xp=xp, device=_compat.device(x), inputs=(("x", x),))


def sequence_length(xp, positions):
    """``floor(max(positions)) + 1``: an int when the positions can be read now, else a 0-d
    array computed with them; None for no positions."""
    if math.prod(positions.shape) == 0:
        return None
    if check.is_eager(positions):
        return math.floor(float(xp.max(positions))) + 1
    top = xp.max(positions)
    return (top if is_integer(xp, positions.dtype) else xp.floor(top)) + 1
