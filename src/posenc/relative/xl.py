"""Transformer-XL / XLNet relative attention, its relative shift, XLNet segments and TENER."""

from __future__ import annotations

import math

from .. import _validate as check
from .._dispatch import call, reference
from .._built import built_in_range
from .._xp import broadcast_shapes, cast, chunked_like, device_of, explicit_sharding, heads_like, host_constants, namespace, pairwise_sum, resplit, size, torch_compiling, unsplit
from ..absolute.sinusoidal import LAYOUTS, sinusoidal
from . import _args, _per_token, _rows
from .indices import distances, per_row, query_offset


def rel_shift(x):
    r"""Transformer-XL's relative shift of ``x [..., q_len, n]``.

    Pads a zero column in front, reads the ``[..., q_len, n + 1]`` buffer as
    ``[..., n + 1, q_len]``, drops the first row and reads the rest as ``[..., q_len, n]``
    again (Dai et al., "Transformer-XL", 2019, ``_rel_shift`` of the released code, here
    with the two sequence axes last). The effect: ``out[..., i, j] = x[..., i, j + q_len - 1 - i]``
    where that index lies in ``[0, n)``; a zero where it is ``n`` (``j = n - q_len + 1 + i``,
    rows ``i < q_len - 1``), and beyond it entries of the next row (both the masked future
    in the causal use: ``rel[i, j] < 0`` below). With ``x[i, c]``
    the score of query ``i`` against the relative embedding of distance ``n - 1 - c``
    and ``n = k_len`` keys ending at the last query, ``out[i, j]`` is the score of
    distance ``rel[i, j] = (k_len - q_len + i) - j``.

    XLNet's ``rel_shift_bnij`` drops the first row without padding; it equals
    ``rel_shift(x[..., 1:])[..., :k_len]`` where ``k_len <= n - q_len``, as in XLNet
    (``n = k_len + q_len``).

    Parameters
    ----------
    x : array ``[..., q_len, n]``

    Examples
    --------
    >>> import numpy as np, posenc as pe
    >>> pe.rel_shift(np.array([[1, 2, 3], [4, 5, 6]])).tolist()
    [[2, 3, 0], [4, 5, 6]]
    """
    check.array("x", x)
    xp = namespace(x)
    check.ndim("x", x, minimum=2)
    q_len, n = size(x.shape[-2]), size(x.shape[-1])
    if 0 in tuple(x.shape):  # (nothing to shift; Dask's reshape refuses an empty array's)
        return xp.zeros_like(x)
    x, split = unsplit(x, -2, -1)  # (the two axes are flattened together and shifted)
    zero = resplit(xp.zeros((*x.shape[:-1], 1), dtype=x.dtype, device=device_of(x)), explicit_sharding(x))
    padded = xp.reshape(xp.concat([zero, x], axis=-1), (*x.shape[:-2], q_len * (n + 1)))
    # Dropping the first row of the [n + 1, q_len] view is dropping the first q_len elements.
    return resplit(chunked_like(xp.reshape(padded[..., q_len:], tuple(x.shape)), x), split)


