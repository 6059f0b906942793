"""Hugging Face transformers drop-in: posenc's rotary tables and biases inside a loaded model.

``HFRotaryEmbedding(config)`` has the signature of a transformers rotary module,
``forward(x, position_ids) -> (cos, sin)``, for every ``rope_type`` transformers ships.
``patch_hf(model)`` swaps, in place, the positional computation of a loaded model for
posenc's: its rotary modules and apply functions, T5 relative biases, ALiBi builders,
recognised and checked against the model's own code (:mod:`posenc.torch.hf_patch`).
transformers itself is never imported here: the model in hand says what it is.
"""

from __future__ import annotations

import torch
from torch import nn

import posenc as pe
from posenc.rotary.apply import rotate_pair
from posenc.rotary.mrope import _axis_of_pairs

from . import _ops
from ._rows import _MOST_CACHED_ROWS, _MOST_CACHED_SETS, _ROWS, _rows_through, cached_rows, fixed_tables, frequencies_name, stacked_tables  # noqa: F401  (kept rows: ``_rows``)

# Architectures (model types of transformers 5.24's causal-LM auto mapping, and the T5 family) whose
# tiny random model, patched, gives the original's logits within float32 rounding and its
# greedy tokens: the "covered" rows of docs/transformers.md (tests/hf_zoo.py, test_hf_zoo.py).
SUPPORTED = (
    "afmoe", "apertus", "apertus1p5_text", "arcee", "aria_text", "axk1", "axk2", "bailing_hybrid",
    "beam", "bitnet", "bloom", "codegen", "cohere", "cohere2", "cohere2_moe", "cwm", "deepseek_v2",
    "deepseek_v3", "deepseek_v32", "diffllama", "doge", "dots3_note_text", "emu3", "ernie4_5",
    "ernie4_5_moe", "exaone", "exaone4", "exaone_moe", "falcon", "falcon_h1", "flex_olmo", "flint",
    "gemma", "gemma2", "gemma3_text", "gemma4_text", "gemma4_unified", "gemma4_unified_text",
    "glm", "glm4", "glm4_moe", "glm4_moe_lite", "glm_moe_dsa", "gpt_neox",
    "gpt_neox_japanese", "gpt_oss", "gptj", "granite", "granite_swa", "granitemoe",
    "granitemoe_swa", "granitemoeshared", "helium", "hrm_text", "hunyuan_v1_dense",
    "hunyuan_v1_moe", "hy_v3", "hy_v4", "hyperclovax", "internlm3", "iquestcoder", "jais2",
    "jetmoe", "kolibri1", "laguna", "lara_mini", "lfm2", "lfm3", "llama", "llama4", "llama4_text",
    "longt5", "mellum", "mimo_v2_flash", "minicpm3", "minimax", "minimax_m2", "minimax_m3_vl_text",
    "ministral", "ministral3", "mistral", "mixtral", "mllama", "modernbert-decoder", "mpt", "mt5",
    "nanochat", "nemotron", "olmo", "olmo2", "olmo3", "olmo_hybrid", "olmoe", "persimmon", "phi",
    "phi3", "phi4_multimodal", "phimoe", "pix2struct", "pop2piano", "qwen2", "qwen2_moe", "qwen3",
    "qwen3_5", "qwen3_5_moe", "qwen3_5_moe_text", "qwen3_5_text", "qwen3_moe", "qwen3_next",
    "roformer", "sarvam_mla", "sarvam_moe", "seed_oss", "smollm3",
    "solar_open", "stablelm", "starcoder2", "switch_transformers", "t5", "umt5", "vaultgemma",
    "youtu", "zamba2",
)


