"""Reference softmax attention that takes any bias of the library."""

from __future__ import annotations

import math

from . import _validate as check
from ._xp import broadcast_shapes, cast, compute_dtype, device_of, namespace


def attention(q, k, v, *, bias=None, causal=False, scale=None):
    r"""Plain softmax attention, :math:`\mathrm{softmax}(q k^T \cdot s + B)\,v`.

    The softmax subtracts the row maximum (stable) and runs in float32 for 16-bit inputs.

    Parameters
    ----------
    q : array ``[..., q_len, d]``
    k : array ``[..., k_len, d]``
    v : array ``[..., k_len, d_v]``
    bias : array broadcasting against ``[..., q_len, k_len]``, optional
        Any bias of this library (``[heads, q_len, k_len]`` for ``q`` of shape
        ``[..., heads, q_len, d]``), added after scaling.
    causal : bool
        Mask keys after the query. Queries are the last ``q_len`` positions of the keys
        (``rel[i, j] = (k_len - q_len + i) - j``; keys with ``rel < 0`` are masked).
    scale : float, optional
        Logit scale, ``1/sqrt(d)`` by default.

    Examples
    --------
    >>> import numpy as np, posenc as pe
    >>> q = k = v = np.eye(2)[None]
    >>> pe.attention(q, k, v, causal=True)[0, 0].tolist()
    [1.0, 0.0]
    """
    xp = namespace(q, k, v, bias)
    device_of(q, k, v, bias)
    check.query_key_value(q, k, v, xp)
    q_len, k_len, d = int(q.shape[-2]), int(k.shape[-2]), int(q.shape[-1])
    if causal and q_len > k_len:
        raise ValueError(f"causal attention needs q_len <= k_len, got {q_len} > {k_len}")
    scale = 1.0 / math.sqrt(d) if scale is None else check.real("scale", scale)
    work = compute_dtype(xp, q.dtype)
    logits = cast(xp, q, work) @ xp.matrix_transpose(cast(xp, k, work)) * scale
    if bias is not None:
        check.array("bias", bias)
        try:
            broadcast_shapes(tuple(bias.shape), tuple(logits.shape))
        except ValueError as exc:
            raise ValueError(f"bias of shape {tuple(bias.shape)} does not broadcast against logits {tuple(logits.shape)}") from exc
        logits = logits + cast(xp, bias, work)
    if causal:
        device = device_of(q)
        rel = xp.arange(k_len - q_len, k_len, device=device)[:, None] - xp.arange(k_len, device=device)[None, :]
        logits = xp.where(rel >= 0, logits, -xp.inf)
    logits = logits - xp.max(logits, axis=-1, keepdims=True)
    weights = xp.exp(logits)
    weights = weights / xp.sum(weights, axis=-1, keepdims=True)
    return cast(xp, weights @ cast(xp, v, work), q.dtype)
