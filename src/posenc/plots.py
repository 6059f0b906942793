"""Figures of the encodings, for any configuration (matplotlib: the ``plot`` extra).

One function per figure. Each takes the figure's options, returns a
:class:`matplotlib.figure.Figure` (not attached to pyplot: nothing to close) and, given
``path``, also saves it as a PNG there. ``posenc plot FIGURE [options] --out DIR`` calls
them; :func:`write_all` writes every figure with its defaults (the docs' figures).
``import posenc`` does not import this module (``posenc.plots`` loads it) and matplotlib
is imported by the first figure drawn.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import numpy as np

import posenc as pe

from . import _validate as check

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["alibi", "rope_decay", "rope_layouts", "scalings", "sinusoidal", "t5_buckets", "write_all"]

SCALINGS = ("linear", "ntk", "dynamic", "yarn", "llama3", "longrope")
# rope_layouts' widest figure: half an inch per channel, 128 inches at the largest head
# dimension in common use (256, Gemma's)
LAYOUTS_MAX_DIM = 256
# scalings' widest rotary dimension: a line of dim / 2 points per panel, far past any model's
# (512); at 2**24 the six panels took minutes and gigabytes to draw
SCALINGS_MAX_DIM = 2**16
# the most cells of a heat map (sinusoidal, alibi): matplotlib's image pipeline takes about
# 100 bytes a cell (ALiBi at 12000 x 12000 peaked at 16 GB), far past a PNG's pixels
IMAGE_MAX_CELLS = 2**24
# t5_buckets' largest max_distance: a line of 2 max_distance points per panel (at 10**6:
# 13 s and 0.7 GB to draw; 10**8 would take 70 GB)
T5_MAX_DISTANCE = 2**20


def _figure(size) -> Figure:
    try:
        import matplotlib  # noqa: F401  (first: a missing matplotlib fails here, even with submodules loaded)
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise ImportError("matplotlib is not installed: pip install 'posenc[plot]'") from exc
    return Figure(figsize=size)


def _save(fig: Figure, path) -> Figure:
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=110)
    return fig


def rope_decay(*, dim=128, bases=(10000.0, 500000.0), max_distance=32768, path=None) -> Figure:
    r"""RoPE's long-range decay bound against the relative distance, one curve per base.

    .. math:: \text{decay}(m) = \frac{2}{d} \sum_{j=1}^{d/2} \Bigl|\sum_{i=0}^{j-1}
              e^{\,\mathrm{i}\,m\theta_i}\Bigr|, \qquad \theta_i = \text{base}^{-2i/d}

    (:func:`posenc.rope_decay`; Su et al., RoFormer, 2021, section 3.4.3). Left: the view the
    paper plots, the first base for ``m = 0..256`` on linear axes, with its value
    :math:`(d/2 + 1)/2` at ``m = 0``. Right: every base for ``m = 1..max_distance`` on a
    logarithmic distance axis, where a larger base's slower decay shows: each base is drawn
    twice, the bound itself (thin, it oscillates) and its mean over each tenth of a decade
    of ``m`` (thick).

    Parameters
    ----------
    dim : int
        Rotary dimension ``d``, positive and even.
    bases : float or sequence of float
        One curve per base on the right panel.
    max_distance : int
        The largest distance ``m`` on the right panel, at least 2.
    path : str or os.PathLike, optional
        Also save the figure there (PNG).

    Returns
    -------
    matplotlib.figure.Figure
        Two axes. The right one's lines are, for each base in order, the bound (label
        ``"base B"``) then its mean (``"base B, mean"``).

    Examples
    --------
    >>> from posenc import plots
    >>> fig = plots.rope_decay(bases=(10000, 500000))
    >>> [line.get_label() for line in fig.axes[1].lines]
    ['base 10000', 'base 10000, mean', 'base 500000', 'base 500000, mean']
    """
    dim = check.even_dim("dim", dim)
    bases = [check.real("bases", b, positive=True) for b in ([bases] if np.ndim(bases) == 0 else bases)]
    if not bases:
        raise ValueError("bases must name at least one base")
    max_distance = check.integer("max_distance", max_distance, minimum=2)
    fig = _figure((11.0, 4.2))
    near_ax, far_ax = fig.subplots(1, 2)
    near = np.arange(0, 257)
    at_zero = (dim / 2 + 1) / 2
    near_ax.plot(near, pe.rope_decay(near, dim, base=bases[0], dtype=np.float64), label=f"base {bases[0]:g}")
    near_ax.plot([0], [at_zero], "o", color="black")
    near_ax.annotate(f"m = 0: (d/2 + 1)/2 = {at_zero:g}", (0, at_zero), xytext=(10, -4), textcoords="offset points", fontsize=9)
    near_ax.set(title=f"as RoFormer plots it: d={dim}, base {bases[0]:g}", xlabel="relative distance m", ylabel=r"$(2/d)\,\sum_j |S_j(m)|$")
    far = np.unique(np.geomspace(1, max_distance, 2000).round())
    bins = np.floor(10 * np.log10(far))  # a tenth of a decade each
    centres = np.array([np.exp(np.log(far[bins == b]).mean()) for b in np.unique(bins)])
    for k, base in enumerate(bases):
        bound = pe.rope_decay(far, dim, base=base, dtype=np.float64)
        means = np.array([bound[bins == b].mean() for b in np.unique(bins)])
        far_ax.plot(far, bound, color=f"C{k}", linewidth=0.5, alpha=0.4, label=f"base {base:g}")
        far_ax.plot(centres, means, color=f"C{k}", linewidth=2.2, label=f"base {base:g}, mean")
    far_ax.set(title=f"d={dim}: " + " vs ".join(f"base {b:g}" for b in bases), xlabel="relative distance m (log scale)", xscale="log")
    for ax in (near_ax, far_ax):
        ax.title.set_fontsize(10)
        ax.legend(fontsize=8)
    fig.suptitle("RoPE long-range decay bound (upper bound of the attention score)")
    return _save(fig, path)


def t5_buckets(*, num_buckets=32, max_distance=128, path=None) -> Figure:
    r"""T5's bucket against the signed distance ``rel = query - key``, both directions.

    :func:`posenc.t5_bucket`: with ``n`` buckets per direction (``num_buckets`` causal,
    ``num_buckets // 2`` bidirectional, future keys offset by ``n``), distances
    below ``n // 2`` get one bucket each and the rest are log-spaced,

    .. math:: b(r) = \frac{n}{2} + \left\lfloor \frac{\ln(2r/n)}{\ln(2\,\text{max\_distance}/n)}
              \cdot \frac{n}{2} \right\rfloor, \text{ at most } n - 1

    (Raffel et al., T5, 2020). Top: bidirectional (encoder); bottom: causal (decoder).

    Parameters
    ----------
    num_buckets : int
        Number of buckets, at least 4.
    max_distance : int
        Distance from which every key shares the last bucket, at most
        :data:`T5_MAX_DISTANCE` (2**20).
    path : str or os.PathLike, optional
        Also save the figure there (PNG).

    Returns
    -------
    matplotlib.figure.Figure
        Two axes, each with one step line: ``rel`` from ``-(max_distance + 72)`` to
        ``max_distance + 72`` against its bucket.

    Examples
    --------
    >>> from posenc import plots
    >>> line = plots.t5_buckets(num_buckets=16, max_distance=64).axes[1].lines[0]
    >>> int(line.get_ydata()[-1])
    15
    """
    max_distance = check.integer("max_distance", max_distance, minimum=1)
    if max_distance > T5_MAX_DISTANCE:
        raise ValueError(f"max_distance must be at most {T5_MAX_DISTANCE} for this figure (a line of 2 max_distance points per panel), got {max_distance}")
    rel = np.arange(-(max_distance + 72), max_distance + 73)
    fig = _figure((9.0, 7.0))
    for ax, bidirectional, name in zip(fig.subplots(2, 1), (True, False), ("bidirectional (encoder)", "causal (decoder)")):
        buckets = pe.t5_bucket(rel, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance)
        exact = num_buckets // 4 if bidirectional else num_buckets // 2
        ax.plot(rel, buckets, drawstyle="steps-mid", label="t5_bucket(rel)")
        for d, text in ((max_distance, f"|rel| = {max_distance}"), (exact, f"|rel| < {exact}: one bucket each")):
            for x in (-d, d):
                ax.axvline(x, color="0.3", linestyle=":", linewidth=1)
            ax.annotate(text, (d, 0.02), xycoords=("data", "axes fraction"), xytext=(4, 0), textcoords="offset points", fontsize=8)
        ax.set(title=f"{name}: {num_buckets} buckets, max_distance {max_distance}", ylabel="bucket", xlabel="rel = query position - key position (key in the past: rel > 0)")
        ax.title.set_fontsize(10)
        ax.legend(fontsize=8)
    fig.suptitle("T5 relative-position buckets")
    return _save(fig, path)


def sinusoidal(*, length=256, dim=128, base=10000.0, path=None) -> Figure:
    r"""The sinusoidal table as a heat map, features against positions.

    .. math:: p_{k,2i} = \sin(k\,\omega_i), \quad p_{k,2i+1} = \cos(k\,\omega_i), \quad
              \omega_i = \text{base}^{-2i/d}

    (:func:`posenc.sinusoidal`, interleaved layout; Vaswani et al., 2017).

    Parameters
    ----------
    length : int
        Positions ``0..length-1``.
    dim : int
        Features, positive and even; ``length x dim`` at most :data:`IMAGE_MAX_CELLS` (2**24).
    base : float
    path : str or os.PathLike, optional
        Also save the figure there (PNG).

    Returns
    -------
    matplotlib.figure.Figure
        One axes whose image is the table transposed, ``[dim, length]``.

    Examples
    --------
    >>> from posenc import plots
    >>> plots.sinusoidal(length=16, dim=8).axes[0].images[0].get_array().shape
    (8, 16)
    """
    length, dim = check.integer("length", length, minimum=0), check.even_dim("dim", dim)
    if length * dim > IMAGE_MAX_CELLS:
        raise ValueError(f"length x dim must be at most {IMAGE_MAX_CELLS} cells for this figure (an image of them), got {length} x {dim}")
    table = pe.sinusoidal(length, dim, base=base, dtype=np.float64)
    fig = _figure((7.0, 4.5))
    ax = fig.subplots()
    image = ax.imshow(table.T, aspect="auto", cmap="RdBu", interpolation="nearest")
    fig.colorbar(image, ax=ax, label="value")
    ax.set(title=f"positions 0..{length - 1}, dim {dim}, base {base:g}: sin at even, cos at odd features", xlabel="position k", ylabel="feature")
    ax.title.set_fontsize(10)
    fig.suptitle("Sinusoidal encoding")
    return _save(fig, path)


def alibi(*, heads=8, length=32, head=0, path=None) -> Figure:
    r"""One head's ALiBi bias, causal: :math:`b_{ij} = -m_h\,(i - j)` for :math:`j \le i`.

    The slopes are :math:`m_h = 2^{-8h/H}` for ``H`` heads (a power of two; other counts
    interleave two such sequences), :func:`posenc.alibi_slopes` and
    :func:`posenc.alibi_bias` (Press et al., ALiBi, 2022). Future keys are left blank.

    Parameters
    ----------
    heads : int
        Number of heads ``H``.
    length : int
        Queries and keys ``0..length-1``, ``length**2`` at most :data:`IMAGE_MAX_CELLS` (2**24).
    head : int
        Which head to draw, from 0.
    path : str or os.PathLike, optional
        Also save the figure there (PNG).

    Returns
    -------
    matplotlib.figure.Figure
        One axes whose image is ``[query i, key j]``, NaN above the diagonal.

    Examples
    --------
    >>> from posenc import plots
    >>> float(plots.alibi(heads=4, length=4).axes[0].images[0].get_array()[3, 0])  # -2^-2 * 3
    -0.75
    """
    slopes = pe.alibi_slopes(heads)
    head = check.integer("head", head, minimum=0)
    if head >= heads:
        raise ValueError(f"head must be below heads={heads}, got {head}")
    length = check.integer("length", length, minimum=0)
    if length * length > IMAGE_MAX_CELLS:
        raise ValueError(f"length x length must be at most {IMAGE_MAX_CELLS} cells for this figure (an image of them), got {length} x {length}")
    rel = pe.relative_positions(length, length)
    bias = np.where(rel >= 0, pe.alibi_bias(slopes[head : head + 1], length, length)[0], np.nan)
    fig = _figure((7.0, 4.5))
    ax = fig.subplots()
    image = ax.imshow(bias, aspect="auto", cmap="magma", interpolation="nearest")
    fig.colorbar(image, ax=ax, label="bias added to the logit")
    ax.set(title=f"head {head} of {heads} (slope m = {slopes[head]:g}), causal", xlabel="key j", ylabel="query i")
    ax.title.set_fontsize(10)
    fig.suptitle("ALiBi bias -m (i - j)")
    return _save(fig, path)


def _scaling(kind, factor, dim, original):
    if kind == "linear":
        return f"Linear(factor={factor:g})", pe.scaling.Linear(factor)
    if kind == "ntk":
        return f"NTK(alpha={factor:g})", pe.scaling.NTK(factor)
    if kind == "dynamic":
        return f"DynamicNTK(factor={factor:g})", pe.scaling.DynamicNTK(factor, original)
    if kind == "yarn":
        return f"YaRN(factor={factor:g})", pe.scaling.YaRN(factor, original)
    if kind == "llama3":
        return f"Llama3(factor={factor:g})", pe.scaling.Llama3(factor, original)
    if kind == "longrope":
        long_factors = list(np.linspace(1.0, factor, dim // 2))
        return f"LongRoPE(long factors 1..{factor:g})", pe.scaling.LongRoPE([1.0] * (dim // 2), long_factors, original)
    raise ValueError(f"scaling type must be one of {', '.join(SCALINGS)}, got {kind!r}")


def _default_seq_len(factor, original):
    original = check.integer("original", original, minimum=1)
    if factor * original > check.INT64_MAX:
        raise ValueError(f"factor x original, the default seq_len, must be at most {check.INT64_MAX}, got {factor:g} x {original}")
    return int(round(factor * original))


def scalings(*, types=SCALINGS, factor=4.0, dim=128, base=10000.0, original=4096, seq_len=None, path=None) -> Figure:
    r"""Each scaling's frequencies over the unscaled ones, against the wavelength.

    For pair ``i``, :math:`\theta'_i / \theta_i` against :math:`2\pi/\theta_i` with
    :math:`\theta_i = \text{base}^{-2i/d}` and :math:`\theta'_i` from
    :func:`posenc.rope_frequencies` with the scaling; each panel's title gives its attention
    scale. Linear divides every frequency by ``factor``; YaRN and Llama3 keep the short
    wavelengths and divide those longer than the original length; NTK and dynamic NTK
    change the base. LongRoPE is drawn with long factors rising linearly from 1 to
    ``factor``.

    Parameters
    ----------
    types : sequence of str
        Panels, among ``"linear"``, ``"ntk"``, ``"dynamic"``, ``"yarn"``, ``"llama3"``,
        ``"longrope"``.
    factor : float
        The scaling factor (NTK's ``alpha``), at least 1.
    dim : int
        Rotary dimension, even, from 4 to :data:`SCALINGS_MAX_DIM` (65536).
    base : float
    original : int
        The original (trained) context length.
    seq_len : int, optional
        The length the length-dependent scalings (dynamic, LongRoPE) see; default
        ``factor * original``, which must fit in int64.
    path : str or os.PathLike, optional
        Also save the figure there (PNG).

    Returns
    -------
    matplotlib.figure.Figure
        One axes per type, each with two lines: ``"unscaled"`` (ones) and the scaling's
        ratio (labelled with its class name).

    Examples
    --------
    >>> from posenc import plots
    >>> fig = plots.scalings(types=["linear"], factor=8)
    >>> set(fig.axes[0].lines[1].get_ydata().round(4))
    {np.float64(0.125)}
    """
    factor = check.real("factor", factor, positive=True)
    if factor < 1:
        raise ValueError(f"factor must be at least 1, got {factor:g}")
    types = list(types)
    if not types:
        raise ValueError(f"types must name at least one of {', '.join(SCALINGS)}")
    dim = check.even_dim("dim", dim)
    if dim > SCALINGS_MAX_DIM:
        raise ValueError(f"dim must be at most {SCALINGS_MAX_DIM} for this figure (a line of dim / 2 points per panel), got {dim}")
    if seq_len is None:
        seq_len = _default_seq_len(factor, original)
    plain, _ = pe.rope_frequencies(dim, base=base)
    wavelength = 2 * np.pi / plain
    cols = min(3, len(types))
    rows = -(-len(types) // cols)
    fig = _figure((4.4 * cols, 3.8 * rows))
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax, kind in zip(axes, types):
        name, scaling = _scaling(kind, factor, dim, original)
        inv_freq, scale = pe.rope_frequencies(dim, base=base, scaling=scaling, seq_len=seq_len)
        ax.plot(wavelength, np.ones_like(plain), color="0.5", linestyle="--", label="unscaled")
        ax.plot(wavelength, inv_freq / plain, color="C3", linewidth=2, label=name.split("(")[0])
        ax.axvline(original, color="0.3", linestyle=":", linewidth=1)
        ax.annotate(f"original length {original}", (original, 0.02), xycoords=("data", "axes fraction"), xytext=(4, 0), textcoords="offset points", fontsize=8)
        ax.set(title=f"{name}\nattention scale {scale:.4g}", xlabel=r"wavelength $2\pi/\theta_i$ (tokens)", ylabel=r"scaled $\theta_i$ / unscaled $\theta_i$", xscale="log", ylim=(0.0, 1.1))
        ax.title.set_fontsize(10)
        ax.legend(fontsize=8)
    for ax in axes[len(types) :]:
        ax.set_visible(False)
    fig.suptitle(f"RoPE scalings: dim {dim}, base {base:g}, factor {factor:g}\noriginal length {original}, seq_len {seq_len}")
    return _save(fig, path)


def rope_layouts(*, dim=8, path=None) -> Figure:
    r"""Which channels form rotated pair ``i = (a, b)`` in the two RoPE layouts.

    ``layout="half"``: :math:`(x_i, x_{i + d/2})` (GPT-NeoX, LLaMA);
    ``layout="interleaved"``: :math:`(x_{2i}, x_{2i+1})` (RoFormer, GPT-J).
    :func:`posenc.convert_layout` moves between them.

    Parameters
    ----------
    dim : int
        Channels, positive and even, at most :data:`LAYOUTS_MAX_DIM` (256).
    path : str or os.PathLike, optional
        Also save the figure there (PNG).

    Returns
    -------
    matplotlib.figure.Figure
        One axes: an image ``[2, dim]`` of pair indices (row 0 half, row 1 interleaved) and a
        text ``"<pair><a|b>"`` on each cell.

    Examples
    --------
    >>> from posenc import plots
    >>> [t.get_text() for t in plots.rope_layouts(dim=4).axes[0].texts]
    ['0a', '1a', '0b', '1b', '0a', '0b', '1a', '1b']
    """
    dim = check.even_dim("dim", dim)
    if dim > LAYOUTS_MAX_DIM:
        raise ValueError(f"dim must be at most {LAYOUTS_MAX_DIM} for this figure (half an inch per channel), got {dim}")
    pairs = dim // 2
    half = [(c % pairs, "ab"[c // pairs]) for c in range(dim)]
    interleaved = [(c // 2, "ab"[c % 2]) for c in range(dim)]
    fig = _figure((max(8.0, dim * 0.5), 2.8))
    ax = fig.subplots()
    ax.imshow(np.array([[p for p, _ in half], [p for p, _ in interleaved]]) % 10, aspect="auto", cmap="tab10", interpolation="nearest", vmin=0, vmax=9)
    for r, row in enumerate((half, interleaved)):
        for c, (pair, side) in enumerate(row):
            ax.text(c, r, f"{pair}{side}", ha="center", va="center", color="white", fontsize=11)
    ax.set_xticks(range(dim))
    ax.set_yticks([0, 1], ['layout="half" (GPT-NeoX, LLaMA)', 'layout="interleaved" (RoFormer, GPT-J)'])
    ax.set(title=f"which channels form pair i = (a, b), d = {dim}", xlabel="channel")
    ax.title.set_fontsize(10)
    fig.suptitle("RoPE layouts")
    return _save(fig, path)


FIGURES = {
    "rope_decay.png": rope_decay,
    "t5_buckets.png": t5_buckets,
    "sinusoidal.png": sinusoidal,
    "alibi.png": alibi,
    "rope_scalings.png": scalings,
    "rope_layouts.png": rope_layouts,
}


def write_all(out_dir, progress=print) -> list[str]:
    """Write every figure, with its defaults, as a PNG under ``out_dir``.

    Parameters
    ----------
    out_dir : str or os.PathLike
        Created if missing.
    progress : callable
        Called with ``"wrote PATH"`` after each figure.

    Returns
    -------
    list of str
        The paths written, in the order of ``FIGURES``.
    """
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for name, make in FIGURES.items():
        path = os.path.join(out_dir, name)
        make(path=path)
        progress(f"wrote {path}")
        paths.append(path)
    return paths
