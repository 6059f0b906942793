r"""Multimodal RoPE (M-RoPE): frequency sections driven by different position axes.

Qwen2-VL (Wang et al., "Qwen2-VL: Enhancing Vision-Language Model's Perception of the World
at Any Resolution", 2024) gives every token three position ids (temporal, height, width;
all equal for text) and splits the ``r/2`` rotary frequencies into consecutive sections,
section ``s`` turning with position id ``s``. Its ``mrope_section`` lists the section
sizes, in frequency pairs.
"""

from __future__ import annotations

import numbers

from .. import _validate as check
from .apply import TableArguments


def _sections(sections, pairs):
    """``sections`` as a tuple of non-negative ints summing to ``pairs``."""
    if isinstance(sections, (str, bytes)) or not hasattr(sections, "__len__"):
        raise TypeError(f"sections must be a sequence of integers (mrope_section), got {type(sections).__name__}")
    if len(sections) == 0:
        raise ValueError("sections must not be empty")
    out = []
    for i, n in enumerate(sections):
        if isinstance(n, bool) or not isinstance(n, numbers.Integral):
            raise TypeError(f"sections[{i}] must be an integer, got {n!r}")
        if n < 0:
            raise ValueError(f"sections[{i}] must be >= 0, got {n}")
        out.append(int(n))
    if sum(out) != pairs:
        raise ValueError(
            f"sections must sum to the number of frequencies len(inv_freq) = rotary_dim / 2 = {pairs}, got {out} (sum {sum(out)})"
        )
    return tuple(out)


def mrope_cos_sin(positions, inv_freq, sections, *, layout="half", dtype=None, scale=1.0):
    r"""``cos`` and ``sin`` of multimodal RoPE: section ``s`` of the frequencies turns with ``positions[s]``.

    .. math:: c_{\dots,i} = \cos(p_{s(i),\dots}\,\theta_i), \quad s(i) = \text{the section holding pair } i

    duplicated in the layout's order like :func:`rope_cos_sin`. With Qwen2-VL's
    ``mrope_section`` (e.g. ``[16, 24, 24]`` for 128-wide heads) and its ``[3, batch, seq]``
    position ids this is the ``(cos, sin)`` of its rotary module; apply them with
    :func:`apply_rope`. When every axis holds the same ids (text), it equals
    :func:`rope_cos_sin`.

    Parameters
    ----------
    positions : integer or float array ``[len(sections), ...]``
    inv_freq : array or sequence ``[r/2]`` (as for :func:`rope_cos_sin`)
    sections : sequence of ints, summing to ``r/2``
    layout : {"half", "interleaved"}
    dtype : float dtype, optional (as for :func:`rope_cos_sin`)
    scale : float, multiplies both tables (the attention scale)

    Returns
    -------
    cos, sin : arrays ``positions.shape[1:] + (r,)``; angles in float64 (or the exact
    split reduction where the namespace has no float64).

    Examples
    --------
    >>> import numpy as np, posenc as pe
    >>> ids = np.array([[2], [5], [7]])                  # temporal, height, width of one token
    >>> cos, sin = pe.mrope_cos_sin(ids, [1.0, 0.5, 0.25], [1, 1, 1])
    >>> bool(np.allclose(cos[0, :3], np.cos([2 * 1.0, 5 * 0.5, 7 * 0.25])))
    True
    >>> cos.shape
    (1, 6)
    """
    args = TableArguments(positions, inv_freq, layout, dtype, scale)
    sections = _sections(sections, args.pairs)
    check.ndim("positions", positions, minimum=1)
    if int(positions.shape[0]) != len(sections):
        raise ValueError(
            f"positions must have one row per section on axis 0 ({len(sections)}), got shape {tuple(positions.shape)}"
        )
    check.allocatable_unless_blocked("mrope_cos_sin", (*positions.shape[1:], 2 * args.pairs), 8, positions)
    cos_parts, sin_parts = [], []
    start = 0
    for axis, size in enumerate(sections):
        if size:
            c, s = args.cos_sin(positions[axis, ...], args.freqs[start : start + size])
            cos_parts.append(c)
            sin_parts.append(s)
        start += size
    return args.tables(args.xp.concat(cos_parts, axis=-1), args.xp.concat(sin_parts, axis=-1))
