"""Linear attention with RoPE in the numerator (RoFormer, section 3.3)."""

from __future__ import annotations

from .. import _dispatch
from .. import _validate as check
from .._xp import broadcast_shapes, cast, compute_dtype, host_constants, namespace, one_device, pairwise_sum, unsplit, without_empty_chunks
from . import _args
from .scaling import frequency_table

FEATURE_MAPS = ("elu",)


def _elu_plus_one(xp, x):
    negative_part = xp.where(x > 0, xp.zeros_like(x), x)
    return xp.where(x > 0, x + 1.0, xp.exp(negative_part))


@host_constants
def linear_attention(q, k, v, *, positions=None, base=10000.0, layout="half", feature_map="elu", causal=False, eps=0.0):
    r"""Linear attention (Katharopoulos et al., 2020), optionally with RoPE (Su et al., 2021).

    .. math::

        o_i = \frac{\sum_j [R_i\,\phi(q_i)]^\top [R_j\,\phi(k_j)]\, v_j}
                   {\sum_j \phi(q_i)^\top \phi(k_j)}, \qquad \phi(x) = \mathrm{elu}(x) + 1

    RoPE rotates :math:`\phi(q), \phi(k)` in the numerator only: the denominator stays
    positive (RoFormer eq. 29). Both sums are computed as :math:`\phi(Q)(\phi(K)^\top V)`
    (``causal=False``) or with running sums of :math:`\phi(k_j)\, v_j^\top` over
    :math:`j \le m - n + i` (``causal=True``), never an ``n x m`` matrix: linear in the
    sequence lengths (``O(m d d_v)`` memory when causal).

    Parameters
    ----------
    q : array ``[..., n, d]``; k : array ``[..., m, d]``; v : array ``[..., m, d_v]``
        Real floating, one namespace; ``d`` even when ``positions`` is given.
    positions : array or (array, array), optional
        Token positions: one array for both ``q`` and ``k`` (self-attention), or
        ``(query_positions, key_positions)``; their last axis runs along the sequence
        axis (-2) and their leading axes along the leading batch axes (``[seq]`` or
        ``[batch, seq]`` for ``[batch, heads, seq, d]``), as in :func:`rope`.
        ``None``: no RoPE.
    base : float
    layout : {"half", "interleaved"}
    feature_map : "elu" or callable
        :math:`\phi`; a callable maps an array to a non-negative array of the same shape.
    causal : bool
        Query ``i`` attends to keys ``j <= m - n + i``: the queries are the last ``n`` keys
        (``n <= m``), as in :func:`posenc.attention`, so a decode step's one query gives the
        last row of the full call.
    eps : float >= 0
        Added to the denominator, as Katharopoulos et al.'s code does (``1e-6`` there). With
        the default 0, a query whose features meet none of its keys' (a feature map that
        gives zeros, such as ReLU) has no defined output: NaN or infinite. No keys at all
        (``m == 0``) give zeros, as in :func:`posenc.attention`.

    Returns
    -------
    array ``[..., n, d_v]`` of ``q``'s dtype (computed in float32 for 16-bit inputs).

    Examples
    --------
    >>> import numpy as np, posenc as pe
    >>> q = k = np.zeros((3, 4)); v = np.arange(6.0).reshape(3, 2)
    >>> pe.linear_attention(q, k, v, causal=True).tolist()  # phi = 1: running means of v
    [[0.0, 1.0], [1.0, 2.0], [2.0, 3.0]]
    """
    for name, a in (("q", q), ("k", k), ("v", v)):
        check.array(name, a)
    given = dict(enumerate(positions)) if isinstance(positions, tuple) else {"": positions}
    named = {f"positions{'' if i == '' else f'[{i}]'}": p for i, p in given.items()}
    check.arrays(**named)
    xp = namespace(q, k, v, *given.values())
    one_device(q=q, k=k, v=v, **named)
    check.query_key_value(q, k, v, xp)
    check.features(q, k, "the normaliser sums the feature map over them")
    check.flag("causal", causal)
    eps = check.real("eps", eps, minimum=0.0)
    if causal and q.shape[-2] > k.shape[-2]:
        raise ValueError(f"causal=True needs at most as many queries as keys (the queries are the last keys), got q {tuple(q.shape)} and k {tuple(k.shape)}")
    for first, second in ((("q", q), ("k", k)), (("q", q), ("v", v)), (("k", k), ("v", v))):
        check.leading_axes(first, second, 2, "leading (batch, head) axes")
    batch = broadcast_shapes(tuple(q.shape[:-2]), tuple(k.shape[:-2]), tuple(v.shape[:-2]))
    (n, d), (m, d_v) = tuple(q.shape[-2:]), tuple(v.shape[-2:])
    # The elements of its arrays: the features, the key-value sums (one per key when causal), the result.
    sums = m * d * d_v if causal else d * d_v
    check.allocatable_unless_blocked("linear_attention's arrays", (*batch, (n + m) * d + sums + n * d_v), 8, q)
    if not callable(feature_map):
        check.choice("feature_map", feature_map, FEATURE_MAPS)

    def phi(a):
        return feature_map(a) if callable(feature_map) else _elu_plus_one(xp, a)

    base = check.real("base", base, positive=True)
    layout = _args.layout("layout", layout)
    if positions is not None:
        if isinstance(positions, tuple) and len(positions) != 2:
            raise ValueError(f"positions must be an array or a (query_positions, key_positions) pair, got {len(positions)} items")
        q_pos, k_pos = positions if isinstance(positions, tuple) else (positions, positions)
        q_pos = _args.place("positions", check.positions("positions", q_pos, xp), tuple(q.shape[:-1]), q.ndim - 2)
        k_pos = _args.place("positions", check.positions("positions", k_pos, xp), tuple(k.shape[:-1]), k.ndim - 2)
        dim = check.even_dim("q.shape[-1]", q.shape[-1])
    work = compute_dtype(xp, q.dtype)
    fq, fk = phi(cast(xp, q, work)), phi(cast(xp, k, work))
    vw = cast(xp, v, work)
    if positions is None:
        rq, rk = fq, fk
    else:
        inv_freq = frequency_table(None, dim, base, None)[0]
        rq = _dispatch.call("rope_rotate", fq, q_pos, inv_freq, layout=layout)
        rk = _dispatch.call("rope_rotate", fk, k_pos, inv_freq, layout=layout)
    if causal:
        # kv[..., t, :, :] = sum_{j <= t} rk_j v_j^T ; z[..., t, :] = sum_{j <= t} fk_j, read at
        # the queries' keys t = first + i (the queries are the last keys)
        first = k.shape[-2] - q.shape[-2]
        rk, vw, fk = (unsplit(a, -2)[0] for a in (rk, vw, fk))  # (running sums along the keys)
        kv = xp.cumulative_sum(without_empty_chunks(rk[..., :, None] * vw[..., None, :]), axis=-3)[..., first:, :, :]
        numerator = pairwise_sum(xp, xp.matrix_transpose(rq[..., :, None] * kv))
        denominator = pairwise_sum(xp, fq * xp.cumulative_sum(without_empty_chunks(fk), axis=-2)[..., first:, :])
    else:
        numerator = xp.matmul(rq, xp.matmul(xp.matrix_transpose(rk), vw))
        denominator = pairwise_sum(xp, fq * xp.sum(fk, axis=-2)[..., None, :])
    if k.shape[-2] == 0:
        return cast(xp, numerator, q.dtype)  # (an empty sum: zeros)
    return cast(xp, numerator / (denominator[..., None] + eps), q.dtype)
