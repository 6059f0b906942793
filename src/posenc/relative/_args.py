"""Argument checks shared by the relative attention logits."""

from __future__ import annotations

from .. import _validate as check
from .._xp import broadcast_shapes, compute_dtype, one_device, one_kind, size


def query_key(q, k, xp, *, names=("q", "k")):
    """``q [..., q_len, d]`` and ``k [..., k_len, d]``: float, same ``d``, batch dims broadcast.

    Returns ``(q_len, k_len, batch_shape)``.
    """
    for name, a in zip(names, (q, k)):
        check.float_array(name, a, xp)
        check.ndim(name, a, minimum=2)
    if int(q.shape[-1]) != int(k.shape[-1]):
        raise ValueError(
            f"{names[0]} and {names[1]} must have the same head dimension (last axis), got {q.shape[-1]} and {k.shape[-1]}"
        )
    batch = check.leading_axes((names[0], q), (names[1], k), 2, "leading (batch, head) dimensions")
    return size(q.shape[-2]), size(k.shape[-2]), batch


def like_query(name, a, q, xp):
    """A float array (``u``, ``v``, ``b``, ...) broadcasting against ``q`` without changing its shape."""
    check.float_array(name, a, xp)
    check.broadcast_shape(name, a.shape, q.shape)
    return a


def table(name, a, xp, *, rows, dim, batch):
    """A float table ``[..., rows, dim]`` whose leading dims broadcast against ``batch``."""
    check.float_array(name, a, xp)
    check.ndim(name, a, minimum=2)
    if (rows is not None and int(a.shape[-2]) != rows) or int(a.shape[-1]) != dim:
        want = f"[..., {rows if rows is not None else 'n'}, {dim}]"
        raise ValueError(f"{name} must have shape {want}, got {tuple(a.shape)}")
    try:
        broadcast_shapes(tuple(a.shape[:-2]), tuple(batch))
    except ValueError:
        raise ValueError(f"{name} of shape {tuple(a.shape)} does not broadcast against the batch dimensions {tuple(batch)}") from None
    return a


def dtypes(xp, *arrays):
    """``(result dtype, compute dtype)`` of float inputs: their promoted dtype, 16-bit computed in float32."""
    dtype = xp.result_type(*arrays)
    return dtype, compute_dtype(xp, dtype)


def logits_shape(batch, q_len, k_len):
    shape = (*batch, q_len, k_len)
    check.allocatable("logits", shape, 8)
    return shape


def namespace_of(**arrays):
    """The namespace of named array arguments (``None`` skipped), each checked to be an array first.

    Then checks that they share one device: arrays of two libraries are a ``TypeError``,
    arrays on two devices a ``ValueError``, naming each argument's (the library is checked
    before the device).
    """
    given = {name: a for name, a in arrays.items() if a is not None}
    for name, a in given.items():
        check.array(name, a)
    xp = one_kind(**given)
    one_device(**given)
    return xp
