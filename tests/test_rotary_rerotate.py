"""``rerotate``: ``out=`` (a cache shifted in place), its sequence axis said as in ``rope``."""

from __future__ import annotations

import numpy as np
import pytest

import posenc as pe
from arrays import assert_close
from formulas import exact_rope


def test_out_cache_shifts_a_cache_in_place(backend, rng):
    if backend.name in ("jax", "dask", "array_api_strict"):
        pytest.skip("immutable or lazy arrays: out= is refused (test_bad_inputs.py)")
    k = rng.standard_normal((2, 3, 7, 16))
    inv_freq, _ = pe.rope_frequencies(16)
    cache = backend.asarray(exact_rope(k, np.arange(7)), dtype="float32")
    address = cache.data_ptr() if hasattr(cache, "data_ptr") else cache.__array_interface__["data"][0]
    got = pe.rerotate(cache, -4, inv_freq, out=cache)  # evict 4 tokens: positions 0..6 -> -4..2
    assert got is cache
    now = cache.data_ptr() if hasattr(cache, "data_ptr") else cache.__array_interface__["data"][0]
    assert now == address
    assert_close(cache, exact_rope(k, np.arange(7) - 4), backend=backend, dtype="float32")


def test_out_equals_the_allocating_call_bit_for_bit(rng):
    k = rng.standard_normal((1, 4, 9, 8)).astype(np.float32)
    inv_freq, _ = pe.rope_frequencies(8)
    new_inv, _ = pe.rope_frequencies(8, base=500000.0)
    for delta, new in ((5, None), (np.arange(9), new_inv)):
        want = pe.rerotate(k, delta, inv_freq, new_inv_freq=new)
        buf = np.empty_like(k)
        assert pe.rerotate(k, delta, inv_freq, new_inv_freq=new, out=buf) is buf
        np.testing.assert_array_equal(buf, want)
        cache = k.copy()
        pe.rerotate(cache, delta, inv_freq, new_inv_freq=new, out=cache)
        np.testing.assert_array_equal(cache, want)


def test_out_refuses_a_partial_overlap_and_a_wrong_buffer():
    cache = np.zeros((2, 6, 8))
    inv_freq, _ = pe.rope_frequencies(8)
    with pytest.raises(ValueError, match="out overlaps the memory of x"):
        pe.rerotate(cache[:, :5], 1, inv_freq, out=cache[:, 1:])
    with pytest.raises(ValueError, match="out must have dtype"):
        pe.rerotate(cache, 1, inv_freq, out=np.zeros((2, 6, 8), np.float32))


def test_seq_axis_places_positions_as_rope_does(rng):
    k = rng.standard_normal((2, 6, 3, 8))  # [batch, seq, heads, dim]
    inv_freq, _ = pe.rope_frequencies(8)
    new_inv, _ = pe.rope_frequencies(8, base=100.0)
    cache = pe.rope(k, seq_axis="bshd")
    moved = pe.rerotate(cache, np.arange(6), inv_freq, new_inv_freq=new_inv, seq_axis="bshd")
    np.testing.assert_allclose(moved, pe.rope(k, seq_axis="bshd", base=100.0), atol=1e-12)
    with pytest.raises(ValueError, match="seq_axis"):
        pe.rerotate(cache, np.arange(6), inv_freq)  # axis -2 has 3 heads, not 6 tokens
