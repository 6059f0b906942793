"""Relative position indices."""

from __future__ import annotations

import math

from .. import _validate as check
from .._compat import is_dask_array
from .._xp import arguments_in, broadcast_shapes, device_of, dimension_value, index_dtype, integer_result_dtype, jax_symbolic_dim, namespace, on_accelerator, shifted, torch_tensor


def relative_positions(q_len, k_len, *, offset=None, xp=None, device=None, dtype=None):
    r"""Signed relative positions ``rel[i, j] = (offset + i) - j``, shape ``[q_len, k_len]``.

    The sign convention of the whole library: query position minus key position, so a key
    in the past has ``rel > 0``. Query positions are ``offset + arange(q_len)``, key
    positions ``arange(k_len)``. By default the queries are the last ``q_len`` positions
    of the keys (``offset = k_len - q_len``): decoding one new token against ``n`` keys
    (the cache and the new key) is ``q_len=1, k_len=n`` and needs no ``offset``.

    Parameters
    ----------
    q_len, k_len : int >= 0
    offset : int or 0-d integer array (a traced value is fine); ``k_len - q_len`` by default;
        or one per batch row, an integer array ``[...]``: the result is then ``[..., q_len,
        k_len]``, row ``b`` that of ``offset[b]``
    xp, device : namespace and device (those of an array ``offset``, else NumPy's; ``xp``
        may be the framework module)
    dtype : integer dtype (default: the namespace's index dtype, ``int64`` where it has it);
        a narrower one must hold every relative position (``ValueError`` otherwise, for
        an ``offset`` that can be read)

    Examples
    --------
    >>> import numpy as np, posenc as pe
    >>> pe.relative_positions(2, 3).tolist()                 # offset = k_len - q_len = 1
    [[1, 0, -1], [2, 1, 0]]
    >>> pe.relative_positions(2, 3, offset=0).tolist()       # the queries are the first keys
    [[0, -1, -2], [1, 0, -1]]
    >>> pe.relative_positions(1, 3, offset=np.array([2, 0])).tolist()   # one offset per row
    [[[2, 1, 0]], [[0, -1, -2]]]
    """
    q_len = check.integer("q_len", q_len, minimum=0)
    k_len = check.integer("k_len", k_len, minimum=0)
    xp, offset, device = offset_namespace(offset, xp, device)
    rows = per_row(offset)
    if rows:
        check.integer_array("offset", offset, xp)
        offset = check.widened("offset", offset, xp, device)[..., None, None]
    else:
        offset = query_offset(offset, q_len, k_len, xp=xp, device=device)
    index = index_dtype(xp, device)
    dtype = integer_result_dtype(xp, dtype, device)
    check.allocatable("relative_positions", (*offset.shape[:-2], q_len, k_len) if rows else (q_len, k_len), 8)
    qpos = xp.arange(q_len, dtype=index, device=device)
    kpos = xp.arange(k_len, dtype=index, device=device)
    if rows:  # every (offset + i) - j checked to stay within the index dtype
        rel = check.shifted("i - j", qpos[:, None] - kpos[None, :], offset, xp, device, known=(1 - k_len, q_len - 1) if q_len and k_len else None)
        if dtype == index or not (q_len and k_len and math.prod(offset.shape) and check.is_eager(offset)):
            return xp.astype(rel, dtype)
        low, high = int(xp.min(offset)), int(xp.max(offset))
    else:
        rel = shifted(qpos[:, None] - kpos[None, :], offset)
        if dtype == index or not isinstance(offset, int) or not (q_len and k_len):  # (a traced offset: cast as it is)
            return xp.astype(rel, dtype)
        low = high = offset
    return check.narrowed("the relative positions", rel, dtype, low - (k_len - 1), high + q_len - 1, xp)


def offset_namespace(offset, xp, device):
    """``(xp, offset, device)`` of a function that builds arrays from lengths: an array
    ``offset`` (0-d, maybe traced) sets the namespace and the device where ``xp`` and
    ``device`` are not given, as positions do (a NumPy one beside a given ``xp`` is
    converted into it, another library's refused); else ``xp`` or NumPy."""
    if not check.is_array(offset):
        return namespace(xp=xp), offset, device
    xp, given = arguments_in(xp, device, offset=offset)
    offset = given["offset"]
    return xp, offset, device_of(offset) if device is None else device


