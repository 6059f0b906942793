"""Plans of the relative biases: one query row (a decode step), the per-distance vector, per-token
positions, one offset per batch row.

With ``q_len == 1`` the ``[heads, 1, k_len]`` bias is the per-distance vector of the
``k_len`` distances ``offset - j`` read backwards, so a planned call computes the vector
of those distances in that order with the kind's own functions (``biases._KINDS``) and
skips the Toeplitz expansion: every entry is the value the full path writes, computed
the same way. ``posenc._plans`` keys the calls and builds these after a validated call.

A plan calls the library's own namespace where it is one (NumPy >= 2), the namespace of
the full path otherwise (array-api-compat's torch). T5's plan keeps the buckets of a window
of distances (``t5_buckets`` of those distances, an elementwise function), Shaw's and
DeBERTa's the table rows of those distances (their kinds' ``source``), ALiBi's the negated
distances in the compute dtype. A decode step's row is a run of that window, and
per-token positions index it (``(hi - offset - q) + k``): one pass of
``_kernels/bias_rows_cpu`` reads and finishes them (the table's entries, or the product
with the slopes) where it serves the call (NumPy and torch CPU, the ``"auto"``
backend), else a slice and one gather from the table or one product with the slopes. The
window holds at most ``HELD`` distances around the rows asked for (1.5 MiB per plan with
the key indices, its own and its kernel launcher's); a row of more distances is computed
directly, and a far offset moves the window rather than filling every distance below it.

A bias call that autograd records (torch parameters that require grad) has the full path's
backward, to the bit, and no kernel (which autograd cannot see through): its decode-step
plan gathers the row's vector in the full path's (ascending) order and reads it backwards,
as ``toeplitz_expand`` of one query row does (its backward, the sums of one-entry diagonals,
is that reversal); a per-token plan finishes every pair's source (the table read, the
slopes multiplied) in one step in the pairs' order, as the full path does.

One offset per batch row (``RowsPlan``) is the per-token call of the query positions
``offset[..., None] + arange(q_len)``, one plan for any ``k_len`` (a decode loop's keys grow
a step at a time). Where the rows' distances are few (offsets close
together: caches of about one length) and autograd records nothing, each row is a window of
one per-distance vector of all their distances, finished once per distance and gathered in
one NumPy indexing; else the per-token plan takes it, one value per pair.
"""

from __future__ import annotations

import copy
import math

import numpy as np

from .. import _dispatch
from .._kernels import _arrays
from .._xp import cast, compute_dtype, device_of, index_dtype, is_integer, namespace
from . import _per_token, biases
from .buckets import t5_buckets

_LARGEST = 2**26  # entries (heads x keys); a larger row takes the full path and its allocation check
# Distances a plan keeps the sources (T5 buckets, ALiBi's negated distances) and key indices
# of, at most: 2**16 of each, 8 bytes apiece, 1 MiB per plan (and as many key indices again in
# its kernel launcher, bias_rows_cpu.Launcher.row). Rows beyond are computed directly.
HELD = 2**16
_EXACT = 2**52
PLANS_KEPT = 4  # per-token plans of one signature of any length of keys: of the last lengths asked for


def _gather(params, xp):
    """``take(a, indices, axis)`` of non-negative ``indices``: torch's own ``index_select`` for
    a tensor (array-api-compat's ``take`` also remaps negative indices), else ``xp.take``."""
    if type(params).__module__.startswith("torch"):
        import torch

        return lambda a, indices, axis: torch.index_select(a, axis, indices)
    return lambda a, indices, axis: xp.take(a, indices, axis=axis)


def _plan_namespace(params):
    """NumPy itself for NumPy arrays (an Array API namespace since 2.0), else the full path's."""
    return np if type(params) is np.ndarray else namespace(params)


