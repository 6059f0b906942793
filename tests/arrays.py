"""Array backends for the test matrix and an assertion that checks kind before values.

Modelled on array-api-extra's test fixture: one ``Backend`` object per array library
creates arrays from NumPy data, converts results back, and says which dtypes it has.
With ``POSENC_TEST_GPU=1`` (``make test-gpu``) the matrix also runs on the GPU: CuPy arrays
and torch CUDA tensors, which reach the numba.cuda kernels.
"""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest
from array_api_compat import array_namespace, device as device_of

BACKENDS = ("numpy", "array_api_strict", "torch", "dask", "jax")
GPU_BACKENDS = ("cupy", "torch_cuda")
_MODULES = {"numpy": "numpy", "array_api_strict": "array_api_strict", "torch": "torch", "dask": "dask", "jax": "jax", "cupy": "cupy", "torch_cuda": "torch"}

# The one tolerance table of the tests: relative and absolute tolerance for a result of
# each dtype against a float64 transcription or another implementation (a few ulps:
# float16 4, bfloat16 4, float32 17 (sums of many terms), float64 ~4500 (libm differences
# in cos/sin grow with the angle)).
TOLERANCE = {"float16": 4e-3, "bfloat16": 3e-2, "float32": 2e-6, "float64": 1e-12}
# Where an op's kernels and reference legitimately round differently: the scatter
# reference sums float16 in float16; its kernels sum in float64 (CPU) or float32 (CUDA).
OP_TOLERANCE = {("toeplitz_scatter", "float16"): 1e-2}


def tolerance(dtype, op=None):
    """Tolerance for a result of ``dtype`` (a dtype or its name), optionally of kernel op ``op``."""
    name = str(dtype).rsplit(".", 1)[-1]
    return OP_TOLERANCE.get((op, name), TOLERANCE.get(name, 0.0))


def gpu_run() -> bool:
    """The suite runs on the GPU too (``make test-gpu`` sets ``POSENC_TEST_GPU=1``)."""
    return os.environ.get("POSENC_TEST_GPU") == "1"


def _usable(name) -> bool:
    if importlib.util.find_spec(_MODULES[name]) is None:
        return False
    if name == "torch_cuda":
        import torch

        return torch.cuda.is_available()
    if name == "cupy":
        import cupy

        return cupy.cuda.is_available()
    return True


def available_backends():
    names = BACKENDS + (GPU_BACKENDS if gpu_run() else ())
    return [b for b in names if _usable(b)]


class Backend:
    def __init__(self, name: str):
        self.name = name
        if name == "numpy":
            from array_api_compat import numpy as xp
        elif name == "array_api_strict":
            import array_api_strict as xp
        elif name in ("torch", "torch_cuda"):
            from array_api_compat import torch as xp
        elif name == "cupy":
            from array_api_compat import cupy as xp
        elif name == "dask":
            from array_api_compat.dask import array as xp
        else:
            import jax.numpy as xp
        self.xp = xp

    def __repr__(self):
        return f"Backend({self.name})"

    def dtype(self, name: str):
        """The namespace's dtype ``name``; skips the test where the backend lacks it."""
        if name == "bfloat16":
            if self.name in ("torch", "torch_cuda"):
                import torch

                return torch.bfloat16
            if self.name == "jax":
                import jax.numpy as jnp

                return jnp.bfloat16
            pytest.skip(f"{self.name} has no bfloat16")
        if name == "float64" and self.name == "jax":
            import jax

            if not jax.config.jax_enable_x64:
                pytest.skip("jax without x64 has no float64")
        if not hasattr(self.xp, name):
            pytest.skip(f"{self.name} has no {name}")
        return getattr(self.xp, name)

    def asarray(self, data, dtype=None):
        """An array of this backend from NumPy data (dtype: a name or a dtype)."""
        data = np.asarray(data)
        if isinstance(dtype, str):
            dtype = self.dtype(dtype)
        if self.name in ("torch", "torch_cuda"):
            import torch

            t = torch.from_numpy(np.ascontiguousarray(data))
            t = t.to(dtype) if dtype is not None else t
            return t.cuda() if self.name == "torch_cuda" else t
        if self.name == "cupy":
            import cupy

            return cupy.asarray(data, dtype=dtype)
        if self.name == "dask":
            import dask.array as da

            chunks = tuple(max(1, (s + 1) // 2) for s in data.shape)
            a = da.from_array(data, chunks=chunks)
            return a.astype(dtype) if dtype is not None else a
        if self.name == "jax":
            import jax.numpy as jnp

            return jnp.asarray(data, dtype=dtype)
        return self.xp.asarray(data, dtype=dtype)

    def to_numpy(self, a):
        if self.name == "cupy":
            return a.get()
        if self.name in ("torch", "torch_cuda"):
            import torch

            a = a.detach().cpu()
            if a.dtype == torch.bfloat16:
                a = a.float()
            return a.numpy()
        if self.name == "dask":
            return np.asarray(a.compute())
        if self.name == "array_api_strict":
            return np.asarray(a._array)
        if self.name == "jax":
            return np.asarray(a.astype("float32") if a.dtype.name == "bfloat16" else a)
        return np.asarray(a)


def assert_close(actual, expected, *, backend: Backend, dtype=None, shape=None, device=None, rtol=None, atol=None):
    """Check namespace, dtype, shape and device of ``actual``, then its values.

    ``expected`` is a NumPy array (usually a float64 transcription of the formula);
    tolerances default to a few ulps of ``dtype``.
    """
    assert array_namespace(actual) is array_namespace(backend.asarray(np.zeros(1))), (
        f"result namespace {array_namespace(actual).__name__} is not {backend.name}"
    )
    if dtype is not None:
        want = backend.dtype(dtype) if isinstance(dtype, str) else dtype
        assert actual.dtype == want, f"dtype {actual.dtype} != {want}"
    expected = np.asarray(expected)
    want_shape = tuple(shape) if shape is not None else expected.shape
    assert tuple(actual.shape) == want_shape, f"shape {tuple(actual.shape)} != {want_shape}"
    if device is not None:
        assert device_of(actual) == device, f"device {device_of(actual)} != {device}"
    got = backend.to_numpy(actual)
    tol = tolerance(actual.dtype)
    rtol = tol if rtol is None else rtol
    atol = tol if atol is None else atol
    np.testing.assert_allclose(got.astype(expected.dtype) if expected.dtype.kind != "O" else got, expected, rtol=rtol, atol=atol)
