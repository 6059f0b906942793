"""Numba CPU kernels for the rotary ops ``rope_rotate`` and ``rope_apply``.

One pass over ``x``: every element is read once and written once. ``x`` is regrouped
(``_layout.plan``) as ``[G, H, S, D]`` where the positions vary over ``G`` and ``S`` and are
shared over ``H``; ``prange`` runs over blocks of ``(g, s)`` rows, computes the block's
float64 ``cos``/``sin`` once into a small local table and rotates every row ``h`` that
shares them. float32/float64 rows use float64 arithmetic (the reference's), rounded once
on store. 16-bit floats travel as ``uint16`` bits (``_codec_cpu``) and are rotated in
float32 with the errors of ``cos``, ``sin`` and the cancelling product compensated
(``_rotate_pairs_compensated``), within one ulp of the float64 result.

The kernels see ``x`` and ``out`` as flat 1-D arrays plus element offsets and strides
(the launchers require unit stride along the channels, copying otherwise), so every row
loop is unit-stride and vectorises. A row is rotated into a small local buffer and then
copied to ``out``, so the in-place case (``out`` is ``x``) vectorises too. The storage
``kind`` is a compile-time constant of each kernel: one specialisation per storage kind
and dtype, compiled (or loaded from Numba's cache) on first use.

The launchers take NumPy arrays and torch CPU tensors (zero-copy views), check shapes
again (a kernel never indexes out of bounds), allocate ``out`` with the input's library,
and choose the block size.
"""

from __future__ import annotations

import functools

import numba
import numpy as np
from numba import njit, prange, types

from . import _codec, _host, _layout
from ._codec_cpu import fma32, load16, store16

# Rows per block. Measured on [1, 32, 8192, 128] float32 (2 cores): 64 rows (32 KiB of
# x per head) run about twice as fast as 16, which jumps between heads too often.
_BLOCK = 64

# pi/2 as P1 + P2 + P3: P1 and P2 with 33 significant bits (so n * P1 and n * P2 are exact
# for |n| < 2**20), P3 the float64 rest; checked against mpmath in the tests.
_P1 = 1.5707963267341256
_P2 = 6.077100506303966e-11
_P3 = 2.0222662487959506e-21
_TWO_OVER_PI = 0.6366197723675814
_ROUND = 6755399441055744.0  # 1.5 * 2**52: (t + _ROUND) - _ROUND is rint(t) for |t| < 2**51
# Angles up to this use the polynomial below, larger ones libm's cos/sin.
FAST_ANGLE_LIMIT = 2.0**19


@njit(cache=True, inline="always")
def _cos_sin(angle):
    """``(cos, sin)`` of a float64 ``angle``, ``|angle| <= FAST_ANGLE_LIMIT``, within ~2 ulp.

    Branch-free, so loops over it vectorise (libm's scalar calls do not): reduce by
    ``n * pi/2`` in three exact-product steps, then the Taylor series of sin and cos on
    ``|r| <= pi/4`` through ``r**17`` / ``r**18`` (truncation below 1e-19).
    """
    n = (angle * _TWO_OVER_PI + _ROUND) - _ROUND
    r = ((angle - n * _P1) - n * _P2) - n * _P3
    z = r * r
    s = z * (1 / 1307674368000 - z * (1 / 355687428096000))
    s = z * (1 / 362880 - z * (1 / 39916800 - z * (1 / 6227020800 - s)))
    s = r + r * z * (-1 / 6 + z * (1 / 120 - z * (1 / 5040 - s)))
    c = z * (1 / 87178291200 - z * (1 / 20922789888000 - z * (1 / 6402373705728000)))
    c = z * (1 / 40320 - z * (1 / 3628800 - z * (1 / 479001600 - c)))
    c = 1.0 + z * (-0.5 + z * (1 / 24 - z * (1 / 720 - c)))
    quadrant = np.int64(n) & 3
    if quadrant & 1:
        c, s = s, c
    cos = -c if (quadrant + 1) & 2 else c
    sin = -s if quadrant & 2 else s
    return cos, sin


