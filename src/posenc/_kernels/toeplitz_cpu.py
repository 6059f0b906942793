"""Numba CPU kernels of the Toeplitz ops (references in ``posenc.relative._toeplitz``).

Every output row is a slice of a per-distance vector: with ``t = i - j + k_len - 1``,
row ``i`` reads ``vec[i + k_len - 1]`` down to ``vec[i]``. Reversing the ``O(L)`` vector
once (``rev[s] = vec[n - 1 - s]``) turns that into the forward slice
``rev[q_len - 1 - i : q_len - 1 - i + k_len]``, so each row is one contiguous copy and
the whole op is one write pass over the output: no ``O(L^2)`` temporary, peak memory the
output itself (or nothing new with ``out=``).

Kernels take ``(inputs..., out, first, last)``: rows ``first .. last - 1`` of the batch
axes merged into one (``_layout.batch_views``). Expand and gather copy bits, so they are
specialised by element size only (float16 and bfloat16 share one kernel, bit-exact);
scatter sums every dtype in float64 and rounds once (``_codec``). Each specialisation
compiles on first use (``FAMILY``) and runs on ``_layout.run_tasks``'s threads. Launchers
allocate (NumPy memory, also under torch tensors) and view torch CPU tensors as NumPy
without copying.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import njit, types

from . import _arrays, _codec, _family, _layout
from .toeplitz import SPECIALISATIONS, guard_expand, guard_gather, guard_index_values, guard_scatter, kernel_key, serves

# Output bytes per thread. The ops are memory-bound: on the 2-core build machine one thread
# already writes at ``ndarray.fill``'s bandwidth (16 x 2048 x 2048 float32 expand: 18 ms on
# one thread, 20-41 ms on two when other processes share the cores, fill 15 ms), so a second
# thread only joins for outputs of a GiB or more.
_BYTES_PER_THREAD = 1 << 29

# Inlined into each scatter specialisation, whose constant storage prunes the other
# storages' branches before anything is compiled.
_load = njit(inline="always")(_codec.load)
_store = njit(inline="always")(_codec.store)


def _expand(rev, out, first, last):
    """``out[b, i, j] = rev[b, q_len - 1 - i + j]`` for rows ``b * q_len + i`` in ``first .. last - 1``."""
    q_len, k_len = out.shape[1], out.shape[2]
    for row in range(first, last):
        b = row // q_len
        i = row - b * q_len
        src = rev[b, q_len - 1 - i : q_len - 1 - i + k_len]
        dst = out[b, i]
        for j in range(k_len):
            dst[j] = src[j]


def _gather(scores, rev_index, out, first, last):
    """``out[b, i, j] = scores[b, i, rev_index[q_len - 1 - i + j]]``."""
    q_len, k_len = out.shape[1], out.shape[2]
    for row in range(first, last):
        b = row // q_len
        i = row - b * q_len
        idx = rev_index[q_len - 1 - i : q_len - 1 - i + k_len]
        src = scores[b, i]
        dst = out[b, i]
        for j in range(k_len):
            dst[j] = src[idx[j]]


def _scatter_source(storage, helpers):
    """The scatter kernel of elements held as ``storage`` (a constant of the closure;
    ``helpers``: see ``_family.source_digest``)."""

    def scatter(weights, rev_index, out, first, last):
        """``out[b, i, c] = sum of weights[b, i, j] over j with rev_index[q_len - 1 - i + j] == c``,
        summed in float64 and rounded once."""
        helpers  # noqa: B018  (in the closure: Numba's cache key follows _codec)
        q_len, k_len = weights.shape[1], weights.shape[2]
        total = np.empty(out.shape[2])
        for row in range(first, last):
            b = row // q_len
            i = row - b * q_len
            idx = rev_index[q_len - 1 - i : q_len - 1 - i + k_len]
            w = weights[b, i]
            total[:] = 0.0
            for j in range(k_len):
                total[idx[j]] += _load(w[j], storage)
            dst = out[b, i]
            for c in range(dst.shape[0]):
                _store(dst, c, total[c], storage)

    return scatter


def _build(op, name, layout):
    """``name``: the unsigned integer type whose bits the copies move, or the float dtype scatter
    sums. ``layout``: ``"C"`` for batch views that are C-contiguous (rows then copy as one
    vector loop: a fifth faster than through strides), ``"A"`` for any other."""
    t = numba.from_dtype(np.dtype(name if op != "scatter" else _arrays.ELEMENT[name]))
    values, out = types.Array(t, 3, layout, readonly=True), types.Array(t, 3, layout)
    rows = (types.int64, types.int64)
    if op == "expand":
        return _family.jitted(njit, _expand, types.void(types.Array(t, 2, layout, readonly=True), out, *rows), nogil=True)
    index = types.Array(types.intp, 1, "C", readonly=True)
    source = _gather if op == "gather" else _scatter_source(_arrays.STORAGE[name], _family.source_digest(_codec))
    return _family.jitted(njit, source, types.void(values, index, out, *rows), nogil=True)


# ``posenc.warmup`` builds the contiguous kernels; strided ones build when a call needs them.
FAMILY = _family.Family("toeplitz_cpu", _build, [(*key, "C") for key in SPECIALISATIONS], serves, prepare=_family.start_numba_cpu)


def _launch(op, values, shape, out, source, view, extra=lambda: ()):
    """``op``'s kernel from ``source`` (the kernel's NumPy view of ``values``) into ``out`` (None:
    a new array of ``shape``, viewed by ``view``), over every row of the batch axes; ``extra()``
    gives the arguments between the two, once the result is known not to be empty."""
    result = _arrays.empty(values, shape) if out is None else out
    if 0 in shape:
        return result
    key = kernel_key(op, values)
    source, written = _arrays.addressable(source), view(result)
    target = _arrays.addressable(written)  # (an out it cannot address: written aside, then copied in)
    arguments = extra()
    workers = min(_layout.threads(), max(1, target.nbytes // _BYTES_PER_THREAD))
    for source_b, target_b in _layout.batch_views([source, target], len(shape) - 2):
        layout = "C" if source_b.flags.c_contiguous and target_b.flags.c_contiguous else "A"
        _layout.run_tasks(FAMILY[(*key, layout)], (source_b, *arguments, target_b), target_b.shape[0] * target_b.shape[1], workers)
    if target is not written:
        np.copyto(written, target)
    return result


def _bits(a):
    """``a``'s NumPy view as unsigned integers of its width (copies move bits)."""
    view = _arrays.host_view(a)
    return view.view(f"u{view.dtype.itemsize}")


