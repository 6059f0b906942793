"""KERPLE (Chi et al., NeurIPS 2022) and Sandwich (Chi et al., ACL 2023): biases of ``|i - j|``.

Both depend on the distance only, so each computes its per-distance vector
``[heads, q_len + k_len - 1]`` and :func:`expand_bias` (the Toeplitz kernels) writes the
``[heads, q_len, k_len]`` bias.
"""

from __future__ import annotations

import math

from .. import _validate as check
from .._xp import arguments_in, cast, constant_on, cos_sin, device_of, host_constants, namespace, pairwise_sum, result_dtype, torch_tensor, widest_float
from . import _per_token
from .biases import expand_bias
from .indices import distance_count, distances, offset_namespace, per_row, query_offset

KERPLE_KINDS = ("log", "power")


# Both biases change with the distance however far: an offset tensor on an accelerator is
# clamped to the offsets whose distances fit the index dtype, not read (indices.saturated).
REACH = math.inf


def _lengths(q_len, k_len, offset, xp, device, instead=None):
    q_len = check.integer("q_len", q_len, minimum=0)
    k_len = check.integer("k_len", k_len, minimum=0)
    return q_len, k_len, query_offset(offset, q_len, k_len, xp=xp, device=device, instead=instead, reach=REACH)


@host_constants
def kerple_bias(r1, r2, q_len, k_len, *, kind="log", offset=None, query_positions=None, key_positions=None):
    r"""KERPLE bias ``[heads, q_len, k_len]`` (Chi, Fan, Ramadge and Rudnicky, NeurIPS 2022).

    The conditionally positive definite kernels of the paper's Eq. 6-7, one pair of
    positive parameters per head:

    .. math::

        B_{h,i,j} = -r_1^{(h)} \log\bigl(1 + r_2^{(h)} |i - j|\bigr) \quad(\texttt{kind="log"}),
        \qquad B_{h,i,j} = -r_1^{(h)} |i - j|^{r_2^{(h)}} \quad(\texttt{kind="power"},\ 0 < r_2 \le 2)

    with query positions ``offset + arange(q_len)`` and key positions ``arange(k_len)``.
    The bias depends on ``|i - j|`` only: the per-distance vector is computed once and
    expanded by :func:`expand_bias`.

    With per-token positions (padded or packed batches: :func:`positions_from_mask`,
    :func:`positions_from_cu_seqlens`), ``|i - j|`` is ``|query_positions[..., i] -
    key_positions[..., j]|`` and the bias is ``[..., heads, q_len, k_len]``, ``...`` the
    broadcast of their leading (batch) axes, as in :func:`relative_bias`.

    Parameters
    ----------
    r1, r2 : float arrays ``[heads]`` (learned, positive; the caller keeps them positive,
        e.g. by clamping as the paper's code does)
    q_len, k_len : int >= 0
    kind : {"log", "power"}
    offset : int, 0-d integer array or None (``k_len - q_len``: queries are the last keys;
        0 with ``query_positions``, to which it is added); or one per batch row, an integer
        array ``[...]`` (the result ``[..., heads, q_len, k_len]``, as in :func:`relative_bias`);
        on an accelerator an offset tensor is clamped, not read, as ALiBi's
        (:func:`alibi_bias`: the host's bits for every offset whose distances fit int64)
    query_positions, key_positions : integer arrays ``[..., q_len]`` / ``[..., k_len]``,
        optional (a missing one is ``arange``)

    Returns
    -------
    array ``[heads, q_len, k_len]`` (``[..., heads, q_len, k_len]`` with per-token
    positions) of ``r1``'s dtype and namespace.

    Examples
    --------
    >>> import numpy as np, posenc as pe
    >>> b = pe.kerple_bias(np.array([1.0]), np.array([1.0]), 2, 2)
    >>> (-b[0]).round(4).tolist()                    # log(1 + |i - j|)
    [[0.0, 0.6931], [0.6931, 0.0]]
    >>> (-pe.kerple_bias(np.array([2.0]), np.array([2.0]), 1, 3, kind="power")[0]).tolist()
    [[8.0, 2.0, 0.0]]
    """
    check.arrays(r1=r1, r2=r2, query_positions=query_positions, key_positions=key_positions)
    xp = namespace(r1, r2, query_positions, key_positions)
    for name, a in (("r1", r1), ("r2", r2)):
        check.float_array(name, a, xp)
        check.ndim(name, a, exactly=1)
    if r1.shape != r2.shape:
        raise ValueError(f"r1 and r2 must both be [heads], got shapes {tuple(r1.shape)} and {tuple(r2.shape)}")
    kind = check.choice("kind", kind, KERPLE_KINDS)
    device = device_of(r1, r2, query_positions, key_positions)
    heads = int(r1.shape[0])
    if _per_token.given(query_positions, key_positions, offset):
        q_len, k_len = check.integer("q_len", q_len, minimum=0), check.integer("k_len", k_len, minimum=0)
        qpos, kpos, batch = _per_token.positions(xp, q_len, k_len, offset, query_positions, key_positions, device=device, reach=REACH)
        check.allocatable("kerple_bias", (*batch, heads, q_len, k_len), 8)
        return _per_token.bias(xp, lambda rel: _kerple_values(xp, r1, r2, rel, kind, device), qpos, kpos, heads, batch, q_len, k_len)
    q_len, k_len, offset = _lengths(q_len, k_len, offset, xp, device)
    check.allocatable("kerple_bias", (heads, q_len, k_len), 8)
    return expand_bias(_kerple_values(xp, r1, r2, distances(q_len, k_len, offset, xp=xp, device=device), kind, device), q_len, k_len)


