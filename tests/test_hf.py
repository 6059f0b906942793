"""The Hugging Face drop-in against transformers itself (tiny random models built from configs).

The original model is the oracle: a patched copy must give its logits within float32
rounding and the same greedy ``generate()`` tokens (KV cache, left-padded batch), for every
``rope_type`` (``dynamic`` and ``longrope`` across their switch length), the LLaMA family,
T5's relative bias (T5, mT5, UMT5, LongT5 local and transient-global, Switch Transformers,
Pop2Piano, Pix2Struct's decoder) and ALiBi (BLOOM, Falcon with ``alibi=True``, MPT).
``tests/hf_models.py`` builds the models; ``python tests/hf_models.py`` prints the table. Bad input (configs, layer types, other architectures): test_bad_inputs.py.
"""

from __future__ import annotations

import copy
import inspect
import itertools
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import posenc as pe  # noqa: E402
from hf_models import LLAMA_ROPE, MODELS, NEW, PROMPT, SWITCH, VOCAB, build, compare, generate, inputs, logits  # noqa: E402
from posenc.torch import HFRotaryEmbedding, T5RelativeBias, patch_hf  # noqa: E402
from posenc.torch import _rows  # noqa: E402
from transformers import LlamaConfig  # noqa: E402
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding  # noqa: E402

# Float32 rounding of a two-layer model: transformers forms its angles in float32, posenc
# in float64; measured differences are below 3e-6 of the largest logit.
RELATIVE = 1e-5


@pytest.mark.parametrize("name", list(MODELS))
def test_patched_model_matches_the_original(name):
    diff, same_tokens, patched = compare(name)
    ids, mask = inputs()
    scale = float(logits(patched, ids, mask).abs().max())
    assert diff <= RELATIVE * scale, f"{name}: logits differ by {diff:.3g} (largest logit {scale:.3g})"
    assert same_tokens, f"{name}: greedy generate() gives other tokens"
    _assert_routed_through_posenc(patched)


def _generated(model, ids, mask, new=NEW, **settings):
    """``generate()``'s output with each step's logits (GenerationMixin's: Pop2Piano has its own)."""
    from transformers import GenerationMixin

    with torch.no_grad():
        return GenerationMixin.generate(
            model, input_ids=ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0,
            output_logits=True, return_dict_in_generate=True, **settings,
        )


def _continued(model, ids, mask, first=5):
    """``first`` greedy tokens, then the rest of ``NEW`` from the cache that generate() returned."""
    start = _generated(model, ids, mask, new=first)
    if model.config.is_encoder_decoder:
        return _generated(model, ids, mask, new=NEW - first, decoder_input_ids=start.sequences, cache=start.cache)
    grown = torch.cat([mask, torch.ones(mask.shape[0], first, dtype=mask.dtype)], -1)
    return _generated(model, start.sequences, grown, new=NEW - first, cache=start.cache)


@pytest.mark.parametrize("name", ["llama[dynamic]", "llama[longrope]", "t5"])
def test_beam_search_a_static_cache_a_continued_cache_and_a_row_alone_give_the_originals_tokens(name):
    """Decoding modes besides greedy search with a dynamic cache: beam search (2 beams), a
    static cache (``cache_implementation="static"``; T5's ``past_seen_tokens`` is then a
    tensor), generation continued from the cache a first generate() returned, and the padded
    row of the batch alone give the original's tokens, and its logits at every step within
    float32 rounding. The left-padded prompts of 10 tokens grow past the switch length 16:
    dynamic NTK's frequencies are recomputed and LongRoPE takes its long factors
    mid-generate, as transformers does."""
    original = build(name)
    patched = patch_hf(copy.deepcopy(original))
    ids, mask = inputs()
    prompt = ids[:, :PROMPT], mask[:, :PROMPT]
    alone = ids[1:, :PROMPT][:, mask[1, :PROMPT].bool()], None
    runs = {
        "beam search": lambda m: _generated(m, *prompt, num_beams=2),
        "static cache": lambda m: _generated(m, *prompt, cache_implementation="static"),
        "continued cache": lambda m: _continued(m, *prompt),
        "padded row alone": lambda m: _generated(m, *alone),
    }
    for run, generated in runs.items():
        want, got = generated(original), generated(patched)
        assert torch.equal(got.sequences, want.sequences), f"{name}, {run}: other tokens"
        for step, (w, g) in enumerate(zip(want.logits, got.logits)):
            torch.testing.assert_close(g, w, atol=RELATIVE * float(w.abs().max()), rtol=0, msg=f"{name}, {run}, step {step}")


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("name", ["llama[default]", "llama[yarn]", "qwen3", "gpt_neox[partial]", "gemma3_text[nested]"])
def test_a_16_bit_patched_model_is_as_close_to_the_float32_model_as_the_original(name, dtype):
    """In a float16/bfloat16 model posenc rounds each rotated value once where transformers
    rounds three times, with angles in float64 rather than float32: the logits differ from
    the original's by the dtype's rounding (not within float32 rounding, as in float32
    models), and are no further from the same model in float32 than the original's."""
    reference = build(name)
    original = copy.deepcopy(reference).to(getattr(torch, dtype))
    patched = patch_hf(copy.deepcopy(original))
    ids, mask = inputs()
    real = mask.bool()[..., None].expand(-1, -1, reference.config.vocab_size)
    exact = logits(reference, ids, mask)[real]
    before, after = logits(original, ids, mask).float()[real], logits(patched, ids, mask).float()[real]
    scale = float(exact.abs().max())
    assert float((after - before).abs().max()) <= 0.06 * scale  # about 15 bfloat16 ulps of the largest logit
    assert float((after - exact).abs().mean()) <= 1.1 * float((before - exact).abs().mean())
    _assert_routed_through_posenc(patched)


def _assert_routed_through_posenc(model):
    """The patch took: no transformers rotary module or bias function is left in the positional path."""
    from posenc.torch import hf_patch

    patched = model.posenc_patched
    if model.config.is_encoder_decoder:  # the T5 family: every layer holding a bias table
        layers = [m for m in model.modules() if isinstance(getattr(m, "relative_attention_bias", None), torch.nn.Embedding)]
        assert layers and all(isinstance(m.compute_bias, hf_patch._T5Bias) and m.compute_bias.table is m.relative_attention_bias.weight for m in layers)
        sides = [m for m in model.modules() if hasattr(m, "global_relative_attention_bias")]  # LongT5 transient-global
        assert all(isinstance(m.compute_side_bias, hf_patch._LongT5SideBias) for m in sides)
        assert len(patched) == len(layers) + len(sides)
    elif model.config.model_type == "bloom":
        assert model.transformer.build_alibi_tensor is hf_patch.bloom_alibi_tensor
    elif model.config.model_type == "mpt":
        assert model.transformer.build_mpt_alibi_tensor is hf_patch.mpt_alibi_tensor
    elif model.config.model_type == "falcon":  # the ALiBi builder Falcon's model calls as a global
        assert inspect.unwrap(model.transformer.forward.method.__func__).__globals__["build_alibi_tensor"] is hf_patch.falcon_alibi_tensor
        assert "transformer build_alibi_tensor: alibi_bias (in bfloat16)" in patched
    else:
        rotary = [m for m in model.modules() if type(m).__name__.endswith("RotaryEmbedding")]
        assert rotary and all(isinstance(m, HFRotaryEmbedding) for m in rotary)
        attention = [m for m in model.modules() if "forward" in vars(m)]
        assert attention and all(inspect.unwrap(m.forward.method.__func__).__globals__["apply_rotary_pos_emb"] in hf_patch.LAYOUTS for m in attention)
        assert len(patched) == len(rotary) + len(attention)


def test_dynamic_keeps_transformers_state_across_calls():
    """transformers' ``dynamic`` module keeps the longest length seen (until a call shorter
    than ``max_position_embeddings`` resets it): after a long call, a shorter one longer than
    that keeps the long base. A second forward or generate() and assisted decoding's
    shorter verifying calls make such calls; the patch gives their logits (it had decided
    per call: 4.97 off on the second prompt, other tokens)."""
    original = build("llama[dynamic]")
    patched = patch_hf(copy.deepcopy(original))
    generator = torch.Generator().manual_seed(3)
    lengths = (30, 20, 24, 12, 20, 40, 17)  # grow, keep, keep, reset, keep (original), grow, keep
    for length in lengths:
        ids = torch.randint(1, VOCAB, (1, length), generator=generator)
        with torch.no_grad():
            want, got = original(input_ids=ids).logits, patched(input_ids=ids).logits
        torch.testing.assert_close(got, want, atol=RELATIVE * float(want.abs().max()), rtol=0, msg=f"length {length}")


