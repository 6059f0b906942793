"""Registrations of the torch autograd path (ops of ``posenc.torch._ops``).

Two kinds of torch calls must not go to a Numba kernel: a tensor that requires grad (with
grad mode on), which a kernel would cut from the autograd graph, and any tensor while
``torch.compile`` traces the call, since the compiler cannot trace into Numba. These
entries come first in the registry: they accept such calls and route them to
``torch.library`` custom ops, opaque to the compiler, whose backward is the same kernel
(rope: the inverse rotation; Toeplitz gather and scatter-add: each other's adjoint). The
custom ops' forward calls the registry again with grad mode off and eagerly, so the Numba
kernels still do the work. Nothing here imports torch.
"""

from __future__ import annotations

import sys

from .._config import torch_compiling
from .._dispatch import register


def _torch_call(arrays, out) -> bool:
    """A torch tensor among ``arrays`` that autograd records (and no ``out``), or any torch
    tensor while torch compiles (``out`` is then written by a copy)."""
    torch = sys.modules.get("torch")
    if torch is None or not any(isinstance(a, torch.Tensor) for a in arrays):
        return False
    if torch_compiling():
        from ..torch import _ops  # noqa: F401  (binds the registry entries: no import while tracing)

        return True
    return out is None and torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in arrays)


# The arguments that carry gradients, per op.
_DIFFERENTIABLE = {
    "rope_rotate": ("x", "positions"),
    "rope_apply": ("x", "cos", "sin"),
    "toeplitz_expand": ("vec",),
    "toeplitz_gather": ("scores",),
    "toeplitz_scatter": ("weights",),
}


def _accepts(op):
    names = _DIFFERENTIABLE[op]
    return lambda a: _torch_call([a[n] for n in names], a["out"])


for _op in _DIFFERENTIABLE:
    register(_op, f"{_op}.torch_autograd", accepts=_accepts(_op), loader=f"posenc.torch._ops:{_op}")
