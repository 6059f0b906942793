"""Figures for ``posenc plot`` (matplotlib, the ``plot`` extra)."""

from __future__ import annotations

import os

import numpy as np

import posenc as pe


def _pyplot():
    try:
        import matplotlib
    except ImportError as exc:
        raise ImportError("posenc plot needs matplotlib: pip install 'posenc[plot]'") from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def rope_decay(plt, ax):
    distances = np.arange(0, 2048)
    for base in (10000.0, 500000.0):
        ax.plot(distances, pe.rope_decay(distances, 128, base=base, dtype=np.float64), label=f"base {base:g}")
    ax.set(title="RoPE long-range decay bound (dim 128)", xlabel="relative distance", ylabel="(2/d) sum |S_j|", xscale="log")
    ax.legend()


def t5_buckets(plt, ax):
    rel = pe.relative_positions(64, 64, offset=0)
    image = ax.imshow(pe.t5_bucket(rel), cmap="viridis")
    ax.set(title="T5 buckets (bidirectional, 32 buckets, max 128)", xlabel="key j", ylabel="query i")
    plt.colorbar(image, ax=ax)


def sinusoidal_heatmap(plt, ax):
    image = ax.imshow(pe.sinusoidal(256, 128).T, aspect="auto", cmap="RdBu")
    ax.set(title="Sinusoidal encoding (interleaved)", xlabel="position", ylabel="feature")
    plt.colorbar(image, ax=ax)


def alibi(plt, ax):
    bias = pe.alibi_bias(pe.alibi_slopes(8), 32, 32)
    image = ax.imshow(np.where(pe.relative_positions(32, 32) >= 0, bias[0], np.nan), cmap="magma")
    ax.set(title="ALiBi bias, head 1 of 8 (causal)", xlabel="key j", ylabel="query i")
    plt.colorbar(image, ax=ax)


def scaling_curves(plt, ax):
    dim, original = 128, 4096
    scalings = {
        "none": None,
        "Linear(4)": pe.scaling.Linear(4.0),
        "NTK(4)": pe.scaling.NTK(4.0),
        "DynamicNTK(4) @16k": pe.scaling.DynamicNTK(4.0, original),
        "YaRN(4)": pe.scaling.YaRN(4.0, original),
        "Llama3(4)": pe.scaling.Llama3(4.0, original),
        "LongRoPE(long)": pe.scaling.LongRoPE([1.0] * (dim // 2), list(np.linspace(1.0, 4.0, dim // 2)), original),
    }
    for name, scaling in scalings.items():
        inv_freq, _ = pe.rope_frequencies(dim, base=10000.0, scaling=scaling, seq_len=16384)
        ax.plot(np.arange(dim // 2), inv_freq, label=name)
    ax.set(title="RoPE inverse frequencies under each scaling", xlabel="pair i", ylabel="inv_freq", yscale="log")
    ax.legend(fontsize=7)


def rope_layouts(plt, ax):
    dim = 8
    half = [f"{i % (dim // 2)}{'ab'[i // (dim // 2)]}" for i in range(dim)]
    interleaved = [f"{i // 2}{'ab'[i % 2]}" for i in range(dim)]
    ax.axis("off")
    ax.set_title("RoPE layouts: which channels form pair i (a, b)")
    for row, (name, labels) in enumerate((("half (GPT-NeoX, LLaMA)", half), ("interleaved (RoFormer, GPT-J)", interleaved))):
        ax.text(-0.5, 1 - row, name, ha="right", va="center")
        for c, label in enumerate(labels):
            ax.add_patch(plt.Rectangle((c, 0.6 - row), 0.9, 0.8, color=plt.cm.tab10(int(label[:-1]))))
            ax.text(c + 0.45, 1 - row, label, ha="center", va="center", color="white")
    ax.set_xlim(-4, dim)
    ax.set_ylim(-0.6, 1.6)


FIGURES = {
    "rope_decay.png": rope_decay,
    "t5_buckets.png": t5_buckets,
    "sinusoidal.png": sinusoidal_heatmap,
    "alibi.png": alibi,
    "rope_scalings.png": scaling_curves,
    "rope_layouts.png": rope_layouts,
}


def write_all(out_dir: str, progress=print) -> list[str]:
    """Write every figure as a PNG under ``out_dir``; returns the paths."""
    plt = _pyplot()
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for name, draw in FIGURES.items():
        fig, ax = plt.subplots(figsize=(7, 4.5))
        draw(plt, ax)
        fig.tight_layout()
        path = os.path.join(out_dir, name)
        fig.savefig(path, dpi=110)
        plt.close(fig)
        progress(f"wrote {path}")
        paths.append(path)
    return paths
