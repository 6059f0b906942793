"""Hugging Face transformers drop-in: posenc's rotary tables and biases inside a loaded model.

``HFRotaryEmbedding(config)`` has the signature of a transformers rotary module,
``forward(x, position_ids) -> (cos, sin)``, for every ``rope_type`` transformers ships.
``patch_hf(model)`` swaps, in place, the positional computation of a loaded model for
posenc's: the rotary module and ``apply_rotary_pos_emb`` of LLaMA-family models, T5's
``compute_bias``, BLOOM's ALiBi tensor. transformers itself is never imported here: the
model in hand says what it is.
"""

from __future__ import annotations

import types

import torch
from torch import nn

import posenc as pe

from .modules import T5RelativeBias

ROTARY_MODELS = ("gemma", "gemma3_text", "gpt_neox", "llama", "mistral", "phi3", "qwen2", "qwen3")
T5_MODELS = ("mt5", "t5")
ALIBI_MODELS = ("bloom",)
SUPPORTED = tuple(sorted(ROTARY_MODELS + T5_MODELS + ALIBI_MODELS))


class HFRotaryEmbedding(nn.Module):
    """posenc's drop-in for a transformers model's rotary embedding module.

    ``HFRotaryEmbedding(config, *, device=None, layer_type=None)``: ``config`` is the
    model's config (or its text config); ``forward(x, position_ids, layer_type=None)``
    returns ``(cos, sin)`` of shape ``position_ids.shape + (rotary_dim,)`` in ``x``'s dtype
    and device, as transformers' rotary modules do, with the attention scale folded in.

    Frequencies and the scaling come from :func:`posenc.scaling.from_hf` (every
    ``rope_type``); the angles are float64 (:func:`posenc.rope_cos_sin`), rounded once to
    ``x``'s dtype. Length-dependent scalings (``"dynamic"``, ``"longrope"``) are decided
    on every call from ``max(position_ids) + 1``; they keep no state between calls
    (transformers' ``dynamic`` keeps the longest length seen until a short call resets it;
    the two agree whenever lengths grow, as in ``generate``). Parameters nested per layer
    type (Gemma 3) are read for ``layer_type``, given here or per call.

    Other scalings keep, per dtype, the rows of positions ``0 .. n - 1`` that
    :func:`posenc.rope_cos_sin` computed (``n`` doubles as larger positions come), and a
    call on CPU position ids looks its rows up: every value is the one computing afresh
    gives, since each row depends on its position only (``tests/test_decode_step.py``).
    Traced calls (``torch.compile``) and GPU position ids compute afresh.

    ``device`` is accepted for the transformers signature; the tables are computed on the
    device of ``position_ids``.
    """

    def __init__(self, config, *, device=None, layer_type=None):
        super().__init__()
        self.config = config
        self.layer_type = layer_type
        nested = pe.scaling.nested_layer_types(config) if layer_type is None else []
        # One set of parameters, or one per layer type (chosen per call).
        self._rope = {t: pe.scaling.from_hf(config, layer_type=t) for t in nested} or {None: pe.scaling.from_hf(config, layer_type=layer_type)}
        first = next(iter(self._rope.values()))
        self.rotary_dim = first.rotary_dim
        self.attention_scaling = pe.rope_frequencies(first.rotary_dim, base=first.base, scaling=first.scaling)[1]
        self._cache = {}

    def _for(self, layer_type):
        if None in self._rope:
            return self._rope[None]
        if layer_type not in self._rope:
            raise ValueError(f"layer_type must be one of {', '.join(map(repr, self._rope))} for this config, got {layer_type!r}")
        return self._rope[layer_type]

    @torch.no_grad()
    def forward(self, x, position_ids, layer_type=None):
        rope = self._for(layer_type)
        if rope.scaling is None or not rope.scaling.uses_seq_len:
            rows = self._rows(rope, x.dtype, position_ids)
            if rows is not None:
                return rows
        seq_len = None
        if rope.scaling is not None and rope.scaling.uses_seq_len and position_ids.numel():
            seq_len = position_ids.max() + 1  # decided per call; a traced value under torch.compile
        inv_freq, scale = pe.rope_frequencies(rope.rotary_dim, base=rope.base, scaling=rope.scaling, seq_len=seq_len)
        return pe.rope_cos_sin(position_ids, inv_freq, dtype=x.dtype, scale=scale)


    def _rows(self, rope, dtype, position_ids):
        """``(cos, sin)`` rows of the position-keyed cache, or None where it does not serve."""
        if torch.compiler.is_compiling() or position_ids.device.type != "cpu" or position_ids.dtype.is_floating_point:
            return None
        if not position_ids.numel():
            return None
        low, high = (int(v) for v in torch.aminmax(position_ids))
        if low < 0 or high >= _MOST_CACHED_ROWS:
            return None
        key = (id(rope), dtype)
        cos, sin = self._cache.get(key, (None, None))
        if cos is None or high >= cos.shape[0]:
            count = max(high + 1, 2 * (0 if cos is None else cos.shape[0]), 64)
            inv_freq, scale = pe.rope_frequencies(rope.rotary_dim, base=rope.base, scaling=rope.scaling)
            cos, sin = pe.rope_cos_sin(torch.arange(count), inv_freq, dtype=dtype, scale=scale)
            self._cache[key] = (cos, sin)
        return cos[position_ids], sin[position_ids]


