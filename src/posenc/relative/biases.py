"""Relative attention biases (T5, ALiBi, Shaw scalar, DeBERTa buckets) via their per-distance vector.

Every bias here depends on ``rel = query - key`` only, so it is a function of the
``q_len + k_len - 1`` distances: the per-distance vector ``[heads, q_len + k_len - 1]``
is computed in ``O(L)`` (buckets once per distance) and ``toeplitz_expand`` (a kernel
where one accepts the arguments) writes the ``[heads, q_len, k_len]`` bias from it.
"""

from __future__ import annotations

import math

from .. import _compat, _dispatch, _plans
from . import _signatures
from .. import _validate as check
from .._dispatch import call
from .._xp import cast, compute_dtype, device_of, explicit_sharding, host_constants, host_plain, mesh_axes, namespace, result_dtype, size, split_spec, unsplit, widest_float
from .buckets import deberta_bucket_options, deberta_buckets, t5_bucket_options, t5_reach
from . import _args, _per_token
from .indices import clipped, distance_count, distances, query_offset

KINDS = ("t5", "alibi", "shaw", "deberta")


def alibi_slopes(num_heads, *, max_bias=8.0, xp=None, device=None, dtype=None):
    r"""ALiBi head slopes (Press, Smith and Lewis, "Train Short, Test Long", 2022).

    For ``n`` a power of two the slopes are the geometric sequence
    :math:`m_h = 2^{-B h/n}`, ``h = 1..n``, with ``B = max_bias`` (8 in the paper). Otherwise
    the ``p`` slopes of the largest power of two ``p < n`` come first, followed by every
    other slope of ``2p`` heads, :math:`2^{-B(2h-1)/(2p)}`, ``h = 1..n-p`` (the paper's
    recipe, as BLOOM builds it; MPT's ``alibi_bias_max`` is ``max_bias`` and gives the same
    slopes).

    Parameters
    ----------
    num_heads : int >= 1
    max_bias : float > 0
    xp, device, dtype : namespace (NumPy; the framework module works too), device and float
        dtype (float32) of the result

    Returns
    -------
    array ``[num_heads]``. Every slope is an exact power of two's root computed in
    float64 and rounded once. BLOOM's ``build_alibi_tensor`` (and Falcon's) raises a
    float32-rounded base to integer powers in float32 instead: its slopes are up to 1 float32 ulp off
    these at 12 heads, 5 at 16, 6 at 32 and 11 at 128 (transformers 5.24 with torch 2.13 on a CPU;
    the count follows torch's float32 ``pow``); MPT's ``build_mpt_alibi_tensor`` takes the
    float32 reciprocal of ``pow(2, x)``, these for ``max_bias = 8`` and up to 64 heads, an
    ulp off some of them for other ``max_bias``. ``patch_hf``'s BLOOM, Falcon and MPT
    builders round these slopes as the original does, giving its bits.

    Examples
    --------
    >>> import posenc as pe
    >>> pe.alibi_slopes(4).tolist()
    [0.25, 0.0625, 0.015625, 0.00390625]
    >>> [round(s, 4) for s in pe.alibi_slopes(6).tolist()]
    [0.25, 0.0625, 0.0156, 0.0039, 0.5, 0.125]
    >>> pe.alibi_slopes(4, max_bias=4.0).tolist()
    [0.5, 0.25, 0.125, 0.0625]
    """
    num_heads = check.integer("num_heads", num_heads, minimum=1)
    max_bias = check.real("max_bias", max_bias, positive=True)
    check.allocatable("alibi_slopes", (num_heads,), 64)
    xp = namespace(xp=xp)
    dtype = result_dtype(xp, dtype, device)
    power = 2 ** int(math.floor(math.log2(num_heads)))
    slopes = [2.0 ** (-max_bias * h / power) for h in range(1, power + 1)]
    slopes += [2.0 ** (-max_bias * (2 * h - 1) / (2 * power)) for h in range(1, num_heads - power + 1)]
    return xp.asarray(slopes, dtype=dtype, device=device)


def _table(name, table, xp, rows):
    check.float_array(name, table, xp)
    check.ndim(name, table, exactly=2)
    if rows is not None and int(table.shape[0]) != rows:
        raise ValueError(f"{name} must have {rows} rows ([{rows}, heads]), got shape {tuple(table.shape)}")
    if int(table.shape[1]) < 1:
        raise ValueError(f"{name} must have at least one head column, got shape {tuple(table.shape)}")
    return table


