"""JAX CPU arrays through the Numba kernels (``posenc._jax``): the kernel is taken,
eagerly and under ``jax.jit``; it gives the NumPy path's bits; ``jax.grad`` through it equals
the reference backend's; ``jax.vmap`` is one batched kernel call equal to a loop; bad input
meets the NumPy path's errors (at trace time where values are static, inside the host
call where they are not), and nothing reads out of bounds under ``NUMBA_BOUNDSCHECK=1``.

JAX runs here without x64; float64 runs under ``jax.enable_x64(True)``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from arrays import child_pythonpath

import posenc as pe
from posenc import _dispatch

jax = pytest.importorskip("jax")
jnp = jax.numpy
ml_dtypes = pytest.importorskip("ml_dtypes")
pytest.importorskip("numba")

from posenc._jax import cpu as jax_cpu  # noqa: E402
from posenc._jax import native as jax_native  # noqa: E402
from posenc._jax import register as jax_kernels  # noqa: E402

OPS = ("rope_rotate", "rope_apply", "toeplitz_expand", "toeplitz_gather", "toeplitz_scatter")
DTYPES = ("float16", "bfloat16", "float32", "float64")
NUMPY_DTYPE = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16, "float32": np.float32, "float64": np.float64}


def _frequencies(half, base=10000.0):
    return base ** (-np.arange(half) / half)


def _cos_sin(positions, half, layout):
    angle = positions.astype(np.float64)[:, None] * _frequencies(half)
    twice = (lambda t: np.concatenate([t, t], -1)) if layout == "half" else (lambda t: np.repeat(t, 2, -1))
    return twice(np.cos(angle)), twice(np.sin(angle))


def _samples(dtype, rng):
    """``{op: (args, kwargs)}``: NumPy arguments of each op, floats in ``dtype``, one call each."""
    f = lambda *s: rng.standard_normal(s).astype(NUMPY_DTYPE[dtype])  # noqa: E731
    x = f(2, 3, 7, 12)
    c, s = _cos_sin(np.arange(100, 107), 5, "interleaved")
    q_len, k_len, m = 5, 7, 4
    index = np.clip(np.arange(q_len + k_len - 1) - 3, 0, m - 1).astype(np.int32)
    return {
        "rope_rotate": ((x, np.arange(1000, 1007, dtype=np.int32), _frequencies(5)), {"layout": "half", "scale": 1.25}),
        "rope_apply": ((x, c.astype(x.dtype), s.astype(x.dtype)), {"layout": "interleaved"}),
        "toeplitz_expand": ((f(3, q_len + k_len - 1), q_len, k_len), {}),
        "toeplitz_gather": ((f(2, q_len, m), index, k_len), {}),
        "toeplitz_scatter": ((f(2, q_len, k_len), index, m), {}),
    }


def _jax(a):
    return jnp.asarray(a) if isinstance(a, np.ndarray) else a


def _array_positions(op):
    """Which positional arguments of ``op`` are arrays (the others: lengths, host frequencies)."""
    return {"rope_rotate": (0, 1), "rope_apply": (0, 1, 2)}.get(op, (0, 1) if op != "toeplitz_expand" else (0,))


def _bits(a):
    a = np.asarray(a)
    return a.view(f"u{a.dtype.itemsize}")


def _launcher_spy(monkeypatch):
    """``{op: calls}`` of each op's Numba CPU kernel launcher (the function NumPy arrays get), counted from now."""
    calls = {op: 0 for op in OPS}
    for op in OPS:
        (entry,) = (k for k in _dispatch.kernels(op) if k.name == f"{op}.numba_cpu")
        real = entry.load()

        def counted(*args, _real=real, _op=op, **kwargs):
            calls[_op] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(entry, "_impl", counted)
    jax_cpu._numpy_kernel.cache_clear()
    return calls


@pytest.fixture
def spy(monkeypatch):
    """Counts the calls of each op's Numba CPU kernel launcher; every traced call takes the
    Python handler, which runs the launcher (not ``jax_native``'s compiled one)."""
    monkeypatch.setattr(jax_native, "rotation", lambda *args: None)
    calls = _launcher_spy(monkeypatch)
    for cache in (jax_cpu._numpy_kernel, jax_cpu._rotation, jax_cpu._cos_sin_rotation, jax_cpu._expansion, jax_cpu._indexed):
        cache.cache_clear()
    yield calls
    for cache in (jax_cpu._numpy_kernel, jax_cpu._rotation, jax_cpu._cos_sin_rotation, jax_cpu._expansion, jax_cpu._indexed):
        cache.cache_clear()


