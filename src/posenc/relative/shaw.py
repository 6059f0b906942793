"""Shaw et al.'s relative position representations, and NEZHA's fixed sinusoidal table."""

from __future__ import annotations

from .. import _compat, _plans
from .. import _validate as check
from .._dispatch import call
from .._built import built_in_range
from .._xp import broadcast_shapes, cast, device_of, host_constants, namespace, result_dtype, size, torch_compiling, unsplit
from ..absolute.sinusoidal import sinusoidal
from . import _args, _per_token, _rows, _signatures
from .indices import clipped, distances, per_row, query_offset, saturated

FORMS = ("released", "paper")


@host_constants
@_plans.planned(_signatures.ShawLogits)
def shaw_logits(q, k, table_k, *, max_distance, offset=None, query_positions=None, key_positions=None):
    r"""Attention logits with Shaw et al.'s relative key embeddings (unscaled).

    .. math::

        e_{ij} = q_i \cdot \left(k_j + a^K_{\mathrm{clip}(\mathrm{rel}_{ij}, -K, K) + K}\right)

    Shaw, Uszkoreit and Vaswani, "Self-Attention with Relative Position Representations"
    (2018), with ``rel = query - key`` (query positions ``offset + arange(q_len)``, by
    default the last ``q_len`` of the keys'; the paper and tensor2tensor index by key minus
    query: their table is ``table_k[::-1]`` here). The position term is computed as ``q @ table_k.T`` (``[..., q_len, 2K + 1]``) gathered
    per distance (``toeplitz_gather``), never as a ``[q_len, k_len, d]`` tensor. Divide by
    ``sqrt(d)`` yourself (or pass ``scale`` to :func:`posenc.attention` with the logits
    as ``bias`` and zero content); NEZHA is this with :func:`nezha_table`.

    Parameters
    ----------
    q : float array ``[..., heads, q_len, d]``
    k : float array ``[..., heads, k_len, d]``
    table_k : float array ``[2K + 1, d]`` (or with leading dims broadcasting against the batch)
    max_distance : int >= 0, the clipping distance ``K``
    offset : int or 0-d integer array (traced is fine), first query position;
        ``k_len - q_len`` by default (0 with ``query_positions``); or one per batch row, an
        integer array ``[...]`` broadcasting against the batch axes before the heads axis:
        the query positions ``offset[..., None] + arange(q_len)`` (row ``b`` the logits of
        ``offset[b]``, to the bit)
    query_positions, key_positions : integer arrays ``[..., q_len]`` / ``[..., k_len]``,
        optional: per-token positions (``rel[..., i, j] = query_positions[..., i] -
        key_positions[..., j]``), their leading axes broadcasting against the batch axes
        of ``q`` and ``k`` before the heads axis (as in :func:`relative_bias`)

    Returns
    -------
    array ``[..., heads, q_len, k_len]`` in the inputs' promoted dtype.

    Examples
    --------
    >>> import numpy as np, posenc as pe
    >>> q, k = np.ones((1, 2, 2)), np.zeros((1, 3, 2))
    >>> table = np.arange(10.0).reshape(5, 2)     # K = 2: rows for rel -2..2
    >>> pe.shaw_logits(q, k, table, max_distance=2)[0].tolist()     # rel = 1 + i - j
    [[13.0, 9.0, 5.0], [17.0, 13.0, 9.0]]
    """
    xp = _args.namespace_of(q=q, k=k, table_k=table_k, query_positions=query_positions, key_positions=key_positions)
    q_len, k_len, batch = _args.query_key(q, k, xp)
    max_distance = check.integer("max_distance", max_distance, minimum=0)
    _args.table("table_k", table_k, xp, rows=2 * max_distance + 1, dim=int(q.shape[-1]), batch=batch)
    dtype, work = _args.dtypes(xp, q, k, table_k)
    device = device_of(q)
    if _per_token.given(query_positions, key_positions, offset):
        qpos, kpos, batch = _per_token.placed(xp, q_len, k_len, offset, query_positions, key_positions, batch, q.ndim >= 3, "q and k", device=device, reach=max_distance)
        _args.logits_shape(batch, q_len, k_len)
        by_row = _rows.served(offset, batch, q_len, k_len, query_positions, key_positions)
        rel = _rows.row_distances(xp, qpos, q_len, k_len, device=device) if by_row else _per_token.relative(qpos, kpos, heads=q.ndim >= 3)
        index = clipped(xp, rel, max_distance)
    else:
        by_row = False
        _args.logits_shape(batch, q_len, k_len)
        index = clipped(xp, distances(q_len, k_len, query_offset(offset, q_len, k_len, xp=xp, device=device, reach=max_distance), xp=xp, device=device), max_distance)
    q, k, table_k = (cast(xp, a, work) for a in (q, k, table_k))
    scores = q @ xp.matrix_transpose(table_k)
    if by_row:
        return cast(xp, _rows.plus_gathered(xp, q @ xp.matrix_transpose(k), scores, index, k_len, batch, q.ndim >= 3), dtype)
    if index.ndim > 1:
        position = _per_token.gather(xp, scores, index, device=device)
    else:
        position = call("toeplitz_gather", scores, built_in_range(index, 2 * max_distance + 1), k_len)
    return cast(xp, q @ xp.matrix_transpose(k) + position, dtype)


