"""One ``offset`` per batch row, a row at a time: each row's per-distance index (``q_len +
k_len - 1`` entries) and the Toeplitz gather or scatter of its own offset's call.

The per-token path forms ``[rows, q_len, k_len]`` distances and reads the scores through an
int64 index of that size: past a few MiB that index's traffic cost more than a loop of
one-offset calls (``shaw_logits`` of 8 x 16 heads x 512 x 2048: 2.4 times the loop's time).
Here each row's index is its one-offset call's vector and its kernel the one that call
runs, into one result: the same entries read (a gather copies values) and the same sums (a
scatter sums each row alone), so every row has its own call's bits, and its gradient (the
kernels' adjoints). A loop over the rows would unroll into a traced graph specialised to
their count, and cannot read a lazy array: :func:`served` keeps it to NumPy arrays and
eager torch CPU tensors.
"""

from __future__ import annotations

import math

import numpy as np

from .. import _validate as check
from .._dispatch import call
from .._xp import device_of, torch_tensor, tracks_gradient
from .indices import distances


def served(offset, batch, q_len, k_len, query_positions=None, key_positions=None):
    """Whether a call of one ``offset`` per row (no per-token positions), of result
    ``[*batch, q_len, k_len]`` (not empty), is served row by row."""
    if query_positions is not None or key_positions is not None or not (q_len and k_len and math.prod(batch)):
        return False
    if type(offset) is np.ndarray:
        return True
    return torch_tensor(offset) and offset.device.type == "cpu" and check.is_eager(offset)


def row_distances(xp, qpos, q_len, k_len, *, device):
    """Each row's per-distance vector ``[*rows, q_len + k_len - 1]`` (:func:`distances` of its
    offset) from its validated query positions ``qpos [*rows, q_len]`` (``offset + arange``)."""
    return distances(q_len, k_len, qpos[..., :1], xp=xp, device=device)


def _rows(xp, values, index, batch, heads):
    """``(rows, values, index)``: the rows' axes (``batch`` but ``heads`` more), ``values``
    broadcast to ``batch`` and ``index`` to the rows'."""
    rows = tuple(batch[: len(batch) - heads])
    return rows, xp.broadcast_to(values, (*batch, *values.shape[-2:])), xp.broadcast_to(index, (*rows, index.shape[-1]))


def plus_gathered(xp, total, scores, index, k_len, batch, heads, *, transposed=False):
    """``total + out`` (``out``'s last two axes swapped with ``transposed``), ``out[*r, .., i, j]
    = scores[*r, .., i, index[*r, i - j + k_len - 1]]``: each row's ``toeplitz_gather`` of
    ``scores [..., q_len, m]`` at its per-distance ``index [*rows, q_len + k_len - 1]``.
    ``total``, a product of the caller's own, takes the sum in place where it has the
    result's shape and autograd records nothing: one row's gather at a time in one buffer,
    no second array of the logits' size (each a fresh mapping of memory past a few MiB)."""
    rows, scores, index = _rows(xp, scores, index, batch, heads)
    one = (*scores.shape[len(rows) : -1], k_len)
    if tracks_gradient(scores) or tracks_gradient(total):
        out = xp.reshape(xp.stack([call("toeplitz_gather", scores[r], index[r], k_len) for r in np.ndindex(*rows)]), (*rows, *one))
        return total + (xp.matrix_transpose(out) if transposed else out)
    if tuple(total.shape) != (*rows, *(one[:-2] + one[-2:][::-1] if transposed else one)):
        out = xp.empty((*rows, *one), dtype=scores.dtype, device=device_of(scores))
        for r in np.ndindex(*rows):
            call("toeplitz_gather", scores[r], index[r], k_len, out=out[r])
        return total + (xp.matrix_transpose(out) if transposed else out)
    buffer = xp.empty(one, dtype=scores.dtype, device=device_of(scores))
    for r in np.ndindex(*rows):
        part = total[r]
        part += xp.matrix_transpose(call("toeplitz_gather", scores[r], index[r], k_len, out=buffer)) if transposed else call("toeplitz_gather", scores[r], index[r], k_len, out=buffer)
    return total


def scatter(xp, weights, index, m, batch, heads):
    """``mass[*r, .., i, c] = sum over j with index[*r, i - j + k_len - 1] == c of weights[*r,
    .., i, j]``: each row's ``toeplitz_scatter`` of ``weights [..., q_len, k_len]``, ``[*batch,
    q_len, m]``."""
    rows, weights, index = _rows(xp, weights, index, batch, heads)
    shape = (*batch, weights.shape[-2], m)
    if tracks_gradient(weights):
        return xp.reshape(xp.stack([call("toeplitz_scatter", weights[r], index[r], m) for r in np.ndindex(*rows)]), shape)
    out = xp.empty(shape, dtype=weights.dtype, device=device_of(weights))
    for r in np.ndindex(*rows):
        call("toeplitz_scatter", weights[r], index[r], m, out=out[r])
    return out
