"""The float32 rotation of float16 and bfloat16 pairs, ``lanes`` pairs at a time, as one LLVM intrinsic.

``rotate_pairs`` loads ``lanes`` pairs ``(a, b)`` of a row as vectors, rotates them and
stores them, with no loop around it: the Numba kernel steps over the row. Written as
vectors, the rotation needs neither LLVM's loop vectoriser, which gives up on a row
written in place (``dst`` is ``src``: every store may overwrite a later load), nor a row
buffer to copy back; the same intrinsic with ``lanes=1`` rotates a row's last pairs, so
there is one arithmetic for every pair.

The arithmetic (``rope_cpu`` derives it): ``cos = ch + cl`` and ``sin = sh + sl``, heads
of 16 significant bits (13 for float16) so that ``a*ch``, ``b*sh``, ``b*ch`` and ``a*sh``
are exact in float32, and

    a' = fma(a, ch, -(b*sh)) + fma(af, cl, -(bf*sl))
    b' = fma(b, ch,   a*sh)  + fma(bf, cl,   af*sl)

with ``af``, ``bf`` the operands clamped to finite values, so that an infinite input
leaves its infinite head term alone instead of adding ``inf - inf``. Each result is
rounded once to 16 bits (``_codec_f32.narrow``).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ._codec_f32 import narrow, widen

_FLOAT32_MAX = float(np.finfo(np.float32).max)


def _splat(vector_type, value):
    return ir.Constant(vector_type, [value] * vector_type.count)


def _check_bounds(context, builder, array_type, array, first, last):
    """``IndexError`` unless ``first`` and ``last`` index ``array`` (only when Numba's bounds checking is on)."""
    if context.enable_boundscheck:
        (length,) = cgutils.unpack_tuple(builder, context.make_array(array_type)(context, builder, array).shape, 1)
        for index in (first, last):
            cgutils.do_boundscheck(context, builder, index, length)


def _pointer(context, builder, array_type, array, index, element_type, lanes):
    data = context.make_array(array_type)(context, builder, array).data
    return builder.bitcast(builder.gep(data, [index]), ir.VectorType(element_type, lanes).as_pointer())


def _rotated(builder, a, b, ch, cl, sh, sl):
    vector = a.type
    fma = builder.module.declare_intrinsic(f"llvm.fma.v{vector.count}f32", (), ir.FunctionType(vector, [vector] * 3))
    big, small = _splat(vector, _FLOAT32_MAX), _splat(vector, -_FLOAT32_MAX)

    def finite(v):
        v = builder.select(builder.fcmp_ordered(">", v, small), v, small)
        return builder.select(builder.fcmp_ordered("<", v, big), v, big)

    af, bf = finite(a), finite(b)
    ra = builder.fadd(
        builder.call(fma, [a, ch, builder.fneg(builder.fmul(b, sh))]),
        builder.call(fma, [af, cl, builder.fneg(builder.fmul(bf, sl))]),
    )
    rb = builder.fadd(builder.call(fma, [b, ch, builder.fmul(a, sh)]), builder.call(fma, [bf, cl, builder.fmul(af, sl)]))
    return ra, rb


@intrinsic(prefer_literal=True)
def rotate_pairs(typingctx, src, dst, ch, cl, sh, sl, i, half, lanes, bfloat16, interleaved):
    """Pairs ``i .. i + lanes - 1`` of the row ``src`` rotated into the row ``dst`` (which may be ``src``).

    ``src``, ``dst``: 1-D contiguous ``uint16`` rows, the pair ``j`` at ``(j, half + j)``
    or, ``interleaved``, at ``(2j, 2j + 1)``. ``ch``, ``cl``, ``sh``, ``sl``: contiguous
    float32 rows of the split ``cos`` and ``sin`` (pair ``j`` at ``j``). ``lanes``,
    ``bfloat16`` and ``interleaved`` are compile-time constants. Every load comes before
    the first store. The caller keeps indices in bounds; with Numba's bounds checking on,
    an index out of bounds raises ``IndexError``.
    """
    if not (
        isinstance(lanes, types.IntegerLiteral)
        and isinstance(bfloat16, types.BooleanLiteral)
        and isinstance(interleaved, types.BooleanLiteral)
    ):
        return None
    count, brain, paired = lanes.literal_value, bfloat16.literal_value, interleaved.literal_value
    i16, f32 = ir.IntType(16), ir.FloatType()

    def codegen(context, builder, signature, args):
        src_v, dst_v, *table, start, half_v = args[:8]
        src_t, dst_t, table_types = signature.args[0], signature.args[1], signature.args[2:6]

        def constant(value):
            return ir.Constant(start.type, value)

        end = builder.add(start, constant(count - 1))
        for array, array_type in zip(table, table_types):
            _check_bounds(context, builder, array_type, array, start, end)
        ch, cl, sh, sl = (
            builder.load(_pointer(context, builder, array_type, array, start, f32, count), align=4)
            for array, array_type in zip(table, table_types)
        )
        if paired:
            first = builder.mul(start, constant(2))
            places = [(first, builder.add(first, constant(2 * count - 1)))]
        else:
            places = [(start, end), (builder.add(start, half_v), builder.add(end, half_v))]
        for array, array_type in ((src_v, src_t), (dst_v, dst_t)):
            for first, last in places:
                _check_bounds(context, builder, array_type, array, first, last)
        width = 2 * count if paired else count
        loaded = [builder.load(_pointer(context, builder, src_t, src_v, at, i16, width), align=2) for at, _ in places]
        if paired:
            even, odd = list(range(0, 2 * count, 2)), list(range(1, 2 * count, 2))
            a_bits = builder.shuffle_vector(loaded[0], loaded[0], ir.Constant(ir.VectorType(ir.IntType(32), count), even))
            b_bits = builder.shuffle_vector(loaded[0], loaded[0], ir.Constant(ir.VectorType(ir.IntType(32), count), odd))
        else:
            a_bits, b_bits = loaded
        ra, rb = _rotated(builder, widen(builder, a_bits, brain), widen(builder, b_bits, brain), ch, cl, sh, sl)
        ra_bits, rb_bits = narrow(builder, ra, brain), narrow(builder, rb, brain)
        if paired:
            zipped = [k // 2 + (count if k % 2 else 0) for k in range(2 * count)]
            stored = [builder.shuffle_vector(ra_bits, rb_bits, ir.Constant(ir.VectorType(ir.IntType(32), 2 * count), zipped))]
        else:
            stored = [ra_bits, rb_bits]
        for value, (at, _) in zip(stored, places):
            builder.store(value, _pointer(context, builder, dst_t, dst_v, at, i16, value.type.count), align=2)
        return context.get_dummy_value()

    return types.void(src, dst, ch, cl, sh, sl, i, half, lanes, bfloat16, interleaved), codegen
