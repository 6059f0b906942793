"""Numba CPU kernels of a planned T5 / ALiBi bias (``posenc.relative._decode``): per-token positions, or one row by offset.

A plan of ``t5_bias`` / ``alibi_bias`` keeps the per-distance *sources* of a window of
distances ``hi, hi - 1, .., lo`` (T5's bucket of each distance, ALiBi's negated distance in
the compute dtype: ``relative._decode.CachedRow``). With per-token positions the bias entry
``[b, h, i, j]`` is the kind's value at ``rel = (offset + q[b, i]) - k[b, j]``, that is the
kept source at ``t = hi - rel = (shift - q[b, i]) + k[b, j]`` with ``shift = hi - offset``,
finished with the parameters:

* T5: ``out[b, h, i, j] = table[sources[t], h]``, a copy (moved as bits: one kernel per
  element size, 16-bit floats included);
* ALiBi: ``out[b, h, i, j] = slopes[h] * sources[t]``, float32 or float64, the product the
  reference (``relative.biases._alibi_scaled``) takes in that dtype.

A decode step's row by a scalar offset is the case of one query at 0 whose ``shift`` is the
row's first index in the window (``Launcher.row``: ``BiasPlan``).

One pass reads each pair's index once and writes the ``[batch, heads, q, k]`` result in
place of the reference's ``rel`` matrix, gather, product and transposition. A kernel checks
every value it indexes with: positions within ``(-2**62, 2**62)``, ``offset + q`` within
int64, ``t`` inside the window and a bucket inside the table. It returns False at the first
value outside (the result is then discarded and the plan's general path, or the full path,
judges the call), so no index it forms wraps and none reads out of bounds; and it reads
nothing when its arrays' shapes disagree.

A kernel fills the query rows ``first .. last - 1`` (row ``b * q_len + i``; ``last`` past
the result's rows: up to its last): a large call's rows are split over
``_layout.run_tasks``'s threads, each element computed alike whatever the split. A call
of less than ``2 * _BYTES_PER_THREAD`` (a decode step's row) is one direct call on the
calling thread.
"""

from __future__ import annotations

import copy
import math

import numba
import numpy as np
from numba import njit, types

from . import _arrays, _family, _layout

# Output bytes per thread. The kernel writes 4-5 GB/s on one core of the 2-core build machine
# (a fifth of ``ndarray.fill``'s bandwidth: it gathers), and a second thread's start and join
# cost about 40 us: under a tenth of the smallest split call's (4 MiB) when no core is free.
_BYTES_PER_THREAD = 1 << 21

_LIMIT = 2**62
_INT64_MAX = 2**63 - 1
_INT64_MIN = -(2**63)


@njit(inline="always")
def _row_index(shift, offset, q, kpos, n, index):
    """``index[j] = (shift - q) + kpos[j]`` when every one is in ``[0, n)`` and the rules above hold."""
    if not -_LIMIT < q < _LIMIT:
        return False
    if offset >= 0:
        if q > _INT64_MAX - offset:
            return False
    elif q < _INT64_MIN - offset:
        return False
    start = shift - q  # |shift| < 2**62 (the launcher's check): no wrap
    if not -_LIMIT < start < _LIMIT:
        return False
    for j in range(kpos.shape[0]):
        k = kpos[j]
        if not -_LIMIT < k < _LIMIT:
            return False
        t = start + k
        if t < 0 or t >= n:
            return False
        index[j] = t
    return True


@njit(inline="always")
def _shapes_agree(heads, qpos, kpos, out, first):
    """Whether ``out [B, heads, q, k]``, ``qpos [B, q]`` and ``kpos [B, k]`` agree and ``first``
    is a row (else nothing is read)."""
    batch, h, q_len, k_len = out.shape
    agree = h == heads and qpos.shape[0] == batch and kpos.shape[0] == batch and qpos.shape[1] == q_len and kpos.shape[1] == k_len
    return agree and first >= 0


def _t5(table, buckets, shift, offset, qpos, kpos, out, first, last):
    """``out[b, h, i, j] = table[buckets[(shift - qpos[b, i]) + kpos[b, j]], h]`` for rows ``b * q_len + i`` in ``first .. last - 1`` (at most the last row)."""
    if not _shapes_agree(table.shape[1], qpos, kpos, out, first):
        return False
    batch, heads, q_len, k_len = out.shape
    index = np.empty(k_len, np.int64)
    rows = table.shape[0]
    columns = np.empty((heads, rows), table.dtype)  # each head's entries contiguous: gathered from the cache
    for h in range(heads):
        for r in range(rows):
            columns[h, r] = table[r, h]
    for r in range(first, min(last, batch * q_len)):
        b = r // q_len
        i = r - b * q_len
        if not _row_index(shift, offset, qpos[b, i], kpos[b], buckets.shape[0], index):
            return False
        for j in range(k_len):
            bucket = buckets[index[j]]
            if bucket < 0 or bucket >= rows:
                return False
            index[j] = bucket
        for h in range(heads):
            column = columns[h]
            dst = out[b, h, i]
            for j in range(k_len):
                dst[j] = column[index[j]]
    return True


