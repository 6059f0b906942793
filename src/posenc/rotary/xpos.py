"""xPos: RoPE with an exponential decay of the score in the relative distance."""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from .. import _doublefloat
from .. import _validate as check
from .._xp import cast, constant_on, device_of, is_real_floating, namespace, on_accelerator, result_dtype, trace_constant, widest_float
from . import _args
from ._call import duplicate


def xpos_scale(positions, dim, *, scale_base=512, layout="half", dtype=None):
    r"""xPos scale factors :math:`\zeta_i^{\,m / \gamma}` for tokens at positions ``m``.

    .. math:: \zeta_i = \frac{2i/d + 0.4}{1.4} \in [0.29, 1), \quad i < d/2, \qquad
              \gamma = \text{scale\_base}

    (Sun et al., "A Length-Extrapolatable Transformer", 2022). After RoPE, queries are
    multiplied by the scale and keys divided by it, so the score of query ``m`` and key
    ``n`` gains the factor :math:`\zeta_i^{(m - n)/\gamma}` per pair: it decays with the
    relative distance ``rel = m - n > 0``. Because :math:`\zeta^{\pm m/\gamma}` under- or
    overflows for large ``|m|``, xPos implementations center the positions (torchscale
    uses ``-L/2 .. L/2``); only the difference ``m - n`` matters.

    Parameters
    ----------
    positions : array (integer or float, any shape)
        Float positions must be finite; on an accelerator that is not read back to be
        checked (a non-finite position gives NaN).
    dim : int
        Rotary dimension, positive and even.
    scale_base : float
        :math:`\gamma` (512 in the paper).
    layout : {"half", "interleaved"}
        Order of the duplicated factors, as in :func:`rope_cos_sin`.
    dtype : float dtype, optional
        Default: the dtype of float positions, float32 for integer ones.

    Returns
    -------
    array ``positions.shape + (dim,)``: multiply rotated queries by it, divide rotated keys.

    Examples
    --------
    >>> import numpy as np, posenc as pe
    >>> pe.xpos_scale(np.array([0.0, 512.0]), 4).round(4).tolist()
    [[1.0, 1.0, 1.0, 1.0], [0.2857, 0.6429, 0.2857, 0.6429]]
    """
    check.array("positions", positions)
    xp = namespace(positions)
    device = device_of(positions)
    positions = check.positions("positions", positions, xp, finite=not (check.is_eager(positions) and on_accelerator(positions)))  # (as rope's)
    dim = check.even_dim("dim", dim)
    scale_base = check.real("scale_base", scale_base, positive=True)
    layout = _args.layout("layout", layout)
    if dtype is None:
        dtype = positions.dtype if is_real_floating(xp, positions.dtype) else xp.float32
    dtype = result_dtype(xp, dtype, device)
    check.allocatable("xpos_scale", (*positions.shape, dim), 8)
    check.allocatable("xpos_scale's exponents", (dim // 2,), 128)  # (a list of Python floats, even for no positions)
    work = widest_float(xp, device)
    rate_hi, rate_lo = exponent_rates(dim, scale_base)
    wide = work != xp.float32
    rates = _numpy_rates(dim, scale_base) if xp is np else None
    if wide and dtype != work:  # (a 16- or 32-bit result: the float64 product's error is far below its rounding)
        exponent = cast(xp, positions, work)[..., None] * (rates[0] if rates else constant_on(xp, rate_hi, work, device, "xPos exponents"))
        return cast(xp, duplicate(xp, xp.exp(exponent), layout), dtype)
    # m ln(zeta) / gamma as a double (hi, lo), of float64 (a float64 result) or float32 (without
    # float64): exp(hi) (1 + lo) is the power within two ulps of the result at every position (a
    # product was off by about |m ln(zeta) / gamma| ulps: 5,600 float64 ulps at m = 10**6).
    if rates:
        rate = rates
    elif wide:
        rate = (constant_on(xp, rate_hi, work, device, "xPos exponents"), constant_on(xp, rate_lo, work, device, "xPos exponents"))
    else:
        rate = _doublefloat.constant(xp, np.asarray(rate_hi), device)
    if wide or is_real_floating(xp, positions.dtype):
        m = (cast(xp, positions, work), xp.zeros(positions.shape, dtype=work, device=device))
    else:
        m = _doublefloat.from_integer(xp, positions)
    # Past exp's range the power is exp(m * rate) = 0 or inf; the split of a huge position
    # would overflow there (NaN).
    rough = m[0][..., None] * rate[0]
    inside = xp.abs(rough) <= 1000.0
    hi, lo = _doublefloat.mul((xp.where(inside, m[0][..., None], 0.0), xp.where(inside, m[1][..., None], 0.0)), rate, wide=wide)
    hi, lo = xp.where(inside, hi, rough), xp.where(inside, lo, 0.0)
    return cast(xp, duplicate(xp, xp.exp(hi) * (1 + lo), layout), dtype)


@trace_constant
def exponent_rates(dim, scale_base):
    """``ln(zeta_i) / gamma`` of every pair as two tuples of float64 numbers ``(hi, lo)``, their
    sum within ``2**-105`` of the exact value, relatively: ``zeta_i = (5 i + 2 d) / (7 d)`` exactly (``i``
    even), its logarithm in decimal to 40 digits."""
    return _exponent_rates(dim, scale_base)


@lru_cache(maxsize=64)
def _numpy_rates(dim, scale_base):
    """:func:`exponent_rates` as two read-only NumPy float64 arrays, made once (1.7 us a call)."""
    rates = tuple(np.asarray(r, dtype=np.float64) for r in exponent_rates(dim, scale_base))
    for r in rates:
        r.flags.writeable = False
    return rates


@lru_cache(maxsize=64)
def _exponent_rates(dim, scale_base):
    from decimal import Decimal, localcontext  # (on first use: 4 ms that import posenc need not pay)

    with localcontext() as context:
        context.prec = 40
        rates = [(Decimal(5 * i + 2 * dim) / Decimal(7 * dim)).ln() / Decimal(scale_base) for i in range(0, dim, 2)]
        hi = tuple(float(r) for r in rates)
        return hi, tuple(float(r - Decimal(h)) for r, h in zip(rates, hi))
