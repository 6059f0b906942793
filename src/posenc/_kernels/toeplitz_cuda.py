"""numba.cuda kernels of the Toeplitz ops, for CuPy arrays, torch CUDA tensors and numba device arrays.

Same contracts as ``toeplitz_cpu``. Expand and gather give each output row to a block's
row of threads (``y``; a row's index arithmetic once per thread), whose ``x`` threads walk
its keys four at a time, loads before stores (writes coalesce; the per-distance vector is
read backwards, which coalesces as well); they copy bits, so they are specialised by element size. Scatter
gives one block per (row, chunk of ``_CHUNK`` classes): the block sums the row's weights
into shared-memory float64 accumulators in an order fixed by the shape alone (no atomics:
the same bits on every run, whatever the layout), then writes the chunk once, rounded once
(``_codec``), as the CPU kernel does.

Each specialisation compiles on first use (``FAMILY``, the pattern of every kernel
family) and runs on the caller's current stream (``_arrays.launch_context``), launched
straight to the driver (``_device_flat.launch``).
"""

from __future__ import annotations

import numba
import numpy as np
from numba import cuda, types

from . import _arrays, _codec, _device_flat, _family
from .._built import clamped_at_launch, known_in_range
from .toeplitz import SPECIALISATIONS, guard_expand, guard_gather, guard_index_values, guard_scatter, kernel_key, serves

_CHUNK = 2048  # scatter accumulators per block (16 KiB of shared memory in float64)
_TILE = 256  # scatter's keys a tile: its threads a block, at most
_MAX_GRID_Y = 65535

_load = _family.jitted(cuda.jit, _codec.load, device=True)
_store = _family.jitted(cuda.jit, _codec.store, device=True)
_BATCH = _device_flat.BATCH_AXES  # batch axes one launch walks
# An operand's geometry: offset, strides over the batch axes, the row (query) and the column.
_GEOMETRY = _BATCH + 3


@_family.cached(cuda.jit, device=True)
def _walk_row(row, sizes, q_len, vg, og):
    """``(i, values offset, out offset)`` of flat row ``row`` (batch axes, then the query), in
    32-bit arithmetic (the launchers keep rows below 2**31); a batch axis of one element is
    passed over."""
    rest = np.uint32(row)
    n = np.uint32(q_len)
    i = np.int64(rest % n)
    rest = rest // n
    vi, oi = vg[0] + i * vg[_BATCH + 1], og[0] + i * og[_BATCH + 1]
    for k in range(_BATCH - 1, -1, -1):
        n = np.uint32(sizes[k])
        if n == 1:
            continue
        b = np.int64(rest % n)
        rest = rest // n
        vi += b * vg[k + 1]
        oi += b * og[k + 1]
    return i, vi, oi


@_family.cached(cuda.jit, device=True)
def _column(index, ig, t, gather):
    """The column of ``values`` that distance entry ``t`` reads: ``index[t]``, or ``t``."""
    return index[ig[0] + t * ig[1]] if gather else t


def _copy_source(gather):
    """Expand (``gather=False``) or gather, a block row of threads per output row: with
    ``t = i + k_len - 1 - j``, ``out[b, i, j] = values[b, t]`` (a per-distance vector) or
    ``values[b, i, index[t]]``. ``gather`` is a constant of the closure (expand's ``index``
    is an empty placeholder). Element indices are read as unsigned (the launchers keep them
    in bounds): no negative-index wraparound, three 64-bit operations an access (sm_90 PTX
    of expand: 322 -> 250 instructions, 32 registers either way)."""

    def copy(sizes, q_len, k_len, values, vg, index, ig, out, og):
        row = cuda.blockIdx.x * cuda.blockDim.y + cuda.threadIdx.y
        rows = q_len
        for k in range(_BATCH):
            rows *= sizes[k]
        if row >= rows:
            return
        i, vi, oi = _walk_row(row, sizes, q_len, vg, og)
        step = cuda.blockDim.x
        j = cuda.threadIdx.x
        t = i + k_len - 1 - j  # the distance's entry of key j, stepped with j
        at, out_step = oi + j * og[_BATCH + 2], step * og[_BATCH + 2]
        while j + 3 * step < k_len:  # four keys' loads before their stores
            v0 = values[np.uint64(vi + _column(index, ig, t, gather) * vg[_BATCH + 2])]
            v1 = values[np.uint64(vi + _column(index, ig, t - step, gather) * vg[_BATCH + 2])]
            v2 = values[np.uint64(vi + _column(index, ig, t - 2 * step, gather) * vg[_BATCH + 2])]
            v3 = values[np.uint64(vi + _column(index, ig, t - 3 * step, gather) * vg[_BATCH + 2])]
            out[np.uint64(at)] = v0
            out[np.uint64(at + out_step)] = v1
            out[np.uint64(at + 2 * out_step)] = v2
            out[np.uint64(at + 3 * out_step)] = v3
            j += 4 * step
            t -= 4 * step
            at += 4 * out_step
        while j < k_len:
            out[np.uint64(at)] = values[np.uint64(vi + _column(index, ig, t, gather) * vg[_BATCH + 2])]
            j += step
            t -= step
            at += out_step

    return copy


