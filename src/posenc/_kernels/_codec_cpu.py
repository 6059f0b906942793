"""16-bit float conversions and a fused multiply-add for the Numba CPU kernels, as LLVM instructions.

Numba's own integer typing widens every ``uint32`` operation to 64 bits, which halves the
vector width of a 16-bit row loop; these forms are a few instructions each and vectorise
to 8 float32 lanes (x86 F16C converts ``half`` in hardware). ``load16``/``store16`` take
the ``_codec`` storage ``kind`` (``FLOAT16`` or ``BFLOAT16``), which should be a
compile-time constant in the calling kernel: elements are ``uint16`` bits, loaded exactly
as float32 and stored from float32 rounded to nearest, ties to even (NaN stays NaN).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from . import _codec

_I16, _I32 = ir.IntType(16), ir.IntType(32)
_HALF, _FLOAT = ir.HalfType(), ir.FloatType()


def _i32(value):
    return ir.Constant(_I32, value)


@intrinsic
def _bfloat16_to_float32(typingctx, bits):
    """The float32 value of bfloat16 bits (exact: the upper half of a float32)."""

    def codegen(context, builder, signature, args):
        return builder.bitcast(builder.shl(builder.zext(args[0], _I32), _i32(16)), _FLOAT)

    return types.float32(types.uint16), codegen


@intrinsic
def _float16_to_float32(typingctx, bits):
    """The float32 value of IEEE binary16 bits (exact)."""

    def codegen(context, builder, signature, args):
        return builder.fpext(builder.bitcast(args[0], _HALF), _FLOAT)

    return types.float32(types.uint16), codegen


@intrinsic
def _float32_to_bfloat16(typingctx, value):
    """The bfloat16 bits nearest to float32 ``value`` (ties to even; NaN stays a quiet NaN)."""

    def codegen(context, builder, signature, args):
        bits = builder.bitcast(args[0], _I32)
        upper = builder.lshr(bits, _i32(16))
        rounded = builder.lshr(builder.add(bits, builder.add(_i32(0x7FFF), builder.and_(upper, _i32(1)))), _i32(16))
        is_nan = builder.fcmp_unordered("uno", args[0], args[0])
        return builder.trunc(builder.select(is_nan, builder.or_(upper, _i32(0x40)), rounded), _I16)

    return types.uint16(types.float32), codegen


@intrinsic
def _float32_to_float16(typingctx, value):
    """The binary16 bits nearest to float32 ``value`` (ties to even; overflow to inf)."""

    def codegen(context, builder, signature, args):
        return builder.bitcast(builder.fptrunc(args[0], _HALF), _I16)

    return types.uint16(types.float32), codegen


@intrinsic
def fma32(typingctx, a, b, c):
    """``a * b + c`` in float32 with one rounding."""

    def codegen(context, builder, signature, args):
        fma = builder.module.declare_intrinsic("llvm.fma", [_FLOAT], ir.FunctionType(_FLOAT, [_FLOAT] * 3))
        return builder.call(fma, args)

    return types.float32(types.float32, types.float32, types.float32), codegen


@njit(cache=True, inline="always")
def load16(bits, kind):
    """The float32 value of 16-bit ``bits`` of storage ``kind`` (``FLOAT16`` or ``BFLOAT16``)."""
    if kind == _codec.BFLOAT16:
        return _bfloat16_to_float32(np.uint16(bits))
    return _float16_to_float32(np.uint16(bits))


@njit(cache=True, inline="always")
def store16(row, index, value, kind):
    """``row[index]`` = float32 ``value`` rounded once to storage ``kind`` (``FLOAT16`` or ``BFLOAT16``)."""
    if kind == _codec.BFLOAT16:
        row[index] = _float32_to_bfloat16(np.float32(value))
    else:
        row[index] = _float32_to_float16(np.float32(value))
