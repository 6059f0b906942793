"""Argument checks shared by the rotary functions (on top of ``posenc._validate``).

The sequence axis, said rather than guessed (``sequence_axis``, ``place``, ``positions``):
``seq_axis`` is an integer or a named layout: one letter per axis of ``x``, ``b`` batch,
``h`` heads, ``s`` sequence, ``t`` packed tokens (the sequence axis of a varlen batch),
``d`` features, last (``"bhsd"``, ``"bshd"``, ``"thd"``, ``"hsd"``, ``"bsd"``, ``"sd"``...).

``positions`` align with the sequence axis (their last axis) and with ``x``'s leading
axes (their leading axes): ``[seq]`` and Hugging Face's ``[batch, seq]`` position ids fit
``[batch, heads, seq, dim]`` as they are. Positions with one axis per token axis of ``x``
(``x.ndim - 1`` axes, e.g. ``position_ids[:, None]``) broadcast axis by axis.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from .. import _compat
from .. import _validate as check
from .._xp import device_of, has_float64, host_constants, index_dtype, is_integer, is_real_floating, length_through, namespace, on_accelerator, torch_tensor, trace_constant, widest_float, without_empty_chunks

LAYOUTS = ("half", "interleaved")


def layout(name, value):
    return check.layout(name, value, LAYOUTS)


def inv_freq(name, value, xp, device=None):
    """Frequencies ``[n]``: a tuple of host float64 numbers, or, when they cannot be read
    now or carry a gradient (a traced JAX value, a torch tensor while torch compiles or one
    that requires grad), or are floats on an accelerator that is ``device`` (the tables',
    where reading them is a synchronisation per value), the array itself, to compute with
    inside the graph (the same float64 products; there, non-finite frequencies give
    non-finite tables rather than a ``ValueError``). Torch ones on another GPU than
    ``device``: ``ValueError`` (:func:`posenc._validate.read_on_its_gpu`)."""
    if check.is_array(value) and not isinstance(value, np.ndarray):
        if namespace(value) is not xp:
            raise TypeError(
                f"{name} must be a NumPy array, a sequence, or an array of the same namespace as the other "
                f"arguments ({xp.__name__}), got {type(value).__name__}"
            )
        check.read_on_its_gpu(name, value, device)
        if not check.is_eager(value) or (getattr(value, "requires_grad", False) and _grad_enabled()) or _on_device(value, device, xp):
            check.float_array(name, value, xp)
            if value.ndim != 1 or value.shape[0] == 0:
                raise ValueError(f"{name} must be a non-empty 1-D array, got shape {tuple(value.shape)}")
            return value
        if _compat.is_dask_array(value):
            value = value.compute()
        elif _compat.is_jax_array(value):  # (one read of every shard: a split array's elements cannot be indexed on an explicit mesh)
            value = np.asarray(value)
    return _host_floats(name, value)


def kept_on_device(value, xp, device) -> bool:
    """Whether frequencies a kernel would take as host constants (``rerotate``'s) are kept as
    the array instead: eager float ones on ``device``, an accelerator, without a gradient to
    carry, where reading them is a synchronisation per value."""
    return (
        check.is_array(value) and not isinstance(value, np.ndarray) and namespace(value) is xp and check.is_eager(value)
        and not getattr(value, "requires_grad", False) and _on_device(value, device, xp)
    )  # fmt: skip


def rerotation_inv_freq(name, value, xp, device, kept):
    """``rerotate``'s frequencies: the array, validated, where ``kept`` (:func:`kept_on_device`),
    else host numbers (:func:`host_inv_freq`)."""
    return inv_freq(name, value, xp, device) if kept else host_inv_freq(name, value, xp)


def pair_count(freqs) -> int:
    """The frequencies of host numbers or of an array."""
    return len(freqs) if isinstance(freqs, tuple) else int(freqs.shape[0])


def _on_device(value, device, xp) -> bool:
    """Float frequencies on an accelerator, ``device`` (the tables are made there)."""
    return device is not None and on_accelerator(value) and is_real_floating(xp, value.dtype) and device_of(value) == device


def _grad_enabled():
    import torch  # only asked about a tensor that requires grad: torch is loaded

    return torch.is_grad_enabled()


@trace_constant
def _host_floats(name, value):
    """``value`` (a NumPy array, a sequence or an eager 1-D array) as a tuple of float64 numbers."""
    check.not_masked(name, value)
    refused = TypeError(f"{name} must be a 1-D array or sequence of real numbers, got {type(value).__name__}")
    if check.is_array(value) and not isinstance(value, np.ndarray):
        if value.ndim != 1:
            raise ValueError(f"{name} must be a non-empty 1-D array, got shape {tuple(value.shape)}")
        if "complex" in str(value.dtype):
            raise refused
        value = [float(value[i]) for i in range(int(value.shape[0]))]
    try:
        freqs = np.asarray(value)
        if freqs.dtype.kind == "c":  # (NumPy's cast to float64 would drop the imaginary parts)
            raise refused
        freqs = freqs.astype(np.float64, copy=False)
    except (TypeError, ValueError) as exc:
        raise refused from exc
    if freqs.ndim != 1 or freqs.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D array, got shape {freqs.shape}")
    if not np.all(np.isfinite(freqs)):
        raise ValueError(f"{name} must be finite, got non-finite values")
    return tuple(freqs.tolist())


def host_inv_freq(name, value, xp):
    """Frequencies that must be host values (a kernel takes them): a tuple of float64 numbers
    (not a NumPy array, which ``torch.compile`` would trace as a tensor)."""
    freqs = inv_freq(name, value, xp)
    if not isinstance(freqs, tuple) and check.concrete_jax(freqs):  # closed over by a jitted function
        return _host_floats(name, np.asarray(freqs))
    if not isinstance(freqs, tuple):
        if getattr(freqs, "requires_grad", False) and check.is_eager(freqs):
            raise TypeError(f"{name} requires grad, but these frequencies are constants of the kernel (no gradient reaches them): pass {name}.detach()")
        raise TypeError(f"{name} must hold concrete values (a NumPy array or an eager array), got a traced {type(freqs).__name__}")
    return freqs


def positions_array(value):
    """``rope``'s ``positions`` must be an array; a number is most likely meant as ``offset``."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        raise TypeError(
            f"positions must be an array of token positions, got the number {value!r}: to number the tokens "
            f"from {value!r}, pass offset={value!r} (positions=None gives offset + arange along seq_axis)"
        )
    check.array("positions", value)