class Row:
    """The per-distance vector of one query row: ``kind``'s vector function on ``offset - j``."""

    def __init__(self, kind, params, options):
        self.xp = xp = _plan_namespace(params)
        self.device = device_of(params)
        self.kind = kind
        self.heads = int(params.shape[-1]) if params.ndim else 1
        self.options = biases._KINDS[kind][0](xp, params, **options)
        self.keys = xp.arange(0, dtype=index_dtype(xp, self.device), device=self.device)
        self.take = _gather(params, xp)

    def _keys(self, k_len):
        xp = self.xp
        keys = self.keys  # (one read: another thread may keep shorter keys meanwhile)
        if k_len > HELD:  # longer rows than a plan keeps: their keys afresh
            return xp.arange(k_len, dtype=keys.dtype, device=self.device)
        if keys.shape[0] < k_len:
            keys = self.keys = xp.arange(min(max(k_len, 2 * int(keys.shape[0])), HELD), dtype=keys.dtype, device=self.device)
        return keys[:k_len]

    def values(self, params, k_len, first, descending):
        """``[heads, k_len]`` at distances ``first - j`` (descending) or ``first + j``."""
        keys = self._keys(k_len)
        return self.vector(params, first - keys if descending else keys + first)

    def vector(self, params, dist):
        return biases.kind_vector(self.kind, self.xp, params, dist, self.options)


class CachedRow(Row):
    """A row whose kind splits into an elementwise function of the distance (``source``)
    and a step that reads the parameters (``finish``): the sources of the distances ``hi,
    hi - 1, .., lo`` are kept, so a decode step's row is one slice of them and ``finish``."""

    def __init__(self, kind, params, options):
        super().__init__(kind, params, options)
        self.held = (-1, 0, None)  # (hi, lo, sources of hi .. lo)

    def _covering(self, first, last):
        """``(hi, sources of hi .. lo)`` with ``lo <= last <= first <= hi``, or None past the cache's reach."""
        hi, lo, sources = self.held
        if not (lo <= last and first <= hi):
            if first - last >= HELD or last == -(2**63):
                return None  # more distances than a plan keeps (or int64's least, below arange's end): computed directly
            hi = max(first, 2 * hi + 1) if first > hi else hi
            lo = min(last, 2 * lo - 1) if last < lo else lo
            if hi - lo >= HELD:  # far from what is kept: a window from this row's distances up
                lo, hi = last, max(first, min(hi, last + HELD - 1))
            hi, lo = min(hi, 2**63 - 1), max(lo, -(2**63) + 1)  # grown within int64 (the index dtype of a plan's arrays)
            sources = self.source(self.xp.arange(hi, lo - 1, -1, dtype=self.keys.dtype, device=self.device))
            self.held = (hi, lo, sources)
        return hi, sources

    def window(self, first, k_len):
        """``(start, sources)``: the kept sources, of the distances ``first, first - 1, .., first
        - k_len + 1`` from ``start`` on; None past the cache's reach."""
        held = self._covering(first, first - k_len + 1)
        return None if held is None else (held[0] - first, held[1])

    def _descending(self, first, k_len):
        """The sources of the distances ``first, first - 1, .., first - k_len + 1``, or None past the cache's reach."""
        held = self.window(first, k_len)
        return None if held is None else held[1][held[0] : held[0] + k_len]

    def _ascending(self, first, n):
        """The sources of the distances ``first, first + 1, .., first + n - 1`` (the kept ones
        read backwards), or None past the cache's reach."""
        held = self._descending(first + n - 1, n) if first < 2**63 - n else None
        if held is None:
            return None
        return held[::-1] if type(held) is np.ndarray else held.flip(0)

    def at(self, params, dist):
        """The vector of integer distances ``dist`` (1-D, not empty): the kept sources gathered."""
        held = self._covering(int(self.xp.max(dist)), int(self.xp.min(dist)))
        if held is None:
            return self.vector(params, dist)
        hi, sources = held
        return self.finish(params, self.take(sources, hi - dist, 0))

    def unrecorded(self, params, sources):
        """``finish`` where autograd records nothing, as NumPy: a tensor's ``_arrays.host_view``
        (16-bit floats as their bits)."""
        values = self.finish(params, sources)
        return values if type(values) is np.ndarray else _arrays.host_view(values)

    def values(self, params, k_len, first, descending):
        sources = self._descending(first, k_len) if descending else self._ascending(first, k_len)
        if sources is None:
            return super().values(params, k_len, first, descending)
        return self.finish(params, sources)