def _x64(dtype):
    return jax.enable_x64(dtype == "float64")


# --- the kernel is taken, and gives the NumPy path's bits ---------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", OPS)
def test_same_bits_as_numpy_eager_and_jitted(op, dtype, spy, rng):
    with _x64(dtype):
        args, kwargs = _samples(dtype, rng)[op]
        want = _dispatch.call(op, *args, **kwargs)
        assert spy[op] == 1  # the NumPy call itself ran the kernel
        arrays = _array_positions(op)
        jargs = [jnp.asarray(a) if i in arrays else a for i, a in enumerate(args)]
        assert _dispatch.select(op, *jargs, **kwargs) is getattr(jax_cpu, op)
        eager = _dispatch.call(op, *jargs, **kwargs)
        assert spy[op] == 2

        def fn(*traced):
            full = list(jargs)
            for i, t in zip(arrays, traced):
                full[i] = t
            return _dispatch.call(op, *full, **kwargs)

        jitted = jax.block_until_ready(jax.jit(fn)(*(jargs[i] for i in arrays)))
        assert spy[op] == 3
    for got in (eager, jitted):
        assert isinstance(got, jax.Array) and got.dtype.name == dtype and got.shape == want.shape
        np.testing.assert_array_equal(_bits(got), _bits(want))


def _clear_traced():
    for cache in (jax_cpu._numpy_kernel, jax_cpu._rotation):
        cache.cache_clear()


@pytest.mark.parametrize(
    ("dtype", "layout", "positions"),
    [(d, "half", "int32") for d in DTYPES] + [("float32", "interleaved", "int32"), ("float32", "half", "float32"), ("float64", "interleaved", "int64")],
)
def test_small_traced_rotations_run_in_the_compiled_handler(dtype, layout, positions, monkeypatch, rng):
    """A decode-size ``rope_rotate`` under ``jit``: the compiled FFI handler (no launcher, no
    Python), the NumPy path's bits."""
    x = rng.standard_normal((1, 8, 3, 32)).astype(NUMPY_DTYPE[dtype])
    p = (np.arange(3) + 1000).astype(positions)
    kwargs = {"layout": layout, "inverse": True, "scale": 1.25}
    with jax.enable_x64(dtype == "float64" or positions == "int64"):
        want = _dispatch.call("rope_rotate", x, p, _frequencies(12), **kwargs)
        calls = _launcher_spy(monkeypatch)
        _clear_traced()
        fn = jax.jit(lambda x, p: _dispatch.call("rope_rotate", x, p, _frequencies(12), **kwargs))
        got = jax.block_until_ready(fn(jnp.asarray(x), jnp.asarray(p)))
        assert f"posenc_rope_rotate_{dtype}_{layout}_{positions}" in fn.lower(jnp.asarray(x), jnp.asarray(p)).as_text()
    assert calls["rope_rotate"] == 0
    np.testing.assert_array_equal(_bits(got), _bits(want))


def test_compiled_handler_hands_over_what_its_plan_does_not_cover(monkeypatch, rng):
    """Other shapes (``vmap``'s batch) and angles beyond the kernel's reduction (or NaN) go to
    the Python handler and the launcher, which gives them the NumPy path's results."""
    x = rng.standard_normal((2, 4, 3, 16)).astype(np.float32)
    calls = _launcher_spy(monkeypatch)
    _clear_traced()
    freqs = _frequencies(8)
    rotate = jax.jit(lambda x, p: _dispatch.call("rope_rotate", x, p, freqs))
    for p in (np.array([1.0, 2.0, 3e12], np.float32), np.array([1.0, np.nan, 3.0], np.float32)):
        want = _dispatch.call("rope_rotate", x, p, freqs)
        before = calls["rope_rotate"]
        got = rotate(jnp.asarray(x), jnp.asarray(p))
        assert calls["rope_rotate"] == before + 1
        np.testing.assert_array_equal(_bits(got), _bits(want))
    assert "posenc_rope_rotate_float32_half_float32" in rotate.lower(jnp.asarray(x), jnp.asarray(p)).as_text()
    calls["rope_rotate"] = 0
    offsets = jnp.asarray([0, 7, 300])
    batched = jax.jit(jax.vmap(lambda o: pe.rope(jnp.asarray(x), offset=o)))(offsets)
    assert calls["rope_rotate"] == 1  # the whole batch: one launcher call
    for i, o in enumerate([0, 7, 300]):
        np.testing.assert_array_equal(np.asarray(batched[i]), pe.rope(x, offset=o))


