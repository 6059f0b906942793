"""RoPE frequencies, optionally rescaled for a longer context."""

from __future__ import annotations

import numpy as np

from .. import _validate as check
from .._xp import device_of, namespace, result_dtype, widest_float
from .scaling import check_scaling, check_seq_len, frequency_table


def rope_frequencies(dim, *, base=10000.0, scaling=None, seq_len=None, xp=None, device=None, dtype=None):
    r"""RoPE's inverse frequencies and attention scale.

    .. math:: \theta_i = \text{base}^{-2i/d}, \quad i = 0, \dots, d/2 - 1

    (Su et al., "RoFormer: Enhanced Transformer with Rotary Position Embedding", 2021),
    then modified by ``scaling`` (see :mod:`posenc.scaling`). Pair ``i`` of a token at
    position ``m`` is rotated by the angle :math:`m\,\theta_i`.

    Parameters
    ----------
    dim : int
        Rotary dimension (the number of rotated channels), a positive even integer.
    base : float
        ``rope_theta``: 10000 in the paper, 500000 in Llama 3.
    scaling : posenc.scaling object, optional
        Context extension: ``Linear``, ``NTK``, ``DynamicNTK``, ``YaRN``, ``LongRoPE``,
        ``Llama3``.
    seq_len : int or 0-d integer array, optional
        The current sequence length, read by ``DynamicNTK`` (base grows beyond the original
        length) and ``LongRoPE`` (long factors beyond it). ``None``: the original length.
        A traced value (``jax.jit``, ``torch.compile``) gives ``inv_freq`` as an array of
        its namespace, computed from it.
    xp, device, dtype
        Namespace, device and dtype of ``inv_freq``. By default a float64 NumPy array; with
        only ``xp`` given, the namespace's widest float.

    Returns
    -------
    inv_freq : array ``[dim/2]``
    attention_scale : float
        Multiplies ``cos`` and ``sin`` (YaRN's temperature, LongRoPE's factor; 1 otherwise).

    Examples
    --------
    >>> import posenc as pe
    >>> inv_freq, scale = pe.rope_frequencies(8)
    >>> inv_freq.tolist(), scale
    ([1.0, 0.1, 0.01, 0.001], 1.0)
    >>> pe.rope_frequencies(8, scaling=pe.scaling.Linear(4.0))[0].tolist()
    [0.25, 0.025, 0.0025, 0.00025]
    """
    dim = check.even_dim("dim", dim)
    base = check.real("base", base, positive=True)
    check_scaling(scaling)
    seq_len = check_seq_len(seq_len)
    if check.is_array(seq_len):
        if scaling is None or not scaling.uses_seq_len:
            seq_len = None
        else:
            xp = namespace(seq_len, xp=xp)
            device = device if device is not None else device_of(seq_len)
            inv_freq, attention_scale = scaling.traced_frequencies(xp, dim, base, seq_len, device)
            return (inv_freq if dtype is None else xp.astype(inv_freq, result_dtype(xp, dtype))), float(attention_scale)
    inv_freq, attention_scale = frequency_table(scaling, dim, base, seq_len)
    if xp is None and device is None and dtype is None:
        return np.asarray(inv_freq), float(attention_scale)
    xp = namespace(xp=xp)
    dtype = widest_float(xp, device) if dtype is None else result_dtype(xp, dtype)
    return xp.asarray(inv_freq, dtype=dtype, device=device), float(attention_scale)
