"""NumPy bfloat16 (``ml_dtypes.bfloat16``, the dtype JAX hands to NumPy) through the rotary
functions: the same kernels as torch bfloat16 (bit-identical results) and the same
one-ulp contract against the float64 rotation; the reference path agrees within one ulp."""

from __future__ import annotations

import numpy as np
import pytest

import posenc as pe
from arrays import ulp
from formulas import exact_rope

ml_dtypes = pytest.importorskip("ml_dtypes")
torch = pytest.importorskip("torch")
BF16 = ml_dtypes.bfloat16


def bits(a):
    """The uint16 bits of a NumPy or torch bfloat16 array."""
    if isinstance(a, np.ndarray):
        return a.view(np.uint16)
    return a.view(torch.int16).numpy().view(np.uint16)


@pytest.fixture
def keys(rng):
    x = rng.uniform(-4, 4, (2, 3, 9, 16))
    return x.astype(BF16), torch.from_numpy(x).to(torch.bfloat16)


CALLS = {
    "rope": lambda x, lib: pe.rope(x, lib.arange(9) * 1000),
    "rope yarn interleaved partial": lambda x, lib: pe.rope(
        x, offset=70_000, scaling=pe.scaling.YaRN(4.0, 64), layout="interleaved", rotary_dim=8
    ),
    "rope inverse": lambda x, lib: pe.rope(x, inverse=True, offset=3),
    "rerotate": lambda x, lib: pe.rerotate(x, 5, pe.rope_frequencies(16)[0]),
}


@pytest.mark.parametrize("name", list(CALLS))
def test_numpy_bfloat16_equals_torch_bfloat16_bit_for_bit(keys, name):
    xn, xt = keys
    got, want = CALLS[name](xn, np), CALLS[name](xt, torch)
    assert isinstance(got, np.ndarray) and got.dtype == BF16
    np.testing.assert_array_equal(bits(got), bits(want))


def test_within_one_ulp_of_the_float64_rotation(keys):
    xn, _ = keys
    positions = np.array([0, 1, 7, 1000, 65_535, 1_000_000, 9_999_991, 2**24 - 2, 2**24 - 1])
    exact = exact_rope(xn.astype(np.float64), positions)
    for backend in ("auto", "reference"):
        with pe.use_backend(backend):
            got = pe.rope(xn, positions)
        assert got.dtype == BF16
        assert np.all(np.abs(got.astype(np.float64) - exact) <= ulp(exact, "bfloat16"))


def test_tables_apply_and_out(keys):
    xn, xt = keys
    inv_freq, _ = pe.rope_frequencies(16)
    cos, sin = pe.rope_cos_sin(np.arange(9), inv_freq, dtype=BF16)
    cos_t, sin_t = pe.rope_cos_sin(torch.arange(9), inv_freq, dtype=torch.bfloat16)
    assert cos.dtype == BF16
    np.testing.assert_array_equal(bits(cos), bits(cos_t))
    out = np.empty_like(xn)
    assert pe.apply_rope(xn, cos, sin, out=out) is out
    np.testing.assert_array_equal(bits(out), bits(pe.apply_rope(xt, cos_t, sin_t)))
    in_place = xn.copy()
    pe.rope(in_place, out=in_place)
    np.testing.assert_array_equal(bits(in_place), bits(pe.rope(xt)))
