"""Rotary relatives: re-rotation, layout conversion, positions, decay, linear attention,
xPos and axial RoPE, each against a direct transcription of its definition (bad input:
test_bad_inputs.py)."""

from __future__ import annotations

import numpy as np
import pytest

import posenc as pe
from arrays import assert_close, assert_kind
from formulas import exact_rope, inv_freq

FLOATS = ["float32", "float64"]


# --- rerotate ---------------------------------------------------------------------------


def test_rerotate_shifts_a_cache(backend, rng):
    x = backend.asarray(rng.standard_normal((2, 5, 16)), dtype="float32")
    pos = backend.asarray(np.arange(5))
    frequencies, _ = pe.rope_frequencies(16)
    # drop three tokens from the front
    shifted = backend.call(lambda a, p: pe.rerotate(pe.rope(a, p), -3, frequencies), x, pos)
    want = backend.to_numpy(pe.rope(x, backend.asarray(np.arange(5) - 3)))
    assert_close(shifted, want, backend=backend, dtype="float32", atol=2e-6)


def test_rerotate_moves_keys_to_a_new_frequency_set(backend, rng):
    dyn = pe.scaling.DynamicNTK(4.0, 64)
    old, _ = pe.rope_frequencies(16, scaling=dyn, seq_len=10)
    new, _ = pe.rope_frequencies(16, scaling=dyn, seq_len=1000)
    x = backend.asarray(rng.standard_normal((7, 16)))
    pos = backend.asarray(np.arange(300, 307))
    moved = backend.call(lambda a, p: pe.rerotate(pe.rope(a, p, scaling=dyn, seq_len=10), p, old, new_inv_freq=new), x, pos)
    want = backend.to_numpy(pe.rope(x, pos, scaling=dyn, seq_len=1000))
    assert_close(moved, want, backend=backend, atol=1e-5, rtol=1e-5)


# --- convert_layout / permute_qk_weight ------------------------------------------------------


@pytest.mark.parametrize("src, dst", [("half", "interleaved"), ("interleaved", "half")])
def test_rotating_converted_equals_converting_rotated(backend, rng, src, dst):
    x = backend.asarray(rng.standard_normal((3, 6, 12)), dtype="float32")
    converted_then_rotated = backend.call(lambda a: pe.rope(pe.convert_layout(a, src, dst, rotary_dim=8), layout=dst, rotary_dim=8), x)
    rotated_then_converted = pe.convert_layout(pe.rope(x, layout=src, rotary_dim=8), src, dst, rotary_dim=8)
    assert_close(converted_then_rotated, backend.to_numpy(rotated_then_converted), backend=backend, dtype="float32")
    back = backend.call(lambda a: pe.convert_layout(pe.convert_layout(a, src, dst), dst, src), x)
    assert_close(back, backend.to_numpy(x), backend=backend, rtol=0, atol=0)


