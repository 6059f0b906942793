"""FIRE: functional interpolation for relative positions (Li et al., ICLR 2024)."""

from __future__ import annotations

import math

from .. import _validate as check
from .._xp import arguments_in, cast, device_of, host_constants, index_dtype, namespace, result_dtype, shifted, size, widest_float
from . import _per_token
from .indices import query_offset


def _scalar(name, value, xp):
    """A positive Python float, or a 0-d float array (a learned parameter)."""
    if check.is_array(value):
        check.float_array(name, value, xp)
        check.ndim(name, value, exactly=0)
        return value
    return check.real(name, value, positive=True)


@host_constants
def fire_distances(
    q_len, k_len, *, offset=None, c=0.1, threshold=512.0, eps=1e-6, query_positions=None, key_positions=None, xp=None, device=None, dtype=None
):
    r"""FIRE's normalised distances ``[q_len, k_len]``: ``psi(|i - j|) / (psi(max(L, i)) + eps)``.

    .. math::

        x_{ij} = \frac{\psi(i - j)}{\psi(\max(L, i)) + \epsilon}, \qquad \psi(x) = \log(|c\,x| + 1)

    the input of FIRE's learned function (Li et al., "Functional Interpolation for Relative
    Positions Improves Long Context Transformers", ICLR 2024; :func:`fire_bias` applies
    the function). ``i = offset + row`` is the query position, ``j`` the key
    position, ``L = |threshold|``. ``c`` and ``threshold`` may be
    0-d float arrays (learned parameters: the result then follows their namespace and
    carries their gradient). With per-token positions ``i`` and ``j`` are
    ``query_positions[..., row]`` (plus ``offset``, 0 by default) and ``key_positions[...,
    col]``, and the result is ``[..., q_len, k_len]``; so it is with one ``offset`` per
    batch row (``[...]``: ``i = offset[...] + row``). On an accelerator an offset tensor
    (without positions) is clamped, not read, to the offsets whose positions and distances
    fit int64 (the host's bits for each; past them, a ``ValueError`` on the host, the
    distances of the nearest).

    Parameters
    ----------
    q_len, k_len : int >= 0
    offset, query_positions, key_positions : as in :func:`fire_bias`
    c, threshold : float > 0 or 0-d float arrays
    eps : float >= 0
    xp, device, dtype : namespace (NumPy, or that of ``c``/``threshold``/the positions),
        device and float dtype (float32) of the result

    Examples
    --------
    >>> import numpy as np, posenc as pe
    >>> pe.fire_distances(2, 3, c=1.0, threshold=1.0, eps=0.0, dtype=np.float64).round(4).tolist()   # queries at 1, 2
    [[1.0, 0.0, 1.0], [1.0, 0.6309, 0.0]]
    """
    q_len = check.integer("q_len", q_len, minimum=0)
    k_len = check.integer("k_len", k_len, minimum=0)
    arrays = {"c": c, "threshold": threshold, "query_positions": query_positions, "key_positions": key_positions, "offset": offset}
    xp, arrays = arguments_in(xp, device, **{name: a for name, a in arrays.items() if check.is_array(a)})
    c, threshold, offset = arrays.get("c", c), arrays.get("threshold", threshold), arrays.get("offset", offset)
    query_positions, key_positions = arrays.get("query_positions", query_positions), arrays.get("key_positions", key_positions)
    c = _scalar("c", c, xp)
    threshold = _scalar("threshold", threshold, xp)
    eps = check.real("eps", eps, minimum=0.0)
    device = device_of(*arrays.values()) if device is None else device
    dtype = result_dtype(xp, dtype, device)
    work = widest_float(xp, device)
    if _per_token.given(query_positions, key_positions, offset):
        query, key, batch = _per_token.positions(xp, q_len, k_len, offset, query_positions, key_positions, device=device, reach=math.inf)
        check.allocatable("fire_bias", (*batch, q_len, k_len), 8)
    else:
        check.allocatable("fire_bias", (q_len, k_len), 8)
        offset = query_offset(offset, q_len, k_len, xp=xp, device=device, reach=math.inf)
        query = shifted(xp.arange(q_len, dtype=index_dtype(xp, device), device=device), offset)
        key, batch = xp.arange(k_len, dtype=index_dtype(xp, device), device=device), ()
    rel = xp.astype(_per_token.relative(query, key), work)  # (integer differences: exact where float32 positions would not be)
    # (a Python float filled in on the device, not copied from host memory: a CUDA graph holds a fill)
    c = cast(xp, c, work) if check.is_array(c) else xp.full((), c, dtype=work, device=device)
    threshold = xp.abs(cast(xp, threshold, work)) if check.is_array(threshold) else xp.full((), threshold, dtype=work, device=device)
    distance = xp.log1p(xp.abs(c * rel))  # (psi as log1p: log(x + 1) loses the bits of a small x)
    normaliser = xp.log1p(xp.abs(c * xp.maximum(xp.astype(query, work), threshold))) + eps
    return cast(xp, distance / normaliser[..., :, None], dtype)