@pytest.mark.parametrize("jit", [False, True])
def test_grad_through_the_compiled_handler_equals_the_reference(jit, rng):
    x = jnp.asarray(rng.standard_normal((1, 8, 1, 32)).astype(np.float32))
    weights = jnp.asarray(rng.standard_normal(x.shape).astype(np.float32))
    p = jnp.asarray([3.5])

    def loss(x, p):
        return jnp.sum(weights * pe.rope(x, p, inverse=True))

    grad = jax.grad(loss, argnums=(0, 1))
    got = (jax.jit(grad) if jit else grad)(x, p)
    with pe.use_backend("reference"):
        want = grad(x, p)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_public_functions_same_bits_as_numpy(dtype, rng):
    # Functions whose work outside the kernels is exact or identical in both (no matmuls:
    # XLA's and NumPy's BLAS round differently; shaw/deberta/xl are checked at the kernels above).
    x = rng.standard_normal((1, 4, 9, 16)).astype(dtype)
    table = rng.standard_normal((32, 4)).astype(dtype)
    c, s = (t.astype(dtype) for t in _cos_sin(np.arange(9) + 50, 8, "half"))
    slopes = pe.alibi_slopes(4).astype(dtype)
    calls = {
        "rope": (lambda x, o: pe.rope(x, offset=o, scaling=pe.scaling.YaRN(4.0, 8)), (x, 1000)),
        "apply_rope": (lambda x, c, s: pe.apply_rope(x, c, s), (x, c, s)),
        "rerotate": (lambda x: pe.rerotate(x, 17, _frequencies(8)), (x,)),
        "t5_bias": (lambda t, o: pe.t5_bias(t, 9, 12, offset=o), (table, 3)),
        "alibi_bias": (lambda s, o: pe.alibi_bias(s, 9, 12, offset=o), (slopes, 3)),
    }
    with _x64(dtype):
        for name, (fn, args) in calls.items():
            want = fn(*args)
            jargs = [jnp.asarray(a) for a in args]
            for got in (fn(*jargs), jax.jit(fn)(*jargs)):
                assert got.dtype == want.dtype, name
                np.testing.assert_array_equal(_bits(got), _bits(want), err_msg=name)


def test_eager_reads_and_writes_jax_memory_without_copies(monkeypatch, rng):
    x = jnp.asarray(rng.standard_normal((2, 5, 8)).astype(np.float32))
    seen = {}
    (entry,) = (k for k in _dispatch.kernels("rope_rotate") if k.name == "rope_rotate.numba_cpu")
    real = entry.load()

    def look(x_view, positions, inv_freq, *, out, **kwargs):
        seen["x"], seen["out"] = x_view.ctypes.data, out
        return real(x_view, positions, inv_freq, out=out, **kwargs)

    monkeypatch.setattr(entry, "_impl", look)
    jax_cpu._numpy_kernel.cache_clear()
    try:
        result = pe.rope(x)
    finally:
        jax_cpu._numpy_kernel.cache_clear()
    assert seen["x"] == x.unsafe_buffer_pointer()
    assert seen["out"].ctypes.data == result.unsafe_buffer_pointer()


def test_accepts_only_cpu_jax_and_the_reference_elsewhere(monkeypatch, rng):
    x = jnp.asarray(rng.standard_normal((3, 8)).astype(np.float32))
    positions, freqs = jnp.arange(3), _frequencies(4)
    assert _dispatch.select("rope_rotate", x, positions, freqs) is jax_cpu.rope_rotate
    with pe.use_backend("reference"):
        assert _dispatch.select("rope_rotate", x, positions, freqs) is _dispatch.references()["rope_rotate"]
    # A tracer where the default backend is not the CPU (a GPU, a TPU) keeps the reference.
    monkeypatch.setattr(jax_kernels, "_cpu_backend", lambda jax: False)
    chosen = []
    jax.jit(lambda x: chosen.append(_dispatch.select("rope_rotate", x, positions, freqs)) or x)(x)
    assert chosen == [_dispatch.references()["rope_rotate"]]
    # JAX arrays never meet the NumPy/torch kernels' accepts, and traced frequencies keep the reference.
    assert not any(k.accepts_call(x, positions, freqs) for k in _dispatch.kernels("rope_rotate") if k.name != "rope_rotate.jax_cpu")
    monkeypatch.undo()
    jax.jit(lambda x, f: chosen.append(_dispatch.select("rope_rotate", x, positions, f)) or x)(x, jnp.asarray(freqs))
    assert chosen[-1] is _dispatch.references()["rope_rotate"]


