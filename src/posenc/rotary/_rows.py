"""Per-row ``seq_len`` of ``rope`` (validated and placed by ``_args.per_row``/``place_rows``).

A per-row ``seq_len`` gives each row the frequencies of its own length (dynamic NTK,
LongRoPE): eagerly by one rotation per row, the very call a single row would make (so
each row is bit-identical to it); in a traced computation (``jax.jit``,
``torch.compile``) by frequencies computed per row inside the graph (``apply.py``).
"""

from __future__ import annotations

import math

import numpy as np

from .._xp import placed_like, resplit, unsplit


def rotate_each_row(xp, x, positions, seq_len, rotate_one, offset=None):
    """``rotate_one(x_row, positions_row, seq_len_int)`` for every row along the leading axes
    on which ``seq_len`` varies (or, ``seq_len`` None, the per-row ``offset``: the length
    None), stacked back into ``x``'s shape; with an ``offset`` (an int, or an integer array
    placed as the positions are) ``rotate_one(..., offset_row)``, the row's own offset 0-d
    where it is one value."""
    rowed = offset if seq_len is None else seq_len
    lead = max((a + 1 for a, n in enumerate(rowed.shape) if n > 1), default=1)
    if 0 in tuple(x.shape[:lead]):  # no row: an empty result of x's shape
        return xp.empty_like(x)
    # (an explicit JAX mesh refuses to index a split axis outside jit: the rows, lengths and positions gathered)
    given, (x, split) = x, unsplit(x, *range(lead))
    if seq_len is not None:
        seq_len, _ = unsplit(seq_len, *range(seq_len.ndim))
    positions, _ = unsplit(positions, *range(positions.ndim))
    if getattr(offset, "ndim", 0):
        offset, _ = unsplit(offset, *range(offset.ndim))
    rows = []
    for index in np.ndindex(*x.shape[:lead]):
        length = None
        if seq_len is not None:
            at = tuple(i if seq_len.shape[a] > 1 else 0 for a, i in enumerate(index))
            length = int(seq_len[at + (0,) * (seq_len.ndim - lead)])
        row_positions, row_offset = (_row(xp, a, index) for a in (positions, offset))
        if getattr(row_offset, "ndim", 0) and math.prod(row_offset.shape) == 1:
            row_offset = xp.reshape(row_offset, ())
        extra = () if offset is None else (row_offset,)
        rows.append(rotate_one(x[(*index, ...)], row_positions, length, *extra))
    return placed_like(resplit(xp.reshape(xp.stack(rows, axis=0), tuple(x.shape)), split), given)


def _row(xp, a, index):
    """Row ``index`` of ``a`` placed on ``x``'s token axes (the whole of a 0-d one, an int, None)."""
    if not getattr(a, "ndim", 0):
        return a
    at = tuple(i if a.shape[n] > 1 else 0 for n, i in enumerate(index))
    return a[(*at, ...)]  # (the ellipsis: array-api-strict wants every axis named)


def rotate_at_lengths(xp, x, positions, seq_len, rotate_at):
    """``rotate_at(x, positions, length)`` at lengths read now (0-d, or one per row placed on
    ``x``'s token axes): one call where every row has the same length, else one a row
    (:func:`rotate_each_row`), each the call a single row of that length makes."""
    lengths = {int(n) for n in xp.reshape(seq_len, (-1,))}
    if len(lengths) == 1:
        return rotate_at(x, positions, lengths.pop())
    positions = xp.reshape(positions, (1,) * (x.ndim - 1 - positions.ndim) + tuple(positions.shape))  # on x's token axes, as seq_len
    return rotate_each_row(xp, x, positions, seq_len, rotate_at)
