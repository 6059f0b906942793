"""What an array is, and how a kernel sees it.

Kernels see NumPy arrays (Numba CPU) or numba device arrays (numba.cuda), 16-bit floats as
their ``uint16`` bits (``_codec``). The views here get there from NumPy arrays, torch
tensors (CPU and CUDA), CuPy arrays and numba device arrays without copying the data.

Words used across ``_kernels``: the *library* of an array is ``"numpy"``, ``"torch"``,
``"cupy"`` or ``"numba"`` (a numba device array, the CUDA simulator's included); its
*storage* is how one element is held, ``_codec.FLOAT`` (float32, float64), ``FLOAT16`` or
``BFLOAT16``. The questions the registrations ask (``library``, ``storage``, ``on_host``,
``on_gpu``, strides) look at types and dtypes only: they never import numba or a framework.
Views, allocation and streams import what they need.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import sys
from functools import lru_cache

import numpy as np

from .. import _compat, _dispatch
from .._validate import self_overlapping
from .._xp import tracks_gradient
from .._xp import torch_compiling, torch_tensor

# How a kernel holds one element (``_codec`` converts): as it is (float32, float64), or the
# raw bits of an IEEE binary16 or of a bfloat16.
FLOAT, FLOAT16, BFLOAT16 = 0, 1, 2

STORAGE = {"float32": FLOAT, "float64": FLOAT, "float16": FLOAT16, "bfloat16": BFLOAT16}
# The element type a kernel sees for each float dtype.
ELEMENT = {"float32": np.float32, "float64": np.float64, "float16": np.uint16, "bfloat16": np.uint16}
INTEGERS = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
SIGNED = INTEGERS[:4]

# ---------------------------------------------------------------- toolchains


@lru_cache(maxsize=None)
def numba_cpu() -> bool:
    """numba is installed (the CPU kernels can run)."""
    return importlib.util.find_spec("numba") is not None


def numba_problem() -> str | None:
    """Why the Numba CPU kernels cannot run here, in words (``posenc info``), or ``None``:
    numba missing, or one that does not import next to this NumPy. (It imports numba: the
    registrations ask ``numba_cpu`` instead.)"""
    if not numba_cpu():
        return "numba is not installed"
    try:
        import numba  # noqa: F401
    except ImportError as exc:  # e.g. a numba older than this NumPy ("Numba needs NumPy 2.2 or less")
        return f"numba failed to import ({exc})"
    return None


def cuda_simulator() -> bool:
    return os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"


def numba_cuda() -> bool:
    """numba.cuda is importable and a GPU is usable (or the CUDA simulator is on)."""
    return cuda_problem() is None


@lru_cache(maxsize=None)
def cuda_problem() -> str | None:
    """Why the numba.cuda kernels cannot run here, in words (``posenc info``), or ``None``."""
    if not numba_cpu():
        return "numba is not installed"
    try:
        from numba import cuda
    except Exception as exc:  # numba-cuda <= 0.30.4 raises AttributeError with NumPy >= 2.5
        return import_failure(exc, np.__version__)
    release = numba_cuda_release()
    if release is None or release < NUMBA_CUDA_MIN:
        found = "no numba-cuda package (numba's own numba.cuda)" if release is None else f"numba-cuda {'.'.join(map(str, release))}"
        wanted = ".".join(map(str, NUMBA_CUDA_MIN))
        return f"{found}: posenc's CUDA kernels need numba-cuda >= {wanted}, pip install 'posenc[cuda]'"
    if cuda_simulator() or cuda.is_available():
        return None
    return "no usable CUDA GPU (numba.cuda.is_available() is False: no NVIDIA GPU or driver here)"


NUMBA_CUDA_MIN = (0, 30)  # launch bounds, launches through cuda.core (the cuda extra's floor)


def numba_cuda_release() -> tuple | None:
    """``(major, minor)`` of the installed numba-cuda distribution, or ``None`` without one."""
    from importlib import metadata

    try:
        version = metadata.version("numba-cuda")
    except metadata.PackageNotFoundError:
        return None
    return tuple([int(part) for part in re.findall(r"\d+", version)[:2]])


def import_failure(exc, numpy_version) -> str:
    """What to say when ``from numba import cuda`` raised ``exc`` under NumPy ``numpy_version``."""
    said = f"numba.cuda failed to import ({type(exc).__name__}: {exc})"
    if "row_stack" in str(exc) or np.lib.NumpyVersion(numpy_version) >= "2.5.0":
        said += (
            f"; numba-cuda up to 0.30.4 uses np.row_stack, which NumPy 2.5 removed, and NumPy here is "
            f"{numpy_version}: install a set that works, pip install 'posenc[cuda]' (numpy<2.5)"
        )
    return said


# ---------------------------------------------------------------- what an array is


def dtype_name(dtype) -> str:
    """``"float32"`` for ``numpy.float32``, ``torch.float32`` and ``dtype('float32')`` alike."""
    key = (type(dtype), dtype)
    try:
        return _DTYPE_NAMES[key]
    except KeyError:
        name = _DTYPE_NAMES[key] = str(dtype).rsplit(".", 1)[-1]
    except TypeError:  # an unhashable dtype object
        name = str(dtype).rsplit(".", 1)[-1]
    return name


_DTYPE_NAMES = {}  # (dtype's class, dtype) -> name: a call asks several times


def integer_kind(a):
    """How a plan applies the integer rule to array ``a`` (positions, an offset): None for no
    array or a float one, ``"int64"``, ``"uint64"``, or ``"narrow"`` (at most 32 bits: widened,
    its sums cannot leave int64 unless an offset is within 2**62 of its limits)."""
    if a is None or isinstance(a, int):
        return None
    # (a NumPy dtype by its name, which leaves out the byte order: ">u8" is "uint64")
    name = a.dtype.name if isinstance(a, np.ndarray) else dtype_name(a.dtype)
    if name.startswith(("float", "bfloat")):
        return None
    return name if name in ("int64", "uint64") else "narrow"


def int64_extremes_fit(*parts) -> bool:
    """Whether every sum ``a + b + ...`` of one value from each of ``parts`` (ints, host
    or torch CPU integer arrays, or known ``(min, max)`` pairs, each with a sign ``(part, +1
    or -1)``) and each value stays within int64, by their extremes."""
    low = high = 0
    for part, sign in parts:
        ends = extremes(part)
        if ends is None:
            return True
        smallest, largest = ends
        if not -(2**63) <= smallest <= largest <= 2**63 - 1:
            return False
        low, high = (low + smallest, high + largest) if sign > 0 else (low - largest, high - smallest)
    return -(2**63) <= low and high <= 2**63 - 1


def extremes(part):
    """``(min, max)`` as Python ints of an int, an integer array (None when it is empty), or
    a ``(min, max)`` pair known beforehand (an ``arange``)."""
    if isinstance(part, int):
        return part, part
    if type(part) is tuple:
        return part
    values = part if type(part) is np.ndarray else host_values(part)
    if values.size < 2:  # (one value read as it is: no reductions)
        return (values.item(),) * 2 if values.size else None
    return int(np.minimum.reduce(values, axis=None)), int(np.maximum.reduce(values, axis=None))


def is_numba_device_array(a) -> bool:
    return type(a).__module__.startswith("numba.cuda") and hasattr(a, "shape") and hasattr(a, "dtype")


def library(a) -> str | None:
    if isinstance(a, np.ndarray):
        return "numpy"
    if torch_tensor(a):
        return "torch"
    if _compat.is_cupy_array(a):
        return "cupy"
    if is_numba_device_array(a):
        return "numba"
    return None


def storage(a):
    """The ``_codec`` storage of a float array a kernel can read, or ``None``."""
    if isinstance(a, np.ndarray) and not a.dtype.isnative:
        return None
    return STORAGE.get(dtype_name(a.dtype))


def to_custom_op(arrays) -> bool:
    """The call goes to ``posenc.torch``'s custom ops rather than a Numba kernel: a torch tensor
    among ``arrays`` that autograd records, which a kernel would cut from the graph, or any
    torch tensor while ``torch.compile`` traces the call, since it cannot trace into Numba.
    ``out`` is then written by a copy, which autograd records (a non-leaf rotated in place
    gets the out-of-place call's bits and gradient). The custom ops' forward calls the
    registry again, eagerly and with grad mode off, so the kernels still do the work."""
    torch = sys.modules.get("torch")
    if torch is None or not any(isinstance(a, torch.Tensor) for a in arrays):
        return False
    if torch_compiling():
        _dispatch.ready("torch")  # binds the registry entries: no import traced

        return True
    return torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in arrays)


def on_host(a) -> bool:
    """A NumPy array, or a torch CPU tensor autograd does not record that NumPy can view."""
    if isinstance(a, np.ndarray):
        return True
    return torch_tensor(a) and a.device.type == "cpu" and not tracks_gradient(a) and not a.is_neg()


def on_gpu(a) -> bool:
    """A CuPy array, a numba device array, or a torch CUDA tensor autograd does not record
    that a kernel can read as memory."""
    if _compat.is_cupy_array(a) or is_numba_device_array(a):
        return True
    return torch_tensor(a) and a.device.type == "cuda" and not tracks_gradient(a) and not a.is_neg()


def element_strides(a) -> tuple:
    """Strides in elements (torch counts elements, the others bytes)."""
    if isinstance(a, np.ndarray) or not torch_tensor(a):
        size = a.dtype.itemsize
        return tuple([st // size for st in a.strides])
    return tuple(a.stride())


def whole_strides(a) -> bool:
    """Every stride is a whole number of elements (byte strides of NumPy or CuPy views need not be)."""
    return torch_tensor(a) or all(st % a.dtype.itemsize == 0 for st in a.strides)


def addressable(a):
    """NumPy array ``a``, or a contiguous copy where a stride is no whole number of elements
    (a field of a packed structured array): the CPU kernels address elements."""
    return a if whole_strides(a) else np.ascontiguousarray(a)


def forward_strides(a) -> bool:
    """Every stride is a whole, non-negative number of elements (what the CUDA kernels address)."""
    return whole_strides(a) and all(st >= 0 for st in element_strides(a))


def writes_each_element_once(a) -> bool:
    """No two indices of ``a`` share memory (no stride 0 along an axis longer than one, no
    strides that fold onto themselves: ``_validate.self_overlapping``)."""
    return not self_overlapping(tuple(a.shape), element_strides(a), 1)


def writeable(a) -> bool:
    return not isinstance(a, np.ndarray) or a.flags.writeable


# ---------------------------------------------------------------- host views


def host_view(a):
    """``a`` as a NumPy array over the same memory; 16-bit floats as ``uint16`` bits."""
    if torch_tensor(a):
        a = a.detach()
        if a.dtype.itemsize == 2 and a.dtype.is_floating_point:
            import torch

            return a.view(torch.int16).numpy().view(np.uint16)
        return a.numpy()
    return a.view(np.uint16) if a.dtype.itemsize == 2 and dtype_name(a.dtype) in ("float16", "bfloat16") else a


def host_reader(a):
    """``host_view`` for arrays of ``a``'s signature (library, dtype, gradient tracking), in
    the fewest steps: where it is one, a C method itself (``Tensor.numpy``), so that a
    planned call reads its arrays with no Python frame of posenc's; ``same`` where NumPy's
    array is its own view."""
    if isinstance(a, np.ndarray):
        return same if host_view(a).dtype == a.dtype else _bits16
    if a.dtype.itemsize == 2:
        return host_view
    return _detached if a.requires_grad else sys.modules["torch"].Tensor.numpy


def same(a):
    return a


def _bits16(a):
    return a.view(np.uint16)


def _detached(a):
    return a.detach().numpy()


def host_values(a):
    """The values of a host array as NumPy (torch 16-bit floats, which NumPy lacks, as float64)."""
    if torch_tensor(a):
        a = a.detach()
        if a.dtype.itemsize == 2 and a.dtype.is_floating_point:
            import torch

            return a.to(torch.float64).numpy()
        return a.numpy()
    return np.asarray(a)


def same_view(a, b) -> bool:
    """NumPy arrays ``a`` and ``b`` are the same elements in the same order."""
    return a.shape == b.shape and a.strides == b.strides and a.__array_interface__["data"][0] == b.__array_interface__["data"][0]


def flat_span(a):
    """``(flat, offset)``: a 1-D view of the memory NumPy array ``a`` spans, and where ``a[0, ..., 0]`` is in it.

    ``a`` has at least one element and whole strides of any sign; element ``(i, j, ...)``
    is ``flat[offset + i*s_i + j*s_j + ...]`` with ``element_strides(a)``.
    """
    if a.flags.c_contiguous:
        return a.ravel(), 0  # (a view: C order needs no copy)
    steps = element_strides(a)
    low = sum((n - 1) * st for n, st in zip(a.shape, steps) if st < 0)
    high = sum((n - 1) * st for n, st in zip(a.shape, steps) if st > 0)
    lowest = a[tuple(slice(n - 1, n) if st < 0 else slice(0, 1) for n, st in zip(a.shape, steps))]
    return strided(lowest, (high - low + 1,), (1,)), -low


# ---------------------------------------------------------------- device views


def device_view(a, *, bits16=True):
    """A numba device array over ``a``'s memory (16-bit floats as ``uint16`` bits when ``bits16``)."""
    from numba import cuda

    lib = library(a)
    if lib == "torch":
        a = a.detach()
        if bits16 and a.dtype.itemsize == 2 and a.dtype.is_floating_point:
            import torch

            a = a.view(torch.int16)  # torch's __cuda_array_interface__ has no bfloat16
        a = cuda.as_cuda_array(a, sync=False)
    elif lib == "cupy":
        a = cuda.as_cuda_array(a, sync=False)
    if bits16 and (a.dtype == np.float16 or a.dtype == np.int16 or dtype_name(a.dtype) == "bfloat16"):
        a = a.view(np.uint16)  # (bfloat16: ml_dtypes' arrays, which the CUDA simulator holds)
    return a


def strided(a, shape, strides):
    """A view of NumPy or numba device array ``a`` (from its first element) with element ``strides``."""
    byte_strides = tuple(int(st) * a.dtype.itemsize for st in strides)
    shape = tuple(int(n) for n in shape)
    if isinstance(a, np.ndarray):
        return np.lib.stride_tricks.as_strided(a, shape=shape, strides=byte_strides, writeable=a.flags.writeable)
    if type(a).__module__.startswith("numba.cuda.simulator"):
        return type(a)(np.lib.stride_tricks.as_strided(a._ary, shape=shape, strides=byte_strides), stream=a.stream)
    from numba.cuda.cudadrv.devicearray import DeviceNDArray

    return DeviceNDArray(shape, byte_strides, a.dtype, stream=a.stream, gpu_data=a.gpu_data)


def bounds(index):
    """``(min, max)`` of a non-empty integer array of any library. On a GPU (torch, CuPy) both
    are reduced on the device and read back together: one synchronisation, two integers."""
    lib = library(index)
    if lib == "numba":
        index = index.copy_to_host()
    elif lib == "numpy" or (lib == "torch" and index.device.type == "cpu"):
        index = host_values(index)
    elif lib == "torch":
        import torch

        low, high = torch.stack([index.min(), index.max()]).tolist()
        return int(low), int(high)
    elif lib == "cupy":
        import cupy

        low, high = cupy.stack([index.min(), index.max()]).get().tolist()
        return int(low), int(high)
    return int(index.min()), int(index.max())


# ---------------------------------------------------------------- allocation


def empty(like, shape=None):
    """A new uninitialised array of ``like``'s library, dtype and device (``like``'s shape by default).

    A torch CPU tensor gets NumPy-allocated memory under a torch tensor: NumPy asks the
    kernel for transparent huge pages on large arrays, which makes the first write 3-4x
    faster than into torch's own allocation (faulted in 4 KiB pages). Such a tensor is not
    resizable (``Tensor.resize_``); everything else about it is an ordinary tensor.
    """
    shape = tuple(like.shape) if shape is None else tuple(shape)
    lib = library(like)
    if lib == "numpy":
        return np.empty(shape, like.dtype)
    if lib == "torch":
        import torch

        if like.device.type != "cpu":
            return torch.empty(shape, dtype=like.dtype, device=like.device)
        if like.dtype == torch.bfloat16:
            return torch.from_numpy(np.empty(shape, np.int16)).view(torch.bfloat16)
        return torch.from_numpy(np.empty(shape, dtype_name(like.dtype)))
    if lib == "cupy":
        import cupy

        with cupy.cuda.Device(like.device.id):
            return cupy.empty(shape, dtype=like.dtype)
    from numba import cuda

    return cuda.device_array(shape, dtype=like.dtype, stream=like.stream)


def copy_into(out, source):
    """``out[...] = source`` for two arrays of one GPU library."""
    lib = library(out)
    if lib == "torch":
        out.copy_(source)
    elif lib == "cupy":
        out[...] = source
    else:
        out.copy_to_device(source)


# ---------------------------------------------------------------- GPU stream and device


def _device_name(a):
    lib = library(a)
    if lib == "torch":
        return str(a.device)
    if lib == "cupy":
        return f"cuda:{a.device.id}"
    return None  # a numba device array: its context's device


def guard_gpu_operands(x, out=None, **named):
    """What a CUDA launcher checks before it launches: each of ``named`` (and ``out``) is a GPU
    array of ``x``'s library on ``x``'s device, every operand has non-negative whole strides
    (the kernels address memory from an array's lowest element up, at unsigned indices), and
    ``out`` is one the kernel can write (each element once). ``TypeError``/``ValueError``
    naming the argument: never a silent copy to or from the host."""
    lib, device = library(x), _device_name(x)
    for name, a in (*named.items(), ("out", out)):
        if a is None:
            continue
        if library(a) != lib or not on_gpu(a):
            raise TypeError(f"{name} must be a GPU array of x's kind ({lib}), got {type(a).__module__}.{type(a).__name__} (kernel launcher check)")
        if _device_name(a) != device:
            raise ValueError(f"{name} is on {_device_name(a)}, x on {device}: move them to one GPU first (kernel launcher check)")
    for name, a in (("out", out), *named.items(), ("x", x)):
        if a is None:
            continue
        if name.startswith("out") and not (forward_strides(a) and writes_each_element_once(a)):
            raise ValueError(
                f"{name} has strides {element_strides(a)} (elements): the CUDA kernel writes only arrays "
                "with non-negative strides that hold each element once (kernel launcher check)"
            )
        if not forward_strides(a):
            raise ValueError(f"{name} has strides {element_strides(a)} (elements): the CUDA kernels read only arrays with non-negative whole strides (kernel launcher check)")


def launch_context(a):
    """``(stream, device context)`` for a kernel on GPU array ``a``: the caller's current stream.

    The one stream policy of every CUDA kernel: torch's or CuPy's current stream on ``a``'s
    device (whichever device is current), or a numba device array's own stream. Handle 0
    (torch's and CuPy's default) is CUDA's legacy default stream, so a kernel orders with
    the caller's work exactly as the caller's own kernels do. The device context:
    ``on_device``.
    """
    from numba import cuda

    lib = library(a)
    if lib == "torch":
        import torch

        index = a.device.index
        handle = torch_stream(torch, index)
    elif lib == "cupy":
        import cupy

        index = a.device.id
        handle = cupy.cuda.get_current_stream(index).ptr  # (the array's device's: CuPy keeps one per device)
    else:
        return a.stream or cuda.legacy_default_stream(), _STAY
    return _stream(handle), on_device(index)


_STAY = contextlib.nullcontext()


def current_context() -> int:
    """The handle of the CUDA context current on this thread (0: none)."""
    from cuda.bindings import driver

    status, context = driver.cuCtxGetCurrent()
    return int(context) if status == driver.CUresult.CUDA_SUCCESS else 0


@lru_cache(maxsize=None)
def _primary_context(index) -> int:
    """The handle of GPU ``index``'s primary context: numba's, retained (not made current)."""
    from cuda.bindings.utils import get_cuda_native_handle
    from numba import cuda

    return int(get_cuda_native_handle(cuda.gpus[index].get_primary_context().handle))


def on_device(index):
    """The context manager a launch on GPU ``index`` runs under: nothing to do where the
    device's primary context (the one numba loads kernels in) is current on this thread, as
    torch and CuPy make it on the threads that use the device; else numba's (a push of that
    context and a pop: driver calls through Python)."""
    if current_context() == _primary_context(index):
        return _STAY
    from numba import cuda

    return cuda.gpus[index]


def torch_stream(torch, index) -> int:
    """The handle of torch's current CUDA stream on device ``index``: by the query inductor's
    generated code makes (``get_raw_stream``), which builds no ``torch.cuda.Stream`` object,
    where this torch has it."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return raw(index) if raw is not None else torch.cuda.current_stream(index).cuda_stream


def device_index(a) -> int:
    """The index of the GPU that array ``a`` lives on (0 for a numba array on the simulator)."""
    lib = library(a)
    if lib == "torch":
        return a.device.index
    if lib == "cupy":
        return a.device.id
    from numba import cuda

    return getattr(cuda.get_current_device(), "id", 0)


@lru_cache(maxsize=64)
def _stream(handle):
    """numba's view of the CUDA stream ``handle`` (0: the legacy default stream), kept for
    the last 64 handles (a program may make a stream per request)."""
    from numba import cuda

    return cuda.external_stream(handle) if handle else cuda.legacy_default_stream()
