"""numba.cuda kernels of the Toeplitz ops, for CuPy arrays, torch CUDA tensors and numba device arrays.

Same contracts as ``bias_cpu``. Expand and gather give one thread per output element
(``x`` along the key axis, so writes coalesce; the per-distance vector is read backwards,
which coalesces as well). Scatter gives one block per (row, chunk of ``_CHUNK`` classes):
the block's threads add the row's weights into a shared-memory accumulator with shared
atomics, then write the chunk once. 16-bit floats travel as ``uint16`` payloads (torch
has bfloat16 tensors that ``__cuda_array_interface__`` cannot describe) and scatter sums
them in float32.

Kernels run on the caller's stream: torch's or CuPy's current stream through
``numba.cuda.external_stream``, a numba device array's own stream otherwise.
"""

from __future__ import annotations

import contextlib

import numpy as np
from numba import cuda, float32, float64

from . import _bias_bits, _bias_checks
from ._bias_arrays import batched, device_payload, dtype_name, empty_like_kind, kind

_CHUNK = 2048  # scatter accumulators per block (16 KiB of shared memory in float64)
_MAX_GRID_Y = 65535

_float16_to_float32 = cuda.jit(device=True)(_bias_bits.float16_to_float32)
_float32_to_float16 = cuda.jit(device=True)(_bias_bits.float32_to_float16)
_bfloat16_to_float32 = cuda.jit(device=True)(_bias_bits.bfloat16_to_float32)
_float32_to_bfloat16 = cuda.jit(device=True)(_bias_bits.float32_to_bfloat16)


@cuda.jit(device=True)
def _same(x):
    return x


@cuda.jit
def _expand(vec, out):
    """``out[b, i, j] = vec[b, i + k_len - 1 - j]``."""
    batch, q_len, k_len = out.shape
    j0, row0 = cuda.grid(2)
    step_j, step_row = cuda.gridsize(2)
    for row in range(row0, batch * q_len, step_row):
        b = row // q_len
        i = row - b * q_len
        for j in range(j0, k_len, step_j):
            out[b, i, j] = vec[b, i + k_len - 1 - j]


@cuda.jit
def _gather(scores, index, out):
    """``out[b, i, j] = scores[b, i, index[i + k_len - 1 - j]]``."""
    batch, q_len, k_len = out.shape
    j0, row0 = cuda.grid(2)
    step_j, step_row = cuda.gridsize(2)
    for row in range(row0, batch * q_len, step_row):
        b = row // q_len
        i = row - b * q_len
        for j in range(j0, k_len, step_j):
            out[b, i, j] = scores[b, i, index[i + k_len - 1 - j]]


def _make_scatter(accumulator, load, store):
    """A scatter kernel summing ``load(weight)`` in shared ``accumulator`` and writing ``store(sum)``."""

    @cuda.jit
    def scatter(weights, index, out):
        batch, q_len, k_len = weights.shape
        m = out.shape[2]
        total = cuda.shared.array(_CHUNK, accumulator)
        first = cuda.blockIdx.x * _CHUNK
        count = min(_CHUNK, m - first)
        t, threads = cuda.threadIdx.x, cuda.blockDim.x
        for row in range(cuda.blockIdx.y, batch * q_len, cuda.gridDim.y):
            b = row // q_len
            i = row - b * q_len
            for c in range(t, count, threads):
                total[c] = 0
            cuda.syncthreads()
            for j in range(t, k_len, threads):
                c = index[i + k_len - 1 - j] - first
                if 0 <= c < count:
                    cuda.atomic.add(total, c, load(weights[b, i, j]))
            cuda.syncthreads()
            for c in range(t, count, threads):
                out[b, i, first + c] = store(total[c])
            cuda.syncthreads()

    return scatter


_SCATTER = {
    "float16": _make_scatter(float32, _float16_to_float32, _float32_to_float16),
    "bfloat16": _make_scatter(float32, _bfloat16_to_float32, _float32_to_bfloat16),
    "float32": _make_scatter(float32, _same, _same),
    "float64": _make_scatter(float64, _same, _same),
}


def _stream_and_device(a):
    """The caller's stream for ``a`` and a context manager selecting ``a``'s GPU."""
    which = kind(a)
    if which == "torch-cuda":
        import torch

        handle = torch.cuda.current_stream(a.device).cuda_stream
        device = a.device.index
    elif which == "cupy":
        import cupy

        handle = cupy.cuda.get_current_stream().ptr
        device = a.device.id
    else:
        return a.stream or 0, contextlib.nullcontext()
    stream = cuda.external_stream(handle) if handle else cuda.legacy_default_stream()
    return stream, cuda.gpus[device]


def _index_bounds(index):
    """``(min, max)`` of a non-empty device index (a small synchronising reduction)."""
    which = kind(index)
    if which in ("torch-cuda", "cupy"):
        return int(index.min()), int(index.max())
    host = index.copy_to_host()
    return int(host.min()), int(host.max())


def _grid(k_len, rows, threads_x=32, threads_y=4):
    blocks_x = min(-(-k_len // threads_x), 1024)
    blocks_y = min(-(-rows // threads_y), _MAX_GRID_Y)
    return (blocks_x, blocks_y), (threads_x, threads_y)


def toeplitz_expand(vec, q_len, k_len, *, out=None):
    """numba.cuda ``toeplitz_expand``."""
    shape = _bias_checks.expand(vec, q_len, k_len, out)
    stream, on_device = _stream_and_device(vec)
    with on_device:
        result = empty_like_kind(vec, shape) if out is None else out
        if 0 in shape:
            return result
        grid, block = _grid(shape[-1], int(np.prod(shape[:-1])))
        batched(lambda v, o: _expand[grid, block, stream](v, o), [device_payload(vec), device_payload(result)], vec.ndim - 1)
    return result


def toeplitz_gather(scores, index, k_len, *, out=None):
    """numba.cuda ``toeplitz_gather``."""
    shape = _bias_checks.gather(scores, index, k_len, out)
    stream, on_device = _stream_and_device(scores)
    with on_device:
        result = empty_like_kind(scores, shape) if out is None else out
        if 0 in shape:
            return result
        _bias_checks.index_range(_index_bounds(index), tuple(scores.shape)[-1])
        idx = device_payload(index)
        grid, block = _grid(shape[-1], int(np.prod(shape[:-1])))
        batched(lambda s, o: _gather[grid, block, stream](s, idx, o), [device_payload(scores), device_payload(result)], scores.ndim - 2)
    return result


def toeplitz_scatter(weights, index, m, *, out=None):
    """numba.cuda ``toeplitz_scatter``."""
    shape = _bias_checks.scatter(weights, index, m, out)
    stream, on_device = _stream_and_device(weights)
    with on_device:
        result = empty_like_kind(weights, shape) if out is None else out
        if 0 in shape:
            return result
        if index.shape[0]:
            _bias_checks.index_range(_index_bounds(index), m)
        idx = device_payload(index)
        kernel = _SCATTER[dtype_name(weights.dtype)]
        rows = int(np.prod(shape[:-1]))
        grid = (-(-m // _CHUNK), min(rows, _MAX_GRID_Y))
        threads = min(256, 32 * -(-tuple(weights.shape)[-1] // 32)) or 32
        batched(lambda w, o: kernel[grid, threads, stream](w, idx, o), [device_payload(weights), device_payload(result)], weights.ndim - 2)
    return result