class TableRow(CachedRow):
    """A kind of a table (Shaw's, DeBERTa's): the table's row of each distance (the kind's
    ``source``: clipped, or DeBERTa's log bucket clipped), then the table's entries of those rows."""

    def source(self, dist):
        return biases._KINDS[self.kind][1](self.xp, None, dist, **self.options)

    def finish(self, table, buckets):
        """``biases._lookup``: ``[heads, len(buckets)]`` of the table's entries (non-negative indices)."""
        return self.take(self.xp.matrix_transpose(table), buckets, 1)

    def unrecorded(self, table, buckets):
        """``CachedRow.unrecorded``: the table's rows at the buckets, transposed in NumPy (torch's
        gather along the table's columns is five times slower in 16 bits, its transposing copy slower too)."""
        rows = self.take(table, buckets, 0)
        return np.ascontiguousarray((rows if type(rows) is np.ndarray else _arrays.host_view(rows)).T)


class T5Row(TableRow):
    """T5: the bucket of each distance (``t5_buckets``), then the table's entries of those buckets."""

    def source(self, dist):
        return t5_buckets(self.xp, dist, **self.options)


class AlibiRow(CachedRow):
    """ALiBi: each distance negated in the compute dtype, then times each head's slope."""

    def __init__(self, kind, params, options):
        super().__init__(kind, params, options)
        self.work = compute_dtype(self.xp, params.dtype)

    def source(self, dist):
        return biases._alibi_distance(self.xp, dist, self.work, self.options["symmetric"])

    def finish(self, slopes, distance):
        return biases._alibi_scaled(self.xp, slopes, distance)

    def unrecorded(self, slopes, distance):
        """``CachedRow.unrecorded``: slopes that compute in their own dtype (float32, float64)
        times the distances as NumPy's one product of host views, a third of torch's cost; 16-bit
        slopes as ``finish`` rounds them."""
        if slopes.dtype != self.work:
            return super().unrecorded(slopes, distance)
        return _arrays.host_view(slopes)[:, None] * _arrays.host_view(distance)


def scalar(offset):
    """A planned call's ``offset`` of one value: None, an int, or a 0-d integer array in host
    memory (the key's: validated by the full path once), read as the int the full path reads."""
    return offset if offset is None or type(offset) is int else int(offset)


def _offset(offset, q_len, k_len):
    offset = k_len - q_len if offset is None else offset
    return offset if -_EXACT < offset < _EXACT else None


_ROWS = {"t5": T5Row, "alibi": AlibiRow, "shaw": TableRow, "deberta": TableRow}


def _row(kind, params, options):
    return _ROWS.get(kind, Row)(kind, params, options)


class BiasPlan:
    """``relative_bias(kind, params, 1, k_len, offset=n)``: the row of distances ``n - j``, ``[heads, 1, k_len]``."""

    def __init__(self, kind, params, options, recorded):
        self.row = _row(kind, params, options)
        self.most = _LARGEST // self.row.heads
        self.recorded = recorded
        self.launcher = _launcher(kind, params, self.row.heads) if isinstance(self.row, CachedRow) and not recorded else None

    def __call__(self, args, kwargs):
        _, params, _, k_len = args
        offset = scalar(kwargs.get("offset"))
        offset = k_len - 1 if offset is None else offset
        if not (0 < k_len <= self.most and -_EXACT < offset < _EXACT):
            return NotImplemented
        if self.recorded:
            return self.row.values(params, k_len, offset - (k_len - 1), descending=False).flip(-1)[:, None]
        if self.launcher is not None and (held := self.row.window(offset, k_len)) is not None:
            bias = self.launcher.row(params, held[1], held[0], k_len)
            if bias is not None:
                return bias
        return self.row.values(params, k_len, offset, descending=True)[:, None]


