"""Plans of ``shaw_logits`` at decode-step and small-prefill sizes: the call's arithmetic, straight.

``shaw_logits(q, k, table_k, max_distance=K, ...)`` is ``q @ k.T`` plus ``q @ table_k.T``
gathered at ``clip(rel, -K, K) + K``. A planned call does those operations on the call's
own arrays in the library's own functions (NumPy; torch, so gradients flow as they do on
the full path): the same casts, the same two products, the same sum; only the gather's
index is formed differently, and a gather copies values, so every entry is the full
path's, bit for bit. With a scalar ``offset`` the index is ``clip(offset + i - j) + K``
from the plan's own ``i - j``; with per-token positions it is ``clip((offset +
query_positions[..., i]) - key_positions[..., j]) + K`` of this call's positions. Positions
of one batch entry (or none) give one ``[q, k]`` index for every batch entry and head,
read in one pass (NumPy: a ``take`` from the flattened scores; torch: ``gather``);
positions with a batch are gathered by the full path's ``_per_token.gather``.

Values are checked as the full path checks them, in one pass: integer positions and
``offset`` whose sums could leave int64 (int64 or uint64 positions, an offset within
``2**62`` of the limits) are read for their extremes, and a call where a sum might leave
it takes the full path and its error. Calls of more than ``LARGEST`` query-key pairs are
not planned (their products and gather dwarf the checks a plan skips).
"""

from __future__ import annotations

import numpy as np

from .._kernels import _arrays
from .._xp import broadcast_shapes, namespace
from . import _args, _per_token

LARGEST = 2**16  # query-key pairs: the plan's own i - j (offset calls) stay within 512 KiB
_NEAR = 2**62
_INT64 = (-(2**63), 2**63 - 1)


class ShawPlan:
    """``shaw_logits(q, k, table_k, max_distance=K, offset=n)`` or with ``query_positions`` /
    ``key_positions``: the full path's casts, products and sum, the gather from this call's index."""

    def __init__(self, q, k, table_k, max_distance, query_positions, key_positions):
        self.torch = type(q).__module__.startswith("torch")
        self.xp = xp = namespace(q, k, table_k)
        self.dtype, self.work = _args.dtypes(xp, q, k, table_k)
        self.max_distance = max_distance
        q_len, k_len, m = int(q.shape[-2]), int(k.shape[-2]), 2 * max_distance + 1
        rows = np.arange(q_len)[:, None]
        self.starts, self.flat = rows * m, (q_len * m,)  # where each query's row starts in flattened NumPy scores
        self.per_token = _per_token.given(query_positions, key_positions)
        if not self.per_token:
            self.ij = self._own(rows - np.arange(k_len))
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
        # Positions of one batch entry: one flat index for every (batch, head) of the scores.
        self.single = all(n == 1 for n in index_batch)
        scores_batch = broadcast_shapes(tuple(q.shape[:-2]), tuple(table_k.shape[:-2]))
        full = broadcast_shapes(scores_batch, tuple(k.shape[:-2]), index_batch)
        self.shape = (*full, q_len, k_len) if len(full) > len(broadcast_shapes(scores_batch, tuple(k.shape[:-2]))) else None

    def _own(self, a):
        """A NumPy int64 array of the plan's as the library's (its index dtype)."""
        if self.torch:
            import torch

            return torch.from_numpy(a)
        return a

    def __call__(self, args, kwargs):
        q, k, table = (self._as(a, self.work) for a in args)
        index = self._index(kwargs) if self.per_token else self._offset_index(kwargs.get("offset"), q.shape[-2], k.shape[-2])
        if index is None:
            return NotImplemented
        scores = q @ table.mT
        if index.ndim > 2:
            position = _per_token.gather(self.xp, scores, index, device=None)
        elif self.torch:
            position = scores.gather(-1, index.expand(*scores.shape[:-1], index.shape[-1]))
        else:
            position = scores.reshape(*scores.shape[:-2], *self.flat).take(index + self.starts, axis=-1)
        total = q @ k.mT + position
        if self.shape is not None:
            total = total.reshape(self.shape)
        return self._as(total, self.dtype)

    def _as(self, a, dtype):
        """``cast``: ``a`` as ``dtype``, no copy when it already is."""
        if a.dtype == dtype:
            return a
        return a.to(dtype) if self.torch else a.astype(dtype)

    def _clipped(self, rel):
        """``clip(rel, -K, K) + K``, in place of the plan's own ``rel``."""
        K = self.max_distance
        if self.torch:
            return rel.clamp_(-K, K).add_(K)
        np.clip(rel, -K, K, out=rel)
        rel += K
        return rel

    def _offset_index(self, offset, q_len, k_len):
        """``[q, k]`` table rows ``clip(offset + i - j) + K``; None near the integer limits."""
        offset = k_len - q_len if offset is None else offset
        if not -_NEAR < offset < _NEAR:
            return None
        return self._clipped(self.ij + offset)

    def _index(self, kwargs):
        """The table rows of ``(offset + query) - key`` of this call's positions: ``[q, k]`` for
        positions of one batch entry, else ``[..., (1,) q, k]``; None where a sum might leave
        int64 (the full path then checks)."""
        given = (kwargs.get("query_positions"), kwargs.get("key_positions"))
        qpos, kpos = (a if p is None else p for p, a in zip(given, self.aranges))
        offset = kwargs.get("offset")
        offset = self.default_offset if offset is None else offset
        if (self.wide or not -_NEAR < offset < _NEAR) and not _fit(qpos, kpos, offset):
            return None
        qpos, kpos = (_widened(p) if widen else p for p, widen in zip((qpos, kpos), self.widen))
        if offset:
            qpos = qpos + offset
        rel = self._clipped(qpos[..., :, None] - kpos[..., None, :])
        if self.single:
            return rel.reshape(rel.shape[-2:])
        return rel[..., None, :, :] if self.heads else rel


def _fit(qpos, kpos, offset):
    """Whether the positions, ``offset + query`` and ``(offset + query) - key`` stay within
    int64, by the positions' extremes."""
    ends = _extremes(qpos), _extremes(kpos)
    if None in ends:  # no position: nothing is computed
        return True
    (q_low, q_high), (k_low, k_high) = ends
    low, high = q_low + offset, q_high + offset
    values = (q_low, q_high, k_low, k_high, low, high, low - k_high, high - k_low)
    return _INT64[0] <= min(values) and max(values) <= _INT64[1]


def _extremes(positions):
    """``(min, max)`` of integer positions as Python ints, None when there are none."""
    if isinstance(positions, np.ndarray):
        return _arrays.extremes(positions)
    if positions.numel() == 0:
        return None
    return tuple(int(end) for end in positions.aminmax())


def _widened(positions):
    """Integer positions of at most 32 bits, or uint64 ones within int64 (``_fit``), as int64 (``posenc._validate.widened``), in their own library."""
    return positions.astype(np.int64) if isinstance(positions, np.ndarray) else positions.long()


def build_shaw(q, k, table_k, *, max_distance, offset, query_positions, key_positions):
    if not 0 < int(q.shape[-2]) * int(k.shape[-2]) <= LARGEST:
        return None
    return ShawPlan(q, k, table_k, max_distance, query_positions, key_positions)