# Positions beyond this compute their rows afresh (a cache of 2**16 rows of 128 float32 is 64 MiB for cos and sin).
_MOST_CACHED_ROWS = 1 << 16


def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
    """transformers' ``apply_rotary_pos_emb`` through :func:`posenc.apply_rope` (its kernels).

    ``cos``/``sin`` are ``[batch, seq, r]`` (``r`` may be smaller than the head: partial
    rotary), unsqueezed at ``unsqueeze_dim`` to broadcast against ``q`` and ``k``.
    """
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    return pe.apply_rope(q, cos, sin), pe.apply_rope(k, cos, sin)


def patch_hf(model):
    """Route a loaded transformers model's positional computation through posenc, in place.

    * Rotary models (``model_type`` in :data:`ROTARY_MODELS`: LLaMA, Mistral, Qwen2,
      Qwen3, Phi-3, Gemma, Gemma 3, GPT-NeoX): every rotary module becomes an
      :class:`HFRotaryEmbedding` (float64 angles, every ``rope_type``), and every attention
      layer applies it with :func:`posenc.apply_rope` (the kernels, CPU and GPU).
    * T5 and mT5: every attention layer that owns ``relative_attention_bias`` computes
      its bias with :class:`~posenc.torch.T5RelativeBias` on the same weight
      (:func:`posenc.t5_bias`).
    * BLOOM: the ALiBi slopes and the per-token ALiBi tensor (padding included) come from
      :func:`posenc.alibi_slopes` and :func:`posenc.alibi_bias`.

    In a float32 model the logits equal the unpatched model's within float32 rounding and
    greedy ``generate()`` gives the same tokens (tested on tiny random models). In a
    float16 or bfloat16 model they differ by that dtype's rounding (posenc rounds each
    rotated value once, transformers three times), and greedy tokens can differ where two
    logits are that close; they are as close to the float32 model as the unpatched
    model's (docs page "Use posenc in a transformers model"). Returns ``model``.

    Raises
    ------
    ValueError
        For another architecture (the message lists the supported ones), or when the
        model does not have the parts its architecture should have.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a transformers model (a torch.nn.Module), got {type(model).__name__}")
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type in ROTARY_MODELS:
        _patch_rotary(model)
    elif model_type in T5_MODELS:
        _patch_t5(model)
    elif model_type in ALIBI_MODELS:
        _patch_bloom(model)
    else:
        raise ValueError(
            f"patch_hf supports the architectures {', '.join(SUPPORTED)}; got model_type={model_type!r} ({type(model).__name__})"
        )
    return model


def _with_globals(fn, replacements, _cache={}):  # noqa: B006  (one copy per function)
    """``fn`` with the global names in ``replacements`` bound to new values (a copy of the function)."""
    key = (fn, tuple(sorted((name, id(value)) for name, value in replacements.items())))
    if key not in _cache:
        scope = dict(fn.__globals__)
        scope.update(replacements)
        new = types.FunctionType(fn.__code__, scope, fn.__name__, fn.__defaults__, fn.__closure__)
        new.__kwdefaults__ = fn.__kwdefaults__
        new.__dict__.update(fn.__dict__)
        new.__qualname__, new.__doc__, new.__module__ = fn.__qualname__, fn.__doc__, fn.__module__
        _cache[key] = new
    return _cache[key]


def _rebind_forward(module, replacements):
    """Give ``module`` (an instance) a ``forward`` whose global names ``replacements`` are posenc's.

    Only this instance changes; its class and the transformers module are untouched.
    Returns whether its forward uses one of the names.
    """
    fn = type(module).forward
    if hasattr(fn, "__wrapped__") or not set(fn.__code__.co_names) & set(replacements):
        return False
    module.forward = types.MethodType(_with_globals(fn, replacements), module)
    return True


def _replace_child(model, name, new):
    parent_name, _, attr = name.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, attr, new)


def _patch_rotary(model):
    rotary = [(n, m) for n, m in model.named_modules() if type(m).__name__.endswith("RotaryEmbedding") and hasattr(m, "rope_type")]
    if not rotary and not any(isinstance(m, HFRotaryEmbedding) for m in model.modules()):  # patched before: nothing to replace
        raise ValueError(f"{type(model).__name__} has no transformers rotary embedding module to replace")
    for name, module in rotary:
        device = next(iter(module.buffers()), torch.empty(0)).device
        _replace_child(model, name, HFRotaryEmbedding(module.config, device=device))
    applied = [m for m in model.modules() if _rebind_forward(m, {"apply_rotary_pos_emb": apply_rotary_pos_emb})]
    if not applied:
        raise ValueError(f"no attention layer of {type(model).__name__} calls apply_rotary_pos_emb; cannot route the rotation through posenc")


def _patch_t5(model):
    layers = [m for m in model.modules() if getattr(m, "has_relative_attention_bias", False) and hasattr(m, "relative_attention_bias")]
    if not layers:
        raise ValueError(f"{type(model).__name__} has no attention layer with relative_attention_bias")
    for layer in layers:
        layer.compute_bias = _t5_compute_bias(T5RelativeBias.from_hf(layer))


def _t5_compute_bias(bias):
    def compute_bias(query_length, key_length, device=None, past_seen_tokens=0):
        """posenc's T5 bias ``[1, heads, query_length, key_length]`` (queries start at ``past_seen_tokens``)."""
        return bias(query_length, key_length, offset=past_seen_tokens)[None]

    return compute_bias


