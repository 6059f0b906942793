"""Numba CPU kernels of the rotary ops ``rope_rotate`` and ``rope_apply``.

One pass over ``x``: every element is read once and written once. ``x`` is regrouped
(``_layout.plan``) as ``[G, H, S, D]``, the positions varying over ``G`` and ``S`` and
shared over ``H``. A task is a block of ``(g, s)`` rows: it computes the block's ``cos``
and ``sin`` once into a small table and rotates every row ``h`` that shares them. The
kernels see ``x`` and ``out`` as flat 1-D arrays plus element offsets and strides (the
launchers give them unit-stride channels, copying otherwise), so every row is a
contiguous slice.

Rows are rotated eight pairs at a time, straight from ``x`` into ``out`` (in place too),
by the vector intrinsics of ``_pairs``. Arithmetic: float32 and float64 rows rotate in
float64 (the reference's), rounded once on store. float16 and bfloat16 rows travel as
``uint16`` bits and rotate in float32: ``cos = ch + cl`` and ``sin = sh + sl`` with heads
of 16 significant bits (13 for float16) and float32 rests, so ``a*ch`` and ``b*sh`` are
exact (a 16-bit float has 8 or 11 significant bits) and
``a*cos - b*sin = (a*ch - b*sh) + (a*cl - b*sl)`` is two fused multiply-adds, each rounded
once: an error below ``2**-23`` of the result plus ``2**-36`` of ``|a| + |b|`` before the
one rounding to 16 bits, so the result is the float64 computation's or one ulp from it
wherever ``a*cos - b*sin`` cancels by fewer than 24 bits.

Each ``(op, dtype, layout)`` is its own small kernel (``FAMILY``), compiled on first use in
one or two seconds, then loaded from Numba's cache. Tasks run on ``_layout.run_tasks``'s
threads. The launchers take NumPy arrays and torch CPU tensors (zero-copy views),
allocate ``out`` in the input's library and re-check every shape a kernel indexes with.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import njit, types

from . import _arrays, _codec_f32, _family, _layout, _pairs
from .rope import SPECIALISATIONS, guard_apply, guard_rotate
from ._codec import BFLOAT16
from ._codec_f32 import from_bfloat16, from_float16
from ._pairs import rotate_16, rotate_wide

# Rows per task. Measured on [1, 32, 8192, 128] float32 (2 cores): 64 rows (32 KiB of
# x per head) run about twice as fast as 16, which jumps between heads too often.
_BLOCK = 64

# pi/2 as P1 + P2 + P3 + P4: P1 to P3 with 21 significant bits (so n * Pk is exact for
# |n| < 2**32), P4 the float64 rest (pi/2 to 2**-119); checked against mpmath in the tests.
_P1 = 1.570796012878418
_P2 = 3.139164164167596e-07
_P3 = 6.223369259164557e-14
_P4 = 2.912732056093356e-20
_TWO_OVER_PI = 0.6366197723675814
_ROUND = 6755399441055744.0  # 1.5 * 2**52: (t + _ROUND) - _ROUND is rint(t) for |t| < 2**51
# Largest angle the kernel's reduction covers (|n| < 2**32); the launcher leaves calls with
# larger angles (positions beyond about 4e9 at frequency 1) to the reference's libm.
FAST_ANGLE_LIMIT = 2.0**32
# Veltkamp splitters: c * S - (c * S - c) is c rounded to 53 - log2(S - 1) significant
# bits, a head whose product with a 16-bit float is exact in float32 (bfloat16 has 8
# significant bits, float16 11).
_SPLIT_BFLOAT16 = 2.0**37 + 1.0  # 16-bit heads
_SPLIT_FLOAT16 = 2.0**40 + 1.0  # 13-bit heads
# Pairs per vector (``_pairs``): 8 float32 lanes fill an AVX2 register, 8 float64 lanes two.
_LANES = 8


@njit(inline="always")
def _head_rest(v, split):
    """float64 ``v`` as float32 ``(head, rest)``, Veltkamp's split by ``split``: the head
    rounded to the significant bits whose product with a 16-bit float is exact in float32, the
    rest ``v - head`` rounded once. A value whose split overflows (infinite, or beyond about
    ``1e27``) is its own head with a rest of 0 (not ``inf - inf``)."""
    t = v * split
    head = t - (t - v)
    if not np.isfinite(head):
        return np.float32(v), np.float32(0.0)
    return np.float32(head), np.float32(v - head)


@njit(inline="always")
def _cos_sin(angle):
    """``(cos, sin)`` of a float64 ``angle``, ``|angle| <= FAST_ANGLE_LIMIT``, within ~2 ulp.

    Branch-free, so loops over it vectorise (libm's scalar calls do not): reduce by
    ``n * pi/2`` in four steps, the first three exact products (Cody and Waite), then the
    Taylor series of sin and cos on ``|r| <= pi/4`` through ``r**17`` / ``r**18``
    (truncation below 1e-19).
    """
    n = (angle * _TWO_OVER_PI + _ROUND) - _ROUND
    r = (((angle - n * _P1) - n * _P2) - n * _P3) - n * _P4
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


def _kernel_source(rotate, wide, bfloat16, interleaved, helpers):
    """One specialisation's Python function: a closure over four constants, so Numba compiles
    only their branches (its cache keys on them too), and over ``helpers``, the digest of
    the helper modules it inlines (``_family.source_digest``). ``rotate``: angles from ``positions``
    and ``inv_freq`` (op ``rope_rotate``), else from ``cos_in``/``sin_in`` (``rope_apply``;
    the arguments of the other op are empty placeholders). ``wide``: float64 arithmetic.

    One function, not a kernel calling helpers: every Numba function compiles through its
    own pipeline (a fifth of a second each, cold), and LLVM would not inline a row loop
    into a kernel this size, where a call per row costs as much as the row.
    """

    def kernel(x, xs, out, os, heads, dim, copy_rest, positions, inv_freq, sign, scale, cos_in, sin_in, cos, sin, table, first, last):
        """Rows ``(g, h, s)`` of ``x`` (offsets and ``G, H, S`` strides ``xs``, in elements)
        rotated into ``out`` (``os``), tasks ``first .. last - 1`` of ``len(cos)`` rows each.

        Scratch, one set per thread: ``cos``, ``sin`` ``[block, half]`` (float64),
        ``table`` ``[4, block, half]`` (float32: 16-bit rows take cos and sin as head + rest).
        """
        helpers  # noqa: B018  (in the closure: Numba's cache key follows the helper modules)
        length = positions.shape[1] if rotate else cos_in.shape[1]
        half = inv_freq.shape[0] if rotate else cos_in.shape[2]
        rotary = 2 * half
        block = cos.shape[0]
        blocks = (length + block - 1) // block
        for task in range(first, last):
            g = task // blocks
            start = (task - g * blocks) * block
            rows = min(block, length - start)
            # The block's float64 cos and sin, scaled (angles within FAST_ANGLE_LIMIT).
            if rotate:
                p = positions[g, start : start + rows]
                for k in range(rows):
                    c_row, s_row = cos[k], sin[k]
                    for i in range(half):
                        c, s = _cos_sin(p[k] * inv_freq[i])
                        c_row[i] = c * scale
                        s_row[i] = sign * s * scale
            else:
                for k in range(rows):
                    for i in range(half):
                        c, s = cos_in[g, start + k, i], sin_in[g, start + k, i]
                        if wide:
                            cos[k, i], sin[k, i] = c, s
                        elif bfloat16:
                            cos[k, i], sin[k, i] = from_bfloat16(c), from_bfloat16(s)
                        else:
                            cos[k, i], sin[k, i] = from_float16(c), from_float16(s)
            if not wide:
                for k in range(rows):
                    for i in range(half):
                        split = _SPLIT_BFLOAT16 if bfloat16 else _SPLIT_FLOAT16
                        table[0, k, i], table[1, k, i] = _head_rest(cos[k, i], split)
                        table[2, k, i], table[3, k, i] = _head_rest(sin[k, i], split)
            # Rows in the order x lies in memory: heads inner where they are nearer than
            # positions (q, k viewed [B, S, H, D] and transposed), else positions inner.
            heads_inner = abs(xs[2]) < abs(xs[3])
            for n in range(heads * rows):
                if heads_inner:
                    k, h = n // heads, n % heads
                else:
                    h, k = n // rows, n % rows
                s = start + k
                xo = xs[0] + g * xs[1] + h * xs[2] + s * xs[3]
                oo = os[0] + g * os[1] + h * os[2] + s * os[3]
                row, dst = x[xo : xo + dim], out[oo : oo + dim]
                i = 0
                if wide:
                    c, sn = cos[k], sin[k]
                    while i + _LANES <= half:
                        rotate_wide(row, dst, c, sn, i, half, _LANES, interleaved)
                        i += _LANES
                    while i < half:
                        rotate_wide(row, dst, c, sn, i, half, 1, interleaved)
                        i += 1
                else:
                    ch, cl, sh, sl = table[0, k], table[1, k], table[2, k], table[3, k]
                    while i + _LANES <= half:
                        rotate_16(row, dst, ch, cl, sh, sl, i, half, _LANES, bfloat16, interleaved)
                        i += _LANES
                    while i < half:
                        rotate_16(row, dst, ch, cl, sh, sl, i, half, 1, bfloat16, interleaved)
                        i += 1
                if copy_rest:
                    for j in range(rotary, dim):
                        dst[j] = row[j]

    return kernel


_OFFSETS = types.UniTuple(types.int64, 4)


def _signature(dtype):
    t = numba.from_dtype(np.dtype(_arrays.ELEMENT[dtype]))
    x = types.Array(t, 1, "C", readonly=True)
    positions = types.Array(types.float64, 2, "C", readonly=True)
    inv_freq = types.Array(types.float64, 1, "C", readonly=True)
    table = types.Array(t, 3, "A", readonly=True)
    scratch = (types.Array(types.float64, 2, "C"),) * 2 + (types.Array(types.float32, 3, "C"),)
    return types.void(
        *(x, _OFFSETS, types.Array(t, 1, "C"), _OFFSETS, types.int64, types.int64, types.boolean),
        *(positions, inv_freq, types.float64, types.float64, table, table),
        *scratch,
        *(types.int64, types.int64),
    )


def _build(op, dtype, layout):
    helpers = _family.source_digest(_codec_f32, _pairs)
    source = _kernel_source(op == "rotate", dtype in ("float32", "float64"), dtype == "bfloat16", layout == "interleaved", helpers)
    return _family.jitted(njit, source, _signature(dtype), nogil=True)


FAMILY = _family.Family("rope_cpu", _build, SPECIALISATIONS, lambda key: {key[1]}, prepare=_family.start_numba_cpu)


# ---------------------------------------------------------------- launchers

# Elements of x below which one thread does the whole call (a thread's start costs about
# what rotating this many elements does).
_ELEMENTS_PER_THREAD = 1 << 16
_NO_ANGLES = (np.zeros((0, 0)), np.zeros(0), 1.0, 1.0)
_NO_TABLES = {dtype: np.zeros((0, 0, 0), storage) for dtype, storage in _arrays.ELEMENT.items()}


def _unit_channels(a):
    return a.shape[-1] <= 1 or a.strides[-1] == a.itemsize


def _host_x(x):
    """``x``'s NumPy view with unit-stride channels (a contiguous copy if it has none)."""
    xv = _arrays.addressable(_arrays.host_view(x))
    return xv if _unit_channels(xv) else np.ascontiguousarray(xv)


def _destination(x, xv, out):
    """``(result, the NumPy view written, in_place, view to copy it into afterwards or None)``.

    The kernels write unit-stride channels and never into memory they read from another
    row, so an ``out`` that overlaps ``x`` other than exactly, or has strided channels, is
    computed aside and copied in.
    """
    result = _arrays.empty(x) if out is None else out
    ov = _arrays.host_view(result)
    if _arrays.same_view(ov, xv) and _unit_channels(ov):
        return result, ov, True, None
    if (out is not None and np.may_share_memory(ov, xv)) or not _unit_channels(ov) or not _arrays.whole_strides(ov):
        return result, np.empty(xv.shape, xv.dtype), False, ov
    return result, ov, False, None


def _launch(x, op, layout, xv, ov, per_position, angles, tables, in_place):
    """Run ``op``'s kernel over the ``[G, H, S]`` blocks of ``xv`` into ``ov`` (unit-stride channels).

    ``per_position``: NumPy views broadcast to ``xv.shape[:-1] + (trailing...)``, shared
    over ``H``, passed to the kernel as ``[G, S, trailing...]`` (positions as a contiguous
    float64 copy, which is small).
    """
    dim = xv.shape[-1]
    plan, per = _layout.rotary_views(xv, ov, per_position)
    shape = plan.shape()
    if 0 in shape or dim == 0:
        return
    kernel = FAMILY[op, _arrays.dtype_name(x.dtype), layout]
    x_flat, x_offset = _arrays.flat_span(xv)
    o_flat, o_offset = (x_flat, x_offset) if in_place else _arrays.flat_span(ov)
    heads, rows = plan.h.size, plan.g.size * plan.s.size
    workers = min(_layout.threads(), max(1, xv.size // _ELEMENTS_PER_THREAD))
    block = max(1, min(_BLOCK, rows // (4 * workers)))
    tasks = plan.g.size * -(-plan.s.size // block)
    half = (per_position[0].shape[-1] if op == "apply" else angles[0].shape[0]) if per_position else 0
    scratch = [
        (np.empty((block, half)), np.empty((block, half)), np.empty((4, block, half), np.float32))
        for _ in range(min(workers, tasks))
    ]
    x_steps, o_steps = plan.strides(0), plan.strides(1)
    for index in np.ndindex(*shape[:-3]):
        xs = (x_offset + sum(i * st for i, st in zip(index, x_steps)), *x_steps[-3:])
        os = (o_offset + sum(i * st for i, st in zip(index, o_steps)), *o_steps[-3:])
        if op == "rotate":
            arguments = (np.ascontiguousarray(per[0][index]), *angles, *tables)
        else:
            arguments = (*angles, per[0][index], per[1][index])
        _layout.run_tasks(kernel, (x_flat, xs, o_flat, os, heads, dim, not in_place, *arguments), tasks, scratch)


def rotate_positions(x, positions, inv_freq, *, layout="half", inverse=False, scale=1.0, out=None):
    """Numba CPU ``rope_rotate`` (reference: ``posenc.rotary._rotate.rotate_positions``).

    Tokens whose angles reach beyond ``FAST_ANGLE_LIMIT`` (positions beyond about 4e9) take
    the reference, whose libm reduces any angle: those tokens only, so every token gets the
    numbers a call of it alone gives, whatever the rest of the call holds.
    """
    inv_freq = guard_rotate(x, positions, inv_freq, out)
    # Angles are float64 products, as in the reference: positions are converted once.
    pv = _arrays.host_values(positions).astype(np.float64, copy=False)
    if pv.size and inv_freq.size and not float(np.abs(pv).max()) * float(np.abs(inv_freq).max()) <= FAST_ANGLE_LIMIT:
        return _rotate_beyond_limit(x, positions, pv, inv_freq, layout, inverse, scale, out)
    return _rotate_fast(x, pv, inv_freq, layout, inverse, scale, out)


def _rotate_beyond_limit(x, positions, pv, inv_freq, layout, inverse, scale, out):
    """``rotate_positions`` where some angles pass ``FAST_ANGLE_LIMIT``: the reference's
    numbers for those tokens (computed first, before an in-place write), the kernel's for the others."""
    from ..rotary import _rotate

    beyond = ~(np.abs(pv) * float(np.abs(inv_freq).max()) <= FAST_ANGLE_LIMIT)
    if beyond.all():
        return _rotate.rotate_positions(x, positions, inv_freq, layout=layout, inverse=inverse, scale=scale, out=out)
    exact = _rotate.rotate_positions(x, positions, inv_freq, layout=layout, inverse=inverse, scale=scale)
    result = _rotate_fast(x, np.where(beyond, 0.0, pv), inv_freq, layout, inverse, scale, out)
    rows = np.broadcast_to(beyond, tuple(x.shape[:-1]))
    _arrays.host_view(result)[rows] = _arrays.host_view(exact)[rows]
    return result


def _rotate_fast(x, pv, inv_freq, layout, inverse, scale, out):
    """The kernel's rotation by float64 positions ``pv`` (every angle within ``FAST_ANGLE_LIMIT``)."""
    xv = _host_x(x)
    pv = np.broadcast_to(_arrays.addressable(pv), xv.shape[:-1])
    result, ov, in_place, copy_back = _destination(x, xv, out)
    angles = (inv_freq, -1.0 if inverse else 1.0, float(scale))
    _launch(x, "rotate", layout, xv, ov, [pv], angles, (_NO_TABLES[_arrays.dtype_name(x.dtype)],) * 2, in_place)
    if copy_back is not None:
        np.copyto(copy_back, ov)
    return result


def rotate_cos_sin(x, cos, sin, *, layout="half", out=None):
    """Numba CPU ``rope_apply`` (reference: ``posenc.rotary._rotate.rotate_cos_sin``)."""
    guard_apply(x, cos, sin, out)
    xv = _host_x(x)
    rotary_dim = cos.shape[-1]
    target = xv.shape[:-1] + (rotary_dim,)
    # Each angle appears twice in the layout's order; the kernel reads it once per pair.
    pairs = slice(None, rotary_dim // 2) if layout == "half" else slice(0, None, 2)
    cv = np.broadcast_to(_arrays.addressable(_arrays.host_view(cos)), target)[..., pairs]
    sv = np.broadcast_to(_arrays.addressable(_arrays.host_view(sin)), target)[..., pairs]
    result, ov, in_place, copy_back = _destination(x, xv, out)
    _launch(x, "apply", layout, xv, ov, [cv, sv], _NO_ANGLES, (), in_place)
    if copy_back is not None:
        np.copyto(copy_back, ov)
    return result
