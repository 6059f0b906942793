"""numba.cuda kernels for the rotary ops ``rope_rotate`` and ``rope_apply``.

Same regrouping as the CPU kernels (``_layout.plan``: ``x`` as ``[G, H, S, D]``, positions
shared over ``H``). One thread per ``(g, s, pair)`` computes that pair's float64 angle,
``cos`` and ``sin`` once and rotates the pair in every row ``h``; neighbouring threads
touch neighbouring channels, so loads and stores coalesce. Extra threads copy the
pass-through channels when ``out`` is not ``x``. Takes CuPy arrays, torch CUDA tensors
and numba device arrays, and launches on the caller's current stream.
"""

from __future__ import annotations

import contextlib
import math

import numpy as np
from numba import cuda

from . import _codec, _device, _layout

_load = cuda.jit(device=True, cache=True)(_codec.load)
_store = cuda.jit(device=True, cache=True)(_codec.store)

_THREADS = 128


@cuda.jit(device=True, cache=True)
def _rotate_pair(x, out, g, s, j, half, c, sn, interleaved, kind):
    if interleaved:
        ia, ib = 2 * j, 2 * j + 1
    else:
        ia, ib = j, j + half
    for h in range(x.shape[1]):
        a = _load(x[g, h, s, ia], kind)
        b = _load(x[g, h, s, ib], kind)
        row = out[g, h, s]
        _store(row, ia, a * c - b * sn, kind)
        _store(row, ib, b * c + a * sn, kind)


@cuda.jit(device=True, cache=True)
def _copy_channel(x, out, g, s, column):
    for h in range(x.shape[1]):
        out[g, h, s, column] = x[g, h, s, column]


@cuda.jit(cache=True)
def rotate_positions_kernel(x, positions, inv_freq, interleaved, sign, scale, kind, columns, out):
    length = x.shape[2]
    half = inv_freq.shape[0]
    t = cuda.grid(1)
    if t >= x.shape[0] * length * columns:
        return
    row = t // columns
    j = t - row * columns
    g = row // length
    s = row - g * length
    if j < half:
        angle = np.float64(positions[g, s]) * inv_freq[j]
        c = math.cos(angle) * scale
        sn = sign * math.sin(angle) * scale
        _rotate_pair(x, out, g, s, j, half, c, sn, interleaved, kind)
    else:
        _copy_channel(x, out, g, s, j + half)


@cuda.jit(cache=True)
def rotate_cos_sin_kernel(x, cos, sin, interleaved, kind, cs_kind, columns, out):
    length = x.shape[2]
    half = cos.shape[2]
    t = cuda.grid(1)
    if t >= x.shape[0] * length * columns:
        return
    row = t // columns
    j = t - row * columns
    g = row // length
    s = row - g * length
    if j < half:
        c = _load(cos[g, s, j], cs_kind)
        sn = _load(sin[g, s, j], cs_kind)
        _rotate_pair(x, out, g, s, j, half, c, sn, interleaved, kind)
    else:
        _copy_channel(x, out, g, s, j + half)


def _views(xd, od, per_position, in_place):
    """Canonical ``[G, H, S, D]`` views of ``xd``/``od`` and ``[G, S, ...]`` ones of the rest."""
    batch = xd.shape[:-1]
    arrays = [xd, od, *per_position]
    strides = [_device.element_strides(a)[: len(batch)] for a in arrays]
    plan = _layout.plan(batch, strides, shared=range(2, len(arrays)))
    shape, dim = plan.shape(), tuple(xd.shape)[-1]
    x4 = _device.strided(xd, shape + (dim,), plan.strides(0) + (_device.element_strides(xd)[-1],))
    o4 = x4 if in_place else _device.strided(od, shape + (dim,), plan.strides(1) + (_device.element_strides(od)[-1],))
    per = []
    for k, a in enumerate(per_position, start=2):
        st = plan.strides(k)
        trailing = a.shape[len(batch) :]
        per.append(
            _device.strided(a, shape[:-2] + (shape[-1],) + trailing, st[:-2] + (st[-1],) + _device.element_strides(a)[len(batch) :])
        )
    return plan, x4, o4, per


