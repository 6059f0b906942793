"""Demo steps for the rotary family (see ``posenc._demo``)."""

import numpy as np

import posenc as pe
from posenc._demo import describe, step


def _x(a, shape, seed=0):
    return a.asarray(np.random.default_rng(seed).standard_normal(shape), a.float32)


@step("rope_frequencies + scalings")
def _frequencies(a):
    yarn = pe.scaling.YaRN(4.0, 4096)
    inv_freq, scale = pe.rope_frequencies(128, base=500000.0, scaling=yarn)
    return f"YaRN x4: inv_freq {inv_freq.shape} float64, attention_scale {scale:.4f}"


@step("rope_cos_sin + apply_rope")
def _apply(a):
    cos, sin = pe.rope_cos_sin(a.asarray(np.arange(16)), pe.rope_frequencies(64)[0])
    out = pe.apply_rope(_x(a, (2, 4, 16, 64)), cos, sin)
    return f"cos {describe(cos)} -> {describe(out)}"


@step("rope (one call, inverse)")
def _rope(a):
    x = _x(a, (2, 4, 16, 64))
    y = pe.rope(x, offset=1000, scaling=pe.scaling.Llama3(8.0, 8192))
    err = float(a.xp.max(a.xp.abs(pe.rope(y, offset=1000, scaling=pe.scaling.Llama3(8.0, 8192), inverse=True) - x)))
    return f"{describe(y)}; max |inverse(rope(x)) - x| = {err:.1e}"


@step("scaling.from_hf")
def _from_hf(a):
    cfg = pe.scaling.from_hf({"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6}, head_dim=128)
    return f"{cfg.scaling}, base {cfg.base:g}, rotary_dim {cfg.rotary_dim}"


@step("rerotate (KV-cache shift)")
def _rerotate(a):
    x = _x(a, (16, 64))
    cached = pe.rope(x, a.asarray(np.arange(16)))
    shifted = pe.rerotate(cached, -4, pe.rope_frequencies(64)[0])
    err = float(a.xp.max(a.xp.abs(shifted - pe.rope(x, a.asarray(np.arange(16) - 4)))))
    return f"{describe(shifted)}; equals rope at positions - 4 within {err:.1e}"


@step("convert_layout, permute_qk")
def _layouts(a):
    x = pe.convert_layout(_x(a, (16, 64)), "half", "interleaved")
    w = pe.permute_qk_weight(_x(a, (4 * 64, 256)), "interleaved", "half", head_dim=64)
    return f"activations {describe(x)}; weight {describe(w)}"


@step("positions (mask, cu_seqlens)")
def _positions(a):
    mask = a.asarray(np.array([[0, 0, 1, 1, 1], [1, 1, 1, 1, 0]]))
    by_mask = pe.positions_from_mask(mask)
    packed = pe.positions_from_cu_seqlens(a.asarray(np.array([0, 3, 5])), 5)
    return f"left/right padding -> {[[int(v) for v in by_mask[r, :]] for r in range(by_mask.shape[0])]}; packed {[int(v) for v in packed]}"


@step("rope_decay")
def _decay(a):
    d = pe.rope_decay(a.asarray(np.array([0.0, 16.0, 256.0]), a.float32), 128)
    return f"bound at distances 0, 16, 256: {[round(float(v), 2) for v in d]}"


@step("linear_attention (causal)")
def _linear(a):
    q, k, v = (_x(a, (2, 32, 16), seed) for seed in (1, 2, 3))
    out = pe.linear_attention(q, k, v, positions=a.asarray(np.arange(32)), causal=True)
    return f"{describe(out)} without a 32 x 32 matrix"


@step("xpos_scale")
def _xpos(a):
    s = pe.xpos_scale(a.asarray(np.arange(-8, 8)), 64)
    return f"{describe(s)}; scale in [{float(a.xp.min(s)):.3f}, {float(a.xp.max(s)):.3f}]"


@step("axial_rope (2-D grid)")
def _axial(a):
    rows, cols = np.meshgrid(np.arange(4), np.arange(4), indexing="ij")
    grid = a.asarray(np.stack([rows.ravel(), cols.ravel()], axis=-1))
    out = pe.axial_rope(_x(a, (2, 16, 64)), grid)
    return f"4 x 4 patches, 32 channels per axis -> {describe(out)}"
