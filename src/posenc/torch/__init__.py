"""PyTorch adapters: custom ops with gradients through the kernels, nn.Modules, flex attention.

Importing this module imports torch; ``import posenc`` alone does not.
"""

from . import _ops  # noqa: F401  (registers the posenc:: custom ops)
from .flex import score_mod
from .modules import ALiBi, DeBERTaRelative, LearnedEmbedding, RotaryEmbedding, ShawRelative, SinusoidalEmbedding, T5RelativeBias

__all__ = [
    "ALiBi",
    "DeBERTaRelative",
    "LearnedEmbedding",
    "RotaryEmbedding",
    "ShawRelative",
    "SinusoidalEmbedding",
    "T5RelativeBias",
    "score_mod",
]
