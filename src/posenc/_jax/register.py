"""Registrations of the JAX CPU paths of every kernel op (``<op>.jax_cpu``), and their accepts.

A JAX array on the CPU goes through the same Numba CPU kernel a NumPy array does
(``cpu.py``): eagerly on the array's own memory, and under tracing (``jax.jit``,
``jax.grad``, ``jax.jvp``, ``jax.vmap``) as a JAX primitive (``primitive.py``) compiled to
a host call, whose transpose is the kernel's adjoint. JAX on a GPU or TPU keeps the
reference, which XLA fuses on the device.

``accepts`` looks at types, dtypes and devices only, through ``sys.modules`` (no JAX
import): every array argument a JAX array on one CPU device (a tracer: the default
backend is the CPU), float dtypes the kernels read, integer lengths known now, no ``out``
(JAX arrays are immutable).
"""

from __future__ import annotations

import operator
import sys

from .._dispatch import register
from .._kernels import _arrays
from ..relative import _toeplitz  # noqa: F401  (registers the references these kernels optimise)
from ..rotary import _rotate  # noqa: F401

_FLOAT_POSITIONS = ("float16", "bfloat16", "float32", "float64")


def _cpu_backend(jax) -> bool:
    return jax.default_backend() == "cpu"


def tracer(a) -> bool:
    """A JAX value being traced (jit, grad, vmap): its memory cannot be read now."""
    jax = sys.modules.get("jax")
    return jax is not None and isinstance(a, jax.core.Tracer)


def _on_cpu(a) -> bool:
    """A JAX array on the CPU (one device, or sharded over several: ``cpu.py`` calls the
    kernel per shard under ``jit``); a traced one where the default backend is the CPU and
    its shape is known (not symbolic: ``jax.export``'s sizes known when it is called)."""
    jax = sys.modules.get("jax")
    if jax is None or not isinstance(a, jax.Array):
        return False
    if isinstance(a, jax.core.Tracer):
        return _cpu_backend(jax) and all(type(n) is int for n in a.shape)
    return all(device.platform == "cpu" for device in a.devices())


def _float(a) -> bool:
    return _on_cpu(a) and _arrays.storage(a) is not None and a.ndim >= 1


def _integers(a) -> bool:
    return _on_cpu(a) and _arrays.dtype_name(a.dtype) in _arrays.INTEGERS


def _count(n) -> bool:
    """A length known now: a Python or NumPy integer, or a concrete 0-d integer array."""
    if tracer(n):
        return False
    try:
        operator.index(n)
    except TypeError:
        return False
    return True


def _host_numbers(a) -> bool:
    """``inv_freq``: host numbers (a NumPy array, a sequence), or a JAX array that is not traced."""
    return not tracer(a)


def _rotation_ok(a) -> bool:
    """What both rotations read: ``x`` and its positions on the CPU, no ``out``."""
    positions = a["positions"]
    return (
        a["out"] is None
        and _float(a["x"])
        and _on_cpu(positions)
        and _arrays.dtype_name(positions.dtype) in (*_arrays.INTEGERS, *_FLOAT_POSITIONS)
        and _arrays.numba_cpu()
    )


def _rotate_ok(a) -> bool:
    return _rotation_ok(a) and _host_numbers(a["inv_freq"])


def _rotate_at_length_ok(a) -> bool:
    """The lengths: integers, or the whole-number floats of float positions (``sequence_length``)."""
    seq_len = a["seq_len"]
    return _rotation_ok(a) and _on_cpu(seq_len) and _arrays.dtype_name(seq_len.dtype) in (*_arrays.INTEGERS, "float32", "float64")


def _apply_ok(a) -> bool:
    x = a["x"]
    return (
        a["out"] is None
        and _float(x)
        and all(_on_cpu(t) and t.dtype == x.dtype for t in (a["cos"], a["sin"]))
        and _arrays.numba_cpu()
    )


def _expand_ok(a) -> bool:
    return a["out"] is None and _float(a["vec"]) and _count(a["q_len"]) and _count(a["k_len"]) and _arrays.numba_cpu()


def _gather_ok(a) -> bool:
    return a["out"] is None and _float(a["scores"]) and _integers(a["index"]) and _count(a["k_len"]) and _arrays.numba_cpu()


def _scatter_ok(a) -> bool:
    return a["out"] is None and _float(a["weights"]) and _integers(a["index"]) and _count(a["m"]) and _arrays.numba_cpu()


for _op, _accepts in (
    ("rope_rotate", _rotate_ok),
    ("rope_rotate_at_length", _rotate_at_length_ok),
    ("rope_apply", _apply_ok),
    ("toeplitz_expand", _expand_ok),
    ("toeplitz_gather", _gather_ok),
    ("toeplitz_scatter", _scatter_ok),
):
    register(_op, f"{_op}.jax_cpu", accepts=_accepts, loader=f"posenc._jax.cpu:{_op}")