def query_offset(offset, q_len, k_len, *, xp=None, device=None, instead=None, reach=None):
    """The validated ``offset`` of the first query; ``None`` (the default) is ``k_len - q_len``:
    the queries are the last ``q_len`` positions of the keys (0 when the lengths are equal).
    The relative positions it gives are checked against ``xp``'s index dtype (int64 when
    ``xp`` is not given). One per batch row is refused (:func:`scalar_offset`). ``reach``:
    where the caller's result saturates (``math.inf``: nowhere); a 0-d array on an
    accelerator (or traced) is then clamped, not read (:func:`saturated`)."""
    if offset is None:
        offset = k_len - q_len
    if type(offset) is int:  # (what scalar_offset returns of one: 3 us a decode step)
        return check.relative_offset(check.integer("offset", offset), q_len, k_len, xp, device)
    if reach is not None and check.is_array(offset) and offset.ndim == 0 and not (torch_tensor(offset) and offset.device != device):
        offset = check.integer_or_traced("offset", offset, read=False)
        clamped = saturated(xp, check.widened("offset", offset, xp, device), q_len, k_len, reach, device)
        if clamped is not None:
            return check.computed_on("offset", clamped, device)
    return check.relative_offset(scalar_offset(offset, instead, device=device), q_len, k_len, xp, device)


def saturated(xp, offset, q_len, k_len, reach, device):
    """Widened offsets ``offset`` (one per batch row, or a 0-d array) clamped to
    ``[-(reach + q_len), reach + k_len]``, for a result that depends on each distance
    ``offset + i - j`` only through ``clip(offset + i - j, -reach, reach)`` (Shaw's table,
    DeBERTa's without log buckets, T5's buckets): past those bounds every distance of a
    row is beyond ``reach`` on one side, as it is at the bound, so the result is the same,
    and every sum stays within the index dtype without the offsets being read.

    ``reach`` ``math.inf``: a result that changes with the distance however far (ALiBi's,
    DeBERTa's log buckets): the offsets are clamped to those whose every ``offset + i`` and
    ``offset + i - j`` fits the index dtype, the offsets the host accepts, which are kept
    as they are (the same bits); one past them gives the row of the nearest (a distance
    of the dtype's edge, never a wrapped one) where the host refuses it.

    Lengths that are symbolic dimensions of ``jax.export`` (whose sums JAX cannot bound):
    clamped first as for an infinite ``reach``, then to the bounds above computed as values
    of the index dtype, saturating at its edges: the same offsets wherever the sums fit.

    ``None`` where they are read instead: in host memory (a free read, whose check refuses
    a sum that would leave the index dtype), a Dask array (checked block by block), or, for
    a finite ``reach`` and concrete lengths, where even the clamped sums could leave the
    index dtype."""
    if is_dask_array(offset) or (torch_tensor(offset) or check.is_eager(offset)) and not on_accelerator(offset):
        return None
    _, _, low, high = check.index_bounds(xp, device)
    symbolic = jax_symbolic_dim(q_len) or jax_symbolic_dim(k_len)
    if reach == math.inf or symbolic:
        kept = xp.clip(offset, low + _size(max(k_len - 1, 0)), high - _size(max(q_len - 1, 0)))  # every (offset + i) - j fits
        if reach == math.inf:
            return kept
        reach = min(reach, high)  # (the saturation's bounds as values, never past the dtype's edges)
        return xp.clip(kept, xp.maximum(-_size(q_len), low + reach) - reach, xp.minimum(_size(k_len), high - reach) + reach)
    if not (low <= -(reach + q_len) - k_len and reach + k_len + q_len <= high):
        return None
    return xp.clip(offset, -(reach + q_len), reach + k_len)


def _size(n):
    """A length (maybe a symbolic dimension of ``jax.export``) to add to an index dtype's edge:
    a symbolic one as the JAX value it is inside the computation (the edge plus the
    dimension, a constant beyond the dtype, cannot be lowered)."""
    return dimension_value(n) if jax_symbolic_dim(n) else n


def per_row(offset):
    """Whether ``offset`` is one per batch row: an array with axes (the per-token path's)."""
    return offset is not None and type(offset) is not int and check.is_array(offset) and offset.ndim > 0


