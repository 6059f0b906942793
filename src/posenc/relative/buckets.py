"""Bucketed relative positions: T5's and DeBERTa-v2's log-spaced buckets."""

from __future__ import annotations

import bisect
import math
from functools import lru_cache

import numpy as np

from .. import _compat
from .. import _validate as check
from .._dispatch import call, reference
from .._xp import device_of, explicit_sharding, host_plain, namespace, resplit, searched, torch_compiling, trace_constant, unsplit, widest_float


# The most T5 buckets: far past T5's 32; each log-spaced bucket's start is found one at a time
# in the original's float32 arithmetic (``_t5_starts``, 0.15 s at this many; 2**24 took minutes).
MAX_T5_BUCKETS = 2**16
# Bucket boundaries a direction from which ``t5_buckets`` searches them (``searchsorted``)
# rather than comparing every distance with each in turn: jax.jit and torch.compile fuse
# those comparisons into one pass, faster there for a few boundaries (T5's 32 buckets have 7).
SEARCHED_STARTS = 32


def t5_bucket_options(num_buckets, max_distance, bidirectional):
    """Validated ``(num_buckets, max_distance, bidirectional)`` of a T5 bucket map."""
    num_buckets = check.integer("num_buckets", num_buckets, minimum=2)
    if num_buckets > MAX_T5_BUCKETS:
        raise ValueError(f"num_buckets must be at most {MAX_T5_BUCKETS} (T5 uses 32), got {num_buckets}")
    if not isinstance(bidirectional, bool):
        raise TypeError(f"bidirectional must be True or False, got {bidirectional!r}")
    if bidirectional and num_buckets < 4:
        raise ValueError(f"num_buckets must be >= 4 when bidirectional=True (num_buckets // 2 a direction), got {num_buckets}")
    max_distance = check.integer("max_distance", max_distance, minimum=1)
    # The original's exact range, e = N // 2 with N buckets a direction: its log step
    # divides by ln(max_distance / e), which must be positive.
    side = num_buckets // 2 if bidirectional else num_buckets
    if max_distance <= side // 2:
        raise ValueError(f"max_distance must be > {side // 2} (the exact range of {side} buckets a direction), got {max_distance}")
    return num_buckets, max_distance, bidirectional


@lru_cache(maxsize=64)
def _t5_starts(side_buckets: int, max_distance: int) -> tuple[int, ...]:
    """Smallest distance of each log-spaced T5 bucket ``exact + 1 .. side_buckets - 1``.

    The original maps a distance ``n >= exact`` (``exact = side_buckets // 2``) to
    ``exact + int(log(n / exact) / log(max_distance / exact) * (side_buckets - exact))``
    in float32 (Mesh TensorFlow, then Hugging Face). That map is non-decreasing in ``n``,
    so it is fully described by the distance where each bucket starts; evaluating it here
    once, with the original's float32 arithmetic, makes the bucket exact integer
    arithmetic on every namespace and device (no float64 needed, none of float32 ``log``'s
    platform differences). The log is correctly rounded to float32 (from float64): NumPy's
    own float32 ``log`` depends on the host's vector instructions (one ulp off for 2.7% of
    values on an AVX-512 CPU), and so did the boundaries.
    """
    exact = side_buckets // 2
    f32 = np.float32
    denominator = f32(math.log(max_distance / exact))

    def bucket(n):  # (n >= exact: the log of a ratio of at least 1)
        return exact + int(f32(math.log(_float32(n) / f32(exact))) / denominator * f32(side_buckets - exact))

    def start(b, guess):
        # Steps doubling away from the guess, then halving (a float32 distance past 2**24 is
        # a step of several): bucket(low) < b <= bucket(high) throughout.
        low, high, step = exact, guess, 1
        while bucket(high) < b:
            low, high, step = high, high + step, 2 * step
        step = 1
        while high - step > low and bucket(high - step) >= b:
            high, step = high - step, 2 * step
        low = max(low, high - step)
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (low, middle) if bucket(middle) >= b else (middle, high)
        return high

    return tuple(
        start(b, max(exact, math.floor(exact * (max_distance / exact) ** ((b - exact) / (side_buckets - exact))) - 2))
        for b in range(exact + 1, side_buckets)
    )


