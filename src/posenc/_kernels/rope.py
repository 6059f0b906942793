"""Registrations of the rotary kernels (ops ``rope_rotate`` and ``rope_apply``).

* ``rope_rotate_numba_cpu`` / ``rope_apply_numba_cpu``: NumPy arrays and torch CPU tensors
  (float16, bfloat16 (torch), float32, float64; any strides);
* ``rope_rotate_numba_cuda`` / ``rope_apply_numba_cuda``: CuPy arrays, torch CUDA tensors
  and numba device arrays (non-negative strides).

``accepts`` only looks at types, dtypes, devices and strides: it imports neither numba
nor a framework. Samples cover both layouts, partial rotary, ``inverse``, ``scale``,
``out`` (``None``, a buffer, ``x`` itself), strided and transposed views, every dtype and
positions ``[S]``, ``[B, 1, S]`` and per token. The CUDA kernels have samples only where
numba.cuda can run (a GPU or the simulator); elsewhere their equivalence test skips.
"""

from __future__ import annotations

import importlib.util
import itertools

import numpy as np

from .. import _compat
from .._dispatch import register
from ..rotary import _rotate  # noqa: F401  (registers the references these kernels optimise)
from . import _available, _device, _host

# ---------------------------------------------------------------------------- accepts


def _positions_dtype_ok(p) -> bool:
    if _compat.is_numpy_array(p):
        return p.dtype.kind in "iuf"
    return str(p.dtype) != "torch.bool" and not p.dtype.is_complex


def _host_strides_ok(a) -> bool:
    return not _compat.is_numpy_array(a) or all(st % a.itemsize == 0 for st in a.strides)


def _host_out_ok(x, out) -> bool:
    if out is None:
        return True
    if type(out) is not type(x) or not _host.is_host_array(out) or out.dtype != x.dtype or tuple(out.shape) != tuple(x.shape):
        return False
    if _compat.is_numpy_array(out):
        return out.flags.writeable and _host.writes_each_element_once(out) and _host_strides_ok(out)
    return out.numel() == 0 or all(st != 0 or n <= 1 for n, st in zip(out.shape, out.stride()))


def _host_x_ok(x) -> bool:
    return _host.is_host_array(x) and _host.float_kind(x) is not None and x.ndim >= 1 and _host_strides_ok(x)


def _host_rotate_accepts(x, positions, inv_freq, *, layout="half", inverse=False, scale=1.0, out=None):
    return (
        _host_x_ok(x)
        and type(positions) is type(x)
        and _host.is_host_array(positions)
        and _positions_dtype_ok(positions)
        and _host_strides_ok(positions)
        and _host_out_ok(x, out)
        and _available.numba_cpu()
    )


def _host_apply_accepts(x, cos, sin, *, layout="half", out=None):
    return (
        _host_x_ok(x)
        and all(type(c) is type(x) and _host.is_host_array(c) and c.dtype == x.dtype for c in (cos, sin))
        and _host_strides_ok(cos)
        and _host_strides_ok(sin)
        and _host_out_ok(x, out)
        and _available.numba_cpu()
    )


def _device_array_ok(a, like) -> bool:
    return (
        _device.is_device_array(a)
        and _device.library(a) == _device.library(like)
        and all(st >= 0 for st in _device.element_strides(a))
        and (_device.library(a) == "torch" or all(st % a.dtype.itemsize == 0 for st in a.strides))
    )


def _device_out_ok(x, out) -> bool:
    if out is None:
        return True
    return (
        _device_array_ok(out, x)
        and str(out.dtype) == str(x.dtype)
        and tuple(out.shape) == tuple(x.shape)
        and (0 in out.shape or all(st != 0 or n <= 1 for n, st in zip(out.shape, _device.element_strides(out))))
    )


def _device_x_ok(x) -> bool:
    return _device.is_device_array(x) and _device.float_kind(x) is not None and x.ndim >= 1 and _device_array_ok(x, x)


def _device_rotate_accepts(x, positions, inv_freq, *, layout="half", inverse=False, scale=1.0, out=None):
    return (
        _device_x_ok(x)
        and _device_array_ok(positions, x)
        and (str(positions.dtype).rsplit(".", 1)[-1] in _DEVICE_POSITION_DTYPES)
        and _device_out_ok(x, out)
        and _available.numba_cuda()
    )


def _device_apply_accepts(x, cos, sin, *, layout="half", out=None):
    return (
        _device_x_ok(x)
        and all(_device_array_ok(c, x) and _device.float_kind(c) is not None for c in (cos, sin))
        and _device_out_ok(x, out)
        and _available.numba_cuda()
    )


# Integer and float positions the GPU kernel converts itself (16-bit floats go to the reference).
_DEVICE_POSITION_DTYPES = {"int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float32", "float64"}

# ---------------------------------------------------------------------------- samples


def _has_torch() -> bool:
    return importlib.util.find_spec("torch") is not None


def _frequencies(half):
    return 10000.0 ** (-np.arange(half) / max(half, 1))


def _make(data, dtype):
    """NumPy data as a NumPy array or torch tensor of ``dtype`` (``"torch.<name>"`` for torch)."""
    if dtype.startswith("torch."):
        import torch

        return torch.from_numpy(np.ascontiguousarray(data)).to(getattr(torch, dtype[6:]))
    return np.asarray(data).astype(dtype)


def _views(rng, dtype):
    """``(name, x)``: contiguous ``[B, H, S, D]``, a strided slice and a transposed view."""
    b, h, s, d = 2, 3, 5, 10
    yield "contiguous", _make(rng.standard_normal((b, h, s, d)), dtype)
    big = _make(rng.standard_normal((b, h, 2 * s, d + 3)), dtype)
    yield "strided", big[:, :, ::2, 1 : d + 1]
    bshd = _make(rng.standard_normal((b, s, h, d)), dtype)
    yield "transposed", bshd.permute(0, 2, 1, 3) if dtype.startswith("torch.") else bshd.transpose(0, 2, 1, 3)


