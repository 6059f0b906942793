"""JAX arrays on a GPU (``make test-gpu``): posenc's Array-API reference runs there, eagerly
and under ``jax.jit``, keeps the result on the GPU, and agrees with the NumPy path.

The rest of the suite keeps its JAX arrays on the CPU (``tests/conftest.py``), where
posenc's JAX kernels run; without a GPU that JAX can use, every test here is skipped.
"""

from __future__ import annotations

import numpy as np
import pytest

import posenc as pe
from arrays import gpu_run, tolerance

jax = pytest.importorskip("jax")

GPUS = [d for d in jax.devices() if d.platform == "gpu"] if gpu_run() else []
pytestmark = pytest.mark.skipif(not GPUS, reason="needs a GPU that JAX uses and POSENC_TEST_GPU=1 (make test-gpu)")


def _close(got, want):
    tol = tolerance("float32")
    np.testing.assert_allclose(np.asarray(got, dtype=np.float64), want.astype(np.float64), rtol=tol, atol=tol)


@pytest.mark.parametrize("jit", [False, True])
def test_rope_on_the_gpu_stays_there_and_equals_numpy(jit):
    x = np.random.default_rng(0).standard_normal((2, 4, 16, 64)).astype(np.float32)
    positions = np.arange(16) + 100_000
    rotate = lambda a, p: pe.rope(a, p)  # noqa: E731
    call = jax.jit(rotate) if jit else rotate
    got = call(jax.device_put(x, GPUS[0]), jax.device_put(positions, GPUS[0]))
    assert got.devices() == {GPUS[0]} and got.dtype == np.float32
    _close(got, pe.rope(x, positions))


@pytest.mark.parametrize("jit", [False, True])
def test_t5_bias_on_the_gpu_stays_there_and_equals_numpy(jit):
    table = np.random.default_rng(1).standard_normal((32, 4)).astype(np.float32)
    bias = lambda t: pe.t5_bias(t, 8, 12, offset=5)  # noqa: E731
    got = (jax.jit(bias) if jit else bias)(jax.device_put(table, GPUS[0]))
    assert got.devices() == {GPUS[0]}
    _close(got, pe.t5_bias(table, 8, 12, offset=5))
