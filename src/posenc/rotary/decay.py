"""RoPE's long-range decay bound (RoFormer, section 3.4.3)."""

from __future__ import annotations

from .. import _validate as check
from .._xp import argument_in, cast, cos_sin, device_of, host_plain, is_real_floating, namespace, pairwise_sum, result_dtype
from .scaling import frequency_table


# the bytes per [..., dim / 2] entry at the peak: six float64 arrays of that shape live at once
# (cos, sin, their partial sums, their squares)
_PEAK_BYTES = 6 * 8


def rope_decay(distances, dim, *, base=10000.0, xp=None, device=None, dtype=None):
    r"""The upper bound of RoPE's attention score as a function of relative distance.

    With :math:`h_i = q_{[2i:2i+1]} k^*_{[2i:2i+1]}`, Abel summation bounds the rotated
    score by :math:`\max_i |h_{i+1} - h_i| \sum_j |S_j|` (Su et al., RoFormer, 2021), where

    .. math:: S_j = \sum_{i=0}^{j-1} e^{\,\mathrm{i}\,m\theta_i}, \qquad
              \text{decay}(m) = \frac{2}{d} \sum_{j=1}^{d/2} |S_j|

    and :math:`\theta_i = \text{base}^{-2i/d}`. At ``m = 0``, :math:`|S_j| = j` and the
    value is :math:`(d/2 + 1)/2`; it falls off (with oscillations) as ``|m|`` grows.

    Parameters
    ----------
    distances : int or array
        An int ``n`` means distances ``arange(n)``; an array gives the distances ``m``.
    dim : int
        Rotary dimension, positive and even.
    base : float
    xp, device, dtype
        Namespace, device and float dtype when ``distances`` is an int (NumPy, float32 by
        default); for an array they follow it (float arrays keep their dtype).

    Returns
    -------
    array ``distances.shape``. Angles in float64 (or the exact split reduction).

    Examples
    --------
    >>> import numpy as np, posenc as pe
    >>> pe.rope_decay(np.array([0.0, 10.0, 100.0]), 128).round(2).tolist()
    [32.5, 17.95, 10.23]
    """
    dim = check.even_dim("dim", dim)
    base = check.real("base", base, positive=True)
    if check.is_array(distances):
        xp, distances = argument_in("distances", distances, xp, device)
        device = device_of(distances)
        distances = host_plain(check.positions("distances", distances, xp))
        out_dtype = dtype if dtype is not None else (distances.dtype if is_real_floating(xp, distances.dtype) else xp.float32)
        out_dtype = result_dtype(xp, out_dtype, device)
        m = distances
    else:
        xp = namespace(xp=xp)
        n = check.integer("distances", distances, minimum=0)
        out_dtype = result_dtype(xp, dtype, device)
        check.allocatable("rope_decay", (n, dim // 2), _PEAK_BYTES)
        m = xp.arange(n, device=device)
    check.allocatable("rope_decay", (*m.shape, dim // 2), _PEAK_BYTES)
    c, s = cos_sin(m, frequency_table(None, dim, base, None)[0], xp=xp, device=device)
    partial_re = xp.cumulative_sum(c, axis=-1)
    partial_im = xp.cumulative_sum(s, axis=-1)
    bound = pairwise_sum(xp, xp.sqrt(partial_re**2 + partial_im**2)) * (2.0 / dim)
    return cast(xp, bound, out_dtype)
