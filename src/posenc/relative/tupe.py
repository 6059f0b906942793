"""TUPE: untied content and position correlations."""

from __future__ import annotations

import math
import numbers
from functools import partial

from .. import _validate as check
from .._dispatch import call, reference
from .._xp import broadcast_shapes, cast, device_of, host_constant_like, host_constants, index_dtype, namespace, shifted, size, torch_compiling, torch_tensor, unsplit
from . import _args, _per_token
from .indices import per_row, scalar_offset


def _cls_value(name, value, xp, batch, work, like):
    """A [CLS] replacement value: a real number or a float array broadcasting against the
    batch (e.g. ``[heads]``); a NumPy array beside another library's ``like`` is a host
    constant, converted as ``host_constants`` converts the other arguments (it cannot see
    inside the pair), an array of a third library refused."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return xp.asarray(check.real(name, value), dtype=work, device=device_of(like))
    check.array(name, value)
    value = host_constant_like(name, value, like)
    namespace(like, value)  # (two libraries: the TypeError naming both)
    check.computed_on(name, value, device_of(like))
    check.float_array(name, value, xp)
    try:
        broadcast_shapes(tuple(value.shape), tuple(batch))
    except ValueError:
        raise ValueError(f"{name} of shape {tuple(value.shape)} does not broadcast against the batch dimensions {tuple(batch)}") from None
    return cast(xp, value, work)[..., None, None]


def _heads(q, uq, uk):
    """The head axis of the position term of one offset: ``uq``'s and ``uk``'s (tables shared
    by the batch rows), or one of 1 where only ``q`` has heads."""
    heads = broadcast_shapes(tuple(uq.shape[:-2]), tuple(uk.shape[:-2]))
    return (1,) if q.ndim >= 3 and not heads else heads


def _row_offsets(xp, q, k, p, uq, uk, offset, batch):
    """``(offset[..., None], batch)`` of one ``offset`` per batch row: validated (an integer
    array of the library and device of ``q``; its values against ``p``: :func:`_outside_p`)
    and the leading axes of the logits. The tables must be shared by the rows: the position
    term of each offset is then the one-offset call's."""
    if p.ndim > 2 or uq.ndim > 3 or uk.ndim > 3:
        raise ValueError(f"{_SHARED}, got p {tuple(p.shape)}, uq {tuple(uq.shape)} and uk {tuple(uk.shape)}")
    offset = _per_token.row_offsets(xp, offset, q, k)
    try:
        batch = broadcast_shapes((*offset.shape[:-1], *_heads(q, uq, uk)), tuple(batch))
    except ValueError:
        raise ValueError(
            f"offset of shape {tuple(offset.shape[:-1])} (one per batch row) does not broadcast against the batch axes of q and k {tuple(batch)}"
        ) from None
    return offset, batch


def _outside_p(low, high, *, q_len, k_len, p_shape):
    """The message of offsets from ``low`` to ``high`` whose query rows are not all rows of ``p``."""
    if low < 0:
        return f"offset must be >= 0, got {low}"
    return f"p must have at least max(offset + q_len, k_len) = {max(high + q_len, k_len)} rows, got shape {p_shape}"


_SHARED = "one offset per batch row takes p [n, d_p] and uq, uk [heads, d_p, e] or [d_p, e] (tables shared by the batch rows)"


def _times(xp, rows, u):
    """``rows @ u``; torch's ``rows`` broadcast to ``u``'s leading (head) axes first: its matmul
    of a 2-d matrix by a batch of them takes another kernel, and rounds apart, when the
    matrix records a gradient (the logits depended on whether autograd recorded ``p``)."""
    lead = broadcast_shapes(tuple(rows.shape[:-2]), tuple(u.shape[:-2]))
    if torch_tensor(rows) and tuple(rows.shape[:-2]) != lead:
        rows = xp.broadcast_to(rows, (*lead, *rows.shape[-2:]))
    return rows @ u


def _keys(xp, p, uk, k_len):
    """``(p[:k_len] U^K)^T``: the keys' side of the position term."""
    return xp.matrix_transpose(_times(xp, p[..., :k_len, :], uk))