def _lookup(xp, table, index):
    """``vec[h, t] = table[index[t], h]``: ``[heads, len(index)]``, rows contiguous. Under
    JAX's explicit sharding (which wants a gather's output sharding given, and its gradient's
    scatter too) split as the table's heads and the index; a table's split rows are gathered
    first, as an Auto mesh does, and its heads where the index is split over their mesh axes."""
    given, columns = explicit_sharding(table), explicit_sharding(index)
    along = {axis for entry in split_spec(columns, index.ndim) for axis in mesh_axes(entry)}
    table, _ = unsplit(table, 0, 1) if along & mesh_axes(split_spec(given, 2)[1]) else unsplit(table, 0)
    rows = explicit_sharding(table)
    if rows is None and columns is None:
        return xp.take(xp.matrix_transpose(table), index, axis=1)
    from jax.sharding import NamedSharding, PartitionSpec

    mesh = (rows or columns).mesh
    out = NamedSharding(mesh, PartitionSpec(split_spec(rows, 2)[1], *split_spec(columns, index.ndim)))
    return xp.matrix_transpose(table).at[:, index].get(out_sharding=out)


# T5's bucket count in every released checkpoint: a table with this many rows is read as
# [num_buckets, heads] without asking, however many heads it has (T5-XXL: 32 x 64).
T5_NUM_BUCKETS = 32

# Each kind checks its parameters and options once (``_check_<kind>``, returning the
# validated options) and computes its per-distance vector from validated values
# (``_<kind>_vector``).


def _check_t5(xp, table, *, bidirectional=True, max_distance=128, num_buckets=None, heads=None):
    check.float_array("table", table, xp)
    check.ndim("table", table, exactly=2)
    rows, columns = (check.static_int(n) for n in table.shape)
    expected = (
        None if num_buckets is None else check.integer("num_buckets", num_buckets, minimum=1),
        None if heads is None else check.integer("heads", heads, minimum=1),
    )
    if expected == (None, None) and rows < min(columns, T5_NUM_BUCKETS):
        raise ValueError(
            f"table of shape {(rows, columns)} is ambiguous: the layout is [num_buckets, heads], {rows} buckets for "
            f"{columns} heads here, but fewer buckets than heads is also what a transposed [heads, num_buckets] table "
            "looks like; pass num_buckets= or heads= to say which (and table.T for a [heads, num_buckets] one)"
        )
    for axis, (name, want) in enumerate(zip(("num_buckets", "heads"), expected)):
        if want is not None and (rows, columns)[axis] != want:
            flipped = " (transposed? the layout is [num_buckets, heads]: pass table.T)" if (columns, rows)[axis] == want else ""
            raise ValueError(f"table must have {name} = {want} along axis {axis} ([num_buckets, heads]), got shape {(rows, columns)}{flipped}")
    _table("table", table, xp, None)
    num_buckets, max_distance, bidirectional = t5_bucket_options(rows, max_distance, bidirectional)
    return {"num_buckets": num_buckets, "max_distance": max_distance, "bidirectional": bidirectional}


def _t5_source(xp, table, dist, *, num_buckets, max_distance, bidirectional):
    return call("t5_buckets", dist, num_buckets=num_buckets, max_distance=max_distance, bidirectional=bidirectional)


def _check_alibi(xp, slopes, *, symmetric=False):
    check.float_array("slopes", slopes, xp)
    check.ndim("slopes", slopes, exactly=1)
    if check.static_int(slopes.shape[0]) == 0:  # (as a T5 table and alibi_slopes refuse no heads)
        raise ValueError(f"slopes must hold at least one head, got shape {tuple(slopes.shape)}")
    if not isinstance(symmetric, bool):
        raise TypeError(f"symmetric must be True or False, got {symmetric!r}")
    return {"symmetric": symmetric}


def _alibi_source(xp, slopes, dist, *, symmetric):
    """``-dist`` (``-|dist|`` when ``symmetric``) in ``slopes``' compute dtype; ``_alibi_scaled``
    finishes ``-slopes[h] * dist`` in ``slopes``' dtype."""
    return _alibi_distance(xp, dist, compute_dtype(xp, slopes.dtype), symmetric)


