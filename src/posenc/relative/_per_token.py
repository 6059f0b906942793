"""Per-token positions: the one path every relative bias and logits function takes when
``query_positions`` / ``key_positions`` are given (padded or packed batches, left padding).

``rel[..., i, j] = (offset + query_positions[..., i]) - key_positions[..., j]`` replaces the
Toeplitz distances; a bias looks its values up at ``rel`` and a logits function gathers its
projected scores at the table row of ``rel`` (:func:`gather`).
"""

from __future__ import annotations

import math

import numpy as np

from .. import _doublefloat
from .. import _validate as check
from .._compat import array_namespace
from .._xp import broadcast_shapes, cast, device_of, empty_result, index_dtype, is_integer, namespace, reshaped, resplit, size, split_spec, torch_tensor, unsplit
from .indices import per_row, saturated, scalar_offset


def given(query_positions, key_positions, offset=None):
    """Whether a call takes the per-token path: per-token positions, or an ``offset`` per
    batch row (the query positions ``offset[..., None] + arange(q_len)``)."""
    return query_positions is not None or key_positions is not None or per_row(offset)


def positions(xp, q_len, k_len, offset, query_positions, key_positions, *, device, float_dtype=None, reach=None):
    """``(query, key, batch)``: the validated positions, the queries' shifted by ``offset``,
    and the broadcast of their leading (batch) axes; lengths already validated.

    Nothing of the ``[..., q_len, k_len]`` size is built here: the caller checks that its
    result fits first, then takes :func:`relative`. A missing one of the two positions is ``arange``. ``offset`` is added to the query
    positions; left out (``None``) it is 0 when ``query_positions`` are given (they say
    where the queries are) and ``k_len - q_len`` otherwise, as without positions.
    ``float_dtype``: float positions are allowed and ``rel`` is computed in it when one is
    float (ALiBi); without it positions must be integers (table lookups). ``reach``: where the
    caller's result saturates (:func:`saturated`), for one offset per batch row and no
    positions given.
    """
    # Every caller forms the [..., q_len, k_len] distances: nothing (a missing position's
    # arange) is built before they are known to fit.
    check.allocatable("the distances of the query and key positions", (q_len, k_len), 8)
    rows = per_row(offset)
    if offset is None:
        offset = 0 if query_positions is not None else k_len - q_len
    # Checked below by value: the query positions it shifts and their differences with the keys.
    offset = offset if rows else scalar_offset(offset)
    found = []
    for name, pos, length in (("query_positions", query_positions, q_len), ("key_positions", key_positions, k_len)):
        if pos is None:
            pos = xp.arange(length, dtype=index_dtype(xp, device), device=device)
        else:
            if float_dtype is None:
                check.integer_array(name, pos, xp)
            check.positions(name, pos, xp, device)  # (dtype and finite values; widened by shifted)
            check.ndim(name, pos, minimum=1)
            if size(pos.shape[-1]) != length:
                want = "q_len" if name == "query_positions" else "k_len"
                raise ValueError(f"{name} must have {want} = {length} entries on its last axis, got shape {tuple(pos.shape)}")
        found.append(pos)
    qpos, kpos = found
    batch = check.leading_axes(("query_positions", qpos), ("key_positions", kpos), 1, "leading (batch) axes")
    if rows:
        offset = row_offsets(xp, offset, qpos, kpos)
        try:
            batch = broadcast_shapes(tuple(offset.shape[:-1]), tuple(batch))
        except ValueError:
            raise ValueError(
                f"offset of shape {tuple(offset.shape[:-1])} (one per batch row) and the positions' leading (batch) axes {tuple(batch)} must broadcast together"
            ) from None
        clamped = None if reach is None or query_positions is not None or key_positions is not None else saturated(xp, offset, q_len, k_len, reach, device)
        if clamped is not None:
            return qpos + clamped, kpos, batch
    qpos, kpos = shifted(xp, qpos, kpos, offset, device, float_dtype)
    return qpos, kpos, batch


def row_offsets(xp, offset, qpos, kpos):
    """One ``offset`` per batch row, validated (integers of the library and on the device of
    the positions ``qpos``/``kpos``, widened to the index dtype), as ``offset[..., None]``:
    added to its row's query positions."""
    check.array("offset", offset)
    namespace(offset, qpos, kpos)
    device_of(offset, qpos, kpos)
    check.integer_array("offset", offset, xp)
    return check.widened("offset", offset, xp, device_of(offset))[..., None]


