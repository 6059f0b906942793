"""numba.cuda kernels of the Toeplitz ops, for CuPy arrays, torch CUDA tensors and numba device arrays.

Same contracts as ``bias_cpu``. Expand and gather give one thread per output element
(``x`` along the key axis, so writes coalesce; the per-distance vector is read backwards,
which coalesces as well). Scatter gives one block per (row, chunk of ``_CHUNK`` classes):
the block's threads add the row's weights into a shared-memory accumulator with shared
atomics, then write the chunk once. 16-bit floats travel as ``uint16`` bits (``_codec``;
torch has bfloat16 tensors that ``__cuda_array_interface__`` cannot describe); scatter sums
them and float32 in float32 (native shared-memory atomics), float64 in float64, and rounds once.

Kernels run on the caller's stream: torch's or CuPy's current stream through
``numba.cuda.external_stream``, a numba device array's own stream otherwise.
"""

from __future__ import annotations

import contextlib

import numpy as np
from numba import cuda, float32, float64

from . import _bias_checks, _codec
from ._bias_arrays import batched, device_payload, dtype_name, empty_like_kind, kind

_CHUNK = 2048  # scatter accumulators per block (16 KiB of shared memory in float64)
_MAX_GRID_Y = 65535

_load = cuda.jit(device=True)(_codec.load)
_store = cuda.jit(device=True)(_codec.store)


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


def _make_scatter(accumulator, storage):
    """The scatter kernel of elements stored as ``storage`` (a ``_codec`` kind), summed in ``accumulator``.

    Both are constants of the kernel, so each compiles only its own conversions.
    """

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
                    cuda.atomic.add(total, c, _load(weights[b, i, j], storage))
            cuda.syncthreads()
            row_out = out[b, i]
            for c in range(t, count, threads):
                _store(row_out, first + c, total[c], storage)
            cuda.syncthreads()

    return scatter


_SCATTER = {
    "float16": _make_scatter(float32, _codec.FLOAT16),
    "bfloat16": _make_scatter(float32, _codec.BFLOAT16),
    "float32": _make_scatter(float32, _codec.FLOAT),
    "float64": _make_scatter(float64, _codec.FLOAT),
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


def _grid(shape):
    """Grid and block of the expand and gather kernels for an output of ``shape``."""
    threads_x, threads_y = 32, 4
    blocks_x = min(-(-shape[-1] // threads_x), 1024)
    blocks_y = min(-(-int(np.prod(shape[:-1])) // threads_y), _MAX_GRID_Y)
    return (blocks_x, blocks_y), (threads_x, threads_y)


def _scatter_grid(shape, k_len):
    """Grid (class chunks x rows) and block (warps covering the ``k_len`` keys) of scatter."""
    grid = (-(-shape[-1] // _CHUNK), min(int(np.prod(shape[:-1])), _MAX_GRID_Y))
    return grid, min(256, 32 * -(-k_len // 32)) or 32


def _launch(kernel, config, values, shape, out, index=None, bound=None):
    """The result of ``kernel[config]`` on ``values`` (and ``index``): ``out``, or a new array.

    Runs on ``values``' GPU and the caller's stream, with the batch axes merged; an empty
    result launches nothing. ``index`` values must lie in ``[0, bound)``.
    """
    stream, on_device = _stream_and_device(values)
    with on_device:
        result = empty_like_kind(values, shape) if out is None else out
        if 0 in shape:
            return result
        extra = ()
        if index is not None:
            if index.shape[0]:
                _bias_checks.index_range(_index_bounds(index), bound)
            extra = (device_payload(index),)
        grid, block = config
        arrays = [device_payload(values), device_payload(result)]
        batched(lambda v, o: kernel[grid, block, stream](v, *extra, o), arrays, len(shape) - 2)
    return result


def toeplitz_expand(vec, q_len, k_len, *, out=None):
    """numba.cuda ``toeplitz_expand``."""
    shape = _bias_checks.expand(vec, q_len, k_len, out)
    return _launch(_expand, _grid(shape), vec, shape, out)


def toeplitz_gather(scores, index, k_len, *, out=None):
    """numba.cuda ``toeplitz_gather``."""
    shape = _bias_checks.gather(scores, index, k_len, out)
    return _launch(_gather, _grid(shape), scores, shape, out, index, tuple(scores.shape)[-1])


def toeplitz_scatter(weights, index, m, *, out=None):
    """numba.cuda ``toeplitz_scatter``."""
    shape = _bias_checks.scatter(weights, index, m, out)
    config = _scatter_grid(shape, tuple(weights.shape)[-1])
    return _launch(_SCATTER[dtype_name(weights.dtype)], config, weights, shape, out, index, m)