def rotary_dim(value, width, *, what="x.shape[-1]"):
    """A positive even rotary dimension no larger than the feature axis ``width``; None
    (not passed) is all of it, which must then be even."""
    if value is None:
        if width % 2 or width == 0:
            raise ValueError(
                f"{what} = {width} cannot be rotated whole: RoPE rotates pairs of channels, so the rotated "
                "width must be a positive even number; pass rotary_dim= (even, at most "
                f"{what}) to rotate the first channels only"
            )
        return width
    value = check.even_dim("rotary_dim", value)
    if value > width:
        raise ValueError(f"rotary_dim must be <= x.shape[-1] = {width}, got {value}")
    return value


def out_like(out, x, xp, *inputs):
    """``out`` is None or a writable buffer of ``x``'s shape, dtype, namespace and device,
    sharing no memory with ``x`` (unless it is ``x``: in place) nor with the other
    ``inputs`` (``(name, array)`` pairs that the computation reads), by elements."""
    if out is None:
        check.allocatable_unless_blocked("the result", tuple(x.shape), getattr(x.dtype, "itemsize", 8), x)
        return None
    if not torch_tensor(out) and _compat.is_jax_array(out):
        raise TypeError("out is not supported for JAX arrays (they are immutable); use the returned array")
    if out is x:  # in place: x's own shape, dtype, namespace, device and memory
        check.writable(out)
        check.separate(out, *inputs)
        return out
    return check.out(out, shape=tuple(x.shape), dtype=x.dtype, xp=xp, device=device_of(x), inputs=(("x", x), *inputs))


