"""torch.library custom ops for posenc's kernel paths, with fake (meta) and autograd rules.

Each op's forward calls posenc's kernel registry with grad mode off, so a Numba kernel (or
the reference) computes it; the backward is the same machinery run on the gradient:

* ``rope_rotate``: backward is the inverse rotation (same angles, ``-sin``), same scale;
  float ``positions`` get ``sum_i theta_i (g_b y_a - g_a y_b)`` over the pairs of each token
  (``-theta_i`` for ``inverse``), the derivative of the angle;
* ``rope_apply``: backward rotates the gradient by ``(cos, -sin)``; ``cos``/``sin`` get
  ``g_a a + g_b b`` and ``g_b a - g_a b`` at the entry each pair reads (the first of its
  two copies; the other copy is not read, its gradient is 0), summed over broadcast axes,
  so learned frequencies train;
* ``toeplitz_expand``: backward sums the gradient along each diagonal ``i - j`` (the
  adjoint of a Toeplitz expansion);
* ``toeplitz_gather`` / ``toeplitz_scatter``: each is the other's adjoint, and so are their
  ``_rows`` forms (one index per row of the first axis: one offset per batch row).

Every differentiable argument gets its gradient (``tests/test_torch_ops.py`` gradchecks each).
The ops are opaque to ``torch.compile`` (no graph break) and pass ``torch.library.opcheck``.
``rope_cos_sin`` and ``rope_cos_sin_rows`` give ``HFRotaryEmbedding``'s tables of integer
positions in a compiled graph (nothing differentiable); inductor decomposes the second
(``_rows_in_graph``).
"""

from __future__ import annotations

import contextlib

import numpy as np
import torch
from torch import Tensor

from .. import _dispatch, _plans
from .._built import built_in_range
from .._xp import kept_for_gradient, namespace
from ..relative import tupe, xl
from ..rotary import _rows, _signatures
from ..rotary.scaling import named_frequency_table, scaling_name


def _kernel(op, *args, **kwargs):
    with torch.no_grad():
        return _dispatch.call(op, *args, **kwargs)


@torch.library.custom_op("posenc::rope_rotate", mutates_args=())
def rope_rotate_op(x: Tensor, positions: Tensor, inv_freq: list[float], interleaved: bool, inverse: bool, scale: float) -> Tensor:
    with torch.no_grad():
        return _rotate_kernel(x, positions, tuple(inv_freq), layout="interleaved" if interleaved else "half", inverse=inverse, scale=scale)


@_plans.planned(_signatures.RotatePositions)
def _rotate_kernel(x, positions, inv_freq, *, layout, inverse, scale):
    """The kernel of ``rope_rotate``, planned: each training step's and each compiled graph's calls."""
    return _dispatch.call("rope_rotate", x, positions, np.asarray(inv_freq, dtype=np.float64), layout=layout, inverse=inverse, scale=scale)


@rope_rotate_op.register_fake
def _(x, positions, inv_freq, interleaved, inverse, scale):
    return x.new_empty(x.shape)  # contiguous, as the kernel's result (not x's strides)


def _pairs(t, interleaved, half):
    """The two members ``(a, b)`` of the first ``half`` rotated pairs of ``t``."""
    if interleaved:
        return t[..., 0 : 2 * half : 2], t[..., 1 : 2 * half : 2]
    return t[..., :half], t[..., half : 2 * half]


def _first_of_pairs(values, interleaved, shape):
    """A tensor of ``shape`` (a ``cos``/``sin`` table) holding ``values`` at the first entry of each pair, 0 at the second."""
    zeros = torch.zeros_like(values)
    if interleaved:
        table = torch.stack([values, zeros], dim=-1).flatten(-2)
    else:
        table = torch.cat([values, zeros], dim=-1)
    return table.sum_to_size(shape)


def _rope_rotate_setup(ctx, inputs, output):
    _, positions, inv_freq, interleaved, inverse, scale = inputs
    ctx.save_for_backward(positions, output if ctx.needs_input_grad[1] else None)
    ctx.args = (inv_freq, interleaved, inverse, scale)


def _rope_rotate_backward(ctx, grad):
    positions, output = ctx.saved_tensors
    inv_freq, interleaved, inverse, scale = ctx.args
    grad_x = grad_positions = None
    if ctx.needs_input_grad[0]:
        grad_x = rope_rotate_op(grad.contiguous(), positions, inv_freq, interleaved, not inverse, scale)
    if ctx.needs_input_grad[1]:
        theta = torch.tensor(inv_freq, dtype=torch.float64, device=grad.device)
        grad_positions = _positions_gradient(grad, output, positions, theta, interleaved, inverse)
    return grad_x, grad_positions, None, None, None, None


