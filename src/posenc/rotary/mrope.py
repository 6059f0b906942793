r"""Multimodal RoPE (M-RoPE): frequency sections driven by different position axes.

Qwen2-VL (Wang et al., "Qwen2-VL: Enhancing Vision-Language Model's Perception of the World
at Any Resolution", 2024) gives every token three position ids (temporal, height, width;
all equal for text) and splits the ``r/2`` rotary frequencies into consecutive sections,
section ``s`` turning with position id ``s``. Its ``mrope_section`` lists the section
sizes, in frequency pairs. Qwen3-VL (and keras_hub's and vLLM's interleaved M-RoPE) deal
the pairs out in turn instead: pair ``i`` turns with axis ``i mod 3`` while that axis has
pairs left, the rest with the temporal axis.

HunyuanVL's XD-RoPE (``xdrope_section``) cuts the doubled table (each frequency twice,
LLaMA's half order) into consecutive chunks instead, so the two members of a pair may turn
with different axes: :func:`xdrope_cos_sin`.
"""

from __future__ import annotations

import numbers

from .. import _validate as check
from .._xp import constant_on, device_of, index_dtype, unsplit
from ._call import parse_tables, table_positions


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


def _axis_of_pairs(sections, interleaved, pairs):
    """The position axis each of ``pairs`` frequency pairs turns with.

    Consecutive sections (Qwen2-VL; they sum to ``pairs``), or Qwen3-VL's interleaving:
    pair ``i`` takes axis ``a = i mod A`` for ``a > 0`` while ``i < A * sections[a]``, else
    axis 0 (for any ``sections``, as transformers' strided slices deal them).
    """
    if not interleaved:
        return [axis for axis, size in enumerate(sections) for _ in range(size)]
    count = len(sections)
    return [a if a and i < count * sections[a] else 0 for i in range(pairs) for a in (i % count,)]


def _pick(xp, freqs, pairs):
    """The frequencies of ``pairs``: host numbers (a tuple) or an array (gathered where an
    explicit mesh splits it: JAX takes no elements of a split axis)."""
    if isinstance(freqs, tuple):
        return tuple(freqs[i] for i in pairs)
    freqs, _ = unsplit(freqs, 0)
    return xp.take(freqs, _indices(xp, pairs, device_of(freqs)), axis=0)


def _indices(xp, values, device):
    """Host ints ``values`` as an index array on ``device`` (kept there on a torch GPU)."""
    return constant_on(xp, tuple(values), index_dtype(xp, device), device, "mrope's channel indices")


def mrope_cos_sin(positions, inv_freq, sections, *, interleaved=False, layout="half", dtype=None, scale=1.0):
    r"""``cos`` and ``sin`` of multimodal RoPE: frequency pair ``i`` turns with ``positions[s(i)]``.

    .. math:: c_{\dots,i} = \cos(p_{s(i),\dots}\,\theta_i)

    (Wang et al., "Qwen2-VL: Enhancing Vision-Language Model's Perception of the World at
    Any Resolution", 2024.) With ``interleaved=False`` (Qwen2-VL, Qwen2.5-VL) :math:`s(i)` is the section holding
    pair ``i``: the first ``sections[0]`` pairs turn with ``positions[0]``, the next
    ``sections[1]`` with ``positions[1]``, and so on. With ``interleaved=True`` (Qwen3-VL;
    keras_hub's and vLLM's interleaved M-RoPE) the axes take pairs in turn,
    :math:`s(i) = i \bmod A` while :math:`i < A \cdot \text{sections}[s]` (for
    :math:`s > 0`), else 0, so every axis sees low and high frequencies alike. As there,
    an axis whose turns run past the last pair takes fewer than ``sections[s]`` pairs
    (Qwen2-VL's ``[16, 24, 24]`` dealt over 64 pairs gives the height and width axes 21
    each, the temporal axis 22): transformers' and vLLM's tables.

    duplicated in the layout's order like :func:`rope_cos_sin`. With Qwen2-VL's
    ``mrope_section`` (e.g. ``[16, 24, 24]`` for 128-wide heads) and its ``[3, batch, seq]``
    position ids this is the ``(cos, sin)`` of its rotary module; apply them with
    :func:`apply_rope`, which broadcasts tables against ``x`` from the right: for ``x
    [batch, heads, seq, d]`` give it ``cos[:, None]`` and ``sin[:, None]`` (transformers'
    ``unsqueeze(1)``). When every axis holds the same ids (text), it equals
    :func:`rope_cos_sin`.

    Parameters
    ----------
    positions : integer or float array ``[len(sections), ...]``
    inv_freq : array or sequence ``[r/2]`` (as for :func:`rope_cos_sin`)
    sections : sequence of ints, summing to ``r/2``
    interleaved : bool
        Deal the pairs out in turn (Qwen3-VL) instead of in consecutive sections.
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
    >>> cos, _ = pe.mrope_cos_sin(ids, [1.0, 0.5, 0.25, 0.125], [2, 1, 1], interleaved=True)
    >>> bool(np.allclose(cos[0, :4], np.cos([2 * 1.0, 5 * 0.5, 7 * 0.25, 2 * 0.125])))
    True
    """
    positions = table_positions(positions, inv_freq)
    args = parse_tables(positions, inv_freq, layout=layout, dtype=dtype, scale=scale)
    sections = _sections(sections, args.pairs)
    if not isinstance(interleaved, bool):
        raise TypeError(f"interleaved must be True or False, got {interleaved!r}")
    check.ndim("positions", positions, minimum=1)
    if int(positions.shape[0]) != len(sections):
        raise ValueError(
            f"positions must have one row per section on axis 0 ({len(sections)}), got shape {tuple(positions.shape)}"
        )
    positions, _ = unsplit(args.positions, 0)  # (each section's positions are a row of it; integers widened)
    check.allocatable_unless_blocked("mrope_cos_sin", (*positions.shape[1:], 2 * args.pairs), 8, positions)
    xp = args.xp
    axis_of = _axis_of_pairs(sections, interleaved, args.pairs)
    order, cos_parts, sin_parts = [], [], []
    for axis in range(len(sections)):
        pairs = [i for i, a in enumerate(axis_of) if a == axis]
        if pairs:
            c, s = args.cos_sin(positions[axis, ...], _pick(xp, args.freqs, pairs))
            cos_parts.append(c)
            sin_parts.append(s)
            order += pairs
    cos, sin = xp.concat(cos_parts, axis=-1), xp.concat(sin_parts, axis=-1)
    if order != sorted(order):
        back = _indices(xp, sorted(range(len(order)), key=order.__getitem__), device_of(cos))
        cos, sin = xp.take(cos, back, axis=-1), xp.take(sin, back, axis=-1)
    return args.placed(*args.tables(cos, sin))


