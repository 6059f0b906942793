"""Element loads and stores shared by the Numba CPU and numba.cuda kernels.

Kernels compute in float64 and keep 16-bit floats as their raw bits in ``uint16`` arrays
(Numba has no CPU float16 and no bfloat16 at all), so torch bfloat16 tensors reach a
kernel as a zero-copy integer view. ``kind`` says how an element is stored (the constants
of ``_arrays``, imported here):

* ``FLOAT``: float32 or float64 element, read and written as is;
* ``FLOAT16``: IEEE binary16 bits;
* ``BFLOAT16``: bfloat16 bits (the upper half of a float32).

Stores round a float64 once to the nearest 16-bit value, ties to even: the float64 is
first rounded to float32 *to odd* (truncate, then set the last bit when inexact), which
keeps enough information for the second rounding to be the correct one. Kernels that
compute 16-bit elements in float32 convert with ``widen16`` (exact) and ``narrow16``
(float32 to 16 bits, ties to even), the two halves of ``load`` and ``store``: they define
the bits of the CUDA rotation's conversions (``_codec_cuda``, the device's instructions).

The functions are plain Python on NumPy scalars, compiled by ``numba.njit`` for the CPU,
by ``numba.cuda.jit(device=True)`` for the GPU, and run as is by the CUDA simulator. Each
kernel specialisation passes its storage ``kind`` as a constant, so only that branch is
left once the compiler has folded it (every branch type-checks for every element type).
"""

from __future__ import annotations

import numpy as np
from numba.core.extending import register_jitable

from ._arrays import BFLOAT16, FLOAT, FLOAT16  # noqa: F401  (kernels read them here, as _codec.FLOAT)


def load(value, kind):
    """The float64 value of one stored element."""
    if kind == FLOAT:
        return np.float64(value)
    return np.float64(widen16(value, kind))


@register_jitable
def widen16(value, kind):
    """The float32 value of 16-bit element bits ``value`` (exact)."""
    h = np.uint32(value) & np.uint32(0xFFFF)
    if kind == BFLOAT16:
        bits = h << np.uint32(16)
    else:
        sign = (h & np.uint32(0x8000)) << np.uint32(16)
        exponent = (h >> np.uint32(10)) & np.uint32(0x1F)
        mantissa = h & np.uint32(0x3FF)
        if exponent == 0:  # zero or subnormal: mantissa * 2**-24
            magnitude = np.float32(mantissa) * np.float32(5.9604644775390625e-08)
            return -magnitude if sign else magnitude
        if exponent == 0x1F:  # inf or nan
            bits = sign | np.uint32(0x7F800000) | (mantissa << np.uint32(13))
        else:
            bits = sign | ((exponent + np.uint32(112)) << np.uint32(23)) | (mantissa << np.uint32(13))
    return np.uint32(bits).view(np.float32)


def store(row, index, value, kind):
    """``row[index] = value`` (a float64), rounded once to the row's storage."""
    if kind == FLOAT:
        row[index] = value
        return
    # float32 bits rounded to odd: toward zero, last bit set when inexact. Written with
    # selects rather than branches so that the kernels' row loops vectorise.
    f = np.float32(value)
    back = np.float64(f)
    inexact = np.uint32(1) if back != value else np.uint32(0)  # also for nan, harmlessly
    too_far = np.uint32(1) if abs(back) > abs(value) else np.uint32(0)
    row[index] = narrow16(np.uint32((np.uint32(f.view(np.uint32)) - too_far) | inexact), kind)


@register_jitable
def narrow16(bits, kind):
    """The 16-bit element nearest to the float32 of bits ``bits``, ties to even; NaN stays
    NaN (quiet)."""
    if kind == BFLOAT16:
        rounding = np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))
        rounded = np.uint16((bits + rounding) >> np.uint32(16))
        quiet_nan = np.uint16((bits >> np.uint32(16)) | np.uint32(0x40))
        is_nan = bits & np.uint32(0x7FFFFFFF) > np.uint32(0x7F800000)
        return quiet_nan if is_nan else rounded
    sign = (bits >> np.uint32(16)) & np.uint32(0x8000)
    magnitude = bits & np.uint32(0x7FFFFFFF)
    if magnitude > np.uint32(0x7F800000):  # nan
        return np.uint16(sign | np.uint32(0x7E00))
    if magnitude >= np.uint32(0x477FF000):  # >= 65520, half way above 65504: inf
        return np.uint16(sign | np.uint32(0x7C00))
    if magnitude < np.uint32(0x38800000):  # below 2**-14: subnormal, in units of 2**-24
        scaled = np.float64(np.uint32(magnitude).view(np.float32)) * 16777216.0
        units = (scaled + 4503599627370496.0) - 4503599627370496.0  # rint, ties to even
        return np.uint16(sign | np.uint32(units))
    rounding = np.uint32(0xFFF) + ((magnitude >> np.uint32(13)) & np.uint32(1))
    return np.uint16(sign | (((magnitude + rounding) >> np.uint32(13)) - np.uint32(112 << 10)))
