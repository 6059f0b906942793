"""``posenc plot``: every figure's data, checked against maths and the original formulas.

The figures are data first (``posenc._plots``: panels of curves, images and marks); these
tests read that data, never the pixels.
"""

import math

import numpy as np
import pytest

import posenc as pe
from formulas import hf_t5_bucket
from posenc import _plots


def by_label(panel, label):
    (curve,) = [c for c in panel.curves if c.label == label]
    return curve


def decay_as_the_source_writes_it(m, d=128, base=10000.0):
    """(1/(d/2)) sum_{j=0}^{d/2-1} |sum_{i=0}^{j} exp(1j m theta_i)|, theta_i = base^(-2i/d)."""
    total = 0.0
    partial = 0.0j
    for i in range(d // 2):
        partial += complex(math.cos(m * base ** (-2 * i / d)), math.sin(m * base ** (-2 * i / d)))
        total += abs(partial)
    return total / (d / 2)


def test_rope_decay_shows_distance_zero_and_the_sources_view():
    fig = _plots.rope_decay()
    source, long_range = fig.panels
    curve = by_label(source, "d=128, base 10000")
    assert source.xscale == "linear" and curve.x[0] == 0 and curve.x[-1] == 256
    assert curve.y[0] == pytest.approx((128 / 2 + 1) / 2) == 32.5
    for m in (1, 10, 100, 256):
        assert curve.y[m] == pytest.approx(decay_as_the_source_writes_it(m), rel=1e-9)
    assert [(mark.x, mark.y) for mark in source.marks] == [(0.0, 32.5)] and "32.5" in source.marks[0].text
    assert long_range.xscale == "linear"
    labels = {c.label for c in long_range.curves}
    assert labels == {"d=128, base 10000", "d=128, base 500000"}
    far = by_label(long_range, "d=128, base 500000")
    assert far.x[0] == 0 and far.x[-1] >= 32768 and far.y[0] == pytest.approx(32.5)
    # The larger base decays more slowly: its bound is the higher one on average at long range.
    near_base = by_label(long_range, "d=128, base 10000")
    assert far.y[far.x > 4096].mean() > near_base.y[near_base.x > 4096].mean()


def test_t5_figure_is_the_bucket_step_function_of_signed_distance():
    fig = _plots.t5_buckets()
    bidirectional, causal = fig.panels
    assert "32 buckets" in bidirectional.title and "max_distance 128" in bidirectional.title
    for panel, is_bidirectional in ((bidirectional, True), (causal, False)):
        (curve,) = panel.curves
        assert curve.style.get("drawstyle", "").startswith("steps")
        rel = curve.x
        assert rel.min() < -128 and rel.max() > 128 and np.array_equal(np.diff(rel), np.ones(rel.size - 1))
        expected = hf_t5_bucket(-rel, bidirectional=is_bidirectional, num_buckets=32, max_distance=128)  # T5's own, on key - query
        np.testing.assert_array_equal(curve.y, expected)
        assert {m.x for m in panel.marks if m.y is None} >= {-128.0, 128.0}
    # Every bucket is on the picture, the outer ones included (bidirectional bucket 16 would
    # be a future key at distance 0, which does not exist).
    assert set(bidirectional.curves[0].y.tolist()) == set(range(32)) - {16}
    assert set(causal.curves[0].y.tolist()) == set(range(32))
    causal_curve = causal.curves[0]
    assert (causal_curve.y[causal_curve.x <= 0] == 0).all()


def test_sinusoidal_heatmap_is_the_papers_formula():
    (panel,) = _plots.sinusoidal_heatmap().panels
    k = np.arange(256)[None, :]
    i = np.arange(64)[:, None]
    angle = k / 10000.0 ** (2 * i / 128)
    np.testing.assert_allclose(panel.image[0::2], np.sin(angle), atol=1e-12)
    np.testing.assert_allclose(panel.image[1::2], np.cos(angle), atol=1e-12)


def test_alibi_figure_is_minus_slope_times_distance_below_the_diagonal():
    (panel,) = _plots.alibi().panels
    i, j = np.indices((32, 32))
    slope = 2.0 ** (-8 / 8)  # head 1 of 8: 2^(-8h/n), h = 1
    assert "slope m = 0.5" in panel.title
    np.testing.assert_array_equal(np.isnan(panel.image), j > i)
    np.testing.assert_allclose(panel.image[j <= i], -slope * (i - j)[j <= i])


def test_scaling_figure_names_its_parameters_and_every_curve_is_visible():
    fig = _plots.scaling_curves()
    for words in ("dim 128", "base 10000", "factor 4", "original length 4096"):
        assert words in fig.title
    assert len(fig.panels) == 6
    names = [p.title.split("(")[0] for p in fig.panels]
    assert names == ["Linear", "NTK", "DynamicNTK", "YaRN", "Llama3", "LongRoPE"]
    theta = 10000.0 ** (-np.arange(64) * 2 / 128)
    for panel in fig.panels:
        assert "=4)" in panel.title or "1..4)" in panel.title
        unscaled, scaled = panel.curves
        np.testing.assert_allclose(unscaled.x, 2 * np.pi / theta)
        assert (unscaled.y == 1).all()
        # Visible: the scaled curve leaves the unscaled one by a clear margin and is drawn differently.
        assert np.abs(scaled.y - 1).max() > 0.5
        assert scaled.style != unscaled.style
        assert [m.x for m in panel.marks] == [4096.0]
    linear = fig.panels[0].curves[1]
    np.testing.assert_allclose(linear.y, 0.25)
    yarn = fig.panels[3]
    assert f"{0.1 * math.log(4.0) + 1:.4g}" in yarn.title
    assert yarn.curves[1].y[0] == pytest.approx(1.0) and yarn.curves[1].y[-1] == pytest.approx(0.25)


def test_layout_figure_pairs_channels_as_convert_layout_moves_them():
    (panel,) = _plots.rope_layouts().panels
    half, interleaved = panel.cell_labels
    assert half[:4] == ["0a", "1a", "2a", "3a"] and half[4:] == ["0b", "1b", "2b", "3b"]
    # convert_layout(half -> interleaved) puts half channel src[c] at interleaved channel c.
    src = pe.convert_layout(np.arange(8.0), "half", "interleaved").astype(int)
    assert [half[s] for s in src] == interleaved


def test_every_figure_draws(tmp_path):
    pytest.importorskip("matplotlib")
    paths = _plots.write_all(str(tmp_path), progress=lambda s: None)
    assert [p.rsplit("/", 1)[-1] for p in paths] == list(_plots.FIGURES)
