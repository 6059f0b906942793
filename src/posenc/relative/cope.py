"""CoPE: contextual position encoding (Golovneva et al., 2024)."""

from __future__ import annotations

import math

import numpy as np

from .. import _validate as check
from .._compat import is_dask_array, is_jax_namespace
from .._xp import broadcast_shapes, cast, compute_dtype, device_of, heads_like, host_constants, index_dtype, namespace, resplit, shifted, torch_tensor, unsplit
from . import _args, _per_token
from .indices import per_row, query_offset, saturated


def _check(q, k, xp, causal, offset, scale, mask):
    """``(q_len, k_len, offset, scale, shape)``: ``offset`` validated, one for every row or,
    one per batch row, as the relative positions ``rel [..., (1,) q_len, k_len]`` of its
    rows (:func:`_row_distances`); ``shape`` the logits'."""
    q_len, k_len, batch = _args.query_key(q, k, xp)
    check.features(q, k, "CoPE's gates are their dot products")
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be True or False, got {causal!r}")
    if per_row(offset):
        offset, batch = _row_distances(xp, q, k, offset, q_len, k_len, batch)
    else:
        offset = query_offset(offset, q_len, k_len, xp=xp, device=device_of(q, k), reach=0)
    logits_shape = (*batch, q_len, k_len)
    scale = 1.0 / math.sqrt(int(q.shape[-1])) if scale is None else check.real("scale", scale, positive=True)
    if mask is not None:
        check.boolean_mask("mask", mask, xp)
        check.computed_on("mask", mask, device_of(q, k))
        try:
            if broadcast_shapes(tuple(mask.shape), logits_shape) != logits_shape:
                raise ValueError
        except ValueError:
            raise ValueError(f"mask of shape {tuple(mask.shape)} does not broadcast against the logits {logits_shape}") from None
    return q_len, k_len, offset, scale, logits_shape


def _row_distances(xp, q, k, offset, q_len, k_len, batch):
    """``(rel, batch)`` of one ``offset`` per batch row: ``rel = (offset[..., None] + i) - j``
    (a head axis before ``[q_len, k_len]`` where ``q`` has one), every value checked to stay
    within the index dtype, and the leading axes of the logits. CoPE reads only the sign of
    ``rel`` (a key past its query): on an accelerator the offsets are clamped instead
    (:func:`saturated`, reach 0), not read."""
    device = device_of(q)
    has_heads = q.ndim >= 3
    offset = _per_token.row_offsets(xp, offset, q, k)[..., None]
    batch = _per_token.batch_with_heads(tuple(offset.shape[:-2]), batch, has_heads, "q and k", rows=True)
    _args.logits_shape(batch, q_len, k_len)
    index = index_dtype(xp, device)
    query, key = xp.arange(q_len, dtype=index, device=device), xp.arange(k_len, dtype=index, device=device)
    clamped = saturated(xp, offset, q_len, k_len, 0, device)
    if clamped is not None:
        rel = clamped + (query[:, None] - key[None, :])
    else:
        known = (1 - k_len, q_len - 1) if q_len and k_len else None
        rel = check.shifted("i - j", query[:, None] - key[None, :], offset, xp, device, known=known)
    return (rel[..., None, :, :] if has_heads else rel), batch


def _gated(xp, q, k, q_len, k_len, offset, scale, causal, mask, shape):
    """``(scale * q.k, sigmoid gates)`` in the compute dtype; future keys get gate 0 when
    causal, and keys ``mask`` hides get gate 0 (the paper's code gates the masked logits).
    The gates are of the logits' ``shape``, which one ``offset`` per batch row (``rel``,
    :func:`_row_distances`) may widen."""
    work = compute_dtype(xp, q.dtype)
    logits = (cast(xp, q, work) @ xp.matrix_transpose(cast(xp, k, work))) * scale
    gates = _sigmoid(xp, logits)
    if per_row(offset):  # one per batch row: a key is past its query where (offset + i) - j < 0
        gates = xp.where(offset >= 0, gates, xp.zeros_like(gates)) if causal else xp.broadcast_to(gates, shape)
    elif causal:
        device = device_of(q, k)
        query = shifted(xp.arange(q_len, dtype=index_dtype(xp, device), device=device), offset)
        key = xp.arange(k_len, dtype=index_dtype(xp, device), device=device)
        gates = xp.where(key[None, :] <= query[:, None], gates, xp.zeros_like(gates))
    if mask is not None:
        gates = xp.where(mask, gates, xp.zeros_like(gates))
    return logits, gates


