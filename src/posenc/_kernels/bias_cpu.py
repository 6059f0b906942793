"""Numba CPU kernels of the Toeplitz ops (references in ``posenc.relative._toeplitz``).

Every output row is a slice of a per-distance vector: with ``t = i - j + k_len - 1``,
row ``i`` reads ``vec[i + k_len - 1]`` down to ``vec[i]``. Reversing the ``O(L)`` vector
once (``rev[s] = vec[n - 1 - s]``) turns that into the forward slice
``rev[q_len - 1 - i : q_len - 1 - i + k_len]``, so each row is one contiguous copy and
the whole op is one parallel write pass over the output: no ``O(L^2)`` temporary, peak
memory the output itself (or nothing new with ``out=``).

Kernels take ``(inputs..., out)`` with the batch axes merged into one; launchers check the
arguments, allocate (``torch.empty`` for torch tensors, ``numpy.empty`` otherwise), view
torch CPU tensors as NumPy without copying, and move 16-bit floats as ``uint16``
payloads (bit-exact copies; ``scatter`` widens them to float32 to sum).
"""

from __future__ import annotations

import contextlib

import numba
import numpy as np
from numba import njit, prange

from . import _bias_bits, _bias_checks
from ._bias_arrays import batched, dtype_name, empty_like_kind, host_payload

# Output bytes per thread. The ops are memory-bound: on the 2-core build machine one thread
# already writes at ``ndarray.fill``'s bandwidth (16 x 2048 x 2048 float32 expand: 18 ms on
# one thread, 20-41 ms on two when other processes share the cores, fill 15 ms), so a second
# thread only joins for outputs of a GiB or more.
_BYTES_PER_THREAD = 1 << 29

_float16_to_float32 = njit(cache=True)(_bias_bits.float16_to_float32)
_float32_to_float16 = njit(cache=True)(_bias_bits.float32_to_float16)
_bfloat16_to_float32 = njit(cache=True)(_bias_bits.bfloat16_to_float32)
_float32_to_bfloat16 = njit(cache=True)(_bias_bits.float32_to_bfloat16)


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


@njit(parallel=True, cache=True)
def _scatter(weights, rev_index, acc, out):
    """``out[b, i, c] = sum of weights[b, i, j] over j with rev_index[q_len - 1 - i + j] == c``.

    ``acc`` holds one accumulator row per parallel chunk of rows (float64 for float32
    and float64 weights), so no thread writes into another's row.
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
                total[idx[j]] += w[j]
            dst = out[b, i]
            for c in range(dst.shape[0]):
                dst[c] = total[c]


@njit(parallel=True, cache=True)
def _scatter_16(weights, rev_index, bfloat16, acc, out):
    """``_scatter`` for float16 / bfloat16 payloads: summed in float32, rounded once."""
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
                total[idx[j]] += _bfloat16_to_float32(w[j]) if bfloat16 else _float16_to_float32(w[j])
            dst = out[b, i]
            for c in range(dst.shape[0]):
                dst[c] = _float32_to_bfloat16(total[c]) if bfloat16 else _float32_to_float16(total[c])


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
    index = host_payload(index)
    if index.size:
        _bias_checks.index_range((int(index.min()), int(index.max())), m)
    return np.ascontiguousarray(index[::-1], dtype=np.intp)


def toeplitz_expand(vec, q_len, k_len, *, out=None):
    """Numba CPU ``toeplitz_expand``: NumPy arrays and torch CPU tensors."""
    shape = _bias_checks.expand(vec, q_len, k_len, out)
    result = empty_like_kind(vec, shape) if out is None else out
    if 0 in shape:
        return result
    payload = host_payload(vec)
    rev = np.ascontiguousarray(payload[..., ::-1])
    out_payload = host_payload(result)
    with _threads_for(out_payload.nbytes):
        batched(_expand, [rev, out_payload], vec.ndim - 1)
    return result


def toeplitz_gather(scores, index, k_len, *, out=None):
    """Numba CPU ``toeplitz_gather``: NumPy arrays and torch CPU tensors."""
    shape = _bias_checks.gather(scores, index, k_len, out)
    result = empty_like_kind(scores, shape) if out is None else out
    if 0 in shape:
        return result
    rev_index = _reversed_index(index, scores.shape[-1])
    out_payload = host_payload(result)
    with _threads_for(out_payload.nbytes):
        batched(lambda s, o: _gather(s, rev_index, o), [host_payload(scores), out_payload], scores.ndim - 2)
    return result


def toeplitz_scatter(weights, index, m, *, out=None):
    """Numba CPU ``toeplitz_scatter``: NumPy arrays and torch CPU tensors."""
    shape = _bias_checks.scatter(weights, index, m, out)
    result = empty_like_kind(weights, shape) if out is None else out
    if 0 in shape:
        return result
    rev_index = _reversed_index(index, m)
    name = dtype_name(weights.dtype)
    rows = int(np.prod(shape[:-1]))
    chunks = min(rows, 4 * numba.get_num_threads())
    acc = np.empty((chunks, m), dtype=np.float32 if name in ("float16", "bfloat16") else np.float64)

    def launch(w, o):
        if name in ("float16", "bfloat16"):
            _scatter_16(w, rev_index, name == "bfloat16", acc, o)
        else:
            _scatter(w, rev_index, acc, o)

    weights_payload = host_payload(weights)
    with _threads_for(weights_payload.nbytes):
        batched(launch, [weights_payload, host_payload(result)], weights.ndim - 2)
    return result
