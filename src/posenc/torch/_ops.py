"""torch.library custom ops for posenc's kernel paths, with fake (meta) and autograd rules.

Each op's forward calls posenc's kernel registry with grad mode off, so a Numba kernel (or
the reference) computes it; the backward is the same machinery run on the gradient:

* ``rope_rotate``: backward is the inverse rotation (same angles, ``-sin``), same scale;
* ``rope_apply``: backward rotates the gradient by ``(cos, -sin)``; ``cos``/``sin`` are
  treated as constants (no gradient flows to them);
* ``toeplitz_expand``: backward sums the gradient along each diagonal ``i - j`` (the
  adjoint of a Toeplitz expansion);
* ``toeplitz_gather`` / ``toeplitz_scatter``: each is the other's adjoint.

The ops are opaque to ``torch.compile`` (no graph break) and pass ``torch.library.opcheck``.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from .. import _dispatch


def _kernel(op, *args, **kwargs):
    with torch.no_grad():
        return _dispatch.call(op, *args, **kwargs)


@torch.library.custom_op("posenc::rope_rotate", mutates_args=())
def rope_rotate_op(x: Tensor, positions: Tensor, inv_freq: list[float], interleaved: bool, inverse: bool, scale: float) -> Tensor:
    layout = "interleaved" if interleaved else "half"
    return _kernel("rope_rotate", x, positions, np.asarray(inv_freq, dtype=np.float64), layout=layout, inverse=inverse, scale=scale)


@rope_rotate_op.register_fake
def _(x, positions, inv_freq, interleaved, inverse, scale):
    return torch.empty_like(x)


def _rope_rotate_setup(ctx, inputs, output):
    _, positions, inv_freq, interleaved, inverse, scale = inputs
    ctx.save_for_backward(positions)
    ctx.args = (inv_freq, interleaved, inverse, scale)


def _rope_rotate_backward(ctx, grad):
    (positions,) = ctx.saved_tensors
    inv_freq, interleaved, inverse, scale = ctx.args
    return rope_rotate_op(grad.contiguous(), positions, inv_freq, interleaved, not inverse, scale), None, None, None, None, None


rope_rotate_op.register_autograd(_rope_rotate_backward, setup_context=_rope_rotate_setup)


@torch.library.custom_op("posenc::rope_apply", mutates_args=())
def rope_apply_op(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool) -> Tensor:
    return _kernel("rope_apply", x, cos, sin, layout="interleaved" if interleaved else "half")


@rope_apply_op.register_fake
def _(x, cos, sin, interleaved):
    return torch.empty_like(x)


def _rope_apply_setup(ctx, inputs, output):
    _, cos, sin, interleaved = inputs
    ctx.save_for_backward(cos, sin)
    ctx.interleaved = interleaved


def _rope_apply_backward(ctx, grad):
    cos, sin = ctx.saved_tensors
    return rope_apply_op(grad.contiguous(), cos, -sin, ctx.interleaved), None, None, None


rope_apply_op.register_autograd(_rope_apply_backward, setup_context=_rope_apply_setup)


@torch.library.custom_op("posenc::toeplitz_expand", mutates_args=())
def toeplitz_expand_op(vec: Tensor, q_len: int, k_len: int) -> Tensor:
    return _kernel("toeplitz_expand", vec, q_len, k_len)


@toeplitz_expand_op.register_fake
def _(vec, q_len, k_len):
    return vec.new_empty((*vec.shape[:-1], q_len, k_len))


def diagonal_sums(grad: Tensor) -> Tensor:
    """``out[..., t] = sum over i - j + k_len - 1 == t of grad[..., i, j]`` (pure torch).

    Reversing the key axis turns diagonal ``t`` into anti-diagonal ``i + j'``; padding each
    row with ``q_len`` zeros and re-reading the flat buffer with rows one longer shifts row
    ``i`` right by ``i``, so the anti-diagonals line up as columns.
    """
    q_len, k_len = grad.shape[-2], grad.shape[-1]
    lead = grad.shape[:-2]
    flipped = torch.flip(grad, dims=(-1,))
    padded = torch.nn.functional.pad(flipped, (0, q_len))
    flat = padded.reshape(*lead, q_len * (k_len + q_len))[..., : q_len * (k_len + q_len - 1)]
    return flat.reshape(*lead, q_len, k_len + q_len - 1).sum(dim=-2)


def _expand_backward(ctx, grad):
    return diagonal_sums(grad), None, None


toeplitz_expand_op.register_autograd(_expand_backward)


@torch.library.custom_op("posenc::toeplitz_gather", mutates_args=())
def toeplitz_gather_op(scores: Tensor, index: Tensor, k_len: int) -> Tensor:
    return _kernel("toeplitz_gather", scores, index, k_len)


@torch.library.custom_op("posenc::toeplitz_scatter", mutates_args=())
def toeplitz_scatter_op(weights: Tensor, index: Tensor, m: int) -> Tensor:
    return _kernel("toeplitz_scatter", weights, index, m)


def _last_axis_resized(x, index, n):
    """An uninitialised tensor like ``x`` with ``n`` entries along its last axis (the fake result)."""
    return x.new_empty((*x.shape[:-1], n))


def _register_adjoint(op, adjoint):
    """Fake and autograd rules of ``op(x, index, n)``: its backward is ``adjoint(grad, index, x.shape[-1])``."""

    def setup(ctx, inputs, output):
        x, index, _ = inputs
        ctx.save_for_backward(index)
        ctx.n = x.shape[-1]

    def backward(ctx, grad):
        (index,) = ctx.saved_tensors
        return adjoint(grad.contiguous(), index, ctx.n), None, None

    op.register_fake(_last_axis_resized)
    op.register_autograd(backward, setup_context=setup)


_register_adjoint(toeplitz_gather_op, toeplitz_scatter_op)
_register_adjoint(toeplitz_scatter_op, toeplitz_gather_op)


# Registry entries (``posenc._kernels.torch_autograd``): the references' signatures.


def rope_rotate(x, positions, inv_freq, *, layout="half", inverse=False, scale=1.0, out=None):
    inv = [float(f) for f in np.asarray(inv_freq, dtype=np.float64)]
    return rope_rotate_op(x, positions, inv, layout == "interleaved", bool(inverse), float(scale))


def rope_apply(x, cos, sin, *, layout="half", out=None):
    return rope_apply_op(x, cos, sin, layout == "interleaved")


def toeplitz_expand(vec, q_len, k_len, *, out=None):
    return toeplitz_expand_op(vec, int(q_len), int(k_len))


def toeplitz_gather(scores, index, k_len, *, out=None):
    return toeplitz_gather_op(scores, index, int(k_len))


def toeplitz_scatter(weights, index, m, *, out=None):
    return toeplitz_scatter_op(weights, index, int(m))