def _sigmoid(xp, logits):
    """``1 / (1 + exp(-logits))``: torch's and JAX's own sigmoid where gradients flow (the
    paper's ``torch.sigmoid``; the formula's derivative is ``0 * inf = NaN`` past
    ``exp``'s range, as for a far-negative float32 logit), the formula elsewhere, where
    NumPy's ``exp(-x)`` of ``x < -88`` in float32 is inf, the gate 0, with a warning that
    errstate keeps quiet."""
    if torch_tensor(logits):
        return logits.sigmoid()
    if is_jax_namespace(xp):
        import jax

        return jax.nn.sigmoid(logits)
    with np.errstate(over="ignore"):
        return 1 / (1 + xp.exp(-logits))


def _positions(xp, gates):
    """``p_ij = sum_{t >= j} g_it``: a cumulative sum from the last key backwards, over the
    keys whole, so in one order (gathered where an explicit mesh splits them, the result put
    back on their split; one chunk where Dask chunks them, whose sum across chunks adds each
    chunk's total to the next chunk's sums: 9e-5 off NumPy's float32 positions at 256 keys)."""
    gates, split = unsplit(gates, -1)
    if is_dask_array(gates):
        gates = gates.rechunk({gates.ndim - 1: -1})
    return resplit(xp.flip(xp.cumulative_sum(xp.flip(gates, axis=-1), axis=-1), axis=-1), split)


def _interpolated(xp, z, pos, device):
    """``z[..., i, ceil(p)] * w + z[..., i, floor(p)] * (1 - w)``, ``w = p - floor(p)``, for
    ``z [..., q_len, P]`` and positions ``p [..., q_len, k_len]`` in ``[0, P - 1]``: the
    paper's code, term for term (its two gathers, its weights, so its values and gradients);
    a NaN position stays NaN, taking row 0 (no integer holds it)."""
    index = index_dtype(xp, device)
    known = xp.where(xp.isnan(pos), 0.0, pos)
    floor, ceil = xp.astype(xp.floor(known), index), xp.astype(xp.ceil(known), index)
    w = pos - xp.astype(floor, pos.dtype)  # (the paper's pos - pos.floor().long(): no gradient through the floor)
    return _per_token.gather(xp, z, ceil, device=device) * w + _per_token.gather(xp, z, floor, device=device) * (1 - w)


@host_constants
def cope_positions(q, k, *, causal=True, offset=None, scale=None, mask=None):
    r"""CoPE's contextual positions ``p [..., heads, q_len, k_len]`` (Golovneva et al.,
    "Contextual Position Encoding: Learning to Count What's Important", 2024).

    .. math::

        g_{ij} = \sigma\bigl(s\, q_i^\top k_j\bigr), \qquad p_{ij} = \sum_{t=j}^{i} g_{it}

    A gate decides per key whether it counts, so positions count what the query chooses
    (words, sentences, a token kind) instead of tokens. ``s`` is the attention scale
    (``1/sqrt(d)`` by default): the paper's code gates the scaled, masked attention logits
    (the paper's text writes ``s = 1``; pass ``scale=1.0`` for that). With ``causal=True``
    keys after the query (``j > offset + i``) have gate 0, so the sum runs from ``j`` to
    ``i``; with ``causal=False`` it runs over every key from ``j`` on. Keys ``mask`` hides
    (padding, another packed document) have gate 0 too, as in the paper's code, which gates
    the masked logits: a padded sequence counts as the unpadded one.

    Parameters
    ----------
    q : float array ``[..., q_len, d]``; k : float array ``[..., k_len, d]``
    causal : bool
    offset : int, 0-d integer array or None (``k_len - q_len``): the first query's position;
        or one per batch row, an integer array ``[...]`` broadcasting against the batch axes
        before the heads axis (``q.ndim >= 3``): the query positions ``offset[..., None] +
        arange(q_len)``, the result ``[..., heads, q_len, k_len]`` and row ``b`` that of
        ``offset[b]``, to the bit. Only whether a key lies past its query depends on it: on
        an accelerator an offset tensor is clamped to ``[-q_len, k_len]`` there, not read
        (the same result; on the host one whose sums leave int64 is a ``ValueError``)
    scale : float > 0 or None (``1/sqrt(d)``)
    mask : boolean array broadcasting against ``[..., q_len, k_len]`` (True = may attend), optional

    Returns
    -------
    array ``[..., q_len, k_len]`` of ``q``'s dtype: real-valued positions in ``[0, k_len]``.

    Examples
    --------
    >>> import numpy as np, posenc as pe
    >>> q = np.zeros((1, 3, 2)); k = np.zeros((1, 3, 2))      # every gate is 1/2
    >>> pe.cope_positions(q, k)[0].tolist()
    [[0.5, 0.0, 0.0], [1.0, 0.5, 0.0], [1.5, 1.0, 0.5]]
    """
    check.arrays(q=q, k=k, mask=mask)
    xp = namespace(q, k, mask)
    q_len, k_len, offset, scale, shape = _check(q, k, xp, causal, offset, scale, mask)
    _, gates = _gated(xp, q, k, q_len, k_len, offset, scale, causal, mask, shape)
    return cast(xp, _positions(xp, gates), q.dtype)