def _alibi_distance(xp, dist, work, symmetric):
    """``-dist`` (``-|dist|``) as the float dtype ``work``, elementwise."""
    # In the float dtype first (-(-2**63) and |-2**63| do not exist in int64), then 0 - it:
    # the distance negated, not the product, so a zero distance gives +0.0, not -0.0.
    distance = xp.astype(dist, work)
    return 0.0 - (xp.abs(distance) if symmetric else distance)


def _alibi_scaled(xp, slopes, distance):
    """``slopes[h] * distance[t]`` in ``distance``'s dtype, rounded to ``slopes``' dtype."""
    return cast(xp, cast(xp, slopes, distance.dtype)[:, None] * distance, slopes.dtype)


def _check_shaw(xp, table, *, max_distance):
    max_distance = check.integer("max_distance", max_distance, minimum=0)
    _table("table", table, xp, 2 * max_distance + 1)
    return {"max_distance": max_distance}


def _shaw_source(xp, table, dist, *, max_distance):
    return clipped(xp, dist, max_distance)


def deberta_index(xp, dist, max_distance, bucket_size, max_position):
    """DeBERTa's table row ``delta = clip(bucket(rel) + K, 0, 2K - 1)`` of each distance (validated options),
    as ``clip(bucket(rel), -K, K - 1) + K``: ``rel + K`` may leave the index dtype."""
    if bucket_size is not None:
        dist = deberta_buckets(xp, dist, bucket_size, max_position)
    return xp.clip(dist, -max_distance, max_distance - 1) + max_distance


def deberta_reach(max_distance, bucket_size):
    """Where DeBERTa's table row stops changing with the distance: ``K`` without buckets
    (``clip(rel, -K, K - 1)``); ``math.inf`` with log buckets (no bound is proved here: an
    offset on an accelerator is clamped to those whose distances fit the index dtype,
    :func:`indices.saturated`)."""
    return max_distance if bucket_size is None else math.inf


def deberta_options(max_distance, bucket_size, max_position):
    """Validated DeBERTa options; ``max_position`` defaults to 512 when bucketing."""
    max_distance = check.integer("max_distance", max_distance, minimum=1)
    if bucket_size is None:
        if max_position is not None:
            raise ValueError(f"max_position={max_position!r} only applies with bucket_size; pass bucket_size too")
        return max_distance, None, None
    bucket_size, max_position = deberta_bucket_options(bucket_size, 512 if max_position is None else max_position)
    return max_distance, bucket_size, max_position


def _check_deberta(xp, table, *, max_distance, bucket_size=None, max_position=None):
    max_distance, bucket_size, max_position = deberta_options(max_distance, bucket_size, max_position)
    _table("table", table, xp, 2 * max_distance)
    return {"max_distance": max_distance, "bucket_size": bucket_size, "max_position": max_position}


def _deberta_source(xp, table, dist, *, max_distance, bucket_size, max_position):
    return deberta_index(xp, dist, max_distance, bucket_size, max_position)


def _heads_of(params):
    """The head count of a table ``[rows, heads]`` or of slopes ``[heads]`` (1 for a scalar)."""
    return int(params.shape[-1]) if params.ndim else 1


# Each kind: (check, source, finish, options): the per-distance vector is ``finish(xp,
# params, source(xp, params, dist, **options))``, ``source`` elementwise in ``dist`` and
# without gradient (a table row, ALiBi's negated distance; ``params`` gives only its
# dtype), ``finish`` the one step that reads the parameters.
_KINDS = {
    "t5": (_check_t5, _t5_source, _lookup, ("bidirectional", "max_distance", "num_buckets", "heads")),
    "alibi": (_check_alibi, _alibi_source, _alibi_scaled, ("symmetric",)),
    "shaw": (_check_shaw, _shaw_source, _lookup, ("max_distance",)),
    "deberta": (_check_deberta, _deberta_source, _lookup, ("max_distance", "bucket_size", "max_position")),
}


def kind_vector(kind, xp, params, dist, options):
    """The per-distance vector ``[heads, len(dist)]`` of validated arguments at the distances ``dist``."""
    _, source, finish, _ = _KINDS[kind]
    return finish(xp, params, source(xp, params, dist, **options))


def _params_name(kind):
    return "slopes" if kind == "alibi" else "table"


