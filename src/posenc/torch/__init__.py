"""PyTorch adapters: custom ops with gradients through the kernels, nn.Modules, flex attention.

Importing this module imports torch; ``import posenc`` alone does not.
"""

try:
    import torch as _torch  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised in a venv without torch (tests/test_install.py)
    raise ImportError("posenc.torch needs PyTorch: pip install 'posenc[torch]' (or install torch your own way first)") from exc

from . import _ops  # noqa: F401  (registers the posenc:: custom ops)
from .flex import score_mod
from .hf import HFRotaryEmbedding, patch_hf
from .lengthgen import FIRE, KERPLE, CoPE, RandomizedRoPE, Sandwich
from .modules import (
    ALiBi,
    DeBERTaRelative,
    LearnedEmbedding,
    NoPE,
    PositionalModule,
    RotaryEmbedding,
    ShawRelative,
    SinusoidalEmbedding,
    T5RelativeBias,
    TENERRelative,
    TUPE,
    TransformerXLRelative,
    XPos,
)

__all__ = [
    "ALiBi",
    "DeBERTaRelative",
    "HFRotaryEmbedding",
    "LearnedEmbedding",
    "NoPE",
    "PositionalModule",
    "RotaryEmbedding",
    "ShawRelative",
    "SinusoidalEmbedding",
    "T5RelativeBias",
    "TENERRelative",
    "TUPE",
    "TransformerXLRelative",
    "XPos",
    "patch_hf",
    "score_mod",
    "CoPE",
    "FIRE",
    "KERPLE",
    "RandomizedRoPE",
    "Sandwich",
]
