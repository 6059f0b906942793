"""Distances computed exactly before they become floats, and ``cos - 1`` without its
cancellation: FIRE past ``2**24`` and Sandwich at short distances, in float32 namespaces
(JAX without x64) as in float64 ones, against formulas evaluated in high precision."""

from __future__ import annotations

import numpy as np
import pytest

import posenc as pe


def _fire_reference(qpos, kpos, c=0.1, threshold=512.0, eps=1e-6):
    """FIRE's normalised distance in float64 from integer positions (exact differences)."""
    qpos, kpos = np.asarray(qpos, dtype=np.int64), np.asarray(kpos, dtype=np.int64)
    rel = (qpos[:, None] - kpos[None, :]).astype(np.float64)
    psi = lambda v: np.log(np.abs(c * v) + 1)  # noqa: E731
    return psi(rel) / (psi(np.maximum(qpos.astype(np.float64), threshold)) + eps)[:, None]


@pytest.mark.parametrize("position", [2**24 + 1, 10**9])
def test_fire_distances_of_far_positions_without_float64(position):
    """JAX without x64 computes in float32: the positions are subtracted as integers first.
    (Converted first, ``2**24 - 1`` and ``2**24`` became one float and distance 1 read as 0.)"""
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    if jax.config.jax_enable_x64:
        pytest.skip("JAX with x64 computes in float64")
    keys = [position - 2, position - 1, position]
    got = pe.fire_distances(1, 3, query_positions=jnp.asarray([position], dtype=jnp.int32), key_positions=jnp.asarray(keys, dtype=jnp.int32))
    assert got.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(got), _fire_reference([position], keys), rtol=2e-6)
    if position < 2**25:  # the last query of a sequence that long (a 64 MiB row)
        decode = pe.fire_distances(1, position + 1, xp=jnp)
        np.testing.assert_allclose(np.asarray(decode)[0, -3:], _fire_reference([position], keys)[0], rtol=2e-6)


def _sandwich_exact(rel, dim, base=10000.0):
    mpmath = pytest.importorskip("mpmath")
    with mpmath.workdps(40):
        return np.array(
            [float(sum(mpmath.cos(r * mpmath.mpf(base) ** (mpmath.mpf(-2 * k) / dim)) - 1 for k in range(1, dim // 2 + 1))) for r in rel]
        )


@pytest.mark.parametrize("library", ["numpy", "jax"])
def test_sandwich_at_short_distances_is_within_an_ulp_or_two(library):
    """``sum_k (cos_k - 1)`` from ``-2 sin^2`` of the half angles: within two ulps of the
    exact value in float64 (NumPy) and float32 (JAX without x64); ``cos - 1`` had lost 85 and
    67 ulps at distance 1."""
    if library == "jax":
        jnp = pytest.importorskip("jax").numpy
        got = np.asarray(pe.sandwich_vector(4, 4, 16, xp=jnp))[0]
    else:
        got = pe.sandwich_vector(4, 4, 16, dtype=np.float64)[0]
    want = _sandwich_exact(range(-3, 4), 16).astype(got.dtype)
    ulps = np.abs(got.astype(np.float64) - want) / np.spacing(np.maximum(np.abs(want), np.finfo(got.dtype).tiny))
    assert ulps[want != 0].max() <= 2, ulps
    assert got[3] == 0