def _checked(kind, params, q_len, k_len, options, **arrays):
    """Every argument of a relative bias but ``offset`` validated once: ``(xp, kind, q_len,
    k_len, options)``; ``arrays`` (positions, ``out``) join ``params`` in the namespace check."""
    kind = check.choice("kind", kind, KINDS)
    check_options, *_, names = _KINDS[kind]
    unknown = sorted(set(options) - set(names))
    if unknown:
        raise TypeError(f"relative_bias_vector(kind={kind!r}) takes options {', '.join(names)}; got {', '.join(unknown)}")
    xp = _args.namespace_of(**{_params_name(kind): params}, **arrays)
    q_len = check.integer("q_len", q_len, minimum=0)
    k_len = check.integer("k_len", k_len, minimum=0)
    return xp, kind, q_len, k_len, check_options(xp, params, **options)


_VECTOR_ROWS = "the per-distance vector has no batch axes; relative_bias (t5_bias, alibi_bias) takes one offset per batch row"


def _vector(xp, kind, params, q_len, k_len, offset, options):
    """The per-distance vector of validated arguments."""
    dist = distances(q_len, k_len, offset, xp=xp, device=device_of(params))
    return kind_vector(kind, xp, params, dist, options)


def _output(xp, like, name, shape, out, chunks):
    """The validated ``out`` of a bias of ``shape`` (``like``'s dtype): ``out`` as given, the
    blocked Dask array that ``chunks`` asks for, or None once the allocation is checked."""
    if chunks is not None:
        out = _blocked_out(like, shape, chunks, out)
    if out is None:
        check.allocatable_unless_blocked("bias", shape, 8, like)
    else:
        check.out(out, shape=shape, dtype=like.dtype, xp=xp, device=device_of(like), inputs=((name, like),))
    return out


@host_constants
@_plans.planned(_signatures.RelativeBiasVector)
def relative_bias_vector(kind, params, q_len, k_len, *, offset=None, **options):
    r"""Per-distance vector of a relative bias: ``[heads, q_len + k_len - 1]``.

    Entry ``t`` holds the bias of every ``(i, j)`` with ``i - j + k_len - 1 == t``, i.e.
    of the distance ``rel = offset + t - (k_len - 1)`` (``rel = query - key``); the
    ``[heads, q_len, k_len]`` bias is ``bias[h, i, j] = vec[h, i - j + k_len - 1]``
    (:func:`relative_bias` expands it). Buckets are computed once per distance, ``O(L)``.

    ========= ======================================== ===================================
    kind      params                                   vec[h, t] for distance r; options
    ========= ======================================== ===================================
    "t5"      table ``[num_buckets, heads]``           ``table[t5_bucket(r), h]``;
                                                       ``bidirectional=True, max_distance=128``
    "alibi"   slopes ``[heads]``                       ``-slopes[h] * r`` (``|r|`` with
                                                       ``symmetric=True``)
    "shaw"    table ``[2K + 1, heads]``                ``table[clip(r, -K, K) + K, h]``;
                                                       ``max_distance=K`` (required)
    "deberta" table ``[2K, heads]``                    ``table[clip(b(r) + K, 0, 2K - 1), h]``,
                                                       ``b = deberta_bucket`` when
                                                       ``bucket_size`` is given;
                                                       ``max_distance=K`` (required),
                                                       ``bucket_size=None``,
                                                       ``max_position=None`` (512)
    ========= ======================================== ===================================

    "shaw" is Shaw et al.'s relative embedding with one scalar per head (a learned
    clipped-distance bias); "deberta" is the same lookup with DeBERTa's index.

    Parameters
    ----------
    kind : {"t5", "alibi", "shaw", "deberta"}
    params : float array (table or slopes, see above)
    q_len, k_len : int >= 0
    offset : int or 0-d integer array (traced is fine), first query position (keys start
        at 0); ``k_len - q_len`` by default (the queries are the last ``q_len`` keys). One
        for every row: the vector has no batch axes (:func:`relative_bias` takes one per row).
        A 0-d tensor on an accelerator is clamped there, not read (as in :func:`relative_bias`)
    **options : the kind's options above; any other keyword raises ``TypeError``

    Returns
    -------
    array ``[heads, q_len + k_len - 1]`` of ``params``' dtype, in the namespace of ``params``
    and ``offset`` (NumPy ``params`` beside an ``offset`` of another library are a host
    constant, converted into it, as in :func:`relative_bias`).

    Examples
    --------
    >>> import numpy as np, posenc as pe
    >>> pe.relative_bias_vector("alibi", np.array([0.5]), 2, 3).tolist()   # rel -1 .. 2 (offset 1)
    [[0.5, 0.0, -0.5, -1.0]]
    >>> table = np.arange(5.0)[:, None]           # Shaw scalar table, K = 2
    >>> pe.relative_bias_vector("shaw", table, 2, 4, max_distance=2, offset=0).tolist()
    [[0.0, 0.0, 1.0, 2.0, 3.0]]
    """
    xp, kind, q_len, k_len, options = _checked(kind, params, q_len, k_len, options)
    params = host_plain(params)  # (validated: gathered as it is, its subclass and byte order would be the vector's)
    offset = query_offset(offset, q_len, k_len, xp=xp, device=device_of(params), instead=_VECTOR_ROWS, reach=_reach(kind, options))
    check.allocatable("relative_bias_vector", (_heads_of(params), distance_count(q_len, k_len)), 8)  # (Dask's too: a blocked bias reads it whole)
    return _vector(xp, kind, params, q_len, k_len, offset, options)


