"""Issue 32, JAX as a first-class pipeline: traced context-extension lengths computed as
exactly as static ones, mixed host/device inputs, clear errors for silent cases, export,
sharding. JAX runs here without x64 (float32 at most).
"""

from __future__ import annotations

import numpy as np
import pytest

import posenc as pe
from formulas import rope_formula, rope_tables

jax = pytest.importorskip("jax")
jnp = jax.numpy
ml_dtypes = pytest.importorskip("ml_dtypes")


# --- 1. a traced seq_len (every step of a jitted decoding loop) ------------------------


def dynamic_ntk_inv_freq(dim, base, factor, original, seq_len):
    """HF's ``_compute_dynamic_ntk_parameters`` in float64, written out."""
    n = max(seq_len, original)
    new_base = base * (factor * n / original - (factor - 1)) ** (dim / (dim - 2))
    return 1.0 / new_base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)


def longrope_inv_freq(dim, base, short, long, original, seq_len):
    """HF's ``_compute_longrope_parameters`` in float64: long factors past the original length."""
    factors = np.asarray(long if seq_len > original else short, dtype=np.float64)
    return 1.0 / (factors * base ** (np.arange(0, dim, 2, dtype=np.float64) / dim))


_DIM = 64
_SHORT = tuple(np.random.default_rng(1).uniform(1.0, 1.5, _DIM // 2))
_LONG = tuple(np.random.default_rng(2).uniform(1.0, 40.0, _DIM // 2))
SCALINGS = {
    "dynamic": (pe.scaling.DynamicNTK(4.0, 4096), lambda n: dynamic_ntk_inv_freq(_DIM, 10000.0, 4.0, 4096, n)),
    "longrope": (
        pe.scaling.LongRoPE(_SHORT, _LONG, 4096, factor=4.0),
        lambda n: longrope_inv_freq(_DIM, 10000.0, _SHORT, _LONG, 4096, n),
    ),
}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("name", sorted(SCALINGS))
def test_traced_seq_len_as_exact_as_a_static_one(name, dtype, rng):
    scaling, formula = SCALINGS[name]
    scale = scaling.frequencies(_DIM, 10000.0, None)[1]
    x = rng.standard_normal((2, 3, 1, _DIM)).astype(np.float32)  # [batch, heads, seq = 1, dim]
    xj = jnp.asarray(x, dtype=getattr(jnp, dtype))
    x = np.asarray(xj, dtype=np.float64)  # the input as rounded to dtype
    step = jax.jit(lambda x, offset, seq_len: pe.rope(x, scaling=scaling, offset=offset, seq_len=seq_len))
    pair = np.sqrt(x[..., : _DIM // 2] ** 2 + x[..., _DIM // 2 :] ** 2)
    pair = np.concatenate([pair, pair], -1)
    for position in (19, 4095, 4096, 16000, 10**6):
        expected = rope_formula(x, *rope_tables(np.array([position]), formula(position + 1), "half"), "half") * scale
        got = np.asarray(step(xj, position, position + 1), dtype=np.float64)
        # docs/precision.md: angles within 1e-6 without float64; then float32 roundings
        bound = (1e-6 + 8 * 2.0**-24) * pair * scale
        if dtype == "bfloat16":  # within one bfloat16 ulp of the float64 result
            bound = bound + np.spacing(np.abs(expected).astype(ml_dtypes.bfloat16)).astype(np.float64)
        assert np.all(np.abs(got - expected) <= bound), (position, np.abs(got - expected).max())
        eager = np.asarray(pe.rope(xj, scaling=scaling, offset=position, seq_len=position + 1), dtype=np.float64)
        assert np.all(np.abs(got - eager) <= 2 * bound)


def test_traced_dynamic_frequencies_are_the_host_table_rounded_once():
    dyn = SCALINGS["dynamic"][0]
    lengths = jnp.asarray([19, 4095, 4096, 4097, 16000, 10**6, 2**31 - 1])
    got, _ = jax.jit(lambda n: pe.rope_frequencies(_DIM, scaling=dyn, seq_len=n, xp=jnp))(lengths)
    for row, n in zip(np.asarray(got), np.asarray(lengths)):
        table = dynamic_ntk_inv_freq(_DIM, 10000.0, 4.0, 4096, int(n))
        np.testing.assert_allclose(row, table, rtol=2.0**-24, atol=0)
