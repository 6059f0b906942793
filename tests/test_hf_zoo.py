"""patch_hf on every causal-LM architecture transformers builds tiny (tests/hf_zoo.py).

Each architecture is either covered (patched logits within float32 rounding of the
original's on a left-padded batch, identical greedy ``generate()`` tokens with the KV cache)
or refused by a ``ValueError`` that names the part posenc does not reproduce; one that
cannot be built tiny is skipped with the reason. By default a representative set runs
(every apply layout, partial rotary, nested rope parameters, MoE, both ALiBi builder forms);
``POSENC_HF_ZOO=all`` runs every model type (the docs' table comes from
``python tests/hf_zoo.py --markdown docs/transformers.md``).

``from_hf`` of a config against the frequencies of the rotary module transformers builds from
it, under ``rope_type="default"`` with and without a ``partial_rotary_factor``: the rotary
modules of representative packages, or (``POSENC_HF_ZOO=all``) of every package.
"""

from __future__ import annotations

import os
import warnings

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import hf_zoo  # noqa: E402
from posenc.torch import HFRotaryEmbedding, hf, patch_hf  # noqa: E402

REPRESENTATIVE = (
    "llama",  # half layout, every layer through the decoder's rotary module
    "phi",  # partial rotary: the attention slices q[..., :rotary_dim] itself
    "glm",  # interleaved pairs made by the apply function from half-order cos/sin
    "cohere",  # interleaved cos/sin from the rotary module
    "gpt_neox",  # partial rotary
    "qwen3_moe",  # MoE, q/k norms
    "deepseek_v3",  # latent attention: interleaved pairs in, half order out
    "gemma3_text",  # rope parameters nested per layer type
    "gemma4_text",  # a head size per layer type (per_layer_config), an apply function turning one tensor a call
    "bloom",  # ALiBi of the padded key positions
    "gptj",  # its apply function takes (tensor, sin, cos), interleaved
    "roformer",  # a static apply method on self, (sinusoidal_pos, q, k), interleaved
    "gpt_oss",  # one cos/sin per pair, [..., r/2]
    "deepseek_v2",  # a complex table cos + i sin, apply(xq, xk, freqs_cis)
    "mpt",  # ALiBi from the last query, its builder (num_heads, sequence_length)
)
TYPES = hf_zoo.model_types() if os.environ.get("POSENC_HF_ZOO") == "all" else REPRESENTATIVE


@pytest.mark.parametrize("model_type", TYPES)
def test_patched_architecture_matches_or_is_refused(model_type):
    row = hf_zoo.check(model_type)
    if not row.buildable:
        pytest.skip(f"{model_type}: {row.refused}")
    if row.refused:
        assert model_type not in hf.SUPPORTED, f"{model_type} is listed as supported but refused: {row.refused}"
        assert row.refused.startswith("patch_hf left") or "has no positional part patch_hf recognises" in row.refused
        return
    assert row.diff <= row.tolerance, f"{model_type}: logits differ by {row.diff:.3g} (float32 rounding of this model: {row.tolerance:.3g})"
    assert row.tokens_equal, f"{model_type}: greedy generate() gives other tokens"
    assert model_type in hf.SUPPORTED


def test_a_refused_model_is_left_unchanged():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = hf_zoo.build("llama")
    rotary = model.model.rotary_emb
    rotary.inv_freq.mul_(1.001)  # its own frequencies no longer follow its config
    with pytest.raises(ValueError, match=r"rotary module model\.rotary_emb \(LlamaRotaryEmbedding\): (cos|sin) differs from posenc's by"):
        patch_hf(model)
    assert model.model.rotary_emb is rotary and not hasattr(model, "posenc_patched")
    assert not any(isinstance(m, HFRotaryEmbedding) for m in model.modules())
    assert all("forward" not in vars(m) for m in model.modules())


def test_an_apply_function_also_called_with_a_query_alone_is_refused():
    """Qwen4-Exp's ``apply_rotary_pos_emb(q, k=None, cos=None, sin=None)``, which its indexer
    calls with a query alone, is refused by name: posenc's replacement takes ``(q, k, cos,
    sin)``, and a model patched with it raised ``TypeError`` in its forward."""
    row = hf_zoo.check("qwen4_exp_text")
    assert row.buildable and not row.patched
    assert "apply_rotary_pos_emb: takes (q, k, cos, sin, unsqueeze_dim) with defaults for k, cos, sin" in row.refused


