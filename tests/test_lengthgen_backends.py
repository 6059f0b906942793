"""The length-generalisation encodings on every backend (NumPy, array-api-strict, torch, JAX
eager and jitted, Dask), against the NumPy references of tests/test_lengthgen.py."""

from __future__ import annotations

import numpy as np

import posenc as pe
from arrays import GPU_BACKENDS, assert_close
from test_lengthgen import kerple_reference, mae_2d_sincos, sandwich_reference


def test_kerple_bias_on_every_backend(backend):
    r1 = backend.asarray(np.array([0.5, 2.0]), dtype="float32")
    r2 = backend.asarray(np.array([0.3, 1.5]), dtype="float32")
    out = backend.call(lambda a, b: pe.kerple_bias(a, b, 3, 5, kind="log"), r1, r2)
    assert_close(out, kerple_reference([0.5, 2.0], [0.3, 1.5], 3, 5, 2, "log"), backend=backend, dtype="float32")


def test_sandwich_bias_on_every_backend(backend):
    out = backend.call(lambda: pe.sandwich_bias(3, 4, 8, heads=2, xp=backend.xp))
    assert_close(out, sandwich_reference(3, 4, 8, 2, 1), backend=backend, dtype="float32")
    vec = backend.call(lambda: pe.sandwich_vector(3, 4, 8, heads=2, xp=backend.xp))
    assert_close(vec, sandwich_reference(1, 6, 8, 2, 3)[:, 0, ::-1], backend=backend, dtype="float32")


def test_sandwich_bias_has_one_set_of_bits(backend):
    """Its cosines are summed in one fixed order (``cos_k - 1``, term by term), so float64 is
    NumPy's bits on every namespace and the jitted call is the eager one (``xp.sum``'s
    orders had differed by up to 128 ulps under the ``- d/2`` cancellation); with JAX
    without x64, float32 eager and jitted calls agree too. A GPU's own ``cos`` is within an
    ulp of NumPy's, not bitwise the same (CuPy on an H200: 38 of 324 elements 1-2 ulps
    off), so there the float64 sum keeps the same order and is held to the 32 cosines' ulps."""
    import importlib

    x64 = backend.name != "jax" or importlib.import_module("jax").config.jax_enable_x64
    dtype = "float64" if x64 else "float32"
    out = backend.call(lambda: pe.sandwich_bias(9, 12, 64, heads=3, xp=backend.xp, dtype=getattr(backend.xp, dtype)))
    want = pe.sandwich_bias(9, 12, 64, heads=3, dtype=getattr(np, dtype))
    runs = [backend.to_numpy(run) for run in backend.each_run(out)]
    for run in runs:
        if dtype == "float64" and backend.name in GPU_BACKENDS:
            np.testing.assert_allclose(run, want, rtol=0, atol=32 * np.finfo(np.float64).eps)
        elif dtype == "float64":
            np.testing.assert_array_equal(run, want)
        else:
            np.testing.assert_allclose(run, want, rtol=1e-6, atol=1e-7)  # (float32 sums: precision.md's 1e-6)
            np.testing.assert_array_equal(run, runs[0])


def test_fire_bias_on_every_backend(backend):
    def mlp(x):
        return backend.xp.concat([x, 1 - x], axis=-1)

    out = backend.call(lambda: pe.fire_bias(mlp, 2, 3, c=1.0, threshold=2.0, eps=0.0, xp=backend.xp))
    rel = np.abs(np.arange(1, 3)[:, None] - np.arange(3)[None, :])
    x = np.log(rel + 1) / np.log(np.maximum(np.arange(1, 3), 2) + 1)[:, None]
    assert_close(out, np.stack([x, 1 - x]), backend=backend, dtype="float32")
    d = backend.call(lambda: pe.fire_distances(2, 3, c=1.0, threshold=2.0, eps=0.0, xp=backend.xp))
    assert_close(d, x, backend=backend, dtype="float32")


