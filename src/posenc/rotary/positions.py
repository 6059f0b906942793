"""Per-token positions for padded and packed batches (inputs of ``rope`` and the biases)."""

from __future__ import annotations

import numpy as np

from .. import _compat
from .. import _validate as check
from .._xp import device_of, index_dtype, namespace, resplit, searched, size, unsplit, without_empty_chunks


def positions_from_mask(mask, *, start=0):
    """Positions of the tokens of a padding mask; padding gets position 0.

    ``positions = start + cumsum(mask) - 1`` on tokens and 0 on padding, along the last
    axis, so left- and right-padded rows both number their tokens ``start, start + 1,
    ...`` (fairseq's ``make_positions``, BLOOM's and Hugging Face ``generate``'s cumsum).

    Parameters
    ----------
    mask : array ``[..., seq]`` of bool or integers (non-zero = token)
    start : int
        Position of each row's first token.

    Returns
    -------
    integer array like ``mask`` (the namespace's index dtype).

    Examples
    --------
    >>> import numpy as np, posenc as pe
    >>> pe.positions_from_mask(np.array([[0, 0, 1, 1, 1], [1, 1, 1, 0, 0]])).tolist()
    [[0, 0, 0, 1, 2], [0, 1, 2, 0, 0]]
    """
    check.array("mask", mask)
    xp = namespace(mask)
    check.ndim("mask", mask, minimum=1)
    if not (mask.dtype == xp.bool or xp.isdtype(mask.dtype, "integral")):
        raise TypeError(f"mask must have a bool or integer dtype, got {mask.dtype}")
    start = check.integer("start", start)
    check.allocatable_unless_blocked("positions_from_mask", tuple(mask.shape), 8, mask)
    _, bits, low, high = check.index_bounds(xp, device_of(mask))
    n = size(mask.shape[-1])  # (a symbolic dimension of jax.export kept)
    if not check.within("start + the token positions", start - 1, start + n - 1, low, high, (n,)):
        raise ValueError(f"start + the positions of {n} tokens must stay within int{bits} ({low} .. {high}), got start={start}")
    itype = index_dtype(xp, device_of(mask))
    mask, split = unsplit(mask, -1)  # (a running count along the sequence)
    token = mask if mask.dtype == xp.bool else mask != 0
    count = xp.cumulative_sum(without_empty_chunks(xp.astype(token, itype)), axis=-1, dtype=itype)
    return resplit(xp.where(token, count - 1 + start, xp.zeros_like(count)), split)


def positions_from_cu_seqlens(cu_seqlens, total, *, check_traced=True):
    """Positions of a packed batch: they restart at 0 at every document boundary.

    ``cu_seqlens = [0, l0, l0 + l1, ..., total]`` (FlashAttention's varlen convention);
    token ``t`` of document ``k`` (``cu_seqlens[k] <= t < cu_seqlens[k+1]``) gets
    ``t - cu_seqlens[k]``. ``total`` is the static number of tokens (the result's
    length), so this also runs lazily and under ``jax.jit``.

    Parameters
    ----------
    cu_seqlens : integer array ``[n_docs + 1]``, non-decreasing, from 0 to ``total``
        (checked when its values can be read now; under ``jax.jit`` by a ``checkify``
        check, see ``check_traced``).
    total : int >= 0
    check_traced : bool
        A traced JAX ``cu_seqlens`` is checked with :func:`jax.experimental.checkify.check`:
        run the jitted function under ``checkify.checkify`` (``err.throw()`` raises a
        ``cu_seqlens`` that does not run from 0 to ``total``). Under a plain ``jax.jit`` the
        check cannot run and JAX refuses to compile it ("a checkify.check which was not
        functionalized", this function in the traceback). The ways out: ``cu_seqlens`` as
        a static argument (``static_argnums``) or a NumPy array, checked now, or
        ``check_traced=False``, which leaves it unchecked (the tokens past
        ``cu_seqlens[-1]`` then count as one more document). A lazy Dask one is checked
        when the result is computed; ``torch.compile`` values are not checked.

    Returns
    -------
    integer array ``[total]`` (the namespace of ``cu_seqlens``).

    Examples
    --------
    >>> import numpy as np, posenc as pe
    >>> pe.positions_from_cu_seqlens(np.array([0, 3, 5, 9]), 9).tolist()
    [0, 1, 2, 0, 1, 0, 1, 2, 3]
    """
    check.array("cu_seqlens", cu_seqlens)
    xp = namespace(cu_seqlens)
    check.integer_array("cu_seqlens", cu_seqlens, xp)
    check.ndim("cu_seqlens", cu_seqlens, exactly=1)
    if cu_seqlens.shape[0] < 1:
        raise ValueError("cu_seqlens must hold at least one boundary (0)")
    total = check.integer("total", total, minimum=0)
    check.allocatable_unless_blocked("positions_from_cu_seqlens", (total,), 8, cu_seqlens)
    if not isinstance(check_traced, bool):
        raise TypeError(f"check_traced must be True or False, got {check_traced!r}")
    if check.concrete_jax(cu_seqlens) and not check.is_eager(cu_seqlens):  # closed over by a jitted function: read now
        _from_zero_to(np.asarray(cu_seqlens), total=total)
    elif check_traced and _compat.is_jax_array(cu_seqlens) and not check.is_eager(cu_seqlens):
        _checkify_total(xp, cu_seqlens, total)
    device = device_of(cu_seqlens)
    itype = index_dtype(xp, device)
    cu = check.widened("cu_seqlens", cu_seqlens, xp, device)  # (torch has no >= of its uint16 .. uint64)
    cu, _ = unsplit(cu, 0)  # (a few integers, read at each token's document)
    if check.is_eager(cu_seqlens):  # (read in the widened copy: under jax.jit a closed-over one's copy is traced, and refuses to be read)
        _from_zero_to(cu, total=total)
    elif _compat.is_dask_array(cu):  # (checked when computed, whole: a few integers, non-decreasing across its blocks)
        cu = cu.rechunk(-1).map_blocks(_from_zero_to, total=total, dtype=cu.dtype)
    tokens = xp.arange(total, dtype=itype, device=device)
    document = searched(xp, cu, tokens) - 1
    return tokens - xp.take(cu, document, axis=0)


def _from_zero_to(cu, *, total):
    """``cu`` (boundaries read now) must be non-decreasing from 0 to ``total`` (``ValueError``)."""
    first, last = int(cu[0]), int(cu[-1])
    if first != 0 or last != total or not bool(namespace(cu).all(cu[1:] >= cu[:-1])):
        raise ValueError(f"cu_seqlens must be non-decreasing from 0 to total = {total}, got values from {first} to {last}")
    return cu


def _checkify_total(xp, cu_seqlens, total):
    """``cu_seqlens`` from 0 to ``total``, non-decreasing, as a ``checkify`` check of a traced
    value: under a plain ``jax.jit`` its lowering refuses the call ("a checkify.check which
    was not functionalized"), with this function in the traceback."""
    from jax.experimental import checkify

    valid = (cu_seqlens[0] == 0) & (cu_seqlens[-1] == total) & xp.all(cu_seqlens[1:] >= cu_seqlens[:-1])
    checkify.check(
        valid,
        "positions_from_cu_seqlens: cu_seqlens must be non-decreasing from 0 to total = {total}, got values from "
        "{first} to {last}",
        total=xp.asarray(total), first=cu_seqlens[0], last=cu_seqlens[-1],
    )  # fmt: skip