def sequence_length(xp, positions, offset):
    """``ceil(max(positions)) + 1``, the shortest length whose positions ``0 .. length - 1``
    reach every one (for fractional positions as transformers' ``max + 1 > original``
    decides): an int when the positions can be read now, else a 0-d array computed with
    them; None for no positions. With a per-row ``offset`` (placed on the batch axes) one
    length a row, the largest of its own positions (each row as a call of its own). The
    length of float positions is a float of the namespace's widest dtype, where ``+ 1`` is
    exact below ``2**53`` (``2**24`` without float64): in float16 ``2048 + 1`` is 2048. A
    traced non-finite position (its row NaN; the eager call refuses it) counts as length 0,
    the original frequencies, where the ops that read the length take it as an integer."""
    if math.prod(positions.shape) == 0:
        return None
    if check.is_array(offset) and offset.ndim:
        axes = tuple(a for a, n in enumerate(offset.shape) if n == 1)
        top = xp.max(without_empty_chunks(positions), axis=axes, keepdims=True)
    elif check.is_eager(positions):
        top = xp.max(positions)
        return length_through(float(top.detach() if torch_tensor(top) else top))  # (a length: no gradient, no torch warning)
    else:
        top = xp.max(without_empty_chunks(positions))
    if is_integer(xp, positions.dtype):
        return length_past(xp, top)
    top = xp.astype(top, widest_float(xp, device_of(positions)))
    return xp.where(xp.isfinite(top), xp.ceil(top) + 1, 0.0)


def length_past(xp, top):
    """``top + 1``, the length through the (widened) integer positions ``top``, 0 for a
    negative ``top`` (as every length up to a scaling's original: the original frequencies),
    without wrapping: where they are int32 (JAX without x64), ``2**31 - 1`` gives ``2**31``
    as uint32."""
    if top.dtype != xp.int32:
        return xp.where(top < 0, 0, top + 1)
    return xp.where(top < 0, 0, xp.astype(top, xp.uint32) + 1)


# ---------------------------------------------------------------- the sequence axis and positions
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


def default_axis(value):
    """Whether ``seq_axis`` is the default, -2 (or None), which a 1-D ``x`` of one token
    at a 0-d position may leave unused."""
    return value is None or (type(value) is int and value == -2)


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


def place(name, positions, shape, axis, xp=None):
    """``positions`` reshaped to broadcast against ``shape`` (``x.shape[:-1]``) along the
    sequence ``axis``: their last axis there, their leading axes on the leading axes of
    ``shape``, whatever the lengths of the other axes (the default axis, -2, is a rule, not
    a guess: a call never succeeds or fails by whether two axes happen to be as long).
    ``xp``: their namespace, where the caller has it."""
    n, k = len(shape), positions.ndim
    if k == 0:
        return positions
    if k > n:
        raise ValueError(f"{name} of shape {tuple(positions.shape)} has more axes than the token axes of x {shape}")
    if k == n:
        if not all(p == 1 or p == s for p, s in zip(positions.shape, shape)):
            raise ValueError(_misfit(name, positions.shape, shape, axis))
        return positions
    length = positions.shape[-1]
    if k - 1 > axis:
        raise ValueError(
            f"{name} of shape {tuple(positions.shape)} has {k - 1} leading (batch) axes, but x's sequence axis is "
            f"axis {axis} of {shape}: pass {LAYOUT_HINT}, or give {name} one axis per token axis of x"
        )
    placed = [*positions.shape[:-1], *([1] * (n - k + 1))]
    placed[axis] = length
    if not all(p == 1 or p == s for p, s in zip(placed, shape)):
        raise ValueError(_misfit(name, positions.shape, shape, axis))
    return (xp or namespace(positions)).reshape(positions, tuple(placed))


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


