"""Registrations of the torch autograd path (ops of ``posenc.torch._ops``).

A torch tensor that requires grad (with grad mode on) must not go to a Numba kernel, which
would cut it from the graph. These entries come first in the registry: they accept such
calls and route them to ``torch.library`` custom ops whose backward is the same kernel
(rope: the inverse rotation; Toeplitz gather and scatter-add: each other's adjoint). The
custom ops' forward calls the registry again with grad mode off, so the Numba kernels
still do the work. Nothing here imports torch.
"""

from __future__ import annotations

import sys

from .. import _compat
from .._dispatch import register


def _needs_grad(*arrays) -> bool:
    torch = sys.modules.get("torch")
    if torch is None or not torch.is_grad_enabled():
        return False
    return any(_compat.is_torch_array(a) and a.requires_grad for a in arrays)


# The arguments that carry gradients, per op.
_DIFFERENTIABLE = {
    "rope_rotate": ("x",),
    "rope_apply": ("x", "cos", "sin"),
    "toeplitz_expand": ("vec",),
    "toeplitz_gather": ("scores",),
    "toeplitz_scatter": ("weights",),
}


def _accepts(op):
    names = _DIFFERENTIABLE[op]
    return lambda a: a["out"] is None and _needs_grad(*(a[n] for n in names))


for _op in _DIFFERENTIABLE:
    register(_op, f"{_op}.torch_autograd", accepts=_accepts(_op), loader=f"posenc.torch._ops:{_op}")