def _positions(rng, x, like):
    """Positions ``[S]`` (int64), ``[B, 1, S]`` (int32) and per token (float32)."""
    b, h, s = x.shape[:3]
    yield _make(np.arange(s) + 7, like + "int64")
    yield _make(rng.integers(0, 1000, (b, 1, s)), like + "int32")
    yield _make(rng.integers(0, 1000, (b, h, s)).astype(np.float32), like + "float32")


def _outs(x, kind):
    if kind == "none":
        return None
    if kind == "self":
        return x
    return x.clone() * 0 if hasattr(x, "clone") else np.zeros_like(x)


def _rotate_samples(rng, dtypes):
    options = itertools.cycle(
        [
            dict(layout="half"),
            dict(layout="interleaved", inverse=True),
            dict(layout="half", scale=1.5),
            dict(layout="interleaved", scale=0.75, inverse=True),
        ]
    )
    out_kinds = itertools.cycle(["none", "buffer", "self"])
    for dtype in dtypes:
        like = "torch." if dtype.startswith("torch.") else ""
        for _, x in _views(rng, dtype):
            for positions in _positions(rng, x, like):
                for rotary in (10, 4):  # full and partial rotary
                    kwargs = dict(next(options), out=_outs(x, next(out_kinds)))
                    yield (x, positions, _frequencies(rotary // 2)), kwargs


def _cos_sin(rng, x, rotary, layout, dtype, per_token):
    b, h, s = x.shape[:3]
    shape = (b, 1, s) if not per_token else (b, h, s)
    angle = rng.uniform(-50, 50, shape + (rotary // 2,))
    pairs = np.repeat(angle, 2, axis=-1) if layout == "interleaved" else np.concatenate([angle, angle], axis=-1)
    return _make(np.cos(pairs), dtype), _make(np.sin(pairs), dtype)


def _apply_samples(rng, dtypes):
    layouts = itertools.cycle(["half", "interleaved"])
    out_kinds = itertools.cycle(["none", "buffer", "self"])
    for dtype in dtypes:
        for _, x in _views(rng, dtype):
            for rotary, per_token in ((10, False), (6, True)):
                layout = next(layouts)
                cos, sin = _cos_sin(rng, x, rotary, layout, dtype, per_token)
                yield (x, cos, sin), dict(layout=layout, out=_outs(x, next(out_kinds)))


_HOST_DTYPES = ("float16", "float32", "float64")
_TORCH_DTYPES = ("torch.bfloat16", "torch.float16", "torch.float32", "torch.float64")


def _host_dtypes():
    return _HOST_DTYPES + (_TORCH_DTYPES if _has_torch() else ())


def _cuda_ready() -> bool:
    return _available.numba_cuda()


def _rotate_cpu_samples(rng):
    return _rotate_samples(rng, _host_dtypes())


def _apply_cpu_samples(rng):
    return _apply_samples(rng, _host_dtypes())


def _rotate_cuda_samples(rng):
    return _rotate_samples(rng, _HOST_DTYPES) if _cuda_ready() else iter(())


def _apply_cuda_samples(rng):
    return _apply_samples(rng, _HOST_DTYPES) if _cuda_ready() else iter(())


def _device_copy(a):
    """A numba device copy of NumPy array ``a``, with ``a``'s strides where ``a`` is a view."""
    from numba import cuda

    base = a if a.base is None else a.base
    if not (isinstance(base, np.ndarray) and base.dtype == a.dtype and base.flags.c_contiguous):
        return cuda.to_device(np.ascontiguousarray(a))
    offset = (a.__array_interface__["data"][0] - base.__array_interface__["data"][0]) // a.itemsize
    flat = cuda.to_device(base.reshape(-1))[offset:]
    return _device.strided(flat, a.shape, _host.element_strides(a))


def _device_copies():
    """Converts host arrays to device copies, each object once (so ``out is x`` survives)."""
    copies = {}

    def convert(a):
        if not isinstance(a, np.ndarray):
            return a
        if id(a) not in copies:
            copies[id(a)] = _device_copy(a)
        return copies[id(a)]

    return convert


def _rotate_to_device(args, kwargs):
    convert = _device_copies()
    x, positions, inv_freq = args  # inv_freq stays a host array, by contract
    return [convert(x), convert(positions), inv_freq], {k: convert(v) for k, v in kwargs.items()}


def _apply_to_device(args, kwargs):
    convert = _device_copies()
    return [convert(a) for a in args], {k: convert(v) for k, v in kwargs.items()}


# ---------------------------------------------------------------------------- registry

register(
    "rope_rotate",
    "rope_rotate_numba_cpu",
    accepts=_host_rotate_accepts,
    loader="posenc._kernels.rope_cpu:rotate_positions",
    samples=_rotate_cpu_samples,
)
register(
    "rope_apply",
    "rope_apply_numba_cpu",
    accepts=_host_apply_accepts,
    loader="posenc._kernels.rope_cpu:rotate_cos_sin",
    samples=_apply_cpu_samples,
)
register(
    "rope_rotate",
    "rope_rotate_numba_cuda",
    accepts=_device_rotate_accepts,
    loader="posenc._kernels.rope_cuda:rotate_positions",
    samples=_rotate_cuda_samples,
    to_device=_rotate_to_device,
)
register(
    "rope_apply",
    "rope_apply_numba_cuda",
    accepts=_device_apply_accepts,
    loader="posenc._kernels.rope_cuda:rotate_cos_sin",
    samples=_apply_cuda_samples,
    to_device=_apply_to_device,
)
