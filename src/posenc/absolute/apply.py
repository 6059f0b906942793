"""Adding (or multiplying) an absolute position table into token features."""

from __future__ import annotations

from .. import _validate as check
from .._xp import cast, compute_dtype, device_of, host_constants, index_dtype, namespace

MODES = ("add", "multiply")


@host_constants
def apply_absolute(x, table, *, mode="add", offset=0):
    r"""Apply an absolute position table to ``x``.

    ``mode="add"``: :math:`x_s + P_{\text{offset}+s}` (BERT, GPT, Vaswani et al.);
    ``mode="multiply"``: :math:`x_s \odot P_{\text{offset}+s}` (the multiplicative
    variant). The sequence axis is ``-2``, ``L = x.shape[-2]``; ``offset`` shifts the
    rows taken (decoding with a cache of ``offset`` tokens).

    Parameters
    ----------
    x : array ``[..., L, d]``, real floating
    table : array ``[n, d]`` with ``n >= offset + L``
    mode : {"add", "multiply"}
    offset : int >= 0, or a 0-d integer array (a traced offset is not range-checked)

    Returns
    -------
    array like ``x`` (same dtype).

    Examples
    --------
    >>> import numpy as np, posenc as pe
    >>> x = np.zeros((2, 3, 4), dtype=np.float32)
    >>> bool((pe.apply_absolute(x, pe.sinusoidal(8, 4), offset=2)[0] == pe.sinusoidal(8, 4)[2:5]).all())
    True
    """
    xp = namespace(x, table)
    device_of(x, table)
    check.float_array("x", x, xp)
    check.float_array("table", table, xp)
    check.ndim("x", x, minimum=2)
    check.ndim("table", table, exactly=2)
    mode = check.choice("mode", mode, MODES)
    offset = check.integer_or_traced("offset", offset, minimum=0)
    length, dim = int(x.shape[-2]), int(x.shape[-1])
    if int(table.shape[1]) != dim:
        raise ValueError(f"table must have {dim} columns to match x.shape[-1], got shape {tuple(table.shape)}")
    if isinstance(offset, int):
        if int(table.shape[0]) < offset + length:
            raise ValueError(f"table has {table.shape[0]} rows, fewer than offset + L = {offset + length}")
        rows = table[offset : offset + length, :]
    else:
        rows = xp.take(table, xp.arange(length, dtype=index_dtype(xp, device_of(x)), device=device_of(x)) + offset, axis=0)
    work = compute_dtype(xp, x.dtype)
    rows = cast(xp, rows, work)
    xw = cast(xp, x, work)
    result = xw + rows if mode == "add" else xw * rows
    return cast(xp, result, x.dtype)