class VectorPlan:
    """``relative_bias_vector(kind, params, q_len, k_len, offset=n)``: the ``q_len + k_len - 1``
    distances from ``n - (k_len - 1)`` up, ``[heads, q_len + k_len - 1]`` (FlexAttention's
    ``score_mod`` of a prefill or a decode step)."""

    def __init__(self, kind, params, options):
        self.row = _row(kind, params, options)
        self.most = _LARGEST // self.row.heads

    def __call__(self, args, kwargs):
        _, params, q_len, k_len = args
        offset = _offset(scalar(kwargs.get("offset")), q_len, k_len)
        if offset is None or not (q_len > 0 and k_len > 0 and q_len + k_len - 1 <= self.most):
            return NotImplemented
        return self.row.values(params, q_len + k_len - 1, offset - (k_len - 1), descending=False)


class ExpandPlan:
    """``expand_bias(vec, 1, k_len)``: ``vec`` read backwards, ``[..., 1, k_len]``."""

    def __init__(self, vec):
        self.torch = type(vec).__module__.startswith("torch")

    def __call__(self, args, kwargs):
        vec = args[0]
        if self.torch:
            return vec.flip(-1).unsqueeze(-2)
        return vec[..., None, ::-1].copy()


class PerTokenPlan:
    """``relative_bias(kind, params, q_len, k_len, query_positions=..., key_positions=...)``:
    ``rel = (offset + query_positions[..., i]) - key_positions[..., j]`` of the call's own
    positions, the kind's values at every ``rel`` (T5's buckets, ALiBi's negated distances
    from the kept ones), in the operations of ``biases._per_token_bias``. Its one check of
    values is the full path's for float positions (finite, ALiBi): a non-finite one takes
    the full path and its error."""

    def __init__(self, kind, params, q_len, k_len, query_positions, key_positions, options, recorded, row=None):
        self.row = _row(kind, params, options) if row is None else row
        xp, device = self.row.xp, self.row.device
        floats = biases.distance_float(xp, kind, device)
        qpos, kpos, batch = _per_token.positions(
            namespace(params), q_len, k_len, None, query_positions, key_positions, device=device, float_dtype=floats
        )
        self.aranges = tuple(
            xp.arange(length, dtype=index_dtype(xp, device), device=device) if given is None else None
            for given, length in ((query_positions, q_len), (key_positions, k_len))
        )
        self.default_offset = 0 if query_positions is not None else k_len - q_len
        self.kinds = tuple(_arrays.integer_kind(p) for p in (query_positions, key_positions))
        self.floats = floats if not (is_integer(xp, qpos.dtype) and is_integer(xp, kpos.dtype)) else None
        self.checked = tuple(p is not None and not is_integer(xp, p.dtype) for p in (query_positions, key_positions))
        heads = self.row.heads
        self.shape = (heads, *batch, q_len, k_len)
        self.order = (*range(1, len(batch) + 1), 0, len(batch) + 1, len(batch) + 2) if batch else None
        self.torch = type(params).__module__.startswith("torch")
        # The kept sources are of index-dtype distances: other integer distances are computed afresh.
        self.gather = isinstance(self.row, CachedRow) and math.prod(self.shape) > 0 and self.floats is None and qpos.dtype == kpos.dtype == self.row.keys.dtype
        # Index-dtype positions (or left out) index the kept sources straight (``_indexed``); in
        # the other byte order (int64 by name) they are not the kernel's int64: summed first.
        self.indexed = self.gather and all(kind in (None, "int64") for kind in self.kinds) and not any(map(_byte_swapped, (query_positions, key_positions)))
        self.queries = (0, q_len - 1) if query_positions is None else None
        self.single = (q_len if query_positions is None else math.prod(query_positions.shape)) == 1
        shapes = (None if p is None else tuple(p.shape) for p in (query_positions, key_positions))
        self.launcher = _launcher(kind, params, heads, batch, q_len, k_len, *shapes, self.aranges) if self.indexed and not recorded else None
        self.query_given = query_positions is not None

    def of_length(self, k_len):
        """This plan for ``k_len`` keys (``PerTokenPlans``): what follows the length made anew,
        the rest (what the full path validated of its signature's arrays) shared. Key
        positions, if given, have this plan's leading axes and ``k_len`` entries."""
        plan = copy.copy(self)
        plan.shape = (*self.shape[:-1], k_len)
        if self.aranges[1] is not None:
            xp, keys = self.row.xp, self.aranges[1]
            plan.aranges = (self.aranges[0], xp.arange(k_len, dtype=keys.dtype, device=self.row.device))
        if not self.query_given:
            plan.default_offset = k_len - self.shape[-2]
        if self.launcher is not None:
            plan.launcher = self.launcher.of_length(k_len, plan.aranges[1])
        return plan

    def __call__(self, args, kwargs):
        if self.launcher is not None:
            values = self._launched(args[1], kwargs)
            if values is not None:
                return values
        elif self.indexed:
            values = self._indexed(args[1], kwargs)
            if values is not None:
                return self._placed(values)
        xp, params = self.row.xp, args[1]
        given = (kwargs.get("query_positions"), kwargs.get("key_positions"))
        for p, checked in zip(given, self.checked):
            if checked and not bool(xp.all(xp.isfinite(p))):
                return NotImplemented
        qpos, kpos = (a if p is None else p for p, a in zip(given, self.aranges))
        offset = self._offset(kwargs)
        # The integer rule: offset + query and query - key within int64 (else the full path
        # checks them pair by pair), integer positions widened to int64.
        if "int64" in self.kinds or "uint64" in self.kinds or abs(offset) >= 2**62:
            if not fits_int64(*(_arrays.extremes(p) if kind or arange is not None else None for p, kind, arange in zip((qpos, kpos), self.kinds, self.aranges)), offset):
                return NotImplemented
        qpos, kpos = (as_int64(p) if kind in ("narrow", "uint64") else p for p, kind in zip((qpos, kpos), self.kinds))
        if self.checked[0]:  # float query positions: summed with the offset in the distance float, as check.shifted does
            qpos = cast(xp, qpos, self.floats)
        qpos = qpos if offset == 0 else qpos + offset
        if self.floats is not None:
            qpos, kpos = cast(xp, qpos, self.floats), cast(xp, kpos, self.floats)
        rel = xp.reshape(_per_token.relative(qpos, kpos), (-1,))
        values = self.row.at(params, rel) if self.gather else self.row.vector(params, rel)
        return self._placed(values)

    def _offset(self, kwargs):
        offset = scalar(kwargs.get("offset"))
        return self.default_offset if offset is None else offset

    def _placed(self, values):
        """``[heads, batch * q_len * k_len]`` values as the ``[*batch, heads, q_len, k_len]`` bias."""
        values = values.reshape(self.shape)
        if self.order is None:
            return values
        return values.permute(self.order) if self.torch else values.transpose(self.order)

    def _indexed(self, params, kwargs):
        """The values at ``rel = (offset + qpos) - kpos`` of index-dtype positions, gathered
        from the kept sources at ``hi - rel = (hi - offset - qpos) + kpos``; None where a
        query position or the offset is near the integer limits or some ``rel`` lies outside
        the kept window (the general path then checks, or moves the window).

        No ``rel`` is formed: with ``|hi - offset - qpos| < 2**62``, an index sum that wraps
        cannot land in ``[0, len(sources))``, so indices all found there are the true ones,
        every ``rel`` is within the window and the full path's range checks all pass. One
        query's indices are first its keys themselves, into the sources from ``hi - offset -
        qpos`` on (no sum to form: keys at 0 and up)."""
        hi, _, sources = self.row.held
        if sources is None:
            return None
        qpos, kpos = kwargs.get("query_positions"), kwargs.get("key_positions")
        offset = self._offset(kwargs)
        if qpos is None:
            (low, high), qpos = self.queries, self.aranges[0]
        elif self.single:
            low = high = qpos.item()
        else:
            low, high = _arrays.extremes(qpos)
        shift = hi - offset
        if not (-(2**62) < shift < 2**62 and -(2**62) < shift - high <= shift - low < 2**62 and -(2**63) <= low + offset and high + offset < 2**63):
            return None
        kpos = self.aranges[1] if kpos is None else kpos
        if not self.single:
            found = self._found(sources, (shift - qpos)[..., :, None] + kpos[..., None, :])
        elif shift - low < 0 or (found := self._found(sources[shift - low :], kpos)) is None:
            found = self._found(sources, kpos + (shift - low))
        return None if found is None else self.row.finish(params, found)

    def _launched(self, params, kwargs):
        """``_indexed``'s values in one pass of ``bias_rows_cpu``, placed: None where it
        does not serve the values (a window that does not cover them, positions near the
        integer limits), which the general path then takes."""
        hi, _, sources = self.row.held
        if sources is None:
            return None
        offset = self._offset(kwargs)
        return self.launcher(params, sources, hi - offset, offset, kwargs.get("query_positions"), kwargs.get("key_positions"))

    def _found(self, sources, index):
        """``sources`` at ``index`` (flattened), or None for an index outside ``[0, len(sources))``."""
        index = index if index.ndim == 1 else index.reshape(-1)
        if self.torch:  # index_select refuses such an index itself
            try:
                return self.row.take(sources, index, 0)
            except IndexError:
                return None
        if _LARGEST_OF(index.view(_UNSIGNED)) < sources.shape[0]:  # a negative index is past the end as unsigned
            return sources.take(index)
        return None