@host_constants
def cope_logits(q, k, pos_emb, *, causal=True, offset=None, scale=None, mask=None):
    r"""CoPE attention logits ``[..., heads, q_len, k_len]``: ``s q_i.k_j + q_i.e[p_ij]``.

    The contextual positions ``p_ij`` of :func:`cope_positions`, clipped to ``[0, P - 1]``
    (``P = pos_emb.shape[-2]``), index the learned position embeddings ``e [P, d]`` by
    linear interpolation between their integer neighbours of the ``P`` products
    ``z_i[n] = q_i . e[n]`` per query, gathered at ``floor(p)`` and ``ceil(p)`` as the paper's
    code does (its weights, so its values and gradients to the bit; ``O(q_len k_len)`` work
    beside the ``O(q_len P d)`` of ``z``):

    .. math::

        \ell_{ij} = s\, q_i^\top k_j + (1 - w)\, z_i[\lfloor p_{ij} \rfloor] + w\, z_i[\lceil p_{ij} \rceil],
        \qquad w = p_{ij} - \lfloor p_{ij} \rfloor

    (Golovneva et al., 2024, Eq. 4-5 and their reference code.) Masking the logits is the
    caller's (with ``causal=True`` future keys still get a logit: mask them); pass the same
    ``mask`` here so that hidden keys do not count.

    Parameters
    ----------
    q, k : as in :func:`cope_positions`
    pos_emb : float array ``[..., P, d]``, broadcasting against ``q``'s leading axes
        (one table, or one per head ``[heads, P, d]``)
    causal, offset, scale, mask : as in :func:`cope_positions`

    Examples
    --------
    >>> import numpy as np, posenc as pe
    >>> q = np.zeros((1, 2, 2)); q[..., 0] = 1.0; k = np.zeros((1, 2, 2))
    >>> e = np.array([[0.0, 0.0], [2.0, 0.0]])                  # q . e = [0, 2]
    >>> pe.cope_logits(q, k, e, scale=1.0)[0].tolist()          # p = [[.5, 0], [1, .5]]
    [[1.0, 0.0], [2.0, 1.0]]
    """
    check.arrays(q=q, k=k, pos_emb=pos_emb, mask=mask)
    xp = namespace(q, k, pos_emb, mask)
    q_len, k_len, offset, scale, shape = _check(q, k, xp, causal, offset, scale, mask)
    check.float_array("pos_emb", pos_emb, xp)
    check.computed_on("pos_emb", pos_emb, device_of(q, k))
    check.ndim("pos_emb", pos_emb, minimum=2)
    if int(pos_emb.shape[-1]) != int(q.shape[-1]):
        raise ValueError(f"pos_emb must be [..., P, d] with d = {q.shape[-1]} (q's last axis), got shape {tuple(pos_emb.shape)}")
    check.leading_axes(("q", q), ("pos_emb", pos_emb), 2, "leading (batch, head) dimensions")
    npos = int(pos_emb.shape[-2])
    if npos < 1:  # (clip to [0, -1] left every position term out: the plain logits, silently)
        raise ValueError(f"pos_emb must have at least one position row (pos_emb.shape[-2] >= 1), got shape {tuple(pos_emb.shape)}")
    logits, gates = _gated(xp, q, k, q_len, k_len, offset, scale, causal, mask, shape)
    pos = xp.clip(_positions(xp, gates), 0.0, float(npos - 1))
    work = logits.dtype
    pos_emb = heads_like(unsplit(pos_emb, -2)[0], q)  # (z gathers along the table's rows: whole)
    z = cast(xp, q, work) @ xp.matrix_transpose(cast(xp, pos_emb, work))
    position_term = _interpolated(xp, z, pos, device_of(q, k))
    return cast(xp, logits + position_term, q.dtype)
