"""Small ``rope_rotate`` calls under ``jax.jit`` with no Python: a Numba ``cfunc`` as the XLA FFI handler.

``ffi.py``'s handler is Python: for a decode step (``[1, 32, 1, 128]``, a few µs of
rotation) its ``ctypes`` callback, buffer views and the kernel launcher cost ten times the
rotation. Here the shapes, known when the call is traced, fix everything the launcher
computes (the ``(G, H, S)`` grouping, offsets, strides, blocks), kept in a ``Plan``; the
handler, compiled by Numba per ``(dtype, layout, positions dtype)``, reads the buffer
addresses from XLA's call frame and runs the same kernel on the calling thread, one
worker, as the launcher does at these sizes: the same bits, with no interpreter lock.

Anything the plan did not foresee goes to ``ffi.py``'s Python handler with the same call
frame, which runs the full launcher: other shapes (a call batched by ``vmap``), and angles
beyond ``rope_cpu.FAST_ANGLE_LIMIT`` or NaN (``rope_cpu.rotate_positions`` gives those rows
alone the reference's libm, the other rows the kernel's bits). XLA's metadata query (the
handler's API version) is answered as ``ffi.py`` does.
"""

from __future__ import annotations

import ctypes as C
import threading
import weakref
from types import FunctionType

import jax
import numpy as np
from llvmlite import ir
from numba import carray, cfunc, njit, types
from numba.extending import intrinsic

from .._kernels import _arrays, _codec_f32, _family, _layout, _pairs, rope_cpu
from . import ffi
from .ffi import _Attrs, _Buffer, _CallFrame, _Extension, _List, _Metadata, _MetadataExtension, _Scalar, HANDLER_ADDRESS

# Offsets (bytes) in XLA's C API structs (``xla/ffi/api/c_api.h``), as ``ffi.py`` declares them.
_WORD = 8
_EXTENSION = _CallFrame.extension_start.offset // _WORD
_ARGS = (_CallFrame.args.offset + _List.items.offset) // _WORD
_ARG_COUNT = (_CallFrame.args.offset + _List.size.offset) // _WORD
_RETS = (_CallFrame.rets.offset + _List.items.offset) // _WORD
_ATTRS = (_CallFrame.attrs.offset + _Attrs.items.offset) // _WORD
_FRAME_WORDS = C.sizeof(_CallFrame) // _WORD
_EXTENSION_TYPE = _Extension.type.offset // _WORD
_METADATA_POINTER = _MetadataExtension.metadata.offset // _WORD
_VERSION = (_Metadata.api_version.offset + 16) // 4  # major, minor: int32 after struct_size and extension_start
_TRAITS = _Metadata.traits.offset // 4
_DATA = _Buffer.data.offset // _WORD
_RANK = _Buffer.rank.offset // _WORD
_DIMS = _Buffer.dims.offset // _WORD
_SCALAR_VALUE = _Scalar.value.offset // _WORD
_METADATA = ffi._METADATA
_MAJOR, _MINOR = ffi._API_VERSION

# The plan: int64 words, then the float64 words it points to.
(P_FALLBACK, P_FLOATS, P_FREQS, P_HALF, P_XS, P_OS, P_HEADS, P_DIM, P_G, P_S, P_PG, P_PS, P_BLOCK, P_TASKS, P_NX, P_NP) = (
    0, 1, 2, 3, 4, 8, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21,
)
_PLAN_WORDS = 22
F_SIGN, F_SCALE, F_MAX_FREQ = 0, 1, 2


@intrinsic
def _pointer(typingctx, address):
    """The ``int64`` ``address`` as a pointer (for ``carray``)."""

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], ir.IntType(8).as_pointer())

    return types.voidptr(types.int64), codegen


@intrinsic
def _call(typingctx, function, argument):
    """Call the C function ``void *f(void *)`` at address ``function`` with ``argument``."""

    def codegen(context, builder, signature, args):
        word = ir.IntType(64)
        target = builder.inttoptr(args[0], ir.FunctionType(word, [word]).as_pointer())
        return builder.call(target, [args[1]])

    return types.int64(types.int64, types.int64), codegen


@njit(inline="always")
def _words(address, count):
    return carray(_pointer(address), count, np.int64)


