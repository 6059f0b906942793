"""The rotation of ``lanes`` pairs of a row at a time, as LLVM intrinsics (the CPU rotary kernels).

An intrinsic loads ``lanes`` pairs ``(a, b)`` of a row as vectors, rotates them and stores
them, with no loop around it: the Numba kernel steps over the row. Written as vectors,
the rotation needs neither LLVM's loop vectoriser, which gives up on a row written in
place (``dst`` is ``src``: every store may overwrite a later load) and on the stride-2
pairs of the interleaved layout, nor a row buffer to copy back. Every load comes before
the first store. The same intrinsic with ``lanes=1`` rotates a row's last pairs, so there
is one arithmetic for every pair. The pair ``j`` of a row is ``(j, half + j)``, or
``(2j, 2j + 1)`` in the interleaved layout, which is split and joined with two shuffles.

``rotate_wide``: float32 and float64 rows in float64, the reference's arithmetic,
``a' = a*cos - b*sin`` and ``b' = b*cos + a*sin`` (no fused multiply-add), rounded once
to the row's dtype.

``rotate_16``: float16 and bfloat16 rows (``uint16`` bits) in float32 (``rope_cpu``
derives the error bound): ``cos = ch + cl`` and ``sin = sh + sl``, heads of 16
significant bits (13 for float16) so that ``a*ch``, ``b*sh``, ``b*ch`` and ``a*sh`` are
exact in float32, and

    a' = fma(a, ch, -(b*sh)) + fma(af, cl, -(bf*sl))
    b' = fma(b, ch,   a*sh)  + fma(bf, cl,   af*sl)

with ``af``, ``bf`` the operands clamped to finite values, so that an infinite input
leaves its infinite head term alone instead of adding ``inf - inf``. Each result is
rounded once to 16 bits (``_codec_f32.narrow``).

Both raise ``IndexError`` for an index out of bounds when Numba's bounds checking is on
(``NUMBA_BOUNDSCHECK=1``); otherwise the caller keeps every index in bounds.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ._codec_f32 import constant, narrow, widen

_FLOAT32_MAX = float(np.finfo(np.float32).max)
_I32 = ir.IntType(32)


class _Row:
    """Where ``lanes`` pairs from pair ``start`` lie in the 1-D rows of one call, and their loads and stores."""

    def __init__(self, context, builder, start, half, lanes, interleaved):
        self.context, self.builder, self.lanes, self.interleaved = context, builder, lanes, interleaved
        self.start = start

        def constant(value):
            return ir.Constant(start.type, value)

        self.end = builder.add(start, constant(lanes - 1))
        if interleaved:
            first = builder.mul(start, constant(2))
            self.places = [(first, builder.add(first, constant(2 * lanes - 1)))]
        else:
            self.places = [(start, self.end), (builder.add(start, half), builder.add(self.end, half))]

    def _check(self, array_type, array, first, last):
        if self.context.enable_boundscheck:
            shape = self.context.make_array(array_type)(self.context, self.builder, array).shape
            (length,) = cgutils.unpack_tuple(self.builder, shape, 1)
            for index in (first, last):
                cgutils.do_boundscheck(self.context, self.builder, index, length)

    def _pointer(self, array_type, array, index, count):
        data = self.context.make_array(array_type)(self.context, self.builder, array).data
        element = data.type.pointee
        return self.builder.bitcast(self.builder.gep(data, [index]), ir.VectorType(element, count).as_pointer())

    def _align(self, array_type):
        return array_type.dtype.bitwidth // 8

    def table(self, array_type, array):
        """Entries ``start .. start + lanes - 1`` of a table row (one per pair)."""
        self._check(array_type, array, self.start, self.end)
        return self.builder.load(self._pointer(array_type, array, self.start, self.lanes), align=self._align(array_type))

    def pairs(self, array_type, array):
        """``(a, b)``: the pairs' first and second elements, as two vectors."""
        builder, count = self.builder, self.lanes
        for first, last in self.places:
            self._check(array_type, array, first, last)
        width = 2 * count if self.interleaved else count
        align = self._align(array_type)
        loaded = [builder.load(self._pointer(array_type, array, at, width), align=align) for at, _ in self.places]
        if not self.interleaved:
            return loaded
        even, odd = (ir.Constant(ir.VectorType(_I32, count), list(range(k, 2 * count, 2))) for k in (0, 1))
        return builder.shuffle_vector(loaded[0], loaded[0], even), builder.shuffle_vector(loaded[0], loaded[0], odd)

    def store(self, array_type, array, a, b):
        """Write the rotated ``(a, b)`` back where ``pairs`` read them."""
        builder, count = self.builder, self.lanes
        for first, last in self.places:
            self._check(array_type, array, first, last)
        if self.interleaved:
            zipped = ir.Constant(ir.VectorType(_I32, 2 * count), [k // 2 + (count if k % 2 else 0) for k in range(2 * count)])
            values = [builder.shuffle_vector(a, b, zipped)]
        else:
            values = [a, b]
        align = self._align(array_type)
        for value, (at, _) in zip(values, self.places):
            builder.store(value, self._pointer(array_type, array, at, value.type.count), align=align)


def _literals(lanes, flags):
    if isinstance(lanes, types.IntegerLiteral) and all(isinstance(f, types.BooleanLiteral) for f in flags):
        return lanes.literal_value, [f.literal_value for f in flags]
    return None


@intrinsic(prefer_literal=True)
def rotate_wide(typingctx, src, dst, cos, sin, i, half, lanes, interleaved):
    """Pairs ``i .. i + lanes - 1`` of the float32 or float64 row ``src`` rotated into ``dst``
    (which may be ``src``), with float64 ``cos``/``sin`` rows. ``lanes`` and ``interleaved``
    are compile-time constants."""
    constants = _literals(lanes, [interleaved])
    if constants is None:
        return None
    count, (paired,) = constants

    def codegen(context, builder, signature, args):
        src_t, dst_t, cos_t, sin_t = signature.args[:4]
        row = _Row(context, builder, args[4], args[5], count, paired)
        c, s = row.table(cos_t, args[2]), row.table(sin_t, args[3])
        a, b = row.pairs(src_t, args[0])
        vector = c.type
        narrowing = a.type != vector
        if narrowing:
            a, b = builder.fpext(a, vector), builder.fpext(b, vector)
        ra = builder.fsub(builder.fmul(a, c), builder.fmul(b, s))
        rb = builder.fadd(builder.fmul(b, c), builder.fmul(a, s))
        if narrowing:
            stored = ir.VectorType(ir.FloatType(), count)
            ra, rb = builder.fptrunc(ra, stored), builder.fptrunc(rb, stored)
        row.store(dst_t, args[1], ra, rb)
        return context.get_dummy_value()

    return types.void(src, dst, cos, sin, i, half, lanes, interleaved), codegen


def _rotated_16(builder, a, b, ch, cl, sh, sl):
    vector = a.type
    fma = builder.module.declare_intrinsic(f"llvm.fma.v{vector.count}f32", (), ir.FunctionType(vector, [vector] * 3))
    big, small = constant(vector, _FLOAT32_MAX), constant(vector, -_FLOAT32_MAX)

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
def rotate_16(typingctx, src, dst, ch, cl, sh, sl, i, half, lanes, bfloat16, interleaved):
    """Pairs ``i .. i + lanes - 1`` of the ``uint16`` row ``src`` (float16 or bfloat16 bits)
    rotated into ``dst`` (which may be ``src``), with the float32 split ``cos``/``sin`` rows
    ``ch``, ``cl``, ``sh``, ``sl``. ``lanes``, ``bfloat16`` and ``interleaved`` are
    compile-time constants."""
    constants = _literals(lanes, [bfloat16, interleaved])
    if constants is None:
        return None
    count, (brain, paired) = constants

    def codegen(context, builder, signature, args):
        row = _Row(context, builder, args[6], args[7], count, paired)
        ch, cl, sh, sl = (row.table(signature.args[k], args[k]) for k in range(2, 6))
        a_bits, b_bits = row.pairs(signature.args[0], args[0])
        ra, rb = _rotated_16(builder, widen(builder, a_bits, brain), widen(builder, b_bits, brain), ch, cl, sh, sl)
        row.store(signature.args[1], args[1], narrow(builder, ra, brain), narrow(builder, rb, brain))
        return context.get_dummy_value()

    return types.void(src, dst, ch, cl, sh, sl, i, half, lanes, bfloat16, interleaved), codegen