# --- from_hf against every rotary module's own frequencies ------------------------------------

# Packages whose rotary modules are compared by default (POSENC_HF_ZOO=all: every package):
# default initialisers that rotate the whole head whatever partial_rotary_factor says (flat,
# nested per layer type, a head size per layer type, one module built from four configs) and
# ones that read it (flat, nested, MiMo-V2-Flash's own default of 0.334, GLM-ASR's encoder
# beside its LLaMA text model).
ROTARY_PACKAGES = (
    "llama", "qwen3", "gemma3", "gemma4", "blt", "hunyuan_v1_dense",
    "phi", "stablelm", "gpt_neox", "glm", "deepseek_v4", "mimo_v2_flash", "glmasr",
)
# Not compared: modules whose tables are not RoPE of the head's leading channels, and one
# config without a model type (from_hf reads its factor as given).
NOT_HEAD_ROPE = {
    "EfficientLoFTRRotaryEmbedding(EfficientLoFTRConfig)": "2-D RoPE of image features (a partial_rotary_factor of 4)",
    "EomtDinov3RotaryEmbedding(EomtDinov3Config)": "2-D RoPE of patches, a quarter of the head per axis",
    "Ernie4_5_VLMoeTextRotaryEmbedding(Ernie4_5_VLMoeTextConfig)": "pre-rotated height and width pairs (docs/transformers.md)",
    "MusicFlamingoRotaryEmbedding(MusicFlamingoConfig)": "2-D axial RoPE of window and time",
    "Qwen3OmniMoeRotaryEmbedding(Qwen3OmniMoeCode2WavConfig)": "a config whose model_type is empty",
}
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    ROTARY = [
        pytest.param(module, config, id=f"{module.__name__}({config.__name__})")
        for module, configs in hf_zoo.rotary_modules(None if os.environ.get("POSENC_HF_ZOO") == "all" else ROTARY_PACKAGES)
        for config in configs
        if f"{module.__name__}({config.__name__})" not in NOT_HEAD_ROPE
    ]


@pytest.mark.parametrize("partial_rotary_factor", [0.5, None], ids=["partial=0.5", "partial=own"])
@pytest.mark.parametrize(("module", "config_class"), ROTARY)
def test_from_hf_gives_the_frequencies_of_the_models_default_rotary_module(module, config_class, partial_rotary_factor):
    """``from_hf(config)`` (``rope_type="default"``) has the rotary dimension, frequencies and
    attention scale of the rotary module transformers builds from ``config``: where its default
    initialiser rotates the whole head whatever ``partial_rotary_factor`` says (LLaMA, Qwen3,
    Gemma 3, ...), the whole head; where it reads it (Phi, StableLM, GPT-NeoX, GLM, ...), the
    factor of the head. Before, a factor of 0.5 gave half the LLaMA head, silently."""
    import numpy as np

    import posenc as pe

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            rotary, config = hf_zoo.default_rotary(module, config_class, partial_rotary_factor)
        except hf_zoo.Unbuildable as why:
            pytest.skip(str(why))
    buffers = {name: b for name, b in rotary.named_buffers() if name.endswith("inv_freq") and "original" not in name}
    assert buffers
    for name, theirs in buffers.items():
        layer_type = None if name == "inv_freq" else name.removesuffix("_inv_freq")
        read = pe.scaling.from_hf(config, layer_type=layer_type)
        assert read.rotary_dim == 2 * theirs.numel(), f"{name}: from_hf rotates {read.rotary_dim} channels, the model {2 * theirs.numel()}"
        inv_freq, scale = pe.rope_frequencies(read.rotary_dim, base=read.base, scaling=read.scaling)
        np.testing.assert_allclose(inv_freq, theirs.double().numpy(), rtol=1e-6)
        assert scale == getattr(rotary, "attention_scaling" if layer_type is None else f"{layer_type}_attention_scaling")