def _positions_gradient(grad, output, positions, theta, interleaved, inverse):
    """``sum_i theta_i (g_b y_a - g_a y_b)`` over the pairs of each token (``-theta_i`` for
    ``inverse``): the derivative of the rotation's angle, summed to ``positions``' shape."""
    y_a, y_b = _pairs(output.double(), interleaved, theta.shape[-1])
    g_a, g_b = _pairs(grad.double(), interleaved, theta.shape[-1])
    per_token = ((g_b * y_a - g_a * y_b) * theta).sum(-1) * (-1.0 if inverse else 1.0)
    return per_token.sum_to_size(positions.shape).to(positions.dtype)


rope_rotate_op.register_autograd(_rope_rotate_backward, setup_context=_rope_rotate_setup)


@torch.library.custom_op("posenc::rope_rotate_at_length", mutates_args=())
def rope_rotate_at_length_op(
    x: Tensor, positions: Tensor, seq_len: int, scaling: str, rotary_dim: int, base: float, interleaved: bool, inverse: bool, divide: bool
) -> Tensor:
    return _rotated_at_length(x, positions, seq_len, scaling, rotary_dim, base, interleaved, inverse, divide)


def _rotated_at_length(x, positions, seq_len, scaling, rotary_dim, base, interleaved, inverse, divide):
    inv_freq, scale = named_frequency_table(scaling, rotary_dim, base, seq_len)
    layout = "interleaved" if interleaved else "half"
    with torch.no_grad():
        return _rotate_kernel(x, positions, tuple(inv_freq), layout=layout, inverse=inverse, scale=1.0 / scale if divide else scale)


@rope_rotate_at_length_op.register_fake
def _(x, positions, seq_len, scaling, rotary_dim, base, interleaved, inverse, divide):
    return x.new_empty(x.shape)


@torch.library.custom_op("posenc::rope_frequencies_at_length", mutates_args=())
def rope_frequencies_at_length_op(seq_len: int, scaling: str, rotary_dim: int, base: float, device: torch.device) -> Tensor:
    return torch.tensor(named_frequency_table(scaling, rotary_dim, base, seq_len)[0], dtype=torch.float64, device=device)