# --- gradients against the reference backend -----------------------------------------------------


def _grad_cases(rng):
    f = lambda *s: jnp.asarray(rng.standard_normal(s).astype(np.float32))  # noqa: E731
    c, s = (jnp.asarray(t, dtype=jnp.float32) for t in _cos_sin(np.arange(6) + 3, 3, "half"))
    ci, si = (jnp.asarray(t, dtype=jnp.float32) for t in _cos_sin(np.arange(6) + 3, 3, "interleaved"))
    return {
        "rope": (lambda x: pe.rope(x, offset=5), [f(2, 6, 8)]),
        "rope[yarn scale, interleaved, partial, inverse]": (
            lambda x: pe.rope(x, offset=40, layout="interleaved", rotary_dim=6, inverse=True, scaling=pe.scaling.YaRN(4.0, 8)),
            [f(2, 6, 8)],
        ),
        "rope[float positions]": (lambda x, p: pe.rope(x, p), [f(2, 6, 8), jnp.asarray([0.5, 3.0, 7.25, 100.0, 1.5, 2.0])]),
        "rope[float per-row positions, inverse]": (lambda x, p: pe.rope(x, p[:, :, None], seq_axis=-2, inverse=True), [f(2, 3, 4, 8), f(2, 3) * 10]),
        "apply_rope[x, cos, sin]": (lambda x, c, s: pe.apply_rope(x, c, s), [f(2, 6, 8), c, s]),
        "apply_rope[interleaved, partial, broadcast]": (lambda x, c, s: pe.apply_rope(x, c, s, layout="interleaved"), [f(2, 6, 9), ci, si]),
        "t5_bias": (lambda t: pe.t5_bias(t, 5, 8, offset=2), [f(32, 3)]),
        "alibi_bias": (lambda s: pe.alibi_bias(s, 4, 6), [f(3)]),
        "shaw_logits": (lambda q, k, t: pe.shaw_logits(q, k, t, max_distance=2, offset=1), [f(2, 4, 5), f(2, 6, 5), f(5, 5)]),
        "shaw_output": (lambda w, v, t: pe.shaw_output(w, v, t, max_distance=2, offset=1), [f(2, 4, 6), f(2, 6, 3), f(5, 3)]),
        "deberta_logits": (lambda q, k, p: pe.deberta_logits(q, k, p, p, max_distance=3), [f(2, 4, 4), f(2, 6, 4), f(2, 6, 4)]),
    }


@pytest.mark.parametrize("name", list(_grad_cases(np.random.default_rng(0))))
@pytest.mark.parametrize("jit", [False, True])
def test_grad_through_the_kernels_equals_the_reference(name, jit, spy, rng):
    fn, args = _grad_cases(rng)[name]
    weights = jnp.asarray(rng.standard_normal(np.shape(fn(*args))).astype(np.float32))
    argnums = tuple(range(len(args)))
    grad = jax.grad(lambda *a: jnp.sum(weights * fn(*a)), argnums=argnums)
    grad = jax.jit(grad) if jit else grad
    got = jax.block_until_ready(grad(*args))
    # Forward and backward through the kernels (a bias's backward, the diagonal sums, is
    # jax.numpy; under jit XLA drops a forward call whose value the gradient does not need).
    assert sum(spy.values()) >= (1 if jit or name in ("t5_bias", "alibi_bias") else 2)
    with pe.use_backend("reference"):
        want = jax.grad(lambda *a: jnp.sum(weights * fn(*a)), argnums=argnums)(*args)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=2e-5, atol=2e-5, err_msg=f"{name}: argument {i}")