def _reversed_index(index, m):
    """``index[::-1]`` as contiguous intp, after checking its values lie in ``[0, m)``."""
    index = _arrays.host_values(index)
    if index.size:
        guard_index_values(index, m)
    return np.ascontiguousarray(index[::-1], dtype=np.intp)


def toeplitz_expand(vec, q_len, k_len, *, out=None):
    """Numba CPU ``toeplitz_expand``: NumPy arrays and torch CPU tensors."""
    shape = guard_expand(vec, q_len, k_len, out)
    reversed_bits = np.ascontiguousarray(_bits(vec)[..., ::-1])  # O(L): the kernel reads forward slices
    return _launch("expand", vec, shape, out, reversed_bits, _bits)


def toeplitz_gather(scores, index, k_len, *, out=None):
    """Numba CPU ``toeplitz_gather``: NumPy arrays and torch CPU tensors."""
    shape = guard_gather(scores, index, k_len, out)
    return _launch("gather", scores, shape, out, _bits(scores), _bits, lambda: (_reversed_index(index, scores.shape[-1]),))


def toeplitz_scatter(weights, index, m, *, out=None):
    """Numba CPU ``toeplitz_scatter``: NumPy arrays and torch CPU tensors."""
    shape = guard_scatter(weights, index, m, out)
    return _launch("scatter", weights, shape, out, _arrays.host_view(weights), _arrays.host_view, lambda: (_reversed_index(index, m),))
