"""torch tensors that say they are on a CUDA device, on a machine without one, and a record of
every read of their values on the host and every copy from host memory onto them.

A ``FakeCuda`` tensor is a wrapper whose ``device`` is ``cuda:0`` around a CPU tensor that
holds its values: posenc's code sees a CUDA tensor (``device.type == "cuda"``, ``on_gpu``)
and takes its GPU branches, while every operation runs on the CPU tensor. Inside
:func:`recording` the reads a GPU would pay for with a synchronisation (``item``, ``int``,
``bool``, ``float``, ``tolist``, ``numpy``, ``__array__``, a copy to the CPU) and the copies
from host memory onto the device (``torch.tensor``/``asarray``/``as_tensor`` of host data
with a CUDA ``device=``, ``.to("cuda")`` or ``copy_`` of a CPU tensor) are recorded with the
line of posenc's source they come from, and run as they would (a ``numpy()`` of a CUDA
tensor still raises, as on a GPU). Without numba-cuda the registry sends such tensors to
the Array-API reference, as on a GPU with torch alone.
"""

from __future__ import annotations

import contextlib
import os
import traceback

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

CUDA = torch.device("cuda", 0)
_SOURCE = os.sep + "posenc" + os.sep
# The methods that read a tensor's values into Python or NumPy (a GPU synchronises there).
_READS = {"item", "tolist", "numpy", "__array__", "__int__", "__bool__", "__float__", "__index__", "__complex__", "__len__"}
_HOST_DATA = {"tensor", "asarray", "as_tensor"}


class FakeCuda(torch.Tensor):
    """A tensor on ``cuda:0`` whose values live in the CPU tensor ``elem``."""

    @staticmethod
    def __new__(cls, elem):
        made = torch.Tensor._make_wrapper_subclass(
            cls, elem.shape, strides=elem.stride(), storage_offset=elem.storage_offset(), dtype=elem.dtype, device=CUDA, requires_grad=elem.requires_grad
        )
        made.elem = elem
        return made

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return _run(func, args, kwargs or {})

    def __repr__(self):
        return f"FakeCuda({self.elem!r})"


class FakeSecondCuda(FakeCuda):
    """A FakeCuda tensor on ``cuda:1`` (what is computed from it says ``cuda:0``: for the
    checks that refuse it beside ``cuda:0`` tensors before any work)."""

    @staticmethod
    def __new__(cls, elem):
        made = torch.Tensor._make_wrapper_subclass(
            cls, elem.shape, strides=elem.stride(), storage_offset=elem.storage_offset(), dtype=elem.dtype, device=torch.device("cuda", 1), requires_grad=elem.requires_grad
        )
        made.elem = elem
        return made


def cuda(t, index=0):
    """``t`` (a CPU tensor) as a FakeCuda tensor on ``cuda:index`` (0 or 1; its values copied)."""
    return (FakeCuda, FakeSecondCuda)[index](t.detach().clone())


def host(t):
    """A FakeCuda tensor's values as a CPU tensor (anything else as it is)."""
    return t.elem if isinstance(t, FakeCuda) else t


class Log(list):
    """``(kind, what, where)``: ``kind`` ``"read"`` (device to host) or ``"copy"`` (host to
    device), ``where`` the innermost line of posenc's source on the stack."""

    def lines(self):
        return [f"{kind} {what} at {where}" for kind, what, where in self]


_LOG: list = []


def _note(kind, what):
    if not _LOG:
        return
    where = "outside posenc"
    for frame in reversed(traceback.extract_stack()[:-2]):
        if _SOURCE in frame.filename and "site-packages" + os.sep + "torch" not in frame.filename:
            where = f"{frame.filename.rsplit(_SOURCE, 1)[1]}:{frame.lineno} {frame.line}"
            break
    _LOG[-1].append((kind, what, where))


def _is_cuda(device):
    return (isinstance(device, torch.device) and device.type == "cuda") or (isinstance(device, str) and device.startswith("cuda"))


