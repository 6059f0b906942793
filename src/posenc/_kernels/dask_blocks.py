"""Registrations of the Dask block kernels (ops ``rope_rotate`` and ``toeplitz_expand``).

A Dask array goes to ``posenc._dask``, which builds a lazy graph whose tasks call the
registry again on each NumPy (or CuPy) block, so the Numba kernels run per block.
``accepts`` recognises Dask arrays through ``sys.modules`` (``_compat.is_dask_array``):
neither Dask nor numba is imported here. Arrays of unknown chunk sizes (NaN in the shape)
are left to the reference.
"""

from __future__ import annotations

import math

import numpy as np

from .. import _compat
from .._dispatch import register

_LOADER = "posenc._dask:"


def _dask(*arrays) -> bool:
    """Every array given (``None`` skipped) is a Dask array of known shape."""
    return all(
        a is None or (_compat.is_dask_array(a) and not any(math.isnan(s) for s in a.shape))
        for a in arrays
    )


def _accepts_rope_rotate(x, positions, inv_freq, *, layout="half", inverse=False, scale=1.0, out=None):
    return _compat.is_dask_array(x) and _dask(x, positions, out)


def _accepts_expand(vec, q_len, k_len, *, out=None):
    return _compat.is_dask_array(vec) and _dask(vec, out) and q_len > 0 and k_len > 0


# --- samples: argument sets for tests/test_kernels_match_reference.py ---------------------

_DTYPES = (np.float64, np.float32, np.float16)


def _rope_samples(rng):
    import dask.array as da

    from ..rotary.scaling import default_inv_freq

    for dtype in _DTYPES:
        # [N, d] with positions chunked alike; a feature axis split in two chunks.
        x = rng.standard_normal((10, 8)).astype(dtype)
        pos = rng.integers(0, 5000, 10)
        yield (da.from_array(x, chunks=(3, 8)), da.from_array(pos, chunks=3), default_inv_freq(8, 10000.0)), {}
        yield (da.from_array(x, chunks=(4, 4)), da.from_array(pos, chunks=5), default_inv_freq(8, 10000.0)), {"layout": "interleaved"}
    # [batch, heads, seq, d]: positions [seq] broadcast; partial rotary, inverse, a scale.
    x = rng.standard_normal((2, 3, 7, 12))
    pos = da.from_array(np.arange(100, 107), chunks=4)
    xs = da.from_array(x, chunks=(1, 2, 3, 12))
    yield (xs, pos, default_inv_freq(8, 500.0)), {"inverse": True, "scale": 1.25}
    # Per-token float positions [batch, 1, seq] and a 0-d shift.
    fpos = da.from_array(rng.uniform(-50.0, 50.0, (2, 1, 7)), chunks=(1, 1, 4))
    yield (xs, fpos, default_inv_freq(12, 10000.0)), {"layout": "interleaved"}
    yield (xs, da.from_array(np.asarray(-3)), default_inv_freq(12, 10000.0)), {}


def _expand_samples(rng):
    import dask.array as da

    for dtype in _DTYPES:
        heads, q_len, k_len = 3, 7, 5
        vec = da.from_array(rng.standard_normal((heads, q_len + k_len - 1)).astype(dtype), chunks=(2, 4))
        yield (vec, q_len, k_len), {}
        out = da.zeros((heads, q_len, k_len), chunks=(1, 3, 2), dtype=dtype)
        yield (vec, q_len, k_len), {"out": out}
    vec = da.from_array(rng.standard_normal(1 + 9 - 1), chunks=3)
    yield (vec, 1, 9), {"out": da.zeros((1, 9), chunks=(1, 4))}
    vec = da.from_array(rng.standard_normal((2, 2, 6 + 6 - 1)), chunks=(1, 2, 5))
    yield (vec, 6, 6), {"out": da.zeros((2, 2, 6, 6), chunks=(2, 1, 4, 1))}


register(
    "rope_rotate",
    "rope_rotate.dask_blocks",
    accepts=_accepts_rope_rotate,
    loader=_LOADER + "rope_rotate_blocks",
    samples=_rope_samples,
)
register(
    "toeplitz_expand",
    "toeplitz_expand.dask_blocks",
    accepts=_accepts_expand,
    loader=_LOADER + "toeplitz_expand_blocks",
    samples=_expand_samples,
)
