"""Figures for ``posenc plot`` (matplotlib, the ``plot`` extra).

Each figure is computed first, as plain data (:class:`Figure`: panels of named curves,
images and marks, every number the picture shows), then drawn by one function. The tests
read the data, and the docs show the drawing.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

import posenc as pe


@dataclass
class Curve:
    label: str
    x: np.ndarray
    y: np.ndarray
    style: dict = field(default_factory=dict)


@dataclass
class Mark:
    """A point (``x`` and ``y``) or a vertical line (``y is None``) with its text."""

    x: float
    y: float | None
    text: str


@dataclass
class Panel:
    title: str
    xlabel: str = ""
    ylabel: str = ""
    curves: list[Curve] = field(default_factory=list)
    marks: list[Mark] = field(default_factory=list)
    image: np.ndarray | None = None
    image_label: str = ""
    cell_labels: list[list[str]] | None = None
    row_labels: list[str] | None = None
    xscale: str = "linear"
    yscale: str = "linear"
    ylim: tuple[float, float] | None = None


@dataclass
class Figure:
    title: str
    panels: list[Panel]
    grid: tuple[int, int] = (1, 1)
    size: tuple[float, float] = (7.0, 4.5)


def rope_decay(dim=128, base=10000.0, long_base=500000.0):
    """RoFormer's decay bound: the source's view (0..256), then long range for two bases."""
    near = np.arange(0, 257)
    far = np.arange(0, 32769, 8)
    at_zero = (dim / 2 + 1) / 2
    source = Panel(
        title=f"as RoFormer plots it: d={dim}, base {base:g}",
        xlabel="relative distance m",
        ylabel=r"$(2/d)\,\sum_j |S_j(m)|$",
        curves=[Curve(f"d={dim}, base {base:g}", near, pe.rope_decay(near, dim, base=base, dtype=np.float64))],
        marks=[Mark(0.0, at_zero, f"m = 0: (d/2 + 1)/2 = {at_zero:g}")],
    )
    long_range = Panel(
        title=f"long range, d={dim}: base {base:g} vs {long_base:g} (Llama 3)",
        xlabel="relative distance m",
        curves=[
            Curve(f"d={dim}, base {b:g}", far, pe.rope_decay(far, dim, base=b, dtype=np.float64), {"linewidth": 0.6})
            for b in (long_base, base)
        ],
        marks=[Mark(0.0, at_zero, f"{at_zero:g} at m = 0")],
    )
    return Figure("RoPE long-range decay bound (upper bound of the attention score)", [source, long_range], (1, 2), (11.0, 4.2))


def t5_buckets(num_buckets=32, max_distance=128):
    """Bucket against signed distance ``rel = query - key``, bidirectional and causal."""
    rel = np.arange(-(max_distance + 72), max_distance + 73)
    panels = []
    for bidirectional, name in ((True, "bidirectional (encoder)"), (False, "causal (decoder)")):
        buckets = pe.t5_bucket(rel, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance)
        exact = num_buckets // 4 if bidirectional else num_buckets // 2
        panels.append(
            Panel(
                title=f"{name}: {num_buckets} buckets, max_distance {max_distance}",
                xlabel="rel = query position - key position (key in the past: rel > 0)",
                ylabel="bucket",
                curves=[Curve("t5_bucket(rel)", rel, buckets, {"drawstyle": "steps-mid"})],
                marks=[Mark(float(d), None, f"|rel| = {max_distance}" if d > 0 else "") for d in (-max_distance, max_distance)]
                + [Mark(float(d), None, f"|rel| < {exact}: one bucket each" if d > 0 else "") for d in (-exact, exact)],
            )
        )
    return Figure("T5 relative-position buckets (posenc.t5_bucket defaults)", panels, (2, 1), (9.0, 7.0))


def sinusoidal_heatmap(length=256, dim=128):
    table = pe.sinusoidal(length, dim, dtype=np.float64)
    panel = Panel(
        title=f"sinusoidal(positions 0..{length - 1}, dim {dim}), interleaved: sin at even, cos at odd features",
        xlabel="position k",
        ylabel="feature",
        image=table.T,
        image_label="value",
    )
    return Figure("Sinusoidal encoding", [panel])


def alibi(num_heads=8, length=32, head=0):
    slopes = pe.alibi_slopes(num_heads)
    rel = pe.relative_positions(length, length)
    bias = np.where(rel >= 0, pe.alibi_bias(slopes, length, length)[head], np.nan)
    panel = Panel(
        title=f"ALiBi bias -m rel, head {head + 1} of {num_heads} (slope m = {slopes[head]:g}), causal",
        xlabel="key j",
        ylabel="query i",
        image=bias,
        image_label="bias added to the logit",
    )
    return Figure("ALiBi", [panel])


def scaling_curves(dim=128, base=10000.0, factor=4.0, original=4096, seq_len=16384):
    """Each scaling's frequencies over the unscaled ones, one panel per scaling."""
    plain, _ = pe.rope_frequencies(dim, base=base)
    wavelength = 2 * np.pi / plain
    long_factors = list(np.linspace(1.0, factor, dim // 2))
    scalings = [
        (f"Linear(factor={factor:g})", pe.scaling.Linear(factor)),
        (f"NTK(alpha={factor:g})", pe.scaling.NTK(factor)),
        (f"DynamicNTK(factor={factor:g}), seq_len {seq_len}", pe.scaling.DynamicNTK(factor, original)),
        (f"YaRN(factor={factor:g})", pe.scaling.YaRN(factor, original)),
        (f"Llama3(factor={factor:g})", pe.scaling.Llama3(factor, original)),
        (f"LongRoPE(long factors 1..{factor:g}), seq_len {seq_len}", pe.scaling.LongRoPE([1.0] * (dim // 2), long_factors, original)),
    ]
    panels = []
    for name, scaling in scalings:
        inv_freq, scale = pe.rope_frequencies(dim, base=base, scaling=scaling, seq_len=seq_len)
        panels.append(
            Panel(
                title=f"{name}\nattention scale {scale:.4g}",
                xlabel=r"wavelength $2\pi/\theta_i$ (tokens)",
                ylabel=r"scaled $\theta_i$ / unscaled $\theta_i$",
                curves=[
                    Curve("unscaled", wavelength, np.ones_like(plain), {"color": "0.5", "linestyle": "--"}),
                    Curve(name.split("(")[0], wavelength, inv_freq / plain, {"color": "C3", "linewidth": 2}),
                ],
                marks=[Mark(float(original), None, f"original length {original}")],
                xscale="log",
                ylim=(0.0, 1.1),
            )
        )
    title = f"RoPE scalings: dim {dim}, base {base:g}, factor {factor:g}, original length {original}"
    return Figure(title, panels, (2, 3), (13.0, 7.5))


def rope_layouts(dim=8):
    pairs = dim // 2
    half = [i % pairs for i in range(dim)], [f"{i % pairs}{'ab'[i // pairs]}" for i in range(dim)]
    interleaved = [i // 2 for i in range(dim)], [f"{i // 2}{'ab'[i % 2]}" for i in range(dim)]
    panel = Panel(
        title=f"which channels form pair i = (a, b), d = {dim}",
        xlabel="channel",
        image=np.array([half[0], interleaved[0]], dtype=float),
        cell_labels=[half[1], interleaved[1]],
        row_labels=['layout="half" (GPT-NeoX, LLaMA)', 'layout="interleaved" (RoFormer, GPT-J)'],
    )
    return Figure("RoPE layouts", [panel], size=(8.0, 2.8))


FIGURES = {
    "rope_decay.png": rope_decay,
    "t5_buckets.png": t5_buckets,
    "sinusoidal.png": sinusoidal_heatmap,
    "alibi.png": alibi,
    "rope_scalings.png": scaling_curves,
    "rope_layouts.png": rope_layouts,
}


def _pyplot():
    try:
        import matplotlib
    except ImportError as exc:
        raise ImportError("matplotlib is not installed: pip install 'posenc[plot]'") from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _draw_panel(fig, ax, panel):
    ax.set(title=panel.title, xlabel=panel.xlabel, ylabel=panel.ylabel, xscale=panel.xscale, yscale=panel.yscale)
    ax.title.set_fontsize(10)
    if panel.image is not None:
        categorical = panel.cell_labels is not None
        cmap = "tab10" if categorical else ("RdBu" if np.nanmin(panel.image) < 0 < np.nanmax(panel.image) else "magma")
        image = ax.imshow(panel.image, aspect="auto", cmap=cmap, interpolation="nearest", vmin=0 if categorical else None, vmax=9 if categorical else None)
        if categorical:
            for r, row in enumerate(panel.cell_labels):
                for c, text in enumerate(row):
                    ax.text(c, r, text, ha="center", va="center", color="white", fontsize=11)
            ax.set_xticks(range(panel.image.shape[1]))
        else:
            fig.colorbar(image, ax=ax, label=panel.image_label)
        if panel.row_labels:
            ax.set_yticks(range(len(panel.row_labels)), panel.row_labels)
    for curve in panel.curves:
        ax.plot(curve.x, curve.y, label=curve.label, **curve.style)
    for mark in panel.marks:
        if mark.y is None:
            ax.axvline(mark.x, color="0.3", linestyle=":", linewidth=1)
            if mark.text:
                ax.annotate(mark.text, (mark.x, 0.02), xycoords=("data", "axes fraction"), xytext=(4, 0), textcoords="offset points", fontsize=8)
        else:
            ax.plot([mark.x], [mark.y], "o", color="black")
            ax.annotate(mark.text, (mark.x, mark.y), xytext=(10, -4), textcoords="offset points", fontsize=9)
    if panel.ylim:
        ax.set_ylim(*panel.ylim)
    if panel.curves:
        ax.legend(fontsize=8)


def draw(plt, figure: Figure):
    """A matplotlib figure showing ``figure``'s data."""
    fig, axes = plt.subplots(*figure.grid, figsize=figure.size, squeeze=False)
    for ax, panel in zip(axes.flat, figure.panels):
        _draw_panel(fig, ax, panel)
    fig.suptitle(figure.title)
    fig.tight_layout()
    return fig


def write_all(out_dir: str, progress=print) -> list[str]:
    """Write every figure as a PNG under ``out_dir``; returns the paths."""
    plt = _pyplot()
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for name, make in FIGURES.items():
        fig = draw(plt, make())
        path = os.path.join(out_dir, name)
        fig.savefig(path, dpi=110)
        plt.close(fig)
        progress(f"wrote {path}")
        paths.append(path)
    return paths