_LARGEST_OF, _UNSIGNED = np.maximum.reduce, np.dtype(np.uint64)
_WINDOWS = np.lib.stride_tricks.as_strided  # [heads, n] -> [heads, n - k + 1, k]: every k entries from each start


def _launcher(kind, params, heads, *shape):
    """``bias_rows_cpu.Launcher(kind, params, heads, *shape)`` for a plan that reads its kept
    sources, or None where the reference's operations serve it: no Numba, the reference
    backend in force, or parameters of a dtype the kernels do not take."""
    if not _arrays.numba_cpu() or _dispatch.get_backend() != "auto":
        return None
    from .._kernels import bias_rows_cpu

    if bias_rows_cpu.element(kind, _arrays.dtype_name(params.dtype)) is None:
        return None
    return bias_rows_cpu.Launcher(kind, params, heads, *shape)


def fits_int64(query, key, offset):
    """Whether query positions (``(min, max)``, or None: float or empty) shifted by ``offset``,
    and their differences with the key positions', stay within int64; and the positions themselves."""
    ends = [e for e in (query, key) if e is not None]
    if not all(-(2**63) <= low and high <= 2**63 - 1 for low, high in ends):
        return False
    if query is None:
        return True
    low, high = query[0] + int(offset), query[1] + int(offset)
    if key is not None:
        low, high = min(low, low - key[1]), max(high, high - key[0])
    return -(2**63) <= low and high <= 2**63 - 1


