"""numba.cuda kernels of the rotary ops ``rope_rotate`` and ``rope_apply``.

Same regrouping as the CPU kernels (``_layout.plan``: ``x`` as ``[G, H, S, D]``, positions
shared over ``H``). One thread per ``(g, s, pair)`` computes that pair's float64 angle,
``cos`` and ``sin`` once (or reads them) and rotates the pair in every row ``h``;
neighbouring threads touch neighbouring channels, so loads and stores coalesce. Extra
threads copy the pass-through channels when ``out`` is not ``x``. Arithmetic is float64
(``_codec``: 16-bit floats as ``uint16`` bits, rounded once on store).

Each ``(op, dtype, layout)`` is one specialisation (``FAMILY``, the same pattern as the CPU
kernels), compiled on first use and cached. Takes CuPy arrays, torch CUDA tensors and numba
device arrays and launches on the caller's current stream (``_arrays.launch_context``).
"""

from __future__ import annotations

import math

import numba
import numpy as np
from numba import cuda, types

from . import _arrays, _codec, _family, _layout
from .rope import SPECIALISATIONS, guard_apply, guard_rotate

_load = cuda.jit(device=True, cache=True)(_codec.load)
_store = cuda.jit(device=True, cache=True)(_codec.store)

_THREADS = 128


def _kernel_source(rotate, storage, interleaved, helpers):
    """One specialisation: a closure over constants (see ``rope_cpu._kernel_source``)."""

    def kernel(x, positions, inv_freq, sign, scale, cos, sin, columns, out):
        helpers  # noqa: B018  (in the closure: Numba's cache key follows _codec)
        groups, heads, length = x.shape[0], x.shape[1], x.shape[2]
        half = inv_freq.shape[0] if rotate else cos.shape[2]
        t = cuda.grid(1)
        if t >= groups * length * columns:
            return
        row = t // columns
        j = t - row * columns
        g = row // length
        s = row - g * length
        if j >= half:  # a pass-through channel
            for h in range(heads):
                out[g, h, s, j + half] = x[g, h, s, j + half]
            return
        if rotate:
            angle = positions[g, s] * inv_freq[j]
            c = math.cos(angle) * scale
            sn = sign * math.sin(angle) * scale
        else:
            c = _load(cos[g, s, j], storage)
            sn = _load(sin[g, s, j], storage)
        ia, ib = (2 * j, 2 * j + 1) if interleaved else (j, j + half)
        for h in range(heads):
            a = _load(x[g, h, s, ia], storage)
            b = _load(x[g, h, s, ib], storage)
            dst = out[g, h, s]
            _store(dst, ia, a * c - b * sn, storage)
            _store(dst, ib, b * c + a * sn, storage)

    return kernel


def _build(op, dtype, layout):
    t = numba.from_dtype(np.dtype(_arrays.ELEMENT[dtype]))
    f64 = types.float64
    sig = types.void(
        types.Array(t, 4, "A"),
        types.Array(f64, 2, "A"),
        types.Array(f64, 1, "C"),
        f64,
        f64,
        types.Array(t, 3, "A"),
        types.Array(t, 3, "A"),
        types.int64,
        types.Array(t, 4, "A"),
    )
    source = _kernel_source(op == "rotate", _arrays.STORAGE[dtype], layout == "interleaved", _family.source_digest(_codec))
    return cuda.jit(sig, cache=True)(source)


FAMILY = _family.Family(
    "rope_cuda",
    _build,
    SPECIALISATIONS,
    lambda key: {key[1]},
)


def _broadcast(a, shape, *, step=None):
    """Device array ``a`` broadcast to ``shape`` (stride 0 along new or unit axes).

    ``step``: the last axis keeps its first ``shape[-1]`` elements ``step`` apart.
    """
    lead = len(shape) - a.ndim
    strides = [0] * lead
    for axis, (n, st) in enumerate(zip(a.shape, _arrays.element_strides(a))):
        if axis == a.ndim - 1 and step is not None:
            strides.append(st * step)
        else:
            strides.append(st if n == shape[lead + axis] else 0)
    return _arrays.strided(a, tuple(shape), tuple(strides))


