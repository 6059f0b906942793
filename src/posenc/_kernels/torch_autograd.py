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


def _accepts_rope_rotate(x, positions, inv_freq, *, layout="half", inverse=False, scale=1.0, out=None):
    return out is None and _needs_grad(x)


def _accepts_rope_apply(x, cos, sin, *, layout="half", out=None):
    return out is None and _needs_grad(x, cos, sin)


def _accepts_expand(vec, q_len, k_len, *, out=None):
    return out is None and _needs_grad(vec)


def _accepts_gather(scores, index, k_len, *, out=None):
    return out is None and _needs_grad(scores)


def _accepts_scatter(weights, index, m, *, out=None):
    return out is None and _needs_grad(weights)


def _samples(op):
    def samples(rng):
        from posenc.torch import _samples

        return _samples.SAMPLES[op](rng)

    return samples


_LOADER = "posenc.torch._ops:"
for _op, _accepts in (
    ("rope_rotate", _accepts_rope_rotate),
    ("rope_apply", _accepts_rope_apply),
    ("toeplitz_expand", _accepts_expand),
    ("toeplitz_gather", _accepts_gather),
    ("toeplitz_scatter", _accepts_scatter),
):
    register(_op, f"{_op}.torch_autograd", accepts=_accepts, loader=_LOADER + _op, samples=_samples(_op))
