"""Tiny random transformers models (from configs, nothing downloaded) and the patched-vs-original check.

``MODELS[name]()`` builds a model in eval mode; ``compare(name)`` patches a copy with
``posenc.torch.patch_hf`` and returns ``(max |logit difference|, generated tokens equal)``
for a left-padded batch: one forward over every token, then greedy ``generate()`` with the
KV cache. Lengths are chosen to cross the switch length of ``dynamic`` (16 =
``max_position_embeddings``) and ``longrope`` (16 = ``original_max_position_embeddings``).
``python tests/hf_models.py`` prints the table for every model.
"""

from __future__ import annotations

import copy

import torch

SWITCH = 16  # max_position_embeddings / original_max_position_embeddings of the scaled models
PROMPT, NEW = 10, 14  # prompt and generated lengths: 10 .. 24 crosses SWITCH
VOCAB = 96


def _rotary_common(**extra):
    common = dict(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=SWITCH, initializer_range=0.25, tie_word_embeddings=False,
    )
    return {**common, **extra}


# Every rope_type transformers ships, on LLaMA (head_dim 16: 8 frequency pairs).
LLAMA_ROPE = {
    "default": None,
    "linear": {"rope_type": "linear", "factor": 2.0},
    "dynamic": {"rope_type": "dynamic", "factor": 3.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4, "beta_fast": 8.0, "beta_slow": 1.0},
    "longrope": {
        "rope_type": "longrope", "original_max_position_embeddings": SWITCH, "factor": 4.0,
        "short_factor": [1.0, 1.0, 1.2, 1.5, 2.0, 2.5, 3.0, 4.0], "long_factor": [1.0, 1.5, 2.0, 3.0, 5.0, 8.0, 12.0, 16.0],
    },
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8},
    "proportional": {"rope_type": "proportional", "partial_rotary_factor": 0.5, "factor": 2.0},
}


def _llama(rope):
    def build():
        from transformers import LlamaConfig, LlamaForCausalLM

        params = {**LLAMA_ROPE[rope], "rope_theta": 500.0} if LLAMA_ROPE[rope] else {"rope_type": "default", "rope_theta": 500.0}
        return LlamaForCausalLM(LlamaConfig(**_rotary_common(rope_parameters=params)))

    return build


def _causal(config_name, model_name, **extra):
    def build():
        import transformers

        config = getattr(transformers, config_name)(**_rotary_common(**extra))
        return getattr(transformers, model_name)(config)

    return build


def _gpt_neox():
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    config = GPTNeoXConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        max_position_embeddings=64, rotary_pct=0.25, initializer_range=0.25, rope_theta=500.0,
    )
    return GPTNeoXForCausalLM(config)


def _gemma3():
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    config = Gemma3TextConfig(
        **_rotary_common(head_dim=16, max_position_embeddings=64, sliding_window=6, layer_types=["sliding_attention", "full_attention"]),
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
            "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1000.0},
        },
    )
    return Gemma3ForCausalLM(config)


def _t5(config_name, model_name):
    def build():
        import transformers

        config = getattr(transformers, config_name)(
            vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4,
            relative_attention_num_buckets=8, relative_attention_max_distance=12, decoder_start_token_id=0,
            initializer_factor=5.0, tie_word_embeddings=False,
        )
        return getattr(transformers, model_name)(config)

    return build


def _t5_family(config_name, model_name, **extra):
    """T5's relative bias in other sequence-to-sequence models (UMT5: one per layer; LongT5: local blocks, transient-global
    side bias; Switch Transformers: MoE; Pop2Piano)."""

    def build():
        import transformers

        config = getattr(transformers, config_name)(
            vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4,
            relative_attention_num_buckets=8, relative_attention_max_distance=12, decoder_start_token_id=0,
            initializer_factor=5.0, tie_word_embeddings=False, pad_token_id=0, eos_token_id=1, **extra,
        )
        return getattr(transformers, model_name)(config)

    return build


def _pix2struct():
    """Pix2Struct: a T5 decoder (always causal, no ``is_decoder``) over a vision encoder of image patches."""
    from transformers import Pix2StructConfig, Pix2StructForConditionalGeneration

    text = dict(
        vocab_size=VOCAB, hidden_size=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, relative_attention_num_buckets=8,
        relative_attention_max_distance=12, initializer_factor=5.0, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1,
    )
    vision = dict(hidden_size=32, patch_embed_hidden_size=PATCH, d_ff=64, d_kv=8, num_hidden_layers=2, num_attention_heads=4, initializer_factor=5.0)
    return Pix2StructForConditionalGeneration(Pix2StructConfig(text_config=text, vision_config=vision, tie_word_embeddings=False))


PATCH = 48  # pixels per Pix2Struct image patch in the tiny model


def _bloom():
    from transformers import BloomConfig, BloomForCausalLM

    return BloomForCausalLM(BloomConfig(vocab_size=VOCAB, hidden_size=48, n_layer=2, n_head=6, initializer_range=0.25))


def _falcon_alibi():
    from transformers import FalconConfig, FalconForCausalLM

    config = FalconConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, alibi=True, initializer_range=0.25)
    return FalconForCausalLM(config)


def _mpt():
    from transformers import MptConfig, MptForCausalLM

    return MptForCausalLM(MptConfig(vocab_size=VOCAB, d_model=64, n_layers=2, n_heads=4, max_seq_len=64, initializer_range=0.25))