def _alibi(slopes, distance, shift, offset, qpos, kpos, out, first, last):
    """``out[b, h, i, j] = slopes[h] * distance[(shift - qpos[b, i]) + kpos[b, j]]`` for rows ``b * q_len + i`` in ``first .. last - 1`` (at most the last row)."""
    if not _shapes_agree(slopes.shape[0], qpos, kpos, out, first):
        return False
    batch, heads, q_len, k_len = out.shape
    index = np.empty(k_len, np.int64)
    row = np.empty(k_len, distance.dtype)
    for r in range(first, min(last, batch * q_len)):
        b = r // q_len
        i = r - b * q_len
        if not _row_index(shift, offset, qpos[b, i], kpos[b], distance.shape[0], index):
            return False
        for j in range(k_len):
            row[j] = distance[index[j]]
        for h in range(heads):
            slope = slopes[h]
            dst = out[b, h, i]
            for j in range(k_len):
                dst[j] = slope * row[j]
    return True


# (kind, element): T5 copies bits of the table's element size, ALiBi computes in its float dtype.
KEYS = [("t5", "int16"), ("t5", "int32"), ("t5", "int64"), ("alibi", "float32"), ("alibi", "float64")]
_SERVES = {"int16": {"float16", "bfloat16"}, "int32": {"float32"}, "int64": {"float64"}, "float32": {"float32"}, "float64": {"float64"}}


def _build(kind, element):
    t = numba.from_dtype(np.dtype(element))
    positions = types.Array(types.int64, 2, "A", readonly=True)
    if kind == "t5":
        params, sources = types.Array(t, 2, "A", readonly=True), types.Array(types.int64, 1, "C", readonly=True)
    else:
        params, sources = types.Array(t, 1, "A", readonly=True), types.Array(t, 1, "C", readonly=True)
    signature = types.boolean(params, sources, types.int64, types.int64, positions, positions, types.Array(t, 4, "C"), types.int64, types.int64)
    return _family.jitted(njit, _t5 if kind == "t5" else _alibi, signature, nogil=True)


FAMILY = _family.Family("bias_rows_cpu", _build, KEYS, lambda key: _SERVES[key[1]], prepare=_family.start_numba_cpu)


def element(kind, dtype_name):
    """The kernel element of a ``kind`` plan whose parameters are ``dtype_name``, or None (no kernel)."""
    if kind == "t5":
        return {"float16": "int16", "bfloat16": "int16", "float32": "int32", "float64": "int64"}.get(dtype_name)
    return dtype_name if kind == "alibi" and dtype_name in ("float32", "float64") else None