def _scatter_source(storage, helpers):
    """The scatter kernel of elements held as ``storage`` (a constant; ``helpers``: see
    ``_family.source_digest``).

    A block walks its row's keys in tiles of ``blockDim.x``, in order. In a tile, neighbours
    of one class form runs; a segmented scan (Hillis-Steele, a fixed tree) leaves each run's
    float64 sum at its last key (one barrier a step: the steps write two buffers in turn),
    which adds it to the class's accumulator: in parallel when the
    tile's runs have distinct classes (a monotone index: every bucketing posenc makes), else
    one by one in key order. No atomics: the sums, rounded once, do not depend on timing."""

    def scatter(sizes, q_len, k_len, weights, wg, index, ig, out, og):
        helpers  # noqa: B018  (in the closure: Numba's cache key follows _codec)
        m = sizes[_BATCH]
        total = cuda.shared.array(_CHUNK, numba.float64)
        value = cuda.shared.array((2, _TILE), numba.float64)  # the scan's two buffers, in turn
        head = cuda.shared.array((2, _TILE), numba.int32)
        cls = cuda.shared.array(_TILE, numba.int64)
        first = cuda.blockIdx.x * _CHUNK
        count = min(_CHUNK, m - first)
        t, threads = cuda.threadIdx.x, cuda.blockDim.x
        rows = q_len
        for k in range(_BATCH):
            rows *= sizes[k]
        for row in range(cuda.blockIdx.y, rows, cuda.gridDim.y):
            i, wi, oi = _walk_row(row, sizes, q_len, wg, og)
            for c in range(t, count, threads):
                total[c] = 0.0
            for start in range(0, k_len, threads):
                j = start + t
                c, v = -1, 0.0  # past the last key: a run of class -1, summed to nothing
                if j < k_len:
                    c = index[ig[0] + (i + k_len - 1 - j) * ig[1]]
                    v = _load(weights[wi + j * wg[_BATCH + 2]], storage)
                cls[t], value[0, t] = c, v
                cuda.syncthreads()
                h = 1 if t == 0 or cls[t - 1] != c else 0
                step, p = 1, 0
                while step < threads:
                    if t >= step and h == 0:
                        u = t - step
                        v += value[p, u]
                        h = (1 if u == 0 or cls[u - 1] != cls[u] else 0) if step == 1 else head[p, u]
                    p = 1 - p
                    value[p, t], head[p, t] = v, h
                    cuda.syncthreads()
                    step *= 2
                after = cls[t + 1] if t + 1 < threads else -1
                last = c >= 0 and after != c
                rising = cuda.syncthreads_and(1 if not last or after < 0 or after > c else 0)
                falling = cuda.syncthreads_and(1 if not last or after < 0 or after < c else 0)
                ours = last and first <= c < first + count
                if rising or falling:
                    if ours:
                        total[c - first] += v
                else:
                    value[0, t], head[0, t] = v, 1 if ours else 0
                    cuda.syncthreads()
                    if t == 0:
                        for u in range(threads):
                            if head[0, u]:
                                total[cls[u] - first] += value[0, u]
                cuda.syncthreads()
            for c in range(t, count, threads):
                _store(out, oi + (first + c) * og[_BATCH + 2], total[c], storage)
            cuda.syncthreads()

    return scatter


def _build(op, name):
    """``name``: the unsigned integer type whose bits the copies move, or the float dtype scatter sums."""
    t = numba.from_dtype(np.dtype(name if op != "scatter" else _arrays.ELEMENT[name]))
    i64 = types.int64
    flat, geometry = types.Array(t, 1, "C"), types.UniTuple(i64, _GEOMETRY)
    sig = types.void(types.UniTuple(i64, _BATCH + 1), i64, i64, flat, geometry, types.Array(i64, 1, "C"), types.UniTuple(i64, 2), flat, geometry)
    if op != "scatter":
        return _family.jitted(cuda.jit, _copy_source(op == "gather"), sig)
    return _family.jitted(cuda.jit, _scatter_source(_arrays.STORAGE[name], _family.source_digest(_codec)), sig)


FAMILY = _family.Family(
    "toeplitz_cuda",
    _build,
    SPECIALISATIONS,
    serves,
)


def _bits(a):
    """``a``'s span as unsigned integers of its width (the copies move bits)."""
    return _device_flat.span(a, unsigned=True)