class HFRotaryEmbedding(nn.Module):
    """posenc's drop-in for a transformers model's rotary embedding module.

    ``HFRotaryEmbedding(config, *, device=None, layer_type=None)``: ``config`` is the
    model's config (or its text config); ``forward(x, position_ids, layer_type=None)``
    returns ``(cos, sin)`` of shape ``position_ids.shape + (rotary_dim,)`` in ``x``'s dtype
    and device, as transformers' rotary modules do, with the attention scale folded in.

    Frequencies and the scaling come from :func:`posenc.scaling.from_hf` (every
    ``rope_type``); the angles are float64 (:func:`posenc.rope_cos_sin`), rounded once to
    ``x``'s dtype. Length-dependent scalings (``"dynamic"``, ``"longrope"``) are decided
    on every call from the length ``max(position_ids) + 1`` (``ceil`` of float ids: the
    side of ``original_max_position_embeddings`` transformers' float length is on); no
    state is kept between calls. With ``transformers_state=True`` (what :func:`patch_hf`
    installs) ``"dynamic"`` keeps transformers' module's state instead: its frequencies are
    at the longest length seen since a call shorter than ``config.max_position_embeddings``
    reset it (a buffer per layer type, updated in the graph under ``torch.compile``;
    :meth:`take_state` copies a transformers module's), so a second ``generate``, or an
    assisted one that verifies fewer tokens than the call before, gets transformers'
    frequencies. Parameters nested per layer type (Gemma 3) are read for ``layer_type``,
    given here or per call.

    Other scalings read CPU position ids' rows from :func:`cached_rows` (every value the
    one computing afresh gives). Under ``torch.compile`` a decode step's position is
    gathered in the graph from the rows :meth:`keep_rows_for_compile` kept, and any other
    call is one opaque op, ``posenc::rope_cos_sin``, whose body is the eager lookup: tables
    in the eager bits either way, where inductor, given the traced float64 formula, would
    recompute ``cos`` and ``sin`` inside every rotation that reads them (every layer and
    head) and skip their rounding to a 16-bit dtype there. GPU position ids compute afresh.

    ``device`` is accepted for the transformers signature; the tables are computed on the
    device of ``position_ids``.
    """

    def __init__(self, config, *, device=None, layer_type=None, transformers_state=False):
        super().__init__()
        self.config = config
        self.layer_type = layer_type
        nested = pe.scaling.nested_layer_types(config) if layer_type is None else []
        # One set of parameters, or one per layer type (chosen per call).
        self._rope = {t: pe.scaling.from_hf(config, layer_type=t) for t in nested} or {None: pe.scaling.from_hf(config, layer_type=layer_type)}
        first = next(iter(self._rope.values()))
        self.rotary_dim = first.rotary_dim
        self.attention_scaling = pe.rope_frequencies(first.rotary_dim, base=first.base, scaling=first.scaling)[1]
        # Frequencies that do not depend on the call, as Python floats (constants of a traced
        # graph); and a length-dependent scaling's at lengths up to its original one, where
        # dynamic NTK and LongRoPE do not depend on the length (eager calls there read rows too).
        self._fixed, self._unscaled = {}, {}
        for key, rope in self._rope.items():
            fixed = rope.scaling is None or not rope.scaling.uses_seq_len
            if fixed or isinstance(rope.scaling, (pe.scaling.DynamicNTK, pe.scaling.LongRoPE)):
                inv_freq, scale = pe.rope_frequencies(rope.rotary_dim, base=rope.base, scaling=rope.scaling)
                frequencies = (tuple(inv_freq.tolist()), float(scale))
                if fixed:
                    self._fixed[key] = frequencies
                else:
                    self._unscaled[key] = (*frequencies, rope.scaling.original_max_position)
        self._fixed_names = {key: frequencies_name(*fixed) for key, fixed in self._fixed.items()}
        self._rows_for_compile = {}  # (key, dtype) -> rows: see keep_rows_for_compile
        # transformers' dynamic module's state (transformers_state): the length its frequencies are at, one per layer type.
        self._longest_seen = {}
        self._original_length = getattr(config, "max_position_embeddings", None)
        for i, (key, rope) in enumerate(self._rope.items()):
            if transformers_state and isinstance(rope.scaling, pe.scaling.DynamicNTK) and self._original_length is not None:
                self._longest_seen[key] = f"_longest_seen_{i}"
                with torch.inference_mode(False):  # (an inference tensor could not be updated outside inference mode)
                    self.register_buffer(self._longest_seen[key], torch.tensor(int(self._original_length), device=device), persistent=False)

    def _apply(self, fn, recurse=True):
        """A move keeps the dynamic state's lengths; a module built on the meta device and
        materialised (``to_empty``, whose buffers hold whatever memory held) starts from the
        original length, as one built in place does. Either way the state is a normal tensor,
        as built: one moved under ``torch.inference_mode`` would be an inference tensor, which
        a call outside it could not update."""
        seen = {name: None if getattr(self, name).is_meta else int(getattr(self, name)) for name in self._longest_seen.values()}
        super()._apply(fn, recurse)
        for name, length in seen.items():
            buffer = getattr(self, name)
            if not buffer.is_meta:
                with torch.inference_mode(False):
                    self._buffers[name] = torch.tensor(self._original_length if length is None else length, dtype=buffer.dtype, device=buffer.device)
        return self

    def take_state(self, module):
        """Take transformers' rotary ``module``'s dynamic state (``max_seq_len_cached``, one per
        layer type): the next call's frequencies are the ones ``module``'s next call would use."""
        for key, name in self._longest_seen.items():
            seen = getattr(module, "max_seq_len_cached", self._original_length)
            if key is not None:
                seen = getattr(module, f"{key}_max_seq_len_cached", seen)
            with torch.no_grad():
                getattr(self, name).fill_(int(seen))

    def keep_rows_for_compile(self, dtype):
        """Keep, for graphs compiled in ``dtype`` (``torch.compile``), the ``[cos, sin]`` rows
        of positions below ``config.max_position_embeddings`` (at most 8192): a compiled call
        for one CPU position (a decode step) gathers its tables from them in the graph when
        the position has its row (``posenc::rope_cos_sin_rows``); other calls, or calls in
        a dtype with no rows kept, call ``posenc::rope_cos_sin``. They are the rows
        :func:`cached_rows` reads, the eager call's bits. ``patch_hf`` keeps them for a CPU
        model's dtype."""
        count = min(getattr(self.config, "max_position_embeddings", None) or _MOST_ROWS_FOR_COMPILE, _MOST_ROWS_FOR_COMPILE)
        for key, (inv_freq, scale) in self._fixed.items():
            self._rows_for_compile[key, dtype] = _rows_through(inv_freq, scale, dtype, count - 1)[0][:count].clone()  # (not a view of the shared rows)

    def _key(self, layer_type):
        """The key of ``self._rope`` (and ``self._fixed``) for ``layer_type``."""
        if None in self._rope:
            return None
        if layer_type not in self._rope:
            raise ValueError(f"layer_type must be one of {', '.join(map(repr, self._rope))} for this config, got {layer_type!r}")
        return layer_type

    def forward(self, x, position_ids, layer_type=None):
        key = self._key(layer_type)
        rope, fixed = self._rope[key], self._fixed.get(key)
        if position_ids.dtype == torch.bool:  # (not indices of kept rows: a mask)
            raise TypeError("position_ids must be integers or floats, got torch.bool")
        if position_ids.dtype in _NARROW_INTEGERS:  # indices of kept rows, where uint8 would be a mask
            position_ids = position_ids.to(torch.int64)
        if fixed is not None and position_ids.dtype in (torch.int32, torch.int64):
            inv_freq, scale = fixed
            if torch.compiler.is_compiling():
                tables = self._compiled_tables(key, x.dtype, position_ids)
                return tables[..., 0, :], tables[..., 1, :]
            return fixed_tables(inv_freq, scale, x.dtype, position_ids)
        with torch.no_grad():
            seq_len = None
            if rope.scaling is not None and rope.scaling.uses_seq_len and position_ids.numel():
                top = position_ids.max()
                if top.is_floating_point() and not torch.compiler.is_compiling() and not bool(torch.isfinite(top)):
                    raise ValueError(f"position_ids must be finite, got {float(top)}")
                # (a traced value under torch.compile; ids all negative: length 0, the original
                # frequencies, as transformers' comparisons with the original length take them)
                seq_len = torch.clamp((top if not top.is_floating_point() else torch.ceil(top).long()) + 1, min=0)
                if key in self._longest_seen:
                    seq_len = self._dynamic_length(key, seq_len)
                unscaled = self._unscaled.get(key)
                if unscaled and position_ids.device.type == "cpu" and position_ids.dtype in (torch.int32, torch.int64) and not torch.compiler.is_compiling():
                    inv_freq, scale, original = unscaled
                    if int(seq_len) <= original:
                        return fixed_tables(inv_freq, scale, x.dtype, position_ids)
            inv_freq, scale = pe.rope_frequencies(rope.rotary_dim, base=rope.base, scaling=rope.scaling, seq_len=seq_len)
            return pe.rope_cos_sin(position_ids, inv_freq, dtype=x.dtype, scale=scale)

    def _dynamic_length(self, key, seq_len):
        """The length transformers' ``dynamic`` module's frequencies are at after a call of
        ``seq_len``: the longest seen grows to it; a call shorter than the original length,
        after one longer, resets it to the original length; otherwise it stays."""
        seen = getattr(self, self._longest_seen[key])
        if not torch.compiler.is_compiling():  # eager: Python ints (transformers' module reads the length as well)
            now, before = int(seq_len), int(seen)
            length = self._original_length if now < self._original_length < before else max(now, before)
            if length != before:
                seen.fill_(length)
            return length
        now = seq_len.to(seen.device, seen.dtype)
        reset = (now < self._original_length) & (seen > self._original_length)
        length = torch.where(reset, torch.full_like(seen, self._original_length), torch.maximum(now, seen))
        seen.copy_(length)
        return length.to(seq_len.device)

    def _compiled_tables(self, key, dtype, position_ids):
        """``stacked_tables`` in a compiled graph: from the rows kept for ``dtype``
        (``posenc::rope_cos_sin_rows``), or the op whose body is the eager lookup."""
        name, rows = self._fixed_names[key], self._rows_for_compile.get((key, dtype))
        if rows is not None and position_ids.device.type == "cpu" and _ops.decomposed_by_inductor():
            return _ops.rope_cos_sin_rows_op(position_ids, rows, name, dtype)
        return _ops.rope_cos_sin_op(position_ids, name, dtype)


