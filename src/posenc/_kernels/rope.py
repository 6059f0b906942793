"""Registrations of the rotary kernels (ops ``rope_rotate`` and ``rope_apply``, and ``rope_rotate_at_length``'s
custom op), and their launchers' guard.

In the order the registry tries them:

* ``<op>.torch_autograd``: torch tensors that autograd records, and every torch tensor
  while ``torch.compile`` traces (``_arrays.to_custom_op``): ``posenc.torch._ops``'s custom
  ops, whose backward is the inverse rotation;
* ``<op>.numba_cpu``: NumPy arrays and torch CPU tensors (float16, bfloat16 (torch),
  float32, float64; any strides), in ``rope_cpu``;
* ``<op>.numba_cuda``: CuPy arrays, torch CUDA tensors and numba device arrays
  (non-negative strides), in ``rope_cuda``.

``accepts`` only looks at types, dtypes, devices and strides: it imports neither numba
nor a framework. ``guard_rotate``/``guard_apply`` are the checks every launcher runs
before a kernel indexes anything (the public functions validated the arguments; these
keep a direct ``_dispatch.call`` from reading or writing out of bounds).
"""

from __future__ import annotations

import numpy as np

from .._dispatch import ready, register
from ..rotary import _rotate, frequencies  # noqa: F401  (registers the references these kernels optimise)
from ..rotary.scaling import nameable
from . import _arrays

# ---------------------------------------------------------------- accepts


def _positions_dtype_ok(p) -> bool:
    name = _arrays.dtype_name(p.dtype)
    return name in _arrays.INTEGERS or name in ("float16", "bfloat16", "float32", "float64")


def _out_ok(x, out, *, host) -> bool:
    if out is None:
        return True
    if out is x:  # in place: x itself passed the library, device, dtype, shape and stride checks
        return _arrays.writeable(out) and _arrays.writes_each_element_once(out)
    return (
        _arrays.library(out) == _arrays.library(x)
        and (_arrays.on_host(out) if host else _arrays.on_gpu(out))
        and out.dtype == x.dtype
        and tuple(out.shape) == tuple(x.shape)
        and _arrays.writeable(out)
        and _arrays.writes_each_element_once(out)
        and (host or _arrays.forward_strides(out))
    )


def _host_ok(a, x) -> bool:
    return _arrays.library(a) == _arrays.library(x) and _arrays.on_host(a)  # (any strides: rope_cpu copies the ones it cannot address)


def _gpu_ok(a, x) -> bool:
    return _arrays.library(a) == _arrays.library(x) and _arrays.on_gpu(a) and _arrays.forward_strides(a)


def _x_ok(x, ok) -> bool:
    return _arrays.storage(x) is not None and x.ndim >= 1 and ok(x, x)


def _host_rotate(a) -> bool:
    x, positions = a["x"], a["positions"]
    return (
        _x_ok(x, _host_ok)
        and _host_ok(positions, x)
        and _positions_dtype_ok(positions)
        and _out_ok(x, a["out"], host=True)
        and _arrays.numba_cpu()
    )


def _host_apply(a) -> bool:
    x = a["x"]
    return (
        _x_ok(x, _host_ok)
        and all(_host_ok(c, x) and c.dtype == x.dtype for c in (a["cos"], a["sin"]))
        and _out_ok(x, a["out"], host=True)
        and _arrays.numba_cpu()
    )


def _gpu_rotate(a) -> bool:
    x, positions = a["x"], a["positions"]
    return (
        _x_ok(x, _gpu_ok)
        and _gpu_ok(positions, x)
        # 16-bit float positions are left to the reference: the kernel converts the others itself.
        and _arrays.dtype_name(positions.dtype) in (*_arrays.INTEGERS, "float32", "float64")
        and _out_ok(x, a["out"], host=False)
        and _arrays.numba_cuda()
    )


def _gpu_apply(a) -> bool:
    x = a["x"]
    return (
        _x_ok(x, _gpu_ok)
        and all(_gpu_ok(c, x) and c.dtype == x.dtype for c in (a["cos"], a["sin"]))
        and _out_ok(x, a["out"], host=False)
        and _arrays.numba_cuda()
    )


# ---------------------------------------------------------------- specialisations and launcher guard

# Every compiled kernel of the CPU families and the CUDA ones: one per (op, dtype, layout) (the CUDA
# family adds the layout "half, words": rope_cuda.WORDS).
SPECIALISATIONS = [(op, dtype, layout) for op in ("rotate", "apply") for dtype in _arrays.ELEMENT for layout in ("half", "interleaved")]