@_plans.planned(_signatures.ExpandBias)
def expand_bias(vec, q_len, k_len, *, out=None, chunks=None):
    r"""The ``[..., q_len, k_len]`` bias of a per-distance vector: ``bias[..., i, j] = vec[..., i - j + k_len - 1]``.

    ``vec`` is ``[..., q_len + k_len - 1]`` (as :func:`relative_bias_vector` returns it);
    the expansion is a Toeplitz matrix per leading index, written by a fast kernel where
    one accepts the arguments.

    A Dask ``vec`` gives a lazy *blocked* bias: every block ``[..., qb, kb]`` is expanded
    on its own from its slice of ``vec`` (see ``docs/dask.md``). Its blocks are ``chunks``
    when given, else the leading axes are chunked like ``vec`` and the query and key axes
    by Dask's ``"auto"`` rule (``dask.config`` ``array.chunk-size``, 128 MiB by default).

    Parameters
    ----------
    vec : array ``[..., q_len + k_len - 1]``
    q_len, k_len : int >= 0
    out : array ``[..., q_len, k_len]`` of ``vec``'s dtype, optional; written in place
        (a Dask ``out`` also gives its chunks to the result)
    chunks : Dask chunks of the ``[..., q_len, k_len]`` result, optional (Dask ``vec``
        only, not with ``out``), e.g. ``(1, 4096, 4096)`` or ``{-1: 512}``

    Examples
    --------
    >>> import numpy as np, posenc as pe
    >>> vec = np.arange(-1, 3)                    # the distances themselves, rel -1 .. 2
    >>> bool((pe.expand_bias(vec, 2, 3) == pe.relative_positions(2, 3)).all())
    True
    """
    xp = _args.namespace_of(vec=vec, out=out)
    q_len = check.integer("q_len", q_len, minimum=0)
    k_len = check.integer("k_len", k_len, minimum=0)
    check.ndim("vec", vec, minimum=1)
    want = distance_count(q_len, k_len)
    if size(vec.shape[-1]) != want:
        raise ValueError(f"vec must have q_len + k_len - 1 = {want} entries on its last axis, got shape {tuple(vec.shape)}")
    if _compat.is_dask_array(vec):  # (a blocked bias: each block reads vec's distance axis, one chunk, whole)
        check.allocatable("the per-distance vector of the blocked bias", tuple(vec.shape), 8)
    out = _output(xp, vec, "vec", (*vec.shape[:-1], q_len, k_len), out, chunks)
    return call("toeplitz_expand", vec, q_len, k_len, out=out)


def _blocked_out(vec, shape, chunks, out):
    """The empty Dask array whose blocks a ``chunks=`` request asks for."""
    if not _compat.is_dask_array(vec):
        raise TypeError(f"chunks applies to Dask arrays only (a Dask table or slopes), got {type(vec).__name__}")
    if out is not None:
        raise ValueError("pass chunks or out, not both (a Dask out gives its own chunks)")
    blocked = _dispatch.adapter("dask").empty_blocked(vec, shape, chunks)
    return blocked if blocked.size else None