class MultimodalHFRotaryEmbedding(HFRotaryEmbedding):
    r"""posenc's drop-in for a multimodal (M-RoPE) text rotary module: Qwen2-VL's, Qwen3-VL's,
    Qwen3.5's (``layout = "half"``), GLM-4V's (:class:`InterleavedMultimodalHFRotaryEmbedding`).

    ``forward(x, position_ids, layer_type=None)`` takes ``position_ids`` ``[3, batch, seq]``
    (temporal, height, width; ``[batch, seq]`` gives every axis the same ids, text) and returns
    ``(cos, sin)`` ``[batch, seq, rotary_dim]``, as those modules do:

    .. math:: c_{b,s,i} = \cos(p_{a(i),b,s}\,\theta_i)

    where pair ``i`` turns with axis ``a(i)`` of the sections and dealing
    :func:`posenc.scaling.from_hf` reads for the config's model type (consecutive sections,
    Qwen2-VL and GLM-4V; dealt in turn, Qwen3-VL and Qwen3.5: :func:`posenc.mrope_cos_sin`'s
    rule, for any sections as transformers' strided slices deal them). (Wang et al.,
    "Qwen2-VL", 2024.) The tables are :class:`HFRotaryEmbedding`'s of each axis's ids (its
    rows kept between calls; a length-dependent scaling at ``max(position_ids) + 1`` over
    every axis, as transformers reads it); each pair's entries are taken from its axis's
    bit for bit (masks on the bits: ``torch.where`` and ``gather`` take 4-10x as long on a
    CPU), in the half order or each twice in a row (``layout = "interleaved"``).
    """

    layout = "half"

    def __init__(self, config, *, device=None, layer_type=None, transformers_state=False):
        super().__init__(config, device=device, layer_type=layer_type, transformers_state=transformers_state)
        self._masks = {}  # key -> name of its _axis_masks buffer
        for i, (key, rope) in enumerate(self._rope.items()):
            if rope.multimodal not in ("mrope", "mrope_interleaved"):
                read = "none" if rope.multimodal is None else f"{rope.multimodal} sections {rope.sections}"
                raise ValueError(f"{type(self).__name__} needs M-RoPE sections (mrope_section); from_hf read {read}")
            pairs, dealt = rope.rotary_dim // 2, rope.multimodal == "mrope_interleaved"
            if not dealt and sum(rope.sections) != pairs:
                raise ValueError(f"consecutive M-RoPE sections must sum to rotary_dim / 2 = {pairs}, got {list(rope.sections)}")
            self._masks[key] = f"_axis_masks_{i}"
            self.register_buffer(self._masks[key], self._axis_masks(rope, device), persistent=False)

    @staticmethod
    def _axis_masks(rope, device):
        """``[axes, 1, 1, 1, r / 2]`` int8: -1 (every bit) where pair ``i`` turns with the axis, else 0."""
        axis_of = torch.tensor(_axis_of_pairs(rope.sections, rope.multimodal == "mrope_interleaved", rope.rotary_dim // 2), device=device)
        masks = -(axis_of == torch.arange(len(rope.sections), device=device)[:, None]).to(torch.int8)
        return masks[:, None, None, None]

    def _apply(self, fn, recurse=True):
        """The masks follow the config, not the buffers' memory (``to_empty`` leaves garbage)."""
        super()._apply(fn, recurse)
        for key, name in self._masks.items():
            masks = getattr(self, name)
            if not masks.is_meta:
                self._buffers[name] = self._axis_masks(self._rope[key], masks.device)
        return self

    def forward(self, x, position_ids, layer_type=None):
        key = self._key(layer_type)
        masks = getattr(self, self._masks[key])
        if position_ids.ndim == 2:
            position_ids = position_ids.expand(masks.shape[0], -1, -1)
        elif position_ids.ndim != 3 or position_ids.shape[0] != masks.shape[0]:
            raise ValueError(f"position_ids must be [{masks.shape[0]}, batch, seq] or [batch, seq], got shape {tuple(position_ids.shape)}")
        fixed = self._fixed.get(key)
        if fixed is not None and position_ids.dtype in (torch.int32, torch.int64) and not torch.compiler.is_compiling():
            tables = stacked_tables(*fixed, x.dtype, position_ids)
        else:
            tables = torch.stack(super().forward(x, position_ids, layer_type), dim=-2)
        half = tables[..., : tables.shape[-1] // 2]  # [axes, batch, seq, 2, r / 2]
        bits = half.view(_SAME_SIZE_INTEGER[half.element_size()])
        picked = torch.sum(bits & masks.to(bits.device), dim=0, dtype=bits.dtype).movedim(-2, 0)  # (one term is not 0)
        picked = torch.cat((picked, picked), -1) if self.layout == "half" else _twice_each(picked)  # [2, batch, seq, r]
        picked = picked.view(tables.dtype)
        return picked[0], picked[1]


def _twice_each(bits):
    """``bits.repeat_interleave(2, -1)``, C-contiguous: for many entries each in both halves of
    an integer twice as wide, where there is one (``repeat_interleave`` took 3x as long: 82 of
    the 184 us of GLM-4V's bfloat16 tables of 1,024 positions, one thread; a decode step's few
    entries keep it: 2.9 us against 8.6)."""
    wider = _TWICE_AS_WIDE.get(bits.dtype)
    if wider is None or bits.numel() < 8192:
        return bits.repeat_interleave(2, -1)
    width = 8 * bits.element_size()
    low = bits.to(wider, memory_format=torch.contiguous_format) & ((1 << width) - 1)
    return (low | low << width).view(bits.dtype)


class InterleavedMultimodalHFRotaryEmbedding(MultimodalHFRotaryEmbedding):
    """:class:`MultimodalHFRotaryEmbedding` with each ``cos``/``sin`` entry twice in a row,
    ``[c_0, c_0, c_1, c_1, ...]``: GLM-4V's text rotary module, whose apply function pairs
    ``(x[2i], x[2i+1])``."""

    layout = "interleaved"


# The integers MultimodalHFRotaryEmbedding views tables as, by element size (int8 masks sign-extend to their width).
_SAME_SIZE_INTEGER = {2: torch.int16, 4: torch.int32, 8: torch.int64}
_TWICE_AS_WIDE = {torch.int16: torch.int32, torch.int32: torch.int64}

# Integer position ids widened to int64 on entry, as transformers' own modules take them.
_NARROW_INTEGERS = (torch.int8, torch.uint8, torch.int16, torch.uint16, torch.uint32)

# keep_rows_for_compile keeps the rows of positions below max_position_embeddings, at most this
# many (8 MiB for cos and sin of 128 float32): a compiled call beyond them costs the op's ~20 µs.
_MOST_ROWS_FOR_COMPILE = 1 << 13


def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
    """transformers' ``apply_rotary_pos_emb`` through :func:`posenc.apply_rope` (its kernels).

    ``cos``/``sin`` are ``[batch, seq, r]`` (``r`` may be smaller than the head: partial
    rotary), unsqueezed at ``unsqueeze_dim`` to broadcast against ``q`` and ``k``. A
    repeated call signature launches from ``rotate_pair``'s plan: the two planned
    ``apply_rope`` launches on a CPU, one launch for both on CUDA tensors.
    """
    # A plain function: a patched attention's globals name it, and torch.compile guards on
    # the closure of what those globals hold (the planned wrapper has one) by a wrong path.
    return rotate_pair(q, k, cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim))
