"""Rotary position embeddings (RoPE), scalings and relatives."""

from . import _rotate  # noqa: F401  (registers the rotation references)
from . import scaling
from .apply import apply_rope, rope, rope_cos_sin
from .axial import axial_frequencies, axial_rope
from .decay import rope_decay
from .frequencies import rope_frequencies
from .interop import convert_layout, permute_qk_weight, rerotate
from .linear_attention import linear_attention
from .mrope import mrope_cos_sin, xdrope_cos_sin
from .positions import positions_from_cu_seqlens, positions_from_mask
from .xpos import xpos_scale

__all__ = [
    "apply_rope",
    "axial_frequencies",
    "axial_rope",
    "convert_layout",
    "linear_attention",
    "mrope_cos_sin",
    "permute_qk_weight",
    "positions_from_cu_seqlens",
    "positions_from_mask",
    "rerotate",
    "rope",
    "rope_cos_sin",
    "rope_decay",
    "rope_frequencies",
    "scaling",
    "xdrope_cos_sin",
    "xpos_scale",
]