@host_constants
@_plans.planned(_signatures.RelativeBias)
def relative_bias(kind, params, q_len, k_len, *, offset=None, query_positions=None, key_positions=None, out=None, chunks=None, **options):
    """The ``[heads, q_len, k_len]`` bias of :func:`relative_bias_vector`'s kinds.

    ``bias[h, i, j] = relative_bias_vector(kind, params, q_len, k_len, offset=offset,
    **options)[h, i - j + k_len - 1]``; ``out`` and ``chunks`` as in :func:`expand_bias`
    (Dask ``params`` give a lazy blocked bias). ``offset`` is ``k_len - q_len`` by default:
    the queries are the last ``q_len`` keys.

    With per-token positions (padded or packed batches, e.g. :func:`positions_from_mask`,
    :func:`positions_from_cu_seqlens`), ``rel[..., i, j] = query_positions[..., i] -
    key_positions[..., j]`` replaces ``i - j`` and the bias is ``[..., heads, q_len,
    k_len]``, ``...`` the broadcast of their leading (batch) axes: ``bias[..., h, i, j]``
    is the kind's value at ``rel[..., i, j]``. A missing one of the two is ``arange``;
    ``offset`` is added to the query positions (0 by default when ``query_positions`` are
    given, else ``k_len - q_len``). Positions are integers, or for ``"alibi"`` also finite
    floats; ``chunks`` does not apply.

    One ``offset`` per batch row (an integer array ``[...]``, e.g. ``[batch]``: decode
    steps after caches of different lengths) is the per-token call with
    ``query_positions = offset[..., None] + arange(q_len)`` (added to the query positions
    where they are given), the bias ``[..., heads, q_len, k_len]``; row ``b`` is the bias
    of ``offset[b]``, to the bit.

    An ``offset`` tensor (0-d or one per row, without positions) on an accelerator (a torch
    GPU, CuPy, JAX on a GPU) is not read, which would synchronise the device and cannot be
    captured in a CUDA graph: it is clamped there, where the bias stops changing with the
    distance (Shaw's and DeBERTa's clipped tables, T5's last buckets) or, for a bias that
    changes however far (ALiBi's, DeBERTa's log buckets), to the offsets whose relative
    positions fit int64. Every offset the host accepts gives the host's bits; one whose
    sums would leave int64 (a ``ValueError`` in host memory) gives there the bias of the
    nearest offset that fits, never that of a wrapped distance.

    Examples
    --------
    >>> import numpy as np, posenc as pe
    >>> pe.relative_bias("shaw", np.arange(5.0)[:, None], 2, 3, max_distance=2)[0].tolist()
    [[3.0, 2.0, 1.0], [4.0, 3.0, 2.0]]
    >>> keys = np.array([0, 1, 2, 0, 1])          # two packed documents (mask across them yourself)
    >>> pe.relative_bias("shaw", np.arange(5.0)[:, None], 1, 5, max_distance=2,
    ...                  query_positions=keys[-1:], key_positions=keys)[0].tolist()
    [[3.0, 2.0, 1.0, 3.0, 2.0]]
    """
    arrays = {"query_positions": query_positions, "key_positions": key_positions, "out": out}
    xp, kind, q_len, k_len, options = _checked(kind, params, q_len, k_len, options, **arrays)
    params = host_plain(params)  # (validated: gathered as it is, its subclass and byte order would be the bias's)
    if _per_token.given(query_positions, key_positions, offset):
        return _per_token_bias(xp, kind, params, q_len, k_len, offset, query_positions, key_positions, out, chunks, options)
    offset = query_offset(offset, q_len, k_len, xp=xp, device=device_of(params), reach=_reach(kind, options))
    # The whole bias is checked before its per-distance vector is built.
    if _compat.is_dask_array(params):  # (a blocked bias: each block reads the per-distance vector, one chunk, whole)
        check.allocatable("the per-distance vector of the blocked bias", (_heads_of(params), distance_count(q_len, k_len)), 8)
    out = _output(xp, params, _params_name(kind), (_heads_of(params), q_len, k_len), out, chunks)
    vec = _vector(xp, kind, params, q_len, k_len, offset, options)
    return call("toeplitz_expand", vec, q_len, k_len, out=out)


# t5_bias and alibi_bias convert host constants themselves (their own ``host_constants``):
# they call the planned function beneath relative_bias's conversion, not a second one.
_planned_relative_bias = relative_bias.__wrapped__


def distance_float(xp, kind, device):
    """The float dtype that per-token positions of ``kind`` are subtracted in: ALiBi's, which
    may be float, the widest the namespace has on ``device`` (a short distance between long
    positions is exact before it is rounded to the slopes' compute dtype; without float64,
    JAX without x64, it stays float32, the offset carried apart: ``_per_token.shifted``);
    ``None`` for the kinds of integer positions."""
    return widest_float(xp, device) if kind == "alibi" else None


