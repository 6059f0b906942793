"""Which axis of ``x`` the positions run along, said rather than guessed.

``seq_axis`` is an integer or a named layout: one letter per axis of ``x``, ``b`` batch,
``h`` heads, ``s`` sequence, ``t`` packed tokens (the sequence axis of a varlen batch),
``d`` features, last (``"bhsd"``, ``"bshd"``, ``"thd"``, ``"hsd"``, ``"bsd"``, ``"sd"``...).

``positions`` align with the sequence axis (their last axis) and with ``x``'s leading
axes (their leading axes): ``[seq]`` and Hugging Face's ``[batch, seq]`` position ids fit
``[batch, heads, seq, dim]`` as they are. Positions with one axis per token axis of ``x``
(``x.ndim - 1`` axes, e.g. ``position_ids[:, None]``) broadcast axis by axis.
"""

from __future__ import annotations

from .. import _validate as check
from .._xp import index_dtype, namespace, shifted

LETTERS = "bhstd"
LAYOUT_HINT = 'seq_axis (an axis, or a named layout: "bhsd", "bshd", "thd" for packed tokens, "hsd", "bsd", "sd")'


def sequence_axis(value, x):
    """``(axis, packed)``: the index of the sequence axis of ``x`` (never the feature axis)
    and whether it holds packed tokens (a layout with ``t``). ``None`` is axis -2."""
    shape = tuple(x.shape)
    if isinstance(value, str):
        return _named(value, shape)
    axis = -2 if value is None else check.integer("seq_axis", value)
    if len(shape) < 2 or not -len(shape) <= axis < len(shape) or axis % len(shape) == len(shape) - 1:
        raise ValueError(f"seq_axis must name an axis of x other than the feature axis (x has shape {shape}), got {axis}")
    return axis % len(shape), False


def _named(value, shape):
    letters = value.lower()
    ok = (
        all(c in LETTERS for c in letters)
        and len(set(letters)) == len(letters)
        and letters.endswith("d")
        and sum(c in "st" for c in letters) == 1
    )
    if not ok:
        raise ValueError(
            "seq_axis as a layout is one letter per axis of x (b batch, h heads, s sequence, t packed tokens, "
            f'd features, last), with one of s or t, e.g. "bhsd", "bshd", "thd"; got {value!r}'
        )
    if len(letters) != len(shape):
        raise ValueError(f"seq_axis={value!r} names {len(letters)} axes, but x has shape {shape}")
    axis = letters.index("s") if "s" in letters else letters.index("t")
    return axis, "t" in letters


def place(name, positions, shape, axis, explicit):
    """``positions`` reshaped to broadcast against ``shape`` (``x.shape[:-1]``) along the
    sequence ``axis``: their last axis there, their leading axes on the leading axes of
    ``shape``. ``explicit`` is whether the caller named the axis; if not, positions that
    could also run along another axis of the same length are refused."""
    n, k = len(shape), positions.ndim
    if k == 0:
        return positions
    if k > n:
        raise ValueError(f"{name} of shape {tuple(positions.shape)} has more axes than the token axes of x {shape}")
    if k == n:
        if not all(p in (1, s) for p, s in zip(positions.shape, shape)):
            raise ValueError(_misfit(name, positions.shape, shape, axis))
        return positions
    length = int(positions.shape[-1])
    if k - 1 > axis:
        raise ValueError(
            f"{name} of shape {tuple(positions.shape)} has {k - 1} leading (batch) axes, but x's sequence axis is "
            f"axis {axis} of {shape}: pass {LAYOUT_HINT}, or give {name} one axis per token axis of x"
        )
    placed = [*positions.shape[:-1], *([1] * (n - k + 1))]
    placed[axis] = length
    if not all(p in (1, s) for p, s in zip(placed, shape)):
        raise ValueError(_misfit(name, positions.shape, shape, axis))
    if not explicit and length > 1:
        others = [a for a in range(k - 1, n) if a != axis and shape[a] == length]
        if others:
            raise ValueError(
                f"{name} of shape {tuple(positions.shape)} could run along axis {axis} or axis {others[0]} of x "
                f"(token axes {shape}, both of length {length}): pass {LAYOUT_HINT} to say which is the sequence"
            )
    return namespace(positions).reshape(positions, tuple(placed))


def _misfit(name, pshape, shape, axis):
    """The message for positions that do not fit ``x``, with the axis they may have meant."""
    pshape = tuple(pshape)
    length = pshape[-1]
    fits = [a for a in range(len(shape)) if a != axis and shape[a] == length]
    hint = f"; x's axis {fits[0]} has length {length}: seq_axis={fits[0]}?" if fits else ""
    return (
        f"{name} of shape {pshape} do not fit x's token axes {shape} with the sequence on axis {axis}{hint}. "
        f"{name} align with the sequence axis (their last axis) and x's leading batch axes (their leading axes), "
        f"e.g. [seq] or [batch, seq] for [batch, heads, seq, dim]; pass {LAYOUT_HINT}, or shape {name} like x's "
        "token axes (position_ids[:, None] gives [batch, 1, seq])"
    )


def positions(xp, x, given, seq_axis, offset, device):
    """``rope``'s positions, validated and placed against ``x``: ``offset + arange`` along
    the sequence axis by default, else ``given + offset`` (see :func:`place`)."""
    shape = tuple(x.shape[:-1])
    if given is None:
        axis, packed = sequence_axis(seq_axis, x)
        if packed:
            raise ValueError(
                f"seq_axis={seq_axis!r} holds packed tokens: pass their positions, e.g. "
                "positions=pe.positions_from_cu_seqlens(cu_seqlens, total)"
            )
        length = int(shape[axis])
        pos = shifted(xp.arange(length, dtype=index_dtype(xp, device), device=device), offset)
        return xp.reshape(pos, tuple(length if a == axis else 1 for a in range(len(shape))))
    check.positions("positions", given, xp)
    if given.ndim:
        axis = sequence_axis(seq_axis, x)[0] if shape or seq_axis is not None else 0
        given = place("positions", given, shape, axis, seq_axis is not None)
    return shifted(given, offset)
