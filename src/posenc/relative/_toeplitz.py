"""Toeplitz operations: the hot loops of every relative bias, as references.

A relative bias or index depends on ``i - j`` only. With ``q_len + k_len - 1`` distances
``rel = offset + i - j`` running from ``offset - (k_len - 1)`` to ``offset + q_len - 1``,
entry ``t = i - j + k_len - 1`` of a per-distance vector belongs to ``(i, j)``. Buckets are
computed once per distance (``O(L)``); these three ops then expand, gather or
scatter-add in one pass. Kernels register against them.
"""

from __future__ import annotations

from .._built import built_in_range, clamped_at_launch, known_in_range
from .._dispatch import call, reference
from .._xp import device_of, empty_result, index_dtype, namespace


def _distance_index(xp, q_len, k_len, device):
    """``t[i, j] = i - j + k_len - 1``, the per-distance vector entry of ``(i, j)``."""
    i = xp.arange(q_len, device=device)[:, None]
    j = xp.arange(k_len, device=device)[None, :]
    return i - j + (k_len - 1)


def _along_rows(xp, values, index, device):
    """``out[..., i, j] = values[..., i, index[i, j]]``: ``values [..., q_len, m]``, integer
    ``index [q_len, n]`` in ``[0, m)``, the same for every leading index."""
    batch = tuple(values.shape[:-2])
    if hasattr(xp, "take_along_axis"):  # (not [..., q_len * m]: a product of symbolic sizes jax.export may not bound)
        index = xp.broadcast_to(xp.astype(index, index_dtype(xp, device)), (*batch, *index.shape))
        return xp.take_along_axis(values, index, axis=-1)
    if 0 in (*values.shape, *index.shape):  # (Dask cannot reshape an empty array)
        return empty_result(xp, (*batch, *index.shape), values)
    q_len, m = values.shape[-2:]  # Dask has no take_along_axis: one take from the rows laid end to end
    flat = xp.reshape(values, (*batch, q_len * m))
    rows = xp.arange(q_len, device=device)[:, None] * m
    return xp.reshape(xp.take(flat, xp.reshape(rows + index, (-1,)), axis=-1), (*batch, *index.shape))


def _write(out, result):
    if out is None:
        return result
    out[...] = result
    return out


@reference("toeplitz_expand")
def toeplitz_expand(vec, q_len, k_len, *, out=None):
    """``bias[..., i, j] = vec[..., i - j + k_len - 1]``: ``[..., q+k-1] -> [..., q, k]``."""
    xp = namespace(vec)
    shape = (*vec.shape[:-1], q_len, k_len)
    if not (q_len and k_len):  # nothing to take (Dask cannot reshape an empty array)
        return _write(out, empty_result(xp, shape, vec))
    t = _distance_index(xp, q_len, k_len, device_of(vec))
    flat = xp.take(vec, xp.reshape(t, (-1,)), axis=-1)
    return _write(out, xp.reshape(flat, shape))


@reference("toeplitz_gather")
def toeplitz_gather(scores, index, k_len, *, out=None):
    """``out[..., i, j] = scores[..., i, index[i - j + k_len - 1]]``.

    ``scores``: ``[..., q_len, m]`` (queries projected on a table of ``m`` relative
    embeddings); ``index``: integer ``[q_len + k_len - 1]`` with values in ``[0, m)``.
    Shaw's and DeBERTa's position terms without a ``[q, k, d]`` tensor.
    """
    xp = namespace(scores, index)
    device = device_of(scores)
    q_len = scores.shape[-2]
    t = _distance_index(xp, q_len, k_len, device)
    idx = xp.reshape(xp.take(index, xp.reshape(t, (-1,)), axis=0), (q_len, k_len))
    return _write(out, _along_rows(xp, scores, idx, device))


@reference("toeplitz_scatter")
def toeplitz_scatter(weights, index, m, *, out=None):
    """``out[..., i, c] = sum over j with index[i - j + k_len - 1] == c of weights[..., i, j]``.

    ``weights``: ``[..., q_len, k_len]``; result ``[..., q_len, m]``: the attention mass
    each query puts on each of ``m`` relative embeddings (Shaw's value term is this times
    the value table). Computed as the weights re-indexed by distance,
    ``G[..., i, t] = weights[..., i, i - t + k_len - 1]`` (zero outside the keys), times
    the ``[q_len + k_len - 1, m]`` one-hot matrix of ``index``: memory ``O(q (q + k))``.
    """
    xp = namespace(weights, index)
    device = device_of(weights)
    q_len, k_len = weights.shape[-2], weights.shape[-1]
    if q_len == 0 or k_len == 0:
        return _write(out, xp.zeros((*weights.shape[:-1], m), dtype=weights.dtype, device=device))
    n = q_len + k_len - 1
    i = xp.arange(q_len, device=device)[:, None]
    j = i - xp.arange(n, device=device)[None, :] + (k_len - 1)
    inside = (j >= 0) & (j < k_len)
    picked = _along_rows(xp, weights, xp.clip(j, 0, k_len - 1), device)
    by_distance = xp.where(inside, picked, xp.zeros_like(weights[..., :1]))
    onehot = xp.astype(index[:, None] == xp.arange(m, device=device)[None, :], weights.dtype)
    return _write(out, by_distance @ onehot)


def _each_row(op, values, index, n, width, m):
    """``op(values[r], index[r], n)`` of each row ``r`` of the first axis, ``[rows, ..., q_len,
    width]``; the rows of an ``index`` posenc built in ``[0, m)`` recorded as such (``_built``)."""
    xp = namespace(values, index)
    if values.shape[0] == 0:
        return xp.zeros((*values.shape[:-1], width), dtype=values.dtype, device=device_of(values))
    rows = xp.unstack(index)
    if known_in_range(index, m):
        rows = [built_in_range(i, m, in_graph=clamped_at_launch(index)) for i in rows]
    return xp.stack([call(op, v, i, n) for v, i in zip(xp.unstack(values), rows)])


@reference("toeplitz_gather_rows")
def toeplitz_gather_rows(scores, index, k_len, *, out=None):
    """``out[r, ..., i, j] = scores[r, ..., i, index[r, i - j + k_len - 1]]``: the
    ``toeplitz_gather`` of each row ``r`` of ``scores [rows, ..., q_len, m]`` at its own
    per-distance ``index [rows, q_len + k_len - 1]`` (one offset per batch row)."""
    return _write(out, _each_row("toeplitz_gather", scores, index, k_len, k_len, scores.shape[-1]))


@reference("toeplitz_scatter_rows")
def toeplitz_scatter_rows(weights, index, m, *, out=None):
    """``out[r, ..., i, c] = sum over j with index[r, i - j + k_len - 1] == c of weights[r, ...,
    i, j]``: the ``toeplitz_scatter`` of each row ``r`` of ``weights [rows, ..., q_len,
    k_len]`` at its own per-distance ``index [rows, q_len + k_len - 1]``."""
    return _write(out, _each_row("toeplitz_scatter", weights, index, m, m, m))