def _reach(kind, options):
    """Where a kind's bias stops changing with the distance (T5's last buckets, Shaw's
    clipped table), or ``math.inf`` (ALiBi's, linear in it: an offset on an accelerator is
    clamped to those whose distances fit the index dtype, :func:`indices.saturated`)."""
    if kind == "t5":
        return t5_reach(options["num_buckets"], options["max_distance"], options["bidirectional"])
    if kind == "deberta":
        return deberta_reach(options["max_distance"], options["bucket_size"])
    return options["max_distance"] if kind == "shaw" else math.inf


def _per_token_bias(xp, kind, params, q_len, k_len, offset, query_positions, key_positions, out, chunks, options):
    """:func:`relative_bias` with per-token positions: the kind's values at every ``rel``."""
    if chunks is not None:
        raise ValueError("chunks applies to the per-distance form, not with query_positions/key_positions or one offset per batch row")
    device = device_of(params)
    floats = distance_float(xp, kind, device)
    qpos, kpos, batch = _per_token.positions(xp, q_len, k_len, offset, query_positions, key_positions, device=device, float_dtype=floats, reach=_reach(kind, options))
    heads = _heads_of(params)
    shape = (*batch, heads, q_len, k_len)
    if out is None:
        check.allocatable("bias", shape, 8)
    else:
        read = ((_params_name(kind), params), ("query_positions", query_positions), ("key_positions", key_positions))
        check.out(out, shape=shape, dtype=params.dtype, xp=xp, device=device, inputs=read)
    _, source, finish, _ = _KINDS[kind]
    result = _per_token.bias(xp, lambda rel: source(xp, params, rel, **options), qpos, kpos, heads, batch, q_len, k_len, finish=lambda s: finish(xp, params, s))
    if out is None:
        return result
    out[...] = result
    return out


@host_constants
def t5_bias(
    table, q_len, k_len, *, bidirectional=True, max_distance=128, offset=None, query_positions=None, key_positions=None, out=None, chunks=None,
    num_buckets=None, heads=None,
):  # fmt: skip
    r"""T5 relative attention bias ``[heads, q_len, k_len]``.

    .. math:: B_{h,i,j} = T[\,\mathrm{bucket}(\mathrm{rel}_{ij}),\, h\,],
              \quad \mathrm{rel}_{ij} = (\mathrm{offset} + i) - j

    with :func:`t5_bucket` (``num_buckets = table.shape[0]``). Raffel et al. (2020): a
    learned scalar per head and bucket, added to the logits; the T5 encoder uses
    ``bidirectional=True``, the decoder ``False``. Hot loop: the per-distance vector is
    expanded by ``toeplitz_expand``.

    Parameters
    ----------
    table : float array ``[num_buckets, heads]``
        A table with fewer rows than columns and fewer than T5's 32 buckets (which every
        released checkpoint uses, so T5-XXL's 32 x 64 is taken as it is) is what a transposed
        ``[heads, num_buckets]`` table looks like: it is refused as ambiguous unless
        ``num_buckets`` or ``heads`` says which.
    q_len, k_len : int >= 0
    num_buckets, heads : int, optional
        The table's expected shape, checked (a transposed table is named as such).
    bidirectional, max_distance : as in :func:`t5_bucket` (``max_distance`` is where the
        log-spaced buckets end, not a clip; see the conventions page)
    offset : int or 0-d integer array (traced is fine), first query position; by default
        ``k_len - q_len``, the queries being the last ``q_len`` keys (a decode step after a
        cache needs no offset); or one per batch row, an integer array ``[...]``: the
        result is then ``[..., heads, q_len, k_len]``, each row the bias of its offset (as
        in :func:`relative_bias`)
    query_positions, key_positions : integer arrays ``[..., q_len]`` / ``[..., k_len]``,
        optional: per-token positions, as in :func:`relative_bias`; the result is then
        ``[..., heads, q_len, k_len]``
    out : array of the result's shape and ``table``'s dtype, optional
    chunks : blocks of the result for a Dask ``table`` (see :func:`expand_bias`), optional

    Returns
    -------
    array ``[heads, q_len, k_len]``, ``table``'s dtype. A Dask ``table`` gives a lazy
    blocked bias, its heads chunked like the table's columns.

    Examples
    --------
    >>> import numpy as np, posenc as pe
    >>> table = np.arange(32.0)[:, None]          # bias = bucket number, one head
    >>> pe.t5_bias(table, 3, 3)[0].tolist()
    [[0.0, 17.0, 18.0], [1.0, 0.0, 17.0], [2.0, 1.0, 0.0]]
    >>> pe.t5_bias(table, 1, 3)[0].tolist()       # one query: the last row
    [[2.0, 1.0, 0.0]]
    >>> pos = pe.positions_from_cu_seqlens(np.array([0, 2, 4]), 4)    # [0, 1, 0, 1]
    >>> pe.t5_bias(table, 1, 4, query_positions=pos[-1:], key_positions=pos)[0].tolist()
    [[1.0, 0.0, 1.0, 0.0]]
    """
    return _planned_relative_bias(
        "t5", table, q_len, k_len, offset=offset, query_positions=query_positions, key_positions=key_positions,
        out=out, chunks=chunks, bidirectional=bidirectional, max_distance=max_distance, num_buckets=num_buckets, heads=heads,
    )  # fmt: skip