def test_permute_qk_weight_matches_the_llama_conversion_script(rng):
    # Meta (interleaved) -> HF (half): w.view(heads, d/2, 2, in).transpose(1, 2).reshape(out, in)
    heads, head_dim, hidden = 3, 8, 5
    w = rng.standard_normal((heads * head_dim, hidden))
    want = w.reshape(heads, head_dim // 2, 2, hidden).transpose(0, 2, 1, 3).reshape(heads * head_dim, hidden)
    np.testing.assert_array_equal(pe.permute_qk_weight(w, "interleaved", "half", head_dim=head_dim), want)
    np.testing.assert_array_equal(pe.permute_qk_weight(want, "half", "interleaved", head_dim=head_dim), w)


def test_permuted_weights_give_the_same_attention_scores(backend, rng):
    heads, head_dim, hidden, seq = 2, 8, 6, 5
    wq, wk = (rng.standard_normal((heads * head_dim, hidden)) for _ in range(2))
    tokens = backend.asarray(rng.standard_normal((seq, hidden)))
    xp = backend.xp

    def scores(wq, wk, layout):
        q = xp.reshape(tokens @ xp.matrix_transpose(wq), (seq, heads, head_dim))
        k = xp.reshape(tokens @ xp.matrix_transpose(wk), (seq, heads, head_dim))
        q, k = pe.rope(q, seq_axis=0, layout=layout), pe.rope(k, seq_axis=0, layout=layout)
        return xp.sum(q[:, None, ...] * k[None, ...], axis=-1)  # [q_seq, k_seq, heads]

    half = scores(backend.asarray(wq), backend.asarray(wk), "half")
    permuted = backend.call(lambda *w: tuple(pe.permute_qk_weight(a, "half", "interleaved", head_dim=head_dim) for a in w), backend.asarray(wq), backend.asarray(wk))
    interleaved = scores(*permuted, "interleaved")
    assert_close(interleaved, backend.to_numpy(half), backend=backend, atol=1e-5, rtol=1e-5)


# --- positions ----------------------------------------------------------------------------


def test_positions_from_mask_left_and_right_padding(backend):
    mask = np.array([[0, 0, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 1, 0, 1]])
    want = np.zeros(mask.shape, dtype=np.int64)
    for b, row in enumerate(mask):  # transcription: count tokens, padding at 0
        count = 0
        for t, m in enumerate(row):
            if m:
                want[b, t] = 2 + count
                count += 1
    for m in (backend.asarray(mask), backend.asarray(mask.astype(bool))):
        for got in backend.each_run(backend.call(lambda a: pe.positions_from_mask(a, start=2), m)):
            assert_kind(got, backend=backend, shape=want.shape)
            assert backend.xp.isdtype(got.dtype, "integral")
            np.testing.assert_array_equal(backend.to_numpy(got), want)


def test_positions_from_mask_refuses_a_start_past_the_index_dtype():
    """The last token's position ``start + seq - 1`` must fit in int64: it had wrapped
    silently to -2**63 (the bound was read as ``not a and b``)."""
    mask = np.ones((1, 5), dtype=bool)
    assert pe.positions_from_mask(mask, start=2**63 - 5).tolist() == [[2**63 - 5 + t for t in range(5)]]
    with pytest.raises(ValueError, match="start \\+ the positions of 5 tokens must stay within int64"):
        pe.positions_from_mask(mask, start=2**63 - 4)
    with pytest.raises(ValueError, match="start \\+ the positions of 5 tokens must stay within int64"):
        pe.positions_from_mask(mask, start=-(2**63))


def test_positions_from_mask_refuses_a_traced_start_for_its_range_check():
    """A traced ``start`` (under ``jax.jit``) cannot be checked against the index dtype's range
    before any work: refused by name, with the static-argument hint (the message had said it
    sets a shape, which it does not); static, it gives the positions."""
    jax = pytest.importorskip("jax")
    mask = np.ones((2, 5), dtype=bool)
    with pytest.raises(TypeError, match=r"start must be a concrete integer here \(its value is read before any work.*static_argnames"):
        jax.jit(lambda s: pe.positions_from_mask(mask, start=s))(3)
    got = jax.jit(lambda s: pe.positions_from_mask(mask, start=s), static_argnums=0)(3)
    np.testing.assert_array_equal(np.asarray(got), np.arange(3, 8)[None].repeat(2, 0))


def test_positions_from_cu_seqlens(backend):
    cu = np.array([0, 3, 3, 7, 8])
    want = np.concatenate([np.arange(n) for n in np.diff(cu)])
    for got in backend.each_run(backend.call(lambda c: pe.positions_from_cu_seqlens(c, 8, check_traced=False), backend.asarray(cu))):
        assert_kind(got, backend=backend, shape=want.shape)
        np.testing.assert_array_equal(backend.to_numpy(got), want)


# --- rope_decay -----------------------------------------------------------------------------


def decay_formula(distances, dim, base=10000.0):
    theta = inv_freq(dim, base)
    out = []
    for m in np.asarray(distances, dtype=np.float64).ravel():
        partial = np.cumsum(np.exp(1j * m * theta))  # S_1 .. S_{d/2}
        out.append(2.0 / dim * np.abs(partial).sum())
    return np.array(out).reshape(np.shape(distances))


@pytest.mark.parametrize("dtype", FLOATS)
def test_rope_decay_matches_formula(backend, dtype):
    m = np.array([0.0, 1.0, 5.5, 64.0, 1000.0])
    got = backend.call(lambda a: pe.rope_decay(a, 64), backend.asarray(m, dtype=dtype))
    assert_close(got, decay_formula(m, 64), backend=backend, dtype=dtype, rtol=1e-5, atol=1e-5)


def test_rope_decay_refuses_what_its_work_would_not_fit(monkeypatch):
    """Six float64 ``[n, dim / 2]`` arrays live at once (1 GiB of them was measured 6.0 GiB at
    the peak): the check counts them all. It had counted one, so ``plot decay --dim 10**6``
    (2000 distances) passed it and was killed for memory at 24 GB."""
    from posenc import _validate

    monkeypatch.setattr(_validate, "_memory_limit", lambda: 2**30)
    with pytest.raises(ValueError, match=r"rope_decay of shape \(200, 524288\) needs 4\.7 GiB"):
        pe.rope_decay(np.arange(200.0), 2**20)
    with pytest.raises(ValueError, match=r"rope_decay of shape \(200, 524288\) needs 4\.7 GiB"):
        pe.rope_decay(200, 2**20)
    assert pe.rope_decay(np.arange(4.0), 2**10).shape == (4,)


def test_rope_decay_of_a_count_in_every_namespace(backend):
    got = backend.call(lambda: pe.rope_decay(4, 8, xp=backend.xp))  # distances 0, 1, 2, 3
    assert_close(got, decay_formula(np.arange(4), 8), backend=backend, dtype="float32", rtol=1e-5, atol=1e-5)


def test_rope_decay_of_some_distances_is_their_entries_of_the_whole_call(backend):
    """Each distance's bound has the bits of its entry in a call of more distances (XLA's sum
    over the pairs had rounded by the array's size: 13 of 23 float32 entries an ulp off)."""
    m = np.arange(3000)
    whole = backend.call(lambda a: pe.rope_decay(a, 64), backend.asarray(m))
    for start, stop in ((0, 1), (777, 800), (2999, 3000)):
        part = backend.call(lambda a: pe.rope_decay(a, 64), backend.asarray(m[start:stop]))
        for got, want in zip(backend.each_run(part), backend.each_run(whole)):
            np.testing.assert_array_equal(backend.to_numpy(got), backend.to_numpy(want)[start:stop])


@pytest.mark.parametrize("dim", [2, 8, 128])
def test_rope_decay_at_distance_zero(dim):
    assert float(pe.rope_decay(1, dim, dtype=np.float64)[0]) == pytest.approx((dim / 2 + 1) / 2, rel=1e-14)


# --- linear_attention ------------------------------------------------------------------------


def linear_attention_formula(q, k, v, qpos=None, kpos=None, causal=False):
    """Naive O(n^2) transcription of RoFormer eq. 29 with phi = elu + 1."""
    def phi(a):
        return np.where(a > 0, a + 1.0, np.exp(np.minimum(a, 0.0)))

    fq, fk = phi(q), phi(k)
    if qpos is not None:
        rq, rk = exact_rope(fq, qpos), exact_rope(fk, kpos)
    else:
        rq, rk = fq, fk
    n, m = q.shape[-2], k.shape[-2]
    out = np.zeros(q.shape[:-1] + (v.shape[-1],))
    for i in range(n):
        num = np.zeros(q.shape[:-2] + (v.shape[-1],))
        den = np.zeros(q.shape[:-2])
        for j in range(m):
            if causal and j > m - n + i:  # (the queries are the last n keys)
                continue
            num += np.sum(rq[..., i, :] * rk[..., j, :], -1)[..., None] * v[..., j, :]
            den += np.sum(fq[..., i, :] * fk[..., j, :], -1)
        out[..., i, :] = num / den[..., None]
    return out


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("with_rope", [False, True])
def test_linear_attention_matches_naive(backend, rng, causal, with_rope):
    q, k, v = (rng.standard_normal((2, 6, 8)) for _ in range(3))
    pos = np.arange(6) + 3
    arrays = [backend.asarray(a, dtype="float32") for a in (q, k, v)] + ([backend.asarray(pos)] if with_rope else [])
    got = backend.call(lambda q, k, v, *p: pe.linear_attention(q, k, v, positions=p[0] if p else None, causal=causal), *arrays)
    want = linear_attention_formula(q, k, v, pos if with_rope else None, pos if with_rope else None, causal)
    assert_close(got, want, backend=backend, dtype="float32", atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("with_rope", [False, True])
def test_linear_attention_causal_queries_are_the_last_keys(rng, with_rope):
    """As every causal mask in posenc (pe.attention, flash-attention): a chunk of queries, or
    a decode step's one query, sits at the end of the keys and gives the full call's rows."""
    q, k, v = rng.standard_normal((2, 6, 8)), rng.standard_normal((2, 6, 8)), rng.standard_normal((2, 6, 3))
    pos = np.arange(6) + 3
    full = pe.linear_attention(q, k, v, positions=pos if with_rope else None, causal=True)
    for n in (1, 4):
        part = pe.linear_attention(q[:, -n:], k, v, positions=(pos[-n:], pos) if with_rope else None, causal=True)
        np.testing.assert_allclose(part, full[:, -n:], rtol=1e-12, atol=1e-12)
        want = linear_attention_formula(q[:, -n:], k, v, pos[-n:] if with_rope else None, pos if with_rope else None, causal=True)
        np.testing.assert_allclose(part, want, rtol=1e-10, atol=1e-12)
    with pytest.raises(ValueError, match="at most as many queries as keys"):
        pe.linear_attention(q, k[:, :5], v[:, :5], causal=True)


@pytest.mark.parametrize("library", ["numpy", "torch"])
@pytest.mark.parametrize("causal", [False, True])
def test_linear_attention_does_not_depend_on_the_memory_layout_of_q_and_k(rng, library, causal):
    """The sums over the features (the normaliser's, and the causal numerator's) add their
    terms in one order: a Fortran-ordered or transposed q (the same values), or k when
    causal, gave other bits where the sums followed the operands' memory layout (1.8e-7
    apart in float32, torch causal; 1.2e-7 NumPy). (Without a mask the sums over the keys,
    ``k^T v`` and ``sum_j phi(k_j)``, are the library's matmul and sum, as documented.)"""
    q, k, v = (rng.standard_normal((3, 2, 9, 8)).astype(np.float32) for _ in range(3))

    def layouts(a):
        if library == "numpy":
            return [a, np.asfortranarray(a), np.swapaxes(np.swapaxes(a, -1, -2).copy(), -1, -2)]
        torch = pytest.importorskip("torch")
        t = torch.from_numpy(a)
        return [t, t.permute(3, 2, 1, 0).contiguous().permute(3, 2, 1, 0), t.mT.contiguous().mT]

    qs, ks, (v, *_) = layouts(q), layouts(k), layouts(v)
    want = np.asarray(pe.linear_attention(qs[0], ks[0], v, causal=causal))
    for q_layout in qs[1:]:
        np.testing.assert_array_equal(np.asarray(pe.linear_attention(q_layout, ks[0], v, causal=causal)), want)
    for k_layout in ks[1:] if causal else ():
        np.testing.assert_array_equal(np.asarray(pe.linear_attention(qs[0], k_layout, v, causal=causal)), want)


def test_linear_attention_cross_positions_and_callable_feature_map(rng):
    q, k, v = rng.standard_normal((4, 8)), rng.standard_normal((6, 8)), rng.standard_normal((6, 3))
    qpos, kpos = np.arange(4) + 2, np.arange(6)
    got = pe.linear_attention(q, k, v, positions=(qpos, kpos))
    np.testing.assert_allclose(got, linear_attention_formula(q, k, v, qpos, kpos), atol=1e-12)
    relu1 = pe.linear_attention(q, k, v, feature_map=lambda a: np.maximum(a, 0.0) + 1.0)
    fq, fk = np.maximum(q, 0) + 1, np.maximum(k, 0) + 1
    np.testing.assert_allclose(relu1, (fq @ fk.T @ v) / (fq @ fk.sum(0))[:, None], atol=1e-12)


def test_linear_attention_eps_as_katharopoulos_and_no_keys_give_zeros(rng):
    """``eps`` is added to the denominator (fast-transformers' ``1 / (phi(Q) . sum phi(K) + eps)``):
    a ReLU feature map's all-zero query row is then 0, not 0/0; no keys at all give zeros,
    as ``pe.attention`` does (both had been NaN)."""
    q, k, v = rng.standard_normal((4, 8)), rng.standard_normal((6, 8)), rng.standard_normal((6, 3))
    q[1] = -1.0  # every feature of row 1 is 0 under ReLU
    relu = lambda a: np.maximum(a, 0.0)  # noqa: E731
    got = pe.linear_attention(q, k, v, feature_map=relu, eps=1e-6)
    fq, fk = relu(q), relu(k)
    np.testing.assert_allclose(got, (fq @ fk.T @ v) / (fq @ fk.sum(0) + 1e-6)[:, None], rtol=1e-12, atol=0)
    assert np.all(got[1] == 0)
    with np.errstate(invalid="ignore"):
        assert np.isnan(pe.linear_attention(q, k, v, feature_map=relu)[1]).all()  # (eps=0: undefined, as documented)
    for causal in (False, True):
        empty = pe.linear_attention(np.ones((0, 8)) if causal else q, np.ones((0, 8)), np.ones((0, 3)), causal=causal)
        np.testing.assert_array_equal(empty, np.zeros((0 if causal else 4, 3)))
    with pytest.raises(ValueError, match="eps must be >= 0"):
        pe.linear_attention(q, k, v, eps=-1.0)


# --- xPos -------------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_xpos_scale_matches_torchscale_formula(backend, layout):
    dim, pos = 16, np.array([-300, -1, 0, 7, 511])
    zeta = (np.arange(0, dim, 2) + 0.4 * dim) / (1.4 * dim)  # torchscale's XPOS buffer
    scale = zeta[None, :] ** (pos[:, None] / 512)
    want = np.concatenate([scale, scale], -1) if layout == "half" else np.repeat(scale, 2, axis=-1)
    got = backend.call(lambda p: pe.xpos_scale(p, dim, layout=layout), backend.asarray(pos))
    assert_close(got, want, backend=backend, dtype="float32")


def test_xpos_scores_decay_with_relative_distance_only(rng):
    q, k = rng.standard_normal((2, 16))

    def score(m, n):
        qm = pe.rope(q, np.array(float(m))) * pe.xpos_scale(np.array(float(m)), 16)
        kn = pe.rope(k, np.array(float(n))) / pe.xpos_scale(np.array(float(n)), 16)
        return float(qm @ kn)

    assert score(10, 4) == pytest.approx(score(110, 104), rel=1e-9)
    # per pair the factor is zeta_i ** ((m - n) / 512)
    zeta = (np.arange(8) * 2 / 16 + 0.4) / 1.4
    x = np.zeros(16); x[0] = 1.0
    got = float((x * pe.xpos_scale(np.array(40.0), 16)) @ (x / pe.xpos_scale(np.array(0.0), 16)))
    assert got == pytest.approx(zeta[0] ** (40 / 512), rel=1e-12)


@pytest.mark.parametrize("xp_name", ["numpy", "torch"])
def test_float64_xpos_scale_is_as_exact_at_a_million_as_at_ten(xp_name):
    """``zeta_i ** (m / gamma)``, ``zeta_i = (2i/d + 0.4) / 1.4``, against mpmath: within two
    float64 ulps at every position. The float64 ``exp(m / gamma * ln(zeta))`` was off by about
    ``|m ln(zeta) / gamma|`` ulps: 6 at ``m = 10``, 334 at ``10**5``, 5,560 at ``10**6``."""
    mpmath = pytest.importorskip("mpmath")
    xp = pytest.importorskip(xp_name)
    dim, pos = 16, [10, -1000, 10**5, -2 * 10**5, 10**6, 10**7]
    with mpmath.workdps(40):
        zeta = [(mpmath.mpf(2 * i) / dim + mpmath.mpf("0.4")) / mpmath.mpf("1.4") for i in range(dim // 2)]
        want = np.array([[float(z ** (mpmath.mpf(m) / 512)) for z in zeta] for m in pos])
    got = np.asarray(pe.xpos_scale(xp.asarray(np.array(pos, dtype=np.float64)), dim))[:, : dim // 2]
    normal = want >= np.finfo(np.float64).tiny
    assert normal.sum() >= 30  # (at 10**7 the low zetas underflow)
    assert (np.abs(got - want)[normal] <= 2 * np.spacing(want[normal])).all()


def test_xpos_scale_of_huge_positions_without_float64_is_zero_or_infinite():
    """Past exp's range the power is 0 (``m > 0``) or inf (``m < 0``); without float64 the
    double-float exponent of a float32 position past about ``8e34`` overflowed its split
    and gave NaN (and -0.0 at ``1e30``)."""
    strict = pytest.importorskip("array_api_strict")
    positions = strict.asarray(np.array([1e30, 1e35, 3e38, -1e35], dtype=np.float32), device=strict.Device("no_float64"))
    with np.errstate(over="ignore"):  # (exp's overflow to inf, the power's value)
        got = np.asarray(pe.xpos_scale(positions, 4)._array)
    assert got.tolist() == [[0.0] * 4] * 3 + [[np.inf] * 4]
    assert not np.signbit(got).any()


# --- axial RoPE -------------------------------------------------------------------------------


def _grid(h, w):
    rows, cols = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
    return np.stack([rows.ravel(), cols.ravel()], axis=-1)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_axial_rope_is_1d_rope_per_axis(backend, rng, layout):
    grid = _grid(3, 4)
    x_np = rng.standard_normal((2, 12, 14))
    x = backend.asarray(x_np, dtype="float32")
    got = backend.call(lambda a, g: pe.axial_rope(a, g, axes_dims=(8, 4), layout=layout, base=100.0), x, backend.asarray(grid))
    xr = backend.to_numpy(x)
    parts = [
        backend.to_numpy(pe.rope(backend.asarray(xr[..., :8]), backend.asarray(grid[:, 0]), layout=layout, base=100.0)),
        backend.to_numpy(pe.rope(backend.asarray(xr[..., 8:12]), backend.asarray(grid[:, 1]), layout=layout, base=100.0)),
        xr[..., 12:],
    ]
    assert_close(got, np.concatenate(parts, -1), backend=backend, dtype="float32")


def test_axial_rope_scores_are_relative_per_axis(rng):
    q, k = rng.standard_normal((2, 12))

    def score(pq, pk):
        return float(pe.axial_rope(q, np.array(pq)) @ pe.axial_rope(k, np.array(pk)))

    assert score([3, 5], [1, 2]) == pytest.approx(score([13, 7], [11, 4]), rel=1e-10)
    assert score([3, 5], [1, 2]) != pytest.approx(score([3, 6], [1, 2]), rel=1e-6)
    y = pe.axial_rope(q, np.array([2, 7]))
    back = pe.axial_rope(y, np.array([2, 7]), inverse=True)
    np.testing.assert_allclose(back, q, atol=1e-12)


def test_axial_rope_video_grid_and_out(rng):
    grid = np.stack(np.meshgrid(np.arange(2), np.arange(2), np.arange(3), indexing="ij"), -1).reshape(-1, 3)
    x = rng.standard_normal((4, 12, 12))  # [heads, tokens, d]: 4 channels per axis
    out = np.empty_like(x)
    result = pe.axial_rope(x, grid, out=out)
    assert result is out
    np.testing.assert_allclose(out[..., 4:8], pe.rope(x[..., 4:8], grid[:, 1]), atol=1e-12)


# --- mrope_cos_sin (Qwen2-VL's multimodal RoPE) -------------------------------------------------


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_mrope_cos_sin_formula(backend, layout, rng):
    sections = [2, 0, 3, 1]
    ids = rng.integers(0, 5000, (4, 2, 5))
    frequencies = pe.rope_frequencies(12, base=1000.0)[0]
    cos, sin = backend.call(lambda i: pe.mrope_cos_sin(i, frequencies, sections, layout=layout, scale=0.5), backend.asarray(ids))
    axis = np.repeat(np.arange(4), sections)  # the position axis of each frequency pair
    angle = ids[axis, :, :].transpose(1, 2, 0) * frequencies  # [2, 5, 6]: pair i turns with ids[axis[i]]
    dup = (lambda t: np.concatenate([t, t], -1)) if layout == "half" else (lambda t: np.repeat(t, 2, -1))
    assert_close(cos, 0.5 * dup(np.cos(angle)), backend=backend, dtype="float32")
    assert_close(sin, 0.5 * dup(np.sin(angle)), backend=backend, dtype="float32")


def test_xdrope_cos_sin_formula(backend, rng):
    sections = [2, 1, 2, 1]  # sum to r/2 = 6: the doubled table's 12 entries go 4, 2, 4, 2 to the axes
    ids = rng.integers(0, 5000, (4, 2, 5))
    frequencies = pe.rope_frequencies(12, base=1000.0)[0]
    cos, sin = backend.call(lambda i: pe.xdrope_cos_sin(i, frequencies, sections, scale=0.5), backend.asarray(ids))
    axis = np.repeat(np.arange(4), 2 * np.array(sections))  # the position axis of each entry
    angle = ids[axis, :, :].transpose(1, 2, 0) * np.tile(frequencies, 2)  # entry e turns at theta_(e mod 6)
    assert_close(cos, 0.5 * np.cos(angle), backend=backend, dtype="float32")
    assert_close(sin, 0.5 * np.sin(angle), backend=backend, dtype="float32")


def test_mrope_cos_sin_of_text_tokens_is_rope_cos_sin(rng):
    ids = np.arange(7)
    frequencies = pe.rope_frequencies(16)[0]
    got = pe.mrope_cos_sin(np.stack([ids] * 3), frequencies, [2, 3, 3], dtype=np.float64)
    for g, w in zip(got, pe.rope_cos_sin(ids, frequencies, dtype=np.float64)):
        np.testing.assert_array_equal(g, w)


def test_mrope_cos_sin_equals_qwen2_vl(rng):
    torch = pytest.importorskip("torch")
    qwen2_vl = pytest.importorskip("transformers.models.qwen2_vl.modeling_qwen2_vl")
    config = qwen2_vl.Qwen2VLTextConfig(
        hidden_size=64, num_attention_heads=4, rope_parameters={"rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 1000.0}
    )
    theirs = qwen2_vl.Qwen2VLRotaryEmbedding(config)
    ids = torch.as_tensor(rng.integers(0, 200, (3, 2, 9)))  # temporal, height, width ids
    want_cos, want_sin = theirs(torch.zeros(1), ids)
    cos, sin = pe.mrope_cos_sin(ids, theirs.inv_freq.double().numpy(), [2, 3, 3])
    # transformers' float32 angles: a few ulps of the largest angle (200 rad)
    torch.testing.assert_close(cos, want_cos, atol=4e-5, rtol=0)
    torch.testing.assert_close(sin, want_sin, atol=4e-5, rtol=0)


def _interleaved_axes(sections, pairs):
    """Qwen3-VL's assignment, written from its ``recomposition_frequencies``: start from axis 0
    everywhere, then axis a in (1, 2) takes indices a, a + 3, ... below 3 * sections[a]."""
    axis = np.zeros(pairs, dtype=int)
    for a in (1, 2):
        axis[a : 3 * sections[a] : 3] = a
    return axis


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_mrope_cos_sin_interleaved_formula(backend, layout, rng):
    sections = [4, 3, 3]
    ids = rng.integers(0, 5000, (3, 2, 5))
    frequencies = pe.rope_frequencies(20, base=1000.0)[0]
    cos, sin = backend.call(
        lambda i: pe.mrope_cos_sin(i, frequencies, sections, interleaved=True, layout=layout), backend.asarray(ids)
    )
    axis = _interleaved_axes(sections, 10)
    angle = ids[axis, :, :].transpose(1, 2, 0) * frequencies
    dup = (lambda t: np.concatenate([t, t], -1)) if layout == "half" else (lambda t: np.repeat(t, 2, -1))
    assert_close(cos, dup(np.cos(angle)), backend=backend, dtype="float32")
    assert_close(sin, dup(np.sin(angle)), backend=backend, dtype="float32")


@pytest.mark.parametrize(
    "sections, head_dim",
    # Qwen3-VL's own kind of sections; and Qwen2-VL's [16, 24, 24] dealt over 64 pairs, which
    # run past the pairs: transformers gives height and width the 21 pairs below 64 of their
    # turns, temporal the other 22 (vLLM's slicing is the same; posenc used to refuse them).
    [([6, 5, 5], 32), ([16, 24, 24], 128)],
)
def test_mrope_cos_sin_interleaved_equals_qwen3_vl(sections, head_dim, rng):
    torch = pytest.importorskip("torch")
    qwen3_vl = pytest.importorskip("transformers.models.qwen3_vl.modeling_qwen3_vl")
    config = qwen3_vl.Qwen3VLTextConfig(
        hidden_size=4 * head_dim, num_attention_heads=4, head_dim=head_dim,
        rope_parameters={"rope_type": "default", "mrope_section": sections, "rope_theta": 1000.0},
    )  # fmt: skip
    theirs = qwen3_vl.Qwen3VLTextRotaryEmbedding(config)
    ids = torch.as_tensor(rng.integers(0, 200, (3, 2, 9)))
    want_cos, want_sin = theirs(torch.zeros(1), ids)
    cos, sin = pe.mrope_cos_sin(ids, theirs.inv_freq.double().numpy(), sections, interleaved=True)
    torch.testing.assert_close(cos, want_cos, atol=4e-5, rtol=0)
    torch.testing.assert_close(sin, want_sin, atol=4e-5, rtol=0)
    # the consecutive order is a different table: the option matters
    plain, _ = pe.mrope_cos_sin(ids, theirs.inv_freq.double().numpy(), sections)
    assert (plain - want_cos).abs().max() > 0.1


def test_mrope_cos_sin_interleaved_pair_counts_and_option_type():
    assert np.bincount(_interleaved_axes([16, 24, 24], 64)).tolist() == [22, 21, 21]
    with pytest.raises(TypeError, match="interleaved"):
        pe.mrope_cos_sin(np.zeros((3, 4), dtype=int), [1.0] * 8, [4, 2, 2], interleaved=1)


# --- axial_rope's "pixel" frequencies (rotary-embedding-torch) -----------------------------------


def test_axial_frequencies_pixel_formula():
    np.testing.assert_allclose(pe.axial_frequencies(8, frequencies="pixel", max_freq=12.0), np.pi * np.array([1.0, 2.6666666666666665, 4.333333333333333, 6.0]))
    np.testing.assert_array_equal(pe.axial_frequencies(8), 10000.0 ** (-np.arange(0, 8, 2) / 8))
    with pytest.raises(ValueError, match="frequencies"):
        pe.axial_frequencies(8, frequencies="pixels")
    with pytest.raises(ValueError, match="max_freq"):
        pe.axial_frequencies(8, frequencies="pixel", max_freq=0.0)


def test_axial_rope_pixel_equals_rotary_embedding_torch(rng):
    torch = pytest.importorskip("torch")
    ret = pytest.importorskip("rotary_embedding_torch")
    height, width, block = 5, 7, 16
    theirs = ret.RotaryEmbedding(dim=block, freqs_for="pixel", max_freq=12.0)
    freqs = theirs.get_axial_freqs(height, width)  # [H, W, 2 * block], interleaved pairs
    x = torch.as_tensor(rng.standard_normal((2, height, width, 2 * block)), dtype=torch.float32)
    want = ret.apply_rotary_emb(freqs, x)
    rows, cols = np.meshgrid(np.linspace(-1, 1, height), np.linspace(-1, 1, width), indexing="ij")
    grid = torch.as_tensor(np.stack([rows, cols], axis=-1))  # [H, W, 2] coordinates in [-1, 1]
    got = pe.axial_rope(x, grid, frequencies="pixel", max_freq=12.0, layout="interleaved")
    # their angles are float32 products (pi * 6 at most): a few float32 ulps
    torch.testing.assert_close(got, want, atol=3e-6, rtol=1e-5)


def test_axial_rope_places_a_grid_per_image_on_the_batch_axes(rng):
    """A grid per image ``[batch, N, A]`` on ``x [batch, heads, N, d]`` rotates each image's
    rows by its own grid, as ``rope`` places ``[batch, seq]`` positions (it had broadcast
    against ``[heads, N]``: refused for ``batch != heads``, head by head for ``batch ==
    heads``); where both readings fit it is refused, and ``grid[:, None]`` says which."""
    n = 4
    grid = np.stack([np.stack([np.arange(n), 2 * np.arange(n)], -1), np.stack([np.arange(n) + 50, np.arange(n) + 70], -1)])
    x = rng.standard_normal((2, 3, n, 8))
    per_image = np.stack([pe.axial_rope(x[b], grid[b]) for b in range(2)])
    np.testing.assert_array_equal(pe.axial_rope(x, grid), per_image)
    square = rng.standard_normal((2, 2, n, 8))  # batch == heads
    with pytest.raises(ValueError, match=r"grid\[:, None\]"):
        pe.axial_rope(square, grid)
    np.testing.assert_array_equal(pe.axial_rope(square, grid[:, None]), np.stack([pe.axial_rope(square[b], grid[b]) for b in range(2)]))
    image = rng.standard_normal((2, 3, 5, 8))  # [batch, H, W, d] with an [H, W, 2] grid: the trailing token axes
    rows, cols = np.meshgrid(np.arange(3), np.arange(5), indexing="ij")
    np.testing.assert_array_equal(pe.axial_rope(image, np.stack([rows, cols], -1)), pe.axial_rope(image, np.stack([rows, cols], -1)[None]))


def test_axial_rope_pixel_formula(backend, rng):
    x = rng.standard_normal((6, 12))
    grid = np.stack(np.meshgrid(np.linspace(-1, 1, 2), np.linspace(-1, 1, 3), indexing="ij"), axis=-1).reshape(6, 2)
    got = backend.call(lambda a, g: pe.axial_rope(a, g, frequencies="pixel", max_freq=8.0), backend.asarray(x), backend.asarray(grid))
    want = []
    for a, block in enumerate((x[:, :6], x[:, 6:])):
        theta = np.pi * np.linspace(1.0, 4.0, 3)  # linspace(1, max_freq / 2, d / 2) * pi
        angle = grid[:, a, None] * theta
        c, s = np.cos(angle), np.sin(angle)
        lo, hi = block[:, :3], block[:, 3:]
        want.append(np.concatenate([lo * c - hi * s, hi * c + lo * s], axis=-1))
    assert_close(got, np.concatenate(want, axis=-1), backend=backend, dtype="float64")
    inv = backend.call(lambda: pe.axial_frequencies(6, frequencies="pixel", max_freq=8.0, xp=backend.xp, dtype=backend.xp.float32))
    assert_close(inv, np.pi * np.linspace(1.0, 4.0, 3), backend=backend, dtype="float32")


def test_int32_positions_on_a_device_without_64_bit_integers():
    """array-api-strict's ``no_x64`` device (no int64, as JAX without x64): int32 positions
    are widened to that device's index dtype (int32), not the default device's int64, and
    each function's values are NumPy's. Per-row offsets and lengths too (they were widened
    to int64, which that device refuses), and the searches of document and bucket boundaries."""
    strict = pytest.importorskip("array_api_strict")
    device = strict.Device("no_x64")
    pos, inv_freq = np.arange(5, dtype=np.int32) + 1000, pe.rope_frequencies(8)[0]
    mask = np.array([[0, 1, 1, 0, 1]], np.int32)
    rows = np.array([3, 900], np.int32)
    on = lambda a: strict.asarray(a, device=device)  # noqa: E731
    x = np.random.default_rng(0).standard_normal((5, 8)).astype(np.float32)
    batch = np.random.default_rng(1).standard_normal((2, 3, 5, 8)).astype(np.float32)
    like = lambda a, p: a if isinstance(p, np.ndarray) else on(a)  # noqa: E731
    dynamic = pe.scaling.DynamicNTK(2.0, 16)
    calls = [
        (lambda p: pe.sinusoidal(p, 8), pos),
        (lambda p: pe.rope_cos_sin(p, inv_freq)[0], pos),
        (lambda p: pe.xpos_scale(p, 8), pos),
        (lambda p: pe.rope(like(x, p), p), pos),
        (pe.positions_from_mask, mask),
        (lambda o: pe.rope(like(batch, o), offset=o, scaling=dynamic), rows),
        (lambda n: pe.rope(like(batch, n), seq_len=n, scaling=dynamic), rows),
        (lambda o: pe.apply_absolute(like(batch[:, 0], o), like(x.repeat(200, axis=0), o), offset=o), rows),
        # (searchsorted: array-api-strict's gives int64 there, which the device refuses)
        (lambda c: pe.positions_from_cu_seqlens(c, 9), np.array([0, 3, 5, 9], np.int32)),
        (lambda r: pe.t5_bucket(r, num_buckets=256, max_distance=1024), np.arange(-600, 600, dtype=np.int32)),
    ]
    for fn, a in calls:
        got = fn(on(a))
        assert got.device == device
        np.testing.assert_allclose(np.asarray(got._array), fn(a), rtol=1e-6, atol=1e-6)
