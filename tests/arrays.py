"""Array backends for the test matrix and an assertion that checks kind before values.

Modelled on array-api-extra's test fixture: one ``Backend`` object per array library
creates arrays from NumPy data, converts results back, says which dtypes it has, and runs
a function the way its library is used (``Backend.call``): under ``jax.jit`` for JAX,
building a graph that computes nothing for Dask. The ordinary tests call posenc through
``backend.call``, so every formula test also proves tracing and laziness.
With ``POSENC_TEST_GPU=1`` (``make test-gpu``) the matrix also runs on the GPU: CuPy arrays
and torch CUDA tensors, which reach the numba.cuda kernels.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os

import numpy as np
import pytest
from array_api_compat import array_namespace, device as device_of

BACKENDS = ("numpy", "array_api_strict", "torch", "dask", "jax")
GPU_BACKENDS = ("cupy", "torch_cuda")
_MODULES = {"numpy": "numpy", "array_api_strict": "array_api_strict", "torch": "torch", "dask": "dask", "jax": "jax", "cupy": "cupy", "torch_cuda": "torch"}
# The floating dtypes every family takes (a result keeps its input's dtype).
DTYPES = ("float16", "bfloat16", "float32", "float64")
# The one tolerance table of the tests: relative and absolute tolerance for a result of
# each dtype against a float64 transcription or another implementation (a few ulps:
# float16 4, bfloat16 4, float32 17 (sums of many terms), float64 ~4500 (libm differences
# in cos/sin grow with the angle)).
TOLERANCE = {"float16": 4e-3, "bfloat16": 3e-2, "float32": 2e-6, "float64": 1e-12}
# Where an op's kernels and reference legitimately round differently: the scatter
# reference sums float16 in float16; its kernels sum in float64 (CPU) or float32 (CUDA).
OP_TOLERANCE = {("toeplitz_scatter", "float16"): 1e-2}
# The spacing of each dtype's numbers just above 1 (2**-mantissa bits): the unit the kernel
# tests state their rounding bounds in.
EPS = {"float16": 2.0**-10, "bfloat16": 2.0**-7, "float32": 2.0**-23, "float64": 2.0**-52}
# The exponent of each dtype's smallest normal number (subnormals are spaced as at it).
MIN_EXPONENT = {"float16": -14, "bfloat16": -126, "float32": -126, "float64": -1022}
_COMPLEX_PARTS = {"complex64": "float32", "complex128": "float64"}


def tolerance(dtype, op=None):
    """Tolerance for a result of ``dtype`` (a dtype or its name), optionally of kernel op ``op``;
    a complex dtype gets the tolerance of its parts."""
    name = str(dtype).rsplit(".", 1)[-1]
    name = _COMPLEX_PARTS.get(name, name)
    return OP_TOLERANCE.get((op, name), TOLERANCE.get(name, 0.0))


def ulp(values, dtype):
    """The spacing of ``dtype``'s numbers (a name) at each of ``values``, subnormals included."""
    tiny = 2.0 ** MIN_EXPONENT[dtype]
    return EPS[dtype] * 2.0 ** np.floor(np.log2(np.maximum(np.abs(values), tiny)))


def assert_float64_specials(got, want, dtype):
    """``got`` (float64 values of a ``dtype`` result) has the infinities (some) and NaNs of the
    float64 formula's ``want`` where it has them, and is within one ulp of it elsewhere."""
    infinite, finite = np.isinf(want), np.isfinite(want)
    assert infinite.any() and np.array_equal(np.isnan(got), np.isnan(want))
    assert np.array_equal(np.isinf(got), infinite) and np.array_equal(got[infinite], want[infinite])
    assert np.all(np.abs(got[finite] - want[finite]) <= ulp(want[finite], dtype))


def gpu_run() -> bool:
    """The suite runs on the GPU too (``make test-gpu`` sets ``POSENC_TEST_GPU=1``)."""
    return os.environ.get("POSENC_TEST_GPU") == "1"


def child_pythonpath(first) -> str:
    """``PYTHONPATH`` for a child process that must import posenc from ``first``: that folder,
    then what this process's ``PYTHONPATH`` held but the checkout's ``src`` (a GPU image's
    own NumPy, say, which its numba-cuda needs)."""
    src = os.path.realpath(os.path.join(os.path.dirname(__file__), os.pardir, "src"))
    kept = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and os.path.realpath(p) != src]
    return os.pathsep.join([str(first), *kept])


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


