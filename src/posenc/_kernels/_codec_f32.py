"""16-bit floats <-> float32 as LLVM instructions (Numba CPU kernels computing in float32).

Elements are ``uint16`` bits, loaded exactly as float32 and stored from float32 rounded to
nearest, ties to even (NaN stays NaN). ``widen`` and ``narrow`` build the instructions for
a scalar or a vector of any width (x86 F16C converts ``half`` vectors in hardware); they
serve ``_pairs`` and the scalar loads below. Written as LLVM instructions rather than
Numba code because Numba's own integer typing widens every ``uint32`` operation to 64
bits, which halves the vector width of a 16-bit row. ``_codec`` holds the float64
conversions the other kernels use.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.extending import intrinsic


def _like(value, element):
    """``element`` as a scalar or as a vector of ``value``'s width."""
    return ir.VectorType(element, value.type.count) if isinstance(value.type, ir.VectorType) else element


def constant(t, value):
    """``value`` as an LLVM constant of type ``t``: a scalar, or every lane of a vector."""
    return ir.Constant(t, [value] * t.count) if isinstance(t, ir.VectorType) else ir.Constant(t, value)


def widen(builder, bits, bfloat16):
    """The float32 value(s) of 16-bit ``bits``: bfloat16 is the upper half of a float32, float16 IEEE binary16."""
    if bfloat16:
        wide = builder.zext(bits, _like(bits, ir.IntType(32)))
        return builder.bitcast(builder.shl(wide, constant(wide.type, 16)), _like(bits, ir.FloatType()))
    return builder.fpext(builder.bitcast(bits, _like(bits, ir.HalfType())), _like(bits, ir.FloatType()))


def narrow(builder, value, bfloat16):
    """The 16-bit bits nearest to float32 ``value`` (ties to even; float16 overflows to inf).

    bfloat16: a NaN ``value`` must have zero low 16 bits, as every NaN computed from
    bfloat16 operands has (arithmetic keeps an operand's payload or makes the default NaN).
    Then the rounding increment cannot carry into its upper half, and NaN stays NaN
    without a select (which costs a sixth of the 16-bit rotation's time).
    """
    i16 = _like(value, ir.IntType(16))
    if not bfloat16:
        return builder.bitcast(builder.fptrunc(value, _like(value, ir.HalfType())), i16)
    bits = builder.bitcast(value, _like(value, ir.IntType(32)))
    lowest_kept = builder.and_(builder.lshr(bits, constant(bits.type, 16)), constant(bits.type, 1))
    rounded = builder.add(bits, builder.add(constant(bits.type, 0x7FFF), lowest_kept))
    return builder.trunc(builder.lshr(rounded, constant(bits.type, 16)), i16)


@intrinsic
def from_bfloat16(typingctx, bits):
    """The float32 value of bfloat16 bits (exact)."""
    return types.float32(types.uint16), lambda context, builder, signature, args: widen(builder, args[0], True)


@intrinsic
def from_float16(typingctx, bits):
    """The float32 value of IEEE binary16 bits (exact)."""
    return types.float32(types.uint16), lambda context, builder, signature, args: widen(builder, args[0], False)
