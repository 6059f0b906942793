"""Model-specific multimodal RoPE against transformers' own modules (test-only oracles).

* HunyuanVL's XD-RoPE (``rope_type="xdrope"``, ``xdrope_section``): ``pe.scaling.from_hf``
  reads the config (an ``alpha`` is the fixed NTK base), ``pe.xdrope_cos_sin`` gives the
  tables of ``HunYuanVLRotaryEmbedding``;
* the 2-D vision RoPE of Qwen3-VL's and GLM-4V's encoders (``rope_type="axial"``):
  ``pe.scaling.Axial`` frequencies with ``pe.mrope_cos_sin`` over (height, width) give the
  tables of their ``VisionRotaryEmbedding``, and ``pe.apply_rope`` their rotation.
"""

from __future__ import annotations

import numpy as np
import pytest

import posenc as pe

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from transformers.models.glm4v.configuration_glm4v import Glm4vVisionConfig  # noqa: E402
from transformers.models.glm4v.modeling_glm4v import Glm4vVisionRotaryEmbedding  # noqa: E402
from transformers.models.hunyuan_vl.configuration_hunyuan_vl import HunYuanVLTextConfig  # noqa: E402
from transformers.models.hunyuan_vl.modeling_hunyuan_vl import HunYuanVLRotaryEmbedding  # noqa: E402
from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLVisionConfig  # noqa: E402
from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLVisionRotaryEmbedding, apply_rotary_pos_emb_vision  # noqa: E402

# transformers forms the angles in float32: a few ulps of the largest angle (positions below 40)
ATOL = 8 * 2.0**-24 * 40


def _hunyuan_config(**rope):
    params = {"rope_type": "xdrope", "rope_theta": 10000.0, "factor": 1.0, "xdrope_section": [4, 2, 6, 4], **rope}
    return HunYuanVLTextConfig(hidden_size=128, num_attention_heads=4, head_dim=32, rope_parameters=params)