def shifted(xp, qpos, kpos, offset, device, float_dtype):
    """The query positions shifted by ``offset`` and the key positions, integer ones of the
    index dtype (:func:`posenc._validate.widened`), every ``offset + query`` and ``query -
    key`` checked to stay within it; both as ``float_dtype`` where one is float.

    Where that is float32 (no float64: JAX without x64) and the distance would take more
    than one rounding there (an ``offset``, an integer position), both are double-floats
    ``(hi, lo)`` (:mod:`posenc._doublefloat`), the offset carried exactly in the queries':
    :func:`relative` rounds ``(offset + query) - key`` once to float32."""
    integers = (is_integer(xp, qpos.dtype), is_integer(xp, kpos.dtype))
    if float_dtype == xp.float32 and not all(integers) and (any(integers) or not (isinstance(offset, int) and offset == 0)):
        return _carried(xp, qpos, kpos, offset, device)
    qpos = check.shifted("query_positions", check.positions("query_positions", qpos, xp, device), offset, xp, device)
    kpos = check.positions("key_positions", kpos, xp, device)
    qpos = check.differences(xp, qpos, kpos, device)
    if not all(integers):
        qpos, kpos = cast(xp, qpos, float_dtype), cast(xp, kpos, float_dtype)
    return qpos, kpos


def _carried(xp, qpos, kpos, offset, device):
    """:func:`shifted`'s double-float positions ``(offset + query, key)`` of float32 parts."""
    qpos, kpos = check.positions("query_positions", qpos, xp, device), check.positions("key_positions", kpos, xp, device)
    if is_integer(xp, qpos.dtype):
        return _doublefloat.from_integer(xp, check.shifted("query_positions", qpos, offset, xp, device)), _double(xp, kpos)
    if isinstance(offset, int):
        shift = _doublefloat.integer_constant(xp, offset, device)
    else:
        shift = _doublefloat.from_integer(xp, check.widened("offset", offset, xp, device))
    return _doublefloat.add(_double(xp, qpos), shift), _double(xp, kpos)


def _double(xp, pos):
    """Positions as an exact double-float of float32 arrays."""
    if is_integer(xp, pos.dtype):
        return _doublefloat.from_integer(xp, pos)
    pos = cast(xp, pos, xp.float32)
    return pos, xp.zeros_like(pos)


def relative(qpos, kpos, *, heads=False):
    """``rel[..., i, j] = qpos[..., i] - kpos[..., j]`` (``[..., 1, q, k]`` with ``heads``)."""
    if isinstance(qpos, tuple):  # double-floats (:func:`shifted`)
        kpos = tuple(unsplit(part, -1)[0] for part in kpos)
        rel = _doublefloat.add(tuple(part[..., :, None] for part in qpos), tuple(-part[..., None, :] for part in kpos))[0]
        return rel[..., None, :, :] if heads else rel
    kpos, _ = unsplit(kpos, -1)  # (the queries may be split alike: JAX refuses rel split twice over one mesh axis)
    rel = qpos[..., :, None] - kpos[..., None, :]
    return rel[..., None, :, :] if heads else rel


def bias(xp, values, qpos, kpos, heads, batch, q_len, k_len, *, finish=None):
    """The per-token bias ``[*batch, heads, q_len, k_len]`` of a function of the distance,
    ``values(rel [n]) -> [heads, n]``, at ``rel = qpos[..., i] - kpos[..., j]``; with
    ``finish``, of ``finish(values(rel))``, ``values`` then giving ``[n]``.

    Integer distances in host memory that can be read now are computed once each and read
    at every pair that has them (the same bits: ``values`` is elementwise in ``rel``); a
    read elsewhere would synchronise a device or a graph. ``finish`` (the step that reads
    parameters) runs once on the values of every pair, so a gradient sums over the pairs
    as the plans' (``_decode.PerTokenPlan``) does.
    """
    rel = relative(qpos, kpos)
    ndim = rel.ndim
    rel, split = flattened(xp, rel)
    finish = finish or (lambda v: v)
    distinct = spanned(xp, rel)
    if distinct is not None:
        span, index = distinct
        return batch_first(xp, finish(xp.take(values(span), index, axis=-1)), heads, batch, q_len, k_len)
    return split_with_heads(batch_first(xp, finish(values(rel)), heads, batch, q_len, k_len), split, ndim)


def spanned(xp, rel):
    """``(span, index)`` of integer distances ``rel [n]`` in host memory that can be read now
    and span fewer values than they hold: ``span`` every value from the least to the
    greatest, ``index`` each distance's place in it (``span[index] == rel``); else ``None``
    (a read elsewhere would synchronise a device or a graph)."""
    count = math.prod(rel.shape)
    if not (count and is_integer(xp, rel.dtype) and _on_host(rel) and check.is_eager(rel)):
        return None
    low, high = int(xp.min(rel)), int(xp.max(rel))
    if high - low + 1 >= count:
        return None
    span = xp.arange(high - low + 1, dtype=rel.dtype, device=device_of(rel)) + low  # (torch's arange refuses an end past int64)
    return span, rel - low


def flattened(xp, rel):
    """``(flat, split)``: ``rel [..., q, k]`` flattened, and, where an explicit JAX mesh splits
    an axis of ``rel`` but its first (which the flattening cannot keep: gathered first), its
    sharding, to put on a result of it (:func:`split_with_heads`); else ``None``."""
    whole, split = unsplit(rel, *range(1, rel.ndim))
    return reshaped(xp, whole, (-1,)), split


