"""RoPE frequencies, optionally rescaled for a longer context."""

from __future__ import annotations

import numpy as np

from .. import _dispatch
from .. import _validate as check
from .._dispatch import reference
from .._xp import cast, device_of, host_as, namespace, result_dtype, torch_compiling, torch_namespace, widest_float
from . import _args
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
    seq_len : int, 0-d integer array, or integer array ``[batch...]``, optional
        The current sequence length, read by ``DynamicNTK`` (base grows beyond the original
        length) and ``LongRoPE`` (long factors beyond it). ``None``: the original length.
        A traced value (``jax.jit``, ``torch.compile``) gives ``inv_freq`` as an array of
        its namespace, computed from it; under ``torch.compile`` a CPU tensor, or an int
        (maybe a symbolic size) with ``xp=torch``, is read when the graph runs, giving the
        eager table. An array of one length per batch row gives one
        frequency set per row, ``inv_freq`` of shape ``seq_len.shape + (dim/2,)``, each row
        bit-identical to the call with that row's length. An eager array's values are read
        now, like an int's: its namespace does not set the result's (``xp=`` does).
    xp, device, dtype
        Namespace, device and dtype of ``inv_freq``. By default a float64 NumPy array; with
        only ``xp`` given, the namespace's widest float: float32 for JAX without x64, each
        frequency rounded once, so tables built from it are below the angle contract at long
        positions (docs: precision); ``rope_cos_sin`` and ``rope`` keep exact angles with the
        default float64 NumPy frequencies. A traced length without float64 returns float32
        frequencies too (the leading part of the double-float ones ``rope`` computes inside
        with a traced ``offset`` or ``seq_len``): tables built from them lose the angle
        contract past a few thousand positions; pass the length to ``rope`` instead.

    Returns
    -------
    inv_freq : array ``[dim/2]`` (``[batch..., dim/2]`` for a per-row ``seq_len``)
    attention_scale : float
        Multiplies ``cos`` and ``sin`` (YaRN's temperature, LongRoPE's factor; 1 otherwise),
        the same for every row: no scaling's attention scale depends on the length.

    Examples
    --------
    >>> import numpy as np, posenc as pe
    >>> inv_freq, scale = pe.rope_frequencies(8)
    >>> inv_freq.tolist(), scale
    ([1.0, 0.1, 0.01, 0.001], 1.0)
    >>> pe.rope_frequencies(8, scaling=pe.scaling.Linear(4.0))[0].tolist()
    [0.25, 0.025, 0.0025, 0.00025]
    >>> dynamic = pe.scaling.DynamicNTK(2.0, original_max_position=16)
    >>> pe.rope_frequencies(8, scaling=dynamic, seq_len=np.array([16, 40]))[0][:, :3].round(3).tolist()
    [[1.0, 0.1, 0.01], [1.0, 0.063, 0.004]]
    """
    dim = check.even_dim("dim", dim)
    check.allocatable("inv_freq", (dim // 2,), 8)
    base = check.real("base", base, positive=True)
    check_scaling(scaling)
    if check.is_array(seq_len) and seq_len.ndim > 0:
        return _per_row(dim, base, scaling, seq_len, xp, device, dtype)
    seq_len = check_seq_len(seq_len)
    uses = scaling is not None and scaling.uses_seq_len
    if uses and isinstance(seq_len, int) and torch_compiling() and torch_namespace(xp):
        seq_len = namespace(xp=xp).asarray(seq_len, device="cpu")  # maybe symbolic: read on the host when the graph runs
    if check.is_array(seq_len):
        if not uses:
            seq_len = None
        else:
            return _at_traced_length(dim, base, scaling, seq_len, xp, device, dtype)
    inv_freq, attention_scale = frequency_table(scaling, dim, base, seq_len)
    if xp is None and device is None and dtype is None:
        return np.asarray(inv_freq), float(attention_scale)
    xp = namespace(xp=xp)
    dtype = widest_float(xp, device) if dtype is None else result_dtype(xp, dtype, device)
    return host_as(xp, inv_freq, dtype, device), float(attention_scale)


def _per_row(dim, base, scaling, seq_len, xp, device, dtype):
    """``rope_frequencies`` of a ``seq_len`` array: ``[*seq_len.shape, dim/2]``, row by row the
    frequencies of that row's length (eagerly: the very table a single-row call reads; traced:
    the scaling's traced arithmetic on every row at once)."""
    own = namespace(seq_len)
    seq_len = _args.per_row("seq_len", seq_len, own)
    uses = scaling is not None and scaling.uses_seq_len
    if not check.is_eager(seq_len):
        if uses:
            return _at_traced_length(dim, base, scaling, seq_len, xp, device, dtype)
        xp = namespace(seq_len, xp=xp)
        device = device if device is not None else device_of(seq_len)
        table, attention_scale = frequency_table(scaling, dim, base, None)  # every row's frequencies are the same table
        inv_freq = xp.broadcast_to(xp.asarray(table, dtype=widest_float(xp, device), device=device), (*seq_len.shape, dim // 2))
        return (inv_freq if dtype is None else cast(xp, inv_freq, result_dtype(xp, dtype, device))), float(attention_scale)
    lengths = [int(n) for n in own.reshape(seq_len, (-1,))]
    rows = [frequency_table(scaling, dim, base, n if uses else None) for n in lengths]
    inv_freq = np.asarray([row for row, _ in rows], dtype=np.float64).reshape(*seq_len.shape, dim // 2)
    attention_scale = rows[0][1] if rows else frequency_table(scaling, dim, base, None)[1]
    if xp is None and device is None and dtype is None:
        return inv_freq, float(attention_scale)
    xp = namespace(xp=xp)
    dtype = widest_float(xp, device) if dtype is None else result_dtype(xp, dtype, device)
    return host_as(xp, inv_freq, dtype, device), float(attention_scale)


def _at_traced_length(dim, base, scaling, seq_len, xp, device, dtype):
    """``rope_frequencies`` of a length-dependent ``scaling`` at lengths that cannot be read now
    (0-d or per row): op ``rope_frequencies_at_length``, in ``seq_len``'s namespace."""
    xp = namespace(seq_len, xp=xp)
    device = device if device is not None else device_of(seq_len)
    inv_freq = _dispatch.call("rope_frequencies_at_length", seq_len, scaling=scaling, rotary_dim=dim, base=base, device=device)
    attention_scale = frequency_table(scaling, dim, base, None)[1]  # (no scaling's depends on the length)
    return (inv_freq if dtype is None else cast(xp, inv_freq, result_dtype(xp, dtype, device))), float(attention_scale)


@reference("rope_frequencies_at_length")
def frequencies_at_length(seq_len, *, scaling, rotary_dim, base, device=None):
    """The frequencies of the length-dependent ``scaling`` at lengths that cannot be read now
    (``[*seq_len.shape, rotary_dim/2]``, float64 where the namespace has it): computed from
    them in the namespace. A kernel reads them when it runs instead (torch's op on the CPU:
    the eager call's bits)."""
    xp = namespace(seq_len)
    lengths = seq_len[..., None] if seq_len.ndim else seq_len
    return scaling.traced_frequencies(xp, rotary_dim, base, lengths, device)[0]