@pytest.mark.parametrize("rope", ["dynamic", "longrope"])
def test_float_position_ids_give_the_integer_ids_length(rope):
    """transformers casts position ids to float itself, so float ids are legal input: the
    length-dependent scalings read ``floor(max) + 1`` (a float length had raised)."""
    original = build(f"llama[{rope}]")
    patched = patch_hf(copy.deepcopy(original))
    ids = torch.randint(1, VOCAB, (1, 20), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        want = original(input_ids=ids, position_ids=torch.arange(20.0)[None]).logits
        got = patched(input_ids=ids, position_ids=torch.arange(20.0)[None]).logits
    torch.testing.assert_close(got, want, atol=RELATIVE * float(want.abs().max()), rtol=0)


@pytest.mark.parametrize("state", [False, True])
@pytest.mark.parametrize("rope", ["dynamic", "longrope"])
def test_negative_position_ids_give_the_original_length(rope, state):
    """Ids that are all negative have length max + 1 <= 0: transformers' modules take the
    original frequencies there (and its dynamic state resets as for any short call). Float
    ids had raised ValueError (the length -6 of ids -9..-7 refused as a seq_len), integer
    ids gave tables: both now give transformers' tables, after a long call too."""
    config = _llama_config(rope)
    theirs, ours = LlamaRotaryEmbedding(config), HFRotaryEmbedding(config, transformers_state=state)
    x = torch.zeros(1, dtype=torch.float32)
    atol = 8 * 2.0**-24 * 3 * SWITCH
    for ids in (torch.arange(3 * SWITCH)[None], torch.tensor([[-9.0, -8.0, -7.0]]), torch.tensor([[-9, -8, -7]]), torch.arange(3 * SWITCH)[None]):
        want, got = theirs(x, ids), ours(x, ids)
        for w, g in zip(want, got):
            torch.testing.assert_close(g, w, atol=atol, rtol=0, msg=f"ids {ids.flatten()[:3].tolist()}")


@pytest.mark.parametrize("rope", ["dynamic", "longrope"])
def test_length_dependent_scalings_really_switch_in_these_runs(rope):
    # The comparison above has teeth: the runs cross the switch length, and rotary tables
    # frozen at the short length (what a stateful module that missed the switch would use)
    # change the logits by far more than the tolerance.
    assert PROMPT < SWITCH < PROMPT + NEW
    model = build(f"llama[{rope}]")
    frozen = patch_hf(copy.deepcopy(model))
    for module in frozen.modules():
        if isinstance(module, HFRotaryEmbedding):
            module.forward = _frozen_at(module, SWITCH)
    ids, mask = inputs()
    diff = float((logits(model, ids, mask) - logits(frozen, ids, mask)).abs()[mask.bool()].max())
    assert diff > 1e-2


def _frozen_at(module, seq_len):
    def forward(x, position_ids, layer_type=None):
        rope = module._rope[module._key(layer_type)]
        inv_freq, scale = pe.rope_frequencies(rope.rotary_dim, base=rope.base, scaling=rope.scaling, seq_len=seq_len)
        return pe.rope_cos_sin(position_ids, inv_freq, dtype=x.dtype, scale=scale)

    return forward


# --- HFRotaryEmbedding against the transformers rotary module --------------------------------


def _llama_config(rope, max_position_embeddings=SWITCH, head_dim=16):
    params = {**(LLAMA_ROPE[rope] or {"rope_type": "default"}), "rope_theta": 500.0}
    return LlamaConfig(hidden_size=4 * head_dim, num_attention_heads=4, head_dim=head_dim, max_position_embeddings=max_position_embeddings, rope_parameters=params)


@pytest.mark.parametrize("rope", list(LLAMA_ROPE))
@pytest.mark.parametrize("length", [SWITCH - 4, SWITCH, SWITCH + 1, 3 * SWITCH])
def test_cos_sin_equal_the_transformers_module(rope, length):
    config = _llama_config(rope)
    theirs, ours = LlamaRotaryEmbedding(config), HFRotaryEmbedding(config)
    x = torch.zeros(1, dtype=torch.float32)
    position_ids = torch.stack([torch.arange(length), torch.arange(length) + 1])  # row 1 one longer
    want_cos, want_sin = theirs(x, position_ids)
    got_cos, got_sin = ours(x, position_ids)
    assert got_cos.dtype == torch.float32 and got_cos.shape == want_cos.shape
    # transformers rounds the angle p * theta to float32: a few ulps of the largest angle.
    atol = 8 * 2.0**-24 * 3 * SWITCH
    torch.testing.assert_close(got_cos, want_cos, atol=atol, rtol=0)
    torch.testing.assert_close(got_sin, want_sin, atol=atol, rtol=0)


def test_cos_sin_in_the_dtype_of_x_with_float64_angles():
    config = _llama_config("linear")
    position = torch.tensor([[2**20 + 3]])
    cos, _ = HFRotaryEmbedding(config)(torch.zeros(1, dtype=torch.bfloat16), position)
    assert cos.dtype == torch.bfloat16
    inv_freq, _ = pe.rope_frequencies(16, base=500.0, scaling=pe.scaling.Linear(2.0))
    exact = np.cos(float(position) * inv_freq)
    np.testing.assert_allclose(cos[0, 0, :8].float().numpy(), exact, atol=2**-8)


def test_module_is_stateless_across_calls_unless_it_follows_transformers_state():
    # transformers' dynamic module keeps the longest length it saw until a call shorter than
    # max_position_embeddings resets it. HFRotaryEmbedding decides every call afresh, like
    # pe.rope; with transformers_state=True (patch_hf's) it follows that state call by call.
    config = _llama_config("dynamic")
    x = torch.zeros(1)
    short, long = torch.arange(SWITCH + 2)[None], torch.arange(4 * SWITCH)[None]
    stateless = HFRotaryEmbedding(config)
    fresh = stateless(x, short)
    stateless(x, long)
    for got, want in zip(stateless(x, short), fresh):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    ours, theirs = HFRotaryEmbedding(config, transformers_state=True), LlamaRotaryEmbedding(config)
    for length in (SWITCH + 2, 4 * SWITCH, SWITCH + 2, SWITCH - 4, SWITCH + 2, 2 * SWITCH, 3 * SWITCH):
        ids = torch.arange(length)[None]
        for got, want in zip(ours(x, ids), theirs(x, ids)):
            torch.testing.assert_close(got, want, atol=1e-6, rtol=0, msg=f"length {length}")
    assert not torch.allclose(ours(x, short)[1], fresh[1])  # (3 * SWITCH is remembered: the state there is to follow)


@pytest.mark.parametrize("state", [False, True], ids=["stateless", "transformers_state"])
@pytest.mark.parametrize("rope", ["dynamic", "longrope"])
def test_a_length_dependent_module_reads_kept_rows_up_to_the_original_length(monkeypatch, rope, state):
    """Dynamic NTK and LongRoPE do not depend on the length up to the original one: an eager
    CPU call there reads the kept rows of those frequencies (no frequencies computed per
    call), with the bits of ``rope_cos_sin`` at the call's own frequencies; past it, the
    frequencies of its length."""
    from posenc.torch import hf

    config = _llama_config(rope)
    module = HFRotaryEmbedding(config, transformers_state=state)
    scaling = module._rope[None].scaling
    original = scaling.original_max_position
    for length in (1, original - 1, original, original + 1, 3 * original):
        ids = torch.arange(length)[None]
        for dtype in (torch.float32, torch.bfloat16):
            inv_freq, scale = pe.rope_frequencies(16, base=500.0, scaling=scaling, seq_len=length)
            want = pe.rope_cos_sin(ids, inv_freq, dtype=dtype, scale=scale)
            with monkeypatch.context() as patch:
                if length <= original:
                    patch.setattr(hf.pe, "rope_frequencies", lambda *a, **k: pytest.fail("frequencies computed for a call at most the original length"))
                got = module(torch.zeros(1, dtype=dtype), ids)
            for g, w in zip(got, want):
                assert torch.equal(g, w), (length, dtype)


@pytest.mark.parametrize("rope", ["default", "dynamic", "longrope"])
def test_bool_or_nan_position_ids_are_refused_by_every_rope_type(rope):
    """Boolean ids are a ``TypeError`` (read as indices of kept rows they had selected rows
    as a mask, silently); a NaN id is a ``ValueError`` naming position_ids, before any
    transformers state is updated."""
    module = HFRotaryEmbedding(_llama_config(rope), transformers_state=True)
    ids = torch.arange(64)[None] % 3 == 0
    with pytest.raises(TypeError, match="position_ids must be integers or floats"):
        module(torch.zeros(1), ids)
    with pytest.raises(ValueError, match="finite"):
        module(torch.zeros(1), torch.tensor([[0.0, float("nan")]]))


def test_module_under_vmap_equals_a_loop_over_the_rows():
    """``torch.func.vmap`` over position ids (transformers' default module allows it): the
    kept rows cannot be read there, so the tables are computed afresh, each row's bits."""
    module = HFRotaryEmbedding(_llama_config("default"))
    ids = torch.stack([torch.arange(12), torch.arange(12) + 2])[:, None]
    got = torch.func.vmap(lambda p: module(torch.zeros(1), p))(ids)
    for row in range(2):
        for g, w in zip(got, module(torch.zeros(1), ids[row])):
            assert torch.equal(g[row], w)


def test_transformers_state_of_a_module_built_in_inference_mode_updates_outside_it():
    with torch.inference_mode():
        ours = HFRotaryEmbedding(_llama_config("dynamic"), transformers_state=True)
    with torch.no_grad():  # as generate() calls it
        ours(torch.zeros(1), torch.arange(4 * SWITCH)[None])


def test_transformers_state_of_a_module_moved_in_inference_mode_updates_outside_it():
    """A move (``_apply``) or ``to_empty`` under ``torch.inference_mode`` made the dynamic
    state's buffer an inference tensor: the next call outside it past the original length
    raised RuntimeError (in-place update to an inference tensor)."""
    from posenc.torch.hf import MultimodalHFRotaryEmbedding

    mrope = transformers.PretrainedConfig(
        model_type="qwen3_vl_text", hidden_size=256, num_attention_heads=4, head_dim=64, max_position_embeddings=SWITCH,
        rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4, "mrope_section": [12, 10, 10]},
    )
    ids = torch.arange(4 * SWITCH)[None]
    for kind, config in ((HFRotaryEmbedding, _llama_config("dynamic")), (MultimodalHFRotaryEmbedding, mrope)):
        fresh = kind(config, transformers_state=True)
        want = fresh(torch.zeros(1), ids)
        with torch.device("meta"):
            materialised = kind(config, transformers_state=True)
        moved = kind(config, transformers_state=True)
        with torch.inference_mode():
            materialised.to_empty(device="cpu")
            moved._apply(lambda t: t.clone())  # (what a move to another device does)
        for module in (materialised, moved):
            with torch.no_grad():  # as generate() calls it
                got = module(torch.zeros(1), ids)
            assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_patch_hf_takes_the_dynamic_state_the_model_has_not_its_probes():
    """patch_hf probes the rotary module with long positions: the patched model starts from
    the unpatched module's state (here after a long call of its own), not the probe's."""
    original = build("llama[dynamic]")
    ids = torch.randint(1, VOCAB, (1, 40), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        original(input_ids=ids)  # transformers' module now remembers 40
    patched = patch_hf(copy.deepcopy(original))
    for length in (20, SWITCH + 1, 12, 20):
        with torch.no_grad():
            want, got = original(input_ids=ids[:, :length]).logits, patched(input_ids=ids[:, :length]).logits
        torch.testing.assert_close(got, want, atol=RELATIVE * float(want.abs().max()), rtol=0, msg=f"length {length}")


def test_nested_per_layer_type_parameters():
    model = build("gemma3_text[nested]")
    config = model.config
    ours = HFRotaryEmbedding(config)
    theirs = model.model.rotary_emb
    x, position_ids = torch.zeros(1), torch.arange(20)[None]
    for layer_type in ("sliding_attention", "full_attention"):
        for got, want in zip(ours(x, position_ids, layer_type), theirs(x, position_ids, layer_type)):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    fixed = HFRotaryEmbedding(config, layer_type="full_attention")
    torch.testing.assert_close(fixed(x, position_ids)[1], ours(x, position_ids, "full_attention")[1])


def test_a_head_size_per_layer_type_is_read_from_that_layer_types_config():
    """Gemma 4's config holds a head size per layer type (``per_layer_config``; reading
    ``config.head_dim`` raises transformers' RuntimeError): each layer type's tables have its
    own width. Its apply function turns one tensor a call, ``(x, cos, sin, unsqueeze_dim)``:
    the patched model gives its logits and greedy tokens."""
    config = transformers.Gemma4TextConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, global_head_dim=32, max_position_embeddings=64, sliding_window=6,
        layer_types=["sliding_attention", "full_attention"], vocab_size_per_layer_input=VOCAB, hidden_size_per_layer_input=16,
    )
    model = transformers.Gemma4ForCausalLM(config).eval()
    ours, theirs = HFRotaryEmbedding(config), model.model.rotary_emb
    x, position_ids = torch.zeros(1), torch.arange(20)[None]
    for layer_type, width in (("sliding_attention", 16), ("full_attention", 32)):
        for got, want in zip(ours(x, position_ids, layer_type), theirs(x, position_ids, layer_type)):
            assert got.shape[-1] == width
            torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    assert pe.scaling.from_hf(config, layer_type="full_attention").rotary_dim == 32
    with pytest.raises(ValueError, match="per layer type"):
        pe.scaling.from_hf(config)
    patched = patch_hf(copy.deepcopy(model))
    assert patched.posenc_patched[1] == "model.layers.0.self_attn: apply_rotary_pos_emb: apply_rope (half, one tensor)"
    ids, mask = inputs()
    want = logits(model, ids, mask)
    torch.testing.assert_close(logits(patched, ids, mask)[mask.bool()], want[mask.bool()], atol=RELATIVE * float(want.abs().max()), rtol=0)
    prompt, prompt_mask = ids[:, :PROMPT], mask[:, :PROMPT]
    assert torch.equal(generate(patched, prompt, prompt_mask), generate(model, prompt, prompt_mask))


