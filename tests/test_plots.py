"""``posenc.plots``: the data in each figure's lines and images, against the formulas.

These tests read what matplotlib would draw (``Line2D`` data, image arrays), never pixels.
"""

import math

import numpy as np
import pytest

pytest.importorskip("matplotlib")

import posenc as pe  # noqa: E402
from formulas import hf_t5_bucket  # noqa: E402
from posenc import plots  # noqa: E402


def lines_by_label(ax):
    return {line.get_label(): line for line in ax.lines if not line.get_label().startswith("_")}


def decay_as_the_source_writes_it(m, d=128, base=10000.0):
    """(1/(d/2)) sum_{j=0}^{d/2-1} |sum_{i=0}^{j} exp(1j m theta_i)|, theta_i = base^(-2i/d)."""
    total = 0.0
    partial = 0.0j
    for i in range(d // 2):
        partial += complex(math.cos(m * base ** (-2 * i / d)), math.sin(m * base ** (-2 * i / d)))
        total += abs(partial)
    return total / (d / 2)


def test_rope_decay_left_panel_is_the_sources_view():
    near, _ = plots.rope_decay().axes
    curve = lines_by_label(near)["base 10000"]
    x, y = curve.get_xdata(), curve.get_ydata()
    assert near.get_xscale() == "linear" and x[0] == 0 and x[-1] == 256
    assert y[0] == pytest.approx((128 / 2 + 1) / 2) == 32.5
    for m in (1, 10, 100, 256):
        assert y[m] == pytest.approx(decay_as_the_source_writes_it(m), rel=1e-9)
    assert "32.5" in near.texts[0].get_text()


def test_rope_decay_shows_two_bases_apart():
    _, far = plots.rope_decay(bases=(10000, 500000), max_distance=32768).axes
    assert far.get_xscale() == "log"
    lines = lines_by_label(far)
    assert list(lines) == ["base 10000", "base 10000, mean", "base 500000", "base 500000, mean"]
    for base in (10000, 500000):
        raw = lines[f"base {base}"]
        x = raw.get_xdata()
        assert x[0] == 1 and x[-1] == 32768
        np.testing.assert_allclose(raw.get_ydata(), [decay_as_the_source_writes_it(m, base=base) for m in x], rtol=1e-9)
        # The thick curve is the mean of the bound over each tenth of a decade of m.
        mean = lines[f"base {base}, mean"]
        in_bin = (x >= 100) & (x < 10 ** 2.1)
        (i,) = np.flatnonzero((mean.get_xdata() >= 100) & (mean.get_xdata() < 10 ** 2.1))
        assert mean.get_ydata()[i] == pytest.approx(raw.get_ydata()[in_bin].mean())
        assert lines[f"base {base}, mean"].get_linewidth() > 3 * raw.get_linewidth()
    slow, fast = lines["base 500000, mean"], lines["base 10000, mean"]
    assert np.array_equal(slow.get_xdata(), fast.get_xdata())
    gap = slow.get_ydata() - fast.get_ydata()
    # Visibly apart: base 500000's bound stays higher by more than 2 (of 32.5) from m = 10 to 1000.
    middle = (slow.get_xdata() >= 10) & (slow.get_xdata() <= 1000)
    assert gap[middle].min() > 2.0
    assert lines["base 500000, mean"].get_color() != lines["base 10000, mean"].get_color()


def test_t5_figure_is_the_bucket_step_function_of_signed_distance():
    fig = plots.t5_buckets()
    bidirectional, causal = fig.axes
    assert "32 buckets" in bidirectional.get_title() and "max_distance 128" in bidirectional.get_title()
    for ax, is_bidirectional in ((bidirectional, True), (causal, False)):
        (curve,) = lines_by_label(ax).values()
        assert curve.get_drawstyle() == "steps-mid"
        rel, bucket = curve.get_xdata(), curve.get_ydata()
        assert rel.min() < -128 and rel.max() > 128 and np.array_equal(np.diff(rel), np.ones(rel.size - 1))
        expected = hf_t5_bucket(-rel, bidirectional=is_bidirectional, num_buckets=32, max_distance=128)  # T5's own, on key - query
        np.testing.assert_array_equal(bucket, expected)
        vertical = {line.get_xdata()[0] for line in ax.lines if line.get_label().startswith("_")}
        assert vertical >= {-128, 128}
    assert set(bidirectional.lines[0].get_ydata().tolist()) == set(range(32)) - {16}
    assert set(causal.lines[0].get_ydata().tolist()) == set(range(32))


def test_t5_figure_takes_its_options():
    (curve,) = lines_by_label(plots.t5_buckets(num_buckets=16, max_distance=64).axes[1]).values()
    rel = curve.get_xdata()
    np.testing.assert_array_equal(curve.get_ydata(), hf_t5_bucket(-rel, bidirectional=False, num_buckets=16, max_distance=64))


def test_sinusoidal_heatmap_is_the_papers_formula():
    (ax, _colorbar) = plots.sinusoidal(length=100, dim=32, base=500.0).axes
    image = ax.images[0].get_array()
    k = np.arange(100)[None, :]
    i = np.arange(16)[:, None]
    angle = k / 500.0 ** (2 * i / 32)
    np.testing.assert_allclose(image[0::2], np.sin(angle), atol=1e-12)
    np.testing.assert_allclose(image[1::2], np.cos(angle), atol=1e-12)


@pytest.mark.parametrize("heads, head", [(8, 0), (8, 3), (12, 11)])
def test_alibi_figure_is_minus_slope_times_distance_below_the_diagonal(heads, head):
    ax = plots.alibi(heads=heads, length=20, head=head).axes[0]
    image = np.ma.filled(ax.images[0].get_array(), np.nan)
    i, j = np.indices((20, 20))
    # Press et al.: 2^(-8h/n) for n a power of two; otherwise the closest power 2^k's slopes,
    # then every other slope of 2^(k+1)'s.
    closest = 2 ** int(math.log2(heads))
    slopes = [2 ** (-8 * h / closest) for h in range(1, closest + 1)]
    slopes += [2 ** (-8 * h / (2 * closest)) for h in range(1, 2 * closest + 1, 2)][: heads - closest]
    assert f"slope m = {slopes[head]:g}" in ax.get_title()
    np.testing.assert_array_equal(np.isnan(image), j > i)
    np.testing.assert_allclose(image[j <= i], -slopes[head] * (i - j)[j <= i], rtol=1e-6)


def test_scaling_figure_names_its_parameters_and_every_curve_is_visible():
    fig = plots.scalings()
    for words in ("dim 128", "base 10000", "factor 4", "original length 4096", "seq_len 16384"):
        assert words in fig.texts[0].get_text()
    assert [ax.get_title().split("(")[0] for ax in fig.axes] == ["Linear", "NTK", "DynamicNTK", "YaRN", "Llama3", "LongRoPE"]
    theta = 10000.0 ** (-np.arange(64) * 2 / 128)
    for ax in fig.axes:
        unscaled, scaled = lines_by_label(ax).values()
        np.testing.assert_allclose(unscaled.get_xdata(), 2 * np.pi / theta)
        assert (unscaled.get_ydata() == 1).all()
        assert np.abs(scaled.get_ydata() - 1).max() > 0.5
        assert scaled.get_color() != unscaled.get_color()
    linear = lines_by_label(fig.axes[0])["Linear"]
    np.testing.assert_allclose(linear.get_ydata(), 0.25)
    yarn = fig.axes[3]
    assert f"{0.1 * math.log(4.0) + 1:.4g}" in yarn.get_title()
    ratio = lines_by_label(yarn)["YaRN"].get_ydata()
    assert ratio[0] == pytest.approx(1.0) and ratio[-1] == pytest.approx(0.25)


def test_scaling_figure_of_one_type_and_factor():
    fig = plots.scalings(types=["yarn"], factor=8, dim=64, base=500000.0, original=8192)
    (ax,) = [ax for ax in fig.axes if ax.get_visible()]
    ratio = lines_by_label(ax)["YaRN"].get_ydata()
    expected, _ = pe.rope_frequencies(64, base=500000.0, scaling=pe.scaling.YaRN(8.0, 8192))
    np.testing.assert_allclose(ratio, expected / 500000.0 ** (-np.arange(32) * 2 / 64))
    assert ratio[-1] == pytest.approx(1 / 8) and f"{0.1 * math.log(8.0) + 1:.4g}" in ax.get_title()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"types": ["yarnn"]}, "scaling type must be one of linear, ntk, dynamic, yarn, llama3, longrope, got 'yarnn'"),
        ({"factor": 0.5}, "factor must be at least 1, got 0.5"),
        ({"factor": 1e300}, "factor x original, the default seq_len, must be at most 9223372036854775807, got 1e\\+300 x 4096$"),
        ({"types": []}, "types must name at least one of"),
    ],
)
def test_scaling_figure_refuses_bad_options(kwargs, message):
    with pytest.raises(ValueError, match=message):
        plots.scalings(**kwargs)