def _host_length(seq_len) -> bool:
    """A length ``rope_rotate_at_length``'s torch op reads on the host: an int, or a CPU tensor."""
    return not _arrays.torch_tensor(seq_len) or seq_len.device.type == "cpu"


def _guard_out(x, out):
    if out is not None and tuple(out.shape) != tuple(x.shape):
        raise ValueError(f"out has shape {tuple(out.shape)}, expected {tuple(x.shape)} (kernel launcher check)")
    if out is not None and out.dtype != x.dtype:
        raise TypeError(f"out has dtype {out.dtype}, expected x's {x.dtype} (kernel launcher check)")


def _broadcasts(shape, target) -> bool:
    return len(shape) <= len(target) and all(n == 1 or n == t for n, t in zip(reversed(shape), reversed(target)))


def guard_rotate(x, positions, inv_freq, out):
    """``inv_freq`` as contiguous float64, after checking the shapes ``rope_rotate``'s kernels index."""
    inv_freq = np.ascontiguousarray(inv_freq, dtype=np.float64)
    shape = tuple(x.shape)
    if not shape or inv_freq.ndim != 1 or 2 * inv_freq.shape[0] > shape[-1]:
        raise ValueError(f"inv_freq of shape {inv_freq.shape} does not fit x of shape {shape} (kernel launcher check)")
    if not _broadcasts(tuple(positions.shape), shape[:-1]):
        raise ValueError(f"positions of shape {tuple(positions.shape)} do not broadcast against {shape[:-1]} (kernel launcher check)")
    _guard_out(x, out)
    return inv_freq


def guard_apply(x, cos, sin, out):
    """Check the shapes ``rope_apply``'s kernels index."""
    if len(tuple(cos.shape)) < 1 or len(tuple(x.shape)) < 1:
        raise ValueError(f"cos/sin of shape {tuple(cos.shape)} do not fit x of shape {tuple(x.shape)} (kernel launcher check)")
    shape, rotary_dim = tuple(x.shape), tuple(cos.shape)[-1]
    if (
        rotary_dim % 2
        or rotary_dim < 2
        or rotary_dim > shape[-1]
        or tuple(sin.shape) != tuple(cos.shape)
        or not _broadcasts(tuple(cos.shape), shape[:-1] + (rotary_dim,))
    ):
        raise ValueError(f"cos/sin of shape {tuple(cos.shape)} do not fit x of shape {shape} (kernel launcher check)")
    _guard_out(x, out)


# ---------------------------------------------------------------- registry

for _op, _differentiable, _cpu, _gpu, _name in (
    ("rope_rotate", ("x", "positions"), _host_rotate, _gpu_rotate, "rotate_positions"),
    ("rope_apply", ("x", "cos", "sin"), _host_apply, _gpu_apply, "rotate_cos_sin"),
):
    register(
        _op,
        f"{_op}.torch_autograd",
        accepts=lambda a, names=_differentiable: _arrays.to_custom_op([a[n] for n in names]),
        loader=f"posenc.torch._ops:{_op}",
    )
    register(_op, f"{_op}.numba_cpu", accepts=_cpu, loader=f"posenc._kernels.rope_cpu:{_name}")
    register(_op, f"{_op}.numba_cuda", accepts=_gpu, loader=f"posenc._kernels.rope_cuda:{_name}")

# rope's length-dependent scalings at a length that cannot be read now: an int while torch
# compiles (maybe symbolic) or a CPU tensor of the compiled graph, for the custom ops; a
# traced JAX array, for the JAX CPU host call (posenc._jax.register). Each reads the length
# when it runs, then rotates as rope_rotate. (A CUDA length stays in the graph: reading it
# would synchronise, and no CUDA graph could hold the call.)
register(
    "rope_rotate_at_length",
    "rope_rotate_at_length.torch_autograd",
    accepts=lambda a: _host_length(a["seq_len"]) and _arrays.to_custom_op([a["x"], a["positions"]]),
    loader="posenc.torch._ops:rope_rotate_at_length",
)
# ... and rope_frequencies' at such a length (a CPU tensor of the compiled graph).
register(
    "rope_frequencies_at_length",
    "rope_frequencies_at_length.torch_autograd",
    accepts=lambda a: _arrays.torch_tensor(a["seq_len"]) and _host_length(a["seq_len"]) and nameable(a["scaling"]) and ready("torch"),
    loader="posenc.torch._ops:rope_frequencies_at_length",
)