@pytest.mark.parametrize("op", OPS)
def test_grad_of_each_op_is_its_adjoint(op, rng):
    """<op(a), g> == <a, op^T(g)> in float64 for the linear argument of each op."""
    with jax.enable_x64(True):
        args, kwargs = _samples("float64", rng)[op]
        arrays = _array_positions(op)
        jargs = [jnp.asarray(a) if i in arrays else a for i, a in enumerate(args)]
        y = _dispatch.call(op, *jargs, **kwargs)
        g = jnp.asarray(rng.standard_normal(y.shape))

        def inner(a):
            return jnp.vdot(_dispatch.call(op, a, *jargs[1:], **kwargs), g)

        adjoint = jax.jit(jax.grad(inner))(jargs[0])
        np.testing.assert_allclose(float(jnp.vdot(jargs[0], adjoint)), float(inner(jargs[0])), rtol=1e-12)
        with pe.use_backend("reference"):
            want = jax.grad(inner)(jargs[0])
        np.testing.assert_allclose(np.asarray(adjoint), np.asarray(want), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", list(_grad_cases(np.random.default_rng(0))))
@pytest.mark.parametrize("jit", [False, True])
def test_forward_mode_through_the_kernels_equals_the_reference(name, jit, spy, rng):
    """``jax.jvp`` (every argument's tangent at once) and ``jax.jacfwd`` of the first argument."""
    fn, args = _grad_cases(rng)[name]
    tangents = tuple(jnp.asarray(rng.standard_normal(a.shape).astype(np.float32)) for a in args)
    jvp = lambda *a: jax.jvp(fn, a, tangents)  # noqa: E731
    jacfwd = jax.jacfwd(fn)
    got = [(jax.jit(f) if jit else f)(*args) for f in (jvp, jacfwd)]
    assert sum(spy.values()) >= 1
    with pe.use_backend("reference"):
        want = [f(*args) for f in (jvp, jacfwd)]
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=2e-5, atol=2e-5, err_msg=name)


def test_hessian_and_grad_of_vmap(rng):
    # Forward over reverse (jax.hessian), and reverse mode over a batched call.
    x = jnp.asarray(rng.standard_normal((3, 8)).astype(np.float32))
    p = jnp.asarray([1.0, 2.5, 9.0])
    c, s = (jnp.asarray(t, dtype=jnp.float32) for t in _cos_sin(np.arange(3) + 3, 4, "half"))

    def cases():
        return (
            jax.hessian(lambda p: jnp.sum(pe.rope(x, p) ** 3))(p),
            jax.grad(lambda x: jnp.sum(jax.vmap(lambda o: pe.rope(x, offset=o))(jnp.arange(4) * 5) ** 3))(x),
            jax.grad(lambda c: jnp.sum(jax.vmap(lambda x: pe.apply_rope(x, c, s))(jnp.stack([x, 2 * x])) ** 3))(c),
        )

    got = cases()
    with pe.use_backend("reference"):
        want = cases()
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-4, atol=1e-4)


def test_second_order_gradient_of_rope(rng):
    # Reverse over reverse: the backward passes are kernel calls with backward passes of their own.
    x = jnp.asarray(rng.standard_normal((3, 8)).astype(np.float32))
    p = jnp.asarray([1.0, 2.5, 9.0])

    def hvp(fn):
        return jax.jacrev(jax.grad(lambda p: jnp.sum(fn(x, p) ** 3)))(p)

    got = hvp(lambda x, p: pe.rope(x, p))
    with pe.use_backend("reference"):
        want = hvp(lambda x, p: pe.rope(x, p))
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-4)


# --- vmap: one batched call, equal to a loop -------------------------------------------------------


def _vmap_cases(rng):
    f = lambda *s: jnp.asarray(rng.standard_normal(s).astype(np.float32))  # noqa: E731
    c, s = (jnp.asarray(t, dtype=jnp.float32) for t in _cos_sin(np.arange(5), 4, "half"))
    table = f(4, 32, 3)
    index = jnp.asarray([0, 1, 2, 2, 1, 0, 0, 1], dtype=jnp.int32)
    x, x3, scores = f(2, 5, 8), f(3, 5, 8), f(2, 4, 3)
    return {
        "rope[x batched]": (lambda x: pe.rope(x, offset=3), (f(4, 2, 5, 8),), 0),
        "rope[positions batched]": (lambda p: pe.rope(x, p), (jnp.arange(20).reshape(4, 5),), 0),
        "rope[both, seq in front]": (lambda x, p: pe.rope(x, p), (f(5, 4, 8), jnp.arange(20).reshape(4, 5) * 7), (1, 0)),
        "rope[offset batched]": (lambda o: pe.rope(x, offset=o), (jnp.arange(4) * 100,), 0),
        "apply_rope[x batched]": (lambda x: pe.apply_rope(x, c, s), (f(4, 3, 5, 8),), 0),
        "apply_rope[cos, sin batched]": (lambda c, s: pe.apply_rope(x3, c, s), (jnp.stack([c] * 4) * 0.5, jnp.stack([s] * 4)), 0),
        "t5_bias[table batched]": (lambda t: pe.t5_bias(t, 4, 6), (table,), 0),
        "toeplitz_gather[scores batched]": (lambda a: _dispatch.call("toeplitz_gather", a, index, 5), (f(3, 2, 4, 3),), 0),
        "toeplitz_gather[index batched]": (
            lambda i: _dispatch.call("toeplitz_gather", scores, i, 5), (jnp.stack([index, 2 - index]),), 0,
        ),
        "toeplitz_scatter[weights batched]": (lambda w: _dispatch.call("toeplitz_scatter", w, index, 3), (f(3, 2, 4, 5),), 0),
    }