@njit(inline="always")
def _elements(buffer):
    """The element count of an ``XLA_FFI_Buffer``."""
    fields = _words(buffer, _DIMS + 1)
    dims = _words(fields[_DIMS], fields[_RANK])
    n = 1
    for d in dims:
        n *= d
    return n


def _handler_source(specialisation, element, position, helpers):
    """The handler of one kernel ``specialisation`` (``element`` its storage dtype,
    ``position`` the positions' dtype), which calls the global ``kernel`` (``_named``).

    A closure over constants only, as ``rope_cpu``'s kernels: Numba's cache keys on them
    (a dispatcher in the closure would give every process a new key). ``helpers``: the
    digest of the modules whose code the handler compiles in, the kernel's included.
    """

    def handler(frame_address):
        specialisation, helpers  # noqa: B018  (Numba's cache key)
        frame = _words(frame_address, _FRAME_WORDS)
        if frame[_EXTENSION] != 0:
            extension = _words(frame[_EXTENSION], _METADATA_POINTER + 1)
            if extension[_EXTENSION_TYPE] & 0xFFFFFFFF == _METADATA:
                metadata = carray(_pointer(extension[_METADATA_POINTER]), _TRAITS + 1, np.int32)
                metadata[_VERSION], metadata[_VERSION + 1], metadata[_TRAITS] = _MAJOR, _MINOR, 0
                return 0
        attrs = _words(frame[_ATTRS], 2)  # sorted by name: host, plan
        plan = _words(_words(_words(attrs[1], _SCALAR_VALUE + 1)[_SCALAR_VALUE], 1)[0], _PLAN_WORDS)
        args, rets = _words(frame[_ARGS], 2), _words(frame[_RETS], 1)
        nx, npos = plan[P_NX], plan[P_NP]
        if frame[_ARG_COUNT] != 2 or _elements(args[0]) != nx or _elements(args[1]) != npos or _elements(rets[0]) != nx:
            return _call(plan[P_FALLBACK], frame_address)  # a shape the plan does not cover (vmap)
        floats = carray(_pointer(plan[P_FLOATS]), 3, np.float64)
        freqs = carray(_pointer(plan[P_FREQS]), plan[P_HALF], np.float64)
        values = carray(_pointer(_words(args[1], _DATA + 1)[_DATA]), npos, position)
        g_size, s_size, pg, ps = plan[P_G], plan[P_S], plan[P_PG], plan[P_PS]
        grid = np.empty((g_size, s_size))
        for g in range(g_size):
            for s in range(s_size):
                p = np.float64(values[g * pg + s * ps])
                # Larger angles (and NaN): the Python handler, whose launcher sends their rows only to the reference.
                if not abs(p) * floats[F_MAX_FREQ] <= rope_cpu.FAST_ANGLE_LIMIT:
                    return _call(plan[P_FALLBACK], frame_address)
                grid[g, s] = p
        x = carray(_pointer(_words(args[0], _DATA + 1)[_DATA]), nx, element)
        out = carray(_pointer(_words(rets[0], _DATA + 1)[_DATA]), nx, element)
        block, half = plan[P_BLOCK], plan[P_HALF]
        xs = (plan[P_XS], plan[P_XS + 1], plan[P_XS + 2], plan[P_XS + 3])
        os = (plan[P_OS], plan[P_OS + 1], plan[P_OS + 2], plan[P_OS + 3])
        no_table = np.empty((0, 0, 0), element)
        kernel(
            x, xs, out, os, plan[P_HEADS], plan[P_DIM], True, grid, freqs, floats[F_SIGN], floats[F_SCALE], no_table, no_table,
            np.empty((block, half)), np.empty((block, half)), np.empty((4, block, half), np.float32), 0, plan[P_TASKS],
        )
        return 0

    return handler


def _named(function, name, **names):
    """``function`` as ``name`` (its qualified name too), with ``names`` among its globals.

    Numba names a compiled function's symbol after its qualified name and signature, and
    links a caller to its callees by symbol: two ``rope_cpu`` kernels of one signature
    (``half`` and ``interleaved``, ``float16`` and ``bfloat16``) compiled in two processes
    can share a symbol, and a handler linked to one would run the other. Each handler
    compiles its own copy of its kernel, both named after the specialisation.
    """
    named = FunctionType(function.__code__, {**function.__globals__, **names}, name, None, function.__closure__)
    named.__qualname__ = name
    return named