@rope_frequencies_at_length_op.register_fake
def _(seq_len, scaling, rotary_dim, base, device):
    return torch.empty((rotary_dim // 2,), dtype=torch.float64, device=device)


def _rope_rotate_at_length_setup(ctx, inputs, output):
    positions, args = inputs[1], inputs[2:]
    ctx.save_for_backward(positions, output if ctx.needs_input_grad[1] else None)
    ctx.args = args


def _length_backward(rotate, frequencies):
    """The backward of a rotation at the frequencies of a length read when it runs
    (``rotate``), as ``rope_rotate``'s: the same op at ``-angle``, and for float positions
    the frequencies ``frequencies`` reads (per row for per-row lengths)."""

    def backward(ctx, grad):
        positions, output = ctx.saved_tensors
        seq_len, scaling, rotary_dim, base, interleaved, inverse, divide = ctx.args
        grad_x = grad_positions = None
        if ctx.needs_input_grad[0]:
            grad_x = rotate(grad.contiguous(), positions, seq_len, scaling, rotary_dim, base, interleaved, not inverse, divide)
        if ctx.needs_input_grad[1]:
            theta = frequencies(seq_len, scaling, rotary_dim, base, grad.device)
            grad_positions = _positions_gradient(grad, output, positions, theta, interleaved, inverse)
        return grad_x, grad_positions, *(None,) * 7

    return backward


rope_rotate_at_length_op.register_autograd(
    _length_backward(rope_rotate_at_length_op, rope_frequencies_at_length_op), setup_context=_rope_rotate_at_length_setup
)


@torch.library.custom_op("posenc::rope_rotate_at_lengths", mutates_args=())
def rope_rotate_at_lengths_op(
    x: Tensor, positions: Tensor, seq_len: Tensor, scaling: str, rotary_dim: int, base: float, interleaved: bool, inverse: bool, divide: bool
) -> Tensor:
    options = (scaling, rotary_dim, base, interleaved, inverse, divide)
    return _rows.rotate_at_lengths(namespace(x), x, positions, seq_len, lambda xr, pr, n: _rotated_at_length(xr, pr, n, *options))


@rope_rotate_at_lengths_op.register_fake
def _(x, positions, seq_len, scaling, rotary_dim, base, interleaved, inverse, divide):
    return x.new_empty(x.shape)


@torch.library.custom_op("posenc::rope_frequencies_at_lengths", mutates_args=())
def rope_frequencies_at_lengths_op(seq_len: Tensor, scaling: str, rotary_dim: int, base: float, device: torch.device) -> Tensor:
    tables = [named_frequency_table(scaling, rotary_dim, base, int(n))[0] for n in seq_len.flatten().tolist()]
    return torch.tensor(tables, dtype=torch.float64, device=device).reshape(*seq_len.shape, rotary_dim // 2)


@rope_frequencies_at_lengths_op.register_fake
def _(seq_len, scaling, rotary_dim, base, device):
    return torch.empty((*seq_len.shape, rotary_dim // 2), dtype=torch.float64, device=device)


def rope_frequencies_at_length(seq_len, *, scaling, rotary_dim, base, device=None):
    """``rope_frequencies``' table at lengths the compiled graph computes (a CPU tensor, 0-d or
    per row), read on the host when the op runs: the eager call's frequencies."""
    device = seq_len.device if device is None else device
    return rope_frequencies_at_lengths_op(seq_len, scaling_name(scaling), rotary_dim, base, device)


rope_rotate_at_lengths_op.register_autograd(
    _length_backward(rope_rotate_at_lengths_op, rope_frequencies_at_lengths_op), setup_context=_rope_rotate_at_length_setup
)


def rope_rotate_at_length(x, positions, seq_len, *, scaling, rotary_dim, base, layout, inverse, out=None):
    """``rope``'s rotation at the frequencies of ``seq_len``, read on the host when the op
    runs, as the eager call reads it, so the bits are the eager call's: an int that
    ``torch.compile`` may keep symbolic (a length read from a shape under dynamic shapes), or
    a CPU integer tensor the compiled graph computes (a tensor ``offset``, the largest of
    traced positions), 0-d or one length per row placed on ``x``'s token axes."""
    op = rope_rotate_at_lengths_op if isinstance(seq_len, Tensor) else rope_rotate_at_length_op
    rotated = op(x, positions, seq_len, scaling_name(scaling), rotary_dim, base, layout == "interleaved", inverse, inverse)
    return _written(rotated, out)


@torch.library.custom_op("posenc::rope_apply", mutates_args=())
def rope_apply_op(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool) -> Tensor:
    with torch.no_grad():
        return _apply_kernel(x, cos, sin, layout="interleaved" if interleaved else "half")


@_plans.planned(_signatures.ApplyRope)
def _apply_kernel(x, cos, sin, *, layout, out=None):
    """The kernel of ``rope_apply`` (a compiled graph's calls: each decode step's), planned as ``apply_rope``."""
    return _dispatch.call("rope_apply", x, cos, sin, layout=layout, out=out)


@rope_apply_op.register_fake
def _(x, cos, sin, interleaved):
    return x.new_empty(x.shape)  # contiguous, as the kernel's result (not x's strides)


def _rope_apply_setup(ctx, inputs, output):
    x, cos, sin, interleaved = inputs
    ctx.save_for_backward(x if ctx.needs_input_grad[1] or ctx.needs_input_grad[2] else None, cos, sin)
    ctx.interleaved = interleaved


def _rope_apply_backward(ctx, grad):
    x, cos, sin = ctx.saved_tensors
    grad_x = grad_cos = grad_sin = None
    if ctx.needs_input_grad[0]:
        grad_x = rope_apply_op(grad.contiguous(), cos, -sin, ctx.interleaved)
    if ctx.needs_input_grad[1] or ctx.needs_input_grad[2]:
        half = cos.shape[-1] // 2
        work = torch.promote_types(torch.promote_types(x.dtype, cos.dtype), torch.float32)
        a, b = _pairs(x.to(work), ctx.interleaved, half)
        g_a, g_b = _pairs(grad.to(work), ctx.interleaved, half)
        if ctx.needs_input_grad[1]:
            grad_cos = _first_of_pairs(g_a * a + g_b * b, ctx.interleaved, cos.shape).to(cos.dtype)
        if ctx.needs_input_grad[2]:
            grad_sin = _first_of_pairs(g_b * a - g_a * b, ctx.interleaved, sin.shape).to(sin.dtype)
    return grad_x, grad_cos, grad_sin, None


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
    ``i`` right by ``i``, so the anti-diagonals line up as columns. No diagonal (and no
    column) when either length is 0, as the per-distance vector has none then.
    """
    q_len, k_len = grad.shape[-2], grad.shape[-1]
    lead = grad.shape[:-2]
    if q_len == 0 or k_len == 0:
        return grad.new_zeros((*lead, 0))
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


@torch.library.custom_op("posenc::index_in_range", mutates_args=())
def index_in_range_op(index: Tensor, m: int) -> Tensor:
    """``index`` clamped into ``[0, m)`` on its device, recorded as in range (``_built``): the
    Toeplitz index of a graph ``torch.compile`` traced (``_built._traced``), which a CUDA
    launcher then takes unread (posenc's values, there by construction, are unchanged).
    Called directly, its result is the caller's: written in place after, it is checked
    again (``_built.version``; an inference tensor keeps no version to tell)."""
    return built_in_range(index.clamp(0, max(m - 1, 0)), m, in_graph=True)


@index_in_range_op.register_fake
def _(index, m):
    return torch.empty_like(index)


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


@torch.library.custom_op("posenc::toeplitz_gather_rows", mutates_args=())
def toeplitz_gather_rows_op(scores: Tensor, index: Tensor, k_len: int) -> Tensor:
    return _kernel("toeplitz_gather_rows", scores, index, k_len)


@torch.library.custom_op("posenc::toeplitz_scatter_rows", mutates_args=())
def toeplitz_scatter_rows_op(weights: Tensor, index: Tensor, m: int) -> Tensor:
    return _kernel("toeplitz_scatter_rows", weights, index, m)


_register_adjoint(toeplitz_gather_op, toeplitz_scatter_op)
_register_adjoint(toeplitz_scatter_op, toeplitz_gather_op)
_register_adjoint(toeplitz_gather_rows_op, toeplitz_scatter_rows_op)
_register_adjoint(toeplitz_scatter_rows_op, toeplitz_gather_rows_op)


@torch.library.custom_op("posenc::tupe_row_terms", mutates_args=())
def tupe_row_terms_op(p: Tensor, every: Tensor, uq: Tensor, uk: Tensor, k_len: int, scale: float) -> Tensor:
    return _kernel("tupe_row_terms", p, every, uq, uk, k_len, scale)


@tupe_row_terms_op.register_fake
def _(p, every, uq, uk, k_len, scale):
    heads = torch.broadcast_shapes(uq.shape[:-2], uk.shape[:-2])
    return p.new_empty((every.shape[0], *heads, every.shape[-1], k_len))


def _loop_gradients(loop, grad, differentiable):
    """The gradients of a reference's loop over the rows, ``loop(*differentiable)``, to
    ``differentiable``: autograd's over the loop run again, so a compiled graph's are the
    eager call's."""
    leaves = [t.detach().requires_grad_() for t in differentiable]
    if grad.shape[0] == 0:
        return tuple(t.new_zeros(t.shape) for t in leaves)
    with torch.enable_grad(), _autograd_recording():
        gradients = torch.autograd.grad(loop(*leaves), leaves, grad)
    return tuple(g.contiguous() for g in gradients)


def _row_terms_gradients(grad, p, every, uq, uk, k_len, scale):
    """The gradients of ``tupe_row_terms`` to ``p``, ``uq`` and ``uk`` (:func:`_loop_gradients`)."""
    return _loop_gradients(lambda p, uq, uk: tupe.row_terms(p, every, uq, uk, k_len, scale), grad, (p, uq, uk))


@contextlib.contextmanager
def _autograd_recording():
    """Autograd's dispatch keys on: a dispatch mode's handler (``FlopCounterMode``,
    opcheck's) runs an op with them excluded, where autograd would record nothing."""
    keys = [k for k in (torch._C.DispatchKey.ADInplaceOrView, torch._C.DispatchKey.AutogradFunctionality) if torch._C._dispatch_tls_is_dispatch_key_excluded(k)]
    for key in keys:
        torch._C._dispatch_tls_set_dispatch_key_excluded(key, False)
    try:
        yield
    finally:
        for key in keys:
            torch._C._dispatch_tls_set_dispatch_key_excluded(key, True)


# The backward as an op of its own, opaque to the graph that calls it (a loop traced there would
# be unrolled to the rows' count). Defined on the Library: not differentiable itself (a second
# derivative of the rows' terms is refused; tests/test_torch_ops.py opchecks it).
_LIBRARY_ROWS = torch.library.Library("posenc", "FRAGMENT")
_LIBRARY_ROWS.define("tupe_row_terms_backward(Tensor grad, Tensor p, Tensor every, Tensor uq, Tensor uk, SymInt k_len, float scale) -> (Tensor, Tensor, Tensor)")
_LIBRARY_ROWS.impl("tupe_row_terms_backward", _row_terms_gradients, "CompositeExplicitAutograd")


@torch.library.register_fake("posenc::tupe_row_terms_backward")
def _(grad, p, every, uq, uk, k_len, scale):
    return p.new_empty(p.shape), uq.new_empty(uq.shape), uk.new_empty(uk.shape)


def _row_terms_setup(ctx, inputs, output):
    p, every, uq, uk, ctx.k_len, ctx.scale = inputs
    ctx.save_for_backward(p, every, uq, uk)


def _row_terms_backward(ctx, grad):
    p, every, uq, uk = ctx.saved_tensors
    grad_p, grad_uq, grad_uk = torch.ops.posenc.tupe_row_terms_backward(grad.contiguous(), p, every, uq, uk, ctx.k_len, ctx.scale)
    return grad_p, None, grad_uq, grad_uk, None, None


tupe_row_terms_op.register_autograd(_row_terms_backward, setup_context=_row_terms_setup)


@torch.library.custom_op("posenc::tener_row_terms", mutates_args=())
def tener_row_terms_op(queries: Tensor, tables: Tensor) -> Tensor:
    return _kernel("tener_row_terms", queries, tables)


@tener_row_terms_op.register_fake
def _(queries, tables):
    return queries.new_empty((queries.shape[0], *queries.shape[1:-1], tables.shape[-2]))


def _tener_terms_gradients(grad, queries, tables):
    """The gradients of ``tener_row_terms`` to ``queries`` and ``tables`` (:func:`_loop_gradients`)."""
    return _loop_gradients(xl.row_terms, grad, (queries, tables))


_LIBRARY_ROWS.define("tener_row_terms_backward(Tensor grad, Tensor queries, Tensor tables) -> (Tensor, Tensor)")
_LIBRARY_ROWS.impl("tener_row_terms_backward", _tener_terms_gradients, "CompositeExplicitAutograd")


@torch.library.register_fake("posenc::tener_row_terms_backward")
def _(grad, queries, tables):
    return queries.new_empty(queries.shape), tables.new_empty(tables.shape)


def _tener_terms_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _tener_terms_backward(ctx, grad):
    return torch.ops.posenc.tener_row_terms_backward(grad.contiguous(), *ctx.saved_tensors)


tener_row_terms_op.register_autograd(_tener_terms_backward, setup_context=_tener_terms_setup)


# Registry entries (the ``<op>.torch_autograd`` kernels of ``posenc._kernels``): the
# references' signatures. While torch compiles, calls with ``out`` arrive here too: the
# result is copied into it.


def _written(result, out):
    if out is None:
        return result
    out.copy_(result)
    return out


def rope_rotate(x, positions, inv_freq, *, layout="half", inverse=False, scale=1.0, out=None):
    inv = [float(f) for f in inv_freq]  # host numbers (a tuple while torch compiles: no NumPy traced)
    return _written(rope_rotate_op(x, positions, inv, layout == "interleaved", bool(inverse), float(scale)), out)


def rope_apply(x, cos, sin, *, layout="half", out=None):
    interleaved = layout == "interleaved"
    if _fuses(x, cos, sin, out):
        return _written(_apply_in_kernel_arithmetic(x, cos, sin, interleaved), out)
    return _written(rope_apply_op(kept_for_gradient(x, out, (cos, sin)), cos, sin, interleaved), out)


def _fuses(x, cos, sin, out=None):
    """A traced call that ``_apply_in_kernel_arithmetic`` computes, bit for bit, as the kernel of
    the eager call would: tensors of one 16-bit or float32 dtype on the CPU, or on a GPU where
    the numba.cuda kernel runs (its 16-bit rows rotate in the CPU kernel's arithmetic, its
    float32 rows in float64 like the CPU's), no gradient recorded, ``out`` included (the custom
    op keeps its own backward; an eager call writing into a recorded ``out`` takes the
    reference)."""
    return (
        torch.compiler.is_compiling()
        and (x.device.type == "cpu" or (x.device.type == "cuda" and cos.device == x.device == sin.device and _cuda_kernels()))
        and x.dtype in _WORK
        and cos.dtype == x.dtype
        and sin.dtype == x.dtype
        and not (torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, cos, sin, out)))
    )


@torch.compiler.assume_constant_result
def _cuda_kernels():
    """Whether the numba.cuda kernels run here (what an eager CUDA call of ``apply_rope`` takes)."""
    from .._kernels import _arrays

    return _arrays.numba_cuda()


# The dtype each row dtype's rotation runs in (``rope_cpu``, ``rope_cuda``): the products of
# two such values are exact in it, so ``a*c - b*s`` is rounded once there whether or not a
# compiler fuses a multiply-add, and once more on the way back to the row's dtype. (float64
# rows, whose products are not exact, keep the custom op: a fused multiply-add would change
# their last bit.)
_WORK = {torch.float32: torch.float64, torch.float16: torch.float32, torch.bfloat16: torch.float32}


def _apply_in_kernel_arithmetic(x, cos, sin, interleaved):
    """``rope_apply`` as torch operations that inductor fuses into its neighbours' loops.

    The kernels' arithmetic (``_kernels/_pairs.py``, ``rope_cuda._pair``), not a second
    definition: each pair ``(a, b)`` becomes ``(a*c - b*s, b*c + a*s)`` in the row's work
    dtype, rounded once to the row's dtype. 16-bit rows add the kernel's second term,
    ``fma(a, cl, -(b*sl))``, whose ``cl = sl = 0`` for 16-bit ``cos``/``sin`` (their heads
    hold them whole): a signed zero, ``a*0 - b*0`` with ``a``, ``b`` clamped to finite
    values, that decides the sign of a zero result as the kernel's does. A compiled decode
    step then costs what the formula it replaces costs, where the opaque custom op costs a
    dispatch per call (docs/benchmarks.md).
    """
    work = _WORK[x.dtype]
    half = cos.shape[-1] // 2
    a, b = (t.to(work) for t in _pairs(x, interleaved, half))
    c, s = (_pairs(t, interleaved, half)[0].to(work) for t in (cos, sin))
    ra, rb = a * c - b * s, b * c + a * s
    if work == torch.float32:
        bound = torch.finfo(torch.float32).max
        af, bf = a.clamp(-bound, bound), b.clamp(-bound, bound)
        ra, rb = ra + (af * 0.0 - bf * 0.0), rb + (bf * 0.0 + af * 0.0)
    ra, rb = ra.to(x.dtype), rb.to(x.dtype)
    rotated = torch.stack([ra, rb], dim=-1).flatten(-2) if interleaved else torch.cat([ra, rb], dim=-1)
    rest = x[..., 2 * half :]
    return torch.cat([rotated, rest], dim=-1) if rest.shape[-1] else rotated


def _rope_cos_sin(positions, frequencies, dtype):
    """``HFRotaryEmbedding``'s tables of integer ``positions`` for frequencies fixed in advance
    (named by ``_rows.frequencies_name``), ``cos`` and ``sin`` stacked on axis -2, as one opaque
    op of a compiled graph (``_rows.stacked_tables``, one gather of the kept rows). A name, not
    a list of floats: the dispatcher converts it for free, and it cannot turn symbolic."""
    from ._rows import named_frequencies, stacked_tables

    return stacked_tables(*named_frequencies(frequencies), dtype, positions)


# Defined on a torch.library.Library rather than with custom_op: nothing in it is differentiable
# (integer positions), and a compiled decode step calls it once, where custom_op's Python
# autograd wrapper would double the cost of the call (tests/test_torch_ops.py opchecks it).
_LIBRARY = torch.library.Library("posenc", "FRAGMENT")
_LIBRARY.define("rope_cos_sin(Tensor positions, str frequencies, ScalarType dtype) -> Tensor")
_LIBRARY.impl("rope_cos_sin", _rope_cos_sin, "CompositeExplicitAutograd")


@torch.library.register_fake("posenc::rope_cos_sin")
def _(positions, frequencies, dtype):
    from ._rows import named_frequencies

    return positions.new_empty((*positions.shape, 2, 2 * len(named_frequencies(frequencies)[0])), dtype=dtype)


rope_cos_sin_op = torch.ops.posenc.rope_cos_sin.default


def _rope_cos_sin_rows(positions, rows, frequencies, dtype):
    """``rope_cos_sin`` of integer ``positions`` gathered from ``rows`` (``rows[p]`` is
    position ``p``'s ``[cos, sin]``) where every position has its row; otherwise the op
    ``posenc::rope_cos_sin``. Inductor decomposes it (``_rows_in_graph``)."""
    if positions.numel():
        low, high = (int(v) for v in torch.aminmax(positions))
        if low >= 0 and high < rows.shape[0]:
            return rows[positions]
    return rope_cos_sin_op(positions, frequencies, dtype)


_LIBRARY.define("rope_cos_sin_rows(Tensor positions, Tensor rows, str frequencies, ScalarType dtype) -> Tensor")
_LIBRARY.impl("rope_cos_sin_rows", _rope_cos_sin_rows, "CompositeExplicitAutograd")
rope_cos_sin_rows_op = torch.ops.posenc.rope_cos_sin_rows.default


@torch.library.register_fake("posenc::rope_cos_sin_rows")
def _(positions, rows, frequencies, dtype):
    return rows.new_empty((*positions.shape, *rows.shape[1:]))


def _rows_in_graph(positions, rows, frequencies, dtype):
    """``rope_cos_sin_rows`` in an inductor graph. One position (a decode step): the gather,
    fused into the loops that read it, or the op where ``torch.cond`` finds the position
    without its row. More positions, or symbolic shapes: the op, whose cost is small beside
    a prefill's, and where inductor 2.13 trips on a ``torch.cond`` (a prefill recompiled
    under dynamic shapes hands it a specialized size it fails to match; symbolic shapes
    leave an undefined size in its code). A decomposition traced below Dynamo: Dynamo,
    tracing a ``torch.cond`` itself, loses the attributes set afterwards on objects built
    before it, as a transformers cache."""
    def kept(positions, rows):
        return rows[positions]

    def afresh(positions, rows):
        return rope_cos_sin_op(positions, frequencies, dtype)

    layout = [n for t in (positions, rows) for n in (*t.shape, *t.stride())]
    if positions.numel() != 1 or any(isinstance(n, torch.SymInt) for n in layout):  # see the docstring
        return afresh(positions, rows)
    low, high = torch.aminmax(positions)
    return torch.cond((low >= 0) & (high < rows.shape[0]), kept, afresh, (positions, rows))


@torch.compiler.assume_constant_result
def decomposed_by_inductor():
    """Register ``_rows_in_graph`` in inductor's decompositions (once, called while Dynamo
    traces, which runs it as it is: a constant of the graph). Importing inductor costs a
    second, so this waits for a compile that needs it."""
    from torch._inductor import decomposition

    if rope_cos_sin_rows_op not in decomposition.decompositions:
        decomposition.decompositions[rope_cos_sin_rows_op] = _rows_in_graph
        decomposition.fast_random_decomps.cache_clear()  # the table inductor reads, built once
    return True


def toeplitz_expand(vec, q_len, k_len, *, out=None):
    return _written(toeplitz_expand_op(vec, q_len, k_len), out)


def toeplitz_gather(scores, index, k_len, *, out=None):
    return _written(toeplitz_gather_op(scores, index, k_len), out)


def toeplitz_scatter(weights, index, m, *, out=None):
    return _written(toeplitz_scatter_op(weights, index, m), out)


def toeplitz_gather_rows(scores, index, k_len, *, out=None):
    return _written(toeplitz_gather_rows_op(scores, index, k_len), out)


def toeplitz_scatter_rows(weights, index, m, *, out=None):
    return _written(toeplitz_scatter_rows_op(weights, index, m), out)


def tupe_row_terms(p, every, uq, uk, k_len, scale):
    return tupe_row_terms_op(p, every, uq, uk, k_len, scale)


def tener_row_terms(queries, tables):
    return tener_row_terms_op(queries, tables)


# Bind the registry entries that load from this module now: ``torch.compile`` cannot trace the
# import a first ``Kernel.load()`` would do (a ``torch_autograd`` kernel's ``accepts`` imports this
# module, through ``_arrays.to_custom_op``, before it routes a call here while torch compiles).
for _entry in _dispatch.kernels():
    if _entry.loader.startswith(__name__ + ":"):
        _entry.load()
