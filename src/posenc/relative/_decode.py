"""Plans of the relative biases for one query row (a decode step): the per-distance vector, straight.

With ``q_len == 1`` the ``[heads, 1, k_len]`` bias is the per-distance vector of the
``k_len`` distances ``offset - j`` read backwards, so a planned call computes the vector
of those distances in that order with the kind's own vector function (``biases._KINDS``)
and skips the Toeplitz expansion: every entry is the value the full path writes, computed
the same way. ``posenc._plans`` keys the calls and builds these after a validated call.
"""

from __future__ import annotations

from .._xp import device_of, index_dtype, namespace

_LARGEST = 2**26  # entries (heads x keys); a larger row takes the full path and its allocation check
_EXACT = 2**52


class Row:
    """The per-distance vector of one query row: ``kind``'s vector function on ``offset - j``."""

    def __init__(self, kind, params, options):
        from .biases import _KINDS

        self.xp = xp = namespace(params)
        self.device = device_of(params)
        self.vector = _KINDS[kind][1]
        self.heads = int(params.shape[-1]) if params.ndim else 1
        self.options = _KINDS[kind][0](xp, params, **options)
        self.keys = xp.arange(0, dtype=index_dtype(xp, self.device), device=self.device)
        self.buckets = _t5_lookup(xp, self.keys.dtype, self.device, self.options) if kind == "t5" else None

    def _keys(self, k_len):
        if self.keys.shape[0] < k_len:
            xp = self.xp
            self.keys = xp.arange(max(k_len, 2 * int(self.keys.shape[0])), dtype=self.keys.dtype, device=self.device)
        return self.keys[:k_len]

    def values(self, params, k_len, first, descending):
        """``[heads, k_len]`` at distances ``first - j`` (descending) or ``first + j``."""
        keys = self._keys(k_len)
        dist = first - keys if descending else keys + first
        if self.buckets is not None:
            from .biases import _lookup

            reach, buckets = self.buckets
            return _lookup(self.xp, params, buckets[dist.clip(-reach, reach) + reach])
        return self.vector(self.xp, params, dist, **self.options)


def _t5_lookup(xp, dtype, device, options):
    """``(reach, buckets)``: T5's bucket of every distance in ``[-reach, reach]``, computed by
    ``t5_buckets``, where every farther distance has the bucket of ``±reach`` (T5's buckets
    are integer thresholds of ``|rel|`` that end at ``max_distance``); None otherwise."""
    from .buckets import t5_buckets

    reach = options["max_distance"] + 1
    wide = t5_buckets(xp, xp.arange(-2 * reach, 2 * reach + 1, dtype=dtype, device=device), **options)
    lo, hi = wide[: reach + 1], wide[3 * reach :]
    if not (bool(xp.all(lo == lo[-1])) and bool(xp.all(hi == hi[0]))):
        return None
    return reach, wide[reach : 3 * reach + 1]


def _offset(offset, q_len, k_len):
    offset = k_len - q_len if offset is None else offset
    return offset if -_EXACT < offset < _EXACT else None


class BiasPlan(Row):
    def __call__(self, kind, params, q_len, k_len, *, offset, **_):
        offset = _offset(offset, q_len, k_len)
        if offset is None or not 0 < k_len <= _LARGEST // self.heads:
            return NotImplemented
        vec = self.values(params, k_len, offset, descending=True)
        return self.xp.reshape(vec, (int(vec.shape[0]), 1, k_len))


class VectorPlan(Row):
    def __call__(self, kind, params, q_len, k_len, *, offset, **_):
        offset = _offset(offset, q_len, k_len)
        if offset is None or not 0 < k_len <= _LARGEST // self.heads:
            return NotImplemented
        return self.values(params, k_len, offset - (k_len - 1), descending=False)


class ExpandPlan:
    """``expand_bias(vec, 1, k_len)``: ``vec`` read backwards, ``[..., 1, k_len]``."""

    def __init__(self, vec):
        self.torch = type(vec).__module__.startswith("torch")

    def __call__(self, vec, q_len, k_len, **_):
        if self.torch:
            return vec.flip(-1).unsqueeze(-2)
        return vec[..., None, ::-1].copy()


def build_bias(kind, params, q_len, k_len, *, offset, out, chunks, query_positions=None, key_positions=None, **options):
    if q_len != 1 or out is not None or chunks is not None or query_positions is not None or key_positions is not None:
        return None
    return BiasPlan(kind, params, options)


def build_vector(kind, params, q_len, k_len, *, offset, **options):
    return VectorPlan(kind, params, options) if q_len == 1 else None


def build_expand(vec, q_len, k_len, *, out, chunks):
    return ExpandPlan(vec) if q_len == 1 and out is None and chunks is None and vec.ndim >= 1 else None
