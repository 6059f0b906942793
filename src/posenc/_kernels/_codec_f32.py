"""16-bit floats <-> float32, and a fused multiply-add, as LLVM instructions (Numba CPU kernels).

The arithmetic of the 16-bit CPU rotation is float32; these conversions are a few
instructions each and vectorise to 8 float32 lanes (x86 F16C converts ``half`` in
hardware). Numba's own integer typing would widen every ``uint32`` operation to 64 bits,
which halves the vector width of a 16-bit row loop. Elements are ``uint16`` bits, loaded
exactly as float32 and stored from float32 rounded to nearest, ties to even (NaN stays
NaN). ``_codec`` holds the float64 conversions the other kernels use.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

_I16, _I32 = ir.IntType(16), ir.IntType(32)
_HALF, _FLOAT = ir.HalfType(), ir.FloatType()


def _i32(value):
    return ir.Constant(_I32, value)


@intrinsic
def from_bfloat16(typingctx, bits):
    """The float32 value of bfloat16 bits (exact: the upper half of a float32)."""

    def codegen(context, builder, signature, args):
        return builder.bitcast(builder.shl(builder.zext(args[0], _I32), _i32(16)), _FLOAT)

    return types.float32(types.uint16), codegen


@intrinsic
def from_float16(typingctx, bits):
    """The float32 value of IEEE binary16 bits (exact)."""

    def codegen(context, builder, signature, args):
        return builder.fpext(builder.bitcast(args[0], _HALF), _FLOAT)

    return types.float32(types.uint16), codegen


@intrinsic
def bfloat16_bits(typingctx, value):
    """The bfloat16 bits nearest to float32 ``value`` (ties to even).

    A NaN ``value`` must have zero low 16 bits, as every NaN computed from bfloat16
    operands has: arithmetic keeps an operand's payload or makes the default NaN. Then the
    rounding increment cannot carry into its upper half, and NaN stays NaN without a
    select (which costs a sixth of the 16-bit rotation's time).
    """

    def codegen(context, builder, signature, args):
        bits = builder.bitcast(args[0], _I32)
        lowest_kept = builder.and_(builder.lshr(bits, _i32(16)), _i32(1))
        return builder.trunc(builder.lshr(builder.add(bits, builder.add(_i32(0x7FFF), lowest_kept)), _i32(16)), _I16)

    return types.uint16(types.float32), codegen


@intrinsic
def float16_bits(typingctx, value):
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