def _broadcast(a, shape, *, step=None):
    """Device array ``a`` broadcast to ``shape`` (stride 0 along new or unit axes).

    ``step``: the last axis keeps its first ``shape[-1]`` elements ``step`` apart.
    """
    lead = len(shape) - a.ndim
    strides = [0] * lead
    for axis, (n, st) in enumerate(zip(a.shape, _device.element_strides(a))):
        want = shape[lead + axis]
        if axis == a.ndim - 1 and step is not None:
            if n < step * (want - 1) + 1:
                raise ValueError(f"array of shape {tuple(a.shape)} has fewer than {want} pairs (kernel launcher check)")
            strides.append(st * step)
        elif n == want or n == 1:
            strides.append(st if n == want else 0)
        else:
            raise ValueError(f"array of shape {tuple(a.shape)} does not broadcast to {tuple(shape)} (kernel launcher check)")
    return _device.strided(a, tuple(shape), tuple(strides))


def _copy_into(out, temporary):
    lib = _device.library(out)
    if lib == "torch":
        out.copy_(temporary)
    elif lib == "cupy":
        out[...] = temporary
    else:
        out.copy_to_device(temporary)


def _launch(kernel, x, xd, per_position, args, half, out):
    """Run ``kernel`` over the canonical blocks of ``x`` into ``out`` (``None``: a new array)."""
    result = _device.empty_like(x) if out is None else out
    od = _device.as_numba(result)
    if tuple(od.shape) != tuple(xd.shape):
        raise ValueError(f"out has shape {tuple(od.shape)}, expected {tuple(xd.shape)} (kernel launcher check)")
    in_place = _device.extent(od) == _device.extent(xd) and tuple(od.strides) == tuple(xd.strides)
    temporary = None
    if not in_place and _device.overlap(od, xd):
        # Overlapping but not the same elements: compute aside, then copy in.
        temporary = _device.empty_like(x)
        od = _device.as_numba(temporary)
    plan, x4, o4, per = _views(xd, od, per_position, in_place)
    stream, device = _device.stream_and_device(x)
    columns = half + (0 if in_place else tuple(xd.shape)[-1] - 2 * half)
    rows = plan.g.size * plan.s.size
    if rows and columns and plan.h.size:
        blocks = (rows * columns + _THREADS - 1) // _THREADS
        with _on(device):
            for index in np.ndindex(*plan.shape()[:-3]):
                kernel[blocks, _THREADS, stream](x4[index], *(p[index] for p in per), *args, columns, o4[index])
    if temporary is not None:
        _copy_into(result, temporary)
    return result


def _on(device):
    return cuda.gpus[device] if device is not None else contextlib.nullcontext()


def rotate_positions(x, positions, inv_freq, *, layout="half", inverse=False, scale=1.0, out=None):
    """numba.cuda ``rope_rotate`` (see ``posenc.rotary._rotate.rotate_positions``)."""
    xd = _device.as_numba(x)
    inv_freq = np.ascontiguousarray(inv_freq, dtype=np.float64)
    if inv_freq.ndim != 1 or 2 * inv_freq.shape[0] > tuple(xd.shape)[-1]:
        raise ValueError(f"inv_freq of shape {inv_freq.shape} does not fit x of shape {tuple(xd.shape)} (kernel launcher check)")
    pd = _broadcast(_device.as_numba(positions, bits16=False), tuple(xd.shape[:-1]))
    stream, device = _device.stream_and_device(x)
    with _on(device):
        freqs = cuda.to_device(inv_freq, stream=stream)
    sign = -1.0 if inverse else 1.0
    args = (freqs, layout == "interleaved", sign, float(scale), _device.float_kind(x))
    return _launch(rotate_positions_kernel, x, xd, [pd], args, inv_freq.shape[0], out)


def rotate_cos_sin(x, cos, sin, *, layout="half", out=None):
    """numba.cuda ``rope_apply`` (see ``posenc.rotary._rotate.rotate_cos_sin``)."""
    xd = _device.as_numba(x)
    rotary_dim = tuple(cos.shape)[-1]
    if rotary_dim % 2 or rotary_dim > tuple(xd.shape)[-1] or tuple(sin.shape) != tuple(cos.shape) or sin.dtype != cos.dtype:
        raise ValueError(f"cos/sin of shape {tuple(cos.shape)} do not fit x of shape {tuple(xd.shape)} (kernel launcher check)")
    half = rotary_dim // 2
    # Each angle appears twice in the layout's order; the kernel reads it once per pair:
    # the first half of the channels ("half") or every other channel ("interleaved").
    target, step = tuple(xd.shape[:-1]) + (half,), (2 if layout == "interleaved" else 1)
    cd = _broadcast(_device.as_numba(cos), target, step=step)
    sd = _broadcast(_device.as_numba(sin), target, step=step)
    args = (layout == "interleaved", _device.float_kind(x), _device.float_kind(cos))
    return _launch(rotate_cos_sin_kernel, x, xd, [cd, sd], args, half, out)