@host_constants
def alibi_bias(slopes, q_len, k_len, *, offset=None, symmetric=False, query_positions=None, key_positions=None, out=None, chunks=None):
    r"""ALiBi linear bias ``[heads, q_len, k_len]``: ``-slope[h] * rel[i, j]``.

    .. math:: B_{h,i,j} = -m_h\,\mathrm{rel}_{ij} \quad(\text{or } -m_h\,|\mathrm{rel}_{ij}|
              \text{ with } \texttt{symmetric=True})

    Press et al. (2022). With causal masking (keys in the past, ``rel >= 0``) the bias is
    ``-m_h * (i - j) <= 0``; ``symmetric=True`` penalises distance in both directions
    (encoder use). Hot loop: ``toeplitz_expand`` of the per-distance vector.

    With per-token positions (padded batches, packed documents: e.g.
    :func:`positions_from_mask`), ``rel[..., i, j] = query_positions[..., i] -
    key_positions[..., j]`` and the bias is ``[..., heads, q_len, k_len]``, ``...`` the
    broadcast of their leading (batch) axes (as in :func:`relative_bias`; float positions
    are allowed here).

    Parameters
    ----------
    slopes : float array ``[heads]`` (e.g. :func:`alibi_slopes`)
    q_len, k_len : int >= 0
    offset : int or 0-d integer array (traced is fine), first query position; by default
        ``k_len - q_len`` (0 with ``query_positions``); or one per batch row, an integer
        array ``[...]``: the result is then ``[..., heads, q_len, k_len]``, each row the
        bias of its offset (as in :func:`relative_bias`). On an accelerator an offset
        tensor is not read but clamped to the offsets whose distances fit int64 (the
        host's bits for each; past them, where the host raises ``ValueError``, the bias of
        the nearest: for float32 slopes that of the exact distance, ``-slope * 2**63``)
    symmetric : bool
    query_positions : integer or float array ``[..., q_len]``, optional
    key_positions : integer or float array ``[..., k_len]``, optional
    out : array of the result's shape and ``slopes``' dtype, optional
    chunks : blocks of the result for Dask ``slopes`` (see :func:`expand_bias`), optional;
        not with per-token positions

    Examples
    --------
    >>> import numpy as np, posenc as pe
    >>> pe.alibi_bias(pe.alibi_slopes(2), 2, 3)[0].tolist()     # offset = k_len - q_len = 1
    [[-0.0625, 0.0, 0.0625], [-0.125, -0.0625, 0.0]]
    >>> keys = pe.positions_from_mask(np.array([[0, 1, 1]]))    # left-padded: [[0, 0, 1]]
    >>> pe.alibi_bias(np.array([0.5]), 1, 3, query_positions=np.array([[1]]), key_positions=keys).tolist()
    [[[[-0.5, -0.5, 0.0]]]]
    """
    if out is None and chunks is None and symmetric is False:  # a decode step: its plan's key holds only these keywords
        if query_positions is None and key_positions is None:
            return _planned_relative_bias("alibi", slopes, q_len, k_len, offset=offset)
        return _planned_relative_bias("alibi", slopes, q_len, k_len, offset=offset, query_positions=query_positions, key_positions=key_positions)
    return _planned_relative_bias(
        "alibi", slopes, q_len, k_len, offset=offset, query_positions=query_positions, key_positions=key_positions,
        out=out, chunks=chunks, symmetric=symmetric,
    )  # fmt: skip