def _float32(n):
    """The int ``n >= 0`` rounded once to float32 (to nearest, ties to even), as the original's
    ``.float()`` of an int64 distance: ``np.float32`` of a Python int rounds it to float64
    first, and past 2**53 those two roundings can give the neighbouring float32."""
    shift = max(n.bit_length() - 24, 0)
    kept, dropped = divmod(n, 1 << shift)
    half = (1 << shift) >> 1
    kept += shift > 0 and (dropped > half or (dropped == half and kept % 2 == 1))
    return np.float32(kept << shift)


def t5_bucket(rel, *, bidirectional=True, num_buckets=32, max_distance=128):
    r"""T5's relative position bucket of ``rel = query - key``.

    Distances below ``exact`` get a bucket each; larger ones share log-spaced buckets up
    to ``max_distance``, beyond which they all fall in the last bucket:

    .. math::

        b(n) = \begin{cases} n & n < e \\
        \min\!\left(e + \left\lfloor \dfrac{\ln(n/e)}{\ln(D/e)}\,(N - e)\right\rfloor,\; N - 1\right)
        & n \ge e \end{cases}

    with ``N`` buckets per direction, ``e = N // 2``, ``D = max_distance``. With
    ``bidirectional=True`` there are ``N = num_buckets // 2`` buckets per direction,
    ``n = |rel|``, and keys after the query (``rel < 0``) use buckets ``N .. 2N - 1``;
    with ``bidirectional=False``, ``N = num_buckets``, ``n = max(rel, 0)`` (a causal model
    never sees future keys). Raffel et al., "Exploring the Limits of Transfer Learning with
    a Unified Text-to-Text Transformer" (2020), Mesh TensorFlow's
    ``_relative_position_bucket``.

    The original takes ``key - query``; here ``rel`` is ``query - key`` (the library's
    convention), so ``t5_bucket(rel) == original(-rel)`` exactly. Buckets are computed in
    integer arithmetic from the bucket boundaries of the original's float32 formula.

    Parameters
    ----------
    rel : integer array, any shape
    bidirectional : bool
    num_buckets : int >= 2 (>= 4 when bidirectional: ``num_buckets // 2`` a direction),
        at most ``MAX_T5_BUCKETS`` (65536)
    max_distance : int > e, the exact range (``num_buckets // 4`` when bidirectional,
        ``num_buckets // 2`` otherwise)

    Returns
    -------
    integer array like ``rel`` with values in ``[0, num_buckets)`` (computed in the index
    dtype; ``ValueError`` where ``num_buckets - 1`` does not fit ``rel``'s dtype).

    Examples
    --------
    >>> import numpy as np, posenc as pe
    >>> pe.t5_bucket(np.arange(0, 31, 3)).tolist()
    [0, 3, 6, 8, 9, 9, 10, 10, 11, 11, 11]
    >>> pe.t5_bucket(np.array([-1, -20, 500])).tolist()
    [17, 26, 15]
    """
    check.array("rel", rel)
    xp = namespace(rel)
    check.integer_array("rel", rel, xp)
    num_buckets, max_distance, bidirectional = t5_bucket_options(num_buckets, max_distance, bidirectional)
    check.allocatable_unless_blocked("t5_bucket", tuple(rel.shape), 8, rel)
    wide = check.widened("rel", host_plain(rel), xp, device_of(rel))
    buckets = call("t5_buckets", wide, num_buckets=num_buckets, max_distance=max_distance, bidirectional=bidirectional)
    return check.narrowed("a T5 bucket", buckets, rel.dtype, 0, num_buckets - 1, xp)


