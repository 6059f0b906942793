"""Every RoPE scaling against Hugging Face transformers' own initialisers (the oracle).

The HF functions (``transformers.modeling_rope_utils.ROPE_INIT_FUNCTIONS`` and LLaMA's
default) are called on a real ``LlamaConfig`` built from the same ``rope_parameters``
dict that ``pe.scaling.from_hf`` reads, over many parameter sets drawn by hypothesis.
HF computes in float32, we compute in float64: ``inv_freq`` is compared with a relative
tolerance of a few float32 ulps, amplified by ``ln(base)`` because HF rounds the exponent
``2i/d`` to float32 before ``base**``.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

import posenc as pe

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
hypothesis = pytest.importorskip("hypothesis")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from transformers import LlamaConfig  # noqa: E402
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb  # noqa: E402

MANY = settings(max_examples=60, deadline=None, derandomize=True)

head_dims = st.sampled_from([8, 16, 32, 64, 80, 96, 128, 256])
bases = st.one_of(st.sampled_from([10000.0, 500000.0, 1e6, 5e6]), st.floats(100.0, 1e7))
fractions = st.sampled_from([1.0, 1.0, 0.5, 0.25, 0.75])
factors = st.one_of(st.sampled_from([1.0, 2.0, 4.0, 8.0, 32.0]), st.floats(0.5, 64.0))
originals = st.sampled_from([256, 512, 2048, 4096, 8192, 32768])


def hf_config(rope_parameters, head_dim, max_position_embeddings):
    return LlamaConfig(
        hidden_size=4 * head_dim,
        num_attention_heads=4,
        head_dim=head_dim,
        max_position_embeddings=max_position_embeddings,
        rope_parameters=dict(rope_parameters),
    )


def hf_frequencies(rope_parameters, head_dim, max_position_embeddings, seq_len=None):
    config = hf_config(rope_parameters, head_dim, max_position_embeddings)
    rope_type = config.rope_parameters["rope_type"]
    if rope_type == "default":
        inv_freq, scale = LlamaRotaryEmbedding.compute_default_rope_parameters(config)
    else:
        inv_freq, scale = ROPE_INIT_FUNCTIONS[rope_type](config, None, seq_len=seq_len)
    return inv_freq.double().numpy(), float(scale)


def ours(rope_parameters, head_dim, max_position_embeddings, seq_len=None):
    cfg = pe.scaling.from_hf(rope_parameters, head_dim=head_dim, max_position_embeddings=max_position_embeddings)
    inv_freq, scale = pe.rope_frequencies(cfg.rotary_dim, base=cfg.base, scaling=cfg.scaling, seq_len=seq_len)
    return inv_freq, scale


def assert_matches_hf(rope_parameters, head_dim, max_position_embeddings, seq_len=None):
    want, want_scale = hf_frequencies(rope_parameters, head_dim, max_position_embeddings, seq_len)
    got, got_scale = ours(rope_parameters, head_dim, max_position_embeddings, seq_len)
    base = rope_parameters.get("rope_theta", 10000.0)
    # Hugging Face computes in float32: powers of the base lose ln(base) ulps, and a blend of
    # theta and theta / factor (YaRN, Llama 3) rounds its weights to float32, an error of
    # one ulp of theta in a result as small as theta / factor.
    rtol = 2.0**-23 * (4 + math.log(base)) * max(1.0, rope_parameters.get("factor") or 1.0)
    assert got.dtype == np.float64 and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=rtol, atol=0)
    assert got_scale == pytest.approx(want_scale, rel=1e-12)


def rotary_fraction_ok(head_dim, fraction):
    rotary = int(head_dim * fraction)
    return rotary >= 4 and rotary % 2 == 0


@st.composite
def rope_parameters(draw, rope_type, **fields):
    """``(rope_parameters, head_dim)``: a dict of ``rope_type`` with a drawn ``rope_theta`` and
    ``partial_rotary_factor`` (an even rotary dimension >= 4 of the drawn ``head_dim``), and a
    value drawn for each of ``fields`` (a strategy per key; a drawn ``None`` leaves the key out)."""
    head_dim = draw(head_dims)
    params = {"rope_type": rope_type, "rope_theta": draw(bases), "partial_rotary_factor": draw(fractions)}
    hypothesis.assume(rotary_fraction_ok(head_dim, params["partial_rotary_factor"]))
    for key, strategy in fields.items():
        value = draw(strategy)
        if value is not None:
            params[key] = value
    return params, head_dim


def optional(strategy):
    return st.one_of(st.none(), strategy)


@MANY
@given(head_dim=head_dims, base=bases)
def test_default_matches_hf(head_dim, base):
    assert_matches_hf({"rope_type": "default", "rope_theta": base}, head_dim, 2048)


@MANY
@given(drawn=rope_parameters("linear", factor=factors))
def test_linear_matches_hf(drawn):
    assert_matches_hf(*drawn, 4096)


@MANY
@given(drawn=rope_parameters("dynamic", factor=factors), max_pos=originals, seq_len=optional(st.integers(0, 300_000)))
def test_dynamic_ntk_matches_hf(drawn, max_pos, seq_len):
    assert_matches_hf(*drawn, max_pos, seq_len)


@MANY
@given(
    drawn=rope_parameters(
        "yarn",
        factor=factors,
        original_max_position_embeddings=originals,
        beta_fast=optional(st.floats(1.0, 64.0)),
        beta_slow=optional(st.floats(0.25, 4.0)),
        mscale=st.sampled_from([None, 0.0, 0.707, 1.0, 1.5]),
        mscale_all_dim=st.sampled_from([None, 0.0, 0.707, 1.0]),
        attention_factor=optional(st.floats(0.5, 2.0)),
        truncate=st.sampled_from([None, True, False]),
    )
)
def test_yarn_matches_hf(drawn):
    params, _ = drawn
    max_pos = int(params["original_max_position_embeddings"] * max(params["factor"], 1.0))
    with warnings.catch_warnings():  # a fractional factor rounds max_pos: the implicit-factor warning
        warnings.filterwarnings("ignore", message=".*implicit factor", category=UserWarning)
        assert_matches_hf(params, drawn[1], max_pos)


def test_yarn_warns_of_an_implicit_factor_as_transformers_does(caplog):
    params = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2048, "rope_theta": 10000.0}
    with pytest.warns(UserWarning, match=r"implicit factor .* = 16384 / 2048 = 8.0"):
        cfg = pe.scaling.from_hf(params, head_dim=64, max_position_embeddings=16384)
    assert cfg.scaling.factor == 4.0  # the explicit factor wins
    with caplog.at_level("WARNING", logger="transformers"):  # transformers' own check warns of the same config
        LlamaConfig(hidden_size=256, num_attention_heads=4, head_dim=64, max_position_embeddings=16384, rope_parameters=dict(params))
    assert "implicit factor" in caplog.text
    for consistent in (8192, 2048):  # factor * original, or the original length itself: no warning
        pe.scaling.from_hf(params, head_dim=64, max_position_embeddings=consistent)


@pytest.mark.parametrize("truncate", [None, False, True])
def test_yarn_truncate_none_is_falsy_as_in_transformers(truncate):
    # transformers reads ``rope_parameters.get("truncate", True)`` and tests it for truth: a
    # ``"truncate": null`` in a config keeps the correction range unrounded, as False does
    # (from_hf took None for "absent", True: the ramp moved, inv_freq off by up to 0.18 relative).
    params = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2048, "rope_theta": 10000.0}
    params.update(beta_fast=31.3, beta_slow=1.7, truncate=truncate)
    assert pe.scaling.from_hf(params, head_dim=64, max_position_embeddings=8192).scaling.truncate is bool(truncate)
    assert_matches_hf(params, 64, 8192)


@pytest.mark.parametrize("max_pos", [8192, 163840])
def test_yarn_without_factor_uses_the_length_ratio(max_pos):
    # DeepSeek-V3 style configs: factor from max_position_embeddings / original.
    params = {"rope_type": "yarn", "factor": None, "original_max_position_embeddings": 4096, "rope_theta": 10000.0}
    params.update(mscale=1.0, mscale_all_dim=1.0, beta_fast=32, beta_slow=1)
    assert_matches_hf(params, 64, max_pos)


@pytest.mark.parametrize(
    "full, top, config_fields",
    [
        ({"truncate": False}, {}, {}),  # a layer type's truncate: not read (True)
        ({}, {"truncate": False}, {}),  # the top level's: read
        ({"truncate": False}, {"truncate": None}, {}),
        ({}, {}, {"original_max_position_embeddings": 2048}),  # the config's field: not copied into nested parameters
        ({"factor": None}, {}, {"original_max_position_embeddings": 2048}),
    ],
)
def test_nested_yarn_is_read_as_transformers_reads_it(full, top, config_fields):
    """Parameters nested per layer type (Gemma 3): transformers' YaRN reads ``truncate`` from
    ``config.rope_parameters`` itself (so a layer type's own is not read), and a nested
    ``original_max_position_embeddings`` only from the layer type's dict. from_hf read the
    layer type's truncate (inv_freq 0.22 off relative) and the config's field first (0.6 off;
    1.4 and the attention scale 1.069 for 1.139 with factor None)."""
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024, "beta_fast": 31.3, "beta_slow": 1.7, "rope_theta": 1000.0}
    params = {"sliding_attention": {"rope_type": "default", "rope_theta": 100.0}, "full_attention": {**yarn, **full}, **top}
    config = transformers.Gemma3TextConfig(
        hidden_size=64, num_attention_heads=4, num_hidden_layers=2, head_dim=16, max_position_embeddings=4096,
        layer_types=["sliding_attention", "full_attention"], rope_parameters=params, **config_fields,
    )
    want, want_scale = ROPE_INIT_FUNCTIONS["yarn"](config, None, layer_type="full_attention")
    ours = pe.scaling.from_hf(config, layer_type="full_attention")
    got, scale = pe.rope_frequencies(ours.rotary_dim, base=ours.base, scaling=ours.scaling)
    np.testing.assert_allclose(got, want.double().numpy(), rtol=2.0**-23 * (4 + math.log(1000.0)) * 4)
    assert scale == pytest.approx(want_scale, rel=1e-12)


@MANY
@given(
    data=st.data(),
    drawn=rope_parameters("longrope", original_max_position_embeddings=originals, attention_factor=optional(st.floats(0.5, 2.0))),
    factor=optional(factors),
    max_factor=st.sampled_from([1, 2, 32]),
)
def test_longrope_matches_hf(data, drawn, factor, max_factor):
    params, head_dim = drawn
    half = int(head_dim * params["partial_rotary_factor"]) // 2
    lists = st.lists(st.floats(1.0, 64.0), min_size=half, max_size=half)
    params.update(short_factor=data.draw(lists), long_factor=data.draw(lists), factor=factor)  # factor None: given as None
    original = params["original_max_position_embeddings"]
    seq_len = data.draw(st.one_of(st.none(), st.integers(0, 2 * original), st.sampled_from([original, original + 1])))
    assert_matches_hf(params, head_dim, original * max_factor, seq_len)


@pytest.mark.parametrize("short, long", [([1.5], [1.0, 2.0, 3.0, 4.0]), ([1.0, 1.2, 1.4, 1.6], [4.0]), ([2.0], [8.0])])
@pytest.mark.parametrize("seq_len", [None, 64, 65])
def test_longrope_with_one_factor_broadcasts_it_as_transformers(short, long, seq_len):
    # transformers divides by a tensor of the factors: one factor broadcasts over every pair
    # (it warns of the length and computes); from_hf refused it (lists of different lengths).
    params = {"rope_type": "longrope", "rope_theta": 500.0, "original_max_position_embeddings": 64, "factor": 4.0}
    assert_matches_hf({**params, "short_factor": short, "long_factor": long}, 8, 256, seq_len)


@pytest.mark.parametrize("largest", [15.0, 15.2, 15.5, 16.0])
def test_fractional_positions_switch_longrope_and_grow_dynamic_ntk_as_transformers(largest):
    """Fractional positions: LongRoPE takes its long factors where transformers'
    ``max(position_ids) + 1 > original`` does (posenc's length is ``ceil(max) + 1``; it was
    ``floor(max) + 1``, which kept the short factors at 15.5 against 16: cos off by 1.9),
    and DynamicNTK grows its base at that length, as ``HFRotaryEmbedding`` does; the planned
    repeat call too (its own floor had outlived the full path's)."""
    from posenc.torch.hf import HFRotaryEmbedding

    longrope = {"rope_type": "longrope", "rope_theta": 500.0, "original_max_position_embeddings": 16, "factor": 4.0, "short_factor": [1.0] * 8, "long_factor": [16.0] * 8}
    dynamic = {"rope_type": "dynamic", "rope_theta": 500.0, "factor": 4.0}
    positions = torch.tensor([[0.0, 7.0, largest]])
    for params, oracle in ((longrope, LlamaRotaryEmbedding), (dynamic, HFRotaryEmbedding)):
        config = hf_config(params, 16, 16 if params is dynamic else 64)
        want_cos, want_sin = oracle(config)(torch.zeros(1, dtype=torch.float64), positions.double())
        ours = pe.scaling.from_hf(config)
        unit = np.zeros((3, 16))
        unit[:, :8] = 1.0  # the first channel of every pair: rotated, it is (cos, sin) times the attention scale
        for _ in range(3):  # (a repeated call is planned: the plan decides the length as the full path does)
            got = pe.rope(unit, positions=positions.numpy()[0].astype(np.float64), base=ours.base, scaling=ours.scaling)
            np.testing.assert_allclose(got[:, :8], want_cos.numpy()[0, :, :8], rtol=1e-6, atol=1e-6)
            np.testing.assert_allclose(got[:, 8:], want_sin.numpy()[0, :, :8], rtol=1e-6, atol=1e-6)


@MANY
@given(
    drawn=rope_parameters("llama3", factor=factors, original_max_position_embeddings=originals, low_freq_factor=st.floats(0.25, 2.0)),
    gap=st.floats(0.25, 8.0),
)
def test_llama3_matches_hf(drawn, gap):
    params, head_dim = drawn
    params["high_freq_factor"] = params["low_freq_factor"] + gap
    assert_matches_hf(params, head_dim, params["original_max_position_embeddings"] * 16)


def test_llama_3_1_release_config():
    params = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_theta": 500000.0,
    }
    assert_matches_hf(params, 128, 131072)


@pytest.mark.parametrize(
    "legacy, modern",
    [
        ({"type": "linear", "factor": 2.0}, {"rope_type": "linear", "factor": 2.0}),
        ({"type": "dynamic", "factor": 4.0}, {"rope_type": "dynamic", "factor": 4.0}),
        (
            {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2048},
            {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2048},
        ),
    ],
)
def test_legacy_rope_scaling_dict_with_top_level_theta(legacy, modern):
    old = pe.scaling.from_hf(legacy, head_dim=64, max_position_embeddings=8192, rope_theta=1e6, partial_rotary_factor=0.5)
    new = pe.scaling.from_hf({**modern, "rope_theta": 1e6, "partial_rotary_factor": 0.5}, head_dim=64, max_position_embeddings=8192)
    assert old == new and old.base == 1e6 and old.rotary_dim == 32
    config = LlamaConfig(
        hidden_size=256, num_attention_heads=4, head_dim=64, max_position_embeddings=8192, rope_scaling=dict(legacy), rope_theta=1e6
    )
    config.rope_parameters["partial_rotary_factor"] = 0.5
    want, _ = ROPE_INIT_FUNCTIONS[config.rope_parameters["rope_type"]](config, None)
    got, _ = pe.rope_frequencies(old.rotary_dim, base=old.base, scaling=old.scaling)
    np.testing.assert_allclose(got, want.double().numpy(), rtol=2e-6)


def test_ntk_alpha_is_the_ntk_aware_base_change():
    # No HF rope_type of its own: the formula of bloc97's NTK-aware scaled RoPE.
    for dim, base, alpha in [(128, 10000.0, 8.0), (64, 500000.0, 2.0), (4, 10.0, 3.0)]:
        new_base = base * alpha ** (dim / (dim - 2))
        want = np.array([1.0 / new_base ** (2 * i / dim) for i in range(dim // 2)])
        got, scale = pe.rope_frequencies(dim, base=base, scaling=pe.scaling.NTK(alpha))
        np.testing.assert_allclose(got, want, rtol=1e-14)
        assert scale == 1.0
        # the lowest frequency is stretched by exactly alpha, the highest kept
        plain, _ = pe.rope_frequencies(dim, base=base)
        assert got[0] == plain[0] and got[-1] * alpha == pytest.approx(plain[-1], rel=1e-13)


def test_dynamic_ntk_equals_ntk_at_the_grown_length():
    dyn = pe.scaling.DynamicNTK(4.0, 2048)
    alpha = 4.0 * 8192 / 2048 - 3.0
    np.testing.assert_allclose(
        pe.rope_frequencies(64, scaling=dyn, seq_len=8192)[0], pe.rope_frequencies(64, scaling=pe.scaling.NTK(alpha))[0], rtol=1e-14
    )
    np.testing.assert_array_equal(pe.rope_frequencies(64, scaling=dyn, seq_len=100)[0], pe.rope_frequencies(64)[0])


def test_classes_equal_from_hf():
    cfg = pe.scaling.from_hf(
        {"rope_type": "yarn", "factor": 40, "original_max_position_embeddings": 4096, "mscale": 1.0, "mscale_all_dim": 1.0},
        head_dim=64,
    )
    assert cfg.scaling == pe.scaling.YaRN(40.0, 4096, mscale=1.0, mscale_all_dim=1.0)
    assert cfg.scaling.attention_scale() == 1.0
    assert pe.scaling.from_hf(None, head_dim=64) == pe.scaling.HFRope(None, 10000.0, 64, 1.0)


# --- the whole pipeline: HF's rotary embedding + apply_rotary_pos_emb vs rope --------


@pytest.mark.parametrize(
    "params",
    [
        {"rope_type": "default", "rope_theta": 10000.0},
        {"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0},
        {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 512, "rope_theta": 10000.0},
        {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
         "original_max_position_embeddings": 64, "rope_theta": 500000.0},
    ],
    ids=lambda p: p["rope_type"],
)
def test_rope_equals_hf_llama_rotary_pipeline(params, rng):
    head_dim, seq = 32, 48
    config = hf_config(params, head_dim, 4096)
    emb = LlamaRotaryEmbedding(config)
    position_ids = torch.arange(seq)[None]
    q = torch.from_numpy(rng.standard_normal((1, 2, seq, head_dim)).astype(np.float32))
    k = torch.from_numpy(rng.standard_normal((1, 2, seq, head_dim)).astype(np.float32))
    cos, sin = emb(q, position_ids)
    want_q, want_k = apply_rotary_pos_emb(q, k, cos, sin)
    cfg = pe.scaling.from_hf(params, head_dim=head_dim, max_position_embeddings=4096)
    got_q = pe.rope(q, base=cfg.base, scaling=cfg.scaling)
    got_k = pe.rope(k, base=cfg.base, scaling=cfg.scaling)
    # HF rounds angles to float32: a few float32 ulps of the largest angle (47 rad).
    np.testing.assert_allclose(got_q.numpy(), want_q.numpy(), atol=2e-5, rtol=0)
    np.testing.assert_allclose(got_k.numpy(), want_k.numpy(), atol=2e-5, rtol=0)
    # with HF's own cos/sin, apply_rope is HF's apply_rotary_pos_emb up to rounding
    np.testing.assert_allclose(pe.apply_rope(q, cos[:, None], sin[:, None]).numpy(), want_q.numpy(), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("model", ["hunyuan_v1_dense", "hunyuan_vl"])
def test_hunyuan_dynamic_with_alpha_is_the_fixed_ntk_base_change(model):
    # HunYuan's checkpoints say rope_type "dynamic" with an "alpha": transformers' HunYuan rotary
    # modules read it as a fixed NTK-aware base change (their compute_ntk_alpha_rope_parameters).
    import importlib

    modeling = importlib.import_module(f"transformers.models.{model}.modeling_{model}")
    rotary = next(getattr(modeling, n) for n in dir(modeling) if n.endswith("RotaryEmbedding"))
    params = {"rope_type": "dynamic", "alpha": 1000.0, "factor": 1.0, "rope_theta": 10000.0}
    config = transformers.AutoConfig.for_model(
        model, hidden_size=128, num_attention_heads=4, head_dim=32, max_position_embeddings=64, rope_parameters=dict(params)
    )
    text = config.get_text_config()
    want, _ = rotary.compute_ntk_alpha_rope_parameters(text)
    cfg = pe.scaling.from_hf(text)
    assert cfg.scaling == pe.scaling.NTK(1000.0)
    got, scale = pe.rope_frequencies(cfg.rotary_dim, base=cfg.base, scaling=cfg.scaling)
    np.testing.assert_allclose(got, want.double().numpy(), rtol=2.0**-23 * (4 + math.log(10000.0 * 1000.0 ** (32 / 30))))
    assert scale == 1.0


def test_an_alpha_outside_hunyuan_is_not_read():
    # Only HunYuan's rotary modules read an alpha: LLaMA's "dynamic" reads its factor (and
    # transformers warns of the key); from_hf of a LLaMA config gave NTK(alpha), silently.
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    params = {"rope_type": "dynamic", "alpha": 4.0, "factor": 2.0, "rope_theta": 500.0}
    config = LlamaConfig(hidden_size=64, num_attention_heads=4, head_dim=16, max_position_embeddings=16, rope_parameters=dict(params))
    with pytest.warns(UserWarning, match=r"\['alpha'\] are not read"):
        cfg = pe.scaling.from_hf(config)
    assert cfg.scaling == pe.scaling.DynamicNTK(2.0, 16)
    got, _ = pe.rope_frequencies(cfg.rotary_dim, base=cfg.base, scaling=cfg.scaling)
    np.testing.assert_allclose(got, LlamaRotaryEmbedding(config).inv_freq.double().numpy(), rtol=1e-6)
    assert pe.scaling.from_hf(params, head_dim=16).scaling == pe.scaling.NTK(4.0)  # a dict: HunYuan's reading, as before


def test_hunyuan_alpha_zero_is_no_alpha():
    # HunYuan's modules test `rope_parameters.get("alpha")` for truth: 0 is no alpha, and
    # "dynamic" is then the dynamic NTK of its factor. from_hf raised ValueError (alpha must be > 0).
    from transformers.models.hunyuan_v1_dense.modeling_hunyuan_v1_dense import HunYuanDenseV1RotaryEmbedding

    params = {"rope_type": "dynamic", "alpha": 0, "factor": 2.0, "rope_theta": 10000.0}
    config = transformers.AutoConfig.for_model(
        "hunyuan_v1_dense", hidden_size=128, num_attention_heads=4, head_dim=32, max_position_embeddings=64, rope_parameters=dict(params)
    )
    module = HunYuanDenseV1RotaryEmbedding(config)
    assert module.rope_type == "dynamic"
    cfg = pe.scaling.from_hf(config)
    assert cfg.scaling == pe.scaling.DynamicNTK(2.0, 64)
    got, _ = pe.rope_frequencies(cfg.rotary_dim, base=cfg.base, scaling=cfg.scaling)
    np.testing.assert_allclose(got, module.inv_freq.double().numpy(), rtol=1e-6)


# --- transformers' own formulas, run in float64 ---------------------------------------------


class _Float64Torch:
    """``torch`` for ``modeling_rope_utils``' globals, with its float32 dtypes float64."""

    float = float32 = torch.float64

    def __getattr__(self, name):
        return getattr(torch, name)


def _float64_drawn(rng, rope_type):
    """``(rope_parameters, config sizes)`` of ``rope_type``: an even rotary dimension of 4 to
    256 channels (a head of 8 to 256, any fraction, head_dim apart from hidden / heads),
    rope_theta 1.5 to 1e7, and the type's keys drawn over the ranges transformers accepts
    (factors below 1, beta_fast below beta_slow, negative mscales, factor None, truncate off)."""
    while True:
        head_dim, fraction = int(rng.integers(4, 129)) * 2, float(rng.choice([1.0, 0.25, 0.5, 0.75, 0.3, 0.625, 0.334]))
        if int(head_dim * fraction) % 2 == 0 and int(head_dim * fraction) >= 4:
            break
    rotary_dim, original = int(head_dim * fraction), int(rng.choice([16, 512, 4096, int(rng.integers(2, 40000))]))
    params = {"rope_type": rope_type, "rope_theta": float(np.exp(rng.uniform(np.log(1.5), np.log(1e7)))), "partial_rotary_factor": fraction}
    factor = float(np.exp(rng.uniform(np.log(0.5), np.log(128.0))))
    if rope_type in ("linear", "dynamic", "llama3", "yarn", "longrope"):
        params["factor"] = None if rope_type in ("yarn", "longrope") and rng.random() < 0.3 else factor
    if rope_type in ("yarn", "longrope", "llama3"):
        params["original_max_position_embeddings"] = original
    if rope_type == "yarn":
        params.update(beta_fast=float(np.exp(rng.uniform(np.log(0.1), np.log(128)))), beta_slow=float(np.exp(rng.uniform(np.log(0.05), np.log(64)))))
        params.update(mscale=float(rng.choice([0.0, 1.0, rng.uniform(-0.5, 3)])), mscale_all_dim=float(rng.choice([0.0, 1.0, rng.uniform(-0.5, 3)])))
        params.update(truncate=bool(rng.random() < 0.5), attention_factor=None if rng.random() < 0.7 else float(rng.uniform(0.1, 3)))
    if rope_type == "longrope":
        params["short_factor"] = rng.uniform(0.5, 4, rotary_dim // 2).tolist()
        params["long_factor"] = np.exp(rng.uniform(np.log(0.5), np.log(64), rotary_dim // 2)).tolist()
        params["attention_factor"] = None if rng.random() < 0.7 else float(rng.uniform(0.1, 3))
    if rope_type == "llama3":
        low = float(rng.uniform(0.1, 4))
        params.update(low_freq_factor=low, high_freq_factor=low + float(rng.choice([0.01, rng.uniform(0.01, 8)])))
    sizes = dict(hidden_size=int(rng.choice([head_dim * 4, 8 * int(rng.integers(1, 128))])), num_attention_heads=4, head_dim=head_dim)
    return params, {**sizes, "max_position_embeddings": int(rng.choice([original, 4 * original, int(rng.integers(2, 70000))]))}


@pytest.mark.parametrize("rope_type", ["linear", "dynamic", "yarn", "longrope", "llama3", "proportional"])
def test_frequencies_are_transformers_formulas_in_float64(rope_type, monkeypatch):
    """docs/precision.md: posenc's frequencies are transformers' formulas evaluated in float64,
    to 1e-13 relative. transformers' own initialisers are run here with their float32 dtypes
    (``torch.float``, ``torch.float32``, ``Tensor.float()``, the default dtype) made float64, on
    40 drawn configs per type (dynamic and LongRoPE also at and past their switch length, the
    length as a tensor as their modules pass it). Measured on 500 configs per type: 1.5e-15 at
    most (1.9e-14 for Llama 3 bands 0.01 apart); the float32 comparisons above allow up to
    1.5e-4, and passed inv_freq off by 1e-9."""
    import transformers.modeling_rope_utils as rope_utils

    rng = np.random.default_rng(sum(map(ord, rope_type)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (implicit-factor and unread-key warnings of drawn configs)
        for _ in range(40):
            params, sizes = _float64_drawn(rng, rope_type)
            config = LlamaConfig(rope_parameters=params, num_hidden_layers=1, vocab_size=8, intermediate_size=8, **sizes)
            ours = pe.scaling.from_hf(config)
            lengths = [None]
            if rope_type in ("dynamic", "longrope"):
                switch = config.max_position_embeddings if rope_type == "dynamic" else config.rope_parameters["original_max_position_embeddings"]
                lengths += [switch, switch + 1, torch.tensor(switch + 1), 3 * switch + 5]
            for seq_len in lengths:
                with monkeypatch.context() as patched:
                    patched.setattr(rope_utils, "torch", _Float64Torch())
                    patched.setattr(torch.Tensor, "float", torch.Tensor.double)
                    default = torch.get_default_dtype()
                    torch.set_default_dtype(torch.float64)
                    try:
                        want, want_scale = ROPE_INIT_FUNCTIONS[rope_type](config, None, seq_len=seq_len)
                    finally:
                        torch.set_default_dtype(default)
                assert want.dtype == torch.float64  # (the swap took: else this compares float32 values)
                got, scale = pe.rope_frequencies(ours.rotary_dim, base=ours.base, scaling=ours.scaling, seq_len=None if seq_len is None else int(seq_len))
                np.testing.assert_allclose(got, want.numpy(), rtol=1e-13, atol=0, err_msg=f"{params} {sizes} seq_len={seq_len}")
                assert scale == pytest.approx(float(want_scale), rel=1e-13, abs=0)