def _row_offsets(xp, weights, v, offset, q_len, k_len, max_distance):
    """One ``offset`` per batch row of ``weights [..., heads, q_len, k_len]``, its axes those
    before the heads, validated (integers of the library and device of ``weights``, every
    ``(offset + i) - j`` within the index dtype), as ``[rows]``; on a device, clamped where
    the clipped distances are the same instead of read (:func:`indices.saturated`)."""
    offset = _per_token.row_offsets(xp, offset, weights, v)
    if weights.ndim < 3 or tuple(offset.shape[:-1]) != tuple(weights.shape[:-3]):
        raise ValueError(
            f"one offset per batch row takes weights [..., heads, q_len, k_len] whose axes before the heads are the offset's {tuple(offset.shape[:-1])} "
            f"(one Toeplitz scatter per row), got weights of shape {tuple(weights.shape)}"
        )
    device = device_of(weights)
    clamped = saturated(xp, offset, q_len, k_len, max_distance, device)
    if clamped is not None:
        return xp.reshape(clamped, (-1,))
    low, high = (1 - k_len, q_len - 1) if q_len and k_len else (0, 0)
    # (while torch compiles, an asarray of the lengths would specialize them: every i - j instead)
    extremes = xp.arange(low, high + 1, dtype=offset.dtype, device=device) if torch_compiling() else xp.asarray([low, high], dtype=offset.dtype, device=device)
    ends = check.shifted("i - j", extremes, offset, xp, device, known=(low, high))
    if _compat.is_dask_array(ends):  # (checked when computed: the offsets read back from the checked sums wait for it)
        offset = ends[..., :1] - low
    return xp.reshape(offset, (-1,))


