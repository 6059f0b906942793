"""Learned absolute tables and their hierarchical extension."""

from __future__ import annotations

from .. import _validate as check
from .._xp import cast, compute_dtype, device_of, namespace, unsplit


def hierarchical_extend(table, length, *, alpha=0.4):
    r"""Extend a learned position table ``[n, d]`` to ``length <= n*n`` rows.

    Hierarchical decomposition (Su, "Hierarchically decomposed position encoding", 2020):
    with :math:`u = (T - \alpha T_0) / (1 - \alpha)`, row :math:`p` of the extended table
    is :math:`\alpha\, u_{\lfloor p / n \rfloor} + (1 - \alpha)\, u_{p \bmod n}`. The first
    ``n`` rows equal ``table`` exactly, so a model keeps its trained positions and gains ``n*n``.

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
    t = cast(xp, table, compute_dtype(xp, table.dtype))
    u = (t - alpha * t[0:1, :]) / (1.0 - alpha)
    p = xp.arange(length, device=device)
    rows = alpha * xp.take(u, p // n, axis=0) + (1.0 - alpha) * xp.take(u, p % n, axis=0)
    # The formula gives table[p] for p < n; take those rows as they are, bit for bit.
    rows = xp.where((p < n)[:, None], xp.take(t, p % n, axis=0), rows)
    return cast(xp, rows, table.dtype)