def split_with_heads(result, split, ndim):
    """``result [..., heads, q, k]`` split as the ``ndim`` axes ``[..., q, k]`` of ``split``
    (:func:`flattened`), its heads whole; unchanged where ``split`` is ``None``."""
    spec = split_spec(split, ndim)
    return resplit(result, split, (*spec[:-2], None, *spec[-2:]))


def _on_host(a) -> bool:
    return type(a) is np.ndarray or (torch_tensor(a) and a.device.type == "cpu")


def batch_first(xp, values, heads, batch, q_len, k_len):
    """``values [heads, *batch, q_len, k_len]`` (any shape of that size, heads first: a
    per-distance function's values at every flattened ``rel``) as ``[*batch, heads, q_len,
    k_len]``, the layout of a per-token bias."""
    values = reshaped(xp, values, (heads, *batch, q_len, k_len))
    return xp.permute_dims(values, (*range(1, len(batch) + 1), 0, len(batch) + 1, len(batch) + 2))


def placed(xp, q_len, k_len, offset, query_positions, key_positions, batch, has_heads, what, *, device, reach=None):
    """``(qpos, kpos, batch)`` of a logits function: the validated positions and the leading
    axes of its ``[..., heads, q, k]`` result (:func:`positions`, :func:`batch_with_heads`)."""
    qpos, kpos, positions_batch = positions(xp, q_len, k_len, offset, query_positions, key_positions, device=device, reach=reach)
    return qpos, kpos, batch_with_heads(positions_batch, batch, has_heads, what, rows=per_row(offset))


def batch_with_heads(positions_batch, batch, has_heads, what, *, rows=False):
    """The leading axes of ``[..., heads, q, k]`` logits whose ``q``/``k`` have leading axes
    ``batch`` (heads included when ``has_heads``) and whose positions have
    ``positions_batch``; a ``ValueError`` naming the positions (and the ``offset`` with
    ``rows``, one per batch row) when they do not broadcast."""
    own = (*positions_batch, 1) if has_heads else tuple(positions_batch)
    try:
        return broadcast_shapes(own, tuple(batch))
    except ValueError:
        raise ValueError(
            f"{'offset (one per batch row) and ' if rows else ''}query_positions/key_positions with leading (batch) axes {tuple(positions_batch)} do not broadcast "
            f"against the batch axes of {what} {tuple(batch[:-1]) if has_heads else tuple(batch)}"
        ) from None


def gather(xp, scores, index, *, device):
    """``out[..., i, j] = scores[..., i, index[..., i, j]]``, the leading axes broadcast.

    ``scores [..., q_len, m]`` (queries projected on ``m`` table rows), ``index`` integer
    ``[..., q_len, k_len]`` in ``[0, m)``: the per-token form of ``toeplitz_gather``.
    """
    q_len, m, k_len = size(scores.shape[-2]), size(scores.shape[-1]), size(index.shape[-1])
    batch = broadcast_shapes(tuple(scores.shape[:-2]), tuple(index.shape[:-2]))
    scores = xp.broadcast_to(scores, (*batch, q_len, m))
    index = xp.broadcast_to(xp.astype(index, index_dtype(xp, device)), (*batch, q_len, k_len))
    if torch_tensor(scores):  # (torch.take_along_dim, array-api-compat's take_along_axis, specializes a Dim of torch.export)
        return scores.gather(-1, index)
    if hasattr(xp, "take_along_axis"):
        # (an explicit mesh gathers along no split axis, nor at indices split along it)
        scores, _ = unsplit(scores, -1)
        index, split = unsplit(index, -1)
        return resplit(xp.take_along_axis(scores, index, axis=-1), split)
    if 0 in (*batch, q_len, k_len):  # (Dask cannot reshape an empty array)
        return empty_result(xp, (*batch, q_len, k_len), scores)
    # Dask has no take_along_axis: each block of the index takes from its rows of the scores,
    # whole along m (one task per block, however many rows the table has).
    import dask.array as da

    lead = tuple(f"b{axis}" for axis in range(len(batch)))
    whole = scores.rechunk({len(batch) + 1: -1})
    return da.blockwise(_take_along_last, (*lead, "q", "k"), whole, (*lead, "q", "m"), index, (*lead, "q", "k"), dtype=scores.dtype, concatenate=True)


def _take_along_last(scores, index):
    """One Dask block of :func:`gather`: ``scores [..., q, m]`` taken at ``index [..., q, k]``."""
    return array_namespace(scores, index).take_along_axis(scores, index, axis=-1)


def scatter(xp, weights, index, m):
    """``mass[..., i, c] = sum_j weights[..., i, j] [index[..., i, j] == c]``, the leading axes
    broadcast: the per-token form of ``toeplitz_scatter``.

    ``index`` integer ``[..., q_len, k_len]`` in ``[0, m)``. One masked row sum per table
    row ``c``, so nothing of ``[..., q_len, k_len, m]`` is built.
    """
    return xp.stack([xp.sum(xp.where(index == c, weights, 0.0), axis=-1) for c in range(m)], axis=-1)
