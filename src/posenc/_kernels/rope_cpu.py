"""Numba CPU kernels for the rotary ops ``rope_rotate`` and ``rope_apply``.

One pass over ``x``: every element is read once and written once. ``x`` is regrouped
(``_layout.plan``) as ``[G, H, S, D]`` where the positions vary over ``G`` and ``S`` and are
shared over ``H``; ``prange`` runs over blocks of ``(g, s)`` rows, computes the block's
float64 ``cos``/``sin`` once into a small local buffer and rotates every row ``h`` that
shares them. Arithmetic is float64 throughout (the reference's), rounded once on store;
16-bit floats travel as ``uint16`` bits (``_codec``).

The launchers take NumPy arrays and torch CPU tensors (zero-copy views), check shapes
again (a kernel never indexes out of bounds), allocate ``out`` with the input's library,
and choose the block size.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import njit, prange, types

from . import _codec, _host, _layout

_load = njit(cache=True, inline="always")(_codec.load)
_store = njit(cache=True, inline="always")(_codec.store)

# Rows per block. Measured on [1, 32, 8192, 128] float32 (2 cores): 64 rows (32 KiB of
# x per head) run about twice as fast as 16, which jumps between heads too often.
_BLOCK = 64

# Storage dtypes (float32, float64, 16-bit bits). Every array is typed as any-layout
# ("A"; inputs read-only, which accepts writable arrays too), so each op compiles once per
# storage dtype instead of once per combination of layouts.
_STORAGE = (types.float32, types.float64, types.uint16)


def _array(dtype, ndim, *, readonly=True):
    return types.Array(dtype, ndim, "A", readonly=readonly)


_ROTATE_SIGNATURES = [
    types.void(
        _array(t, 4), _array(types.float64, 2), _array(types.float64, 1), types.boolean, types.float64,
        types.float64, types.int64, types.boolean, types.int64, _array(t, 4, readonly=False),
    )
    for t in _STORAGE
]
_APPLY_SIGNATURES = [
    types.void(
        _array(t, 4), _array(t, 3), _array(t, 3), types.boolean, types.int64, types.boolean, types.int64,
        _array(t, 4, readonly=False),
    )
    for t in _STORAGE
]


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
def _rotate_pairs(x, cos, sin, interleaved, kind, out):
    half = cos.shape[0]
    if interleaved:
        for i in range(half):
            a = _load(x[2 * i], kind)
            b = _load(x[2 * i + 1], kind)
            _store(out, 2 * i, a * cos[i] - b * sin[i], kind)
            _store(out, 2 * i + 1, b * cos[i] + a * sin[i], kind)
    else:
        for i in range(half):
            a = _load(x[i], kind)
            b = _load(x[i + half], kind)
            _store(out, i, a * cos[i] - b * sin[i], kind)
            _store(out, i + half, b * cos[i] + a * sin[i], kind)


@njit(cache=True, inline="always")
def _rotate_row(x, cos, sin, interleaved, kind, copy_rest, out):
    """Rotate one row of ``x`` into ``out`` (which may be ``x``)."""
    # A constant ``kind`` per call, so each inlined loop keeps only its own conversions.
    if kind == _codec.FLOAT:
        _rotate_pairs(x, cos, sin, interleaved, _codec.FLOAT, out)
    elif kind == _codec.BFLOAT16:
        _rotate_pairs(x, cos, sin, interleaved, _codec.BFLOAT16, out)
    else:
        _rotate_pairs(x, cos, sin, interleaved, _codec.FLOAT16, out)
    if copy_rest:
        for j in range(2 * cos.shape[0], x.shape[0]):
            out[j] = x[j]


@njit(_ROTATE_SIGNATURES, parallel=True, cache=True)
def rotate_positions_kernel(x, positions, inv_freq, interleaved, sign, scale, kind, copy_rest, block, out):
    """``out[g,h,s]`` = row ``x[g,h,s]`` rotated by ``sign * positions[g,s] * inv_freq``, times ``scale``."""
    groups, heads, length = x.shape[0], x.shape[1], x.shape[2]
    half = inv_freq.shape[0]
    max_freq = 0.0
    for i in range(half):
        max_freq = max(max_freq, abs(inv_freq[i]))
    blocks = (length + block - 1) // block
    for task in prange(groups * blocks):
        g = task // blocks
        start = (task - g * blocks) * block
        rows = min(block, length - start)
        cos = np.empty((rows, half))
        sin = np.empty((rows, half))
        largest = 0.0
        for k in range(rows):
            largest = max(largest, abs(positions[g, start + k]))
        fast = largest * max_freq <= FAST_ANGLE_LIMIT
        for k in range(rows):
            p = positions[g, start + k]
            if fast:
                for i in range(half):
                    c, sn = _cos_sin(p * inv_freq[i])
                    cos[k, i] = c * scale
                    sin[k, i] = sign * sn * scale
            else:
                for i in range(half):
                    angle = p * inv_freq[i]
                    cos[k, i] = np.cos(angle) * scale
                    sin[k, i] = sign * np.sin(angle) * scale
        for h in range(heads):
            for k in range(rows):
                _rotate_row(x[g, h, start + k], cos[k], sin[k], interleaved, kind, copy_rest, out[g, h, start + k])


@njit(_APPLY_SIGNATURES, parallel=True, cache=True)
def rotate_cos_sin_kernel(x, cos, sin, interleaved, kind, copy_rest, block, out):
    """``out[g,h,s]`` = row ``x[g,h,s]`` rotated with ``cos[g,s]``/``sin[g,s]`` (one value per pair).

    ``cos`` and ``sin`` are stored like ``x`` (same dtype, same ``kind``).
    """
    groups, heads, length = x.shape[0], x.shape[1], x.shape[2]
    half = cos.shape[2]
    blocks = (length + block - 1) // block
    for task in prange(groups * blocks):
        g = task // blocks
        start = (task - g * blocks) * block
        rows = min(block, length - start)
        c = np.empty((rows, half))
        s = np.empty((rows, half))
        for k in range(rows):
            for i in range(half):
                c[k, i] = _load(cos[g, start + k, i], kind)
                s[k, i] = _load(sin[g, start + k, i], kind)
        for h in range(heads):
            for k in range(rows):
                _rotate_row(x[g, h, start + k], c[k], s[k], interleaved, kind, copy_rest, out[g, h, start + k])


def _block(plan):
    """Rows per task: ``_BLOCK``, fewer when that would leave a thread idle."""
    tasks_wanted = 4 * numba.get_num_threads()
    rows = plan.g.size * plan.s.size
    return max(1, min(_BLOCK, rows // tasks_wanted))


def _destination(x, xv, out):
    """``(result, its NumPy view, in_place, needs_copy_back)`` for ``out``."""
    if out is None:
        result = _host.empty_like(x)
        return result, _host.numpy_view(result), False, None
    ov = _host.numpy_view(out)
    if _host.same_view(ov, xv):
        return out, ov, True, None
    if np.may_share_memory(ov, xv):
        # Overlapping but not the same elements: compute aside, then copy in.
        return out, np.empty_like(xv), False, ov
    return out, ov, False, None


def _check(name, shape, want):
    if tuple(shape) != tuple(want):
        raise ValueError(f"{name} has shape {tuple(shape)}, expected {tuple(want)} (kernel launcher check)")


def _launch(kernel, xv, ov, per_position, rest_args, in_place):
    """Run ``kernel`` over the canonical blocks of ``xv``/``ov``.

    ``per_position``: NumPy views broadcast to ``xv.shape[:-1] + (trailing...)``, shared
    over ``H``; they are passed to the kernel as ``[G, S, trailing...]``.
    """
    batch = xv.shape[:-1]
    arrays = [xv, ov, *per_position]
    strides = [_host.element_strides(a)[: len(batch)] for a in arrays]
    plan = _layout.plan(batch, strides, shared=range(2, len(arrays)))
    if 0 in plan.shape() or xv.shape[-1] == 0:
        return
    dim = xv.shape[-1]
    shape = plan.shape()
    x4 = _host.strided(xv, shape + (dim,), plan.strides(0) + (_host.element_strides(xv)[-1],))
    o4 = x4 if in_place else _host.strided(ov, shape + (dim,), plan.strides(1) + (_host.element_strides(ov)[-1],))
    per = []
    for k, a in enumerate(per_position, start=2):
        st = plan.strides(k)
        trailing = a.shape[len(batch) :]
        keep = st[:-2] + (st[-1],)  # drop H (stride 0)
        per.append(_host.strided(a, shape[:-2] + (shape[-1],) + trailing, keep + _host.element_strides(a)[len(batch) :]))
    block = _block(plan)
    for index in np.ndindex(*shape[:-3]):
        kernel(x4[index], *(p[index] for p in per), *rest_args, block, o4[index])


def rotate_positions(x, positions, inv_freq, *, layout="half", inverse=False, scale=1.0, out=None):
    """Numba CPU ``rope_rotate`` (see ``posenc.rotary._rotate.rotate_positions``)."""
    kind = _host.float_kind(x)
    xv = _host.numpy_view(x)
    pv = _host.positions_view(positions)
    inv_freq = np.ascontiguousarray(inv_freq, dtype=np.float64)
    if inv_freq.ndim != 1 or 2 * inv_freq.shape[0] > xv.shape[-1]:
        raise ValueError(f"inv_freq of shape {inv_freq.shape} does not fit x of shape {xv.shape} (kernel launcher check)")
    pv = np.broadcast_to(pv, xv.shape[:-1])
    # Angles are float64 products, as in the reference; the [G, S] positions are small.
    result, ov, in_place, copy_back = _destination(x, xv, out)
    _check("out", ov.shape, xv.shape)
    sign = -1.0 if inverse else 1.0
    rest = (inv_freq, layout == "interleaved", sign, float(scale), kind, not in_place)
    _launch(_rotate_positions_float64, xv, ov, [pv], rest, in_place)
    if copy_back is not None:
        np.copyto(copy_back, ov)
    return result


def _rotate_positions_float64(x, positions, *args):
    # A fresh float64 copy: one kernel specialisation for every positions dtype.
    rotate_positions_kernel(x, np.array(positions, dtype=np.float64, order="C"), *args)


def rotate_cos_sin(x, cos, sin, *, layout="half", out=None):
    """Numba CPU ``rope_apply`` (see ``posenc.rotary._rotate.rotate_cos_sin``)."""
    kind = _host.float_kind(x)
    xv = _host.numpy_view(x)
    rotary_dim = cos.shape[-1]
    if rotary_dim % 2 or rotary_dim > xv.shape[-1] or tuple(sin.shape) != tuple(cos.shape) or not cos.dtype == sin.dtype == x.dtype:
        raise ValueError(f"cos/sin of shape {tuple(cos.shape)} do not fit x of shape {xv.shape} (kernel launcher check)")
    target = xv.shape[:-1] + (rotary_dim,)
    cv = np.broadcast_to(_host.numpy_view(cos), target)
    sv = np.broadcast_to(_host.numpy_view(sin), target)
    # Each angle appears twice in the layout's order; the kernel reads it once per pair.
    if layout == "half":
        cv, sv = cv[..., : rotary_dim // 2], sv[..., : rotary_dim // 2]
    else:
        cv, sv = cv[..., 0::2], sv[..., 0::2]
    result, ov, in_place, copy_back = _destination(x, xv, out)
    _check("out", ov.shape, xv.shape)
    rest = (layout == "interleaved", kind, not in_place)
    _launch(rotate_cos_sin_kernel, xv, ov, [cv, sv], rest, in_place)
    if copy_back is not None:
        np.copyto(copy_back, ov)
    return result