@pytest.mark.parametrize("name", list(_vmap_cases(np.random.default_rng(0))))
def test_vmap_is_one_batched_call_equal_to_a_loop(name, spy, rng):
    fn, args, axes = _vmap_cases(rng)[name]
    axes = axes if isinstance(axes, tuple) else (axes,) * len(args)
    counted = dict(spy)
    got = jax.block_until_ready(jax.jit(jax.vmap(fn, in_axes=axes))(*args))
    calls = {op: spy[op] - counted[op] for op in OPS}
    # One host call; a batched Toeplitz index (a 1-D kernel argument) is one kernel call per index row in it.
    assert sum(calls.values()) == (2 if "index batched" in name else 1), calls
    n = args[0].shape[axes[0]]
    want = jnp.stack([fn(*(jnp.take(a, i, axis=ax) for a, ax in zip(args, axes))) for i in range(n)])
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_nested_vmap_and_vmap_of_grad(rng):
    x = jnp.asarray(rng.standard_normal((3, 2, 5, 8)).astype(np.float32))
    offsets = jnp.asarray([0, 9, 70])
    nested = jax.vmap(jax.vmap(lambda x, o: pe.rope(x, offset=o), in_axes=(0, None)), in_axes=(0, 0))(x, offsets)
    for i in range(3):
        for j in range(2):
            np.testing.assert_array_equal(np.asarray(nested[i, j]), np.asarray(pe.rope(x[i, j], offset=int(offsets[i]))))
    per_example = jax.vmap(jax.grad(lambda x, o: jnp.sum(pe.rope(x, offset=o) ** 2)))(x, offsets)
    with pe.use_backend("reference"):
        want = jax.vmap(jax.grad(lambda x, o: jnp.sum(pe.rope(x, offset=o) ** 2)))(x, offsets)
    np.testing.assert_allclose(np.asarray(per_example), np.asarray(want), rtol=2e-5, atol=2e-5)


# --- bad input: the NumPy path's errors ------------------------------------------------------------


def _errors(fn, *numpy_args):
    """The exception types and messages of ``fn`` on NumPy and on JAX arguments (eager, jitted)."""
    got = []
    for args, wrap in ((numpy_args, lambda f: f), ([_jax(a) for a in numpy_args], lambda f: f), ([_jax(a) for a in numpy_args], jax.jit)):
        with pytest.raises((ValueError, TypeError)) as info:
            wrap(fn)(*args)
        got.append((type(info.value), str(info.value)))
    return got


BAD_CALLS = {
    "rope[odd rotary_dim]": (lambda x: pe.rope(x, rotary_dim=3), (np.ones((2, 4, 8), np.float32),)),
    "rope[positions shape]": (lambda x, p: pe.rope(x, p), (np.ones((2, 4, 8), np.float32), np.arange(3))),
    "rope[integer x]": (lambda x: pe.rope(x), (np.ones((2, 4, 8), np.int32),)),
    "apply_rope[cos shape]": (lambda x, c: pe.apply_rope(x, c, c), (np.ones((2, 4, 8), np.float32), np.ones((3, 8), np.float32))),
    "apply_rope[cos too wide]": (lambda x, c: pe.apply_rope(x, c, c), (np.ones((2, 4, 8), np.float32), np.ones((4, 10), np.float32))),
    "t5_bias[table shape]": (lambda t: pe.t5_bias(t, 3, 4), (np.ones((32,), np.float32),)),
    "kernel: rope_rotate[too many frequencies]": (
        lambda x, p: _dispatch.call("rope_rotate", x, p, np.ones(5)), (np.ones((2, 8), np.float32), np.arange(2)),
    ),
    "kernel: rope_apply[cos shape]": (
        lambda x, c: _dispatch.call("rope_apply", x, c, c), (np.ones((2, 8), np.float32), np.ones((3, 4), np.float32)),
    ),
    "kernel: toeplitz_expand[vec length]": (lambda v: _dispatch.call("toeplitz_expand", v, 3, 4), (np.ones((2, 5), np.float32),)),
    "kernel: toeplitz_gather[index length]": (
        lambda s, i: _dispatch.call("toeplitz_gather", s, i, 4), (np.ones((3, 2), np.float32), np.zeros(5, np.int32)),
    ),
    "kernel: toeplitz_scatter[index length]": (
        lambda w, i: _dispatch.call("toeplitz_scatter", w, i, 2), (np.ones((3, 4), np.float32), np.zeros(7, np.int32)),
    ),
}


