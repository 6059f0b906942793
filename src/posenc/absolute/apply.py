"""Adding (or multiplying) an absolute position table into token features."""

from __future__ import annotations

from functools import partial

from .. import _validate as check
from .._xp import cast, compute_dtype, device_of, host_constants, index_dtype, namespace, unsplit
from ..rotary import _args

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
    offset : int >= 0, a 0-d integer array, or one per batch row (an integer array on the
        leading axes of ``x``, as :func:`rope`'s: each row's rows start at its own); a
        traced offset is not range-checked (under ``jax.jit`` a row outside the table,
        before it or past its end, is NaN)

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
    check.arrays(x=x, table=table)
    xp = namespace(x, table)
    device = device_of(x, table)
    check.float_array("x", x, xp)
    check.float_array("table", table, xp)
    check.ndim("x", x, minimum=2)
    check.ndim("table", table, exactly=2)
    mode = check.choice("mode", mode, MODES)
    offset = check.computed_on("offset", _args.per_row("offset", check.read_on_its_gpu("offset", offset, device), xp), device)
    length, dim = x.shape[-2], x.shape[-1]
    if table.shape[1] != dim:
        raise ValueError(f"table must have {dim} columns to match x.shape[-1], got shape {tuple(table.shape)}")
    table, _ = unsplit(table, 0)  # (its rows are sliced or taken)
    if isinstance(offset, int):
        if offset < 0:
            raise ValueError(f"offset must be a non-negative integer, got {offset}")
        if table.shape[0] < offset + length:
            raise ValueError(f"table has {table.shape[0]} rows, fewer than offset + L = {offset + length}")
        rows = table[offset : offset + length, :]
    else:
        if offset.ndim:  # per row: [..., 1] on x's leading axes, the sequence on axis -2
            offset = _args.place_rows("offset", offset, tuple(x.shape[:-1]), x.ndim - 2)
        offset = check.rows_within(offset, length=length, rows=table.shape[0], error=partial(_outside_table, rows=table.shape[0]))
        offset, _ = unsplit(offset, *range(offset.ndim))  # (a few integers: JAX takes no rows at split indices)
        index = xp.arange(length, dtype=index_dtype(xp, device_of(x)), device=device_of(x)) + offset
        if not check.is_eager(offset):  # unchecked: a negative row is past the end, not a row from it (JAX's take: NaN)
            index = xp.where(index < 0, table.shape[0], index)
        rows = xp.reshape(xp.take(table, xp.reshape(index, (-1,)), axis=0), (*index.shape, dim))
    check.allocatable_unless_blocked("apply_absolute", tuple(x.shape), 8, x)
    work = compute_dtype(xp, x.dtype)
    rows = cast(xp, rows, work)
    xw = cast(xp, x, work)
    result = xw + rows if mode == "add" else xw * rows
    return cast(xp, result, x.dtype)


def _outside_table(low, high, *, rows):
    """The message of offsets from ``low`` to ``high`` whose rows are not all rows of the table."""
    return f"offset must be >= 0 with offset + L <= {rows} (the table's rows) in every row, got {low} .. {high}"
