"""Host calls from XLA into Python without copies: one typed XLA FFI target over ``ctypes``.

``jax.pure_callback`` copies every argument into a new array and the result back into
XLA's buffer, about 2 GB/s here: 60 ms each way for a ``[1, 32, 4096, 128]`` float32
rotation the kernel does in 20 ms. This FFI target (XLA's C API, ``xla/ffi/api/c_api.h``,
API 0.3) is a ``ctypes`` function: XLA calls it with its buffers, the handler views them as
NumPy arrays (no copy) and a Python function writes the result straight into XLA's output
buffer. Which function: the call's ``host`` attribute, a key of ``_HOSTS``.

XLA allocates a new output buffer for every call, which the kernel's first write faults in
4 KiB page by page: a large one is advised to the kernel for transparent huge pages first
(``madvise(MADV_HUGEPAGE)``, as NumPy does for its own large arrays), which halves the time
of a ``[1, 32, 4096, 128]`` rotation under ``jit`` (29 ms -> 14 ms here, the NumPy path's).

A Python exception in the function becomes an XLA error carrying its message
(``INVALID_ARGUMENT``), raised by JAX where the result is used. At exit the process waits
for every JAX computation still running (``_finish``): one that calls the handler after
Python began to shut down would wait for the interpreter lock forever.
"""

from __future__ import annotations

import atexit
import ctypes as C
import itertools
import math
import mmap
import sys
import threading

import jax
import ml_dtypes
import numpy as np

_TARGET = "posenc_host_call"
_API_VERSION = (0, 3)
_METADATA = 1  # XLA_FFI_Extension_Metadata
_INVALID_ARGUMENT = 3
# XLA_FFI_DataType -> NumPy
_DTYPES = {
    1: np.bool_, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.uint8, 7: np.uint16, 8: np.uint32, 9: np.uint64,
    10: np.float16, 11: np.float32, 12: np.float64, 16: ml_dtypes.bfloat16,
}


class _Extension(C.Structure):
    pass


_Extension._fields_ = [("struct_size", C.c_size_t), ("type", C.c_int), ("next", C.POINTER(_Extension))]


class _ApiVersion(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("extension_start", C.c_void_p), ("major", C.c_int), ("minor", C.c_int)]


class _Metadata(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("api_version", _ApiVersion), ("traits", C.c_uint32), ("state_type_id", C.c_int64)]


class _MetadataExtension(C.Structure):
    _fields_ = [("base", _Extension), ("metadata", C.POINTER(_Metadata))]


class _List(C.Structure):
    """``XLA_FFI_Args`` / ``XLA_FFI_Rets``."""

    _fields_ = [("struct_size", C.c_size_t), ("extension_start", C.c_void_p), ("size", C.c_int64), ("types", C.c_void_p), ("items", C.POINTER(C.c_void_p))]


class _Attrs(C.Structure):
    _fields_ = [
        ("struct_size", C.c_size_t), ("extension_start", C.c_void_p), ("size", C.c_int64),
        ("types", C.c_void_p), ("names", C.c_void_p), ("items", C.POINTER(C.c_void_p)),
    ]


class _CallFrame(C.Structure):
    _fields_ = [
        ("struct_size", C.c_size_t), ("extension_start", C.POINTER(_Extension)), ("api", C.c_void_p), ("ctx", C.c_void_p),
        ("stage", C.c_int), ("args", _List), ("rets", _List), ("attrs", _Attrs), ("future", C.c_void_p),
    ]


class _Buffer(C.Structure):
    _fields_ = [
        ("struct_size", C.c_size_t), ("extension_start", C.c_void_p), ("dtype", C.c_int), ("data", C.c_void_p),
        ("rank", C.c_int64), ("dims", C.POINTER(C.c_int64)),
    ]


class _Scalar(C.Structure):
    _fields_ = [("dtype", C.c_int), ("value", C.POINTER(C.c_int64))]


class _ErrorArgs(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("extension_start", C.c_void_p), ("message", C.c_char_p), ("errc", C.c_int)]


_ERROR_CREATE = C.CFUNCTYPE(C.c_void_p, C.POINTER(_ErrorArgs))


class _Api(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("extension_start", C.c_void_p), ("api_version", _ApiVersion), ("internal_api", C.c_void_p), ("error_create", _ERROR_CREATE)]


