"""The 2-D sin-cos position table of ViT/MAE (Dosovitskiy et al., 2021; He et al., 2022)."""

from __future__ import annotations

import numpy as np

from .. import _validate as check
from .._xp import cast, cos_sin, index_dtype, namespace, result_dtype, trace_constant


@trace_constant
def mae_frequencies(quarter: int, base: float) -> tuple:
    """Host float64 ``1 / base**(k / quarter)`` for ``k < quarter``, NumPy's ``power`` as MAE's
    ``get_1d_sincos_pos_embed_from_grid`` computes them (``base**(-k / quarter)``, Python's
    ``pow``, differs from it by an ulp in some)."""
    return tuple((1.0 / np.power(base, np.arange(quarter, dtype=np.float64) / quarter)).tolist())


def sincos_2d(grid_h, grid_w, dim, *, base=10000.0, cls_token=False, xp=None, device=None, dtype=None):
    r"""2-D sin-cos table ``[grid_h * grid_w, dim]`` for a grid of image patches.

    Half the channels encode the column ``w``, half the row ``h``, each with the 1-D
    table whose sines fill the first half and cosines the second:

    .. math::

        p_{(h, w)} = \bigl[\sin(w\,\omega),\ \cos(w\,\omega),\ \sin(h\,\omega),\ \cos(h\,\omega)\bigr],
        \qquad \omega_k = \text{base}^{-k/(d/4)},\ k = 0..d/4 - 1

    Row ``h * grid_w + w`` belongs to patch ``(h, w)`` (row-major, as the patches are
    flattened). This is MAE's ``get_2d_sincos_pos_embed`` (He et al., "Masked Autoencoders
    Are Scalable Vision Learners", 2022; the fixed 2-D table of ViT's ablations, also
    used by DiT and I-JEPA), whose first half holds the column coordinate. ``cls_token=True``
    puts a row of zeros first, as MAE does for its class token.

    Parameters
    ----------
    grid_h, grid_w : int >= 1, the patch grid
    dim : int, a positive multiple of 4
    base : float > 0
    cls_token : bool
    xp, device, dtype : namespace (NumPy), device and float dtype (float32) of the result

    Returns
    -------
    array ``[grid_h * grid_w (+ 1), dim]``; angles in float64 (MAE's: its frequencies and
    products, bit for bit), rounded once.

    Examples
    --------
    >>> import posenc as pe
    >>> t = pe.sincos_2d(2, 3, 8)
    >>> t.shape
    (6, 8)
    >>> t[5].astype("float64").round(3).tolist()  # patch (h=1, w=2)
    [0.909, 0.02, -0.416, 1.0, 0.841, 0.01, 0.54, 1.0]
    """
    grid_h = check.integer("grid_h", grid_h, minimum=1)
    grid_w = check.integer("grid_w", grid_w, minimum=1)
    dim = check.integer("dim", dim, minimum=1)
    if dim % 4:
        raise ValueError(f"dim must be a positive multiple of 4 (sin and cos for each of two axes), got {dim}")
    base = check.real("base", base, positive=True)
    if not isinstance(cls_token, bool):
        raise TypeError(f"cls_token must be True or False, got {cls_token!r}")
    xp = namespace(xp=xp)
    dtype = result_dtype(xp, dtype, device)
    check.allocatable("sincos_2d", (grid_h * grid_w + 1, dim), 8)
    quarter = dim // 4
    freqs = mae_frequencies(quarter, base)
    cell = xp.arange(grid_h * grid_w, dtype=index_dtype(xp, device), device=device)
    halves = []
    for coordinate in (cell % grid_w, cell // grid_w):
        cos, sin = cos_sin(coordinate, freqs, xp=xp, device=device)
        halves += [sin, cos]
    table = cast(xp, xp.concat(halves, axis=-1), dtype)
    if cls_token:
        table = xp.concat([xp.zeros((1, dim), dtype=dtype, device=device), table], axis=0)
    return table
