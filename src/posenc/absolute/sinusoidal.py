"""Fixed sinusoidal encoding (Vaswani et al., 2017)."""

from __future__ import annotations

import numpy as np

from .. import _compat
from .. import _validate as check
from .._xp import argument_in, cast, constant_on, cos_sin, device_of, has_float64, is_real_floating, namespace, on_accelerator, result_dtype, trace_constant

LAYOUTS = ("interleaved", "half")


def inverse_frequencies(dim: int, base: float) -> list[float]:
    """Host float64 frequencies ``base**(-2i/dim)`` for ``i < dim/2``."""
    return [base ** (-(2.0 * i) / dim) for i in range(dim // 2)]


@trace_constant
def wavelengths(dim: int, base: float) -> tuple:
    """Host float64 divisors ``base**(2i/dim)`` for ``i < dim/2``, NumPy's ``power`` as
    Marian's, Pegasus's and RoFormer's tables compute them."""
    return tuple(np.power(base, np.arange(0, dim, 2) / dim).tolist())


def sinusoidal(positions, dim, *, base=10000.0, layout="interleaved", xp=None, device=None, dtype=None):
    r"""Sinusoidal position encoding.

    .. math::

        p_{k, 2i} = \sin(k\,\omega_i), \quad p_{k, 2i+1} = \cos(k\,\omega_i), \quad
        \omega_i = \text{base}^{-2i/d}

    (``layout="interleaved"``, the default: Vaswani et al., "Attention Is All You Need",
    2017). With ``layout="half"`` the sines fill the first half of the features and the
    cosines the second half (the table of RoFormer and Marian; the halves pairing of
    :func:`rope`'s ``"half"``). fairseq's table (and M2M100's, in transformers) has this
    order but other numbers: :math:`\omega_i = \text{base}^{-i/(d/2 - 1)}`, rows shifted by
    ``padding_idx + 1``. ``"split"``, the earlier name of ``"half"``, is accepted with a
    ``FutureWarning``.

    Parameters
    ----------
    positions : int or array
        An int ``n`` means positions ``arange(n)``; an array (integer or float, any shape)
        gives the positions themselves. Float positions must be finite; on an accelerator
        that is not read back to be checked (a non-finite position gives NaN).
    dim : int
        Number of features, a positive even integer.
    base : float
        Wavelength base (10000 in the paper).
    layout : {"interleaved", "half"}
    xp, device, dtype
        Namespace, device and float dtype of the result when ``positions`` is an int
        (NumPy, float32 by default). For a position array they follow the array (a torch
        one on another device than a given ``device`` is a ``ValueError``); a float
        position array keeps its dtype unless ``dtype`` is given.

    Returns
    -------
    array of shape ``positions.shape + (dim,)``
        Angles are float64 quotients :math:`k / \text{base}^{2i/d}` (or an exact split
        reduction where float64 is missing), rounded once to the output dtype.

    Examples
    --------
    >>> import posenc as pe
    >>> p = pe.sinusoidal(3, 4)
    >>> p.shape, p.dtype
    ((3, 4), dtype('float32'))
    >>> p[1].astype('float64').round(3).tolist()
    [0.841, 0.54, 0.01, 1.0]
    """
    dim = check.even_dim("dim", dim)
    base = check.real("base", base, positive=True)
    layout = check.layout("layout", layout, LAYOUTS)
    check.allocatable("frequency table for dim", (dim // 2,), 128)
    if check.is_array(positions):
        xp, positions = argument_in("positions", positions, xp, device)
        device = device_of(positions)
        pos = check.positions("positions", positions, xp, finite=not (check.is_eager(positions) and on_accelerator(positions)))  # (as rope's)
        out_dtype = dtype if dtype is not None else (pos.dtype if is_real_floating(xp, pos.dtype) else xp.float32)
        out_dtype = result_dtype(xp, out_dtype, device)
        check.allocatable("sinusoidal", (*pos.shape, dim), 8)
    else:
        xp = namespace(xp=xp)
        n = check.integer("positions", positions, minimum=0)
        out_dtype = check.creation_dtype("dtype", dtype, xp, device)
        check.allocatable("sinusoidal", (n, dim), 8)
        pos = xp.arange(n, device=device)
    if has_float64(xp, device):  # the paper's k / base**(2i/d), divided as Marian's and RoFormer's tables are: their bits
        angle = _quotients(xp, xp.astype(pos, xp.float64)[..., None], constant_on(xp, wavelengths(dim, base), xp.float64, device, "sinusoidal wavelengths"))
        cos, sin = xp.cos(angle), xp.sin(angle)
    else:
        cos, sin = cos_sin(pos, inverse_frequencies(dim, base), xp=xp, device=device)
    return _laid_out(xp, cos, sin, dim, layout, out_dtype)


def _quotients(xp, dividends, divisors):
    """``dividends / divisors``, each quotient rounded once. XLA turns a division by a
    broadcast operand into a product by its reciprocal (up to an ulp of the angle off: with
    x64, 10,231 of 33.5 million float32 entries of a table at positions ``10**6 .. 10**6 +
    2**18`` a step from NumPy's), so JAX divides by the divisors broadcast to the quotients'
    shape (and split as the dividends are) behind an optimization barrier."""
    if not _compat.is_jax_namespace(xp):
        return dividends / divisors
    import jax

    return dividends / jax.lax.optimization_barrier(xp.zeros_like(dividends) + divisors)


def _laid_out(xp, cos, sin, dim, layout, out_dtype):
    """The table of the undoubled ``cos`` and ``sin`` in ``layout``'s order, in ``out_dtype``."""
    shape = tuple(cos.shape[:-1])
    if layout == "interleaved":
        table = xp.reshape(xp.stack([sin, cos], axis=-1), (*shape, dim))
    else:
        table = xp.concat([sin, cos], axis=-1)
    return cast(xp, table, out_dtype)


def embedded(x, positions, offset, dim, *, base, layout):
    """The table an absolute module adds to ``x [..., seq, d]``: :func:`sinusoidal` at
    ``positions + offset`` (``rotary._args.embedded_positions``) in ``x``'s dtype; float
    positions keep the exact sum without float64 too (the offset carried into the angles)."""
    from ..rotary._args import embedded_positions

    positions, offset = embedded_positions(x, positions, offset, carry=True)
    if type(offset) is int and offset == 0:
        return sinusoidal(positions, dim, base=base, layout=layout, dtype=x.dtype)
    xp = namespace(x)  # (float positions and an offset without float64: the exact sum's angles)
    check.allocatable("sinusoidal", (*x.shape[:-1], dim), 8)
    cos, sin = cos_sin(positions, inverse_frequencies(dim, base), xp=xp, device=device_of(x), offset=offset)
    return _laid_out(xp, cos, sin, dim, layout, result_dtype(xp, x.dtype))