@reference("tupe_row_terms")
def row_terms(p, every, uq, uk, k_len, scale):
    """``terms[r] = (p[every[r]] U^Q) (p[:k_len] U^K)^T * scale``: the position term of each
    batch row ``r`` of one offset per row (``every [rows, q_len]``: its query positions), the
    product of the one-offset call, made once per row (a batched product rounds apart).
    While torch compiles, one op for every row (``posenc::tupe_row_terms``): a loop would be
    unrolled to the batch size, a graph for each."""
    xp = namespace(p, every)
    keys = _keys(xp, p, uk, k_len)
    terms = [_times(xp, xp.take(p, positions, axis=-2), uq) @ keys * scale for positions in xp.unstack(every)]
    if terms:
        return xp.stack(terms)
    heads = broadcast_shapes(tuple(uq.shape[:-2]), tuple(keys.shape[:-2]))
    return xp.zeros((0, *heads, every.shape[-1], keys.shape[-1]), dtype=keys.dtype, device=device_of(keys))


@host_constants
def tupe_logits(q, k, p, uq, uk, *, offset=None, bias=None, cls=None):
    r"""TUPE logits: content and absolute-position correlations computed apart.

    .. math::

        A_{ij} = \frac{q_i \cdot k_j}{\sqrt{2d}} + \frac{(p_i U^Q) \cdot (p_j U^K)}{\sqrt{2d}} + B_{ij}

    Ke, He and Liu, "Rethinking Positional Encoding in Language Pre-training" (2021):
    the positional embedding ``p`` is no longer added to the tokens but gets its own
    projections ``U^Q, U^K``; ``bias`` adds a relative term (TUPE-R, e.g. a
    :func:`t5_bias`). With ``cls=(to_others, from_others)`` the ``[CLS]`` token (position
    0) is untied from positions: the positional terms (the last two: the scaled absolute
    one and ``bias``) of row 0 are replaced by ``to_others`` and those of column 0, rows
    ``i > 0``, by ``from_others`` (the paper's :math:`\theta_1, \theta_2`; its Eq. 11
    resets TUPE-R's relative term too, as the released code does by giving ``[CLS]`` its
    own relative buckets). Query ``i`` sits at position ``offset + i``
    (its row of ``p``), key ``j`` at ``j``; by default the queries are the last ``q_len``
    positions of the keys, so a decode step costs ``O(q_len k_len)``.

    Parameters
    ----------
    q : float array ``[..., heads, q_len, d]``
    k : float array ``[..., heads, k_len, d]``
    p : float array ``[n, d_p]`` (or with leading dims broadcasting against the batch),
        ``n >= max(offset + q_len, k_len)``: absolute positional embeddings
    uq, uk : float arrays ``[..., heads, d_p, e]``: positional query / key projections
    offset : int >= 0 or 0-d integer array (traced is fine: then its range is not checked),
        position of the first query; ``k_len - q_len`` by default; or one per batch row, an
        integer array ``[...]`` broadcasting against the batch axes before the heads axis,
        beside tables shared by the rows (``p [n, d_p]``, ``uq``/``uk`` without batch axes):
        the query positions ``offset[..., None] + arange(q_len)``, row ``b`` the logits of
        ``offset[b]``, to the bit (each offset's position term is the product of the
        one-offset call, made once per row)
    bias : float array broadcasting against ``[..., heads, q_len, k_len]``, optional
        (computed for the same query positions: pass it the same ``offset``); with ``cls``
        its row 0 and column 0 are not used
    cls : pair of real numbers or float arrays broadcasting against ``[..., heads]``, optional

    Returns
    -------
    array ``[..., heads, q_len, k_len]`` (``d = q.shape[-1]``).

    Examples
    --------
    >>> import numpy as np, posenc as pe
    >>> q = k = np.zeros((1, 2, 2))
    >>> p, u = np.eye(2), np.eye(2)[None]
    >>> pe.tupe_logits(q, k, p, u, u).tolist()                  # (p_i . p_j) / 2
    [[[0.5, 0.0], [0.0, 0.5]]]
    >>> pe.tupe_logits(q, k, p, u, u, cls=(1.0, -1.0)).tolist()
    [[[1.0, 1.0], [-1.0, 0.5]]]
    >>> pe.tupe_logits(q[:, 1:], k, p, u, u).tolist()            # one query: the last row
    [[[0.0, 0.5]]]
    """
    xp = _args.namespace_of(q=q, k=k, p=p, uq=uq, uk=uk, bias=bias)
    q_len, k_len, batch = _args.query_key(q, k, xp)
    check.features(q, k, "the logits are divided by sqrt(2d)")
    rows = per_row(offset)
    if not rows:
        offset = k_len - q_len if offset is None else offset
        device = device_of(q, k)
        offset = check.relative_offset(scalar_offset(offset, minimum=0, device=device), q_len, k_len, device=device)
    check.float_array("p", p, xp)
    check.ndim("p", p, minimum=2)
    check.ndim("uq", check.float_array("uq", uq, xp), minimum=2)
    for name, u in (("uq", uq), ("uk", uk)):
        _args.table(name, u, xp, rows=int(p.shape[-1]), dim=int(uq.shape[-1]), batch=batch)
    if rows:
        offset, batch = _row_offsets(xp, q, k, p, uq, uk, offset, batch)
    rows = max((offset if isinstance(offset, int) else 0) + q_len, k_len)
    if size(p.shape[-2]) < rows:
        raise ValueError(f"p must have at least max(offset + q_len, k_len) = {rows} rows, got shape {tuple(p.shape)}")
    if check.is_array(offset):
        offset = check.rows_within(offset, length=q_len, rows=p.shape[-2], error=partial(_outside_p, q_len=q_len, k_len=k_len, p_shape=tuple(p.shape)))
    arrays = [q, k, p, uq, uk]
    shape = _args.logits_shape(batch, q_len, k_len)
    if bias is not None:
        check.float_array("bias", bias, xp)
        check.broadcast_shape("bias", bias.shape, shape)
        arrays.append(bias)
    if cls is not None and not (isinstance(cls, (tuple, list)) and len(cls) == 2):
        raise TypeError(f"cls must be a pair (to_others, from_others), got {type(cls).__name__}")
    dtype, work = _args.dtypes(xp, *arrays)
    q, k, p, uq, uk = (cast(xp, a, work) for a in (q, k, p, uq, uk))
    p, _ = unsplit(p, -2)  # (its rows are taken at the queries' and sliced at the keys' positions)
    device = device_of(q)
    query_positions = shifted(xp.arange(q_len, dtype=index_dtype(xp, device), device=device), offset)
    scale = 1.0 / math.sqrt(2 * int(q.shape[-1]))
    if per_row(offset):  # one per batch row: the product of each row's one-offset call
        every, _ = unsplit(xp.reshape(query_positions, (math.prod(offset.shape[:-1]), q_len)), 0)  # (an explicit mesh unstacks no split axis)
        terms = call("tupe_row_terms", p, every, uq, uk, k_len, scale) if torch_compiling() else row_terms(p, every, uq, uk, k_len, scale)
        one = (*_heads(q, uq, uk), q_len, k_len)
        position = xp.reshape(terms, (*offset.shape[:-1], *one))
        query_positions = xp.reshape(query_positions, (*offset.shape[:-1], *(1,) * (len(one) - 2), q_len))  # (beside the heads)
    else:
        keys = _keys(xp, p, uk, k_len)
        position = _times(xp, xp.take(p, query_positions, axis=-2), uq) @ keys * scale
    if bias is not None:
        position = position + cast(xp, bias, work)
    if cls is not None:
        to_others, from_others = (_cls_value(n, v, xp, batch, work, q) for n, v in zip(("cls[0]", "cls[1]"), cls))
        row = query_positions[..., None]
        col = xp.arange(k_len, device=device)[None, :]
        position = xp.where(row == 0, to_others, xp.where(col == 0, from_others, position))
    return cast(xp, q @ xp.matrix_transpose(k) * scale + position, dtype)