def to_host(a):
    """An array the kernels take (NumPy, torch on any device, CuPy, a numba device array) as a
    NumPy array, bfloat16 as float32."""
    if hasattr(a, "detach"):
        a = a.detach().cpu()
        return (a.float() if str(a.dtype) == "torch.bfloat16" else a).numpy()
    if hasattr(a, "copy_to_host"):
        return a.copy_to_host()
    if hasattr(a, "get"):
        return a.get()
    return np.asarray(a)


def to_float64(a):
    return to_host(a).astype(np.float64)


def without_float64(make):
    """``(to, back, jit)`` for a namespace without float64: ``make`` is
    ``"array_api_strict_no_float64"`` (array-api-strict's ``no_float64`` device; ``jit`` does
    nothing) or ``"jax_without_x64"`` (skipped where JAX runs with x64): NumPy data to its
    arrays, its arrays back to NumPy, and how it compiles a function."""
    if make == "array_api_strict_no_float64":
        strict = pytest.importorskip("array_api_strict")
        device = strict.Device("no_float64")
        return (lambda a: strict.asarray(a, device=device)), (lambda a: np.asarray(a._array)), (lambda f: f)
    jax = pytest.importorskip("jax")
    if jax.config.jax_enable_x64:
        pytest.skip("jax runs with x64 here")
    return jax.numpy.asarray, np.asarray, jax.jit


def copy_of(value):
    """A copy of an array or tensor (anything else as it is)."""
    if hasattr(value, "clone"):
        return value.clone()
    return value.copy() if hasattr(value, "copy") else value


class _CountingScheduler:
    """A Dask scheduler that counts the graphs it is asked to compute, then runs them."""

    def __init__(self):
        self.count = 0

    def __call__(self, dsk, keys, **kwargs):
        import dask.local

        self.count += 1
        return dask.local.get_sync(dsk, keys, **kwargs)


@contextlib.contextmanager
def no_dask_compute(what="the call"):
    """Fails if Dask computes anything inside the block (a no-op where Dask is not installed)."""
    if importlib.util.find_spec("dask") is None:
        yield
        return
    import dask

    counter = _CountingScheduler()
    with dask.config.set(scheduler=counter):
        yield
    assert counter.count == 0, f"{counter.count} Dask computation(s) during {what}"


def _results(value):
    return value if isinstance(value, tuple) else (value,)


def lazily(fn, *arrays):
    """``fn(*arrays)`` with Dask arrays: the result must be Dask arrays, built without computing anything."""
    import dask.array as da

    with no_dask_compute("graph building"):
        result = fn(*arrays)
    for r in _results(result):
        assert isinstance(r, da.Array), f"{type(r).__name__} is not a Dask array"
    return result


def jitted(fn, *arrays):
    """``jax.jit(fn)(*arrays)`` and the eager ``fn(*arrays)``: results of the same dtypes and
    shapes (their values may differ by roundings: XLA fuses operations)."""
    import jax

    traced, eager = jax.jit(fn)(*arrays), fn(*arrays)
    for t, e in zip(_results(traced), _results(eager), strict=True):
        assert isinstance(t, jax.Array) and t.dtype == e.dtype and t.shape == e.shape, f"jit {t.dtype}{t.shape}, eager {e.dtype}{e.shape}"
    return traced, eager


class Backend:
    def __init__(self, name: str):
        self.name = name
        self._eager = []  # JAX: (traced result, eager result) of each ``call``
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

    def call(self, fn, *arrays):
        """``fn(*arrays)`` the way this library runs it: JAX under ``jax.jit`` (``arrays`` traced;
        the eager call is made too, and ``assert_close`` checks it like the traced one), Dask
        lazily (nothing computed until asked), the others directly. Options that are no arrays
        belong in ``fn``'s closure."""
        if self.name == "jax":
            traced, eager = jitted(fn, *arrays)
            self._eager += zip(_results(traced), _results(eager))
            return traced
        if self.name == "dask":
            return lazily(fn, *arrays)
        return fn(*arrays)

    def each_run(self, result):
        """``result`` of ``call`` and, for JAX, the eager call's result too: every check made
        on one is made on each."""
        return (result, *(e for t, e in self._eager if t is result))

    def to_numpy(self, a):
        if self.name == "dask":
            return np.asarray(a.compute())
        if self.name == "array_api_strict":
            return np.asarray(a._array)
        if self.name == "jax":
            return np.asarray(a.astype("float32") if a.dtype.name == "bfloat16" else a)
        return to_host(a)