def test_bad_figure_options_name_the_argument():
    with pytest.raises(ValueError, match="head must be below heads=8, got 8"):
        plots.alibi(head=8)
    with pytest.raises(ValueError, match="dim"):
        plots.rope_decay(dim=7)
    with pytest.raises(ValueError, match="dim must be at most 256 for this figure .*, got 258"):
        plots.rope_layouts(dim=258)
    (one,) = [ax for ax in plots.rope_decay(bases=500000).axes[1:]]
    assert [line.get_label() for line in one.lines] == ["base 500000", "base 500000, mean"]
    with pytest.raises(ValueError, match="bases must name at least one base"):
        plots.rope_decay(bases=())
    # T5's figure draws every distance up to max_distance: too many is refused before allocating
    with pytest.raises(ValueError, match=r"max_distance must be at most 1048576 for this figure .*, got 1000000000000"):
        plots.t5_buckets(max_distance=10**12)
    with pytest.raises(ValueError, match="max_distance must be a positive integer"):
        plots.t5_buckets(max_distance=0)


def test_layout_figure_pairs_channels_as_convert_layout_moves_them():
    ax = plots.rope_layouts().axes[0]
    labels = [t.get_text() for t in ax.texts]
    half, interleaved = labels[:8], labels[8:]
    assert half[:4] == ["0a", "1a", "2a", "3a"] and half[4:] == ["0b", "1b", "2b", "3b"]
    # convert_layout(half -> interleaved) puts half channel src[c] at interleaved channel c.
    src = pe.convert_layout(np.arange(8.0), "half", "interleaved").astype(int)
    assert [half[s] for s in src] == interleaved


def test_write_all_and_path(tmp_path):
    paths = plots.write_all(str(tmp_path), progress=lambda s: None)
    assert [p.rsplit("/", 1)[-1] for p in paths] == list(plots.FIGURES)
    fig = plots.alibi(path=tmp_path / "one.png")
    assert (tmp_path / "one.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and fig.axes


def test_matplotlib_is_imported_by_the_first_figure_only():
    import subprocess
    import sys

    code = (
        "import sys, posenc; assert 'matplotlib' not in sys.modules and 'posenc.plots' not in sys.modules\n"
        "import posenc.cli; posenc.plots.SCALINGS; assert 'matplotlib' not in sys.modules\n"
        "posenc.plots.alibi(); assert 'matplotlib' in sys.modules and 'matplotlib.pyplot' not in sys.modules"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