@pytest.mark.parametrize("name", list(BAD_CALLS))
def test_bad_input_gets_the_numpy_error_eager_and_at_trace_time(name):
    fn, args = BAD_CALLS[name]
    numpy, eager, jitted = _errors(fn, *args)
    assert eager == numpy and jitted[0] is numpy[0], name
    # Traced values are named by JAX's repr in a few messages; the check and its words are the same.
    assert jitted[1].split(",")[0] == numpy[1].split(",")[0], (jitted, numpy)


def test_traced_index_out_of_range_is_refused_inside_the_host_call():
    scores = np.ones((2, 3, 2), np.float32)
    index = np.array([0, 1, 2, 1, 0, 0], np.int32)  # 2 is out of range for m = 2
    with pytest.raises(ValueError, match=r"index values must lie in \[0, 2\)") as numpy_error:
        _dispatch.call("toeplitz_gather", scores, index, 4)
    with pytest.raises(ValueError, match=r"index values must lie in \[0, 2\)"):
        _dispatch.call("toeplitz_gather", jnp.asarray(scores), jnp.asarray(index), 4)
    gather = jax.jit(lambda s, i: _dispatch.call("toeplitz_gather", s, i, 4))
    with pytest.raises(Exception, match=r"index values must lie in \[0, 2\)") as traced_error:
        gather(jnp.asarray(scores), jnp.asarray(index)).block_until_ready()
    assert str(numpy_error.value) in str(traced_error.value)
    scatter = jax.jit(lambda w, i: _dispatch.call("toeplitz_scatter", w, i, 2))
    with pytest.raises(Exception, match=r"index values must lie in \[0, 2\)"):
        scatter(jnp.ones((2, 3, 4)), jnp.asarray(index)).block_until_ready()


def test_no_out_of_bounds_access_under_numba_boundscheck(tmp_path):
    script = textwrap.dedent(
        """
        import jax, jax.numpy as jnp, numpy as np, posenc as pe
        from posenc import _dispatch
        x = jnp.asarray(np.random.default_rng(0).standard_normal((2, 3, 9, 10)).astype(np.float32))
        for fn in (lambda x, o: pe.rope(x, offset=o, rotary_dim=6), lambda x, o: pe.rope(x, offset=o, layout="interleaved")):
            np.testing.assert_array_equal(np.asarray(jax.jit(fn)(x, 2**30)), np.asarray(fn(x, 2**30)))
        t = jnp.ones((32, 4))
        assert pe.t5_bias(t, 9, 1).shape == jax.jit(lambda t, o: pe.t5_bias(t, 9, 1, offset=o))(t, 10**6).shape
        q = x[0]
        jax.jit(lambda q, o: pe.shaw_logits(q, q, jnp.ones((5, 10)), max_distance=2, offset=o))(q, -10**6).block_until_ready()
        jax.jit(jax.grad(lambda w: pe.shaw_output(w, q, jnp.ones((5, 10)), max_distance=2).sum()))(jnp.ones((3, 9, 9))).block_until_ready()
        for bad in (np.full(12, -1), np.full(12, 7)):
            try:
                jax.jit(lambda s, i: _dispatch.call("toeplitz_gather", s, i, 4))(jnp.ones((9, 3)), jnp.asarray(bad, jnp.int32)).block_until_ready()
            except Exception as e:
                assert "index values must lie in [0, 3)" in str(e), e
            else:
                raise AssertionError("out-of-range index accepted")
        print("ok")
        """
    )
    env = {**os.environ, "NUMBA_BOUNDSCHECK": "1", "NUMBA_CACHE_DIR": str(tmp_path)}
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=900)
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stderr[-3000:]


