"""Learned absolute tables and their hierarchical extension."""

from __future__ import annotations

from .. import _validate as check
from .._xp import cast, device_of, namespace, unsplit, widest_float


def hierarchical_extend(table, length, *, alpha=0.4):
    r"""Extend a learned position table ``[n, d]`` to ``length <= n*n`` rows.

    Hierarchical decomposition (Su, "Hierarchically decomposed position encoding", 2020):
    with :math:`u = (T - \alpha T_0) / (1 - \alpha)`, row :math:`p` of the extended table
    is :math:`\alpha\, u_{\lfloor p / n \rfloor} + (1 - \alpha)\, u_{p \bmod n}`. The first
    ``n`` rows equal ``table`` exactly, so a model keeps its trained positions and gains ``n*n``.
    The others are computed as :math:`T_{p \bmod n} + \frac{\alpha}{1 - \alpha}(T_{\lfloor p/n
    \rfloor} - T_0)` (the same rows) in float64 where the namespace has it, and rounded once
    to the table's dtype.

    Parameters
    ----------
    table : array ``[n, d]``, real floating
    length : int, ``0 <= length <= n*n``
    alpha : float in ``[0, 1)``

    Examples
    --------
    >>> import numpy as np, posenc as pe
    >>> t = np.arange(6.0).reshape(3, 2)
    >>> e = pe.hierarchical_extend(t, 9, alpha=0.5)
    >>> bool(np.allclose(e[:3], t)), e.shape
    (True, (9, 2))
    """
    check.array("table", table)
    xp = namespace(table)
    check.float_array("table", table, xp)
    check.ndim("table", table, exactly=2)
    n = int(table.shape[0])
    length = check.integer("length", length, minimum=0)
    if length > n * n:
        raise ValueError(f"length must be <= n*n = {n * n} for a table of {n} rows, got {length}")
    alpha = check.real("alpha", alpha, minimum=0.0, below=1.0)
    if length and n == 0:
        raise ValueError("table must have at least one row to extend")
    check.allocatable_unless_blocked("hierarchical_extend", (length, table.shape[1]), 8, table)
    device = device_of(table)
    table, _ = unsplit(table, 0)  # (its rows are taken, each row from two others)
    # The formula as T[p % n] + alpha / (1 - alpha) * (T[p // n] - T[0]), in float64 where the
    # namespace has it, rounded once: no division for XLA to make a product by a reciprocal.
    t = cast(xp, table, widest_float(xp, device))
    p = xp.arange(length, device=device)
    low = xp.take(t, p % n, axis=0)
    rows = low + (alpha / (1.0 - alpha)) * (xp.take(t, p // n, axis=0) - t[0:1, :])
    rows = xp.where((p < n)[:, None], low, rows)  # (table[p] even where T[0] - T[0] is NaN: an infinite T[0])
    return cast(xp, rows, table.dtype)