def _grid(shape):
    """Grid and block of the expand and gather kernels for an output of ``shape``: 256 threads,
    ``x`` along a row's keys (up to 128), ``y`` over rows."""
    threads_x = min(32 * -(-shape[-1] // 32), 128) or 32
    threads_y = 256 // threads_x
    return -(-int(np.prod(shape[:-1])) // threads_y), (threads_x, threads_y)


def _scatter_grid(shape, k_len):
    """Grid (class chunks x rows) and block (warps covering the ``k_len`` keys) of scatter."""
    grid = (-(-shape[-1] // _CHUNK), min(int(np.prod(shape[:-1])), _MAX_GRID_Y))
    return grid, min(_TILE, 32 * -(-k_len // 32)) or 32


def _launch(key, config, like, values, shape, out, index=None, classes=None):
    """The result of the ``key`` kernel on ``Span`` ``values`` (and device ``index``, its
    values checked to lie in ``[0, classes)`` (``_index``) and converted to int64 on ``like``'s GPU):
    ``out`` or a new array of ``shape``, in one launch (batch axes in the grid, operands as
    flat device arrays: ``_device_flat``), on ``like``'s GPU and the caller's stream. An
    empty result launches nothing."""
    stream, on_device = _arrays.launch_context(like)
    with on_device:
        if index is not None:
            index = _index(index, classes)
        result = _arrays.empty(like, shape) if out is None else out
        if 0 in shape:
            return result
        rows = int(np.prod(shape[:-1]))
        if rows >= 2**31:
            raise ValueError(f"{rows} rows of queries: the CUDA kernels take fewer than 2**31")
        device = _arrays.device_index(like)
        target = _device_flat.span(result) if key[0] == "scatter" else _bits(result)
        (v_flat, v_steps), (o_flat, o_steps) = _device_flat.flat(values), _device_flat.flat(target)
        lead = len(shape) - 2
        # The per-distance vector of expand has no query axis: its row stride is 0.
        v_row = (0, v_steps[-1]) if key[0] == "expand" else v_steps[-2:]
        if index is None:  # expand: an empty placeholder
            index_flat, index_geometry = _device_flat.empty(device, np.int64, stream), (0, 0)
        else:
            index_flat, (step,) = _device_flat.flat(_device_flat.span(index, bits16=False))
            index_geometry = (0, step)
        kernel = FAMILY[key]
        grid, block = config
        for sizes, (vg, og) in _device_flat.batch_launches(tuple(shape[:lead]), (v_steps[:lead], o_steps[:lead])):
            _device_flat.launch(
                kernel, device, grid, block, stream,
                (*sizes, shape[-1]), shape[-2], shape[-1] if key[0] != "scatter" else tuple(values.shape)[-1],
                v_flat, (*vg, *v_row), index_flat, index_geometry, o_flat, (*og, *o_steps[-2:]),
            )
    return result


def _index(index, m):
    """``index`` as int64 on its device, after checking its values lie in ``[0, m)``: read
    back (a synchronisation), unless posenc built this array in that range (``_built``);
    one recorded in a compiled graph is clamped into the range on the device instead."""
    if index.shape[0] and not known_in_range(index, m):
        guard_index_values(index, m)
    elif index.shape[0] and clamped_at_launch(index):
        index = index.clamp(0, m - 1)
    return _device_flat.device_values(index, np.int64)


def toeplitz_expand(vec, q_len, k_len, *, out=None):
    """numba.cuda ``toeplitz_expand``."""
    shape = guard_expand(vec, q_len, k_len, out)
    _arrays.guard_gpu_operands(vec, out)
    _device_flat.separate(out, vec=vec)
    return _launch(kernel_key("expand", vec), _grid(shape), vec, _bits(vec), shape, out)


def toeplitz_gather(scores, index, k_len, *, out=None):
    """numba.cuda ``toeplitz_gather``."""
    shape = guard_gather(scores, index, k_len, out)
    _arrays.guard_gpu_operands(scores, out, index=index)
    _device_flat.separate(out, scores=scores, index=index)
    return _launch(kernel_key("gather", scores), _grid(shape), scores, _bits(scores), shape, out, index, tuple(scores.shape)[-1])


def toeplitz_scatter(weights, index, m, *, out=None):
    """numba.cuda ``toeplitz_scatter``."""
    shape = guard_scatter(weights, index, m, out)
    _arrays.guard_gpu_operands(weights, out, index=index)
    _device_flat.separate(out, weights=weights, index=index)
    config = _scatter_grid(shape, tuple(weights.shape)[-1])
    return _launch(kernel_key("scatter", weights), config, weights, _device_flat.span(weights), shape, out, index, m)