MODELS = {
    **{f"llama[{rope}]": _llama(rope) for rope in LLAMA_ROPE},
    "mistral": _causal("MistralConfig", "MistralForCausalLM", sliding_window=None),
    # its default rotary module rotates the whole head whatever partial_rotary_factor says
    "mistral[partial_rotary_factor unread]": _causal("MistralConfig", "MistralForCausalLM", sliding_window=None, partial_rotary_factor=0.5),
    "qwen2": _causal("Qwen2Config", "Qwen2ForCausalLM"),
    "qwen3": _causal("Qwen3Config", "Qwen3ForCausalLM", head_dim=16),
    "phi3[partial, longrope]": _causal(
        "Phi3Config", "Phi3ForCausalLM", partial_rotary_factor=0.5, pad_token_id=0,
        rope_parameters={"rope_type": "longrope", "short_factor": [1.0, 1.5, 2.0, 3.0], "long_factor": [2.0, 4.0, 8.0, 16.0],
                         "original_max_position_embeddings": SWITCH, "rope_theta": 500.0},
        max_position_embeddings=4 * SWITCH, original_max_position_embeddings=SWITCH,
    ),
    "gemma": _causal("GemmaConfig", "GemmaForCausalLM", head_dim=16),
    "gemma3_text[nested]": _gemma3,
    "gpt_neox[partial]": _gpt_neox,
    "t5": _t5("T5Config", "T5ForConditionalGeneration"),
    "mt5": _t5("MT5Config", "MT5ForConditionalGeneration"),
    "bloom": _bloom,
    "umt5": _t5_family("UMT5Config", "UMT5ForConditionalGeneration"),
    "longt5[local]": _t5_family("LongT5Config", "LongT5ForConditionalGeneration", encoder_attention_type="local", local_radius=3),
    "longt5[tglobal]": _t5_family(
        "LongT5Config", "LongT5ForConditionalGeneration", encoder_attention_type="transient-global", local_radius=3, global_block_size=4
    ),
    "switch_transformers": _t5_family(
        "SwitchTransformersConfig", "SwitchTransformersForConditionalGeneration", num_experts=4, expert_capacity=64,
        num_sparse_encoder_layers=1, num_sparse_decoder_layers=1,
    ),
    "pop2piano": _t5_family("Pop2PianoConfig", "Pop2PianoForConditionalGeneration"),
    "pix2struct": _pix2struct,
    "falcon[alibi]": _falcon_alibi,
    "mpt": _mpt,
}


def build(name, seed=0):
    torch.manual_seed(seed)
    return MODELS[name]().eval()


def inputs(seed=1, length=PROMPT + NEW, *, lowest=1):
    """A left-padded batch of two: ``(input_ids, attention_mask)``, 3 padding tokens in row 1;
    token ids from ``lowest`` up to ``VOCAB``."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(lowest, VOCAB, (2, length), generator=generator)
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    return ids, mask


def _encoder_inputs(model, ids, mask):
    """The keyword inputs of ``model`` for the tokens ``ids``: Pix2Struct reads image patches instead
    (``[row, column, pixels]``, the pixels drawn from the ids)."""
    if model.config.model_type != "pix2struct":
        return {"input_ids": ids, "attention_mask": mask}
    generator = torch.Generator().manual_seed(int(ids.sum()))
    rows, columns = torch.arange(ids.shape[1]) // 4 + 1, torch.arange(ids.shape[1]) % 4 + 1
    pixels = torch.randn(*ids.shape, PATCH, generator=generator)
    places = torch.stack([rows, columns], -1).float().expand(ids.shape[0], -1, -1)
    return {"flattened_patches": torch.cat([places, pixels], -1), "attention_mask": mask}


def logits(model, ids, mask):
    with torch.no_grad():
        if model.config.is_encoder_decoder:
            decoder = torch.roll(ids, 1, dims=1)
            return model(**_encoder_inputs(model, ids, mask), decoder_input_ids=decoder).logits
        return model(input_ids=ids, attention_mask=mask).logits


def generate(model, ids, mask):
    from transformers import GenerationMixin

    # GenerationMixin's generate: Pop2Piano's own takes audio features and a composer
    return GenerationMixin.generate(model, **_encoder_inputs(model, ids, mask), max_new_tokens=NEW, do_sample=False, min_new_tokens=NEW)


def compare(name):
    """``(max |logit difference| over real tokens, greedy tokens equal, patched model)``."""
    from posenc.torch import patch_hf

    original = build(name)
    patched = patch_hf(copy.deepcopy(original))
    ids, mask = inputs()
    real = mask.bool()[..., None].expand(-1, -1, VOCAB) if not original.config.is_encoder_decoder else torch.ones(1, dtype=torch.bool)
    diff = (logits(original, ids, mask) - logits(patched, ids, mask)).abs()
    diff = diff[real].max() if not original.config.is_encoder_decoder else diff.max()
    prompt, prompt_mask = ids[:, :PROMPT], mask[:, :PROMPT]
    same = torch.equal(generate(original, prompt, prompt_mask), generate(patched, prompt, prompt_mask))
    return float(diff), same, patched


if __name__ == "__main__":  # the table of the report
    import transformers

    print(f"transformers {transformers.__version__}, torch {torch.__version__}; float32 models, left-padded batch of 2")
    print(f"{'model':28s} {'max |logit diff|':>17s}  {'max |logit|':>11s}  generate() tokens")
    for name in MODELS:
        d, same, patched = compare(name)
        ids, mask = inputs()
        scale = float(logits(patched, ids, mask).abs().max())
        print(f"{name:28s} {d:17.3g}  {scale:11.3g}  {'identical' if same else 'DIFFERENT'}")
