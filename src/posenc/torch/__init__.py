"""PyTorch adapters: custom ops with gradients through the kernels, nn.Modules, flex attention.

Importing this module imports torch; ``import posenc`` alone does not.
"""

try:
    import torch as _torch  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised in a venv without torch (tests/test_install.py)
    raise ImportError("posenc.torch needs PyTorch: pip install 'posenc[torch]' (or install torch your own way first)") from exc

from . import _ops  # noqa: F401  (registers the posenc:: custom ops)
from .flex import score_mod
from .hf import HFRotaryEmbedding
from .hf_patch import patch_hf
from .lengthgen import FIRE, KERPLE, CoPE, RandomizedRoPE, Sandwich
from .modules import *  # noqa: F403  (every positional module of the protocol)
from .modules import __all__ as _modules_all

__all__ = [
    *_modules_all,
    "CoPE",
    "FIRE",
    "KERPLE",
    "RandomizedRoPE",
    "Sandwich",
    "HFRotaryEmbedding",
    "patch_hf",
    "score_mod",
]