def _image_position_ids(batch=2, length=PROMPT + NEW):
    """M-RoPE position ids ``[3, batch, length]`` of a 3x4 image at tokens 5-16: its tokens share
    the temporal id 5 and take their row and column as height and width, as Qwen2-VL's
    ``get_rope_index`` makes them; the text after it goes on from the largest."""
    seq = torch.arange(length)
    image = (seq >= 5) & (seq < 17)
    after = torch.where(seq >= 17, seq - 17 + 9, seq)
    axes = [torch.where(image, 5 + 0 * seq, after), torch.where(image, 5 + (seq - 5) // 4, after), torch.where(image, 5 + (seq - 5) % 4, after)]
    return torch.stack(axes)[:, None].expand(3, batch, length)


def _qwen3_5(**rope):
    config = transformers.Qwen3_5TextConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
        head_dim=32, max_position_embeddings=64, initializer_range=0.25, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 500.0, "partial_rotary_factor": 0.5, "mrope_section": [3, 3, 2], **rope},
    )
    torch.manual_seed(0)
    return transformers.Qwen3_5ForCausalLM(config).eval()


@pytest.mark.parametrize(
    "rope",
    [{}, {"rope_type": "linear", "factor": 2.0}, {"rope_type": "dynamic", "factor": 2.0}, {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}],
    ids=["default", "linear", "dynamic", "yarn"],
)
def test_patch_hf_reproduces_a_multimodal_text_rotary_module(rope):
    """M-RoPE text rotary modules (Qwen3.5's: position ids ``[3, batch, seq]``, the pairs dealt
    out in turn to the temporal, height and width ids) become ``MultimodalHFRotaryEmbedding``,
    checked on ids that differ per axis: an image's positions give the original's logits, and
    greedy ``generate()`` its tokens. (patch_hf had refused every M-RoPE module.)"""
    from posenc.torch.hf import MultimodalHFRotaryEmbedding

    original = _qwen3_5(**rope)
    patched = patch_hf(copy.deepcopy(original))
    assert type(patched.model.rotary_emb) is MultimodalHFRotaryEmbedding
    ids, mask = inputs()
    positions = _image_position_ids()
    with torch.no_grad():
        want = original(input_ids=ids, position_ids=positions).logits
        got = patched(input_ids=ids, position_ids=positions).logits
        text = original(input_ids=ids, position_ids=positions[0]).logits  # every axis the text's: other logits
    torch.testing.assert_close(got, want, atol=RELATIVE * float(want.abs().max()), rtol=0)
    assert float((text - want).abs().max()) > 1e-2
    prompt = (ids[:, :PROMPT], mask[:, :PROMPT])
    assert torch.equal(generate(patched, *prompt), generate(original, *prompt))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
