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
from ._decode import as_int64, fits_int64
from .biases import deberta_index, deberta_options
from .deberta import canonical_terms

LARGEST = 2**16  # query-key pairs: the plan's own i - j (offset calls) stay within 512 KiB
_NEAR = 2**62


class LogitsPlan:
    """What the relative logits share: the call's casts, its relative positions (the plan's
    own ``i - j`` shifted by the ``offset``, or this call's positions) and the gathers of
    projected scores at table rows of them. ``tables``: the float arrays besides ``q``, ``k``."""

    def __init__(self, q, k, tables, query_positions, key_positions):
        self.torch = type(q).__module__.startswith("torch")
        self.xp = xp = namespace(q, k, *tables)
        self.dtype, self.work = _args.dtypes(xp, q, k, *tables)
        q_len, k_len = int(q.shape[-2]), int(k.shape[-2])
        self.starts = {}
        self.per_token = _per_token.given(query_positions, key_positions)
        if not self.per_token:
            recording = self.torch and any(_arrays.tracks_gradient(a) for a in (q, k, *tables))
            self.ij = self._own(np.arange(-(k_len - 1), q_len) if recording else np.arange(q_len)[:, None] - np.arange(k_len))
            self.shape = None
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

    def _gather(self, scores, index, k_len):
        """``out[..., i, j] = scores[..., i, index[..., i, j]]`` (``toeplitz_gather`` and
        ``_per_token.gather`` read the same entries); a per-distance ``index [q_len + k_len -
        1]`` goes to ``toeplitz_gather`` itself."""
        if index.ndim == 1:
            return _dispatch.call("toeplitz_gather", scores, index, k_len)
        if index.ndim > 2:
            return _per_token.gather(self.xp, scores, index, device=None)
        if self.torch:
            return scores.gather(-1, index.expand(*scores.shape[:-1], index.shape[-1]))
        rows, m = index.shape[0], scores.shape[-1]
        starts = self.starts.get((rows, m))
        if starts is None:  # where each row starts in the flattened scores
            starts = self.starts[rows, m] = np.arange(rows)[:, None] * m
        return scores.reshape(*scores.shape[:-2], rows * m).take(index + starts, axis=-1)

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

    def __init__(self, q, k, table_k, max_distance, query_positions, key_positions):
        super().__init__(q, k, (table_k,), query_positions, key_positions)
        self.max_distance = max_distance

    def __call__(self, args, kwargs):
        q, k, table = (self._as(a, self.work) for a in args)
        rel = self._rel(kwargs, q.shape[-2], k.shape[-2])
        if rel is None:
            return NotImplemented
        position = self._gather(q @ table.mT, self._clipped(rel), k.shape[-2])
        return self._finished(q @ k.mT + position)

    def _clipped(self, rel):
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

    def __init__(self, q, k, pos_q, pos_k, options, terms, query_positions, key_positions):
        super().__init__(q, k, tuple(t for t in (pos_q, pos_k) if t is not None), query_positions, key_positions)
        self.options, self.terms = options, terms
        self.scale = math.sqrt((1 + len(terms)) * int(q.shape[-1]))

    def __call__(self, args, kwargs):
        q, k, pos_q, pos_k = args
        q, k = self._as(q, self.work), self._as(k, self.work)
        rel = self._rel(kwargs, q.shape[-2], k.shape[-2])
        if rel is None:
            return NotImplemented
        total = q @ k.mT
        delta = deberta_index(self.xp, rel, *self.options)
        if "c2p" in self.terms:
            total = total + self._gather(q @ self._as(pos_k, self.work).mT, delta, k.shape[-2])
        if "p2c" in self.terms:  # (the transposed problem sees a per-distance index in reverse order)
            flipped = delta.flip(-1) if delta.ndim == 1 else delta.mT
            total = total + self._gather(k @ self._as(pos_q, self.work).mT, flipped, q.shape[-2]).mT
        return self._finished(total / self.scale)


def _sized(q, k):
    return 0 < int(q.shape[-2]) * int(k.shape[-2]) <= LARGEST


def build_shaw(q, k, table_k, *, max_distance, offset, query_positions, key_positions):
    return ShawPlan(q, k, table_k, max_distance, query_positions, key_positions) if _sized(q, k) else None


def build_deberta(q, k, pos_q, pos_k, *, max_distance, bucket_size, max_position, terms, offset, query_positions, key_positions):
    if not _sized(q, k):
        return None
    options = deberta_options(max_distance, bucket_size, max_position)
    return DebertaPlan(q, k, pos_q, pos_k, options, canonical_terms(terms), query_positions, key_positions)