class Launcher:
    """One plan's kernel and the NumPy views it reads: ``params`` of the plan's signature
    (NumPy, or torch CPU tensors viewed without a copy), the positions, and the result in
    ``params``' library and dtype. Built once per plan (with its kernel).

    ``__call__``: per-token positions, int64 of the shapes ``query_shape`` / ``key_shape``
    (``[..., q_len]`` / ``[..., k_len]`` whose leading axes broadcast to ``batch``), or None
    for the plan's own ``ranges`` (``arange(q_len)`` / ``arange(k_len)``, NumPy or torch CPU,
    read without a copy); the result ``[*batch, heads, q_len, k_len]``. ``row``: one query
    row of any length up to a plan's window (``BiasPlan``), ``[heads, 1, k_len]``."""

    def __init__(self, kind, params, heads, batch=(), q_len=1, k_len=0, query_shape=None, key_shape=None, ranges=(None, None)):
        name = _arrays.dtype_name(params.dtype)
        self.element = element(kind, name)
        self.kernel = FAMILY[(kind, self.element)]
        self.heads, self.shape = heads, (*batch, heads, q_len, k_len)
        if type(params) is np.ndarray:
            self.result, self.wrap = params.dtype, None
        else:  # a NumPy result under a torch tensor; torch's bfloat16 (NumPy has none) as its bits
            import torch

            self.result = np.dtype(self.element if name == "bfloat16" else name)
            self.wrap = (lambda r: torch.from_numpy(r).view(torch.bfloat16)) if name == "bfloat16" else torch.from_numpy
        self.view_result = self.result != self.element
        self.params = _params_reader(params, self.element)
        rows = math.prod(batch)
        self.queries, self.keys = (
            _rows_reader(shape, batch, length)
            if shape is not None
            else np.broadcast_to(np.arange(length, dtype=np.int64) if arange is None else _arrays.host_view(arange), (rows, length))
            for shape, length, arange in zip((query_shape, key_shape), (q_len, k_len), ranges)
        )
        self.sources = (None, None)  # the plan's sources and their NumPy view
        self.row_keys = np.arange(0, dtype=np.int64)[None]  # a row's key indices, grown as rows grow
        self.one_query = not batch and query_shape is not None and tuple(query_shape) == (1,)  # a decode step's [position]
        self.key_shape = key_shape

    def of_length(self, k_len, keys):
        """This launcher for ``k_len`` keys: key positions of its leading axes and ``k_len``
        entries, or ``keys``, the plan's ``arange(k_len)`` where they are left out."""
        launcher = copy.copy(self)
        *batch, heads, q_len, _ = self.shape
        launcher.shape = (*batch, heads, q_len, k_len)
        if self.key_shape is not None:
            launcher.key_shape = (*self.key_shape[:-1], k_len)
            launcher.keys = _rows_reader(launcher.key_shape, batch, k_len)
        else:
            launcher.keys = np.broadcast_to(_arrays.host_view(keys), (math.prod(batch), k_len))
        return launcher

    def __call__(self, params, sources, shift, offset, query_positions, key_positions):
        """The bias, or None where a value lies outside what the kernel takes (see the module docstring)."""
        kpos = self.keys if key_positions is None else self.keys(key_positions)
        if self.one_query:  # the kernel's query checks here, its one index start as the shift
            q = query_positions.item()
            if not (-_LIMIT < q < _LIMIT and _INT64_MIN <= offset + q <= _INT64_MAX):
                return None
            return self._run(params, sources, shift - q, 0, _FIRST, kpos, self.shape)
        qpos = self.queries if query_positions is None else self.queries(query_positions)
        return self._run(params, sources, shift, offset, qpos, kpos, self.shape)

    def row(self, params, sources, start, k_len):
        """``[heads, 1, k_len]`` of the sources ``start .. start + k_len - 1``, or None past their end."""
        keys = self.row_keys
        if keys.shape[1] < k_len:  # (at most a window's 2**16 distances: relative._decode.HELD)
            keys = self.row_keys = np.arange(max(k_len, min(2 * keys.shape[1], 2**16)), dtype=np.int64)[None]
        return self._run(params, sources, start, 0, _FIRST, keys[:, :k_len], (self.heads, 1, k_len))

    def _run(self, params, sources, shift, offset, qpos, kpos, shape):
        if not -_LIMIT < shift < _LIMIT:
            return None
        held = self.sources  # (one read: another thread may keep other sources meanwhile)
        if held[0] is not sources:
            held = self.sources = (sources, sources if type(sources) is np.ndarray else sources.numpy())
        result = np.empty(shape, self.result)
        merged = result.reshape(-1, *shape[-3:])
        params = params if self.params is None else self.params(params)
        out = merged.view(self.element) if self.view_result else merged
        if merged.nbytes < 2 * _BYTES_PER_THREAD:  # (a decode step's row: one direct call, every row)
            done = self.kernel(params, held[1], shift, offset, qpos, kpos, out, 0, _INT64_MAX)
        else:
            workers = min(_layout.threads(), merged.nbytes // _BYTES_PER_THREAD)
            done = all(_layout.run_tasks(self.kernel, (params, held[1], shift, offset, qpos, kpos, out), merged.shape[0] * merged.shape[2], workers))
        if not done:
            return None
        return result if self.wrap is None else self.wrap(result)


_FIRST = np.zeros((1, 1), np.int64)  # one query at 0: a row's index is its start plus the key's


def _params_reader(params, element):
    """``params`` (NumPy, or a torch CPU tensor) as the NumPy array of ``element`` the kernel
    reads (``_arrays.host_reader``, then viewed as ``element``); None for NumPy parameters
    the kernel reads as they are."""
    read = _arrays.host_reader(params)
    if _arrays.host_view(params).dtype == element:
        return None if read is _arrays.same else read
    if read is _arrays.same:
        return lambda a: a.view(element)
    return lambda a: read(a).view(element)


def _rows_reader(shape, batch, length):
    """int64 positions of ``shape`` (NumPy or torch CPU, never tracking gradients) as
    ``[prod(batch), length]``, a view where one serves: broadcast only where their leading
    axes are not the batch's already."""
    if tuple(shape) == (*batch, length):
        return lambda p: (p if type(p) is np.ndarray else p.numpy()).reshape(-1, length)
    return lambda p: np.broadcast_to(_arrays.host_view(p), (*batch, length)).reshape(-1, length)
