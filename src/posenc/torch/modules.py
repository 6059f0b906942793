"""Every positional module of ``posenc.torch``, one protocol (:class:`PositionalModule`).

Each module holds its parameters (or buffers) and calls the public function; gradients go
through posenc's custom ops (``posenc.torch._ops``), so the Numba kernels do the work
forward and backward. The families live in ``absolute``, ``rotary``, ``biases`` and
``relative``; this module gathers them.
"""

from ._protocol import PositionalModule
from .absolute import LearnedEmbedding, NoPE, SinusoidalEmbedding
from .biases import ALiBi, T5RelativeBias
from .relative import TUPE, DeBERTaRelative, ShawRelative, TENERRelative, TransformerXLRelative
from .rotary import RotaryEmbedding, XPos

__all__ = [
    "ALiBi",
    "DeBERTaRelative",
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
]
