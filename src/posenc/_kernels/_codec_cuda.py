"""Elements to float32 and back on the device, two at a time (the numba.cuda rotation).

The rotation moves words of two adjacent channels (``rope_cuda.WORDS``) and rounds
the two results of a pair together. Each function here is plain Python on NumPy scalars, which the
CUDA simulator runs and which defines the bits, and is compiled (``overload``) to the
device's own instructions: a word split into its two float32 halves and joined again by
one move, float16 widened and narrowed by ``cvt`` (the LLVM ``fpext``/``fptrunc`` of
``_codec_f32``), two float32 rounded to bfloat16 by one ``cvt.rn.bf16x2.f32`` on compute
capability 8.0 and later (``_codec.narrow16``, compiled, before). Numba's own code of the
same bit operations widens every ``uint32`` operation to 64 bits and tests each branch of
``_codec.widen16``; on an H100/H200 the 16-bit rotation is bound by the instructions it
issues, not by memory.

The rounding is IEEE's to nearest, ties to even, in software and in hardware, subnormals
included (no flush to zero). Only NaN payloads may differ: the device's arithmetic makes its
default NaN (``0x7FFFFFFF``), which narrows to ``0x7FFF`` in hardware, and to ``0x7FFF``
(bfloat16) or ``0x7E00`` (float16) in software; a NaN stays a NaN.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.cuda.core import targetconfig
from numba.core.extending import register_jitable
from numba.cuda.extending import intrinsic, overload

from . import _codec
from ._codec_f32 import narrow, widen

_I32 = ir.IntType(32)
_FLOAT32 = ir.FloatType()


def float32_pair(word):
    """The two float32 in uint64 ``word``: ``(low half, high half)``."""
    word = np.uint64(word)
    return np.uint32(word & np.uint64(0xFFFFFFFF)).view(np.float32), np.uint32(word >> np.uint64(32)).view(np.float32)


def float32_word(low, high):
    """float32 ``low`` and ``high`` as one uint64 word, ``low`` in the low half."""
    return np.uint64(np.float32(low).view(np.uint32)) | (np.uint64(np.float32(high).view(np.uint32)) << np.uint64(32))


def widen_one(bits, storage):
    """The float32 value of the 16-bit element in the low half of ``bits`` (exact)."""
    return _codec.widen16(bits, storage)


def widen_pair(word, storage):
    """The float32 values of the two 16-bit elements in uint32 ``word``: ``(low, high)`` (exact)."""
    word = np.uint32(word)
    return _codec.widen16(word, storage), _codec.widen16(word >> np.uint32(16), storage)


def narrow_pair(low, high, storage):
    """float32 ``low`` and ``high`` rounded to 16 bits (ties to even), as one uint32 word
    with ``low`` in the low half."""
    return _narrow_pair_software(low, high, storage)


@register_jitable
def _narrow_pair_software(low, high, storage):
    lo = _codec.narrow16(np.float32(low).view(np.uint32), storage)
    hi = _codec.narrow16(np.float32(high).view(np.uint32), storage)
    return np.uint32(np.uint32(lo) | (np.uint32(hi) << np.uint32(16)))


def _vector(builder, values, element):
    v = ir.Constant(ir.VectorType(element, len(values)), ir.Undefined)
    for i, value in enumerate(values):
        v = builder.insert_element(v, value, ir.Constant(_I32, i))
    return v


def _elements(context, builder, tuple_type, vector):
    values = [builder.extract_element(vector, ir.Constant(_I32, i)) for i in range(vector.type.count)]
    return context.make_tuple(builder, tuple_type, values)


@intrinsic
def _float32_halves(typingctx, word):
    pair = types.UniTuple(types.float32, 2)

    def codegen(context, builder, signature, args):
        return _elements(context, builder, pair, builder.bitcast(args[0], ir.VectorType(_FLOAT32, 2)))

    return pair(types.uint64), codegen


@intrinsic
def _float32_join(typingctx, low, high):
    def codegen(context, builder, signature, args):
        return builder.bitcast(_vector(builder, args, _FLOAT32), ir.IntType(64))

    return types.uint64(types.float32, types.float32), codegen


def _widen_intrinsic(bfloat16):
    @intrinsic
    def one(typingctx, bits):
        def codegen(context, builder, signature, args):
            return widen(builder, args[0], bfloat16)

        return types.float32(types.uint16), codegen

    @intrinsic
    def pair(typingctx, word):
        result = types.UniTuple(types.float32, 2)

        def codegen(context, builder, signature, args):
            if bfloat16:  # each half moved to the top of a float32: one operation a half
                low = builder.shl(args[0], ir.Constant(_I32, 16))
                high = builder.and_(args[0], ir.Constant(_I32, 0xFFFF0000))
                values = [builder.bitcast(v, _FLOAT32) for v in (low, high)]
                return context.make_tuple(builder, result, values)
            halves = builder.bitcast(args[0], ir.VectorType(ir.IntType(16), 2))
            return _elements(context, builder, result, widen(builder, halves, bfloat16))

        return result(types.uint32), codegen

    return one, pair


_widen_bfloat16, _widen_pair_bfloat16 = _widen_intrinsic(True)
_widen_float16, _widen_pair_float16 = _widen_intrinsic(False)


@intrinsic
def _narrow_pair_float16(typingctx, low, high):
    def codegen(context, builder, signature, args):
        return builder.bitcast(narrow(builder, _vector(builder, args, _FLOAT32), False), _I32)

    return types.uint32(types.float32, types.float32), codegen


def _narrow_pair_bfloat16_software(low, high):
    return _narrow_pair_software(low, high, _codec.BFLOAT16)


@intrinsic
def _narrow_pair_bfloat16(typingctx, low, high):
    signature = types.uint32(types.float32, types.float32)

    def codegen(context, builder, sig, args):
        flags = targetconfig.ConfigStack().top_or_none()
        cc = getattr(flags, "compute_capability", None)
        if cc is None or cc < (8, 0):
            return context.compile_internal(builder, _narrow_pair_bfloat16_software, sig, args)
        asm = ir.FunctionType(_I32, [_FLOAT32, _FLOAT32])
        # cvt's first operand goes to the upper half
        return builder.asm(asm, "cvt.rn.bf16x2.f32 $0, $1, $2;", "=r,f,f", [args[1], args[0]], False)

    return signature, codegen


@overload(float32_pair, target="cuda")
def _float32_pair_compiled(word):
    return lambda word: _float32_halves(word)


@overload(float32_word, target="cuda")
def _float32_word_compiled(low, high):
    return lambda low, high: _float32_join(np.float32(low), np.float32(high))


@overload(widen_one, target="cuda")
def _widen_one_compiled(bits, storage):
    def impl(bits, storage):
        if storage == _codec.BFLOAT16:
            return _widen_bfloat16(np.uint16(bits))
        return _widen_float16(np.uint16(bits))

    return impl


@overload(widen_pair, target="cuda")
def _widen_pair_compiled(word, storage):
    def impl(word, storage):
        if storage == _codec.BFLOAT16:
            return _widen_pair_bfloat16(word)
        return _widen_pair_float16(word)

    return impl


@overload(narrow_pair, target="cuda")
def _narrow_pair_compiled(low, high, storage):
    def impl(low, high, storage):
        if storage == _codec.BFLOAT16:
            return _narrow_pair_bfloat16(np.float32(low), np.float32(high))
        return _narrow_pair_float16(np.float32(low), np.float32(high))

    return impl