@njit(cache=True, inline="always")
def _load(value, kind):
    """The float64 value of one stored element."""
    return np.float64(value) if kind == _codec.FLOAT else np.float64(load16(value, kind))


@njit(cache=True, inline="always")
def _put(table, k, i, cos, sin):
    """Store one angle's float64 ``cos``/``sin`` in the block ``table``.

    A float64 table is ``[2, rows, half]``: ``cos``, ``sin``. A float32 table (16-bit
    storage) is ``[4, rows, half]``: each value as a float32 head and its float32 rest.
    """
    if table.shape[0] == 2:
        table[0, k, i] = cos
        table[1, k, i] = sin
    else:
        c = np.float32(cos)
        s = np.float32(sin)
        table[0, k, i] = c
        table[1, k, i] = np.float32(cos - np.float64(c))
        table[2, k, i] = s
        table[3, k, i] = np.float32(sin - np.float64(s))


@njit(cache=True, inline="always")
def _fill_angles(positions, g, start, inv_freq, sign, scale, table):
    """The block ``table`` of ``sign * positions[g, start + k] * inv_freq[i]``, times ``scale``."""
    rows, half = table.shape[1], table.shape[2]
    largest = 0.0
    for k in range(rows):
        largest = max(largest, abs(positions[g, start + k]))
    max_freq = 0.0
    for i in range(half):
        max_freq = max(max_freq, abs(inv_freq[i]))
    fast = largest * max_freq <= FAST_ANGLE_LIMIT
    for k in range(rows):
        p = positions[g, start + k]
        for i in range(half):
            if fast:
                c, sn = _cos_sin(p * inv_freq[i])
            else:
                c, sn = np.cos(p * inv_freq[i]), np.sin(p * inv_freq[i])
            _put(table, k, i, c * scale, sign * sn * scale)


@njit(cache=True, inline="always")
def _rotate_pairs(a, b, table, k, kind, ra, rb):
    """``ra = a*cos - b*sin``, ``rb = b*cos + a*sin`` for the pairs ``(a[i], b[i])`` of row ``k``."""
    if table.shape[0] == 2:  # float32/float64 storage: float64 arithmetic, rounded once
        cos, sin = table[0, k], table[1, k]
        for i in range(cos.shape[0]):
            ai = np.float64(a[i])
            bi = np.float64(b[i])
            ra[i] = ai * cos[i] - bi * sin[i]
            rb[i] = bi * cos[i] + ai * sin[i]
    else:
        _rotate_pairs_compensated(a, b, table[0, k], table[1, k], table[2, k], table[3, k], kind, ra, rb)


@njit(cache=True, inline="always")
def _rotate_pairs_compensated(a, b, ch, cl, sh, sl, kind, ra, rb):
    """16-bit pairs in float32 with the rounding errors of ``cos = ch + cl``, ``sin = sh + sl``
    and of the cancelling product compensated: within ``2**-23`` of the result plus
    ``2**-45`` of the inputs' size before the one rounding to 16 bits, so the result is
    the float64 computation's or one ulp from it, at twice float64's vector width.
    """
    for i in range(ch.shape[0]):
        ai = load16(a[i], kind)
        bi = load16(b[i], kind)
        p = bi * sh[i]
        q = ai * sh[i]
        # b*sh = p + fma(b, sh, -p) and a*sh = q + fma(a, sh, -q) exactly.
        ra_head = fma32(ai, ch[i], -p)
        rb_head = fma32(bi, ch[i], q)
        ra_rest = (ai * cl[i] - bi * sl[i]) - fma32(bi, sh[i], -p)
        rb_rest = (bi * cl[i] + ai * sl[i]) + fma32(ai, sh[i], -q)
        store16(ra, i, _corrected(ra_head, ra_rest), kind)
        store16(rb, i, _corrected(rb_head, rb_rest), kind)