def as_int64(positions):
    """Integer positions as int64 (``posenc._validate.widened``), in their own library."""
    return positions.astype(np.int64) if isinstance(positions, np.ndarray) else positions.long()


class RowsPlan:
    """``relative_bias(kind, params, q_len, k_len, offset=offsets)`` of one offset per batch
    row: ``_windowed`` where it serves the call, else the ``PerTokenPlan`` of the query
    positions ``offsets[..., None] + arange(q_len)``, as the full path takes them
    (``_per_token.positions``), which checks their integer rule. Where forming them could
    wrap (uint64 offsets, int64 ones plus a step) the offsets' extremes are checked first:
    a call outside takes the full path and its error."""

    def __init__(self, kind, params, q_len, k_len, offset, options, recorded):
        xp, device = _plan_namespace(params), device_of(params)
        self.steps = None if q_len == 1 else xp.arange(q_len, dtype=index_dtype(xp, device), device=device)
        integers = _arrays.integer_kind(offset)
        self.checked = integers == "uint64" or (integers == "int64" and q_len > 1)
        self.q_len, self.rows = q_len, math.prod(offset.shape)
        self.torch = type(params).__module__.startswith("torch")
        self.row = _row(kind, params, options)
        self.per_token = PerTokenPlans(kind, params, q_len, self._queries(offset), None, options, recorded, self.row)
        self.heads = self.row.heads
        self.most = _LARGEST // max(1, self.heads * self.rows * q_len)
        # One row of one query: a decode step's plan, its [heads, 1, k_len] given the offset's axes (the
        # same bits; a call autograd records keeps the per-token gradient, summed in the pairs' order).
        single = q_len == 1 and self.rows == 1 and integers != "uint64" and not recorded
        self.single = BiasPlan(kind, params, options, False) if single else None
        self.windowed = isinstance(self.row, CachedRow) and not recorded
        self.heads_index, self.descents = np.arange(self.heads)[:, None], np.arange(q_len, dtype=np.int64)
        self.wrap = _torch_wrap(params) if self.torch else None

    def _queries(self, offset):
        offset = offset.long().unsqueeze(-1) if self.torch else offset.astype(np.int64, copy=False)[..., None]
        return offset if self.steps is None else offset + self.steps

    def __call__(self, args, kwargs):
        offset, k_len = kwargs["offset"], args[3]
        if not 0 < k_len <= self.most:  # (no keys, or more than a plan serves: the full path, its allocation check)
            return NotImplemented
        if self.single is not None:
            bias = self.single(args, {"offset": offset.item()})
            if bias is not NotImplemented:
                return bias.reshape(*offset.shape, self.heads, 1, k_len)
        if self.windowed:
            bias = self._windowed(args[1], offset, k_len)
            if bias is not None:
                return bias
        if self.checked:
            ends = _arrays.extremes(offset)
            if ends is None or not fits_int64((ends[0], ends[1] + self.q_len - 1), (0, k_len - 1), 0):
                return NotImplemented
        return self.per_token(args, {"query_positions": self._queries(offset)})

    def _windowed(self, params, offset, k_len):
        """The rows as windows of one per-distance vector: the kind's values (``finish``) at the
        distances from the rows' greatest, ``top``, down to their least, row ``b``'s query ``i``
        then the ``k_len`` of them from ``top - offset[b] - i`` on (the bits of its own call's
        row), gathered into ``[..., heads, q_len, k_len]`` by one NumPy indexing of the
        vector's windows (of host views for torch, whose indexing is slower). None where the
        vector would be longer than the pairs (offsets far apart), past the kept window, or
        outside the integer rule (the per-token plan and the full path then judge the call)."""
        host = offset if type(offset) is np.ndarray else offset.numpy()
        ends = _arrays.extremes(host)
        if ends is None:
            return None
        top, bottom = ends[1] + self.q_len - 1, ends[0] - (k_len - 1)
        if top - bottom >= self.rows * self.q_len * k_len or not fits_int64((ends[0], top), (0, k_len - 1), 0):
            return None
        held = self.row.window(top, top - bottom + 1)
        if held is None:
            return None
        start, sources = held
        values = self.row.unrecorded(params, sources[start : start + top - bottom + 1])
        firsts = np.int64(top) - host.astype(np.int64, copy=False)  # (their true values, 0 .. top - bottom: no wrap)
        # Windows over the buffer of ``values``, C-contiguous (``unrecorded``'s fresh product or
        # contiguous copy): NumPy's constructor checks them against it, in a tenth of as_strided's time.
        across, along = values.strides
        windows = np.ndarray((values.shape[0], values.shape[1] - k_len + 1, k_len), values.dtype, values, 0, (across, along, along))
        bias = windows[self.heads_index, firsts[..., None, None] - self.descents]
        return bias if self.wrap is None else self.wrap(bias)