def _run(func, args, kwargs):
    fake = False

    def unwrap(a):
        nonlocal fake
        if isinstance(a, FakeCuda):
            fake = True
            return a.elem
        if _is_cuda(a):
            fake = True
            return torch.device("cpu")
        return a

    to_device = kwargs.get("device")
    if func is torch.ops.aten._to_copy.default and _is_cuda(to_device) and not isinstance(args[0], FakeCuda):
        _note("copy", "Tensor.to(cuda) of a CPU tensor")
    if func is torch.ops.aten.copy_.default and isinstance(args[0], FakeCuda) and not isinstance(args[1], FakeCuda):
        _note("copy", "copy_ from a CPU tensor")
    if func is torch.ops.aten.copy_.default and isinstance(args[1], FakeCuda) and not isinstance(args[0], FakeCuda):
        _note("read", "copy_ to a CPU tensor")
    if func is torch.ops.aten._local_scalar_dense.default and isinstance(args[0], FakeCuda):
        _note("read", "item")
    out = func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs))
    if not fake:
        return out
    if func is torch.ops.aten._to_copy.default and to_device is not None and not _is_cuda(to_device):
        _note("read", "Tensor.to(cpu)")
        return out
    if func is torch.ops.aten.copy_.default and not isinstance(args[0], FakeCuda):
        return args[0]
    if func is torch.ops.aten.copy_.default or func._schema.is_mutable and isinstance(args[0], FakeCuda) and out is args[0].elem:
        return args[0]
    return tree_map(lambda o: FakeCuda(o) if isinstance(o, torch.Tensor) and not isinstance(o, FakeCuda) else o, out)


class _Dispatch(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return _run(func, args, kwargs or {})


class _Functions(TorchFunctionMode):
    """Runs every function of a FakeCuda tensor on its CPU tensor (torch's Python bindings
    would otherwise look for a CUDA device) and wraps what it returns; records the reads
    and copies of :mod:`fake_cuda`'s list."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        flat = [*args, *kwargs.values()]
        fake = any(isinstance(a, FakeCuda) for a in tree_flatten(flat)[0])
        if name == "__get__" or not fake and not (_is_cuda(kwargs.get("device")) or name in ("to", "cuda") and any(_is_cuda(a) for a in args)):
            return func(*args, **kwargs)
        if fake and name in _READS:
            if name != "__len__":
                _note("read", name)
            if name in ("numpy", "__array__"):
                raise TypeError("can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu() to copy the tensor to host memory first.")
        elif fake and (name == "cpu" or name in _MOVES and any(_is_cpu(a) for a in flat)):
            _note("read", f"{name} to the CPU")
            return func(*tree_map(host, args), **kwargs)
        elif not fake and name in _HOST_DATA | _MOVES:
            _note("copy", f"{name} of host data onto the device")
        elif fake and any(isinstance(a, torch.Tensor) and not isinstance(a, FakeCuda) and a.ndim for a in tree_flatten(flat)[0]):
            _note("copy", f"{name} with a CPU tensor operand")
        out = func(*tree_map(_on_cpu, args), **tree_map(_on_cpu, kwargs))
        if name in _READS:
            return out
        if isinstance(out, torch.Tensor) and args and isinstance(args[0], FakeCuda) and out is args[0].elem:
            return args[0]  # (in place)
        return tree_map(lambda o: FakeCuda(o) if isinstance(o, torch.Tensor) and not isinstance(o, FakeCuda) else o, out)


_MOVES = {"to", "asarray", "as_tensor", "tensor", "copy_", "cuda"}


def _is_cpu(device):
    return (isinstance(device, torch.device) and device.type == "cpu") or device == "cpu"


def _on_cpu(a):
    if isinstance(a, FakeCuda):
        return a.elem
    return torch.device("cpu") if _is_cuda(a) else a


@contextlib.contextmanager
def recording():
    """Inside: FakeCuda tensors compute, factories asked for ``cuda`` make them, and the reads
    and copies of the block are recorded in the ``Log`` yielded."""
    log = Log()
    _LOG.append(log)
    from posenc import _device_constants

    lazy_init, constant = torch.cuda._lazy_init, _device_constants.torch_constant
    torch.cuda._lazy_init = lambda: None
    _device_constants.torch_constant = _kept_constant
    try:
        with _Functions(), _Dispatch():
            yield log
    finally:
        torch.cuda._lazy_init, _device_constants.torch_constant = lazy_init, constant
        _LOG.pop()


_KEPT: dict = {}


def _kept_constant(values, dtype, device, what=None):
    """``_device_constants.torch_constant`` (which asks CUDA about streams and graph
    capture): a constant copied once (unrecorded) and kept, as on a GPU."""
    key = (dtype, tuple(values))
    if key not in _KEPT:
        _KEPT[key] = FakeCuda(torch.tensor(values, dtype=dtype))
    return _KEPT[key]
