"""16-bit float payloads as integers: decode to float32, encode with round-to-nearest-even.

Neither Numba's CPU target nor NumPy has bfloat16, and Numba's CPU target has no float16,
so the kernels move 16-bit floats as ``uint16`` bit patterns. Copies need nothing more;
``toeplitz_scatter`` sums, so it widens each payload to float32 here and rounds the sum
back once. The functions are plain Python on integers and NumPy scalars: ``bias_cpu``
compiles them with ``numba.njit`` and ``bias_cuda`` with ``numba.cuda.jit(device=True)``.
"""

from __future__ import annotations

import numpy as np


def float16_to_float32(h):
    """The float32 value of the IEEE half-precision bit pattern ``h`` (exact)."""
    h = np.int64(h)
    sign = (h & 0x8000) << 16
    exponent = (h >> 10) & 0x1F
    mantissa = h & 0x3FF
    if exponent == 0x1F:
        bits = sign | 0x7F800000 | (mantissa << 13)
    elif exponent != 0:
        bits = sign | ((exponent + 112) << 23) | (mantissa << 13)
    elif mantissa == 0:
        bits = sign
    else:
        # Subnormal half: normalise the mantissa into a float32 normal number.
        exponent = 113
        while (mantissa & 0x400) == 0:
            mantissa <<= 1
            exponent -= 1
        bits = sign | (exponent << 23) | ((mantissa & 0x3FF) << 13)
    return np.uint32(bits).view(np.float32)


def float32_to_float16(x):
    """The half-precision bit pattern nearest to float32 ``x`` (ties to even, NaN kept)."""
    b = np.int64(np.float32(x).view(np.uint32))
    sign = (b >> 16) & 0x8000
    exponent = (b >> 23) & 0xFF
    mantissa = b & 0x7FFFFF
    if exponent == 0xFF:
        return sign | 0x7C00 | (0x200 if mantissa != 0 else 0)
    half_exponent = exponent - 112
    if half_exponent >= 31:
        return sign | 0x7C00
    if half_exponent <= 0:
        if half_exponent < -10:
            return sign
        # Result is subnormal (or rounds up to the smallest normal): units of 2**-24.
        mantissa |= 0x800000
        shift = 14 - half_exponent
        quotient = mantissa >> shift
        remainder = mantissa & ((1 << shift) - 1)
        halfway = 1 << (shift - 1)
        if remainder > halfway or (remainder == halfway and (quotient & 1) == 1):
            quotient += 1
        return sign | quotient
    quotient = (half_exponent << 10) | (mantissa >> 13)
    remainder = mantissa & 0x1FFF
    if remainder > 0x1000 or (remainder == 0x1000 and (quotient & 1) == 1):
        quotient += 1  # a carry into the exponent is the right rounding, up to inf
    return sign | quotient


def bfloat16_to_float32(h):
    """The float32 value of the bfloat16 bit pattern ``h`` (exact: its upper half)."""
    return np.uint32(np.int64(h) << 16).view(np.float32)


def float32_to_bfloat16(x):
    """The bfloat16 bit pattern nearest to float32 ``x`` (ties to even, NaN kept quiet)."""
    b = np.int64(np.float32(x).view(np.uint32))
    if (b & 0x7F800000) == 0x7F800000 and (b & 0x7FFFFF) != 0:
        return (b >> 16) | 0x40
    return (b + 0x7FFF + ((b >> 16) & 1)) >> 16
