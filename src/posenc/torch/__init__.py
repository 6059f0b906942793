"""PyTorch adapters: custom ops with gradients through the kernels, nn.Modules, flex attention.

Importing this module imports torch; ``import posenc`` alone does not.
"""

from . import _ops  # noqa: F401  (registers the posenc:: custom ops)
from .flex import score_mod
from .hf import HFRotaryEmbedding, patch_hf
from .modules import ALiBi, DeBERTaRelative, LearnedEmbedding, RotaryEmbedding, ShawRelative, SinusoidalEmbedding, T5RelativeBias

__all__ = [
    "ALiBi",
    "DeBERTaRelative",
    "HFRotaryEmbedding",
    "LearnedEmbedding",
    "RotaryEmbedding",
    "ShawRelative",
    "SinusoidalEmbedding",
    "T5RelativeBias",
    "patch_hf",
    "score_mod",
]