_TARGETS: dict[tuple, tuple] = {}  # (dtype, layout, positions dtype) -> (FFI target name, compiled handler)
_PLANS: weakref.WeakValueDictionary[tuple, "Plan"] = weakref.WeakValueDictionary()  # held by the computations naming their addresses (ffi.kept)
_LOCK = threading.Lock()


def _target(dtype, layout, position):
    """The FFI target of one specialisation, its handler compiled (or loaded from Numba's cache) on first use."""
    key = (dtype, layout, position)
    with _LOCK:
        if key not in _TARGETS:
            name = f"posenc_rope_rotate_{dtype}_{layout}_{position}"
            kernel_helpers = _family.source_digest(_codec_f32, _pairs)  # as rope_cpu builds its kernels
            kernel = rope_cpu._kernel_source(True, dtype in ("float32", "float64"), dtype == "bfloat16", layout == "interleaved", kernel_helpers)
            kernel = njit(nogil=True)(_named(kernel, f"{name}_kernel"))
            helpers = _family.source_digest(rope_cpu, _codec_f32, _pairs, ffi)
            source = _handler_source(key, np.dtype(_arrays.ELEMENT[dtype]), np.dtype(position), helpers)
            handler = _family.jitted(cfunc, _named(source, name, kernel=kernel), types.int64(types.int64))
            jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(handler.address), platform="cpu")
            _TARGETS[key] = (name, handler)
        return _TARGETS[key][0]


class Plan:
    """What ``rope_cpu``'s launcher computes for a call of these static shapes, as the handler
    reads it: int64 words (``P_*``) and the float64 words they point to."""

    def __init__(self, shape, storage, positions_shape, freqs, inverse, scale):
        xv = np.empty(shape, storage)
        pv = np.broadcast_to(np.empty(positions_shape), shape[:-1])
        grouping, (view,) = _layout.rotary_views(xv, np.empty_like(xv), [pv])
        rows = grouping.g.size * grouping.s.size
        block = max(1, min(rope_cpu._BLOCK, rows // 4))  # the launcher's, for one worker
        self.freqs = np.ascontiguousarray(freqs, dtype=np.float64)
        self.floats = np.array([-1.0 if inverse else 1.0, scale, float(np.abs(self.freqs).max(initial=0.0))])
        self.words = np.zeros(_PLAN_WORDS, np.int64)
        w = self.words
        w[P_FALLBACK], w[P_FLOATS], w[P_FREQS], w[P_HALF] = HANDLER_ADDRESS, self.floats.ctypes.data, self.freqs.ctypes.data, self.freqs.size
        w[P_XS : P_XS + 4] = (0, *grouping.strides(0)[-3:])
        w[P_OS : P_OS + 4] = (0, *grouping.strides(1)[-3:])
        w[P_HEADS], w[P_DIM], w[P_G], w[P_S] = grouping.h.size, shape[-1], grouping.g.size, grouping.s.size
        w[P_PG], w[P_PS] = _arrays.element_strides(view)
        w[P_BLOCK], w[P_TASKS] = block, grouping.g.size * -(-grouping.s.size // block)
        w[P_NX], w[P_NP] = xv.size, int(np.prod(positions_shape))
        # Covered: one (G, H, S) group, read from the start of the positions.
        self.covered = not grouping.outer and xv.size > 0 and view.ctypes.data == pv.ctypes.data


_POSITIONS = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float32", "float64")


def rotation(x, positions, freqs, layout, inverse, scale):
    """``(FFI target, plan)`` of this traced ``rope_rotate`` call, or None where the
    Python handler serves it (large calls: their Python is a small share of the time)."""
    dtype, position = _arrays.dtype_name(x.dtype), _arrays.dtype_name(positions.dtype)
    if position not in _POSITIONS or x.size >= 2 * rope_cpu._ELEMENTS_PER_THREAD:  # the launcher's one-worker sizes
        return None
    key = (tuple(x.shape), dtype, tuple(positions.shape), tuple(freqs.tolist()), bool(inverse), float(scale))
    with _LOCK:
        plan = _PLANS.get(key)
        if plan is None:
            plan = _PLANS[key] = Plan(key[0], _arrays.ELEMENT[dtype], key[2], freqs, inverse, scale)
    if not plan.covered:
        return None
    return _target(dtype, layout, position), plan
