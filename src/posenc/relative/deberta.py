"""DeBERTa's disentangled attention, as the released code computes it."""

from __future__ import annotations

import math

from .. import _plans
from .. import _validate as check
from .._dispatch import call
from .._built import built_in_range
from .._xp import cast, device_of, heads_like, host_constants
from . import _args, _per_token, _rows, _signatures
from .biases import deberta_index, deberta_options, deberta_reach
from .indices import distances, query_offset


TERMS = ("c2p", "p2c")


@host_constants
@_plans.planned(_signatures.DebertaLogits)
def deberta_logits(
    q, k, pos_q, pos_k, *, max_distance, bucket_size=None, max_position=None, terms=TERMS, offset=None, query_positions=None, key_positions=None
):
    r"""DeBERTa disentangled attention logits (content-to-content, -position, position-to-content).

    .. math::

        A_{ij} = \frac{q_i \cdot k_j + q_i \cdot P^K_{\delta(i,j)} + k_j \cdot P^Q_{\delta(i,j)}}{\sqrt{3d}},
        \qquad \delta(i, j) = \mathrm{clip}(b(\mathrm{rel}_{ij}) + K,\; 0,\; 2K - 1)

    with ``rel = query - key`` (query positions ``offset + arange(q_len)``, by default the
    last ``q_len`` of the keys') and ``b`` the
    identity, or :func:`deberta_bucket` when ``bucket_size`` is given (DeBERTa-v2/v3).
    He et al., "DeBERTa: Decoding-enhanced BERT with Disentangled Attention" (2021).
    ``pos_k = P^K`` and ``pos_q = P^Q`` are the relative embeddings already projected by
    the key and query projections (``[..., heads, 2K, d]``, ``K`` = the released code's
    ``att_span``).

    ``terms`` is the subset of position terms a model uses (its config's
    ``pos_att_type``): ``"c2p"`` (content-to-position, :math:`q_i \cdot P^K`) and
    ``"p2c"`` (position-to-content, :math:`k_j \cdot P^Q`). The scale is
    :math:`\sqrt{(1 + \text{len(terms)})\, d}` (:math:`\sqrt{3d}` with both), as in the
    released code; the table of an unused term may be ``None``.

    This is the released code's arithmetic (``disentangled_attention_bias``, the numbers
    the checkpoints were trained with). The paper's Eq. (4) writes the
    position-to-content term as :math:`k_j \cdot P^Q_{\delta(j,i)}`, the distance seen from
    the key; the released code indexes it with the same :math:`\delta(i, j)` as the
    content-to-position term (it gathers ``k @ pos_q.T`` at ``clip(-rel[j, i] + K)`` and
    transposes), which is what is computed here. Both position terms are ``O(L)``
    projections gathered per distance (``toeplitz_gather``); no ``[q, k, d]`` tensor.

    Parameters
    ----------
    q : float array ``[..., heads, q_len, d]``
    k : float array ``[..., heads, k_len, d]``
    pos_q, pos_k : float arrays ``[..., heads, 2K, d]`` (leading dims broadcast), or
        ``None`` when their term is not in ``terms``
    max_distance : int >= 1, ``K``
    bucket_size : int >= 2, optional; log-bucket the distances first
    max_position : int, optional (512 by default when ``bucket_size`` is given)
    terms : subset of ``("c2p", "p2c")``
    offset : int or 0-d integer array (traced is fine), first query position;
        ``k_len - q_len`` by default (0 with ``query_positions``); or one per batch row, as
        in :func:`shaw_logits`. On an accelerator an offset tensor (without positions) is
        not read but clamped: where the index stops changing (``K`` without buckets), with
        log buckets to the offsets whose distances fit int64 (the host's bits for each; past
        them, a ``ValueError`` on the host, the logits of the nearest)
    query_positions, key_positions : integer arrays ``[..., q_len]`` / ``[..., k_len]``,
        optional: per-token positions, as in :func:`shaw_logits`

    Returns
    -------
    array ``[..., heads, q_len, k_len]``, already divided by ``sqrt((1 + len(terms)) d)``.

    Examples
    --------
    >>> import numpy as np, posenc as pe
    >>> q, k = np.ones((1, 2, 3)), np.zeros((1, 2, 3))
    >>> pos_k = np.repeat(np.arange(4.0)[:, None], 3, axis=1)[None]   # K = 2: rows delta 0..3
    >>> pe.deberta_logits(q, k, pos_k, pos_k, max_distance=2).tolist()
    [[[2.0, 1.0], [3.0, 2.0]]]
    >>> pe.deberta_logits(q, k, None, pos_k, max_distance=2, terms=("c2p",)).round(4).tolist()
    [[[2.4495, 1.2247], [3.6742, 2.4495]]]
    """
    terms = canonical_terms(terms)
    tables = {"c2p": ("pos_k", pos_k), "p2c": ("pos_q", pos_q)}
    for term in terms:
        name, table = tables[term]
        if table is None:
            raise ValueError(f"{name} is needed for the {term!r} term (terms={terms!r}), got None")
    arrays = {"q": q, "k": k, "pos_q": pos_q, "pos_k": pos_k, "query_positions": query_positions, "key_positions": key_positions}
    xp = _args.namespace_of(**arrays)
    q_len, k_len, batch = _args.query_key(q, k, xp)
    check.features(q, k, "the logits are divided by sqrt((1 + len(terms)) d)")
    max_distance, bucket_size, max_position = deberta_options(max_distance, bucket_size, max_position)
    dim = int(q.shape[-1])
    given = [(name, table) for name, table in (("pos_q", pos_q), ("pos_k", pos_k)) if table is not None]
    for name, table in given:
        _args.table(name, table, xp, rows=2 * max_distance, dim=dim, batch=batch)
    dtype, work = _args.dtypes(xp, q, k, *(table for _, table in given))
    device = device_of(q)
    reach = deberta_reach(max_distance, bucket_size)
    if _per_token.given(query_positions, key_positions, offset):
        qpos, kpos, batch = _per_token.placed(xp, q_len, k_len, offset, query_positions, key_positions, batch, q.ndim >= 3, "q and k", device=device, reach=reach)
        _args.logits_shape(batch, q_len, k_len)
        by_row = _rows.served(offset, batch, q_len, k_len, query_positions, key_positions)
        rel = _rows.row_distances(xp, qpos, q_len, k_len, device=device) if by_row else _per_token.relative(qpos, kpos, heads=q.ndim >= 3)
    else:
        by_row = False
        _args.logits_shape(batch, q_len, k_len)
        rel = distances(q_len, k_len, query_offset(offset, q_len, k_len, xp=xp, device=device, reach=reach), xp=xp, device=device)
    q, k = cast(xp, q, work), cast(xp, k, work)
    total = q @ xp.matrix_transpose(k)
    delta = deberta_index(xp, rel, max_distance, bucket_size, max_position)
    if "c2p" in terms:
        scores = q @ heads_like(xp.matrix_transpose(cast(xp, pos_k, work)), q)
        if by_row:
            total = _rows.plus_gathered(xp, total, scores, delta, k_len, batch, q.ndim >= 3)
        else:
            total = total + _gather(xp, scores, delta, k_len, 2 * max_distance, device)
    if "p2c" in terms:
        # Key j's row of k @ pos_q.T, read at delta(i, j): the transposed problem ([k_len, q_len],
        # entry t' = j - i + q_len - 1) sees the per-distance index in reverse order.
        scores = k @ heads_like(xp.matrix_transpose(cast(xp, pos_q, work)), k)
        if by_row:
            total = _rows.plus_gathered(xp, total, scores, xp.flip(delta, axis=-1), q_len, batch, q.ndim >= 3, transposed=True)
        else:
            flipped = xp.matrix_transpose(delta) if delta.ndim > 1 else xp.flip(delta)
            total = total + xp.matrix_transpose(_gather(xp, scores, flipped, q_len, 2 * max_distance, device))
    return cast(xp, total / math.sqrt((1 + len(terms)) * dim), dtype)


def _gather(xp, scores, index, k_len, rows, device):
    """``scores`` read at a per-distance index (``toeplitz_gather``) or a per-token one, its
    values table rows in ``[0, rows)``."""
    if index.ndim > 1:
        return _per_token.gather(xp, scores, index, device=device)
    return call("toeplitz_gather", scores, built_in_range(index, rows), k_len)


def canonical_terms(terms):
    """``terms`` as a tuple in canonical order; a subset of ``("c2p", "p2c")`` without repeats."""
    if isinstance(terms, str) or not hasattr(terms, "__iter__"):
        raise TypeError(f"terms must be a tuple of term names, a subset of {TERMS}, got {terms!r}")
    given = list(terms)
    if any(t not in TERMS for t in given) or len(set(given)) != len(given):
        raise ValueError(f"terms must be a subset of {TERMS} without repeats, got {tuple(given)!r}")
    return tuple(t for t in TERMS if t in given)