@host_constants
def shaw_output(weights, v, table_v, *, max_distance, offset=None, query_positions=None, key_positions=None):
    r"""Attention output with Shaw et al.'s relative value embeddings.

    .. math::

        z_i = \sum_j w_{ij} \left(v_j + a^V_{\mathrm{clip}(\mathrm{rel}_{ij}, -K, K) + K}\right)

    (Shaw et al., 2018; ``rel = query - key``). Computed as ``weights @ v`` plus the
    attention mass each query puts on each of the ``2K + 1`` table rows
    (``toeplitz_scatter``, ``[..., q_len, 2K + 1]``) times ``table_v``: no
    ``[q_len, k_len, d]`` tensor.

    Parameters
    ----------
    weights : float array ``[..., heads, q_len, k_len]`` (attention probabilities)
    v : float array ``[..., heads, k_len, d_v]``
    table_v : float array ``[2K + 1, d_v]`` (or with leading dims broadcasting against the batch)
    max_distance : int >= 0
    offset : int or 0-d integer array (traced is fine), first query position;
        ``k_len - q_len`` by default (0 with ``query_positions``); or one per batch row, an
        integer array of the shape of ``weights``' axes before the heads: the query positions
        ``offset[..., None] + arange(q_len)``, row ``b`` the output of ``offset[b]``, to the
        bit (one Toeplitz scatter per row)
    query_positions, key_positions : integer arrays ``[..., q_len]`` / ``[..., k_len]``,
        optional: per-token positions, as in :func:`shaw_logits` (``rel[..., i, j] =
        query_positions[..., i] - key_positions[..., j]``, their leading axes broadcasting
        against the batch axes of ``weights`` and ``v`` before the heads axis); the mass
        on each table row is then one masked row sum per row (``2K + 1`` passes over
        ``weights``)

    Returns
    -------
    array ``[..., heads, q_len, d_v]``.

    Examples
    --------
    >>> import numpy as np, posenc as pe
    >>> w = np.full((1, 2, 2), 0.5)
    >>> table = np.array([[-1.0], [0.0], [1.0]])  # K = 1: rows for rel -1, 0, 1
    >>> pe.shaw_output(w, np.zeros((1, 2, 1)), table, max_distance=1)[0].tolist()   # rel = i - j
    [[-0.5], [0.5]]
    """
    xp = _args.namespace_of(weights=weights, v=v, table_v=table_v, query_positions=query_positions, key_positions=key_positions)
    for name, a in (("weights", weights), ("v", v)):
        check.float_array(name, a, xp)
        check.ndim(name, a, minimum=2)
    q_len, k_len = size(weights.shape[-2]), size(weights.shape[-1])
    if size(v.shape[-2]) != k_len:
        raise ValueError(f"v must have k_len = weights.shape[-1] = {k_len} rows (axis -2), got shape {tuple(v.shape)}")
    try:
        batch = broadcast_shapes(tuple(weights.shape[:-2]), tuple(v.shape[:-2]))
    except ValueError:
        raise ValueError(f"weights {tuple(weights.shape)} and v {tuple(v.shape)} must have broadcasting leading dimensions") from None
    max_distance = check.integer("max_distance", max_distance, minimum=0)
    rows = 2 * max_distance + 1
    _args.table("table_v", table_v, xp, rows=rows, dim=int(v.shape[-1]), batch=batch)
    dtype, work = _args.dtypes(xp, weights, v, table_v)
    device = device_of(v)
    if _per_token.given(query_positions, key_positions):
        has_heads = weights.ndim >= 3
        qpos, kpos, batch = _per_token.placed(xp, q_len, k_len, offset, query_positions, key_positions, batch, has_heads, "weights and v", device=device)
        check.allocatable("output", (*batch, q_len, int(v.shape[-1])), 8)
        index = clipped(xp, _per_token.relative(qpos, kpos, heads=has_heads), max_distance)
        weights, v, table_v = (cast(xp, a, work) for a in (weights, v, table_v))
        mass = _per_token.scatter(xp, weights, index, rows)
    elif per_row(offset):
        offsets = _row_offsets(xp, weights, v, offset, q_len, k_len, max_distance)
        check.allocatable("output", (*batch, q_len, int(v.shape[-1])), 8)
        weights, v, table_v = (cast(xp, a, work) for a in (weights, v, table_v))
        if torch_compiling() or _rows.served(offset, weights.shape[:-2], q_len, k_len):
            index = built_in_range(clipped(xp, distances(q_len, k_len, offsets[:, None], xp=xp, device=device), max_distance), rows)  # [rows, q_len + k_len - 1]
            if torch_compiling():  # (one op for every row: a loop would compile a graph per batch size)
                mass = xp.reshape(call("toeplitz_scatter_rows", xp.reshape(weights, (-1, *weights.shape[-3:])), index, rows), (*weights.shape[:-1], rows))
            else:  # (into one result, no stack)
                mass = _rows.scatter(xp, weights, xp.reshape(index, (*weights.shape[:-3], -1)), rows, tuple(weights.shape[:-2]), 1)
        else:
            # (an explicit mesh unstacks no split axis: the rows' weights and offsets gathered)
            rows_weights = xp.unstack(unsplit(xp.reshape(weights, (size(offsets.shape[0]), *weights.shape[-3:])), 0)[0])
            index = [built_in_range(clipped(xp, distances(q_len, k_len, o, xp=xp, device=device), max_distance), rows) for o in xp.unstack(unsplit(offsets, 0)[0])]
            scattered = [call("toeplitz_scatter", w, i, rows) for w, i in zip(rows_weights, index)]
            mass = xp.reshape(xp.stack(scattered), (*weights.shape[:-1], rows)) if scattered else xp.zeros((*weights.shape[:-1], rows), dtype=work, device=device)
    else:
        offset = query_offset(offset, q_len, k_len, xp=xp, device=device, reach=max_distance)
        check.allocatable("output", (*batch, q_len, int(v.shape[-1])), 8)
        weights, v, table_v = (cast(xp, a, work) for a in (weights, v, table_v))
        index = built_in_range(clipped(xp, distances(q_len, k_len, offset, xp=xp, device=device), max_distance), rows)
        mass = call("toeplitz_scatter", weights, index, rows)
    return cast(xp, weights @ v + mass @ table_v, dtype)