def assert_kind(actual, *, backend: Backend, dtype=None, shape=None, device=None):
    """Check namespace, dtype (a dtype or its name), shape and device of ``actual``."""
    assert array_namespace(actual) is array_namespace(backend.asarray(np.zeros(1))), (
        f"result namespace {array_namespace(actual).__name__} is not {backend.name}"
    )
    if dtype is not None:
        want = backend.dtype(dtype) if isinstance(dtype, str) else dtype
        assert actual.dtype == want, f"dtype {actual.dtype} != {want}"
    if shape is not None:
        assert tuple(actual.shape) == tuple(shape), f"shape {tuple(actual.shape)} != {tuple(shape)}"
    if device is not None:
        assert device_of(actual) == device, f"device {device_of(actual)} != {device}"


def assert_close(actual, expected, *, backend: Backend, dtype=None, shape=None, device=None, rtol=None, atol=None):
    """Check namespace, dtype, shape and device of ``actual``, then its values.

    ``expected`` is a NumPy array (usually a float64 transcription of the formula; its shape
    is the one wanted unless ``shape`` is given); tolerances default to a few ulps of
    ``dtype``. A JAX result of ``Backend.call`` is checked again as the eager call gave it.
    """
    expected = np.asarray(expected)
    for run in backend.each_run(actual):
        assert_kind(run, backend=backend, dtype=dtype, shape=expected.shape if shape is None else shape, device=device)
        got = backend.to_numpy(run)
        tol = tolerance(run.dtype)
        np.testing.assert_allclose(
            got.astype(expected.dtype) if expected.dtype.kind != "O" else got, expected, rtol=tol if rtol is None else rtol, atol=tol if atol is None else atol
        )


def counting_kernel_keys(monkeypatch, module):
    """The keys of kernel module ``module``'s family (``module.FAMILY``) asked for from now
    on, in order: one per launch."""
    keys, family = [], module.FAMILY

    class Counting:
        def __getitem__(self, key):
            keys.append(key)
            return family[key]

    monkeypatch.setattr(module, "FAMILY", Counting())
    return keys


def torch_bits_equal(a, b):
    """torch tensors equal bit for bit up to NaN payloads (a NaN's sign included): the same
    NaNs, values and signs of zero."""
    import torch

    nan = a.isnan()
    return torch.equal(nan, b.isnan()) and torch.equal(torch.nan_to_num(a), torch.nan_to_num(b)) and torch.equal(a.signbit() & ~nan, b.signbit() & ~nan)


def check_compiled_apply_rope_fuses(dtype, device, monkeypatch):
    """``apply_rope`` compiled by inductor (``fullgraph``) on ``device`` tensors of ``dtype``
    calls no custom op and gives the eager kernel's result bit for bit: both layouts, partial
    rotary, broadcast ``cos``/``sin``, signed zeros, infinities (in ``x`` and in the tables)
    and ``cos = 0`` entries (where a 16-bit row's sign of zero comes from the kernel's second
    term)."""
    import torch

    import posenc as pe
    from posenc.torch import _ops

    torch._dynamo.reset()
    gen = torch.Generator(device=device).manual_seed(0)
    calls, kernel = [], _ops._apply_kernel
    monkeypatch.setattr(_ops, "_apply_kernel", lambda *a, **k: calls.append(1) or kernel(*a, **k))
    for layout in ("half", "interleaved"):
        x = torch.randn(2, 3, 5, 12, generator=gen, device=device).to(dtype)
        x[0, 0, 0, :4] = torch.tensor([-0.0, 0.0, -0.0, 0.0])
        x[0, 0, 1, :2] = torch.tensor([float("inf"), -float("inf")])
        angles = torch.randn(2, 1, 5, 4, generator=gen, device=device, dtype=torch.float64) * 100
        angles[0, 0, 0, :2] = 0.0
        doubled = angles.repeat_interleave(2, -1) if layout == "interleaved" else torch.cat([angles, angles], -1)
        cos, sin = doubled.cos().to(dtype), doubled.sin().to(dtype)
        cos[0, 0, 2, :3], sin[0, 0, 2, :3] = 0.0, -0.0
        cos[1, 0, 3, :2], sin[1, 0, 4, 2:4] = float("inf"), -float("inf")

        def f(x, cos, sin):
            return pe.apply_rope(x, cos, sin, layout=layout)

        eager = f(x, cos, sin)
        calls.clear()
        compiled = torch.compile(f, fullgraph=True, dynamic=False)(x, cos, sin)
        assert not calls, "the compiled graph called the custom op"
        assert compiled.dtype == dtype and torch_bits_equal(compiled, eager), layout
