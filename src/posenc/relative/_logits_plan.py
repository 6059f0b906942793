"""Plans of ``shaw_logits`` and ``deberta_logits`` at decode-step and small-prefill sizes: the call's arithmetic, straight.

``shaw_logits`` is ``q @ k.T`` plus ``q @ table_k.T`` gathered at ``clip(rel, -K, K) + K``;
``deberta_logits`` adds ``q @ pos_k.T`` and ``k @ pos_q.T`` gathered at DeBERTa's
``delta(rel)`` (``biases.deberta_index``) and divides by ``sqrt((1 + len(terms)) d)``. A
planned call does those operations on the call's own arrays in the library's own
functions (NumPy; torch, so gradients flow as they do on the full path): the same casts,
the same products, sums and division, in the same order; only the gathers' index is
formed differently, and a gather copies values, so every entry is the full path's, bit
for bit. A torch call that autograd records gathers per distance through the full path's
``toeplitz_gather``, whose backward (``toeplitz_scatter``, summed in float64) torch's
``gather`` would not equal: the gradients are the full path's too. With a scalar ``offset``,
``rel = offset + i - j`` from the plan's own ``i - j`` (per distance: ``offset + t - (k_len
- 1)``);
with per-token positions, ``rel = (offset + query_positions[..., i]) -
key_positions[..., j]`` of this call's positions. Positions of one batch entry (or none)
give one ``[q, k]`` index for every batch entry and head, read in one pass (NumPy: a
``take`` from the flattened scores; torch: ``gather``); positions with a batch are
gathered by the full path's ``_per_token.gather``.

One ``offset`` per batch row (``[...]``, the logits' leading axes but the heads, no
positions) is the per-token call of ``offset[..., None] + arange(q_len)``: row ``b``'s
index is the table row of ``offset[b] + i - j``, ``[rows, q_len, k_len]``, formed on the
host. Where the rows' distances, from the greatest offset's last query down to the least
offset's first key, are no more than their pairs (offsets close together) the table row
of each distance is found once and each row's index is a window of those; else each pair's
is found. The projected scores are then read at each row's index, every row's products
the whole batch's, as in the call of its own offset (so row ``b`` is that call's, to the
bit, whatever the framework's matmul does with a batch): NumPy one ``take`` per row, torch
one ``gather``; a torch call that autograd records takes the full path (``_rows``: its
per-row Toeplitz kernels' adjoints are its gradient). NumPy arrays whose keys cast to
the compute dtype, or whose ``k @ pos_q.T``, pass ``CHUNK`` bytes are computed a chunk of
rows at a time (``_chunked``): NumPy's matmul multiplies each matrix alone, so a chunk's
products are its rows' part of the whole batch's; torch's batched products are not
(docs/precision.md), and a torch call keeps the whole batch's, and its intermediates.

Values are checked as the full path checks them, in one pass: integer positions and
``offset`` whose sums could leave int64 (int64 or uint64 positions, an offset within
``2**62`` of the limits) are read for their extremes, and a call where a sum might leave
it takes the full path and its error. Calls of more than ``LARGEST`` query-key pairs are
not planned (their products and gathers dwarf the checks a plan skips).
"""

from __future__ import annotations

import math

import numpy as np

from .. import _dispatch
from .._kernels import _arrays
from .._xp import broadcast_shapes, namespace
from . import _args, _per_token
from ._decode import _WINDOWS, as_int64, fits_int64
from .biases import deberta_index, deberta_options
from .deberta import canonical_terms

LARGEST = 2**16  # query-key pairs: the plan's own i - j (offset calls) stay within 512 KiB
CHUNK = 2**22  # bytes of intermediates (keys cast, products) of a chunk of rows (one offset per batch row)
_NEAR = 2**62


