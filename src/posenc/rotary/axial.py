"""Axial (2-D / N-D) RoPE for image and video tokens."""

from __future__ import annotations

import numpy as np

from .. import _dispatch
from .. import _validate as check
from .._xp import device_of, host_as, host_constants, namespace, resplit, result_dtype, trace_constant, unsplit, widest_float
from . import _args
from ._rotate import _write
from .scaling import frequency_table


def _axes_dims(axes_dims, n_axes, width):
    if axes_dims is None:
        per_axis = (width // n_axes) // 2 * 2
        if per_axis == 0:
            raise ValueError(f"x.shape[-1] = {width} is too small to give {n_axes} axes an even number (>= 2) of channels")
        return (per_axis,) * n_axes
    if isinstance(axes_dims, (str, bytes)) or not hasattr(axes_dims, "__len__"):
        raise TypeError(f"axes_dims must be a sequence of positive even integers, got {type(axes_dims).__name__}")
    dims = tuple(check.even_dim(f"axes_dims[{i}]", d) for i, d in enumerate(axes_dims))
    if len(dims) != n_axes:
        raise ValueError(f"axes_dims must have one entry per axis of grid (grid.shape[-1] = {n_axes}), got {len(dims)}")
    if sum(dims) > width:
        raise ValueError(f"axes_dims must sum to at most x.shape[-1] = {width}, got {dims} (sum {sum(dims)})")
    return dims


FREQUENCIES = ("lang", "pixel")


def axial_frequencies(dim, *, frequencies="lang", base=10000.0, max_freq=10.0, xp=None, device=None, dtype=None):
    r"""The inverse frequencies of one axis block of :func:`axial_rope`: ``[dim / 2]``.

    ``"lang"``: :math:`\theta_i = \text{base}^{-2i/\text{dim}}` (RoPE's). ``"pixel"``:
    :math:`\theta_i = \pi \cdot \mathrm{linspace}(1, \text{max\_freq}/2, \text{dim}/2)_i`,
    the frequencies rotary-embedding-torch uses for images (``freqs_for="pixel"``), meant for
    coordinates normalised to ``[-1, 1]`` (e.g. ``linspace(-1, 1, H)``), so the same table
    serves any resolution.

    Parameters
    ----------
    dim : int, positive and even
        The block's channels.
    frequencies : {"lang", "pixel"}
    base : float > 0 (``"lang"``)
    max_freq : float > 0 (``"pixel"``)
    xp, device, dtype
        As for :func:`rope_frequencies`: a float64 NumPy array by default; with only ``xp``
        given, the namespace's widest float.

    Examples
    --------
    >>> import numpy as np, posenc as pe
    >>> (pe.axial_frequencies(6, frequencies="pixel", max_freq=10.0) / np.pi).tolist()
    [1.0, 3.0, 5.0]
    """
    dim = check.even_dim("dim", dim)
    check.allocatable("axial_frequencies", (dim // 2,), 128)  # (a tuple of Python floats on the way)
    table = _block_frequencies(dim, frequencies, base, max_freq)
    if xp is None and device is None and dtype is None:
        return np.asarray(table)
    xp = namespace(xp=xp)
    dtype = widest_float(xp, device) if dtype is None else result_dtype(xp, dtype, device)
    return host_as(xp, table, dtype, device)


def _block_frequencies(dim, frequencies, base, max_freq):
    """float64 frequencies of a validated ``dim``, a tuple of Python floats (a constant of a
    ``torch.compile`` graph)."""
    frequencies = check.choice("frequencies", frequencies, FREQUENCIES)
    if frequencies == "lang":
        return frequency_table(None, dim, check.real("base", base, positive=True), None)[0]
    return _pixel_frequencies(dim, check.real("max_freq", max_freq, positive=True))


@trace_constant
def _pixel_frequencies(dim, max_freq):
    return tuple((np.linspace(1.0, max_freq / 2, dim // 2) * np.pi).tolist())


def _coordinates(values, shape):
    """One axis of the grid, ``values``, placed against the token axes ``shape`` (see
    :func:`axial_rope`'s ``grid``); ``ValueError`` where it fits neither way, or both ways
    with different meanings."""
    try:
        placed = _args.place("grid[..., a]", values, shape, len(shape) - 1)
    except ValueError:  # not as positions: the trailing axes, or the broadcast's error
        check.broadcast_shape("grid[..., a]", values.shape, shape)
        return values
    trailing = (1,) * (len(shape) - values.ndim) + tuple(values.shape)
    if tuple(placed.shape) != trailing and all(v == 1 or v == s for v, s in zip(trailing, shape)):
        raise ValueError(
            f"grid[..., a] of shape {tuple(values.shape)} could hold one grid per batch row of x (token axes {shape}) or "
            f"broadcast against its trailing token axes: give it one axis per token axis of x (grid[:, None] for one per "
            f"batch row, grid[None] for the trailing axes)"
        )
    return placed


@host_constants
def axial_rope(
    x, grid, *, base=10000.0, axes_dims=None, layout="half", frequencies="lang", max_freq=10.0, inverse=False, out=None
):
    r"""Axial RoPE: each axis of a token grid rotates its own block of channels.

    A token at integer (or float) coordinates :math:`(p_0, \dots, p_{A-1})` has its
    channels split into consecutive blocks of ``axes_dims[a]`` channels; block ``a`` is a
    1-D RoPE (:func:`rope`) of dimension ``axes_dims[a]`` at position :math:`p_a`, with
    frequencies :math:`\text{base}^{-2i/\text{axes\_dims}[a]}`. Channels after the last
    block pass through. The score of two tokens then depends only on their coordinate
    differences, axis by axis (relative in 2-D for images, 3-D for video: the layout of
    FLUX / EVA-style axial RoPE; Heo et al., "Rotary Position Embedding for Vision
    Transformer", 2024). ``frequencies="pixel"`` takes the frequencies of
    :func:`axial_frequencies` instead, for coordinates in ``[-1, 1]`` (rotary-embedding-torch's
    ``freqs_for="pixel"``, whose axial tables give each axis the same block width).

    Parameters
    ----------
    x : array ``[..., d]``, real floating (e.g. ``[batch, heads, H*W, d]``)
    grid : array ``[..., A]``
        Coordinates of each token (e.g. ``[H*W, 2]`` rows and columns). ``grid[..., a]``
        is placed as :func:`rope`'s positions are, its last axis along the sequence (axis
        -2 of ``x``) and its leading axes on ``x``'s leading (batch) axes (a grid per
        image ``[batch, H*W, A]`` for ``x [batch, heads, H*W, d]``), or broadcast against
        ``x``'s trailing token axes (``[H, W, A]`` for ``x [batch, H, W, d]``), whichever
        fits; where both fit and differ (``batch == heads`` above) it is a ``ValueError``:
        give it one axis per token axis of ``x`` (``grid[:, None]``: per batch row).
    base : float
    axes_dims : sequence of A positive even ints, optional
        Channels per axis; default ``d // A`` rounded down to even for every axis.
    layout : {"half", "interleaved"}
        Pairing inside each block, as in :func:`apply_rope`.
    frequencies : {"lang", "pixel"}
        The frequencies of each block (:func:`axial_frequencies`); ``base`` applies to
        ``"lang"``, ``max_freq`` to ``"pixel"``.
    max_freq : float > 0
    inverse : bool
        Rotate by ``-angle`` (undo).
    out : array like ``x``, optional

    Returns
    -------
    array like ``x``.

    Examples
    --------
    >>> import numpy as np, posenc as pe
    >>> rows, cols = np.meshgrid(np.arange(2), np.arange(3), indexing="ij")
    >>> grid = np.stack([rows.ravel(), cols.ravel()], axis=-1)      # [6 tokens, 2 axes]
    >>> x = np.ones((6, 8))
    >>> y = pe.axial_rope(x, grid)                                     # 4 channels per axis
    >>> bool(np.allclose(y[:, :4], pe.rope(x[:, :4], grid[:, 0])))
    True
    >>> unit = np.linspace(-1, 1, 3)[np.stack([rows.ravel(), cols.ravel()], axis=-1)]   # coordinates in [-1, 1]
    >>> pe.axial_rope(x, unit, frequencies="pixel").shape
    (6, 8)
    """
    check.array("x", x)
    check.array("grid", grid)
    xp = namespace(x, grid)
    device_of(x, grid)
    check.float_array("x", x, xp)
    check.ndim("x", x, minimum=1)
    check.array("grid", grid)
    check.ndim("grid", grid, minimum=1)
    n_axes = check.static_int(grid.shape[-1])
    if n_axes < 1:
        raise ValueError(f"grid must have at least one axis of coordinates (grid.shape[-1] >= 1), got shape {tuple(grid.shape)}")
    grid, _ = unsplit(check.positions("grid", grid, xp), -1)  # (each axis's coordinates are a slice of the last axis)
    coordinates = [_coordinates(grid[..., a], tuple(x.shape[:-1])) for a in range(n_axes)]
    width = check.static_int(x.shape[-1])
    dims = _axes_dims(axes_dims, n_axes, width)
    tables = [_block_frequencies(d, frequencies, base, max_freq) for d in dims]
    layout = _args.layout("layout", layout)
    check.flag("inverse", inverse)
    _args.out_like(out, x, xp)
    x, split = unsplit(x, -1)  # (the blocks are slices of the channels)
    blocks, start = [], 0
    for a, (d, inv_freq) in enumerate(zip(dims, tables)):
        block = x[..., start : start + d]
        blocks.append(_dispatch.call("rope_rotate", block, coordinates[a], inv_freq, layout=layout, inverse=inverse))
        start += d
    if start < width:
        blocks.append(x[..., start:])
    result = xp.concat(blocks, axis=-1) if len(blocks) > 1 else blocks[0]
    return _write(xp, resplit(result, split), out)
