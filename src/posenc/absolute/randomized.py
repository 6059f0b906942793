"""Randomised positional encodings (Ruoss et al., ACL 2023)."""

from __future__ import annotations

import numpy as np

from .. import _validate as check
from .._xp import integer_result_dtype, namespace


def randomized_positions(length, max_length, *, rng, batch=None, xp=None, device=None, dtype=None):
    r"""A sorted random subset of ``range(max_length)`` of size ``length``.

    Ruoss et al., "Randomized Positional Encodings Boost Length Generalization of
    Transformers" (ACL 2023): during training, the positions of a sequence of ``n`` tokens
    are an ordered sample of ``n`` distinct integers from ``[0, M)`` with ``M`` much larger
    than the training length (the longest test length); at test time too. Any encoding's
    ``positions`` can take them (``rope(x, positions)``, ``sinusoidal(positions, d)``, ...):
    the model sees every position up to ``M`` during training, and only orders matter.

    Parameters
    ----------
    length : int >= 0, the number of tokens ``n``
    max_length : int >= length, the range ``M`` (at most ``2**31`` where positions are int32: JAX without x64)
    rng : numpy.random.Generator or int (a seed): the draws are made on the host with
        ``rng.choice(max_length, length, replace=False)``, so a seed gives the same
        positions in every namespace
    batch : int >= 1 or None: one independent sample per row, ``[batch, length]``
    xp, device : namespace (NumPy) and device of the result
    dtype : integer dtype of the result (default: the namespace's index dtype, ``int64``
        where it has it); it must hold ``max_length - 1`` (``ValueError`` otherwise)

    Returns
    -------
    integer array ``[length]`` (or ``[batch, length]``), strictly increasing along the last axis.

    Examples
    --------
    >>> import posenc as pe
    >>> p = pe.randomized_positions(4, 16, rng=0)
    >>> p.shape, bool((p[1:] > p[:-1]).all()), bool((p >= 0).all() and (p < 16).all())
    ((4,), True, True)
    """
    length = check.integer("length", length, minimum=0)
    max_length = check.integer("max_length", max_length, minimum=0)
    if max_length < length:
        raise ValueError(f"max_length must be >= length = {length}, got {max_length}")
    if batch is not None:
        batch = check.integer("batch", batch, minimum=1)
    check.allocatable("randomized_positions", (batch or 1, length), 8)
    if isinstance(rng, (int, np.integer)) and not isinstance(rng, bool):
        rng = np.random.default_rng(int(rng))
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator or an int seed, got {type(rng).__name__}")
    xp = namespace(xp=xp)
    dtype = integer_result_dtype(xp, dtype, device)
    high = int(xp.iinfo(dtype).max)
    if max_length - 1 > high:  # a draw would not fit the dtype (the index dtype int32: JAX without x64)
        raise ValueError(f"max_length must be at most {high + 1} here: positions are {getattr(dtype, '__name__', dtype)} in {xp.__name__} on this device, got {max_length}")
    rows = [np.sort(rng.choice(max_length, size=length, replace=False)) for _ in range(batch or 1)]
    values = np.stack(rows) if batch is not None else rows[0]
    return xp.asarray(values.astype(np.int64), dtype=dtype, device=device)
