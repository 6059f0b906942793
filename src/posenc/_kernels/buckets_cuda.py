"""numba.cuda kernel of T5's buckets (op ``t5_buckets``), for CuPy arrays, torch CUDA tensors and numba device arrays.

Reference: ``posenc.relative.buckets.t5_buckets``. A thread per distance, in the
reference's integer arithmetic: the distance (``|rel|`` with ``rel`` raised to ``-largest``
of its dtype, or ``max(rel, 0)`` one way), itself below ``exact``, else ``exact`` plus the
count of bucket starts it reaches (``t5_starts_array``: the boundaries of the original's
float32 formula, a constant on the device), found by binary search (O(log(num_buckets))
a distance), plus ``side`` for a key after the query.
Specialised by the distances' dtype (int32, int64), which is the result's; compiled on
first use (``FAMILY``) and launched on the caller's current stream, straight to the driver
(``_device_flat.launch``).
"""

from __future__ import annotations

import numba
import numpy as np
from numba import cuda, types

from . import _arrays, _device_flat, _family
from .buckets import SPECIALISATIONS, guard, serves
from ..relative.buckets import t5_starts_array

_THREADS = 256


def _buckets(n, rel, step, starts, exact, side, bidirectional, lowest, out):
    i = cuda.grid(1)
    if i < n:
        r = max(np.int64(rel[i * step]), lowest)
        base = 0
        if r < 0:
            if bidirectional:
                base, r = side, -r
            else:
                r = 0
        bucket = r
        if r >= exact:
            low, high = 0, starts.shape[0]  # a binary search for the count of starts <= r
            while low < high:
                middle = (low + high) // 2
                if starts[middle] <= r:
                    low = middle + 1
                else:
                    high = middle
            bucket = exact + low
        out[i] = base + bucket


def _signature(name):
    """The kernel's numba signature for distances (and buckets) of dtype ``name``."""
    i64 = types.int64
    values, held = types.Array(numba.from_dtype(np.dtype(name)), 1, "C"), types.Array(i64, 1, "C")
    return types.void(i64, values, i64, held, i64, i64, i64, i64, values)


def _build(name):
    return _family.jitted(cuda.jit, _buckets, _signature(name))


FAMILY = _family.Family("buckets_cuda", _build, SPECIALISATIONS, serves)


def t5_buckets(rel, *, num_buckets, max_distance, bidirectional):
    """numba.cuda ``t5_buckets`` of a 1-D int32/int64 GPU array: a new array of ``rel``'s dtype."""
    num_buckets, max_distance, bidirectional = guard(rel, num_buckets, max_distance, bidirectional)
    n = int(rel.shape[0])
    if n >= 2**31:
        raise ValueError(f"rel has {n} distances: the CUDA kernel takes fewer than 2**31 (kernel launcher check)")
    side = num_buckets // 2 if bidirectional else num_buckets
    name = _arrays.dtype_name(rel.dtype)
    stream, on_device = _arrays.launch_context(rel)
    with on_device:
        result = _arrays.empty(rel)
        if n:
            device = _arrays.device_index(rel)
            starts = _device_flat.constant(device, t5_starts_array(side, max_distance), stream)
            values, (step,) = _device_flat.flat(_device_flat.span(rel))
            out, _ = _device_flat.flat(_device_flat.span(result))
            lowest = -int(np.iinfo(name).max)
            _device_flat.launch(
                FAMILY[(name,)], device, -(-n // _THREADS), _THREADS, stream,
                n, values, step, starts, side // 2, side, int(bidirectional), lowest, out,
            )  # fmt: skip
    return result