def _patch_bloom(model):
    bloom = [m for m in model.modules() if hasattr(m, "build_alibi_tensor") and hasattr(m, "num_heads")]
    if not bloom:
        raise ValueError(f"{type(model).__name__} has no BLOOM transformer with build_alibi_tensor")
    for module in bloom:
        module.build_alibi_tensor = bloom_alibi_tensor
        _rebind_forward(module, {"_get_alibi_slopes": _alibi_slopes})


def _alibi_slopes(num_heads, device):
    return pe.alibi_slopes(num_heads, xp=torch, device=device)


def bloom_alibi_tensor(attention_mask, num_heads, dtype):
    """BLOOM's ``build_alibi_tensor`` with posenc: ``[batch * heads, 1, kv]`` ALiBi of the key positions.

    BLOOM adds ``slope * key_position`` (positions from the padding mask), which differs
    from ALiBi's ``-slope * (query - key)`` by a constant per query row that softmax
    ignores; it is :func:`posenc.alibi_bias` with the query at position 0.
    """
    batch, length = attention_mask.shape
    keys = pe.positions_from_mask(attention_mask)
    queries = torch.zeros((batch, 1), dtype=keys.dtype, device=keys.device)
    slopes = _alibi_slopes(num_heads, attention_mask.device)
    bias = pe.alibi_bias(slopes, 1, length, query_positions=queries, key_positions=keys)
    return bias.reshape(batch * num_heads, 1, length).to(dtype)