def positions(xp, x, given, seq_axis, offset, device, *, unread=False):
    """``rope``'s positions, validated and placed against ``x``: ``(placed, offset, placed +
    offset)``, ``placed`` being ``arange`` along the sequence axis by default, else ``given``
    (an array: :func:`positions_array`; see :func:`place`), widened, and ``offset`` (checked
    by :func:`per_row`) an int or placed on the batch axes. ``unread``
    (:func:`summed_on_device`): nothing of the positions or offset is read (:func:`shifted`;
    float positions' finiteness unchecked)."""
    shape = tuple(x.shape[:-1])
    if given is None:
        axis, packed = sequence_axis(seq_axis, x)
        if packed:
            raise ValueError(
                f"seq_axis={seq_axis!r} holds packed tokens: pass their positions, e.g. "
                "positions=pe.positions_from_cu_seqlens(cu_seqlens, total)"
            )
        length = shape[axis]  # (not int(): a size torch.export keeps symbolic stays so)
        if check.is_array(offset) and offset.ndim:
            offset = place_rows("offset", offset, shape, axis)
        pos = xp.arange(length, dtype=index_dtype(xp, device), device=device)
        pos = xp.reshape(pos, tuple(length if a == axis else 1 for a in range(len(shape))))
        return pos, offset, shifted("the token positions", pos, offset, xp, device, unread=unread, known=(0, length - 1) if length else None)
    if check.is_array(offset) and offset.ndim:
        offset = rows("offset", offset, x, seq_axis)
    if given.ndim:
        axis = sequence_axis(seq_axis, x)[0] if shape or not default_axis(seq_axis) else 0
        given = place("positions", given, shape, axis, xp)
    elif not default_axis(seq_axis):  # 0-d positions use no axis, but a seq_axis given must be one
        sequence_axis(seq_axis, x)
    given = check.positions("positions", given, xp, device, finite=not unread)  # (widened once their shape fits x)
    return given, offset, shifted("positions", given, offset, xp, device, unread=unread)


def summed_on_device(x, xp, device, scaling, seq_len) -> bool:
    """Whether ``rope`` leaves its positions and offset unread (:func:`shifted`): ``x`` on an
    accelerator, eager, where the namespace has float64, at frequencies that do not depend on
    the positions (a length-dependent ``scaling`` without ``seq_len`` reads its length from
    them, as before)."""
    if scaling is not None and scaling.uses_seq_len and seq_len is None:
        return False
    # (a torch tensor's device first, which is cheap; a JAX tracer has no devices to ask)
    eager = (on_accelerator(x) and check.is_eager(x)) if torch_tensor(x) else (check.is_eager(x) and on_accelerator(x))
    return eager and has_float64(xp, device)


def shifted(name, values, offset, xp, device, *, unread, known=None):
    """``values + offset`` (:func:`posenc._validate.shifted`), or where ``unread``
    (:func:`summed_on_device`) and reading them would be needed to check the integer sums,
    their float64 sum on the device, unread: the positions every rotation converts to
    float64 anyway, so the same angles where positions and offset are below ``2**53``; past
    it the float64 rounding of the true sum, never a wrapped one."""
    if not unread or type(offset) is int and (offset == 0 or known is not None):
        return check.shifted(name, values, offset, xp, device, known=known)
    return xp.astype(values, xp.float64) + (xp.astype(offset, xp.float64) if check.is_array(offset) else offset)


def rows(name, value, x, seq_axis):
    """A per-row ``value`` (``offset``, ``seq_len``) placed on the batch axes of ``x``."""
    if not (check.is_array(value) and value.ndim):
        return value
    axis = sequence_axis(seq_axis, x)[0]
    return place_rows(name, value, tuple(x.shape[:-1]), axis)


