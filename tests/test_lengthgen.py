"""The encodings built for length generalisation, against references written from the papers."""

from __future__ import annotations

import importlib.util
import math
import warnings

import numpy as np
import pytest
import torch

import posenc as pe
import posenc.torch as pt

# ---- references, transcribed from the papers' equations and released code -------------


def kerple_reference(r1, r2, q_len, k_len, offset, kind):
    out = np.zeros((len(r1), q_len, k_len))
    for h in range(len(r1)):
        for i in range(q_len):
            for j in range(k_len):
                d = abs(offset + i - j)
                out[h, i, j] = -r1[h] * (math.log(1 + r2[h] * d) if kind == "log" else d ** r2[h])
    return out


def sandwich_reference(q_len, k_len, dim, heads, offset):
    """Chi et al. 2023: p_m . p_n of sinusoidal embeddings (sin and cos per frequency), minus d/2,
    head h divided by 8h/H."""

    def embedding(m):
        w = [10000.0 ** (-2.0 * k / dim) for k in range(1, dim // 2 + 1)]
        return np.array([f(m * x) for x in w for f in (math.sin, math.cos)])

    out = np.zeros((heads, q_len, k_len))
    for h in range(heads):
        for i in range(q_len):
            for j in range(k_len):
                out[h, i, j] = (embedding(offset + i) @ embedding(j) - dim / 2) / (8 * (h + 1) / heads)
    return out


class FIREReference(torch.nn.Module):
    """The FIRE module of Li et al. (ICLR 2024), Appendix (PyTorch pseudo-code), biases only."""

    def __init__(self, num_heads=4, mlp_width=32, init_c=0.1, init_L=512.0, eps=1e-6):
        super().__init__()
        self.mlp = torch.nn.Sequential(torch.nn.Linear(1, mlp_width), torch.nn.ReLU(), torch.nn.Linear(mlp_width, num_heads))
        self.c = torch.nn.Parameter(torch.tensor(init_c))
        self.init_L = torch.nn.Parameter(torch.tensor(init_L), requires_grad=False)
        self.L_multiplier = torch.nn.Parameter(torch.tensor(1.0))
        self.eps = eps

    def forward(self, seq_length):
        positions = torch.arange(seq_length, dtype=torch.float)
        rel_distance = positions[:, None] - positions[None, :]
        threshold = torch.abs(self.L_multiplier * self.init_L)
        pos_normalizer = torch.max(positions, threshold)[:, None]
        rel_distance = torch.log(torch.abs(self.c * rel_distance) + 1)
        pos_normalizer = torch.log(torch.abs(self.c * pos_normalizer) + 1) + self.eps
        return self.mlp((rel_distance / pos_normalizer).unsqueeze(-1)).permute(2, 0, 1)


class CoPEReference(torch.nn.Module):
    """Golovneva et al. (2024), the CoPE module of their paper's code listing."""

    def __init__(self, npos_max, head_dim):
        super().__init__()
        self.npos_max = npos_max
        self.pos_emb = torch.nn.Parameter(torch.randn(1, head_dim, npos_max))

    def forward(self, query, attn_logits):
        return papers_position_term(query, attn_logits, self.pos_emb, self.npos_max)


def papers_position_term(query, attn_logits, pos_emb, npos_max):
    """The forward of the paper's CoPE module (its ``pos_emb`` ``[..., d, P]``)."""
    gates = torch.sigmoid(attn_logits)
    pos = gates.flip(-1).cumsum(dim=-1).flip(-1)
    pos = pos.clamp(max=npos_max - 1)
    pos_ceil = pos.ceil().long()
    pos_floor = pos.floor().long()
    logits_int = torch.matmul(query, pos_emb)
    logits_ceil = logits_int.gather(-1, pos_ceil)
    logits_floor = logits_int.gather(-1, pos_floor)
    w = pos - pos_floor
    return logits_ceil * w + logits_floor * (1 - w)


def mae_2d_sincos(embed_dim, grid_size_h, grid_size_w):
    """MAE's util/pos_embed.py get_2d_sincos_pos_embed (He et al. 2022), for a rectangular grid."""

    def one_d(dim, pos):
        omega = np.arange(dim // 2, dtype=np.float64) / (dim / 2.0)
        omega = 1.0 / 10000**omega
        out = np.einsum("m,d->md", pos.reshape(-1), omega)
        return np.concatenate([np.sin(out), np.cos(out)], axis=1)

    grid_h = np.arange(grid_size_h, dtype=np.float32)
    grid_w = np.arange(grid_size_w, dtype=np.float32)
    grid = np.stack(np.meshgrid(grid_w, grid_h), axis=0).reshape([2, 1, grid_size_h, grid_size_w])
    emb_h = one_d(embed_dim // 2, grid[0])
    emb_w = one_d(embed_dim // 2, grid[1])
    return np.concatenate([emb_h, emb_w], axis=1)


# ---- KERPLE ----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["log", "power"])
@pytest.mark.parametrize(("q_len", "k_len", "offset"), [(5, 5, None), (1, 7, None), (3, 6, 0), (4, 4, 2)])
def test_kerple_matches_the_paper(kind, q_len, k_len, offset):
    r1, r2 = np.array([0.5, 1.0, 2.0]), np.array([0.3, 1.0, 1.7])
    got = pe.kerple_bias(r1, r2, q_len, k_len, kind=kind, offset=offset)
    want = kerple_reference(r1, r2, q_len, k_len, k_len - q_len if offset is None else offset, kind)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_kerple_torch_gradients_reach_r1_and_r2():
    r1 = torch.tensor([0.5, 1.5], dtype=torch.float64, requires_grad=True)
    r2 = torch.tensor([0.7, 1.2], dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: pe.kerple_bias(a, b, 3, 4, kind="log"), (r1, r2))
    assert torch.autograd.gradcheck(lambda a, b: pe.kerple_bias(a, b, 3, 4, kind="power"), (r1, r2))


@pytest.mark.parametrize("kind", ["log", "power"])
def test_kerple_torch_second_derivatives_are_finite_at_distance_zero(kind):
    # d^r2 at d = 0 is 0 for every r2 > 0: torch's double backward of 0 ** r2 was NaN
    r1 = torch.tensor([0.5, 1.5], dtype=torch.float64, requires_grad=True)
    r2 = torch.tensor([0.7, 1.2], dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradgradcheck(lambda a, b: pe.kerple_bias(a, b, 3, 4, kind=kind), (r1, r2))


@pytest.mark.parametrize("kind", ["log", "power"])
def test_kerple_module_starts_where_the_authors_code_starts(kind):
    """ParallelKerpleLog draws ``bias_p = rand * 2`` then ``bias_a = rand`` for ``-p log(1 + a d)``;
    ParallelKerplePower draws ``bias_p = rand * 2`` then ``bias_a = rand`` for ``-a d ** p``
    (github.com/chijames/KERPLE, megatron/mpu/layers.py)."""
    from posenc.torch import lengthgen as lg

    torch.manual_seed(7)
    bias_p, bias_a = torch.rand(5) * 2, torch.rand(5)
    torch.manual_seed(7)
    module = lg.KERPLE(5, kind=kind)
    multiplier, inner = (bias_p, bias_a) if kind == "log" else (bias_a, bias_p)
    assert torch.equal(module.r1.detach(), multiplier) and torch.equal(module.r2.detach(), inner)
    d = torch.arange(4.0)
    authors = -bias_p[:, None] * torch.log(1 + bias_a[:, None] * d) if kind == "log" else -bias_a[:, None] * d ** bias_p[:, None]
    torch.testing.assert_close(module.bias(1, 4)[:, 0], authors.flip(-1).to(module.bias(1, 4).dtype))


@pytest.mark.parametrize("kind", ["log", "power"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_kerple_16_and_32_bit_biases_are_the_same_bits_in_numpy_and_torch(kind, dtype):
    """The per-distance vector is computed in float64 and rounded once, as Sandwich's and
    FIRE's are: in float32 each namespace's own ``log``/``pow`` had given other bits in
    5-14 % of the entries."""
    rng = np.random.default_rng(3)
    r1, r2 = rng.uniform(0.01, 2.0, 4).astype(dtype), rng.uniform(0.01, 2.0, 4).astype(dtype)
    want = pe.kerple_bias(r1, r2, 64, 64, kind=kind)
    got = pe.kerple_bias(torch.from_numpy(r1), torch.from_numpy(r2), 64, 64, kind=kind)
    assert want.dtype == dtype and np.array_equal(got.numpy(), want)


@pytest.mark.parametrize("xp", [np, torch])
def test_kerple_log_of_a_small_rate_keeps_float64s_precision(xp):
    """``log(1 + r2 d)`` lost the bits of ``r2 d`` that ``1 + r2 d`` rounds away: with
    ``r2 = 1e-6`` the float64 bias was 8e-11 (relative, 3.7e5 ulps) off ``log1p``, 7 ulps at ``r2 = 0.02``."""
    r1, r2 = np.array([0.7, 1.3]), np.array([1e-6, 0.02])
    got = pe.kerple_bias(xp.asarray(r1), xp.asarray(r2), 1, 5)
    got = np.asarray(got)
    want = [[[-a * math.log1p(b * d) for d in (4, 3, 2, 1, 0)]] for a, b in zip(r1, r2)]
    np.testing.assert_allclose(got, want, rtol=4 * 2.0**-52, atol=0)


# ---- Sandwich --------------------------------------------------------------------------


@pytest.mark.parametrize(("q_len", "k_len", "offset"), [(4, 4, None), (1, 6, None), (3, 5, 1)])
def test_sandwich_is_the_inner_product_of_sinusoidal_embeddings(q_len, k_len, offset):
    got = pe.sandwich_bias(q_len, k_len, 16, heads=4, offset=offset, dtype=np.float64)
    want = sandwich_reference(q_len, k_len, 16, 4, k_len - q_len if offset is None else offset)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)


def test_sandwich_without_heads_is_one_unscaled_row():
    got = pe.sandwich_bias(3, 3, 8, dtype=np.float64)
    assert got.shape == (1, 3, 3)
    np.testing.assert_allclose(got[0], sandwich_reference(3, 3, 8, 1, 0)[0] * 8, atol=1e-12)


@pytest.mark.parametrize(
    ("xp", "dtype", "bits", "dim", "heads", "distance"),
    [(torch, "float16", 11, 16, None, 3553), (torch, "bfloat16", 8, 128, 12, 463), (np, "bfloat16", 8, 128, 12, 463)],
)
def test_sandwich_16_bit_is_the_float64_vector_rounded_once(xp, dtype, bits, dim, heads, distance):
    """A 16-bit vector is the float64 one rounded once: torch's and ml_dtypes' conversions of
    float64 go through float32 and rounded these entries twice (265 float16 and 52 bfloat16
    of 4,521,984 over head dims 16 to 256, distances to 4,095)."""
    dtype = getattr(torch, dtype) if xp is torch else pytest.importorskip("ml_dtypes").bfloat16
    want = _round_once(pe.sandwich_vector(1, distance + 1, dim, heads=heads, dtype=np.float64), bits)
    got = pe.sandwich_vector(1, distance + 1, dim, heads=heads, xp=xp, dtype=dtype)
    assert got.dtype == dtype
    np.testing.assert_array_equal(np.asarray(got.double() if xp is torch else got.astype(np.float64)), want)


# ---- FIRE ------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [5, 40])
def test_fire_matches_the_papers_module(n):
    torch.manual_seed(0)
    ref = FIREReference(num_heads=3, init_L=16.0)
    got = pe.fire_bias(ref.mlp, n, n, c=ref.c, threshold=ref.init_L * ref.L_multiplier, dtype=torch.float32)
    torch.testing.assert_close(got, ref(n), rtol=1e-5, atol=1e-6)
    got.sum().backward()
    assert ref.c.grad is not None and ref.L_multiplier.grad is not None


@pytest.mark.parametrize(("xp", "dtype", "bits", "row"), [(torch, "float16", 11, 572), (torch, "bfloat16", 8, 585), (np, "bfloat16", 8, 585)])
def test_fire_16_bit_distances_are_the_float64_ones_rounded_once(xp, dtype, bits, row):
    """16-bit distances are the float64 ones rounded once: torch's and ml_dtypes' conversions of
    float64 go through float32 and rounded entries of these rows twice (199 float16 and 31
    bfloat16 entries of the 2,048 x 2,048 table)."""
    dtype = getattr(torch, dtype) if xp is torch else pytest.importorskip("ml_dtypes").bfloat16
    want = _round_once(pe.fire_distances(1, 2048, offset=row, dtype=np.float64), bits)
    got = pe.fire_distances(1, 2048, offset=row, xp=xp, dtype=dtype)
    assert got.dtype == dtype
    np.testing.assert_array_equal(np.asarray(got.double() if xp is torch else got.astype(np.float64)), want)


@pytest.mark.parametrize("xp", [np, torch])
def test_fire_distances_of_a_small_c_keep_float64s_precision(xp):
    """``psi(x) = log(|c x| + 1)`` lost the bits of ``c x`` that ``|c x| + 1`` rounds away:
    with ``c = 1e-5`` the float64 distances were 1.1e-11 (relative, 5e4 ulps) off ``log1p``, 5 ulps at ``c = 0.1``."""
    for c in (1e-5, 0.1):
        got = np.asarray(pe.fire_distances(2, 4, c=c, threshold=1.0, eps=0.0, xp=xp, dtype=xp.float64))
        want = [[math.log1p(c * abs(i - j)) / math.log1p(c * max(1.0, i)) for j in range(4)] for i in (2, 3)]
        np.testing.assert_allclose(got, want, rtol=4 * 2.0**-52, atol=0)


def test_fire_one_query_is_the_last_row():
    mlp = torch.nn.Sequential(torch.nn.Linear(1, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    full = pe.fire_bias(mlp, 6, 6, threshold=2.0, xp=torch)
    last = pe.fire_bias(mlp, 1, 6, threshold=2.0, xp=torch)
    torch.testing.assert_close(last[:, 0], full[:, -1])


# ---- CoPE ------------------------------------------------------------------------------


@pytest.mark.parametrize("q_len", [6, 1])
def test_cope_matches_the_papers_module(q_len):
    torch.manual_seed(1)
    b, h, k_len, d, npos = 2, 3, 6, 8, 4
    q, k = torch.randn(b, h, q_len, d, dtype=torch.float64), torch.randn(b, h, k_len, d, dtype=torch.float64)
    ref = CoPEReference(npos, d).double()
    attn = q @ k.transpose(-1, -2) / math.sqrt(d)
    i = torch.arange(k_len - q_len, k_len)[:, None]
    attn = attn + torch.where(torch.arange(k_len)[None, :] <= i, 0.0, float("-inf"))  # mask.log()
    want = attn + ref(q, attn)
    got = pe.cope_logits(q, k, ref.pos_emb[0].T)
    visible = torch.isfinite(want)
    torch.testing.assert_close(got[visible], want[visible])
    positions = pe.cope_positions(q, k)
    torch.testing.assert_close(positions, torch.sigmoid(attn).flip(-1).cumsum(-1).flip(-1))


def papers_cope_logits(q, k, pos_emb, scale, causal, mask):
    """CoPE logits of the paper's code listing (Golovneva et al., 2024): its module on the
    scaled logits plus ``mask.log()`` (future and masked keys), a table stored ``[..., P, d]``."""
    logits = (q @ k.mT) * scale
    if causal:
        q_len, k_len = q.shape[-2], k.shape[-2]
        mask = mask & (torch.arange(k_len)[None, :] <= torch.arange(k_len - q_len, k_len)[:, None])
    return logits + papers_position_term(q, logits + mask.to(logits.dtype).log(), pos_emb.mT, pos_emb.shape[-2])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(("causal", "scale"), [(True, None), (False, None), (True, 6.0)])
def test_cope_logits_and_their_gradients_are_the_papers_to_the_bit(dtype, causal, scale):
    """cope_logits gathers z = q @ e.T at floor(p) and ceil(p) with the paper's weights
    w = p - floor(p) and 1 - w: its values and its gradients to q, k and a per-head table are
    those of the paper's code, bit for bit. Its sum over every table row of hat weights
    max(0, 1 - |p - n|) had weighed ceil(p) by 1 - (ceil(p) - p), a few ulps off w, and at an
    integer p (saturated gates, scale 6) had passed the gradient on to p's neighbours through
    the hat's corners. A padding mask, and positions past the table's last row (clipped)."""
    gen = torch.Generator().manual_seed(3)
    heads, q_len, k_len, d, npos = 3, 7, 9, 8, 5
    q = torch.randn(2, heads, q_len, d, generator=gen, dtype=dtype).requires_grad_()
    k = torch.randn(2, heads, k_len, d, generator=gen, dtype=dtype).requires_grad_()
    e = torch.randn(heads, npos, d, generator=gen, dtype=dtype).requires_grad_()
    weights = torch.randn(2, heads, q_len, k_len, generator=gen, dtype=dtype)
    mask = torch.ones(2, 1, 1, k_len, dtype=torch.bool)
    mask[1, ..., k_len - 2 :] = False
    runs = []
    for fn in (lambda: pe.cope_logits(q, k, e, causal=causal, scale=scale, mask=mask), lambda: papers_cope_logits(q, k, e, scale or 1 / math.sqrt(d), causal, mask)):
        logits = fn()
        q.grad = k.grad = e.grad = None
        (logits * weights).sum().backward()
        runs.append((logits.detach(), q.grad, k.grad, e.grad))
    for name, got, want in zip(("logits", "q.grad", "k.grad", "pos_emb.grad"), *runs, strict=True):
        assert torch.equal(got, want), f"{name}: {(got - want).abs().max().item()} apart"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cope_gradients_stay_finite_where_a_gate_saturates(dtype):
    """A key whose scaled logit is far negative (past float32's exp range) has gate 0 and
    gradient 0, as torch.sigmoid's: 1 / (1 + exp(-x)) had differentiated to 0 * inf = NaN,
    poisoning every gradient of the call (q's all NaN here), a masked or future key too."""
    q = torch.ones(1, 2, 4, dtype=dtype, requires_grad=True)
    k = torch.tensor([[[1.0] * 4, [-1.0] * 4]], dtype=dtype, requires_grad=True)
    e = torch.randn(3, 4, generator=torch.Generator().manual_seed(0), dtype=dtype, requires_grad=True)
    for fn in (lambda: pe.cope_logits(q, k, e, scale=30.0), lambda: pe.cope_positions(q, k, scale=30.0)):
        q.grad = k.grad = e.grad = None
        fn().sum().backward()
        for grad in (q.grad, k.grad, e.grad):
            assert grad is None or bool(torch.isfinite(grad).all())
    assert q.grad is not None and k.grad is not None
    want = torch.autograd.grad(papers_cope_logits(q, k, e, 30.0, True, torch.ones(2, 2, dtype=torch.bool)).sum(), (q, k))
    got = torch.autograd.grad(pe.cope_logits(q, k, e, scale=30.0).sum(), (q, k))
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w)


@pytest.mark.parametrize("causal", [False, True])
def test_cope_with_a_padding_mask_matches_the_papers_module(causal):
    """The paper's code adds ``mask.log()`` to the logits before the gates, so a key the
    mask hides does not count: a padded sequence's real rows equal the unpadded sequence's,
    for the function and for the torch and flax modules' ``attend`` (their gates had
    counted the padding: 2.4 apart on this input)."""
    torch.manual_seed(1)
    b, h, n, pad, d, npos = 1, 2, 6, 2, 8, 8
    q, k, v = (torch.randn(b, h, n, d, dtype=torch.float64) for _ in range(3))
    ref = CoPEReference(npos, d).double()
    with torch.no_grad():
        ref.pos_emb.normal_()
    mask = torch.ones(n, n, dtype=torch.bool)
    mask[:, n - pad :] = False
    allowed = mask & (torch.arange(n)[None, :] <= torch.arange(n)[:, None]) if causal else mask
    attn = q @ k.transpose(-1, -2) / math.sqrt(d) + allowed.double().log()
    want = attn + ref(q, attn)
    got = pe.cope_logits(q, k, ref.pos_emb[0].T, causal=causal, mask=mask)
    torch.testing.assert_close(got[..., allowed], want[..., allowed])
    torch.testing.assert_close(pe.cope_positions(q, k, causal=causal, mask=mask)[..., allowed], torch.sigmoid(attn).flip(-1).cumsum(-1).flip(-1)[..., allowed])

    module = pt.CoPE(d, npos_max=npos, causal=causal).double()
    with torch.no_grad():
        module.pos_emb.copy_(ref.pos_emb[0].T)
    real = n - pad
    padded = module.attend(q, k, v, mask=mask, causal=causal)[..., :real, :]
    unpadded = module.attend(q[..., :real, :], k[..., :real, :], v[..., :real, :], causal=causal)
    torch.testing.assert_close(padded, unpadded)
    if importlib.util.find_spec("flax") is not None:
        import jax.numpy as jnp

        import posenc.flax as pf

        flax_module = pf.CoPE(d, npos_max=npos, causal=causal)
        flax_module.pos_emb[...] = jnp.asarray(ref.pos_emb[0].T.detach().float().numpy())
        qj, kj, vj = (jnp.asarray(t.float().numpy()) for t in (q, k, v))
        flax_padded = flax_module.attend(qj, kj, vj, mask=jnp.asarray(mask.numpy()), causal=causal)[..., :real, :]
        flax_unpadded = flax_module.attend(qj[..., :real, :], kj[..., :real, :], vj[..., :real, :], causal=causal)
        np.testing.assert_allclose(np.asarray(flax_padded), np.asarray(flax_unpadded), atol=1e-6)


@pytest.mark.parametrize("make", ["numpy", "array_api_strict"])
def test_cope_gates_of_large_negative_logits_are_0_without_a_numpy_warning(make):
    """A gate sigmoid(x) of x < -88 (float32) is 0: 1 / (1 + exp(-x)) with exp(-x) = inf, as
    torch's and JAX's; NumPy (and array-api-strict, through it) warned 'overflow encountered
    in exp', an error under -W error."""
    xp = np if make == "numpy" else pytest.importorskip("array_api_strict")
    q = np.ones((1, 3, 4), np.float32) * 10
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        p = pe.cope_positions(xp.asarray(q), xp.asarray(-q), scale=40.0)  # (q.k = -400 * 40)
    np.testing.assert_array_equal(np.asarray(p), np.zeros((1, 3, 3), np.float32))


def test_cope_positions_count_gates_from_the_key_to_the_query():
    rng = np.random.default_rng(0)
    q, k = rng.normal(size=(4, 3)), rng.normal(size=(4, 3))
    p = pe.cope_positions(q, k, scale=1.0)
    for i in range(4):
        for j in range(4):
            want = sum(1 / (1 + math.exp(-(q[i] @ k[t]))) for t in range(j, i + 1))
            assert abs(p[i, j] - want) < 1e-12


# ---- 2-D sin-cos, randomised positions -------------------------------------------------


@pytest.mark.parametrize(("h", "w", "dim"), [(4, 4, 16), (3, 5, 8), (14, 14, 64)])
def test_sincos_2d_matches_mae(h, w, dim):
    got = pe.sincos_2d(h, w, dim, dtype=np.float64)
    np.testing.assert_allclose(got, mae_2d_sincos(dim, h, w), atol=1e-12)
    with_cls = pe.sincos_2d(h, w, dim, cls_token=True)
    assert with_cls.shape == (h * w + 1, dim) and not with_cls[0].any()


@pytest.mark.parametrize(("h", "w", "dim"), [(14, 14, 768), (16, 16, 1024), (7, 9, 64)])
def test_sincos_2d_is_maes_float64_table_bit_for_bit(h, w, dim):
    """MAE's frequencies are ``1 / 10000**(k / quarter)`` by NumPy's ``power``; Python's
    ``10000 ** (-k / quarter)`` differs from them by an ulp in some, and the float64 table had
    differed from MAE's in 21,952 of 150,528 entries at ViT-B's 14 x 14 x 768 (up to 1.8e-15)."""
    np.testing.assert_array_equal(pe.sincos_2d(h, w, dim, dtype=np.float64), mae_2d_sincos(dim, h, w))


def _round_once(table, bits):
    """``table`` (float64, normal magnitudes) rounded once to ``bits`` significant bits, ties to even."""
    mantissa, exponent = np.frexp(table)
    return np.ldexp(np.round(mantissa * 2.0**bits), exponent - bits)


@pytest.mark.parametrize(("dtype", "bits"), [(torch.float16, 11), (torch.bfloat16, 8)])
def test_sincos_2d_16_bit_is_maes_table_rounded_once(dtype, bits):
    """A 16-bit table is MAE's float64 one rounded once, in torch as in NumPy: torch's float64
    to float16 conversion goes through float32 and rounded 128 of these entries twice."""
    want = _round_once(mae_2d_sincos(256, 64, 64), bits)
    got = pe.sincos_2d(64, 64, 256, xp=torch, dtype=dtype)
    assert got.dtype == dtype
    np.testing.assert_array_equal(got.double().numpy(), want)
    if dtype == torch.float16:
        np.testing.assert_array_equal(pe.sincos_2d(64, 64, 256, dtype=np.float16), want)


def test_randomized_positions_are_a_sorted_seeded_subset():
    p = pe.randomized_positions(10, 40, rng=3)
    assert p.dtype == np.int64 and p.shape == (10,)
    assert len(set(p.tolist())) == 10 and (np.diff(p) > 0).all() and p.min() >= 0 and p.max() < 40
    np.testing.assert_array_equal(p, pe.randomized_positions(10, 40, rng=np.random.default_rng(3)))
    rows = pe.randomized_positions(5, 9, rng=0, batch=3, xp=torch)
    assert isinstance(rows, torch.Tensor) and rows.shape == (3, 5) and bool((rows.diff(dim=-1) > 0).all())
    assert pe.randomized_positions(6, 6, rng=0).tolist() == list(range(6))


def test_randomized_positions_take_a_dtype():
    # (API.md: functions that build arrays from nothing take xp, device and dtype)
    for xp, dtype in ((np, np.int32), (np, np.uint8), (torch, torch.int32)):
        p = pe.randomized_positions(5, 200, rng=2, xp=xp, dtype=dtype)
        assert p.dtype == dtype and np.asarray(p).tolist() == pe.randomized_positions(5, 200, rng=2).tolist()
    with pytest.raises(ValueError, match="max_length must be at most 256"):
        pe.randomized_positions(5, 257, rng=0, dtype=np.uint8)
    with pytest.raises(TypeError, match="dtype must be an integer dtype"):
        pe.randomized_positions(5, 9, rng=0, dtype=np.float32)


def test_randomized_positions_beyond_int32_are_refused_where_positions_are_int32():
    # JAX without x64 holds positions in int32: a draw of 2**31 or more would wrap to a
    # negative, unsorted position. NumPy (int64) keeps them; a seed gives the same draws.
    jnp = pytest.importorskip("jax.numpy")
    import jax

    wide = pe.randomized_positions(4, 2**40, rng=0)
    assert (np.diff(wide) > 0).all() and wide.max() >= 2**31
    if jax.config.jax_enable_x64:
        np.testing.assert_array_equal(np.asarray(pe.randomized_positions(4, 2**40, rng=0, xp=jnp)), wide)
        return
    with pytest.raises(ValueError, match="max_length must be at most 2147483648"):
        pe.randomized_positions(4, 2**31 + 1, rng=0, xp=jnp)
    np.testing.assert_array_equal(np.asarray(pe.randomized_positions(4, 2**31, rng=0, xp=jnp)), pe.randomized_positions(4, 2**31, rng=0))


# ---- bad input -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "error", "name"),
    [
        (lambda: pe.kerple_bias(np.ones(2), np.ones(3), 2, 2), ValueError, "r1 and r2"),
        (lambda: pe.kerple_bias(np.ones(2), np.ones(2), 2, 2, kind="linear"), ValueError, "kind"),
        (lambda: pe.kerple_bias(np.ones(2, dtype=int), np.ones(2), 2, 2), TypeError, "r1"),
        (lambda: pe.kerple_bias(np.ones(2), np.ones(2), -1, 2), ValueError, "q_len"),
        (lambda: pe.sandwich_bias(2, 2, 5), ValueError, "dim"),
        (lambda: pe.sandwich_bias(2, 2, 4, heads=0), ValueError, "heads"),
        (lambda: pe.fire_bias(None, 2, 2), TypeError, "mlp"),
        (lambda: pe.fire_bias(lambda x: x, 2, 2, c=-1.0), ValueError, "c"),
        (lambda: pe.fire_bias(lambda x: x[:1], 2, 2), ValueError, "mlp"),
        (lambda: pe.cope_positions(np.ones((2, 3)), np.ones((2, 4))), ValueError, "head dimension"),
        (lambda: pe.cope_logits(np.ones((2, 3)), np.ones((2, 3)), np.ones((4, 2))), ValueError, "pos_emb"),
        # no position rows: the position term was silently left out (plain logits returned)
        (lambda: pe.cope_logits(np.ones((2, 3)), np.ones((2, 3)), np.ones((0, 3))), ValueError, "pos_emb"),
        (lambda: pe.cope_positions(np.ones((2, 3)), np.ones((2, 3)), causal=1), TypeError, "causal"),
        (lambda: pe.cope_positions(np.ones((2, 0)), np.ones((2, 0))), ValueError, "at least one feature"),
        (lambda: pe.sandwich_bias(0, 0, 2**62), ValueError, "sandwich_bias frequencies"),
        (lambda: pe.randomized_positions(2**40, 2**41, rng=0), ValueError, "randomized_positions"),
        (lambda: pe.sincos_2d(2, 2, 6), ValueError, "dim"),
        (lambda: pe.sincos_2d(0, 2, 8), ValueError, "grid_h"),
        (lambda: pe.randomized_positions(5, 4, rng=0), ValueError, "max_length"),
        (lambda: pe.randomized_positions(2, 4, rng="x"), TypeError, "rng"),
    ],
)
def test_bad_input_is_refused(call, error, name):
    with pytest.raises(error, match=name):
        call()


# ---- torch modules (the module protocol) -----------------------------------------------


def _modules():
    from posenc.torch import lengthgen as lg

    return [
        lg.FIRE(2, threshold=4.0),
        lg.KERPLE(2),
        lg.KERPLE(2, kind="power"),
        lg.Sandwich(2, dim=16),
        lg.CoPE(8, npos_max=6),
        lg.RandomizedRoPE(8, max_length=40, seed=1),
    ]


@pytest.mark.parametrize("index", range(6))
def test_modules_follow_the_protocol(index):
    torch.manual_seed(0)
    module = _modules()[index]
    q, k, v = (torch.randn(2, 2, 5, 8, dtype=torch.float64) for _ in range(3))
    module = module.double()
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    assert module.embed(x).shape == x.shape
    full = module.attend(q, k, v, causal=True)
    last = module.attend(q[..., -1:, :], k, v, causal=True)
    torch.testing.assert_close(last[..., 0, :], full[..., -1, :])
    assert module.logits(q, k).shape == (2, 2, 5, 5)
    assert "(" in repr(module) and "=" in repr(module)
    params = list(module.parameters())
    if params:
        full.sum().backward()
        assert all(p.grad is not None for p in params)


@pytest.mark.parametrize("kind", ["log", "power"])
def test_kerple_module_under_torch_func_gives_the_eager_values_and_gradients(kind):
    """KERPLE clamps ``r1, r2`` in place before each use (``.data``, as the paper's code does):
    under ``torch.func.grad``/``jacrev``/``jvp`` of the queries that write to a captured
    parameter raised RuntimeError ('attempted to call in-place operation (aten::clamp_) that
    would mutate a captured Tensor'), and ``vmap`` over stacked parameters (an ensemble, through
    ``functional_call``) 'accessing `data` under vmap transform is not allowed'. There the
    clamped values are now used without being written back: the eager call's bits."""
    from torch.func import functional_call, grad, jacrev, vmap

    from posenc.torch import lengthgen as lg

    torch.manual_seed(0)
    module = lg.KERPLE(2, kind=kind).double()
    with torch.no_grad():
        module.r1[0], module.r2[1] = -0.5, 3.0  # out of range: the clamp matters
    saved = {name: p.detach().clone() for name, p in module.named_parameters()}
    q, k, v = torch.randn(3, 1, 2, 5, 8, dtype=torch.float64).unbind(0)

    eager = lg.KERPLE(2, kind=kind).double()
    eager.load_state_dict(saved)
    queries = q.clone().requires_grad_(True)
    out = eager.attend(queries, k, v, causal=True)
    out.sum().backward()
    module.load_state_dict(saved)
    loss = lambda q_: module.attend(q_, k, v, causal=True).sum()  # noqa: E731
    assert torch.equal(grad(loss)(q), queries.grad)
    assert torch.equal(jacrev(lambda q_: module.logits(q_, k))(q), jacrev(lambda q_: eager.logits(q_, k))(q))
    grads = grad(lambda p: functional_call(module, p, (q, k, v), {"causal": True}).sum())(dict(saved))
    assert all(torch.equal(grads[name], p.grad) for name, p in eager.named_parameters())
    stacked = {name: torch.stack([p, p]) for name, p in saved.items()}
    batched = vmap(lambda p: functional_call(module, p, (q, k, v), {"causal": True}))(stacked)
    assert torch.equal(batched, torch.stack([out.detach(), out.detach()]))


def test_module_biases_are_the_functions():
    from posenc.torch import lengthgen as lg

    kerple = lg.KERPLE(3)
    q, k = torch.randn(1, 3, 4, 8), torch.randn(1, 3, 4, 8)
    want = q @ k.transpose(-1, -2) / math.sqrt(8) + pe.kerple_bias(kerple.r1.detach(), kerple.r2.detach(), 4, 4)
    torch.testing.assert_close(kerple.logits(q, k), want)
    sandwich = lg.Sandwich(3, dim=32)
    want = q @ k.transpose(-1, -2) / math.sqrt(8) + torch.from_numpy(pe.sandwich_bias(4, 4, 32, heads=3))
    torch.testing.assert_close(sandwich.logits(q, k), want)
    cope = lg.CoPE(8, npos_max=5)
    torch.testing.assert_close(cope.logits(q, k), pe.cope_logits(q, k, cope.pos_emb.detach()))


def test_cope_modules_take_the_functions_scale():
    # (API.md: a module takes every option its function takes)
    from posenc.torch import lengthgen as lg

    torch.manual_seed(0)
    cope = lg.CoPE(8, npos_max=5, scale=1.0)
    with torch.no_grad():
        cope.pos_emb.normal_()
    q, k = torch.randn(1, 3, 4, 8), torch.randn(1, 3, 4, 8)
    want = pe.cope_logits(q, k, cope.pos_emb.detach(), scale=1.0)
    torch.testing.assert_close(cope.logits(q, k), want)
    assert not torch.allclose(want, pe.cope_logits(q, k, cope.pos_emb.detach()))
    assert "scale=1.0" in repr(cope)
    with pytest.raises(ValueError, match="scale"):
        lg.CoPE(8, scale=0.0)
    if importlib.util.find_spec("flax") is not None:
        import jax.numpy as jnp

        import posenc.flax as pf

        flax_cope = pf.CoPE(8, npos_max=5, scale=1.0)
        flax_cope.pos_emb[...] = jnp.asarray(cope.pos_emb.detach().numpy())
        got = flax_cope.logits(jnp.asarray(q.numpy()), jnp.asarray(k.numpy()))
        np.testing.assert_allclose(np.asarray(got), want.numpy(), rtol=1e-5, atol=1e-5)


def test_randomized_rope_uses_the_drawn_positions_in_every_layer():
    from posenc.torch import lengthgen as lg

    module = lg.RandomizedRoPE(8, max_length=50, seed=3)
    x = torch.zeros(2, 6, 8)
    module.embed(x)
    drawn = module.positions
    assert drawn.shape == (2, 6) and bool((drawn.diff(dim=-1) > 0).all()) and int(drawn.max()) < 50
    q, k = torch.randn(2, 1, 6, 8), torch.randn(2, 1, 6, 8)
    rotated_q, rotated_k = pe.rope(q, drawn[:, None, :]), pe.rope(k, drawn[:, None, :])
    torch.testing.assert_close(module.logits(q, k), rotated_q @ rotated_k.transpose(-1, -2) / math.sqrt(8))
    again = lg.RandomizedRoPE(8, max_length=50, seed=3)
    again.embed(x)
    assert torch.equal(again.positions, drawn)


def test_modules_refuse_bad_options():
    from posenc.torch import lengthgen as lg

    with pytest.raises(ValueError, match="num_heads"):
        lg.FIRE(0)
    with pytest.raises(ValueError, match="kind"):
        lg.KERPLE(2, kind="cubic")
    with pytest.raises(ValueError, match="dim"):
        lg.Sandwich(2, dim=7)
    with pytest.raises(ValueError, match="npos_max"):
        lg.CoPE(8, npos_max=0)
    with pytest.raises(ValueError, match="max_length"):
        lg.RandomizedRoPE(8, max_length=0)