@host_constants
def xl_logits(q, k, r, u, v):
    r"""Transformer-XL / XLNet relative attention logits (unscaled).

    .. math::

        A_{ij} = q_i \cdot k_j + q_i \cdot r_{i-j} + u \cdot k_j + v \cdot r_{i-j}
               = (q_i + u) \cdot k_j + (q_i + v) \cdot r_{i-j}

    Dai et al., "Transformer-XL" (2019), Eq. (3) with ``W_{k,R} R`` already projected into
    ``r``; XLNet (Yang et al., 2019) is the same with bidirectional ``r``. The queries are
    the last ``q_len`` positions of the keys (memory first), so ``i - j`` is
    ``rel[i, j] = (k_len - q_len + i) - j``. Row ``c`` of ``r`` is the distance
    ``k_len - 1 - c``: ``n_rel = k_len`` rows for distances ``k_len - 1 .. 0`` (causal;
    the logits of future keys, ``rel < 0``, are then unspecified and must be masked) or
    ``k_len + q_len`` rows for ``k_len - 1 .. -q_len`` (bidirectional; XLNet's
    ``relative_positional_encoding`` starts one row earlier, at ``k_len``: pass its
    ``r[..., 1:, :]``). The position
    term is ``(q + v) @ r.T`` gathered per distance (``toeplitz_gather``), the same
    numbers as Transformer-XL's :func:`rel_shift` without the shift's wrap-around.

    Parameters
    ----------
    q : float array ``[..., heads, q_len, d]``
    k : float array ``[..., heads, k_len, d]``, ``k_len >= q_len``
    r : float array ``[..., heads, n_rel, d]``, ``n_rel >= k_len`` (leading dims broadcast)
    u, v : float arrays broadcasting against ``q`` (e.g. ``[heads, 1, d]``)

    Returns
    -------
    array ``[..., heads, q_len, k_len]``.

    Examples
    --------
    >>> import numpy as np, posenc as pe
    >>> q, k, u, v = np.ones((1, 2, 1)), np.zeros((1, 3, 1)), np.zeros((1, 1, 1)), np.zeros((1, 1, 1))
    >>> r = np.array([[[2.0], [1.0], [0.0]]])     # r[c] = distance k_len - 1 - c
    >>> pe.xl_logits(q, k, r, u, v)[0, :, :2].tolist()   # (the masked future left out)
    [[1.0, 0.0], [2.0, 1.0]]
    """
    xp = _args.namespace_of(q=q, k=k, r=r, u=u, v=v)
    q_len, k_len, batch = _args.query_key(q, k, xp)
    if q_len > k_len:
        raise ValueError(f"q_len must be <= k_len (queries are the last keys), got q_len={q_len}, k_len={k_len}")
    _args.table("r", r, xp, rows=None, dim=int(q.shape[-1]), batch=batch)
    n_rel = size(r.shape[-2])
    if n_rel < k_len:
        raise ValueError(f"r must have at least k_len = {k_len} rows (distances k_len-1 .. 0), got shape {tuple(r.shape)}")
    _args.like_query("u", u, q, xp)
    _args.like_query("v", v, q, xp)
    dtype, work = _args.dtypes(xp, q, k, r, u, v)
    _args.logits_shape(batch, q_len, k_len)
    q, k, r, u, v = (cast(xp, a, work) for a in (q, k, r, u, v))
    rel = distances(q_len, k_len, k_len - q_len, xp=xp, device=device_of(q))
    last = xp.zeros((), dtype=rel.dtype, device=device_of(q)) + (n_rel - 1)  # (not asarray, which specializes a symbolic n_rel)
    row = xp.minimum(k_len - 1 - rel, last)  # (k_len - 1 - rel >= 0: rel <= k_len - 1)
    position = call("toeplitz_gather", (q + v) @ heads_like(xp.matrix_transpose(r), q), built_in_range(row, n_rel), k_len)
    return cast(xp, (q + u) @ xp.matrix_transpose(k) + position, dtype)


@reference("tener_row_terms")
def row_terms(queries, tables):
    """``terms[r] = queries[r] @ tables[r]^T``: TENER's position scores of each batch row ``r``
    of one offset per row (``queries [rows, ..., q_len, d]``, ``q + v`` of the row;
    ``tables [rows, n, d]``, the sinusoids of its offset's distances), the product of the
    one-offset call on that row alone, made once per row (a product of the whole batch
    folds the rows into one matrix, which rounds apart). While torch compiles, one op for
    every row (``posenc::tener_row_terms``): a loop would be unrolled to the batch size, a
    graph for each."""
    xp = namespace(queries, tables)
    terms = [a @ xp.matrix_transpose(t) for a, t in zip(xp.unstack(queries), xp.unstack(tables))]
    if terms:
        return xp.stack(terms)
    return xp.zeros((0, *queries.shape[1:-1], tables.shape[-2]), dtype=queries.dtype, device=device_of(queries))


def _sinusoids(xp, rel, dim, **options):
    """``sinusoidal(rel [..., n], dim)``, ``[..., n, dim]``, each distance computed once where
    host distances repeat (the rows of close offsets share most of theirs; the same bits:
    the sinusoid is elementwise)."""
    distinct = _per_token.spanned(xp, xp.reshape(rel, (-1,)))
    if distinct is None:
        return sinusoidal(rel, dim, **options)
    span, index = distinct
    return xp.reshape(xp.take(sinusoidal(span, dim, **options), index, axis=0), (*rel.shape, dim))


def _row_scores(xp, queries, tables, batch, heads):
    """``[*batch, q_len, n]``: :func:`row_terms` of ``queries [..., q_len, d]`` broadcast to
    ``batch`` and ``tables [*rows, n, d]`` to the rows' axes (``batch`` but ``heads`` more)."""
    rows = tuple(batch[: len(batch) - heads])
    count = math.prod(rows)
    # (an explicit mesh unstacks no split axis: the rows' queries and tables gathered, as shaw_output's weights)
    queries, _ = unsplit(xp.reshape(xp.broadcast_to(queries, (*batch, *queries.shape[-2:])), (count, *batch[len(rows) :], *queries.shape[-2:])), 0)
    tables, _ = unsplit(xp.reshape(xp.broadcast_to(tables, (*rows, *tables.shape[-2:])), (count, *tables.shape[-2:])), 0)
    terms = call("tener_row_terms", queries, tables) if torch_compiling() else row_terms(queries, tables)
    return xp.reshape(terms, (*batch, *terms.shape[-2:]))


