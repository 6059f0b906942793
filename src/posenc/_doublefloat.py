"""Double-float arithmetic on float32 arrays, for namespaces without float64.

A value is a pair ``(hi, lo)`` of float32 arrays whose exact sum is the number, ``|lo| <=
ulp(hi)/2``: about 46 significant bits from float32 operations alone (Dekker, "A
floating-point technique for extending the available precision", 1971). posenc uses it
where a frequency must be computed inside a traced computation (a ``DynamicNTK`` length
under ``jax.jit`` without x64) with the precision of the host's float64 tables. :func:`mul`
with ``wide=True`` takes pairs of float64 arrays (double-double, about 106 bits).
"""

from __future__ import annotations

import numpy as np


_TWO_24 = 2**24


def constant(xp, values, device=None):
    """Host float64 numbers as a double-float of float32 arrays of ``xp``."""
    values = np.asarray(values, dtype=np.float64)
    hi = values.astype(np.float32)
    lo = (values - hi.astype(np.float64)).astype(np.float32)
    return xp.asarray(hi, device=device), xp.asarray(lo, device=device)


def _two_sum(a, b):
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


def _fast_two_sum(a, b):
    s = a + b
    return s, b - (s - a)


def split12(a):
    """Veltkamp's split of float32 ``a`` into two halves of 12 significant bits, ``hi + lo == a``."""
    return _split(a, _FLOAT32_SPLIT)


# Veltkamp's factors 2**s + 1: float32's 24 bits split in 12 and 12, float64's 53 in 26 and 27.
_FLOAT32_SPLIT, _FLOAT64_SPLIT = 4097.0, 134217729.0


def _split(a, factor):
    t = a * factor
    hi = t - (t - a)
    return hi, a - hi


def _two_product(a, b, factor):
    p = a * b
    ah, al = _split(a, factor)
    bh, bl = _split(b, factor)
    return p, ((ah * bh - p) + ah * bl + al * bh) + al * bl


def add(x, y):
    s, e = _two_sum(x[0], y[0])
    return _fast_two_sum(s, e + (x[1] + y[1]))


def mul(x, y, *, wide=False):
    p, e = _two_product(x[0], y[0], _FLOAT64_SPLIT if wide else _FLOAT32_SPLIT)
    return _fast_two_sum(p, e + (x[0] * y[1] + x[1] * y[0]))


def negate(x):
    return -x[0], -x[1]


def from_integer(xp, n):
    """An integer array (int32 or int64) as a double-float: ``n = high * 2**24 + low`` with
    ``0 <= low < 2**24``, both parts exact in float32 for ``|n| < 2**48``, and one
    :func:`_two_sum` of them, ``(fl(n), n - fl(n))``: exact there."""
    high = n // _TWO_24
    return _two_sum(xp.astype(high, xp.float32) * float(_TWO_24), xp.astype(n - high * _TWO_24, xp.float32))


def integer_constant(xp, n, device=None):
    """A host int as the double-float :func:`from_integer` makes of it (the same split: the same bits)."""
    high = n // _TWO_24
    hi, lo = _two_sum(np.float32(high) * np.float32(_TWO_24), np.float32(n - high * _TWO_24))
    return xp.asarray(hi, device=device), xp.asarray(lo, device=device)


def integer_power(xp, x, exponents):
    """``x ** k`` for every host integer ``k >= 0`` of ``exponents`` (binary powering), shaped
    ``broadcast(x, exponents)``: ``len(bin(max k))`` double-float products."""
    exponents = np.asarray(exponents, dtype=np.int64)
    one = xp.broadcast_to(xp.ones_like(x[0]), np.broadcast_shapes(tuple(x[0].shape), exponents.shape))
    result = (one, 0.0 * one)
    square = x
    for bit in range(int(exponents.max()).bit_length()):
        if bit:
            square = mul(square, square)
        mask = xp.asarray((exponents >> bit) & 1 == 1)
        result = mul(result, (xp.where(mask, square[0], one), xp.where(mask, square[1], 0.0 * one)))
    return result


def root_reciprocal(xp, x, k):
    """``x ** (-1/k)`` for a positive double-float ``x`` and a host integer ``k >= 1``: the
    float32 power refined by two Newton steps on ``q**k * x = 1`` in double-float."""
    q = (x[0] ** (-1.0 / k), xp.zeros_like(x[0]))
    for _ in range(2):
        residual = add(mul(integer_power(xp, q, k), x), (-xp.ones_like(x[0]), xp.zeros_like(x[0])))
        step = (residual[0] + residual[1]) / k  # |step| ~ 1e-7: float32 suffices
        q = add(q, negate(mul(q, (step, xp.zeros_like(step)))))
    return q