def _kerple_values(xp, r1, r2, rel, kind, device):
    """The bias ``[heads, n]`` at the relative positions ``rel [n]``."""
    work = widest_float(xp, device)  # rounded once to r1's dtype: the same bits from every namespace's float64 log/pow
    dist = xp.abs(xp.astype(rel, work))  # |int64 min| only as a float
    a, b = cast(xp, r1, work)[:, None], cast(xp, r2, work)[:, None]
    if kind == "log":
        values = -a * xp.log1p(b * dist)  # (log(1 + x) loses the bits of a small x that 1 + x rounds away)
    else:
        # |0|^b is 0 for b > 0; raised to b only where positive, so that torch's second
        # derivative in b is not 0 * log(0) = NaN there.
        positive = dist > 0
        values = -a * xp.where(positive, _power(xp, xp.where(positive, dist, 1.0), b), 0.0)
    return cast(xp, values, r1.dtype)


def _power(xp, base, exponent):
    """``base ** exponent``, each entry's bits those of its own values, wherever it lies in
    the array. torch's CPU ``pow`` of contiguous operands takes a vectorized pow for whole
    vectors and the C library's for the entries left over, an ulp apart in about one entry
    in a hundred (float64): a one-query row differed from the full call's last row. Read
    with a stride of 2, every entry takes the C library's."""
    if torch_tensor(base) and base.device.type == "cpu":
        base = xp.stack((base, base), axis=-1)[..., 0]
    return base ** exponent