@host_constants
def tener_logits(q, k, u, v, *, base=10000.0, offset=None, layout="interleaved"):
    r"""TENER's direction-aware relative attention logits (unscaled).

    .. math::

        A_{ij} = q_i \cdot k_j + q_i \cdot R_{i-j} + u \cdot k_j + v \cdot R_{i-j},
        \qquad R_t = \mathrm{sinusoidal}(t)

    Yan et al., "TENER: Adapting Transformer Encoder for Named Entity Recognition"
    (2019): the Transformer-XL form with a fixed, unprojected sinusoid of the *signed*
    distance ``t = rel[i, j] = (offset + i) - j``; ``sin`` is odd, so ``R_t`` tells left
    from right. TENER leaves the logits unscaled (no ``1/sqrt(d)``). ``R`` is built for
    the ``q_len + k_len - 1`` distances only and gathered per distance.

    Parameters
    ----------
    q : float array ``[..., heads, q_len, d]``, ``d`` even
    k : float array ``[..., heads, k_len, d]``
    u, v : float arrays broadcasting against ``q``
    base : float, sinusoid base
    offset : int or 0-d integer array (traced is fine), first query position;
        ``k_len - q_len`` by default (the queries are the last ``q_len`` keys). A 0-d
        tensor on an accelerator is clamped there, not read, to the offsets whose distances
        fit int64 (the host's bits for each; past them, a ``ValueError`` on the host, the
        logits of the nearest). Or one per batch row, an integer array ``[...]``
        broadcasting against the batch axes before the heads axis: the query positions
        ``offset[..., None] + arange(q_len)``, row ``b`` the logits of the call on that row
        alone with ``offset[b]``, to the bit (each row's sinusoids and their product with
        its queries are that call's, made once per row; a one-offset call of the whole
        batch may round its rows apart from those: see docs/relative.md)
    layout : {"interleaved", "half"}, the sinusoid's feature order (:func:`posenc.sinusoidal`;
        default ``"interleaved"``). ``"split"``, its earlier name, warns. This is the
        paper's form: TENER's released code orders its sinusoid ``"half"`` (sines, then
        cosines) but with fairseq's frequencies ``10000**(-i/(d/2 - 1))``, and adds a
        key-against-table term (docs: relative).

    Returns
    -------
    array ``[..., heads, q_len, k_len]``.

    Examples
    --------
    >>> import numpy as np, posenc as pe
    >>> q = np.array([[[0.0, 1.0]]])              # picks the cosine feature of R
    >>> zero = np.zeros((1, 1, 2))
    >>> pe.tener_logits(q, np.zeros((1, 2, 2)), zero, zero).round(4).tolist()   # rel = 1, 0
    [[[0.5403, 1.0]]]
    >>> pe.tener_logits(q, np.zeros((1, 2, 2)), zero, zero, offset=np.array([1, 0])).round(4).tolist()
    [[[[0.5403, 1.0]]], [[[1.0, 0.5403]]]]
    """
    xp = _args.namespace_of(q=q, k=k, u=u, v=v)
    q_len, k_len, batch = _args.query_key(q, k, xp)
    dim = int(q.shape[-1])
    if dim % 2:
        raise ValueError(f"q and k must have an even head dimension (sinusoid pairs), got {dim}")
    _args.like_query("u", u, q, xp)
    _args.like_query("v", v, q, xp)
    base = check.real("base", base, positive=True)
    device = device_of(q)
    rows = per_row(offset)
    if rows:  # the query positions offset[..., None] + arange(q_len), each row's distances within int64
        qpos, _, batch = _per_token.placed(xp, q_len, k_len, offset, None, None, batch, q.ndim >= 3, "q and k", device=device, reach=math.inf)
    else:
        offset = query_offset(offset, q_len, k_len, xp=xp, device=device, reach=math.inf)
    layout = check.layout("layout", layout, LAYOUTS)
    dtype, work = _args.dtypes(xp, q, k, u, v)
    _args.logits_shape(batch, q_len, k_len)
    q, k, u, v = (cast(xp, a, work) for a in (q, k, u, v))
    if rows:
        tables = _sinusoids(xp, _rows.row_distances(xp, qpos, q_len, k_len, device=device), dim, base=base, layout=layout, dtype=work)
        scores = _row_scores(xp, q + v, tables, batch, q.ndim >= 3)
    else:
        scores = (q + v) @ xp.matrix_transpose(sinusoidal(distances(q_len, k_len, offset, xp=xp, device=device), dim, base=base, layout=layout, dtype=work))
    n = size(scores.shape[-1])
    position = call("toeplitz_gather", scores, built_in_range(xp.arange(n, device=device), n), k_len)
    return cast(xp, (q + u) @ xp.matrix_transpose(k) + position, dtype)