@pytest.mark.parametrize(
    "model, sections, dealt",
    [("qwen2_vl_text", [16, 24, 24], False), ("qwen3_vl_text", [24, 20, 20], True), ("glm4v_text", [8, 12, 12], False), ("qwen3_5_text", [11, 11, 10], True)],
)
def test_multimodal_hf_rotary_embedding_gives_mrope_cos_sin_bits(model, sections, dealt, dtype):
    """``MultimodalHFRotaryEmbedding`` (the kept rows of each axis's ids, each pair's entries
    taken from its axis's bits) gives :func:`posenc.mrope_cos_sin`'s tables bit for bit: one
    decode position, a prefill, ids past the kept rows (``2**16``, computed afresh), text ids
    ``[batch, seq]``; GLM-4V's each entry twice in a row."""
    from posenc.torch.hf import InterleavedMultimodalHFRotaryEmbedding, MultimodalHFRotaryEmbedding

    glm = model.startswith("glm")
    head_dim = 64 if model == "qwen3_5_text" else 128
    config = transformers.PretrainedConfig(
        model_type=model, hidden_size=8 * head_dim, num_attention_heads=8, head_dim=head_dim, max_position_embeddings=4096,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": sections, "partial_rotary_factor": 0.5 if glm else 1.0},
    )
    module = (InterleavedMultimodalHFRotaryEmbedding if glm else MultimodalHFRotaryEmbedding)(config)
    rope = pe.scaling.from_hf(config)
    inv_freq, scale = pe.rope_frequencies(rope.rotary_dim, base=rope.base, scaling=rope.scaling)
    x = torch.zeros(1, dtype=dtype)
    for start, length in ((700, 1), (0, 300), ((1 << 16) - 5, 40)):
        seq = torch.arange(start, start + length)
        for ids in (torch.stack([seq, seq // 2 + 1, seq % 7])[:, None].expand(3, 2, -1), seq[None]):
            cos, sin = module(x, ids)
            want = pe.mrope_cos_sin(ids.expand(3, -1, -1), inv_freq, sections, interleaved=dealt, layout="interleaved" if glm else "half", dtype=dtype, scale=scale)
            assert cos.dtype == dtype and torch.equal(cos, want[0]) and torch.equal(sin, want[1]), (start, tuple(ids.shape))


@pytest.mark.parametrize("glm", [False, True], ids=["dealt, half order", "consecutive, twice in a row"])
def test_multimodal_hf_rotary_embedding_compiles_to_its_eager_bits(glm):
    """``torch.compile(fullgraph=True)`` of ``MultimodalHFRotaryEmbedding`` (masks on the bits,
    the wide-integer doubling of GLM-4V's many entries) gives the eager bits: a decode
    position, a prefill, ids past the kept rows."""
    from posenc.torch.hf import InterleavedMultimodalHFRotaryEmbedding, MultimodalHFRotaryEmbedding

    config = transformers.PretrainedConfig(
        model_type="glm4v_text" if glm else "qwen3_vl_text", hidden_size=256, num_attention_heads=4, head_dim=64, max_position_embeddings=4096,
        rope_parameters={"rope_type": "default", "rope_theta": 1e4, "mrope_section": [12, 10, 10]},
    )
    module = (InterleavedMultimodalHFRotaryEmbedding if glm else MultimodalHFRotaryEmbedding)(config)
    compiled = torch.compile(module, fullgraph=True)
    x = torch.zeros(1, dtype=torch.bfloat16)
    for start, length in ((700, 1), (0, 300), ((1 << 16) - 5, 40)):
        seq = torch.arange(start, start + length)
        ids = torch.stack([seq, seq // 2, seq % 7])[:, None]
        assert all(torch.equal(a, b) for a, b in zip(compiled(x, ids), module(x, ids))), (start, length)


def test_rotary_modules_materialised_from_the_meta_device_start_as_built_in_place():
    """``to_empty`` leaves a buffer whatever memory held: the dynamic state's length (a first
    call past the original length took its frequencies at that garbage length, cos off by 2)
    and the M-RoPE axis masks. They start as a module built in place does; a move keeps the
    state of the calls before it."""
    from posenc.torch.hf import MultimodalHFRotaryEmbedding

    config = _llama_config("dynamic")
    mrope = transformers.PretrainedConfig(
        model_type="qwen3_vl_text", hidden_size=256, num_attention_heads=4, head_dim=64, max_position_embeddings=64,
        rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4, "mrope_section": [12, 10, 10]},
    )
    x = torch.zeros(1)
    for kind, conf, ids in ((HFRotaryEmbedding, config, torch.arange(3 * SWITCH)[None]), (MultimodalHFRotaryEmbedding, mrope, torch.arange(200)[None].expand(3, 1, -1) // torch.tensor([1, 2, 3])[:, None, None])):
        for _ in range(3):  # (garbage differs from one allocation to the next)
            with torch.device("meta"):
                built = kind(conf, transformers_state=True)
            materialised, fresh = built.to_empty(device="cpu"), kind(conf, transformers_state=True)
            for call in (ids, ids[..., :5]):
                assert all(torch.equal(a, b) for a, b in zip(materialised(x, call), fresh(x, call)))
        fresh(x, ids)
        moved = copy.deepcopy(fresh).to("cpu", torch.float64)  # (its longest length seen: 3 * SWITCH or 200)
        assert all(torch.equal(a, b) for a, b in zip(moved(x, ids[..., :SWITCH + 2]), fresh(x, ids[..., :SWITCH + 2])))


def _tiny_vision_language(kind):
    """A tiny randomly initialised vision-language model of transformers (M-RoPE text model, a vision encoder with its own rotary parts)."""
    text = dict(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=256, initializer_range=0.25, rope_parameters={"rope_type": "default", "rope_theta": 500.0, "mrope_section": [2, 3, 3]},
    )
    patches = dict(patch_size=4, spatial_merge_size=2, temporal_patch_size=2)
    tokens = dict(image_token_id=IMAGE_TOKEN, video_token_id=IMAGE_TOKEN + 1)
    starts = dict(vision_start_token_id=IMAGE_TOKEN + 2, vision_end_token_id=IMAGE_TOKEN + 3)
    vision = dict(depth=2, hidden_size=32, out_hidden_size=64, num_heads=2, intermediate_size=48, **patches)
    if kind == "qwen2_vl":
        config = transformers.Qwen2VLConfig(text_config=text, vision_config=dict(depth=1, embed_dim=32, hidden_size=64, num_heads=2, mlp_ratio=2, **patches), **tokens, **starts)
        model = transformers.Qwen2VLForConditionalGeneration
    elif kind == "qwen2_5_vl":
        config = transformers.Qwen2_5_VLConfig(text_config=text, vision_config=dict(vision, window_size=16, fullatt_block_indexes=[1]), **tokens, **starts)
        model = transformers.Qwen2_5_VLForConditionalGeneration
    elif kind == "qwen3_vl":
        config = transformers.Qwen3VLConfig(text_config=dict(text, head_dim=16), vision_config=dict(vision, num_position_embeddings=64, deepstack_visual_indexes=[1]), **tokens, **starts)
        model = transformers.Qwen3VLForConditionalGeneration
    else:
        config = transformers.Glm4vConfig(text_config=text, vision_config=dict(vision, depth=1), **tokens, image_start_token_id=IMAGE_TOKEN + 2, image_end_token_id=IMAGE_TOKEN + 3)
        model = transformers.Glm4vForConditionalGeneration
    torch.manual_seed(0)
    return model(config).eval()


IMAGE_TOKEN = VOCAB - 8


@pytest.mark.parametrize("kind", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "glm4v"])
def test_a_vision_language_models_language_model_is_patched_alone(kind):
    """A whole vision-language model is refused (its vision encoder's rotary module returns a
    table of angles for a length, not ``(cos, sin)`` of position ids), and the refusal says
    that its language model passes every check and how to patch it alone. Patched alone (an
    M-RoPE text rotary module: consecutive sections, Qwen2-VL's and Qwen2.5-VL's; dealt in
    turn, Qwen3-VL's; each ``cos`` twice in a row, GLM-4V's), the whole model gives the
    original's logits on a prompt holding an image (position ids that differ per axis: other
    logits than the text's) and greedy ``generate()`` its tokens."""
    original = _tiny_vision_language(kind)
    with pytest.raises(ValueError, match=r"rotary module model\.visual\.rotary_pos_emb") as refused:
        patch_hf(copy.deepcopy(original))
    assert "patch_hf(model.get_submodule('model.language_model')) patches it alone" in str(refused.value)
    patched = copy.deepcopy(original)
    patch_hf(patched.get_submodule("model.language_model"))
    assert "MultimodalHFRotaryEmbedding" in type(patched.model.language_model.rotary_emb).__name__
    ids = torch.tensor([[5, 6, IMAGE_TOKEN + 2, *[IMAGE_TOKEN] * 4, IMAGE_TOKEN + 3, 7, 8, 9]])
    image = dict(pixel_values=torch.randn(16, 3 * 2 * 4 * 4, generator=torch.Generator().manual_seed(1)), image_grid_thw=torch.tensor([[1, 4, 4]]))
    image["mm_token_type_ids"] = (ids == IMAGE_TOKEN).long()
    with torch.no_grad():
        want = original(input_ids=ids, **image).logits
        got = patched(input_ids=ids, **image).logits
        text = original(input_ids=ids).logits
    torch.testing.assert_close(got, want, atol=RELATIVE * float(want.abs().max()), rtol=0)
    assert float((text - want).abs().max()) > 1e-2
    settings = dict(max_new_tokens=8, do_sample=False)
    assert torch.equal(patched.generate(input_ids=ids, **image, **settings), original.generate(input_ids=ids, **image, **settings))


def test_hf_rotary_embedding_compiles_with_a_traced_switch():
    config = _llama_config("longrope")
    module = HFRotaryEmbedding(config)
    compiled = torch.compile(module, fullgraph=True, backend="aot_eager")
    x = torch.zeros(1)
    for length in (SWITCH - 2, SWITCH + 3):  # short factors, then long ones, in one compiled graph
        position_ids = torch.arange(length)[None]
        for got, want in zip(compiled(x, position_ids), module(x, position_ids)):
            torch.testing.assert_close(got, want, atol=1e-6, rtol=0)


def test_compiled_dynamic_module_keeps_transformers_state():
    """The longest length seen is a buffer updated in the graph: one compiled graph follows
    transformers' eager module through growth, keeping and reset."""
    config = _llama_config("dynamic")
    ours = HFRotaryEmbedding(config, transformers_state=True)
    compiled, theirs = torch.compile(ours, fullgraph=True, backend="aot_eager"), LlamaRotaryEmbedding(config)
    x = torch.zeros(1)
    for length in (SWITCH + 2, 4 * SWITCH, SWITCH + 2, SWITCH - 4, SWITCH + 2):
        ids = torch.arange(length)[None]
        for got, want in zip(compiled(x, ids), theirs(x, ids)):
            torch.testing.assert_close(got, want, atol=1e-6, rtol=0, msg=f"length {length}")


@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")  # inductor's own import
@pytest.mark.parametrize("kept", [False, True], ids=["op", "rows kept"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("rope", ["default", "yarn", "dynamic"])
def test_compiled_hf_rotary_embedding_gives_the_eager_tables(rope, dtype, kept, monkeypatch, uncached_compile):
    """Under inductor, frequencies that do not depend on the call (every ``rope_type`` but
    ``dynamic`` and ``longrope``) give their tables from the opaque ``posenc::rope_cos_sin``
    (its body the eager lookup), at each call of the graph; with rows kept for compiling
    (``keep_rows_for_compile``: positions below ``max_position_embeddings``), a decode step's
    position that has its row is gathered in the graph, and only others reach the op. Either
    way the tables are the eager module's, bit for bit, as are the traced tables of a
    ``dynamic`` model; never the traced float64 formula, which inductor recomputes in every
    rotation reading the tables."""
    torch._dynamo.reset()
    module = HFRotaryEmbedding(_llama_config(rope))  # max_position_embeddings SWITCH
    if kept:
        module.keep_rows_for_compile(dtype)
    x = torch.zeros(1, dtype=dtype)
    compiled = torch.compile(module, fullgraph=True, dynamic=False)
    compiled(x, torch.arange(9)[None])
    calls = []  # the op's body runs the eager lookup; a gather in the graph does not
    eager = _rows.stacked_tables  # the torch table op's body
    monkeypatch.setattr(_rows, "stacked_tables", lambda *a: calls.append(1) or eager(*a))
    # a decode step's position: in the kept rows; their last; beyond them, the eager cache's; negative
    # (not for dynamic, whose length max + 1 must be positive);
    # then 9 positions (a prefill takes the op: inductor decomposes the gather for one position only)
    singles = (0, SWITCH - 1, SWITCH, 1000, 70000, -3) if rope != "dynamic" else (0, SWITCH - 1, SWITCH, 1000, 70000)
    positions = [torch.tensor([[p]]) for p in singles] + [torch.arange(9)[None]]
    got = [compiled(x, p) for p in positions]
    assert len(calls) == (0 if rope == "dynamic" else 5 if kept else 7)
    monkeypatch.undo()
    for p, tables in zip(positions, got):
        for table, want in zip(tables, module(x, p)):
            assert table.dtype == dtype and torch.equal(table, want), (rope, p)


@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")  # inductor's own import
def test_compiled_tables_of_symbolic_shapes_take_the_op():
    """Position ids of a symbolic shape (``dynamic=True``, or a recompiled prefill) reach
    ``posenc::rope_cos_sin`` even with rows kept (inductor 2.13 miscompiles a ``torch.cond``
    over them); the tables are still the eager module's."""
    torch._dynamo.reset()
    module = HFRotaryEmbedding(_llama_config("default"))
    module.keep_rows_for_compile(torch.float32)
    x = torch.zeros(1)
    compiled = torch.compile(module, fullgraph=True, dynamic=True)
    for length in (3, 5, 40):
        p = torch.arange(length)[None]
        for table, want in zip(compiled(x, p), module(x, p)):
            assert torch.equal(table, want), length


@pytest.mark.parametrize("dtype", ["float32", torch.int64, torch.complex64])
def test_keep_rows_for_compile_refuses_a_dtype_that_is_not_real_floating(dtype):
    module = HFRotaryEmbedding(_llama_config("default"))
    with pytest.raises(TypeError, match="real floating dtype"):
        module.keep_rows_for_compile(dtype)
    assert module._rows_for_compile == {}


def test_patch_hf_keeps_rows_for_compiling_in_the_models_dtype():
    patched = patch_hf(build("llama[default]").to(torch.bfloat16))
    kept = patched.model.rotary_emb._rows_for_compile
    assert [dtype for _, dtype in kept] == [torch.bfloat16]
    rows = next(iter(kept.values()))
    assert rows.shape[0] == patched.config.max_position_embeddings
    cos, sin = patched.model.rotary_emb(torch.zeros(1, dtype=torch.bfloat16), torch.arange(rows.shape[0])[None])
    assert torch.equal(rows[None, :, 0], cos) and torch.equal(rows[None, :, 1], sin)


# Dynamo warns that it traces through array-api-compat's lru_cache'd type checks (a pure
# function of the array's type: nothing to go stale).
@pytest.mark.filterwarnings("ignore:Dynamo detected a call to a `functools.lru_cache`")
def test_a_patched_model_compiles_in_one_graph_to_the_same_logits():
    """``torch.compile(fullgraph=True)`` of a patched model's forward: no graph break, and
    the compiled logits are the eager patched model's (the attention's patched globals name
    posenc's functions, which torch.compile must trace and guard)."""
    patched = patch_hf(build("llama[default]"))
    ids = torch.arange(1, 13)[None]
    with torch.no_grad():
        eager = patched(ids).logits
        compiled = torch.compile(patched, fullgraph=True, backend="aot_eager")(ids).logits
    torch.testing.assert_close(compiled, eager, atol=1e-5, rtol=1e-5)


# --- from_hf on config objects --------------------------------------------------------------


@pytest.mark.parametrize("rope", [r for r in LLAMA_ROPE if r != "default"])
def test_from_hf_reads_a_config_object_like_transformers(rope):
    config = _llama_config(rope)
    read = pe.scaling.from_hf(config)
    want, want_scale = ROPE_INIT_FUNCTIONS[config.rope_parameters["rope_type"]](config, None)
    got, scale = pe.rope_frequencies(read.rotary_dim, base=read.base, scaling=read.scaling)
    np.testing.assert_allclose(got, want.double().numpy(), rtol=2.0**-23 * (4 + math.log(500.0)))
    assert scale == pytest.approx(want_scale, rel=1e-12)


def test_from_hf_config_object_fields_phi3():
    model = build("phi3[partial, longrope]")
    read = pe.scaling.from_hf(model.config)
    assert read.rotary_dim == 8 and read.partial_rotary_factor == 0.5
    assert read.scaling.original_max_position == SWITCH
    # factor 4 = max_position_embeddings / original, as transformers computes it
    assert read.scaling.attention_scale() == pytest.approx(math.sqrt(1 + math.log(4) / math.log(SWITCH)))


def test_from_hf_reads_partial_rotary_factor_as_the_models_default_initialiser_does():
    """Under ``rope_type="default"`` a model type's own initialiser decides: LLaMA's rotates the
    whole head whatever the factor (from_hf gave half of it, silently), HunYuan's fixed-alpha
    NTK too, MiMo-V2-Flash's reads 0.334 where its parameters have none (from_hf read 1);
    an explicit ``partial_rotary_factor=`` and a dict (no model type) are read as given."""
    from transformers import HunYuanDenseV1Config, MiMoV2FlashConfig
    from transformers.models.hunyuan_v1_dense.modeling_hunyuan_v1_dense import HunYuanDenseV1RotaryEmbedding
    from transformers.models.mimo_v2_flash.modeling_mimo_v2_flash import MiMoV2FlashRotaryEmbedding

    llama = LlamaConfig(hidden_size=64, num_attention_heads=4, head_dim=16, rope_parameters={"rope_type": "default", "rope_theta": 500.0, "partial_rotary_factor": 0.5})
    read = pe.scaling.from_hf(llama)
    assert (read.rotary_dim, read.partial_rotary_factor) == (16, 1.0) == (2 * LlamaRotaryEmbedding(llama).inv_freq.numel(), 1.0)
    assert pe.scaling.from_hf(llama, partial_rotary_factor=0.5).rotary_dim == 8
    assert pe.scaling.from_hf(dict(llama.rope_parameters), head_dim=16).rotary_dim == 8
    hunyuan = HunYuanDenseV1Config(
        hidden_size=64, num_attention_heads=4, head_dim=16, rope_parameters={"rope_type": "dynamic", "alpha": 4.0, "factor": 1.0, "rope_theta": 500.0, "partial_rotary_factor": 0.5}
    )
    mimo = MiMoV2FlashConfig(
        hidden_size=64, num_attention_heads=4, head_dim=24, layer_types=["full_attention", "sliding_attention"], num_hidden_layers=2,
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 5e6}, "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}},
    )
    for config, module, layer_type in ((hunyuan, HunYuanDenseV1RotaryEmbedding, None), (mimo, MiMoV2FlashRotaryEmbedding, "full_attention")):
        theirs = getattr(module(config), "inv_freq" if layer_type is None else f"{layer_type}_inv_freq")
        read = pe.scaling.from_hf(config, layer_type=layer_type)
        np.testing.assert_allclose(pe.rope_frequencies(read.rotary_dim, base=read.base, scaling=read.scaling)[0], theirs.double().numpy(), rtol=1e-6)


@pytest.mark.parametrize("model_type", ["gpt_neox", "phi3"])
def test_from_hf_reads_the_top_level_partial_rotary_factor_where_transformers_does(model_type):
    """A config's own ``partial_rotary_factor`` beside ``rope_parameters`` replaced after it was
    built: transformers copies it into the parameters in the initialisers of
    ``ROPE_INIT_FUNCTIONS`` (``standardize_rope_params``), not in a model's own ``default`` one,
    which rotated the whole head where from_hf read half of it."""
    from transformers import AutoConfig
    from transformers.models.gpt_neox.modeling_gpt_neox import GPTNeoXRotaryEmbedding
    from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding

    module = {"gpt_neox": GPTNeoXRotaryEmbedding, "phi3": Phi3RotaryEmbedding}[model_type]
    for parameters, channels in (({"rope_type": "default", "rope_theta": 500.0}, 16), ({"rope_type": "linear", "factor": 2.0, "rope_theta": 500.0}, 8)):
        config = AutoConfig.for_model(model_type, hidden_size=64, num_attention_heads=4, partial_rotary_factor=0.5)
        config.rope_parameters = dict(parameters)
        read = pe.scaling.from_hf(config)  # (before the module's initialiser copies the factor in)
        theirs = module(config).inv_freq
        assert read.rotary_dim == 2 * theirs.numel() == channels and read.partial_rotary_factor == channels / 16
        np.testing.assert_allclose(pe.rope_frequencies(read.rotary_dim, base=read.base, scaling=read.scaling)[0], theirs.double().numpy(), rtol=1e-6)


def test_from_hf_warns_about_keys_it_does_not_read():
    with pytest.warns(UserWarning, match="low_freq_factor"):
        pe.scaling.from_hf({"rope_type": "linear", "factor": 2.0, "low_freq_factor": 1.0}, head_dim=16)


def test_proportional_rotates_only_the_first_pairs():
    read = pe.scaling.from_hf({"rope_type": "proportional", "partial_rotary_factor": 0.25, "factor": 2.0, "rope_theta": 100.0}, head_dim=16)
    inv_freq, _ = pe.rope_frequencies(read.rotary_dim, base=read.base, scaling=read.scaling)
    want = np.array([100.0 ** (-2 * i / 16) / 2.0 if i < 2 else 0.0 for i in range(8)])
    np.testing.assert_allclose(inv_freq, want, rtol=1e-15)


# --- T5RelativeBias.from_hf and patch_hf refusals -------------------------------------------


def test_t5_relative_bias_from_hf_shares_the_weight():
    model = build("t5")
    layer = model.encoder.block[0].layer[0].SelfAttention
    bias = T5RelativeBias.from_hf(layer)
    assert bias.table is layer.relative_attention_bias.weight
    assert bias.bidirectional and bias.max_distance == 12
    torch.testing.assert_close(bias(5, 7, offset=2)[None], layer.compute_bias(5, 7, past_seen_tokens=2), rtol=0, atol=0)
    bias(5, 7).sum().backward()  # gradients reach the model's own embedding weight
    assert layer.relative_attention_bias.weight.grad is not None
    decoder = T5RelativeBias.from_hf(model.decoder.block[0].layer[0].SelfAttention)
    assert not decoder.bidirectional


@pytest.mark.parametrize("name", ["llama[yarn]", "t5", "bloom", "falcon[alibi]", "mpt"])
def test_patching_twice_is_refused(name):
    once = patch_hf(build(name))
    with pytest.raises(ValueError, match="already patched"):
        patch_hf(once)
    half = build(name)  # one part already swapped by hand: refused too, nothing more swapped
    if name == "llama[yarn]":
        half.model.rotary_emb = HFRotaryEmbedding(half.config)
        with pytest.raises(ValueError, match="already patched"):
            patch_hf(half)


def test_patch_hf_refuses_what_is_not_a_transformers_model():
    with pytest.raises(TypeError, match="model must be a transformers model"):
        patch_hf(torch.nn.Linear(2, 2))
    with pytest.raises(TypeError, match="model must be a transformers model"):
        patch_hf("llama")


def test_patch_hf_refuses_a_model_it_cannot_probe():
    with torch.device("meta"):
        model = build("llama[default]")
    with pytest.raises(ValueError, match="meta device"):
        patch_hf(model)


def test_a_part_that_differs_is_named_and_nothing_is_swapped():
    model = build("llama[default]")
    model.model.layers[1].self_attn.forward = lambda *a, **k: None  # an instance forward: not inspected
    from transformers.models.llama import modeling_llama

    def shifted(q, k, cos, sin, unsqueeze_dim=1):  # an apply function posenc does not reproduce
        q_embed, k_embed = modeling_llama.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim)
        return q_embed + 1e-3, k_embed

    attention = type(model.model.layers[0].self_attn)
    original = inspect.unwrap(attention.forward)
    scope = dict(original.__globals__, apply_rotary_pos_emb=shifted)
    import types

    attention_forward = types.FunctionType(original.__code__, scope, original.__name__, original.__defaults__, original.__closure__)
    model.model.layers[0].self_attn.__class__ = type("ShiftedAttention", (attention,), {"forward": attention_forward})
    with pytest.raises(ValueError, match=r"apply function .*shifted: no posenc layout reproduces it: half layout differs by 0\.001"):
        patch_hf(model)
    assert type(model.model.rotary_emb).__name__ == "LlamaRotaryEmbedding"


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_16_bit_rotary_module_with_other_frequencies_is_refused(dtype):
    """A module whose frequencies are not the config's (rope_theta 550 against the module's 500:
    its cos 0.057 off in float32) is refused in a 16-bit model too. The check had widened its
    tolerance by the rounding of the 16-bit inv_freq buffer, 8 eps (p + 1) up to position p (0.94 at
    14 in bfloat16): it swapped the module, and the logits moved by 3.1."""
    model = build("llama[default]").to(getattr(torch, dtype))
    model.config.rope_parameters["rope_theta"] = 550.0
    with pytest.raises(ValueError, match=rf"model\.rotary_emb \(LlamaRotaryEmbedding\): its (original_)?inv_freq \(torch\.{dtype}\) differs from posenc's frequencies"):
        patch_hf(model)
    assert type(model.model.rotary_emb).__name__ == "LlamaRotaryEmbedding"
    for name in ("llama[dynamic]", "llama[longrope]"):  # frequencies of a longer call than the original length: patched
        model = build(name)
        with torch.no_grad():
            model(*inputs())
        patch_hf(model.to(getattr(torch, dtype)))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_16_bit_apply_function_that_differs_is_refused(dtype):
    """An apply function that turns q 1.001 times too long is refused in a 16-bit model too (its
    probes run in float32 as well): the 16-bit tolerance alone (0.15 in bfloat16, 0.018 in
    float16) had let it be swapped."""
    model = build("llama[default]").to(getattr(torch, dtype))
    from transformers.models.llama import modeling_llama

    def longer(q, k, cos, sin, unsqueeze_dim=1):
        q_embed, k_embed = modeling_llama.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim)
        return q_embed * 1.001, k_embed

    attention = type(model.model.layers[0].self_attn)
    original = inspect.unwrap(attention.forward)
    import types

    scope = dict(original.__globals__, apply_rotary_pos_emb=longer)
    attention_forward = types.FunctionType(original.__code__, scope, original.__name__, original.__defaults__, original.__closure__)
    for layer in model.model.layers:
        layer.self_attn.__class__ = type("LongerAttention", (attention,), {"forward": attention_forward})
    with pytest.raises(ValueError, match=r"apply function .*longer: no posenc layout reproduces it: half layout differs by 0\.00"):
        patch_hf(model)
    assert type(model.model.rotary_emb).__name__ == "LlamaRotaryEmbedding"


def _decorated(forward, holds_it):
    """``forward`` under a ``functools.wraps`` decorator (as transformers' ``deprecate_kwarg``),
    which holds the wrapped function in its closure, or reaches it some other way."""
    import functools

    elsewhere = {"forward": forward}

    def holding(*args, **kwargs):
        return forward(*args, **kwargs)

    def looking_up(*args, **kwargs):
        return elsewhere["forward"](*args, **kwargs)

    return functools.wraps(forward)(holding if holds_it else looking_up)


@pytest.mark.parametrize("holds_it", [True, False])
def test_a_decorated_attention_forward_is_rebound_through_its_decorator_or_refused(holds_it):
    model = build("llama[default]")
    ids, mask = inputs()
    with torch.no_grad():
        want = model(ids, attention_mask=mask).logits
    attention = type(model.model.layers[0].self_attn)
    decorated = type("DecoratedAttention", (attention,), {"forward": _decorated(inspect.unwrap(attention.forward), holds_it)})
    for layer in model.model.layers:
        layer.self_attn.__class__ = decorated
    if not holds_it:
        with pytest.raises(ValueError, match="wrapped by a decorator that does not hold the function it wraps"):
            patch_hf(model)
        return
    patch_hf(model)
    _assert_routed_through_posenc(model)
    for layer in model.model.layers:
        forward = layer.self_attn.forward.method.__func__
        assert forward.__code__ is decorated.forward.__code__  # the decorator still runs, around the rebound forward
    with torch.no_grad():
        torch.testing.assert_close(model(ids, attention_mask=mask).logits, want, atol=1e-5, rtol=1e-5)


def test_an_alibi_builder_that_differs_is_named():
    model = build("mpt")
    model.transformer.build_mpt_alibi_tensor = lambda num_heads, sequence_length, alibi_bias_max=8, device=None: torch.zeros(
        num_heads, 1, sequence_length
    )
    with pytest.raises(ValueError, match=r"ALiBi builder transformer\.build_mpt_alibi_tensor \(MptModel\): alibi_bias differs by"):
        patch_hf(model)


def test_falcon_alibi_is_bfloat16_like_falcons():
    """Falcon rounds its slopes and key positions to bfloat16 before multiplying: so does the replacement (a
    float32 ALiBi would differ from the model's own bias by the bfloat16 rounding, and be refused)."""
    from posenc.torch import hf_patch
    from transformers.models.falcon.modeling_falcon import build_alibi_tensor

    mask = torch.ones(2, 700, dtype=torch.long)
    mask[1, :5] = 0
    want = build_alibi_tensor(mask, 12, torch.float32)
    torch.testing.assert_close(hf_patch.falcon_alibi_tensor(mask, 12, torch.float32), want, rtol=0, atol=0)
    assert float((hf_patch.bloom_alibi_tensor(mask, 12, torch.float32) - want).abs().max()) > 0.1


def _alibi_masks(dtypes):
    """Masks of 1, 257 and 1,025 tokens, all ones and left-padded (a row of one token), in ``dtypes``."""
    for length, dtype in itertools.product((1, 257, 1025), dtypes):
        ones = torch.ones(3, length, dtype=torch.long)
        padded = ones.clone()
        padded[1, : length // 2] = 0
        padded[2, : length - 1] = 0
        yield f"{length} tokens, all ones, {dtype}", ones.to(dtype)
        yield f"{length} tokens, left-padded, {dtype}", padded.to(dtype)


def test_bloom_and_falcon_alibi_builders_give_the_originals_bits_for_every_head_count():
    """The replacements of BLOOM's and Falcon's ``build_alibi_tensor`` (and of BLOOM's
    ``_get_alibi_slopes``) give the original's bits for 1 .. 40 heads. Their slopes had been
    posenc's correctly rounded ones, an ulp off some of BLOOM's float32 ``pow`` for head counts
    other than 1, 2, 4 and 8: with 16 heads 14,154 of the 16,400 entries of a 1,025-token row
    differed (3.1e-5). (Falcon's slopes, rounded to bfloat16, were the same either way up to 128 heads.)"""
    from posenc.torch import hf_patch
    from transformers.models.bloom.modeling_bloom import _get_alibi_slopes, build_alibi_tensor as bloom
    from transformers.models.falcon.modeling_falcon import build_alibi_tensor as falcon

    for heads in range(1, 65):
        want, got = _get_alibi_slopes(heads, torch.device("cpu")), hf_patch._alibi_slopes(heads, torch.device("cpu"))
        assert got.dtype == want.dtype and torch.equal(got, want), f"{heads} heads: slopes"
    for name, mask in _alibi_masks((torch.long, torch.float32)):
        for heads in range(1, 41):
            for theirs, ours in ((bloom, hf_patch.bloom_alibi_tensor), (falcon, hf_patch.falcon_alibi_tensor)):
                want, got = theirs(mask, heads, torch.float32), ours(mask, heads, torch.float32)
                assert got.dtype == want.dtype and torch.equal(got, want), f"{theirs.__module__}, {heads} heads, {name}"


def test_bloom_and_falcon_alibi_builders_give_the_originals_bits_for_16_bit_masks():
    """A bfloat16 (or float16) mask's positions are its cumulative sum in that dtype, rounded
    past 256 (2,048) tokens, minus one, rounded again: the replacements take the builders'
    own. They had taken every position exactly, rounded once to the mask's dtype: with a
    bfloat16 mask of 257 tokens and more, some entries differed from BLOOM's and Falcon's."""
    from posenc.torch import hf_patch
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor as bloom
    from transformers.models.falcon.modeling_falcon import build_alibi_tensor as falcon

    for name, mask in _alibi_masks((torch.bfloat16, torch.float16)):
        for heads in (1, 5, 12, 16):
            for theirs, ours in ((bloom, hf_patch.bloom_alibi_tensor), (falcon, hf_patch.falcon_alibi_tensor)):
                want, got = theirs(mask, heads, torch.float32), ours(mask, heads, torch.float32)
                assert got.dtype == want.dtype and torch.equal(got, want), f"{theirs.__module__}, {heads} heads, {name}"


def test_bloom_and_falcon_alibi_builders_of_a_growing_mask_give_the_originals_bits():
    """A mask growing by a token a call (``generate``'s, served by one planned ``alibi_bias``)
    and masks of lengths coming back: the originals' bits, a tensor that takes Falcon's
    ``view(batch, heads, 1, -1)``."""
    from posenc.torch import hf_patch
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor as bloom
    from transformers.models.falcon.modeling_falcon import build_alibi_tensor as falcon

    lengths = [*range(1, 140), 64, 65, 63, 64, 128, 129, 128, 300, 300]
    for theirs, ours in ((bloom, hf_patch.bloom_alibi_tensor), (falcon, hf_patch.falcon_alibi_tensor)):
        for length in lengths:
            mask = torch.ones(3, length, dtype=torch.long)
            mask[1, : length // 2] = 0
            want, got = theirs(mask, 12, torch.float32), ours(mask, 12, torch.float32)
            assert got.dtype == want.dtype and torch.equal(got, want), f"{theirs.__module__}, {length} tokens"
            assert torch.equal(got.view(3, 12, 1, -1), want.view(3, 12, 1, -1))


def test_mpt_alibi_builder_gives_the_originals_bits_for_every_head_count_and_max_bias():
    """The replacement of MPT's ``build_mpt_alibi_tensor`` gives its bits for 1 .. 64 heads and
    an ``alibi_bias_max`` of 8 (what MPT's forward passes) or any other: its slopes had been
    posenc's correctly rounded ones, which ``patch_hf`` accepted within 4 float32 eps, an ulp
    off MPT's float32 ``1 / pow(2, x)`` for 33 heads and more at ``alibi_bias_max = 4`` (520
    of the cases below differed)."""
    from posenc.torch import hf_patch
    from transformers.models.mpt.modeling_mpt import build_mpt_alibi_tensor

    for bias_max in (8, 16, 4, 3, 12.5, 1, 0.5):
        for heads in range(1, 65):
            for length in (1, 11, 300):
                want, got = build_mpt_alibi_tensor(heads, length, bias_max), hf_patch.mpt_alibi_tensor(heads, length, bias_max)
                assert got.dtype == want.dtype and torch.equal(got, want), f"{heads} heads, alibi_bias_max {bias_max}, {length} keys"


def test_mpt_alibi_builder_called_under_fake_tensors_keeps_no_fake_slopes():
    """MPT's builder called under ``FakeTensorMode`` (shape propagation) makes its slopes
    afresh and keeps none, as BLOOM's does: it had kept a ``FakeTensor``, and every later
    eager call with those heads and ``alibi_bias_max`` failed (``AssertionError`` from
    fake-tensor checks). (A head count and maximum no other test keeps slopes of.)"""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from transformers.models.mpt.modeling_mpt import build_mpt_alibi_tensor

    from posenc.torch import hf_patch

    with FakeTensorMode(allow_non_fake_inputs=True):
        hf_patch.mpt_alibi_tensor(11, 7, 5.5)
    assert torch.equal(hf_patch.mpt_alibi_tensor(11, 7, 5.5), build_mpt_alibi_tensor(11, 7, 5.5))


def test_bloom_and_falcon_alibi_builders_compile_to_the_originals_bits():
    """``torch.compile(fullgraph=True)`` traces the builders (their slopes' ratios taken as
    constants, not traced through ``alibi_slopes``' NumPy) to the originals' bits."""
    from posenc.torch import hf_patch
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor as bloom
    from transformers.models.falcon.modeling_falcon import build_alibi_tensor as falcon

    mask = torch.ones(2, 37, dtype=torch.long)
    mask[1, :5] = 0
    for theirs, ours in ((bloom, hf_patch.bloom_alibi_tensor), (falcon, hf_patch.falcon_alibi_tensor)):
        compiled = torch.compile(ours, fullgraph=True, backend="aot_eager")
        assert torch.equal(compiled(mask, 13, torch.float32), theirs(mask, 13, torch.float32))


@pytest.mark.parametrize("heads", [16, 6])
@pytest.mark.parametrize("model_type", ["bloom", "falcon"])
def test_a_patched_alibi_model_gives_the_originals_logits_to_the_bit(model_type, heads):
    """A tiny BLOOM (and Falcon with ``alibi=True``) of 16 and 6 heads: the patched model's
    logits are the original's, bit for bit, with an integer, a float and an all-ones mask
    (BLOOM's of 16 heads had differed: posenc's slopes)."""
    if model_type == "bloom":
        config = transformers.BloomConfig(vocab_size=VOCAB, hidden_size=8 * heads, n_layer=2, n_head=heads, initializer_range=0.25)
        make = transformers.BloomForCausalLM
    else:
        config = transformers.FalconConfig(
            vocab_size=VOCAB, hidden_size=8 * heads, num_hidden_layers=2, num_attention_heads=heads, alibi=True, initializer_range=0.25
        )
        make = transformers.FalconForCausalLM
    torch.manual_seed(0)
    original = make(config).eval()
    patched = patch_hf(copy.deepcopy(original))
    _assert_routed_through_posenc(patched)
    ids, mask = inputs(length=40)
    for attention_mask in (mask, mask.float(), torch.ones_like(mask)):
        assert torch.equal(logits(patched, ids, attention_mask), logits(original, ids, attention_mask))


def test_udop_is_refused_naming_its_layout_biases():
    """UDOP's encoder adds T5-style biases of the token boxes (1-D, horizontal, vertical) with no ``compute_bias``:
    refused, the model left as it was."""
    config = transformers.UdopConfig(
        vocab_size=96, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4,
        relative_attention_num_buckets=8, relative_attention_max_distance=12, image_size=32, patch_size=16,
    )
    model = transformers.UdopForConditionalGeneration(config).eval()
    with pytest.raises(ValueError, match=r"relative attention bias encoder\.relative_bias\.biases\.1 \(RelativePositionBiasHorizontal\): no compute_bias"):
        patch_hf(model)
    assert not hasattr(model, "posenc_patched") and all("compute_bias" not in vars(m) for m in model.modules())


def test_a_t5_bias_that_differs_is_named():
    model = build("umt5")
    layer = model.decoder.block[1].layer[0].SelfAttention
    original = layer.compute_bias  # a bias twice the table's: posenc's (in either direction) is not it
    layer.compute_bias = lambda query_length, key_length, device=None, past_seen_tokens=0: original(query_length, key_length) * 2
    with pytest.raises(ValueError, match=r"relative attention bias decoder\.block\.1\.layer\.0\.SelfAttention \(UMT5Attention\): compute_bias differs"):
        patch_hf(model)


@pytest.mark.filterwarnings("ignore:Dynamo detected a call to a `functools.lru_cache`")
@pytest.mark.parametrize("rope", ["dynamic", "longrope"])
def test_a_patched_model_with_a_length_dependent_scaling_compiles_with_dynamic_shapes(rope):
    """``torch.compile(dynamic=True)`` of a patched model whose frequencies depend on the
    length: one graph of symbolic length serves prompts on both sides of the switch, each
    with the eager patched model's logits bit for bit (the frequencies are read when the
    op runs; ``dynamic=True`` used to stop the compile)."""
    patched = patch_hf(build(f"llama[{rope}]"))
    torch._dynamo.reset()
    compiled = torch.compile(patched, fullgraph=True, dynamic=True, backend="aot_eager")
    with torch.no_grad():
        for length in (SWITCH - 3, SWITCH + 5):
            ids = torch.arange(1, length + 1)[None]
            assert torch.equal(compiled(ids).logits, patched(ids).logits), length


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int16, torch.uint16, torch.int32, torch.uint32, torch.uint64])
def test_hf_rotary_embedding_takes_position_ids_of_every_integer_dtype(dtype):
    """The int64 tables for any integer ``position_ids``, as transformers' module gives them:
    a uint8 index into the kept rows had been a boolean mask (with ids shaped like the rows,
    a wrong 1-D result and no error), and the other narrow dtypes raised."""
    module = HFRotaryEmbedding(LlamaConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256))
    x = torch.zeros(1, dtype=torch.float32)
    ids = torch.randint(0, 2 if dtype == torch.uint8 else 100, (64, 16))  # uint8: the shape of the kept rows, [64, rotary_dim]
    for got, want in zip(module(x, ids.to(dtype)), module(x, ids)):
        assert got.shape == (64, 16, 16) and torch.equal(got, want)


@pytest.mark.parametrize("name", ["t5", "longt5[tglobal]"])
def test_a_patched_t5_reads_a_bias_weight_replaced_after_the_patch(name):
    """``load_state_dict(..., assign=True)`` (torch's advice for mmap or meta loading) and a
    new ``nn.Parameter`` replace the weight object: the patched bias reads the layer's
    weight on every call, as the layer's code does (it had kept the patch-time one: logits
    332 off, other generate() tokens)."""
    ids, mask = inputs()
    original, tuned = build(name), build(name, seed=1)
    patched = patch_hf(copy.deepcopy(original))
    patched.load_state_dict(tuned.state_dict(), assign=True)
    want = logits(tuned, ids, mask)
    torch.testing.assert_close(logits(patched, ids, mask), want, atol=RELATIVE * float(want.abs().max()), rtol=0)
    _assert_routed_through_posenc(patched)
    generator = torch.Generator().manual_seed(3)
    for layer in patched.modules():  # every bias table (LongT5's global one too) a new Parameter
        for attribute in ("relative_attention_bias", "global_relative_attention_bias"):
            embedding = getattr(layer, attribute, None)
            if isinstance(embedding, torch.nn.Embedding):
                embedding.weight = torch.nn.Parameter(torch.randn(embedding.weight.shape, generator=generator) * 5)
    unpatched = copy.deepcopy(tuned)
    unpatched.load_state_dict(patched.state_dict())
    want = logits(unpatched, ids, mask)
    torch.testing.assert_close(logits(patched, ids, mask), want, atol=RELATIVE * float(want.abs().max()), rtol=0)


@pytest.mark.parametrize("name", ["t5", "longt5[tglobal]", "llama[default]", "gpt_neox[partial]", "falcon[alibi]"])
def test_a_patched_model_deep_copies_and_pickles_with_its_patch(name):
    """A deep copy reads its own weights (a T5 copy's bias closure had kept the original's
    table: other logits, and its gradient went to the original), and ``torch.save`` /
    ``torch.load`` keeps every part of the patch (a rebound forward had come back as the
    class's own, and a patched T5 could not be pickled)."""
    import io

    ids, mask = inputs()
    patched = patch_hf(build(name))
    want = logits(patched, ids, mask)
    buffer = io.BytesIO()
    torch.save(patched, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    assert torch.equal(logits(loaded, ids, mask), want)
    _assert_routed_through_posenc(loaded)

    copied, other = copy.deepcopy(patched), build(name, seed=7)
    copied.load_state_dict(other.state_dict())
    got, theirs = logits(copied, ids, mask), logits(other, ids, mask)
    torch.testing.assert_close(got, theirs, atol=RELATIVE * float(theirs.abs().max()), rtol=0)
    if name == "t5":
        copied.train()
        copied(input_ids=ids, attention_mask=mask, decoder_input_ids=ids).logits.sum().backward()
        table = copied.encoder.block[0].layer[0].SelfAttention.relative_attention_bias.weight
        assert table.grad is not None and patched.encoder.block[0].layer[0].SelfAttention.relative_attention_bias.weight.grad is None


# --- what patch_hf keeps of the model around it ---------------------------------------------------


def _tiny(config_name, model_name, **extra):
    import transformers

    torch.manual_seed(0)
    config = getattr(transformers, config_name)(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, **extra
    )
    return getattr(transformers, model_name)(config).eval()


def test_a_patched_model_whose_apply_is_a_closure_compiles():
    """Cohere's interleaved apply (a closure made for the layout): torch.compile guarded the
    closure through the transformers module's own function and crashed ("'NoneType' object
    is not subscriptable"); the rebound globals now live in a module of their own, removed
    from ``sys.modules`` once the model is gone (when the next model is patched)."""
    import gc
    import sys

    def scopes():
        return {n for n in sys.modules if n.startswith("posenc._patched_")}

    before = scopes()
    original = _tiny("CohereConfig", "CohereForCausalLM", num_key_value_heads=2, pad_token_id=0)
    patched = patch_hf(copy.deepcopy(original))
    ids = torch.arange(1, 13)[None]
    with torch.no_grad():
        want = original(ids).logits
        got = torch.compile(patched, backend="eager")(ids).logits
    torch.testing.assert_close(got, want, atol=RELATIVE * float(want.abs().max()), rtol=0)
    assert len(scopes() - before) == 2  # one a rebound attention forward
    mine = scopes() - before
    del patched
    torch._dynamo.reset()
    gc.collect()
    patch_hf(copy.deepcopy(original))
    assert not mine & scopes()


def test_two_models_patched_at_once_share_the_removal_of_released_scopes(monkeypatch):
    """Two threads patching models at once (a server loading two): the other thread's patch
    empties the names of released scope modules between this one's look and its ``pop``;
    ``patch_hf`` raised ``IndexError: pop from empty list``."""
    from posenc.torch import hf_patch

    class Raced(list):
        def __len__(self):  # the other thread's patch removes the last name right after this thread looked
            n = super().__len__()
            if n:
                super().pop()
            return n

    monkeypatch.setattr(hf_patch, "_RELEASED", Raced(["posenc._patched_released"]))
    original = build("llama[default]")
    ids, mask = inputs()
    want = logits(original, ids, mask)
    torch.testing.assert_close(logits(patch_hf(copy.deepcopy(original)), ids, mask), want, atol=RELATIVE * float(want.abs().max()), rtol=0)


def test_a_patched_roformer_pickles():
    """RoFormer's replacement apply (set on each attention layer) is a function of posenc's
    module, not a closure: ``torch.save`` of the patched model had failed to pickle it."""
    import io

    patched = patch_hf(_tiny("RoFormerConfig", "RoFormerModel", embedding_size=32))
    ids = torch.arange(1, 13)[None]
    with torch.no_grad():
        want = patched(ids).last_hidden_state
    buffer = io.BytesIO()
    torch.save(patched, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    with torch.no_grad():
        assert torch.equal(loaded(ids).last_hidden_state, want)


@pytest.mark.parametrize("name", ["bloom", "falcon[alibi]"])
def test_patched_alibi_takes_a_float_attention_mask(name):
    """A float mask of ones and zeros, which the models take (the patched ALiBi had refused it
    as neither bool nor integer): the logits of the integer mask."""
    original = build(name)
    patched = patch_hf(copy.deepcopy(original))
    ids, mask = inputs()
    want = logits(original, ids, mask)
    got = logits(patched, ids, mask.float())
    torch.testing.assert_close(got[mask.bool()], want[mask.bool()], atol=RELATIVE * float(want.abs().max()), rtol=0)


def test_patch_hf_keeps_a_hook_of_accelerates_form_and_refuses_other_instance_forwards():
    """A hook of accelerate's form (``module.forward`` a partial of the hook calling
    ``module._old_forward``) still runs after patch_hf, which rebinds ``_old_forward`` (it had
    silently replaced the hook); another instance-level forward is a refusal naming it."""
    import functools

    def hooked(model, calls):
        for layer in model.model.layers:
            def new_forward(module, *args, **kwargs):
                calls.append(module)
                return module._old_forward(*args, **kwargs)

            layer.self_attn._old_forward = layer.self_attn.forward
            layer.self_attn.forward = functools.update_wrapper(functools.partial(new_forward, layer.self_attn), layer.self_attn._old_forward)
        return model

    calls = []
    original = build("llama[default]")
    patched = patch_hf(hooked(copy.deepcopy(original), calls))
    ids, mask = inputs()
    want = logits(original, ids, mask)
    torch.testing.assert_close(logits(patched, ids, mask), want, atol=RELATIVE * float(want.abs().max()), rtol=0)
    assert len(calls) == 2 and all(getattr(layer.self_attn._old_forward, "__posenc__", False) for layer in patched.model.layers)
    with pytest.raises(ValueError, match="already patched"):
        patch_hf(patched)
    wrapped = build("llama[default]")
    for layer in wrapped.model.layers:
        layer.self_attn.forward = functools.partial(layer.self_attn.forward)
    with pytest.raises(ValueError, match="instance's forward is replaced by a partial"):
        patch_hf(wrapped)


@pytest.mark.parametrize("mask_dtype", [torch.float32, torch.float64])
def test_alibi_builders_of_a_float_mask_multiply_as_the_originals(mask_dtype):
    """A float attention mask's positions (its cumulative sum, in its dtype) promote the
    builders' product: Falcon's bfloat16 slopes times float32 positions multiply in float32.
    The replacement multiplied in bfloat16 whatever the mask: 4.9375 for Falcon's 4.94921875
    at 10 tokens, and a float16 bias of +inf where Falcon's is 65408 (slope 1/2, key 130816)."""
    from posenc.torch import hf_patch
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor as bloom
    from transformers.models.falcon.modeling_falcon import build_alibi_tensor as falcon

    for length, dtype in ((11, torch.float32), (3000, torch.float32), (130817, torch.float16)):
        mask = torch.ones(2, length, dtype=mask_dtype)
        mask[1, :4] = 0
        for theirs, ours in ((bloom, hf_patch.bloom_alibi_tensor), (falcon, hf_patch.falcon_alibi_tensor)):
            want = theirs(mask, 8, dtype)
            torch.testing.assert_close(ours(mask, 8, dtype), want, rtol=0, atol=0)