def sandwich_vector(q_len, k_len, dim, *, heads=None, offset=None, base=10000.0, xp=None, device=None, dtype=None):
    r"""The per-distance vector ``[heads, q_len + k_len - 1]`` of :func:`sandwich_bias`.

    .. math::

        v_{h,t} = \frac{1}{s_h}\Bigl(\sum_{k=1}^{d/2} \cos(r_t\,\omega_k) - \frac d2\Bigr),
        \qquad r_t = \text{offset} + t - (k_\text{len} - 1), \qquad
        \omega_k = \text{base}^{-2k/d}, \qquad s_h = \frac{8h}{H}

    Sandwich (Chi, Fan, Rudnicky and Ramadge, "Dissecting Transformer Length Extrapolation
    via the Lens of Receptive Field Analysis", ACL 2023): entry ``t`` is the bias of the
    distance ``r_t = query - key``, so ``sandwich_bias(...)[h, i, j] == v[h, i - j + k_len
    - 1]`` (:func:`expand_bias`); ``heads=None`` gives one unscaled row (``s = 1``).

    Parameters
    ----------
    q_len, k_len : int >= 0
    dim : int, positive even, the dimension ``d`` of the sinusoidal embeddings
    heads : int >= 1 or None
    offset : int, 0-d integer array or None (``k_len - q_len``), one for every row: the
        vector has no batch axes (:func:`sandwich_bias` takes one offset per batch row)
    base : float > 0
    xp, device, dtype : namespace (NumPy, or that of ``offset``), device and float dtype
        (float32) of the result

    Examples
    --------
    >>> import numpy as np, posenc as pe
    >>> v = pe.sandwich_vector(2, 3, 4, dtype=np.float64)   # distances -1, 0, 1, 2
    >>> bool(np.allclose(v[0], [np.cos(r / 100) + np.cos(r / 10000) - 2 for r in (-1, 0, 1, 2)]))
    True
    >>> bool((pe.expand_bias(v, 2, 3) == pe.sandwich_bias(2, 3, 4, dtype=np.float64)).all())
    True
    """
    dim, base, heads = _sandwich_options(dim, base, heads)
    xp, offset, device = offset_namespace(offset, xp, device)
    q_len, k_len, offset = _lengths(q_len, k_len, offset, xp, device, "the per-distance vector has no batch axes; sandwich_bias takes one offset per batch row")
    dtype = result_dtype(xp, dtype, device)
    check.allocatable("sandwich_bias", (heads or 1, distance_count(q_len, k_len), dim // 2), 8)
    return _sandwich_values(xp, distances(q_len, k_len, offset, xp=xp, device=device), dim, heads, base, device, dtype)


def _sandwich_options(dim, base, heads):
    dim = check.even_dim("dim", dim)
    base = check.real("base", base, positive=True)
    if heads is not None:
        heads = check.integer("heads", heads, minimum=1)
    check.allocatable("sandwich_bias frequencies", (dim // 2,), 8)
    return dim, base, heads


def _sandwich_values(xp, rel, dim, heads, base, device, dtype):
    """The bias ``[heads or 1, n]`` at the relative positions ``rel [n]``."""
    freqs = [base ** (-2.0 * k / dim) for k in range(1, dim // 2 + 1)]
    # cos_k - 1 as -2 sin^2 of the half angle (cos - 1 cancels: 67 float32 ulps at distance
    # 1, where the half angle's sine keeps every bit), the terms added pairwise in one fixed
    # order: the same bits in every namespace and under jax.jit (xp.sum's orders differ, and
    # sum(cos) - d/2 cancels)
    _, sin = cos_sin(rel, [f / 2 for f in freqs], xp=xp, device=device)
    terms = 0.0 - 2.0 * (sin * sin)  # (0 - x: +0 at distance 0, as cos - 1 gave, not -0)
    vec = pairwise_sum(xp, terms)
    if heads is None:
        scales = xp.ones((1, 1), dtype=vec.dtype, device=device)
    else:
        scales = xp.reshape(constant_on(xp, tuple(heads / (8.0 * h) for h in range(1, heads + 1)), vec.dtype, device, "Sandwich's head scales"), (heads, 1))
    return cast(xp, scales * vec[None, :], dtype)


@host_constants
def sandwich_bias(q_len, k_len, dim, *, heads=None, offset=None, base=10000.0, query_positions=None, key_positions=None, xp=None, device=None, dtype=None):
    r"""Sandwich bias ``[heads, q_len, k_len]`` (Chi, Fan, Rudnicky and Ramadge, ACL 2023).

    The inner product of two sinusoidal embeddings of dimension ``d`` (``dim``), a
    parameter-free function of the distance, shifted so that distance 0 gives 0:

    .. math::

        B_{h,i,j} = \frac{1}{s_h}\Bigl(\sum_{k=1}^{d/2} \cos\bigl((i - j)\,\omega_k\bigr) - \frac d2\Bigr),
        \qquad \omega_k = \text{base}^{-2k/d}, \qquad s_h = \frac{8h}{H}

    ``p_i . p_j = sum_k cos((i - j) w_k)`` is the Sandwich term of the paper (Sec. 5); the
    per-head compression ``s_h`` (``h = 1..H``) gives head ``h`` the slope ratio ALiBi
    gives its heads, as the paper's Megatron code (also NeMo's) applies it. With
    ``heads=None`` the result is one unscaled row ``[1, q_len, k_len]``. The bias is a
    function of ``i - j``: its per-distance vector (:func:`sandwich_vector`) is expanded by
    :func:`expand_bias`.

    With per-token positions (padded or packed batches), ``i - j`` is
    ``query_positions[..., i] - key_positions[..., j]`` and the bias is ``[..., heads,
    q_len, k_len]``, ``...`` the broadcast of their leading (batch) axes, as in
    :func:`relative_bias`.

    Parameters
    ----------
    q_len, k_len : int >= 0
    dim : int, positive even, the dimension ``d`` of the sinusoidal embeddings
    heads : int >= 1 or None
    offset : int, 0-d integer array or None (``k_len - q_len``; 0 with
        ``query_positions``, to which it is added); or one per batch row, an integer array
        ``[...]`` (the result ``[..., heads, q_len, k_len]``, as in :func:`relative_bias`);
        on an accelerator an offset tensor is clamped, not read, as ALiBi's
        (:func:`alibi_bias`: the host's bits for every offset whose distances fit int64)
    base : float > 0
    query_positions, key_positions : integer arrays ``[..., q_len]`` / ``[..., k_len]``,
        optional (a missing one is ``arange``)
    xp, device, dtype : namespace (NumPy, or that of the positions), device and float dtype
        (float32) of the result

    Examples
    --------
    >>> import posenc as pe
    >>> b = pe.sandwich_bias(3, 3, 4)             # d = 4: cos(r/100) + cos(r/10000) - 2
    >>> b.shape, float(b[0, 1, 1])
    ((1, 3, 3), 0.0)
    >>> round(float(b[0, 2, 0]), 6)
    -0.0002
    """
    q_len = check.integer("q_len", q_len, minimum=0)
    k_len = check.integer("k_len", k_len, minimum=0)
    if not _per_token.given(query_positions, key_positions, offset):
        vec = sandwich_vector(q_len, k_len, dim, heads=heads, offset=offset, base=base, xp=xp, device=device, dtype=dtype)
        return expand_bias(vec, q_len, k_len)
    dim, base, heads = _sandwich_options(dim, base, heads)
    rows = offset if per_row(offset) else None  # (one per batch row: an array beside the positions)
    check.arrays(query_positions=query_positions, key_positions=key_positions)
    xp, given = arguments_in(xp, device, query_positions=query_positions, key_positions=key_positions, offset=rows)
    query_positions, key_positions, rows = given["query_positions"], given["key_positions"], given["offset"]
    offset = offset if rows is None else rows
    device = device_of(query_positions, key_positions, rows) if device is None else device
    dtype = result_dtype(xp, dtype, device)
    qpos, kpos, batch = _per_token.positions(xp, q_len, k_len, offset, query_positions, key_positions, device=device, reach=REACH)
    check.allocatable("sandwich_bias", (*batch, heads or 1, q_len, k_len, dim // 2), 8)
    return _per_token.bias(xp, lambda rel: _sandwich_values(xp, rel, dim, heads, base, device, dtype), qpos, kpos, heads or 1, batch, q_len, k_len)

