"""numba.cuda kernels of the Toeplitz ops, for CuPy arrays, torch CUDA tensors and numba device arrays.

Same contracts as ``toeplitz_cpu``. Expand and gather give one thread per output element
(``x`` along the key axis, so writes coalesce; the per-distance vector is read backwards,
which coalesces as well) and copy bits, so they are specialised by element size. Scatter
gives one block per (row, chunk of ``_CHUNK`` classes): the block's threads add the row's
weights into a shared-memory accumulator with shared atomics, then write the chunk once;
it sums 16-bit floats and float32 in float32 (native shared-memory atomics), float64 in
float64, and rounds once (``_codec``).

Each specialisation compiles on first use (``FAMILY``, the pattern of every kernel
family) and runs on the caller's current stream (``_arrays.launch_context``).
"""

from __future__ import annotations

import numba
import numpy as np
from numba import cuda, types

from . import _arrays, _codec, _family, _layout
from .toeplitz import SPECIALISATIONS, guard_expand, guard_gather, guard_index_values, guard_scatter, kernel_key, serves

_CHUNK = 2048  # scatter accumulators per block (16 KiB of shared memory in float64)
_MAX_GRID_Y = 65535

_load = cuda.jit(device=True, cache=True)(_codec.load)
_store = cuda.jit(device=True, cache=True)(_codec.store)


def _copy_source(gather):
    """Expand (``gather=False``) or gather, one thread per output element: with
    ``t = i + k_len - 1 - j``, ``out[b, i, j] = values[b, t]`` (a per-distance vector) or
    ``values[b, i, index[t]]``. ``gather`` is a constant of the closure (expand's ``index``
    is an empty placeholder)."""

    def copy(values, index, out):
        batch, q_len, k_len = out.shape
        j0, row0 = cuda.grid(2)
        step_j, step_row = cuda.gridsize(2)
        for row in range(row0, batch * q_len, step_row):
            b = row // q_len
            i = row - b * q_len
            for j in range(j0, k_len, step_j):
                t = i + k_len - 1 - j
                out[b, i, j] = values[b, i, index[t]] if gather else values[b, t]

    return copy


def _scatter_source(accumulator, storage, helpers):
    """The scatter kernel of elements held as ``storage``, summed in ``accumulator`` (constants;
    ``helpers``: see ``_family.source_digest``)."""

    def scatter(weights, index, out):
        helpers  # noqa: B018  (in the closure: Numba's cache key follows _codec)
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


def _build(op, name):
    """``name``: the unsigned integer type whose bits the copies move, or the float dtype scatter sums."""
    t = numba.from_dtype(np.dtype(name if op != "scatter" else _arrays.ELEMENT[name]))
    array3, index = types.Array(t, 3, "A"), types.Array(types.int64, 1, "A")
    if op != "scatter":
        values = array3 if op == "gather" else types.Array(t, 2, "A")
        return cuda.jit(types.void(values, index, array3), cache=True)(_copy_source(op == "gather"))
    accumulator = numba.float64 if name == "float64" else numba.float32
    return cuda.jit(types.void(array3, index, array3), cache=True)(_scatter_source(accumulator, _arrays.STORAGE[name], _family.source_digest(_codec)))


FAMILY = _family.Family(
    "toeplitz_cuda",
    _build,
    SPECIALISATIONS,
    serves,
)


def _bits(a):
    """A numba device view of ``a`` as unsigned integers of its width (the copies move bits)."""
    view = _arrays.device_view(a)
    return view.view(np.dtype(f"u{view.dtype.itemsize}"))


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


def _launch(key, config, like, values, shape, out, lead, index=None):
    """The result of the ``key`` kernel on device views ``values`` (and ``index``): ``out`` or a new array.

    Runs on ``like``'s GPU and the caller's stream, with the batch axes merged; an empty
    result launches nothing.
    """
    stream, on_device = _arrays.launch_context(like)
    with on_device:
        result = _arrays.empty(like, shape) if out is None else out
        if 0 in shape:
            return result
        kernel = FAMILY[key]
        grid, block = config
        target = _arrays.device_view(result) if key[0] == "scatter" else _bits(result)
        if index is None:  # expand: an empty placeholder
            index = cuda.device_array(0, np.int64, stream=stream)
        for values_b, result_b in _layout.batch_views([values, target], lead):
            kernel[grid, block, stream](values_b, index, result_b)
    return result


def _index(index, m):
    """``index`` as an int64 numba device array, after checking its values lie in ``[0, m)``."""
    if index.shape[0]:
        guard_index_values(index, m)
    return _arrays.device_values(index, np.int64)


def toeplitz_expand(vec, q_len, k_len, *, out=None):
    """numba.cuda ``toeplitz_expand``."""
    shape = guard_expand(vec, q_len, k_len, out)
    return _launch(kernel_key("expand", vec), _grid(shape), vec, _bits(vec), shape, out, len(shape) - 2)


def toeplitz_gather(scores, index, k_len, *, out=None):
    """numba.cuda ``toeplitz_gather``."""
    shape = guard_gather(scores, index, k_len, out)
    return _launch(kernel_key("gather", scores), _grid(shape), scores, _bits(scores), shape, out, len(shape) - 2, _index(index, tuple(scores.shape)[-1]))


def toeplitz_scatter(weights, index, m, *, out=None):
    """numba.cuda ``toeplitz_scatter``."""
    shape = guard_scatter(weights, index, m, out)
    config = _scatter_grid(shape, tuple(weights.shape)[-1])
    return _launch(kernel_key("scatter", weights), config, weights, _arrays.device_view(weights), shape, out, len(shape) - 2, _index(index, m))