@reference("t5_buckets")
def t5_bucket_values(rel, *, num_buckets, max_distance, bidirectional):
    """The op ``t5_buckets``, which kernels register against: :func:`t5_buckets` in ``rel``'s namespace."""
    return t5_buckets(namespace(rel), rel, num_buckets, max_distance, bidirectional)


def t5_buckets(xp, rel, num_buckets, max_distance, bidirectional):
    """:func:`t5_bucket` of validated arguments (``t5_bucket_options``): ``exact`` plus the
    count of log-spaced bucket boundaries (``_t5_starts``) a distance reaches, in
    O(len(rel) * log(num_buckets)): a binary search (``searchsorted``) of ``SEARCHED_STARTS`` or
    more boundaries, one comparison per boundary below that."""
    side = num_buckets // 2 if bidirectional else num_buckets
    exact = side // 2
    largest = xp.iinfo(rel.dtype).max
    if bidirectional:
        n = xp.abs(xp.clip(rel, -largest, None))  # |int64 min| does not exist: beyond every threshold, as -largest
        base = xp.astype(rel < 0, rel.dtype) * side  # (no host scalar copied to the device: CUDA graphs capture this)
    else:
        n = xp.clip(rel, 0, None)
        base = xp.zeros_like(rel)
    starts = t5_starts_reached(side, max_distance, largest)
    if len(starts) < SEARCHED_STARTS:
        logarithmic = xp.full_like(rel, exact)
        for start in starts:
            logarithmic = logarithmic + xp.astype(n >= start, rel.dtype)
    else:
        boundaries = _starts_on(xp, side, max_distance, starts, rel.dtype, device_of(rel), on_cupy=_compat.is_cupy_array(rel))
        reached = searched(xp, boundaries, n)
        logarithmic = xp.astype(reached, rel.dtype) + exact
    return base + xp.where(n < exact, n, logarithmic)


