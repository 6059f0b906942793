"""Numba CPU kernels of the Toeplitz ops (references in ``posenc.relative._toeplitz``).

Every output row is a slice of a per-distance vector: with ``t = i - j + k_len - 1``,
row ``i`` reads ``vec[i + k_len - 1]`` down to ``vec[i]``. Reversing the ``O(L)`` vector
once (``rev[s] = vec[n - 1 - s]``) turns that into the forward slice
``rev[q_len - 1 - i : q_len - 1 - i + k_len]``, so each row is one contiguous copy and
the whole op is one parallel write pass over the output: no ``O(L^2)`` temporary, peak
memory the output itself (or nothing new with ``out=``).

Kernels take ``(inputs..., out)`` with the batch axes merged into one; launchers check the
arguments, allocate (``torch.empty`` for torch tensors, ``numpy.empty`` otherwise), view
torch CPU tensors as NumPy without copying, and move 16-bit floats as ``uint16`` bits
(``_codec``): copies are bit-exact; ``scatter`` sums every dtype in float64 and rounds once.
"""

from __future__ import annotations

import contextlib

import numba
import numpy as np
from numba import njit, prange

from . import _bias_checks, _codec
from ._bias_arrays import batched, empty_like_kind
from ._host import float_kind, numpy_view

# Output bytes per thread. The ops are memory-bound: on the 2-core build machine one thread
# already writes at ``ndarray.fill``'s bandwidth (16 x 2048 x 2048 float32 expand: 18 ms on
# one thread, 20-41 ms on two when other processes share the cores, fill 15 ms), so a second
# thread only joins for outputs of a GiB or more.
_BYTES_PER_THREAD = 1 << 29

_load = njit(cache=True, inline="always")(_codec.load)
_store = njit(cache=True, inline="always")(_codec.store)


@njit(parallel=True, cache=True)
def _expand(rev, out):
    """``out[b, i, j] = rev[b, q_len - 1 - i + j]``."""
    batch, q_len, k_len = out.shape
    for row in prange(batch * q_len):
        b = row // q_len
        i = row - b * q_len
        src = rev[b, q_len - 1 - i : q_len - 1 - i + k_len]
        dst = out[b, i]
        for j in range(k_len):
            dst[j] = src[j]


@njit(parallel=True, cache=True)
def _gather(scores, rev_index, out):
    """``out[b, i, j] = scores[b, i, rev_index[q_len - 1 - i + j]]``."""
    batch, q_len, k_len = out.shape
    for row in prange(batch * q_len):
        b = row // q_len
        i = row - b * q_len
        idx = rev_index[q_len - 1 - i : q_len - 1 - i + k_len]
        src = scores[b, i]
        dst = out[b, i]
        for j in range(k_len):
            dst[j] = src[idx[j]]


@njit(cache=True, inline="always")
def _scatter(weights, rev_index, kind, acc, out):
    """``out[b, i, c] = sum of weights[b, i, j] over j with rev_index[q_len - 1 - i + j] == c``.

    Elements are stored as ``kind`` (``_codec``), summed in float64 and rounded once.
    ``acc`` holds one float64 accumulator row per parallel chunk of rows, so no thread
    writes into another's row.
    """
    batch, q_len, k_len = weights.shape
    rows = batch * q_len
    chunks = acc.shape[0]
    for chunk in prange(chunks):
        total = acc[chunk]
        for row in range(chunk * rows // chunks, (chunk + 1) * rows // chunks):
            b = row // q_len
            i = row - b * q_len
            idx = rev_index[q_len - 1 - i : q_len - 1 - i + k_len]
            w = weights[b, i]
            total[:] = 0.0
            for j in range(k_len):
                total[idx[j]] += _load(w[j], kind)
            dst = out[b, i]
            for c in range(dst.shape[0]):
                _store(dst, c, total[c], kind)


# One entry point per storage kind: ``kind`` is a constant in each inlined ``_scatter``,
# so each compiles only its own conversions.
@njit(parallel=True, cache=True)
def _scatter_float(weights, rev_index, acc, out):
    """``_scatter`` of float32 or float64 elements."""
    _scatter(weights, rev_index, _codec.FLOAT, acc, out)


@njit(parallel=True, cache=True)
def _scatter_float16(weights, rev_index, acc, out):
    """``_scatter`` of float16 bits."""
    _scatter(weights, rev_index, _codec.FLOAT16, acc, out)


@njit(parallel=True, cache=True)
def _scatter_bfloat16(weights, rev_index, acc, out):
    """``_scatter`` of bfloat16 bits."""
    _scatter(weights, rev_index, _codec.BFLOAT16, acc, out)


_SCATTER = {_codec.FLOAT: _scatter_float, _codec.FLOAT16: _scatter_float16, _codec.BFLOAT16: _scatter_bfloat16}


@contextlib.contextmanager
def _threads_for(nbytes):
    """Run the enclosed kernels on ``nbytes / _BYTES_PER_THREAD`` threads (at least one)."""
    previous = numba.get_num_threads()
    numba.set_num_threads(max(1, min(previous, nbytes // _BYTES_PER_THREAD)))
    try:
        yield
    finally:
        numba.set_num_threads(previous)


def _reversed_index(index, m):
    """``index[::-1]`` as contiguous intp, after checking its values lie in ``[0, m)``."""
    index = numpy_view(index)
    if index.size:
        _bias_checks.index_range((int(index.min()), int(index.max())), m)
    return np.ascontiguousarray(index[::-1], dtype=np.intp)


def toeplitz_expand(vec, q_len, k_len, *, out=None):
    """Numba CPU ``toeplitz_expand``: NumPy arrays and torch CPU tensors."""
    shape = _bias_checks.expand(vec, q_len, k_len, out)
    result = empty_like_kind(vec, shape) if out is None else out
    if 0 in shape:
        return result
    rev = np.ascontiguousarray(numpy_view(vec)[..., ::-1])
    out_view = numpy_view(result)
    with _threads_for(out_view.nbytes):
        batched(_expand, [rev, out_view], vec.ndim - 1)
    return result


def toeplitz_gather(scores, index, k_len, *, out=None):
    """Numba CPU ``toeplitz_gather``: NumPy arrays and torch CPU tensors."""
    shape = _bias_checks.gather(scores, index, k_len, out)
    result = empty_like_kind(scores, shape) if out is None else out
    if 0 in shape:
        return result
    rev_index = _reversed_index(index, scores.shape[-1])
    out_view = numpy_view(result)
    with _threads_for(out_view.nbytes):
        batched(lambda s, o: _gather(s, rev_index, o), [numpy_view(scores), out_view], scores.ndim - 2)
    return result


def toeplitz_scatter(weights, index, m, *, out=None):
    """Numba CPU ``toeplitz_scatter``: NumPy arrays and torch CPU tensors."""
    shape = _bias_checks.scatter(weights, index, m, out)
    result = empty_like_kind(weights, shape) if out is None else out
    if 0 in shape:
        return result
    rev_index = _reversed_index(index, m)
    kernel = _SCATTER[float_kind(weights)]
    rows = int(np.prod(shape[:-1]))
    acc = np.empty((min(rows, 4 * numba.get_num_threads()), m))
    weights_view = numpy_view(weights)
    with _threads_for(weights_view.nbytes):
        batched(lambda w, o: kernel(w, rev_index, acc, o), [weights_view, numpy_view(result)], weights.ndim - 2)
    return result