def test_cope_on_every_backend(backend):
    rng = np.random.default_rng(0)
    qn, kn, en = rng.normal(size=(2, 3, 4)), rng.normal(size=(2, 4, 4)), rng.normal(size=(3, 4))
    q, k, e = (backend.asarray(a, dtype="float32") for a in (qn, kn, en))
    g = 1 / (1 + np.exp(-(qn @ kn.transpose(0, 2, 1)) / 2))
    g = np.where(np.arange(4)[None, :] <= np.arange(1, 4)[:, None], g, 0.0)
    p = np.flip(np.cumsum(np.flip(g, -1), -1), -1)
    out = backend.call(lambda a, b: pe.cope_positions(a, b), q, k)
    assert_close(out, p, backend=backend, dtype="float32")
    z = qn @ en.T
    clipped = np.minimum(p, 2.0)
    low, w = np.floor(clipped).astype(int), clipped - np.floor(clipped)
    term = np.take_along_axis(z, low, -1) * (1 - w) + np.take_along_axis(z, np.ceil(clipped).astype(int), -1) * w
    logits = backend.call(lambda a, b, c: pe.cope_logits(a, b, c), q, k, e)
    assert_close(logits, qn @ kn.transpose(0, 2, 1) / 2 + term, backend=backend, dtype="float32")


def papers_cope_logits_numpy(q, k, pos_emb, scale, mask):
    """The paper's CoPE code (tests/test_lengthgen.py's ``papers_cope_logits``) in NumPy, causal."""
    logits = (q @ np.swapaxes(k, -1, -2)) * scale
    gates = 1 / (1 + np.exp(-logits))
    q_len, k_len = q.shape[-2], k.shape[-2]
    gates = np.where(np.arange(k_len)[None, :] <= np.arange(k_len - q_len, k_len)[:, None], gates, np.zeros_like(gates))
    gates = np.where(mask, gates, np.zeros_like(gates))
    pos = np.clip(np.flip(np.cumsum(np.flip(gates, -1), -1), -1), 0.0, pos_emb.shape[-2] - 1)
    logits_int = q @ np.swapaxes(pos_emb, -1, -2)
    pos_floor = np.floor(pos).astype(np.int64)
    w = pos - pos_floor
    return logits + (np.take_along_axis(logits_int, np.ceil(pos).astype(np.int64), -1) * w + np.take_along_axis(logits_int, pos_floor, -1) * (1 - w))


def test_cope_logits_with_per_head_tables_and_a_mask_on_every_backend(backend):
    """The paper's gather of the two integer neighbours on every backend: per-head tables,
    a padding mask, saturated gates (integer positions) and positions past the last row;
    NumPy's float64 bits exactly on NumPy and array-api-strict."""
    rng = np.random.default_rng(4)
    qn, kn, en = rng.normal(size=(2, 3, 5, 4)), rng.normal(size=(2, 3, 7, 4)), rng.normal(size=(3, 4, 4))
    mask = np.ones((2, 1, 1, 7), bool)
    mask[0, ..., :2] = False
    want = papers_cope_logits_numpy(qn, kn, en, 4.0, mask)
    dtype = "float64" if backend.name in ("numpy", "array_api_strict") else "float32"
    q, k, e = (backend.asarray(a, dtype=dtype) for a in (qn, kn, en))
    got = backend.call(lambda a, b, c, m: pe.cope_logits(a, b, c, scale=4.0, mask=m), q, k, e, backend.asarray(mask))
    if dtype == "float64":
        np.testing.assert_array_equal(backend.to_numpy(got), want)
    else:
        assert_close(got, want, backend=backend, dtype="float32", rtol=1e-5, atol=1e-5)


def test_sincos_2d_and_randomized_positions_on_every_backend(backend):
    out = backend.call(lambda: pe.sincos_2d(2, 3, 8, xp=backend.xp))
    assert_close(out, mae_2d_sincos(8, 2, 3), backend=backend, dtype="float32")
    positions = backend.call(lambda: pe.randomized_positions(4, 9, rng=5, xp=backend.xp))
    np.testing.assert_array_equal(backend.to_numpy(positions), pe.randomized_positions(4, 9, rng=5))