def module_rows(offset, q, k):
    """A module's one ``offset`` per batch row must broadcast against the batch axes of
    ``q``/``k [..., heads, seq, head_dim]``, those before the heads (``ValueError``)."""
    batch = broadcast_shapes(tuple(q.shape[:-3]), tuple(k.shape[:-3]))
    try:
        broadcast_shapes(tuple(offset.shape), batch)
    except ValueError:
        raise ValueError(f"offset of shape {tuple(offset.shape)} (one per batch row) does not broadcast against the batch axes {batch} of q and k") from None


PER_ROW = (
    "one offset per batch row is taken by the functions with query_positions (relative_bias, t5_bias, alibi_bias, "
    "kerple_bias, sandwich_bias, fire_bias, shaw_logits, deberta_logits), their result then [batch, heads, q_len, k_len]"
)


def scalar_offset(offset, instead=None, *, minimum=None, device=None):
    """A relative function's ``offset`` of one value for every row (an int, a 0-d integer
    array or a traced one, ``>= minimum``); one per batch row is a ``TypeError`` that says
    what takes it (``instead``: the caller's own advice), one on another GPU than
    ``device`` (the other arguments') a ``ValueError`` (:func:`posenc._validate.read_on_its_gpu`)."""
    if check.is_array(offset) and offset.ndim > 0:
        raise TypeError(
            f"offset must be an integer or a 0-d integer array here, got an array of shape {tuple(offset.shape)}: {instead or PER_ROW}"
        )
    return check.integer_or_traced("offset", check.read_on_its_gpu("offset", offset, device), minimum=minimum)


def distance_count(q_len, k_len):
    """The entries of a per-distance vector: ``q_len + k_len - 1``, none where either length is 0."""
    return q_len + k_len - 1 if q_len and k_len else 0


def distances(q_len, k_len, offset, *, xp, device=None):
    """The ``q_len + k_len - 1`` distinct relative positions, in per-distance vector order.

    Entry ``t`` is ``offset + t - (k_len - 1)``, the ``rel`` of every ``(i, j)`` with
    ``i - j + k_len - 1 == t`` (see ``_toeplitz``); empty when either length is 0.
    Arguments are already validated; ``offset`` may be a 0-d integer array (traced).
    """
    return shifted(xp.arange(-(k_len - 1), distance_count(q_len, k_len) - (k_len - 1), dtype=index_dtype(xp, device), device=device), offset)


def clip_relative(rel, max_distance):
    r"""Shaw / NEZHA table index of relative positions: ``clip(rel, -K, K) + K``.

    .. math::

        \mathrm{idx}(i, j) = \min(\max(\mathrm{rel}_{ij}, -K), K) + K \in [0, 2K]

    Shaw, Uszkoreit and Vaswani, "Self-Attention with Relative Position
    Representations" (2018): relative embeddings are learned for distances up to ``K``
    and shared beyond. ``rel = query - key`` (a key in the past has ``rel > 0``), so row
    ``K + r`` of a ``[2K + 1, d]`` table belongs to distance ``r``.

    Parameters
    ----------
    rel : integer array, any shape
    max_distance : int >= 0, the clipping distance ``K``

    Returns
    -------
    integer array like ``rel`` with values in ``[0, 2K]`` (computed in the index dtype;
    ``ValueError`` where ``2K`` does not fit ``rel``'s dtype).

    Examples
    --------
    >>> import numpy as np, posenc as pe
    >>> pe.clip_relative(np.arange(-4, 5), 2).tolist()
    [0, 0, 0, 1, 2, 3, 4, 4, 4]
    """
    check.array("rel", rel)
    xp = namespace(rel)
    check.integer_array("rel", rel, xp)
    max_distance = check.integer("max_distance", max_distance, minimum=0)
    _, bits, _, largest = check.index_bounds(xp, device_of(rel))
    if 2 * max_distance > largest:  # (the sum would wrap in the index dtype)
        raise ValueError(f"max_distance must be at most {largest // 2}: the indices 0 .. 2 * max_distance are computed in int{bits}, got {max_distance}")
    check.allocatable_unless_blocked("clip_relative", tuple(rel.shape), 8, rel)
    result = clipped(xp, check.widened("rel", rel, xp, device_of(rel)), max_distance)
    return check.narrowed("clip_relative's index (0 .. 2 * max_distance)", result, rel.dtype, 0, 2 * max_distance, xp)


def clipped(xp, rel, max_distance):
    """:func:`clip_relative` of validated arguments."""
    return xp.clip(rel, -max_distance, max_distance) + max_distance
