"""Array plumbing for the Toeplitz kernels: what kind an array is, zero-copy views, output buffers.

The kernels see NumPy arrays (Numba CPU, through ``_host.numpy_view``) or numba device
arrays (numba.cuda) with the leading batch axes merged into one, and 16-bit floats as
``uint16`` payloads. The helpers here get there without copying the large arrays:

* ``kind`` tells NumPy, torch CPU, torch CUDA, CuPy and numba device arrays apart by
  looking at types and ``sys.modules``, never importing a framework or numba;
* ``device_payload`` is a zero-copy numba view of a CUDA array (through
  ``numba.cuda.as_cuda_array``; torch bfloat16 through an ``int16`` view);
* ``merge_leading`` makes the batch axes one axis when the strides allow it; callers fall
  back to one launch per outer index otherwise.
"""

from __future__ import annotations

import math

import numpy as np

from .. import _compat
from ._device import is_numba_device_array
from ._host import tracks_gradient

FLOAT_NAMES = ("float16", "bfloat16", "float32", "float64")


def dtype_name(dtype) -> str:
    return str(dtype).rsplit(".", 1)[-1]


def kind(a) -> str | None:
    """``"numpy"``, ``"torch-cpu"``, ``"torch-cuda"``, ``"cupy"``, ``"numba-cuda"`` or ``None``."""
    if isinstance(a, np.ndarray):
        return "numpy"
    if _compat.is_torch_array(a):
        return {"cpu": "torch-cpu", "cuda": "torch-cuda"}.get(a.device.type)
    if _compat.is_cupy_array(a):
        return "cupy"
    if is_numba_device_array(a):
        return "numba-cuda"
    return None


def device_payload(a):
    """A zero-copy numba device array view of a CUDA array; 16-bit floats as uint16."""
    from numba import cuda

    if _compat.is_torch_array(a):
        a = a.detach()
        if dtype_name(a.dtype) in ("float16", "bfloat16"):
            import torch

            return cuda.as_cuda_array(a.view(torch.int16), sync=False).view(np.uint16)
    if not is_numba_device_array(a):
        a = cuda.as_cuda_array(a, sync=False)
    return a.view(np.uint16) if a.dtype == np.float16 else a


def empty_like_kind(like, shape):
    """An uninitialised result of ``shape`` of the same kind, dtype and device as ``like``."""
    dtype = like.dtype
    which = kind(like)
    if which in ("torch-cpu", "torch-cuda"):
        import torch

        return torch.empty(shape, dtype=dtype, device=like.device)
    if which == "cupy":
        import cupy

        with cupy.cuda.Device(like.device.id):
            return cupy.empty(shape, dtype=dtype)
    if which == "numba-cuda":
        from numba import cuda

        return cuda.device_array(shape, dtype=dtype, stream=getattr(like, "stream", 0))
    return np.empty(shape, dtype=dtype)


def _strided_view(a, shape, strides):
    """``a`` with another shape and byte strides over the same memory (NumPy or numba)."""
    if isinstance(a, np.ndarray):
        return np.lib.stride_tricks.as_strided(a, shape, strides, writeable=a.flags.writeable)
    if hasattr(a, "_ary"):  # the CUDA simulator's array wraps a NumPy array
        return type(a)(_strided_view(a._ary, shape, strides), stream=a.stream)
    return type(a)(shape=shape, strides=strides, dtype=a.dtype, stream=a.stream, gpu_data=a.gpu_data)


def merge_leading(a, lead_ndim):
    """``a`` with its first ``lead_ndim`` axes as one axis (a view), or ``None`` if strides forbid it."""
    shape, strides = tuple(a.shape), tuple(a.strides)
    tail_shape, tail_strides = shape[lead_ndim:], strides[lead_ndim:]
    if lead_ndim == 1:
        return a
    axes = [(n, s) for n, s in zip(shape[:lead_ndim], strides[:lead_ndim]) if n != 1]
    for (_, outer), (n, inner) in zip(axes, axes[1:]):
        if outer != inner * n:
            return None
    stride = axes[-1][1] if axes else 0
    count = math.prod(shape[:lead_ndim])
    return _strided_view(a, (count, *tail_shape), (stride, *tail_strides))


def batched(launch, arrays, lead_ndim):
    """Run ``launch(*views)`` on ``arrays`` with their leading axes merged into one.

    All arrays share the same ``lead_ndim`` leading axes. When the strides of one of them
    cannot be merged, launch once per index of all but the last leading axis instead.
    """
    views = [merge_leading(a, lead_ndim) for a in arrays]
    if all(v is not None for v in views):
        launch(*views)
        return
    for index in np.ndindex(*tuple(arrays[0].shape)[: lead_ndim - 1]):
        launch(*(a[index] for a in arrays))
