"""RoPE frequencies, optionally rescaled for a longer context."""

from __future__ import annotations

from .. import _validate as check
from .._xp import namespace, widest_float
from .scaling import check_scaling, check_seq_len, default_inv_freq


def host_frequencies(dim, base, scaling, seq_len):
    """Validated float64 NumPy ``inv_freq`` and the attention scale (no array namespace)."""
    if scaling is None:
        return default_inv_freq(dim, base), 1.0
    return scaling.frequencies(dim, base, seq_len)


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
    seq_len : int, optional
        The current sequence length, read by ``DynamicNTK`` (base grows beyond the original
        length) and ``LongRoPE`` (long factors beyond it). ``None``: the original length.
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
    inv_freq, attention_scale = host_frequencies(dim, base, scaling, seq_len)
    if xp is None and device is None and dtype is None:
        return inv_freq, float(attention_scale)
    xp = namespace(xp=xp)
    if dtype is None:
        dtype = widest_float(xp, device)
    elif not xp.isdtype(dtype, "real floating"):
        raise TypeError(f"dtype must be a real floating dtype, got {dtype!r}")
    return xp.asarray(inv_freq.tolist(), dtype=dtype, device=device), float(attention_scale)