@njit(cache=True, inline="always")
def _corrected(head, rest):
    """``head + rest``, or ``head`` where an infinite input made the correction NaN (inf - inf)."""
    total = head + rest
    return total if total == total else head


@njit(cache=True, inline="always")
def _rotate_row(row, table, k, interleaved, kind, rotated):
    """The rotated pairs of ``row`` (angles: row ``k`` of ``table``) into ``rotated``, stored like ``row``."""
    # Every access goes through a slice, so indices are loop counters (never negative):
    # no wrap-around arithmetic on addresses, and the loops vectorise.
    half = table.shape[2]
    if interleaved:
        _rotate_pairs(row[0 : 2 * half : 2], row[1 : 2 * half : 2], table, k, kind, rotated[0::2], rotated[1::2])
    else:
        _rotate_pairs(row[:half], row[half : 2 * half], table, k, kind, rotated[:half], rotated[half:])


@njit(cache=True, inline="always")
def _rotate_block(x, xs, g, start, heads, dim, table, interleaved, kind, copy_rest, out, os):
    """Rotate rows ``start : start + rows`` of group ``g``, every head, with the block's ``table``.

    ``xs``/``os``: ``(offset, G stride, H stride, S stride)`` of ``x``/``out`` in elements.
    """
    rows, half = table.shape[1], table.shape[2]
    rotary = 2 * half
    rotated = np.empty(rotary, out.dtype)
    for h in range(heads):
        for k in range(rows):
            s = start + k
            xo = xs[0] + g * xs[1] + h * xs[2] + s * xs[3]
            oo = os[0] + g * os[1] + h * os[2] + s * os[3]
            row = x[xo : xo + dim]
            dst = out[oo : oo + dim]
            _rotate_row(row, table, k, interleaved, kind, rotated)
            for j in range(rotary):
                dst[j] = rotated[j]
            if copy_rest:
                for j in range(rotary, dim):
                    dst[j] = row[j]


def _table_layout(kind):
    """``(planes, dtype)`` of the per-block angle table for storage ``kind`` (see ``_put``)."""
    return (2, np.float64) if kind == _codec.FLOAT else (4, np.float32)


def _rotate_positions_kernel(kind):
    """The ``rope_rotate`` kernel for one storage ``kind`` (a constant when compiled)."""
    planes, table_dtype = _table_layout(kind)

    def rotate_positions(x, xs, out, os, heads, dim, block, copy_rest, positions, inv_freq, interleaved, sign, scale):
        """Rows ``(g, h, s)`` of ``x`` rotated by ``sign * positions[g, s] * inv_freq``, times ``scale``."""
        groups, length = positions.shape
        half = inv_freq.shape[0]
        blocks = (length + block - 1) // block
        for task in prange(groups * blocks):
            g = task // blocks
            start = (task - g * blocks) * block
            table = np.empty((planes, min(block, length - start), half), table_dtype)
            _fill_angles(positions, g, start, inv_freq, sign, scale, table)
            _rotate_block(x, xs, g, start, heads, dim, table, interleaved, kind, copy_rest, out, os)

    return rotate_positions


def _rotate_cos_sin_kernel(kind):
    """The ``rope_apply`` kernel for one storage ``kind`` (a constant when compiled)."""
    planes, table_dtype = _table_layout(kind)

    def rotate_cos_sin(x, xs, out, os, heads, dim, block, copy_rest, cos, sin, interleaved):
        """Rows ``(g, h, s)`` of ``x`` rotated with ``cos[g, s]``/``sin[g, s]`` (one value per pair, stored like ``x``)."""
        groups, length, half = cos.shape
        blocks = (length + block - 1) // block
        for task in prange(groups * blocks):
            g = task // blocks
            start = (task - g * blocks) * block
            table = np.empty((planes, min(block, length - start), half), table_dtype)
            for k in range(table.shape[1]):
                for i in range(half):
                    _put(table, k, i, _load(cos[g, start + k, i], kind), _load(sin[g, start + k, i], kind))
            _rotate_block(x, xs, g, start, heads, dim, table, interleaved, kind, copy_rest, out, os)

    return rotate_cos_sin