def _image_ids(batch=2, length=20):
    """Four axis ids as HunyuanVL builds them: sequence, then width, height, image index of a 4-wide image from token 6."""
    seq = torch.arange(length)
    image = (seq >= 6) & (seq < 18)
    width = torch.where(image, (seq - 6) % 4, seq)
    height = torch.where(image, (seq - 6) // 4, seq)
    index = torch.where(image, torch.zeros_like(seq), seq)
    return torch.stack([seq, width, height, index])[:, None].expand(4, batch, length)


@pytest.mark.parametrize("rope", [{"alpha": 1000.0}, {}])
def test_xdrope_equals_hunyuan_vl(rope):
    config = _hunyuan_config(**rope)
    theirs = HunYuanVLRotaryEmbedding(config)
    read = pe.scaling.from_hf(config)
    assert read.sections == (4, 2, 6, 4) and read.multimodal == "xdrope"
    assert read.scaling == (pe.scaling.NTK(1000.0) if rope else pe.scaling.DynamicNTK(1.0, config.max_position_embeddings))
    inv_freq, scale = pe.rope_frequencies(read.rotary_dim, base=read.base, scaling=read.scaling)
    ids = _image_ids()
    want_cos, want_sin = theirs(torch.zeros(1), ids)
    cos, sin = pe.xdrope_cos_sin(ids, inv_freq, read.sections, scale=scale)
    assert cos.dtype == torch.float32 and cos.shape == want_cos.shape == (2, 20, 32)
    torch.testing.assert_close(cos, want_cos, atol=ATOL, rtol=0)
    torch.testing.assert_close(sin, want_sin, atol=ATOL, rtol=0)
    # image tokens: the two members of pair 0 turn with different axes (sequence and height)
    assert not torch.allclose(cos[0, 10, 0], cos[0, 10, 16])
    # text tokens (every axis the same id): plain RoPE
    text = torch.arange(6)
    plain, _ = pe.rope_cos_sin(text, inv_freq, scale=scale)
    torch.testing.assert_close(cos[0, :6], plain, atol=1e-7, rtol=0)


def test_from_hf_reads_an_xdrope_dict():
    read = pe.scaling.from_hf({"rope_type": "xdrope", "alpha": 1000.0, "xdrope_section": [4, 2, 6, 4], "rope_theta": 1e4}, head_dim=32)
    assert read.scaling == pe.scaling.NTK(1000.0) and read.sections == (4, 2, 6, 4) and read.multimodal == "xdrope"
    qwen = pe.scaling.from_hf({"rope_type": "default", "mrope_section": [2, 3, 3], "mrope_interleaved": True}, head_dim=16)
    assert qwen.sections == (2, 3, 3) and qwen.multimodal == "mrope_interleaved"
    assert pe.scaling.from_hf({"rope_type": "default"}, head_dim=16).sections is None


def test_xdrope_cos_sin_refuses_sections_that_do_not_fit():
    ids = np.zeros((3, 5), dtype=np.int64)
    with pytest.raises(ValueError, match="sections must sum"):
        pe.xdrope_cos_sin(ids, [1.0, 0.5, 0.25], [1, 1, 2])
    with pytest.raises(ValueError, match="one row per section"):
        pe.xdrope_cos_sin(ids, [1.0, 0.5, 0.25], [1, 2])


@pytest.mark.parametrize(
    "config_class, module_class", [(Qwen3VLVisionConfig, Qwen3VLVisionRotaryEmbedding), (Glm4vVisionConfig, Glm4vVisionRotaryEmbedding)]
)
def test_vision_axial_rope_equals_the_encoders(config_class, module_class):
    config = config_class(hidden_size=128, num_heads=4)
    theirs = module_class(config)
    read = pe.scaling.from_hf(config)
    assert read.scaling == pe.scaling.Axial(2) and read.rotary_dim == 32 and read.sections == (8, 8)
    inv_freq, scale = pe.rope_frequencies(read.rotary_dim, base=read.base, scaling=read.scaling)
    expected = 1.0 / 10000.0 ** (np.arange(0, 16, 2) / 16)  # RoPE over each axis' 16 channels
    np.testing.assert_allclose(inv_freq, np.concatenate([expected, expected]), rtol=1e-15)
    hw = torch.stack([torch.arange(30) // 6, torch.arange(30) % 6])  # a 5x6 patch grid: (height, width) rows
    want_cos, want_sin = theirs(torch.zeros(1), hw.T)  # transformers takes them [patches, 2]
    cos, sin = pe.mrope_cos_sin(hw, inv_freq, read.sections, scale=scale)
    torch.testing.assert_close(cos, want_cos, atol=ATOL, rtol=0)
    torch.testing.assert_close(sin, want_sin, atol=ATOL, rtol=0)
    generator = torch.Generator().manual_seed(0)
    q, k = (torch.randn(30, 4, 32, generator=generator) for _ in range(2))
    want_q, want_k = apply_rotary_pos_emb_vision(q, k, want_cos, want_sin)
    torch.testing.assert_close(pe.apply_rope(q, cos[:, None], sin[:, None]), want_q, atol=1e-5, rtol=0)
    torch.testing.assert_close(pe.apply_rope(k, cos[:, None], sin[:, None]), want_k, atol=1e-5, rtol=0)


def test_axial_scaling_refuses_a_dim_it_cannot_split():
    with pytest.raises(ValueError, match=r"Axial\(2\) needs dim // axes even"):
        pe.rope_frequencies(6, scaling=pe.scaling.Axial(2))
    with pytest.raises(ValueError, match="axes"):
        pe.scaling.Axial(0)


@pytest.mark.parametrize("model_type", sorted(pe.scaling._MROPE_MODELS))
def test_from_hf_deals_the_sections_out_as_the_models_text_rotary_module(model_type):
    """transformers' multimodal text rotary modules fall back on sections of their own where the
    config has no ``mrope_section``, and deal the pairs out by their code (Qwen3-VL's turns, or
    consecutive sections), never reading ``mrope_interleaved``: from_hf reads them as the module
    for the config's model type does (it gave no sections for GLM-4V's, Qwen3-VL's, Qwen3.5's
    default configs, and consecutive sections for Cosmos3-Edge's and HY-V4-VL's: cos off by 2).
    Position ids differ per axis, as an image's do; the layout of the pairs is the module's own."""
    import importlib
    import inspect

    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    config_class = CONFIG_MAPPING[model_type]
    modeling = importlib.import_module(config_class.__module__.replace(".configuration_", ".modeling_"))
    module_class = next(
        c for n, c in vars(modeling).items()
        if isinstance(c, type) and n.endswith("RotaryEmbedding") and "Vision" not in n and "mrope_section" in inspect.getsource(c)
    )
    sections, _ = pe.scaling._MROPE_MODELS[model_type]
    params = config_class().rope_parameters or {}
    fraction = params.get("partial_rotary_factor", 1.0)
    head_dim = round(2 * sum(params.get("mrope_section", sections)) / fraction)
    layer_type, extra = None, {}
    if model_type == "cohere_compass_text":  # rope parameters per layer type
        layer_type = "full_attention"
        extra = {"rope_parameters": {t: {"rope_type": "default", "rope_theta": 1e4} for t in ("full_attention", "sliding_attention")}}
    config = config_class(hidden_size=2 * head_dim, num_attention_heads=2, num_key_value_heads=2, head_dim=head_dim, **extra)
    ids = torch.randint(0, 50, (3, 2, 20), generator=torch.Generator().manual_seed(0))
    want_cos, want_sin = module_class(config)(torch.zeros(1), ids, *([layer_type] if layer_type else []))
    read = pe.scaling.from_hf(config, layer_type=layer_type)
    inv_freq, scale = pe.rope_frequencies(read.rotary_dim, base=read.base, scaling=read.scaling)
    differences = []
    for layout in ("half", "interleaved"):
        cos, sin = pe.mrope_cos_sin(ids, inv_freq, read.sections, interleaved=read.multimodal == "mrope_interleaved", layout=layout, scale=scale)
        differences.append(max(float((cos - want_cos).abs().max()), float((sin - want_sin).abs().max())))
    assert min(differences) <= ATOL, f"{model_type}: from_hf read {read.sections}, {read.multimodal}: tables off by {differences}"