class LogitsPlan:
    """What the relative logits share: the call's casts, its relative positions (the plan's
    own ``i - j`` shifted by the ``offset``, or this call's positions) and the gathers of
    projected scores at table rows of them. ``tables``: the float arrays besides ``q``, ``k``."""

    def __init__(self, q, k, tables, query_positions, key_positions, rows=None):
        self.torch = type(q).__module__.startswith("torch")
        self.xp = xp = namespace(q, k, *tables)
        self.dtype, self.work = _args.dtypes(xp, q, k, *tables)
        q_len, k_len = int(q.shape[-2]), int(k.shape[-2])
        self.starts = {}
        self.per_token = _per_token.given(query_positions, key_positions)
        self.recording = self.torch and any(_arrays.tracks_gradient(a) for a in (q, k, *tables))
        self.rows, self.shape, self.chunk = rows, None, None
        if rows is not None:  # the offsets' axes, the logits' leading ones but the heads (rows_planned)
            self.ij, self.count, self.shapes = np.arange(q_len)[:, None] - np.arange(k_len), math.prod(rows), {}
            return
        if not self.per_token:
            self.ij = self._own(np.arange(-(k_len - 1), q_len) if self.recording else np.arange(q_len)[:, None] - np.arange(k_len))
            return
        self.default_offset = 0 if query_positions is not None else k_len - q_len
        self.aranges = tuple(self._own(np.arange(n)) if p is None else None for p, n in ((query_positions, q_len), (key_positions, k_len)))
        kinds = [_arrays.integer_kind(p) for p in (query_positions, key_positions)]
        self.widen = tuple(kind in ("narrow", "uint64") for kind in kinds)
        self.wide = "int64" in kinds or "uint64" in kinds
        self.heads = q.ndim >= 3
        batch = broadcast_shapes(*(tuple(p.shape[:-1]) for p in (query_positions, key_positions) if p is not None))
        index_batch = (*batch, 1) if self.heads else batch
        # Positions of one batch entry: one [q, k] index for every (batch, head) of the scores.
        self.single = all(n == 1 for n in index_batch)
        self.step = self.single and q_len == 1  # one query position: a decode step
        arrays = broadcast_shapes(*(tuple(a.shape[:-2]) for a in (q, k, *tables)))
        full = broadcast_shapes(arrays, index_batch)
        self.shape = (*full, q_len, k_len) if len(full) > len(arrays) else None

    def _own(self, a):
        """A NumPy int64 array of the plan's as the library's (its index dtype)."""
        if self.torch:
            import torch

            return torch.from_numpy(a)
        return a

    def _as(self, a, dtype):
        """``cast``: ``a`` as ``dtype``, no copy when it already is."""
        if a.dtype == dtype:
            return a
        return a.to(dtype) if self.torch else a.astype(dtype)

    def _finished(self, total):
        """The logits in the full path's shape and result dtype."""
        if self.shape is not None:
            total = total.reshape(self.shape)
        return self._as(total, self.dtype)

    def _index(self, kwargs, q_len, k_len):
        """The table row (``_table_rows``) of each ``rel``: ``_rel``'s, or one offset per batch
        row's ``[rows, q_len, k_len]`` (``_row_index``); None near the integer limits, and for
        one offset per row where autograd records (the full path's per-row kernels, whose
        adjoints give its gradients: ``_rows``)."""
        if self.rows is not None:
            return None if self.recording else self._row_index(kwargs["offset"], q_len, k_len)
        rel = self._rel(kwargs, q_len, k_len)
        return None if rel is None else self._table_rows(rel)

    def _chunk(self, q, k, per_row):
        """Rows a chunk (``_chunked``) where the call's intermediates, ``per_row`` bytes for each
        of its rows (keys cast to the compute dtype, products with a table), pass ``CHUNK``
        bytes in all (an allocation past a size is mapped afresh on every call, and costs more
        than the products), else None. NumPy arrays ``q`` and ``k`` ``[rows, heads, n, d]``
        alike only: NumPy's matmul multiplies each matrix alone, so a chunk's products are its
        rows' part of the whole batch's, bit for bit; torch's batched products round a row
        otherwise in another batch (on more than one thread, or against a broadcast table:
        docs/precision.md), and its calls are not chunked."""
        rows = self.rows
        if self.torch or not per_row or len(rows) != 1 or q.ndim != 4 or tuple(q.shape[:-2]) != tuple(k.shape[:-2]):
            return None
        chunk = max(1, CHUNK // per_row)
        return chunk if chunk < rows[0] else None

    def _bytes(self, *shape):
        """The bytes of a compute-dtype array of ``shape``."""
        return math.prod(shape) * (self.work.itemsize if self.torch else np.dtype(self.work).itemsize)

    def _chunked(self, q, k, logits):
        """The logits ``self.chunk`` rows at a time: ``logits(rows, q[rows], keys)`` of each chunk,
        its keys cast to the compute dtype in one buffer, written in the result dtype. Each
        product is the chunk's rows' part of the whole batch's (``_chunk``), every other step
        elementwise: every row the bits of the whole batch's call."""
        shape = (*k.shape[:-2], q.shape[-2], k.shape[-2])
        cast = k.dtype != self.work
        out, keys = np.empty(shape, self.dtype), np.empty((self.chunk, *k.shape[1:]), self.work) if cast else None
        for start in range(0, shape[0], self.chunk):
            rows = slice(start, start + self.chunk)
            if cast:  # (exact: the compute dtype holds every value of the keys' dtype)
                part = keys[: min(self.chunk, shape[0] - start)]
                part[...] = k[rows]
            else:
                part = k[rows]
            out[rows] = logits(rows, q[rows], part)
        return out

    def _row_index(self, offset, q_len, k_len):
        """Row ``b``'s table rows of ``offset[b] + i - j``, ``[rows, q_len, k_len]`` NumPy int64:
        windows of the table rows of every distance from ``top`` down, row ``b``'s query ``i``
        from ``top - offset[b] - i`` on, where those distances are no more than the pairs;
        else each pair's. None where ``offset + query`` or ``query - key`` could leave int64
        (the full path checks)."""
        host = offset if type(offset) is np.ndarray else offset.numpy()
        ends = _arrays.extremes(host)
        if ends is None or not fits_int64((ends[0], ends[1] + q_len - 1), (0, k_len - 1), 0):
            return None
        host = host.reshape(-1).astype(np.int64, copy=False)
        top, bottom = ends[1] + q_len - 1, ends[0] - (k_len - 1)
        if top - bottom + 1 >= self.count * q_len * k_len:
            return self._host(self._table_rows(self._own(host[:, None, None] + self.ij)))
        rows = self._host(self._table_rows(self._own(np.int64(top) - np.arange(top - bottom + 1))))
        windows = _WINDOWS(rows, (rows.shape[0] - k_len + 1, k_len), rows.strides * 2, writeable=False)
        return windows[(np.int64(top) - host)[:, None] - np.arange(q_len)]

    def _host(self, a):
        return a.numpy() if self.torch else a

    def _row_gather(self, scores, index, rows=None):
        """``out[..., h, i, j] = scores[..., h, i, index[b, i, j]]``, ``b`` the row of the
        offsets' axes ``rows`` (the plan's): ``[*rows, heads, r, c]`` of ``scores [..., r, m]``
        and ``index [count, r, c]`` (values in ``[0, m)``)."""
        rows = self.rows if rows is None else rows
        r, m, c = int(scores.shape[-2]), int(scores.shape[-1]), int(index.shape[-1])
        shape = self.shapes.get((scores.shape, rows))
        if shape is None:
            shape = self.shapes[scores.shape, rows] = broadcast_shapes(tuple(scores.shape[:-2]), (*rows, 1))
        if self.torch:
            import torch

            index = torch.from_numpy(index).reshape(*rows, 1, r, c)
            return scores.expand(*shape, r, m).gather(-1, index.expand(*shape, r, c))
        scores = np.broadcast_to(scores, (*shape, r, m))
        flat = scores.reshape(index.shape[0], -1, r * m)
        if r > 1:
            index = index + self._row_starts(r, m)
        out = np.empty((*flat.shape[:2], r, c), scores.dtype)
        for b in range(index.shape[0]):
            out[b] = flat[b].take(index[b], axis=-1)
        return out.reshape(*scores.shape[:-2], r, c)

    def _row_starts(self, rows, m):
        """``[rows, 1]``: where each row starts in the flattened ``[rows, m]`` scores."""
        starts = self.starts.get((rows, m))
        if starts is None:
            starts = self.starts[rows, m] = np.arange(rows)[:, None] * m
        return starts

    def _gather(self, scores, index, k_len):
        """``out[..., i, j] = scores[..., i, index[..., i, j]]`` (``toeplitz_gather`` and
        ``_per_token.gather`` read the same entries); a per-distance ``index [q_len + k_len -
        1]`` goes to ``toeplitz_gather`` itself, one per batch row to ``_row_gather``."""
        if self.rows is not None:
            return self._row_gather(scores, index)
        if index.ndim == 1:
            return _dispatch.call("toeplitz_gather", scores, index, k_len)
        if index.ndim > 2:
            return _per_token.gather(self.xp, scores, index, device=None)
        if self.torch:
            return scores.gather(-1, index.expand(*scores.shape[:-1], index.shape[-1]))
        rows, m = index.shape[0], scores.shape[-1]
        return scores.reshape(*scores.shape[:-2], rows * m).take(index + self._row_starts(rows, m), axis=-1)

    def _rel(self, kwargs, q_len, k_len):
        """``rel = (offset + query) - key``: ``[q, k]`` for an offset (per distance ``[q + k - 1]``
        where autograd records) or positions of one batch entry, else ``[..., (1,) q, k]``; None
        near the integer limits (the full path checks)."""
        offset = kwargs.get("offset")
        if not self.per_token:
            offset = k_len - q_len if offset is None else offset
            return self.ij + offset if -_NEAR < offset < _NEAR else None
        qpos, kpos = kwargs.get("query_positions"), kwargs.get("key_positions")
        qpos = self.aranges[0] if qpos is None else qpos
        kpos = self.aranges[1] if kpos is None else kpos
        offset = self.default_offset if offset is None else offset
        if self.step:  # its one value read, the keys' differences from it in one operation
            qpos = qpos.item()
        if (self.wide or not -_NEAR < offset < _NEAR) and not fits_int64(_arrays.extremes(qpos), _arrays.extremes(kpos), offset):
            return None
        if self.widen[1]:
            kpos = as_int64(kpos)
        if self.step:
            return ((qpos + offset) - kpos).reshape(1, k_len)
        if self.widen[0]:
            qpos = as_int64(qpos)
        if offset:
            qpos = qpos + offset
        rel = qpos.unsqueeze(-1) - kpos.unsqueeze(-2) if self.torch else qpos[..., :, None] - kpos[..., None, :]
        if self.single:
            return rel.reshape(rel.shape[-2:])
        return rel[..., None, :, :] if self.heads else rel


class ShawPlan(LogitsPlan):
    """``shaw_logits(q, k, table_k, max_distance=K, offset=n)`` or with ``query_positions`` /
    ``key_positions``: ``q @ k.T + gather(q @ table_k.T, clip(rel, -K, K) + K)``."""

    def __init__(self, q, k, table_k, max_distance, query_positions, key_positions, rows):
        super().__init__(q, k, (table_k,), query_positions, key_positions, rows)
        self.max_distance = max_distance
        if rows is not None and k.dtype != self.work:  # (the table's product stays the whole batch's)
            self.chunk = self._chunk(q, k, self._bytes(*k.shape[1:]))

    def __call__(self, args, kwargs):
        q, k, table = args
        index = self._index(kwargs, q.shape[-2], k.shape[-2])
        if index is None:
            return NotImplemented
        q = self._as(q, self.work)
        position = self._gather(q @ self._as(table, self.work).mT, index, k.shape[-2])
        if self.chunk:
            return self._chunked(q, k, lambda rows, q, keys: q @ keys.mT + position[rows])
        return self._finished(q @ self._as(k, self.work).mT + position)

    def _table_rows(self, rel):
        """``clip(rel, -K, K) + K``, in place of the plan's own ``rel``."""
        K = self.max_distance
        if self.torch:
            return rel.clamp_(-K, K).add_(K)
        np.clip(rel, -K, K, out=rel)
        rel += K
        return rel


class DebertaPlan(LogitsPlan):
    """``deberta_logits(q, k, pos_q, pos_k, max_distance=K, ...)``: ``(q @ k.T + c2p + p2c) /
    sqrt((1 + len(terms)) d)`` with ``c2p = gather(q @ pos_k.T, delta)`` and ``p2c[i, j] =
    (k @ pos_q.T)[j, delta[i, j]]``, ``delta = deberta_index(rel)``."""

    def __init__(self, q, k, pos_q, pos_k, options, terms, query_positions, key_positions, rows):
        super().__init__(q, k, tuple(t for t in (pos_q, pos_k) if t is not None), query_positions, key_positions, rows)
        self.options, self.terms = options, terms
        self.scale = math.sqrt((1 + len(terms)) * int(q.shape[-1]))
        # Products with tables of no batch axis are a chunk's own; a table's with one, the whole batch's.
        self.split_c2p = "c2p" in terms and pos_k.ndim <= 3
        if rows is not None and ("p2c" not in terms or pos_q.ndim <= 3):
            cast = self._bytes(*k.shape[1:]) if k.dtype != self.work else 0
            self.chunk = self._chunk(q, k, cast + (self._bytes(*k.shape[1:-1], 2 * options[0]) if "p2c" in terms else 0))

    def __call__(self, args, kwargs):
        q, k, pos_q, pos_k = args
        delta = self._index(kwargs, q.shape[-2], k.shape[-2])
        if delta is None:
            return NotImplemented
        q = self._as(q, self.work)
        pos_q, pos_k = (self._as(t, self.work) if term in self.terms else None for t, term in ((pos_q, "p2c"), (pos_k, "c2p")))
        # (the transposed problem sees a per-distance index in reverse order)
        flipped = None if pos_q is None else delta.flip(-1) if delta.ndim == 1 else delta.mT
        if self.chunk:
            c2p = None if self.split_c2p or pos_k is None else self._gather(q @ pos_k.mT, delta, k.shape[-2])
            return self._chunked(q, k, lambda rows, q, keys: self._part(rows, q, keys, pos_q, pos_k, delta, flipped, c2p))
        k = self._as(k, self.work)
        total = q @ k.mT
        if pos_k is not None:
            total = total + self._gather(q @ pos_k.mT, delta, k.shape[-2])
        if flipped is not None:
            total = total + self._gather(k @ pos_q.mT, flipped, q.shape[-2]).mT
        return self._finished(total / self.scale)

    def _part(self, rows, q, keys, pos_q, pos_k, delta, flipped, c2p):
        """The logits of the chunk ``rows`` of one offset per batch row (``_chunked``); ``c2p``:
        the whole batch's term (a table whose product is not split), else None."""
        total = q @ keys.mT
        count = (int(keys.shape[0]),)
        if pos_k is not None:
            total = total + (c2p[rows] if c2p is not None else self._row_gather(q @ pos_k.mT, delta[rows], count))
        if flipped is not None:
            total = total + self._row_gather(keys @ pos_q.mT, flipped[rows], count).mT
        return total / self.scale

    def _table_rows(self, rel):
        return deberta_index(self.xp, rel, *self.options)


def _sized(q, k):
    return 0 < int(q.shape[-2]) * int(k.shape[-2]) <= LARGEST


def rows_planned(offset, *arrays):
    """One offset per batch row: its axes where they are the logits' leading axes but the
    heads (``arrays`` with heads and no more leading axes, broadcasting into them), else
    None (the full path serves the call). False for a scalar ``offset``."""
    if not _per_token.per_row(offset):
        return False
    rows = tuple(offset.shape)
    if arrays[0].ndim < 3 or broadcast_shapes(*(tuple(a.shape[:-2]) for a in arrays), (*rows, 1))[:-1] != rows:
        return None
    return rows


def build_shaw(q, k, table_k, *, max_distance, offset, query_positions, key_positions):
    rows = rows_planned(offset, q, k, table_k)
    if rows is None or not _sized(q, k):
        return None
    return ShawPlan(q, k, table_k, max_distance, query_positions, key_positions, rows or None)


def build_deberta(q, k, pos_q, pos_k, *, max_distance, bucket_size, max_position, terms, offset, query_positions, key_positions):
    rows = rows_planned(offset, q, k, *(t for t in (pos_q, pos_k) if t is not None))
    if rows is None or not _sized(q, k):
        return None
    options = deberta_options(max_distance, bucket_size, max_position)
    return DebertaPlan(q, k, pos_q, pos_k, options, canonical_terms(terms), query_positions, key_positions, rows or None)