_OFFSETS = types.UniTuple(types.int64, 4)


def _flat(t, *, readonly):
    return types.Array(t, 1, "C", readonly=readonly)


def _signature(op, storage):
    """``op``'s kernel signature for ``storage`` (float32, float64 or uint16 elements)."""
    t = numba.from_dtype(np.dtype(storage))
    x, out = _flat(t, readonly=True), _flat(t, readonly=False)
    common = (x, _OFFSETS, out, _OFFSETS, types.int64, types.int64, types.int64, types.boolean)
    if op == "rotate":
        positions = types.Array(types.float64, 2, "C", readonly=True)
        inv_freq = types.Array(types.float64, 1, "C", readonly=True)
        return types.void(*common, positions, inv_freq, types.boolean, types.float64, types.float64)
    table = types.Array(t, 3, "A", readonly=True)
    return types.void(*common, table, table, types.boolean)


@functools.cache
def _kernel(op, kind, storage):
    """The compiled kernel of ``op`` for storage ``kind`` and dtype name ``storage``."""
    make = _rotate_positions_kernel if op == "rotate" else _rotate_cos_sin_kernel
    return njit(_signature(op, storage), parallel=True, cache=True)(make(kind))


def _block(plan):
    """Rows per task: ``_BLOCK``, fewer when that would leave a thread idle."""
    tasks_wanted = 4 * numba.get_num_threads()
    rows = plan.g.size * plan.s.size
    return max(1, min(_BLOCK, rows // tasks_wanted))


def _unit_channels(a):
    return a.shape[-1] <= 1 or a.strides[-1] == a.itemsize


def _destination(x, xv, out):
    """``(result, the NumPy view written, in_place, view to copy it into afterwards or None)``.

    The kernels write unit-stride channels and never into memory they read from another
    row, so an ``out`` that overlaps ``x`` other than exactly, or has strided channels, is
    computed aside and copied in.
    """
    if out is None:
        result = _host.empty_like(x)
        ov = _host.numpy_view(result)
    else:
        result, ov = out, _host.numpy_view(out)
    if _host.same_view(ov, xv) and _unit_channels(ov):
        return result, ov, True, None
    if (out is not None and np.may_share_memory(ov, xv)) or not _unit_channels(ov):
        return result, np.empty(xv.shape, xv.dtype), False, ov
    return result, ov, False, None


def _check(name, shape, want):
    if tuple(shape) != tuple(want):
        raise ValueError(f"{name} has shape {tuple(shape)}, expected {tuple(want)} (kernel launcher check)")


def _launch(op, kind, xv, ov, per_position, rest_args, in_place):
    """Run ``op``'s kernel over the canonical blocks of ``xv``/``ov`` (unit-stride channels).

    ``per_position``: NumPy views broadcast to ``xv.shape[:-1] + (trailing...)``, shared
    over ``H``; they are passed to the kernel as ``[G, S, trailing...]`` (positions as a
    contiguous float64 copy, which is small), followed by ``rest_args``.
    """
    batch, dim = xv.shape[:-1], xv.shape[-1]
    arrays = [xv, ov, *per_position]
    strides = [_host.element_strides(a)[: len(batch)] for a in arrays]
    plan = _layout.plan(batch, strides, shared=range(2, len(arrays)))
    shape = plan.shape()
    if 0 in shape or dim == 0:
        return
    x_flat, x_offset = _host.flat_span(xv)
    o_flat, o_offset = (x_flat, x_offset) if in_place else _host.flat_span(ov)
    per = []
    for k, a in enumerate(per_position, start=2):
        st = plan.strides(k)
        trailing = a.shape[len(batch) :]
        keep = st[:-2] + (st[-1],)  # drop H (stride 0)
        per.append(_host.strided(a, shape[:-2] + (shape[-1],) + trailing, keep + _host.element_strides(a)[len(batch) :]))
    kernel = _kernel(op, kind, xv.dtype.name)
    heads, block = plan.h.size, _block(plan)
    x_steps, o_steps = plan.strides(0), plan.strides(1)
    for index in np.ndindex(*shape[:-3]):
        xs = (x_offset + sum(i * st for i, st in zip(index, x_steps)), *x_steps[-3:])
        os = (o_offset + sum(i * st for i, st in zip(index, o_steps)), *o_steps[-3:])
        tables = [np.ascontiguousarray(p[index]) if op == "rotate" else p[index] for p in per]
        kernel(x_flat, xs, o_flat, os, heads, dim, block, not in_place, *tables, *rest_args)


def _host_x(x):
    """``x``'s NumPy view with unit-stride channels (a contiguous copy if it has none)."""
    xv = _host.numpy_view(x)
    return xv if _unit_channels(xv) else np.ascontiguousarray(xv)


def rotate_positions(x, positions, inv_freq, *, layout="half", inverse=False, scale=1.0, out=None):
    """Numba CPU ``rope_rotate`` (see ``posenc.rotary._rotate.rotate_positions``)."""
    kind = _host.float_kind(x)
    xv = _host_x(x)
    pv = _host.positions_view(positions)
    inv_freq = np.ascontiguousarray(inv_freq, dtype=np.float64)
    if inv_freq.ndim != 1 or 2 * inv_freq.shape[0] > xv.shape[-1]:
        raise ValueError(f"inv_freq of shape {inv_freq.shape} does not fit x of shape {xv.shape} (kernel launcher check)")
    if out is not None:
        _check("out", out.shape, xv.shape)
    # Angles are float64 products, as in the reference: positions are converted once.
    pv = np.broadcast_to(pv.astype(np.float64, copy=False), xv.shape[:-1])
    result, ov, in_place, copy_back = _destination(x, xv, out)
    sign = -1.0 if inverse else 1.0
    rest = (inv_freq, layout == "interleaved", sign, float(scale))
    _launch("rotate", kind, xv, ov, [pv], rest, in_place)
    if copy_back is not None:
        np.copyto(copy_back, ov)
    return result


def rotate_cos_sin(x, cos, sin, *, layout="half", out=None):
    """Numba CPU ``rope_apply`` (see ``posenc.rotary._rotate.rotate_cos_sin``)."""
    kind = _host.float_kind(x)
    xv = _host_x(x)
    rotary_dim = cos.shape[-1]
    if rotary_dim % 2 or rotary_dim > xv.shape[-1] or tuple(sin.shape) != tuple(cos.shape) or not cos.dtype == sin.dtype == x.dtype:
        raise ValueError(f"cos/sin of shape {tuple(cos.shape)} do not fit x of shape {xv.shape} (kernel launcher check)")
    if out is not None:
        _check("out", out.shape, xv.shape)
    target = xv.shape[:-1] + (rotary_dim,)
    cv = np.broadcast_to(_host.numpy_view(cos), target)
    sv = np.broadcast_to(_host.numpy_view(sin), target)
    # Each angle appears twice in the layout's order; the kernel reads it once per pair.
    if layout == "half":
        cv, sv = cv[..., : rotary_dim // 2], sv[..., : rotary_dim // 2]
    else:
        cv, sv = cv[..., 0::2], sv[..., 0::2]
    result, ov, in_place, copy_back = _destination(x, xv, out)
    _launch("apply", kind, xv, ov, [cv, sv], (layout == "interleaved",), in_place)
    if copy_back is not None:
        np.copyto(copy_back, ov)
    return result