def xdrope_cos_sin(positions, inv_freq, sections, *, dtype=None, scale=1.0):
    r"""``cos`` and ``sin`` of HunyuanVL's XD-RoPE: chunks of the doubled table, chunk ``a`` from ``positions[a]``.

    .. math:: c_{\dots,e} = \cos(p_{a(e),\dots}\,\theta_{e \bmod r/2}), \qquad
              a(e) = \text{the } a \text{ with } 2\textstyle\sum_{b<a} s_b \le e < 2\sum_{b\le a} s_b

    for the ``r`` entries ``e`` of the table in the half order (``[c_0 .. c_{r/2-1}, c_0 ..
    c_{r/2-1}]``, LLaMA's), ``s = sections`` summing to ``r/2`` (HunyuanVL's
    ``xdrope_section``, e.g. four axes: sequence, width, height, image index). Where the
    axes hold different ids, entry ``i`` and entry ``i + r/2`` of a pair may turn with
    different axes: the tables are applied as transformers applies them, ``x * cos +
    rotate_half(x) * sin``; :func:`apply_rope` (which reads each pair's first entry) agrees
    where every axis holds the same ids (text). With equal ids on every axis this is
    :func:`rope_cos_sin`.

    Parameters
    ----------
    positions : integer or float array ``[len(sections), ...]``
    inv_freq : array or sequence ``[r/2]`` (as for :func:`rope_cos_sin`)
    sections : sequence of ints, summing to ``r/2``
    dtype : float dtype, optional (as for :func:`rope_cos_sin`)
    scale : float, multiplies both tables (the attention scale)

    Returns
    -------
    cos, sin : arrays ``positions.shape[1:] + (r,)``, angles in float64.

    Examples
    --------
    >>> import numpy as np, posenc as pe
    >>> ids = np.array([[3], [0], [1], [2]])              # one token's four axis ids
    >>> cos, _ = pe.xdrope_cos_sin(ids, [1.0, 0.5], [1, 0, 1, 0])
    >>> bool(np.allclose(cos[0], np.cos([3 * 1.0, 3 * 0.5, 1 * 1.0, 1 * 0.5])))
    True
    """
    positions = table_positions(positions, inv_freq)
    args = parse_tables(positions, inv_freq, layout="half", dtype=dtype, scale=scale)
    sections = _sections(sections, args.pairs)
    check.ndim("positions", positions, minimum=1)
    if int(positions.shape[0]) != len(sections):
        raise ValueError(
            f"positions must have one row per section on axis 0 ({len(sections)}), got shape {tuple(positions.shape)}"
        )
    positions, _ = unsplit(args.positions, 0)  # (each section's positions are a row of it; integers widened)
    check.allocatable_unless_blocked("xdrope_cos_sin", (*positions.shape[1:], 2 * args.pairs), 8 * len(sections), positions)
    xp = args.xp
    cos_parts, sin_parts, start = [], [], 0
    for axis, size in enumerate(sections):
        if size:
            c, s = args.tables(*args.cos_sin(positions[axis, ...], args.freqs))
            cos_parts.append(c[..., start : start + 2 * size])
            sin_parts.append(s[..., start : start + 2 * size])
        start += 2 * size
    return args.placed(xp.concat(cos_parts, axis=-1), xp.concat(sin_parts, axis=-1))
