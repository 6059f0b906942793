"""The backend matrix itself: every public function runs through ``Backend.call`` in an
ordinary test, and ``Backend.call`` really traces under ``jax.jit`` and really notices a Dask
computation (tests/arrays.py)."""

from __future__ import annotations

import ast
import pathlib

import numpy as np
import pytest

import posenc as pe
from arrays import Backend, lazily

# Public names that take no arrays: the backend switches, the scaling classes' module, warm-up.
NOT_ARRAY_FUNCTIONS = {"get_backend", "set_backend", "use_backend", "scaling", "warmup"}


def _called_through_backend_call():
    """Names ``pe.<name>`` that appear inside a ``backend.call(...)`` of a test module."""
    names = set()
    for path in pathlib.Path(__file__).parent.glob("test_*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            func = getattr(node, "func", None)
            if isinstance(node, ast.Call) and isinstance(func, ast.Attribute) and func.attr == "call" and getattr(func.value, "id", None) == "backend":
                names.update(n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute) and getattr(n.value, "id", None) == "pe")
    return names


def test_every_public_function_runs_through_backend_call():
    assert sorted(set(pe.__all__) - NOT_ARRAY_FUNCTIONS - _called_through_backend_call()) == []


def test_jax_calls_are_traced():
    jnp = pytest.importorskip("jax.numpy")
    jax = pytest.importorskip("jax")
    backend = Backend("jax")
    with pytest.raises(jax.errors.ConcretizationTypeError):  # a Python branch on a value: only eager code may
        backend.call(lambda a: a if float(a[0]) > 0 else -a, jnp.ones(3))
    traced, eager = backend.each_run(backend.call(lambda a: 2 * a, jnp.ones(3)))  # the eager call is made too
    assert traced is not eager and np.array_equal(np.asarray(traced), np.asarray(eager))


def test_dask_computations_are_noticed():
    da = pytest.importorskip("dask.array")
    with pytest.raises(AssertionError, match="1 Dask computation"):
        lazily(lambda a: a * float(a.sum()), da.ones(3, chunks=2))
    with pytest.raises(AssertionError, match="not a Dask array"):
        lazily(lambda a: np.zeros(a.shape), da.ones(3, chunks=2))