def nezha_table(max_distance, dim, *, base=10000.0, form="released", xp=None, device=None, dtype=None):
    r"""NEZHA's functional (fixed sinusoidal) relative table, ``[2K + 1, dim]``.

    NEZHA (Wei et al., "NEZHA: Neural Contextualized Representation for Chinese Language
    Understanding", 2019) is Shaw et al.'s attention with a fixed table instead of a
    learned one; pass this table as ``table_k`` to :func:`shaw_logits` and as
    ``table_v`` to :func:`shaw_output`. Row ``c`` belongs to ``rel = c - K`` (the
    :func:`clip_relative` index, ``rel = query - key``); ``s(x)`` below is the interleaved
    sinusoid :func:`posenc.sinusoidal` of ``x`` (``s(x)[2i] = sin(x w_i)``,
    ``s(x)[2i+1] = cos(x w_i)``, ``w_i = base**(-2i/dim)``).

    - ``form="released"`` (default): the table NEZHA's checkpoints were trained with. The
      released code indexes its table by ``clip(key - query, -K, K) + K`` and puts the
      sinusoid of that *index* (0..2K) in each row, so row ``c`` here is ``s(2K - c)``
      = ``s(K - rel)``.
    - ``form="paper"``: the paper's formula, the sinusoid of the signed distance
      ``j - i``: row ``c`` is ``s(K - c) = s(-rel)``.

    The two differ by a shift of ``K`` in the angle, which changes the numbers (not the
    model class); use ``"released"`` to reproduce NEZHA checkpoints.

    Parameters
    ----------
    max_distance : int >= 0, ``K`` (NEZHA uses 64 or 127)
    dim : positive even int, the head dimension
    base : float
    form : {"released", "paper"}
    xp, device, dtype : namespace (NumPy), device and float dtype (float32) of the result

    Examples
    --------
    >>> import posenc as pe
    >>> t = pe.nezha_table(2, 4)
    >>> t.shape
    (5, 4)
    >>> bool((t[::-1] == pe.sinusoidal(5, 4)).all())    # released: sinusoid of NEZHA's index
    True
    """
    max_distance = check.integer("max_distance", max_distance, minimum=0)
    dim = check.even_dim("dim", dim)
    form = check.choice("form", form, FORMS)
    check.allocatable("nezha_table", (2 * max_distance + 1, dim), 8)
    xp = namespace(xp=xp)
    dtype = result_dtype(xp, dtype, device)
    rows = xp.arange(2 * max_distance + 1, device=device)
    angle_positions = 2 * max_distance - rows if form == "released" else max_distance - rows
    return sinusoidal(angle_positions, dim, base=base, dtype=dtype)