def _torch_wrap(params):
    """A NumPy result of ``_arrays.host_view``'s dtype as a tensor of ``params``' dtype (16-bit floats from their bits)."""
    import torch

    dtype = params.dtype
    if dtype.itemsize == 2:
        return lambda a: torch.from_numpy(a.view(np.int16)).view(dtype)
    return torch.from_numpy


def _byte_swapped(a):
    """Whether ``a`` is a NumPy array of the other byte order. Parameters: the full path
    reads a native copy (``_xp.host_plain``) and gives a native result, a plan's row, vector
    or gathered rows would be in ``a``'s own order, so such a call keeps the full path (one
    dtype on every call). Positions: no kernel reads them as int64."""
    return isinstance(a, np.ndarray) and not a.dtype.isnative


class PerTokenPlans:
    """``PerTokenPlan``'s of one signature of per-token positions whose key leaves ``k_len``
    out (``_signatures._bias_key``): each length of keys its own, made on its first call
    (of at most ``PLANS_KEPT`` lengths at a time), sharing one row and its kept window. A
    ``k_len`` of no keys, of more entries than a plan serves, or that the key positions'
    last axis does not hold takes the full path and its checks; so does a plan that cannot
    be made of the call's values."""

    def __init__(self, kind, params, q_len, query_positions, key_positions, options, recorded, row=None):
        self.row = _row(kind, params, options) if row is None else row
        batch = np.broadcast_shapes(*(tuple(p.shape[:-1]) for p in (query_positions, key_positions) if p is not None))
        self.most = _LARGEST // max(1, self.row.heads * q_len * math.prod(batch))
        self.made = (kind, q_len, options, recorded)
        self.first = None
        self.plans = {}  # k_len -> its PerTokenPlan, of the last few lengths

    def __call__(self, args, kwargs):
        k_len, keys = args[3], kwargs.get("key_positions")
        if not 0 < k_len <= self.most or keys is not None and keys.shape[-1] != k_len:
            return NotImplemented
        plan = self.plans.get(k_len)
        if plan is None:
            plan = self._first(args, kwargs) if self.first is None else self.first.of_length(k_len)
            if plan is None:
                return NotImplemented
            plans = self.plans if len(self.plans) < PLANS_KEPT else {}
            plans[k_len] = plan
            self.plans = plans
        return plan(args, kwargs)

    def _first(self, args, kwargs):
        """The ``PerTokenPlan`` of the call's length, the first made (the others are its
        ``of_length``); None where the call's values keep it from being made (the full path
        then refuses them in its own words)."""
        kind, q_len, options, recorded = self.made
        try:
            self.first = PerTokenPlan(kind, args[1], q_len, args[3], kwargs.get("query_positions"), kwargs.get("key_positions"), options, recorded, self.row)
        except (ValueError, TypeError, OverflowError):
            return None
        return self.first


def build_bias(kind, params, q_len, k_len, *, offset, out, chunks, query_positions=None, key_positions=None, **options):
    if out is not None or chunks is not None or _byte_swapped(params):
        return None
    recorded = _arrays.tracks_gradient(params)
    if _per_token.per_row(offset):
        return RowsPlan(kind, params, q_len, k_len, offset, options, recorded)
    if _per_token.given(query_positions, key_positions):
        return PerTokenPlans(kind, params, q_len, query_positions, key_positions, options, recorded)
    return BiasPlan(kind, params, options, recorded) if q_len == 1 else None


def build_vector(kind, params, q_len, k_len, *, offset, **options):
    return None if _byte_swapped(params) else VectorPlan(kind, params, options)


def build_expand(vec, q_len, k_len, *, out, chunks):
    return ExpandPlan(vec) if q_len == 1 and out is None and chunks is None and vec.ndim >= 1 and not _byte_swapped(vec) else None
