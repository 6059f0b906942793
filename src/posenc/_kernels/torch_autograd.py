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


def _accepts_rope_rotate(x, positions, inv_freq, *, layout="half", inverse=False, scale=1.0, out=None):
    return _torch_call((x, positions), out)


def _accepts_rope_apply(x, cos, sin, *, layout="half", out=None):
    return _torch_call((x, cos, sin), out)


def _accepts_expand(vec, q_len, k_len, *, out=None):
    return _torch_call((vec,), out)


def _accepts_gather(scores, index, k_len, *, out=None):
    return _torch_call((scores,), out)


def _accepts_scatter(weights, index, m, *, out=None):
    return _torch_call((weights,), out)


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
