"""Relative position indices."""

from __future__ import annotations

from .. import _validate as check
from .._xp import index_dtype, namespace


def relative_positions(q_len, k_len, *, offset=0, xp=None, device=None, dtype=None):
    r"""Signed relative positions ``rel[i, j] = (offset + i) - j``, shape ``[q_len, k_len]``.

    The sign convention of the whole library: query position minus key position, so a key
    in the past has ``rel > 0``. Query positions are ``offset + arange(q_len)``, key
    positions ``arange(k_len)``: decoding one new token against ``n`` keys (the cache and
    the new key) is ``q_len=1, k_len=n, offset=n - 1``.

    Parameters
    ----------
    q_len, k_len : int >= 0
    offset : int
    xp, device : namespace (NumPy by default) and device of the result
    dtype : integer dtype (default: the namespace's index dtype, ``int64`` where it has it)

    Examples
    --------
    >>> import posenc as pe
    >>> pe.relative_positions(2, 3, offset=1).tolist()
    [[1, 0, -1], [2, 1, 0]]
    """
    q_len = check.integer("q_len", q_len, minimum=0)
    k_len = check.integer("k_len", k_len, minimum=0)
    offset = check.integer("offset", offset)
    xp = namespace(xp=xp)
    dtype = index_dtype(xp, device) if dtype is None else dtype
    if not xp.isdtype(dtype, "integral"):
        raise TypeError(f"dtype must be an integer dtype, got {dtype!r}")
    check.allocatable("relative_positions", (q_len, k_len), 8)
    qpos = xp.arange(offset, offset + q_len, dtype=dtype, device=device)
    kpos = xp.arange(k_len, dtype=dtype, device=device)
    return qpos[:, None] - kpos[None, :]