def _launch(x, op, layout, xd, per_position, arguments, half, out):
    """Run ``op``'s kernel over the ``[G, H, S]`` blocks of ``x`` into ``out`` (``None``: a new array)."""
    stream, on_device = _arrays.launch_context(x)
    with on_device:
        result = _arrays.empty(x) if out is None else out
        od = _arrays.device_view(result)
        in_place = _arrays.extent(od) == _arrays.extent(xd) and tuple(od.strides) == tuple(xd.strides)
        temporary = None
        if not in_place and _arrays.overlap(od, xd):  # overlapping but not the same elements
            temporary = _arrays.empty(x)
            od = _arrays.device_view(temporary)
        dim = tuple(xd.shape)[-1]
        plan, per = _layout.rotary_views(xd, od, per_position)
        shape = plan.shape()
        x4 = _arrays.strided(xd, shape + (dim,), plan.strides(0) + (_arrays.element_strides(xd)[-1],))
        o4 = x4 if in_place else _arrays.strided(od, shape + (dim,), plan.strides(1) + (_arrays.element_strides(od)[-1],))
        columns = half + (0 if in_place else dim - 2 * half)
        rows = plan.g.size * plan.s.size
        if rows and columns and plan.h.size:
            kernel = FAMILY[op, _arrays.dtype_name(x.dtype), layout]
            blocks = (rows * columns + _THREADS - 1) // _THREADS
            for index in np.ndindex(*shape[:-3]):
                views = [p[index] for p in per]
                if op == "rotate":
                    args = (views[0], *arguments)
                else:
                    args = (*arguments, *views)
                kernel[blocks, _THREADS, stream](x4[index], *args, columns, o4[index])
        if temporary is not None:
            _arrays.copy_into(result, temporary)
    return result


def _no_tables(x, stream):
    empty = cuda.device_array((0, 0, 0), dtype=_arrays.ELEMENT[_arrays.dtype_name(x.dtype)], stream=stream)
    return empty, empty


def rotate_positions(x, positions, inv_freq, *, layout="half", inverse=False, scale=1.0, out=None):
    """numba.cuda ``rope_rotate`` (reference: ``posenc.rotary._rotate.rotate_positions``)."""
    inv_freq = guard_rotate(x, positions, inv_freq, out)
    xd = _arrays.device_view(x)
    stream, on_device = _arrays.launch_context(x)
    with on_device:
        pd = _broadcast(_arrays.device_values(positions, np.float64), tuple(xd.shape[:-1]))
        freqs = cuda.to_device(inv_freq, stream=stream)
        arguments = (freqs, -1.0 if inverse else 1.0, float(scale), *_no_tables(x, stream))
    return _launch(x, "rotate", layout, xd, [pd], arguments, inv_freq.shape[0], out)


def rotate_cos_sin(x, cos, sin, *, layout="half", out=None):
    """numba.cuda ``rope_apply`` (reference: ``posenc.rotary._rotate.rotate_cos_sin``)."""
    guard_apply(x, cos, sin, out)
    xd = _arrays.device_view(x)
    half = tuple(cos.shape)[-1] // 2
    # Each angle appears twice in the layout's order; the kernel reads it once per pair:
    # the first half of the channels ("half") or every other channel ("interleaved").
    target, step = tuple(xd.shape[:-1]) + (half,), (2 if layout == "interleaved" else 1)
    cd = _broadcast(_arrays.device_view(cos), target, step=step)
    sd = _broadcast(_arrays.device_view(sin), target, step=step)
    stream, on_device = _arrays.launch_context(x)
    with on_device:
        arguments = (cuda.device_array((0, 0), np.float64, stream=stream), cuda.to_device(np.zeros(0), stream=stream), 1.0, 1.0)
    return _launch(x, "apply", layout, xd, [cd, sd], arguments, half, out)