def per_row(name, value, xp, *, unread=False):
    """``value`` validated: None (a ``seq_len`` only), an int, a 0-d integer array (traced ok;
    with ``unread``, one on an accelerator too: :func:`posenc._validate.integer_or_on_device`),
    or a per-row integer array."""
    if value is None and name == "seq_len":
        return None
    if type(value) is int:
        return check.integer(name, value, minimum=0 if name == "seq_len" else None)
    check.not_masked(name, value)
    if not (check.is_array(value) and value.ndim > 0):
        value = (check.integer_or_on_device if unread else check.integer_or_traced)(name, value, minimum=0 if name == "seq_len" else None)
        return check.widened(name, value, namespace(value), device_of(value)) if check.is_array(value) else value
    if not is_integer(xp, value.dtype):  # (its namespace is x's: checked with x's)
        raise TypeError(f"{name} must be an integer or an integer array (one value per batch row), got dtype {value.dtype}")
    value = check.widened(name, value, xp, device_of(value))
    if name == "seq_len" and check.is_eager(value) and bool(xp.any(value < 0)):
        raise ValueError("seq_len must be >= 0 in every row")
    return value


@host_constants
def embedded_positions(x, positions, offset, carry=False):
    """The positions an absolute module embeds ``x [..., seq, d]`` at: ``positions`` (by
    default ``arange(seq)``) plus ``offset``, as ``rope`` adds it: an int, a 0-d integer
    array or one per batch row (``[batch]``, on its row's positions, not broadcast against
    the sequence), validated; a NumPy one beside another library's ``x`` converted. Integer
    positions are widened to the index dtype before the offset is added, and every sum is
    checked to stay within it (int8 positions plus an offset do not wrap). ``carry``: a pair
    ``(positions, offset)``, the offset placed and not added to float positions where the
    namespace has no float64 (their float32 sum would round; else 0, the sum made): for a
    caller whose angles are of float64 positions (the sinusoidal table), which on an
    accelerator are then summed unread as ``rope``'s are (:func:`shifted`)."""
    plain = type(offset) is int and offset == 0  # (a forward's usual call: nothing to check or add)
    if plain and positions is not None:
        return (positions, 0) if carry else positions
    xp, device = namespace(x), device_of(x)
    unread = carry and not plain and summed_on_device(x, xp, device, None, None)
    if positions is None:
        length = x.shape[-2]
        positions = xp.arange(length, dtype=index_dtype(xp, device), device=device)
        known = (0, length - 1) if length else None
    else:
        positions, known = check.positions("positions", positions, xp, device, finite=not unread), None
    if plain:
        return (positions, 0) if carry else positions
    offset = place_rows("offset", per_row("offset", offset, xp, unread=unread), tuple(x.shape[:-1]), x.ndim - 2)
    if carry and is_real_floating(xp, positions.dtype) and not has_float64(xp, device):
        return positions, offset
    summed = shifted("positions", positions, offset, xp, device, unread=unread, known=known)
    return (summed, 0) if carry else summed


def place_rows(name, value, shape, axis):
    """A per-row ``value`` reshaped to broadcast against the token axes ``shape`` along the
    batch axes before the sequence ``axis`` (0-d and ints pass through)."""
    if not (check.is_array(value) and value.ndim > 0):
        return value
    n, k = len(shape), value.ndim
    placed = tuple(value.shape) if k == n else (*value.shape, *([1] * (n - k)))
    fits = k <= n and placed[axis] == 1 and all(p == 1 or p == s for p, s in zip(placed, shape))
    if not fits or (k < n and k > axis):
        raise ValueError(
            f"{name} of shape {tuple(value.shape)} must hold one value per batch row: its axes are x's leading "
            f"(batch) axes {shape[:axis]} (or one axis per token axis of x {shape}, of length 1 along the "
            f"sequence axis {axis})"
        )
    return namespace(value).reshape(value, placed)