def t5_reach(num_buckets, max_distance, bidirectional) -> int:
    """The distance from which every farther one on its side has the same T5 bucket: the
    last bucket's first distance (``_t5_starts``), or the exact buckets' end."""
    side = num_buckets // 2 if bidirectional else num_buckets
    return max((side // 2, *_t5_starts(side, max_distance)))


@trace_constant
def t5_starts_reached(side_buckets: int, max_distance: int, largest: int) -> tuple[int, ...]:
    """The :func:`_t5_starts` a distance of at most ``largest`` reaches (a constant for ``torch.compile``)."""
    return _t5_starts_reached(side_buckets, max_distance, largest)


@lru_cache(maxsize=64)
def _t5_starts_reached(side_buckets, max_distance, largest):
    starts = _t5_starts(side_buckets, max_distance)
    return starts[: bisect.bisect_right(starts, largest)]


def _starts_on(xp, side_buckets, max_distance, starts, dtype, device, *, on_cupy=False):
    """``starts``, the first of ``_t5_starts(side_buckets, max_distance)``, as a 1-D array of
    ``dtype`` on ``device``: copied once to a torch GPU or a CuPy device (``on_cupy``) and
    kept there (``_device_constants``: no copy in a call, which a CUDA graph captures), a
    constant of the graph ``torch.compile`` traces, else copied from a host array made once
    (a copy: torch shares a NumPy array's memory, and warns that this one is read-only)."""
    if torch_compiling():
        return xp.asarray(starts, dtype=dtype, device=device)
    if getattr(device, "type", None) == "cuda":
        from .._device_constants import torch_constant

        kept = torch_constant(starts, dtype, device, what="T5 bucket boundaries")
        if kept is not None:
            return kept
    host = t5_starts_array(side_buckets, max_distance)[: len(starts)]
    if on_cupy:
        from .._device_constants import kept_array

        return kept_array(xp, host, dtype, device)
    return xp.asarray(host, dtype=dtype, device=device, copy=True)


@lru_cache(maxsize=64)
def t5_starts_array(side_buckets: int, max_distance: int) -> np.ndarray:
    """:func:`_t5_starts` as a read-only int64 NumPy array."""
    starts = np.asarray(_t5_starts(side_buckets, max_distance), dtype=np.int64)
    starts.flags.writeable = False
    return starts


def deberta_bucket_options(bucket_size, max_position):
    """Validated ``(bucket_size, max_position)`` of a DeBERTa bucket map."""
    bucket_size = check.integer("bucket_size", bucket_size, minimum=2)
    max_position = check.integer("max_position", max_position, minimum=1)
    return bucket_size, max_position


def deberta_bucket(rel, *, bucket_size=256, max_position=512):
    r"""DeBERTa-v2's log bucket of ``rel = query - key``.

    Identity for ``|rel| <= m`` (``m = bucket_size // 2``), log-spaced and signed beyond:

    .. math::

        b(r) = \begin{cases} r & |r| \le m \\
        \operatorname{sign}(r)\left(m + \left\lceil \dfrac{\ln(|r|/m)}{\ln((P-1)/m)}\,(m-1)
        \right\rceil\right) & |r| > m \end{cases}

    with ``P = max_position``; ``b(P - 1) = 2m - 1`` and larger distances keep growing
    slowly (DeBERTa clips the result when it indexes its table, see ``deberta_logits``).
    He et al., "DeBERTa: Decoding-enhanced BERT with Disentangled Attention" (2021), the
    released v2/v3 code (``make_log_bucket_position``), which also takes
    ``query - key``. The formula is evaluated as the original evaluates it, in float32:
    every operation's result rounded to float32, the logarithms correctly rounded (from
    float64 where the namespace has it, so every such namespace and device gives the same
    bucket; JAX without x64 takes its own float32 ``log``). Evaluated in float64 instead,
    a distance a whole number of steps from ``m`` (``|r| / m`` a rational power of
    ``(P-1)/m``: ``|r| = 2m`` for ``P - 1 = 8m`` where 3 divides ``m - 1``, e.g.
    ``bucket_size = 128``, ``max_position = 513``) would land a rounding error above it and
    one bucket past the original's.
    Where the original's own float32 ``log`` is not correctly rounded (PyTorch's on a CPU,
    at rare boundaries) its bucket there is one off this one (``docs/precision.md``).

    Small ``max_position`` (``P <= m + 1``) is computed as the released code does: for
    ``P < m + 1`` the log of ``(P-1)/m`` is negative (``-inf`` for ``P = 1``) and the
    formula above is evaluated as it stands (buckets shrink with distance, or stay at
    ``m`` for ``P = 1``); for ``P = m + 1`` it divides by zero, and the original's
    ``±inf``, cast to an integer as its model does, is the most negative integer of the
    dtype, so every distance beyond ``m`` lands on table row 0 in ``deberta_logits``.

    Parameters
    ----------
    rel : integer array, any shape
    bucket_size : int >= 2
    max_position : int >= 1

    Returns
    -------
    integer array like ``rel`` (computed in the index dtype; ``ValueError`` where a bucket
    of a value of ``rel``'s dtype would not fit it).

    Examples
    --------
    >>> import numpy as np, posenc as pe
    >>> pe.deberta_bucket(np.array([0, 3, -4, 5, 9, 15, -15]), bucket_size=8, max_position=16).tolist()
    [0, 3, -4, 5, 6, 7, -7]
    >>> pe.deberta_bucket(np.array([3, 5, -9]), bucket_size=8, max_position=1).tolist()
    [3, 4, -4]
    """
    check.array("rel", rel)
    xp = namespace(rel)
    check.integer_array("rel", rel, xp)
    bucket_size, max_position = deberta_bucket_options(bucket_size, max_position)
    check.allocatable_unless_blocked("deberta_bucket", tuple(rel.shape), 8, rel)
    lowest = int(xp.iinfo(rel.dtype).min)
    wide = check.widened("rel", rel, xp, device_of(rel))
    buckets = deberta_buckets(xp, wide, bucket_size, max_position, lowest=lowest)
    if buckets.dtype == rel.dtype:
        return buckets
    # (uint64 values beyond the index dtype's range were refused when widened)
    largest = min(int(xp.iinfo(rel.dtype).max), check.index_bounds(xp, device_of(rel))[3])
    low, high = _deberta_range(bucket_size, max_position, lowest, largest)
    return check.narrowed("a DeBERTa bucket", buckets, rel.dtype, low, high, xp)


def _deberta_range(bucket_size, max_position, lowest, largest):
    """The smallest and largest bucket of a value in ``lowest .. largest``: the map is
    monotonic in ``|rel|`` on each side of the identity zone, so at the ends of the range
    and just past ``m`` (evaluated as the buckets are)."""
    mid = bucket_size // 2
    ends = [v for v in (lowest, -(mid + 1), -mid, 0, mid, mid + 1, largest) if lowest <= v <= largest]
    buckets = deberta_buckets(np, np.array(ends, dtype=np.int64), bucket_size, max_position, lowest=lowest)
    return int(buckets.min()), int(buckets.max())


def deberta_buckets(xp, rel, bucket_size, max_position, *, lowest=None):
    """:func:`deberta_bucket` of validated arguments (``deberta_bucket_options``); ``lowest``
    (default: that of ``rel``'s dtype) is the most negative integer of the dtype the
    caller's ``rel`` came in, the bucket of every distance beyond ``m`` for ``P = m + 1``."""
    mid = bucket_size // 2
    largest = xp.iinfo(rel.dtype).max
    if mid >= largest:  # every distance of the dtype is in the identity zone (and m is past the dtype)
        return xp.asarray(rel, copy=True)
    magnitude = xp.abs(xp.clip(rel, -largest, None))  # |int64 min| does not exist: as -largest, beyond every threshold
    identity = magnitude <= mid
    if max_position - 1 == mid:
        return xp.where(identity, rel, xp.full_like(rel, xp.iinfo(rel.dtype).min if lowest is None else lowest))
    if max_position == 1:  # ln(0) = -inf: every step is ceil(-0.0) = 0
        logarithmic = xp.full_like(rel, mid)
    else:
        work = widest_float(xp, device_of(rel))

        # Each float32 operation of the original computed in the work dtype and rounded: JAX's
        # own float32 division by a constant multiplies by its reciprocal (not IEEE's quotient).
        def single(v):  # v rounded to float32, kept in the work dtype
            return xp.astype(xp.astype(v, xp.float32), work)

        # Distances inside the identity zone are replaced by m before the log (never used).
        safe = xp.where(identity, xp.full_like(magnitude, mid), magnitude)
        ratio = single(xp.astype(xp.astype(safe, xp.float32), work) / mid)
        # The log of the same float32 ratio as a distance's, by the same log, so |rel| =
        # max_position - 1 gives exactly 1 (bucket 2m - 1), as in the original.
        top = xp.full((1,), float(np.float32((max_position - 1) / mid)), dtype=work, device=device_of(rel))
        if _compat.is_jax_namespace(xp):  # one log of both: under jax.jit a constant's alone is folded by another log
            # The top ends every row, split as the row is (an explicit mesh joins no split
            # array to a replicated one), the last axis gathered where it is split.
            rows, sharding = unsplit(ratio if ratio.ndim else xp.reshape(ratio, (1,)), max(ratio.ndim - 1, 0))
            tops = resplit(xp.broadcast_to(top, (*rows.shape[:-1], 1)), explicit_sharding(rows))
            logs = single(xp.log(xp.concat([rows, tops], axis=-1)))
            log_ratio = resplit(xp.reshape(logs[..., :-1], ratio.shape), sharding)
            log_top = logs[..., -1:] if ratio.ndim else logs[-1]
        else:
            log_ratio, log_top = single(xp.log(ratio)), single(xp.log(top))[0]
        steps = xp.ceil(single(single(log_ratio / log_top) * (mid - 1)))
        logarithmic = xp.astype(steps, rel.dtype) + mid
    return xp.where(identity, rel, xp.where(rel < 0, -logarithmic, logarithmic))