NATIVE_BUILD = """
from numba.core import event
from posenc._jax import native
with event.install_recorder("numba:compile") as recorder:
    native._target("float32", "half", "int32")
compiled = sorted({e[1].data["dispatcher"].py_func.__qualname__ for e in recorder.buffer if e[1].is_start and "posenc" in e[1].data["dispatcher"].py_func.__qualname__})
print(native._TARGETS[("float32", "half", "int32")][1].cache_hits, compiled)
"""


def test_the_native_handler_loads_from_numbas_cache_with_its_kernel(tmp_path):
    """``native._target`` compiles its copy of the rotation kernel with ``njit`` alone, no
    ``cache=True``: the kernel is linked into the handler, which ``_family.jitted`` keeps in
    Numba's cache, so a second process loads the handler and compiles nothing, the kernel
    included."""
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path), "PYTHONPATH": child_pythonpath(Path(pe.__file__).parent.parent)}
    cold, warm = (subprocess.run([sys.executable, "-c", NATIVE_BUILD], env=env, capture_output=True, text=True, check=True, timeout=300).stdout.strip() for _ in range(2))
    assert cold == "0 ['posenc_rope_rotate_float32_half_int32_kernel']"
    assert warm == "1 []"


# --- posenc bench's JAX rows time what they name ------------------------------------------------------


def test_bench_jax_rows_time_the_calls_they_name():
    from posenc import _bench_jax
    from posenc._bench_measure import _measure

    rope, t5 = _bench_jax.RopeCalls((1, 2, 6, 16), offset=40), _bench_jax.T5Calls(3, 9)
    for calls in (rope, t5):
        want = calls.numpy()
        for got in (calls.eager(), calls.jit()):
            assert isinstance(got, jax.Array)
            np.testing.assert_array_equal(_bits(got), _bits(want))
        # The plain jnp formula computes the same values (XLA's cos/sin or log round differently).
        np.testing.assert_allclose(np.asarray(calls.plain_jit()), want, rtol=1e-5, atol=1e-5)
    rows = _measure("rope", _bench_jax._cases(rope, "rope", 2 * rope.x.nbytes), 1, lambda s: None)
    assert [r.impl for r in rows] == ["jnp plain formula, jax.jit", "posenc rope (NumPy arrays)", "posenc rope (JAX, eager)", "posenc rope (JAX, jax.jit)"]
    assert rows[0].plain_seconds is None and all(r.plain_seconds == rows[0].seconds for r in rows[1:])
    line = _bench_jax.decode(rounds=1, calls=2)
    assert line.startswith("rope jax.jit [1,32,1,128]") and line.split()[-1] == "1.5"


def test_host_call_registry_stays_bounded_and_kept_for_live_computations(monkeypatch):
    """A long-running process that jits calls of ever new bases and shapes: the host
    functions and native plans the computations name are held by those computations, and
    past them by a queue of the last ``RETIRED`` (here 8), not for the process (they were:
    one host function per base or length and one plan per shape, never freed). A function
    still alive keeps its own and gives the same bits after the others are dropped."""
    import collections
    import gc

    from posenc._jax import ffi

    monkeypatch.setattr(ffi, "_RETIRED", collections.deque(maxlen=8), raising=False)
    x = jnp.asarray(np.random.default_rng(0).standard_normal((1, 2, 3, 8)).astype(np.float32))
    alive = jax.jit(lambda x: pe.rope(x, base=500.0))
    first = alive(x)
    gc.collect()
    hosts, plans = len(ffi._HOSTS), len(jax_native._PLANS)
    for i in range(24):
        jax.jit(lambda x: pe.rope(x, base=1000.0 + i))(x).block_until_ready()  # a host function and a plan each
        jax.jit(lambda x: pe.rope(x))(jnp.ones((1, 1, 1 + i, 8), jnp.float32)).block_until_ready()  # a plan each
        jax.jit(lambda: pe.t5_bias(jnp.ones((32, 2)), 1 + i, 5))().block_until_ready()  # a host function each
    gc.collect()
    assert len(ffi._HOSTS) <= hosts + 8 and len(jax_native._PLANS) <= plans + 8, (len(ffi._HOSTS), len(jax_native._PLANS))
    np.testing.assert_array_equal(np.asarray(alive(x)), np.asarray(first))
    np.testing.assert_array_equal(np.asarray(first), pe.rope(np.asarray(x), base=500.0))
