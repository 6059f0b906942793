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

The registry lives as long as the computations that name its entries: lowering under
``jit`` hands every entry a call names (and ``native.py``'s plan, whose address the
computation holds) to the computation's keepalive (``kept``), and when the computation is
freed they go to a queue of the last ``RETIRED`` (a call of it still running finds them),
then are dropped: a long-running process that jits calls of ever new shapes or bases keeps
a bounded registry. An entry named where no computation can hold it (``jax.export`` with
kernels, a sharded call's partition, lowered when XLA partitions) is kept for the process.

A Python exception in the function becomes an XLA error carrying its message
(``INVALID_ARGUMENT``), raised by JAX where the result is used. At exit the process waits
for every JAX computation still running (``_finish``): one that calls the handler after
Python began to shut down would wait for the interpreter lock forever.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import contextvars
import ctypes as C
import itertools
import math
import mmap
import sys
import threading
import weakref

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
        host = _HOSTS[C.cast(frame.attrs.items[0], C.POINTER(_Scalar)).contents.value[0]].host
        arrays = [_view(frame.args.items[i]) for i in range(frame.args.size)]
        (out,) = (_view(frame.rets.items[i]) for i in range(frame.rets.size))
        _huge_pages(out)
        host(*arrays, out=out)
    except Exception as error:  # noqa: BLE001 - every error goes back to XLA with its message
        return _error(frame, f"{type(error).__name__}: {error}")
    return None


_HANDLER = C.CFUNCTYPE(C.c_void_p, C.POINTER(_CallFrame))(_handle)
HANDLER_ADDRESS = C.cast(_HANDLER, C.c_void_p).value  # for handlers that hand a call over (``native.py``)
RETIRED = 256  # entries of freed computations kept for a call still running


class _Entry:
    """A host function and the id the computations calling it name it by."""

    __slots__ = ("id", "host", "__weakref__")

    def __init__(self, id, host):
        self.id, self.host = id, host


_HOSTS: weakref.WeakValueDictionary[int, _Entry] = weakref.WeakValueDictionary()  # id -> entry, while held
_KEYS: weakref.WeakValueDictionary[object, _Entry] = weakref.WeakValueDictionary()  # key -> entry, while held
_PINNED: dict[object, object] = {}  # held for the process: named where no computation can hold them
_RETIRED = collections.deque(maxlen=RETIRED)
_NEXT = itertools.count(1)
_LOCK = threading.Lock()
_HELD: contextvars.ContextVar[list | None] = contextvars.ContextVar("posenc_host_calls_held", default=None)
_registered = False


@contextlib.contextmanager
def kept(keepalive):
    """Inside the block, what the host calls lowered name goes to ``keepalive(token)``
    (the lowering's ``add_keepalive``: the compiled computation holds ``token``), retired
    when the token is freed."""
    held = []
    reset = _HELD.set(held)
    try:
        yield
    finally:
        _HELD.reset(reset)
        if held:
            token = _Token()
            weakref.finalize(token, _RETIRED.extend, tuple(held))
            keepalive(token)


class _Token:
    """What a computation's keepalive holds: its entries are retired when it is freed."""


def _hold(key, value):
    """``value`` kept while the computation being lowered lives, else for the process."""
    held = _HELD.get()
    if held is None:
        _PINNED.setdefault(key, value)
    else:
        held.append(value)


def _entry(key, host):
    with _LOCK:
        entry = _KEYS.get(key)
        if entry is None:
            entry = _KEYS[key] = _Entry(next(_NEXT), host)
            _HOSTS[entry.id] = entry
    _hold(key, entry)
    return entry


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

    ``key``: hashable, the same for every ``host`` that does the same thing (the one
    registered is kept while a computation names it: ``kept``). ``native``: an FFI target
    compiled without Python and its ``plan`` (``native.py``, kept as the entry is), which
    hands the calls it does not cover to ``host``.
    """
    _register()
    entry = _entry(key, host)
    if native is None:
        call = jax.ffi.ffi_call(_TARGET, jax.ShapeDtypeStruct(shape, dtype), vmap_method="expand_dims")
        return call(*args, host=np.int64(entry.id))
    target, plan = native
    _hold(plan, plan)
    call = jax.ffi.ffi_call(target, jax.ShapeDtypeStruct(shape, dtype), vmap_method="expand_dims")
    return call(*args, host=np.int64(entry.id), plan=np.int64(plan.words.ctypes.data))
