"""Convolutional (conditional) position encoding."""

from __future__ import annotations

from .. import _validate as check
from .._xp import cast, chunked_like, compute_dtype, device_of, explicit_sharding, host_constants, namespace, resplit, size, unsplit


@host_constants
def conv_positions(x, kernel):
    r"""Convolutional position encoding along the sequence axis (``-2``).

    .. math:: y_s = x_s + \sum_{t=0}^{w-1} K_t \odot x_{s + t - \lfloor w/2 \rfloor}

    a depthwise "same" cross-correlation with zero padding (as conv1d is defined in deep
    learning frameworks) added to the input, as in the conditional position encoding of
    Chu et al., "Conditional Positional Encodings for Vision Transformers" (2021) and the
    convolutional position embeddings of wav2vec 2.0.

    Parameters
    ----------
    x : array ``[..., S, dim]``, real floating
    kernel : array ``[width, dim]``, ``width`` odd

    Examples
    --------
    >>> import numpy as np, posenc as pe
    >>> x = np.eye(3)
    >>> pe.conv_positions(x, np.array([[1.0] * 3, [0.0] * 3, [2.0] * 3])).tolist()
    [[1.0, 2.0, 0.0], [1.0, 1.0, 2.0], [0.0, 1.0, 1.0]]
    """
    check.arrays(x=x, kernel=kernel)
    xp = namespace(x, kernel)
    device = device_of(x, kernel)
    check.float_array("x", x, xp)
    check.float_array("kernel", kernel, xp)
    check.ndim("x", x, minimum=2)
    check.ndim("kernel", kernel, exactly=2)
    width, dim = int(kernel.shape[0]), int(x.shape[-1])
    if width % 2 == 0:
        raise ValueError(f"kernel width (kernel.shape[0]) must be odd, got {width}")
    if int(kernel.shape[1]) != dim:
        raise ValueError(f"kernel must have {dim} columns to match x.shape[-1], got shape {tuple(kernel.shape)}")
    work = compute_dtype(xp, x.dtype)
    xw, split = unsplit(cast(xp, x, work), -2)
    kw = cast(xp, kernel, work)
    length, half = size(x.shape[-2]), width // 2  # (a symbolic dimension of jax.export kept)
    # (the zeros placed as xw is: a JAX array split over a mesh concatenates only with its like)
    pad = resplit(xp.zeros((*xw.shape[:-2], half, dim), dtype=work, device=device), explicit_sharding(xw))
    padded = xp.concat([pad, xw, pad], axis=-2)
    result = xw
    for t in range(width):
        result = result + kw[t, :] * chunked_like(padded[..., t : t + length, :], xw)
    return cast(xp, resplit(result, split), x.dtype)
