"""Cheap argument checks of the Toeplitz kernel launchers (CPU and CUDA alike).

The public functions validate their own arguments; these checks keep a direct
``_dispatch.call`` from reading or writing out of bounds: shapes, lengths, the ``out``
buffer and the range of ``index``. Each returns the result's shape.
"""

from __future__ import annotations

import numpy as np

from .. import _validate as check
from ._bias_arrays import dtype_name, kind


def _distances(q_len, k_len):
    return max(q_len + k_len - 1, 0)


def _distances_match(n, q_len, k_len):
    """A per-distance vector has ``q_len + k_len - 1`` entries; an empty bias may also have none."""
    return n == _distances(q_len, k_len) or (n == 0 and q_len * k_len == 0)


def _ndim(name, a, minimum):
    if a.ndim < minimum:
        raise ValueError(f"{name} must have at least {minimum} dimension(s), got shape {tuple(a.shape)}")


def _index(index, q_len, k_len):
    if dtype_name(index.dtype) not in ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"):
        raise TypeError(f"index must have an integer dtype, got {index.dtype}")
    want = _distances(q_len, k_len)
    if index.ndim != 1 or not _distances_match(int(index.shape[0]), q_len, k_len):
        raise ValueError(f"index must have shape ({want},) (q_len + k_len - 1 distances), got {tuple(index.shape)}")


def index_range(bounds, m):
    """``bounds``: ``(min, max)`` of a non-empty index, which must lie in ``[0, m)``."""
    low, high = bounds
    if low < 0 or high >= m:
        raise ValueError(f"index values must lie in [0, {m}) (m = {m}), got values in [{low}, {high}]")


def out(out, like, shape):
    """``out`` is ``None`` or a buffer of the same kind, device and dtype as ``like``, of ``shape``."""
    if out is None:
        return
    if kind(out) != kind(like) or getattr(out, "device", None) != getattr(like, "device", None):
        raise TypeError(f"out must be an array of the same kind and device as the input ({type(like).__name__}), got {type(out).__name__}")
    if tuple(out.shape) != tuple(shape):
        raise ValueError(f"out must have shape {tuple(shape)}, got {tuple(out.shape)}")
    if out.dtype != like.dtype:
        raise ValueError(f"out must have dtype {like.dtype}, got {out.dtype}")
    if isinstance(out, np.ndarray) and not out.flags.writeable:
        raise ValueError("out must be a writeable array, got a read-only one")


def expand(vec, q_len, k_len, result):
    q_len = check.integer("q_len", q_len, minimum=0)
    k_len = check.integer("k_len", k_len, minimum=0)
    _ndim("vec", vec, 1)
    vec_shape = tuple(vec.shape)  # the CUDA simulator's shapes reject negative indices
    want = _distances(q_len, k_len)
    if not _distances_match(vec_shape[-1], q_len, k_len):
        raise ValueError(f"vec must have {want} entries (q_len + k_len - 1) on its last axis, got shape {vec_shape}")
    shape = (*vec_shape[:-1], q_len, k_len)
    out(result, vec, shape)
    return shape


def gather(scores, index, k_len, result):
    k_len = check.integer("k_len", k_len, minimum=0)
    _ndim("scores", scores, 2)
    scores_shape = tuple(scores.shape)
    _index(index, scores_shape[-2], k_len)
    shape = (*scores_shape[:-1], k_len)
    out(result, scores, shape)
    return shape


def scatter(weights, index, m, result):
    m = check.integer("m", m, minimum=0)
    _ndim("weights", weights, 2)
    weights_shape = tuple(weights.shape)
    _index(index, weights_shape[-2], weights_shape[-1])
    shape = (*weights_shape[:-1], m)
    out(result, weights, shape)
    return shape
