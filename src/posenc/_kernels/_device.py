"""GPU arrays as numba.cuda device arrays, zero-copy, and the caller's stream.

CuPy arrays and torch CUDA tensors go through ``__cuda_array_interface__`` (16-bit floats
as ``uint16`` bits, see ``_codec``; torch's interface has no bfloat16, so the tensor is
viewed as ``int16`` first). numba device arrays, including the CUDA simulator's fake
ones (which have no ``__cuda_array_interface__``), are used as they are. ``is_device_array``
and ``float_kind`` are cheap: they never import numba, torch or CuPy.
"""

from __future__ import annotations

import sys

import numpy as np

from .. import _compat
from . import _codec

_KINDS = {
    "float32": _codec.FLOAT,
    "float64": _codec.FLOAT,
    "float16": _codec.FLOAT16,
    "torch.float32": _codec.FLOAT,
    "torch.float64": _codec.FLOAT,
    "torch.float16": _codec.FLOAT16,
    "torch.bfloat16": _codec.BFLOAT16,
}


def is_numba_device_array(a) -> bool:
    module = type(a).__module__
    return module.startswith("numba.cuda") and hasattr(a, "shape") and hasattr(a, "dtype")


def is_device_array(a) -> bool:
    """A numba device array, a CuPy array or a torch CUDA tensor."""
    if is_numba_device_array(a) or _compat.is_cupy_array(a):
        return True
    return _compat.is_torch_array(a) and a.device.type == "cuda" and not a.requires_grad


def library(a) -> str:
    if _compat.is_torch_array(a):
        return "torch"
    if _compat.is_cupy_array(a):
        return "cupy"
    return "numba"


def float_kind(a):
    return _KINDS.get(str(a.dtype))


def element_strides(a):
    """Strides in elements (torch counts elements, the others bytes)."""
    if library(a) == "torch":
        return tuple(a.stride())
    return tuple(st // a.dtype.itemsize for st in a.strides)


def as_numba(a, *, bits16=True):
    """A numba device array over ``a``'s memory (16-bit floats as ``uint16`` bits)."""
    from numba import cuda

    lib = library(a)
    if lib == "torch":
        if bits16 and a.dtype.itemsize == 2 and a.dtype.is_floating_point:
            import torch

            a = a.view(torch.int16)
        a = cuda.as_cuda_array(a.detach(), sync=False)
    elif lib == "cupy":
        a = cuda.as_cuda_array(a, sync=False)
    if bits16 and (a.dtype == np.float16 or a.dtype == np.int16):
        a = a.view(np.uint16)
    return a


def strided(a, shape, strides):
    """A view of numba device array ``a`` (from its first element) with element ``strides``."""
    item = a.dtype.itemsize
    byte_strides = tuple(st * item for st in strides)
    if type(a).__module__.startswith("numba.cuda.simulator"):
        from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

        return FakeCUDAArray(np.lib.stride_tricks.as_strided(a._ary, shape=shape, strides=byte_strides))
    from numba.cuda.cudadrv.devicearray import DeviceNDArray

    return DeviceNDArray(shape, byte_strides, a.dtype, stream=a.stream, gpu_data=a.gpu_data)


def empty_like(a):
    lib = library(a)
    if lib == "torch":
        import torch

        return torch.empty_like(a)
    if lib == "cupy":
        import cupy

        return cupy.empty_like(a)
    from numba import cuda

    return cuda.device_array(a.shape, dtype=a.dtype, stream=a.stream)


def stream_and_device(a):
    """``(stream, device index)`` to launch on: the caller's current stream for ``a``."""
    from numba import cuda

    lib = library(a)
    if lib == "torch":
        import torch

        ptr, device = torch.cuda.current_stream(a.device).cuda_stream, a.device.index
    elif lib == "cupy":
        ptr, device = sys.modules["cupy"].cuda.get_current_stream().ptr, a.device.id
    else:
        return a.stream, None
    # Handle 0 is the legacy default stream, which numba names default_stream().
    return (cuda.external_stream(ptr) if ptr else cuda.default_stream()), device


def data_pointer(a) -> int:
    if type(a).__module__.startswith("numba.cuda.simulator"):
        return a._ary.__array_interface__["data"][0]
    return a.device_ctypes_pointer.value or 0


def overlap(a, b) -> bool:
    (al, ah), (bl, bh) = extent(a), extent(b)
    return al < bh and bl < ah


def extent(a):
    """``(lowest, highest + 1)`` byte addresses that device array ``a`` touches."""
    start = data_pointer(a)
    low = high = 0
    for n, st in zip(a.shape, a.strides):
        if n == 0:
            return start, start
        if st < 0:
            low += (n - 1) * st
        else:
            high += (n - 1) * st
    return start + low, start + high + a.dtype.itemsize
