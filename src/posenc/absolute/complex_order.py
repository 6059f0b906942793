"""Complex-order embeddings (Wang et al., ICLR 2020)."""

from __future__ import annotations

from .. import _validate as check
from .._xp import broadcast_shapes, cast, compute_dtype, cos_sin_of_array, device_of, has_float64, host_constants, namespace


@host_constants
def complex_order(amplitude, frequency, phase, positions):
    r"""Complex-valued word embedding with continuous word order.

    .. math:: f(j, \text{pos}) = r_j\, e^{\,i(\omega_j \text{pos} + \theta_j)}

    (Wang et al., "Encoding word order in complex embeddings", ICLR 2020). Amplitude
    :math:`r`, frequency :math:`\omega` and phase :math:`\theta` are ``[..., dim]``
    (shared across tokens or per token); ``positions`` have no feature axis and broadcast
    against ``amplitude.shape[:-1]``. The phase is computed in float64 where available.

    Returns
    -------
    complex array ``[..., dim]``: complex64 for float32/16-bit inputs, complex128 for
    float64.

    Examples
    --------
    >>> import numpy as np, posenc as pe
    >>> z = pe.complex_order(np.ones(2), np.array([1.0, 0.5]), np.zeros(2), np.arange(3))
    >>> z.shape, z.dtype
    ((3, 2), dtype('complex128'))
    >>> bool(np.allclose(z[2], np.exp(1j * np.array([2.0, 1.0]))))
    True
    """
    check.arrays(amplitude=amplitude, frequency=frequency, phase=phase, positions=positions)
    xp = namespace(amplitude, frequency, phase, positions)
    device = device_of(amplitude, frequency, phase, positions)
    for name, a in (("amplitude", amplitude), ("frequency", frequency), ("phase", phase)):
        check.float_array(name, a, xp)
        check.ndim(name, a, minimum=1)
    positions = check.positions("positions", positions, xp)
    try:
        shape = broadcast_shapes(tuple(amplitude.shape), tuple(frequency.shape), tuple(phase.shape))
    except ValueError as exc:
        raise ValueError(
            f"amplitude {tuple(amplitude.shape)}, frequency {tuple(frequency.shape)} and phase "
            f"{tuple(phase.shape)} do not broadcast together"
        ) from exc
    try:
        full = broadcast_shapes(tuple(positions.shape) + (1,), shape)
    except ValueError as exc:
        raise ValueError(f"positions of shape {tuple(positions.shape)} do not broadcast against {shape[:-1]}") from exc
    check.allocatable_unless_blocked("complex_order", full, 16, amplitude)
    float64 = has_float64(xp, device)
    wide = float64 and any(compute_dtype(xp, a.dtype) == xp.float64 for a in (amplitude, frequency, phase))  # (>f8 too)
    real_dtype = xp.float64 if wide else xp.float32
    if float64:
        work = xp.float64
        angle = cast(xp, frequency, work) * cast(xp, positions, work)[..., None] + cast(xp, phase, work)
        cos, sin = xp.cos(angle), xp.sin(angle)
    else:  # the phase turns an exactly reduced w * p (cos_sin_of_array): a float32 product
        # was off by |w p| * 2**-24 (5e-3 at position 123,457 with w = 3)
        work = xp.float32
        c, s = cos_sin_of_array(positions, frequency, xp=xp, device=device)
        pc, ps = xp.cos(cast(xp, phase, work)), xp.sin(cast(xp, phase, work))
        cos, sin = c * pc - s * ps, s * pc + c * ps
    r = cast(xp, amplitude, work)
    re = cast(xp, r * cos, real_dtype)
    im = cast(xp, r * sin, real_dtype)
    cdtype = xp.complex128 if wide else xp.complex64
    z = cast(xp, re, cdtype) + cast(xp, im, cdtype) * 1j
    return xp.broadcast_to(z, full) if tuple(z.shape) != tuple(full) else z