def _view(pointer):
    """An XLA buffer as a NumPy array over its memory."""
    buffer = C.cast(pointer, C.POINTER(_Buffer)).contents
    shape = tuple(buffer.dims[i] for i in range(buffer.rank))
    dtype = np.dtype(_DTYPES[buffer.dtype])
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes == 0:
        return np.empty(shape, dtype)
    return np.frombuffer((C.c_char * nbytes).from_address(buffer.data), dtype).reshape(shape)


_MADV_HUGEPAGE = 14  # Linux
_HUGE = 1 << 22  # bytes from which a result is worth huge pages (NumPy's threshold)


def _madvise():
    try:
        madvise = C.CDLL(None, use_errno=True).madvise
    except (AttributeError, OSError):  # not Linux: no huge-page advice
        return None
    madvise.argtypes, madvise.restype = [C.c_void_p, C.c_size_t, C.c_int], C.c_int
    return madvise if sys.platform.startswith("linux") else None


_ADVISE = _madvise()


def _huge_pages(a):
    """Advise transparent huge pages for a large NumPy array's memory (a hint: ignored where not granted)."""
    if _ADVISE is not None and a.nbytes >= _HUGE:
        start = a.ctypes.data & ~(mmap.PAGESIZE - 1)
        _ADVISE(start, a.ctypes.data + a.nbytes - start, _MADV_HUGEPAGE)


def _error(frame, message):
    api = C.cast(frame.api, C.POINTER(_Api)).contents
    text = message.encode("utf-8", "replace")
    arguments = _ErrorArgs(C.sizeof(_ErrorArgs), None, text, _INVALID_ARGUMENT)
    return api.error_create(C.byref(arguments))  # XLA copies the message


def _handle(frame_pointer):
    frame = frame_pointer.contents
    if frame.extension_start and frame.extension_start.contents.type == _METADATA:
        metadata = C.cast(frame.extension_start, C.POINTER(_MetadataExtension)).contents.metadata.contents
        metadata.api_version.major, metadata.api_version.minor = _API_VERSION
        metadata.traits = 0
        return None
    try:
        host = _HOSTS[C.cast(frame.attrs.items[0], C.POINTER(_Scalar)).contents.value[0]]
        arrays = [_view(frame.args.items[i]) for i in range(frame.args.size)]
        (out,) = (_view(frame.rets.items[i]) for i in range(frame.rets.size))
        _huge_pages(out)
        host(*arrays, out=out)
    except Exception as error:  # noqa: BLE001 - every error goes back to XLA with its message
        return _error(frame, f"{type(error).__name__}: {error}")
    return None


_HANDLER = C.CFUNCTYPE(C.c_void_p, C.POINTER(_CallFrame))(_handle)
HANDLER_ADDRESS = C.cast(_HANDLER, C.c_void_p).value  # for handlers that hand a call over (``native.py``)
_HOSTS: dict[int, object] = {}
_KEYS: dict[object, int] = {}
_NEXT = itertools.count(1)
_LOCK = threading.Lock()
_registered = False


def _finish():
    try:
        jax.block_until_ready(jax.live_arrays())
    except Exception:  # noqa: BLE001 - a failed computation has no handler call left to wait for
        pass


def _register():
    global _registered
    with _LOCK:
        if not _registered:
            jax.ffi.register_ffi_target(_TARGET, jax.ffi.pycapsule(_HANDLER), platform="cpu")
            atexit.register(_finish)  # after JAX's own: runs before it
            _registered = True


def host_call(key, host, shape, dtype, *args, native=None):
    """``host(*views of args, out=view of the result)`` inside the computation, the result
    ``shape``/``dtype`` declared here; under ``vmap`` the arguments arrive with the batch axes
    in front (size 1 where one is not batched) and ``out`` with the batch's.

    ``key``: hashable, the same for every ``host`` that does the same thing (the first one
    is kept: compiled computations name it for as long as they live). ``native``: an FFI
    target compiled without Python and the address of its ``plan`` (``native.py``), which
    hands the calls it does not cover to ``host``.
    """
    _register()
    with _LOCK:
        if key not in _KEYS:
            _KEYS[key] = next(_NEXT)
            _HOSTS[_KEYS[key]] = host
    if native is None:
        call = jax.ffi.ffi_call(_TARGET, jax.ShapeDtypeStruct(shape, dtype), vmap_method="expand_dims")
        return call(*args, host=np.int64(_KEYS[key]))
    target, plan = native
    call = jax.ffi.ffi_call(target, jax.ShapeDtypeStruct(shape, dtype), vmap_method="expand_dims")
    return call(*args, host=np.int64(_KEYS[key]), plan=np.int64(plan))