def fire_bias(
    mlp, q_len, k_len, *, offset=None, c=0.1, threshold=512.0, eps=1e-6, query_positions=None, key_positions=None, xp=None, device=None, dtype=None
):
    r"""FIRE bias ``[heads, q_len, k_len]`` (Li et al., "Functional Interpolation for
    Relative Positions Improves Long Context Transformers", ICLR 2024).

    .. math::

        B_{:,i,j} = f_\theta\!\left(\frac{\psi(i - j)}{\psi(\max(L, i))}\right),
        \qquad \psi(x) = \log(c\,x + 1)

    ``f_theta`` is a learned function to ``heads`` values (the paper: an MLP with one hidden
    layer of 32 ReLU units; :class:`posenc.torch.FIRE` holds one), ``c`` and ``L`` are
    learned scalars (initialised to 0.1 and 512). The normalisation by the query position
    ``i`` ("progressive interpolation") keeps the input of ``f`` in ``[0, 1]`` at every
    length, so a longer sequence only makes the grid of inputs finer. As the paper's code
    does, ``psi`` takes ``|c x|`` and the denominator gets ``eps``; FIRE is causal (keys
    ``j <= i``), the entries of future keys are defined (``|i - j|``) but meant to be masked.

    With per-token positions (padded or packed batches), ``i`` and ``j`` are
    ``query_positions[..., row]`` and ``key_positions[..., col]`` (each document's tokens
    counted from its own start, as :func:`positions_from_cu_seqlens` gives them) and the
    bias is ``[..., heads, q_len, k_len]``, ``...`` the broadcast of their leading (batch)
    axes.

    Parameters
    ----------
    mlp : callable ``[n, 1] -> [n, heads]`` on arrays of the result's namespace
    q_len, k_len : int >= 0
    offset : int, 0-d integer array or None (``k_len - q_len``: the queries are the last
        keys; 0 with ``query_positions``, to which it is added); or one per batch row, an
        integer array ``[...]`` (the result ``[..., heads, q_len, k_len]``, as in
        :func:`relative_bias`)
    c, threshold : float > 0 or 0-d float arrays (learned ``c`` and ``L``)
    eps : float >= 0
    query_positions, key_positions : integer arrays ``[..., q_len]`` / ``[..., k_len]``,
        optional (a missing one is ``arange``)
    xp, device, dtype : namespace (NumPy, or that of ``c``/``threshold``/the positions),
        device and float dtype (float32) of the distances given to ``mlp``

    Returns
    -------
    array ``[heads, q_len, k_len]`` (``[..., heads, q_len, k_len]`` with per-token
    positions): ``mlp``'s output, heads first.

    Examples
    --------
    >>> import numpy as np, posenc as pe
    >>> b = pe.fire_bias(lambda x: np.concatenate([x, -x], axis=-1), 2, 2, threshold=1.0, c=1.0, eps=0.0)
    >>> b.shape
    (2, 2, 2)
    >>> b[0].round(4).tolist()                    # log(1 + |i - j|) / log(1 + max(1, i))
    [[0.0, 1.0], [1.0, 0.0]]
    """
    if not callable(mlp):
        raise TypeError(f"mlp must be a callable [n, 1] -> [n, heads], got {type(mlp).__name__}")
    x = fire_distances(
        q_len, k_len, offset=offset, c=c, threshold=threshold, eps=eps, query_positions=query_positions, key_positions=key_positions,
        xp=xp, device=device, dtype=dtype,
    )  # fmt: skip
    batch, q_len, k_len = tuple(x.shape[:-2]), size(x.shape[-2]), size(x.shape[-1])
    n = math.prod(batch) * q_len * k_len
    xp = namespace(x)
    flat, split = _per_token.flattened(xp, x)
    values = mlp(flat[:, None])
    if not check.is_array(values) or values.ndim != 2 or size(values.shape[0]) != n:
        raise ValueError(f"mlp must map [n, 1] to [n, heads] (n = {n}), got {getattr(values, 'shape', type(values).__name__)}")
    result = _per_token.batch_first(xp, xp.matrix_transpose(values), int(values.shape[1]), batch, q_len, k_len)
    return _per_token.split_with_heads(result, split, x.ndim)
