"""xPos: RoPE with an exponential decay of the score in the relative distance."""

from __future__ import annotations

import math

import numpy as np

from .. import _doublefloat
from .. import _validate as check
from .._xp import cast, constant_on, device_of, is_real_floating, namespace, on_accelerator, result_dtype, widest_float
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
    log_zeta = [math.log((i / dim + 0.4) / 1.4) for i in range(0, dim, 2)]
    if work == xp.float32:
        # Without float64, m ln(zeta) / gamma as a double-float (hi, lo): exp(hi) (1 + lo)
        # is the float32 power within a few ulps at every position (a float32 product was
        # off by |m ln(zeta) / gamma| ulps).
        if is_real_floating(xp, positions.dtype):
            m = (cast(xp, positions, work), xp.zeros(positions.shape, dtype=work, device=device))
        else:
            m = _doublefloat.from_integer(xp, positions)
        rate = _doublefloat.constant(xp, np.asarray(log_zeta) / scale_base, device)
        hi, lo = _doublefloat.mul((m[0][..., None], m[1][..., None]), rate)
        return cast(xp, duplicate(xp, xp.exp(hi) * (1 + lo), layout), dtype)
    log_zeta = constant_on(xp, tuple(log_zeta), work, device, "xPos exponents")
    exponent = cast(xp, positions, work)[..., None] / scale_base
    return cast(xp, duplicate(xp, xp.exp(exponent * log_zeta), layout), dtype)
