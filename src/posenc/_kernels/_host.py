"""Zero-copy NumPy views of NumPy arrays and torch CPU tensors for the CPU kernels.

Kernels see float32/float64 arrays as they are and 16-bit floats as ``uint16`` bits
(``_codec``); a torch tensor becomes a NumPy view of its own memory (``Tensor.numpy``), a
bfloat16 tensor through ``Tensor.view(torch.int16)``, so nothing is copied or converted.
The cheap checks (``float_kind``, ``dense_enough``) are used by the registrations' ``accepts``
and never import numba or torch.
"""

from __future__ import annotations

import numpy as np

from .. import _compat
from . import _codec

_NUMPY_KINDS = {"float32": _codec.FLOAT, "float64": _codec.FLOAT, "float16": _codec.FLOAT16}
_TORCH_KINDS = {
    "torch.float32": _codec.FLOAT,
    "torch.float64": _codec.FLOAT,
    "torch.float16": _codec.FLOAT16,
    "torch.bfloat16": _codec.BFLOAT16,
}


def float_kind(a):
    """The ``_codec`` storage kind of a host float array, or ``None`` if unsupported."""
    if _compat.is_numpy_array(a):
        return _NUMPY_KINDS.get(a.dtype.name)
    if _compat.is_torch_array(a):
        return _TORCH_KINDS.get(str(a.dtype))
    return None


def tracks_gradient(a) -> bool:
    """A torch tensor whose result autograd would record (grad mode on): not for a kernel."""
    if not getattr(a, "requires_grad", False):
        return False
    import torch

    return torch.is_grad_enabled()


def is_host_array(a) -> bool:
    """A NumPy array, or a torch CPU tensor that needs no autograd record."""
    if _compat.is_numpy_array(a):
        return True
    return _compat.is_torch_array(a) and a.device.type == "cpu" and not tracks_gradient(a)


def numpy_view(a):
    """``a`` as a NumPy array over the same memory; 16-bit floats as ``uint16`` bits."""
    if _compat.is_torch_array(a):
        a = a.detach()
        if a.dtype.itemsize == 2 and a.dtype.is_floating_point:
            import torch

            return a.view(torch.int16).numpy().view(np.uint16)
        return a.numpy()
    if a.dtype == np.float16:
        return a.view(np.uint16)
    return a


def positions_view(p):
    """Positions as a NumPy array (torch 16-bit floats, which NumPy lacks, as float64)."""
    if _compat.is_torch_array(p):
        if p.dtype.itemsize == 2 and p.dtype.is_floating_point:
            import torch

            return p.detach().to(torch.float64).numpy()
        return p.detach().numpy()
    return np.asarray(p)


def empty_like(a):
    """A new uninitialised array like ``a``, of ``a``'s library.

    A contiguous torch tensor gets NumPy-allocated memory under a torch tensor: NumPy asks
    the kernel for transparent huge pages on large arrays, which makes the first write 3-4x
    faster than into torch's CPU allocation (faulted in 4 KiB pages). Such a tensor is not
    resizable (``Tensor.resize_``); everything else about it is an ordinary tensor.
    """
    if _compat.is_torch_array(a):
        import torch

        if not a.is_contiguous():
            return torch.empty_like(a)
        if a.dtype == torch.bfloat16:
            return torch.from_numpy(np.empty(a.shape, np.int16)).view(torch.bfloat16)
        return torch.from_numpy(np.empty(a.shape, str(a.dtype)[6:]))
    return np.empty_like(a)


def same_view(a, b) -> bool:
    """Whether NumPy arrays ``a`` and ``b`` are the same elements in the same order."""
    return (
        a.shape == b.shape
        and a.strides == b.strides
        and a.__array_interface__["data"][0] == b.__array_interface__["data"][0]
    )


def writes_each_element_once(a) -> bool:
    """No two indices of ``a`` share memory (no stride 0 over an axis longer than one)."""
    return a.size == 0 or all(st != 0 or n <= 1 for n, st in zip(a.shape, a.strides))


def strided(a, shape, strides):
    """A view of ``a`` (from its first element) with ``shape`` and element ``strides``."""
    item = a.itemsize
    return np.lib.stride_tricks.as_strided(a, shape=shape, strides=tuple(st * item for st in strides))


def element_strides(a):
    return tuple(st // a.itemsize for st in a.strides)


def flat_span(a):
    """``(flat, offset)``: a 1-D view of the memory ``a`` spans, and ``a[0, ..., 0]``'s index in it.

    ``a`` has at least one element and strides that are multiples of its item size (of
    any sign); element ``(i, j, ...)`` of ``a`` is ``flat[offset + i*s_i + j*s_j + ...]``
    with ``element_strides(a)``.
    """
    steps = element_strides(a)
    low = sum((n - 1) * st for n, st in zip(a.shape, steps) if st < 0)
    high = sum((n - 1) * st for n, st in zip(a.shape, steps) if st > 0)
    lowest = a[tuple(slice(n - 1, n) if st < 0 else slice(0, 1) for n, st in zip(a.shape, steps))]
    return strided(lowest, (high - low + 1,), (1,)), -low