@host_constants
def segment_logits(q, seg_q, seg_k, s_same, s_diff, b):
    r"""XLNet's relative segment term (unscaled).

    .. math::

        a_{ij} = (q_i + b) \cdot s_{ij}, \qquad
        s_{ij} = \begin{cases} s_+ & \mathrm{seg}_i = \mathrm{seg}_j \\ s_- & \text{otherwise}\end{cases}

    Yang et al., "XLNet" (2019), Sec. 2.5: only whether two tokens share a segment is
    encoded, not which segments they are. Added to the logits of :func:`xl_logits`.

    Parameters
    ----------
    q : float array ``[..., heads, q_len, d]``
    seg_q : integer array ``[..., q_len]``, segment ids of the queries; its leading dims
        broadcast against ``q.shape[:-3]`` (the batch, no head axis)
    seg_k : integer array ``[..., k_len]``, segment ids of the keys
    s_same, s_diff, b : float arrays broadcasting against ``q`` (e.g. ``[heads, 1, d]``)

    Returns
    -------
    array ``[..., heads, q_len, k_len]``.

    Examples
    --------
    >>> import numpy as np, posenc as pe
    >>> q = np.ones((1, 2, 1))
    >>> one = np.ones((1, 1, 1))
    >>> pe.segment_logits(q, np.array([0, 1]), np.array([0, 0, 1]), 2 * one, -one, 0 * one)[0].tolist()
    [[2.0, 2.0, -1.0], [-1.0, -1.0, 2.0]]
    """
    xp = _args.namespace_of(q=q, seg_q=seg_q, seg_k=seg_k, s_same=s_same, s_diff=s_diff, b=b)
    check.float_array("q", q, xp)
    check.ndim("q", q, minimum=2)
    for name, a in (("seg_q", seg_q), ("seg_k", seg_k)):
        check.integer_array(name, a, xp)
        check.ndim(name, a, minimum=1)
    q_len, k_len = size(q.shape[-2]), size(seg_k.shape[-1])
    if size(seg_q.shape[-1]) != q_len:
        raise ValueError(f"seg_q must have q_len = {q_len} entries on its last axis, got shape {tuple(seg_q.shape)}")
    for name, a in (("s_same", s_same), ("s_diff", s_diff), ("b", b)):
        _args.like_query(name, a, q, xp)
    head_axis = 1 if q.ndim >= 3 else 0
    mask_shape = _segment_batch(seg_q.shape[:-1], seg_k.shape[:-1], q.shape[: q.ndim - 2 - head_axis])
    shape = (*broadcast_shapes((*mask_shape, *(1,) * head_axis), tuple(q.shape[:-2])), q_len, k_len)
    check.allocatable("logits", shape, 8)
    dtype, work = _args.dtypes(xp, q, s_same, s_diff, b)
    q, s_same, s_diff, b = (cast(xp, a, work) for a in (q, s_same, s_diff, b))
    if seg_q.dtype != seg_k.dtype:  # (mixed integer dtypes promote to float or wrap in JAX, and torch refuses unsigned ones)
        device = device_of(q)
        seg_q, seg_k = check.widened("seg_q", seg_q, xp, device), check.widened("seg_k", seg_k, xp, device)
    same = seg_q[..., :, None] == seg_k[..., None, :]
    if head_axis:
        same = same[..., None, :, :]
    # (pairwise_sum's one order of the terms: xp.sum's follows q's memory layout)
    with_same = pairwise_sum(xp, (q + b) * s_same)[..., None]
    with_diff = pairwise_sum(xp, (q + b) * s_diff)[..., None]
    return cast(xp, xp.where(same, with_same, with_diff), dtype)


def _segment_batch(seg_q_batch, seg_k_batch, q_batch):
    try:
        return broadcast_shapes(tuple(seg_q_batch), tuple(seg_k_batch), tuple(q_batch))
    except ValueError:
        raise ValueError(
            f"the leading dims of seg_q {tuple(seg_q_batch)}, seg_k {tuple(seg_k_batch)} and the batch of q "
            f"{tuple(q_batch)} must broadcast together"
        ) from None
