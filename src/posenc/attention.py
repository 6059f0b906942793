"""Reference softmax attention that takes any bias of the library."""

from __future__ import annotations

import math

from . import _validate as check
from ._xp import broadcast_shapes, cast, compute_dtype, device_of, host_constants, namespace, size, without_empty_chunks


@host_constants
def attention(q, k, v, *, bias=None, mask=None, causal=False, scale=None):
    r"""Plain softmax attention, :math:`\mathrm{softmax}(q k^T \cdot s + B)\,v`.

    Vaswani et al., "Attention Is All You Need" (2017), with an additive bias ``B`` (any
    of posenc's relative biases) and masks.

    The softmax subtracts the row maximum (stable) and runs in float32 for 16-bit inputs.
    A query that may attend to no key (every key masked by ``mask`` or ``causal``, or a
    bias of ``-inf`` on every key, e.g. a left-padding query) gets an output of zeros,
    never NaN: its weights are all zero.

    Parameters
    ----------
    q : array ``[..., q_len, d]``
    k : array ``[..., k_len, d]``
    v : array ``[..., k_len, d_v]``
    bias : real array broadcasting against ``[..., q_len, k_len]``, optional
        Any bias of this library (``[heads, q_len, k_len]`` for ``q`` of shape
        ``[..., heads, q_len, d]``), added after scaling.
    mask : boolean array broadcasting against ``[..., q_len, k_len]``, optional
        ``True`` where the query may attend to the key (a padding mask ``[batch, k_len]``
        is ``mask[:, None, None, :]`` against ``[batch, heads, q_len, k_len]``).
    causal : bool
        Mask keys after the query. Queries are the last ``q_len`` positions of the keys
        (``rel[i, j] = (k_len - q_len + i) - j``; keys with ``rel < 0`` are masked), the
        alignment of every ``offset`` default in the library.
    scale : float, optional
        Logit scale, ``1/sqrt(d)`` by default.

    Examples
    --------
    >>> import numpy as np, posenc as pe
    >>> q = k = v = np.eye(2)[None]
    >>> pe.attention(q, k, v, causal=True)[0, 0].tolist()
    [1.0, 0.0]
    >>> pe.attention(q, k, v, mask=np.array([[False, False], [True, True]]))[0, 0].tolist()
    [0.0, 0.0]
    """
    check.arrays(q=q, k=k, v=v, bias=bias, mask=mask)
    xp = namespace(q, k, v, bias, mask)
    device_of(q, k, v, bias, mask)
    check.query_key_value(q, k, v, xp)
    q_len, k_len, d = size(q.shape[-2]), size(k.shape[-2]), int(q.shape[-1])
    check.flag("causal", causal)
    if causal and q_len > k_len:
        raise ValueError(f"causal attention needs q_len <= k_len, got {q_len} > {k_len}")
    if scale is None:
        check.features(q, k, "the default scale is 1/sqrt(d)")
    scale = 1.0 / math.sqrt(d) if scale is None else check.real("scale", scale)
    work = compute_dtype(xp, q.dtype)
    batch = check.leading_axes(("q", q), ("k", k), 2, "leading (batch, head) axes")
    check.leading_axes(("q", q), ("v", v), 2, "leading (batch, head) axes")
    check.leading_axes(("k", k), ("v", v), 2, "leading (batch, head) axes")
    check.allocatable_unless_blocked("attention's logits", (*batch, q_len, k_len), 8, q)
    logits = cast(xp, q, work) @ xp.matrix_transpose(cast(xp, k, work)) * scale
    if bias is not None:
        check.array("bias", bias)
        if xp.isdtype(bias.dtype, "complex floating"):
            raise TypeError(f"bias must have a real dtype (its values are added to real logits), got {bias.dtype}")
        _broadcasts("bias", bias, logits)
        logits = logits + cast(xp, bias, work)
    if mask is not None:
        check.boolean_mask("mask", mask, xp)
        _broadcasts("mask", mask, logits)
        logits = xp.where(mask, logits, -xp.inf)
    if causal:
        device = device_of(q)
        rel = xp.arange(k_len - q_len, k_len, device=device)[:, None] - xp.arange(k_len, device=device)[None, :]
        logits = xp.where(rel >= 0, logits, -xp.inf)
    if k_len and all(size(n) for n in logits.shape[:-1]):  # (Dask's max fails on an empty array)
        top = xp.max(without_empty_chunks(logits), axis=-1, keepdims=True)
    else:
        top = xp.zeros((*logits.shape[:-1], 1), dtype=work, device=device_of(q))
    # A row with no key to attend to has a maximum of -inf: shift it by 0, so its weights are exp(-inf) = 0.
    weights = xp.exp(logits - xp.where(xp.isfinite(top), top, xp.zeros_like(top)))
    total = xp.sum(weights, axis=-1, keepdims=True)
    weights = weights / xp.where(total > 0, total, xp.ones_like(total))
    return cast(xp, weights @ cast(xp, v, work), q.dtype)


def _broadcasts(name, a, logits):
    try:
        broadcast_shapes(tuple(a.shape), tuple(logits.shape))
    except ValueError as exc:
        raise ValueError(f"{name} of shape {tuple(a.shape)} does not broadcast against logits {tuple(logits.shape)}") from exc
