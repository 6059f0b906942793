"""JAX CPU arrays through the Numba CPU kernels, eagerly and under ``jit``, ``grad`` and ``vmap``.

Each op calls the very function NumPy arrays get (the op's ``numba_cpu`` registry entry),
so a JAX CPU array and a NumPy array with the same values give the same bits:

* **eagerly** (concrete arrays): the kernel reads the JAX buffers through NumPy views
  (``np.asarray``, no copy) and writes a new 64-byte aligned NumPy buffer, which becomes
  the JAX result through DLPack without a copy (bfloat16, which DLPack lacks, travels as
  its ``uint16`` bits and is bit-cast back: one copy);
* **traced** (``jax.jit``, ``jax.grad``, ``jax.vmap``, eager or not): a host call into the
  same kernel (``jax_ffi``: an XLA FFI call that hands the kernel XLA's own buffers, where
  ``jax.pure_callback`` would copy both ways), the result's shape and dtype declared up front, inside a
  ``jax.custom_vjp`` whose backward is the kernel's adjoint, itself such a host call:
  the inverse rotation (``rope_rotate``, and ``rope_apply`` with ``-sin``), the scatter for
  ``toeplitz_gather`` and the gather for ``toeplitz_scatter``. The gradients of float
  ``positions`` and of ``cos``/``sin`` are ``jax.numpy`` formulas (those of
  ``posenc.torch._ops``, which the reference's gradients equal): ``g_b*y_a - g_a*y_b``
  times the frequency, and ``g_a*a + g_b*b`` / ``g_b*a - g_a*b`` at the first copy of each
  angle (the second copy is not read: its gradient is 0). ``toeplitz_expand``'s adjoint
  sums the gradient along each diagonal, in ``jax.numpy``.

Under ``vmap`` a host call receives every argument with the batch axes in front (size 1
where an argument is not batched); ``_batched``
lines the per-position arguments up with ``x`` again, so the whole batch is one kernel
call. Values only known when the call runs (a traced ``offset`` in a Toeplitz index) meet
the launchers' own checks inside the host call, which raise there: nothing reaches a
kernel unchecked.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from .. import _dispatch
from .jax import tracer
from . import jax_native
from .jax_ffi import host_call
from .rope import guard_apply, guard_rotate
from .toeplitz import guard_expand, guard_gather, guard_scatter

# JAX adopts a NumPy buffer through DLPack without a copy only when it is 64-byte aligned.
_ALIGN = 64


@functools.lru_cache(maxsize=None)
def _numpy_kernel(op):
    """The function NumPy arrays get for ``op``: its ``numba_cpu`` registry entry."""
    (kernel,) = (k for k in _dispatch.kernels(op) if k.name == f"{op}.numba_cpu")
    return kernel.load()


# ---------------------------------------------------------------- eager: the arrays' memory


def _view(a):
    """A read-only NumPy view of a concrete JAX CPU array (no copy)."""
    return np.asarray(a)


def _empty(shape, dtype):
    """An uninitialised 64-byte aligned NumPy array."""
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    raw = np.empty(nbytes + _ALIGN, np.uint8)
    start = -raw.ctypes.data % _ALIGN
    return raw[start : start + nbytes].view(dtype).reshape(shape)


def _adopt(result, like):
    """NumPy ``result`` as a JAX array on ``like``'s device, without a copy where DLPack allows."""
    device = next(iter(like.devices()))
    if result.dtype.name == "bfloat16":
        return jax.lax.bitcast_convert_type(jax.dlpack.from_dlpack(result.view(np.uint16), device=device), jnp.bfloat16)
    return jax.dlpack.from_dlpack(result, device=device)


def _eager(op, values, shape, *args, **kwargs):
    """``op``'s NumPy kernel on NumPy views of ``args``, into a new buffer of ``shape`` adopted by JAX."""
    out = _empty(shape, values.dtype)
    _numpy_kernel(op)(*(_view(a) if isinstance(a, jax.Array) else a for a in args), out=out, **kwargs)
    return _adopt(out, values)


def _traced(*arrays):
    return any(tracer(a) for a in arrays)


# ---------------------------------------------------------------- traced: host calls


def _batched(x, ndim, *per_position):
    """Undo ``vmap``'s layout inside a host call: ``x`` has ``x.ndim - ndim`` batch axes in front,
    and so does each ``(array, width)`` of ``per_position``, whose unbatched form broadcasts
    against ``x``'s leading axes (``width`` 0) or its leading axes plus ``width`` channels.

    Returns ``x`` broadcast over the whole batch, and each array with ones inserted after
    its batch axes, so it broadcasts against ``x`` the way its unbatched form did.
    """
    lead = x.ndim - ndim
    if lead == 0:
        return (x, *(a for a, _ in per_position))
    batch = np.broadcast_shapes(x.shape[:lead], *(a.shape[:lead] for a, _ in per_position))
    x = np.broadcast_to(x, batch + x.shape[lead:])
    target = ndim - 1
    aligned = []
    for a, width in per_position:
        missing = target + (1 if width else 0) - (a.ndim - lead)
        aligned.append(a.reshape(a.shape[:lead] + (1,) * missing + a.shape[lead:]))
    return (x, *aligned)


def _sum_to(a, shape):
    """``a`` summed over the axes broadcasting added to ``shape`` (a gradient back to its argument's shape)."""
    extra = a.ndim - len(shape)
    axes = tuple(range(extra)) + tuple(extra + i for i, n in enumerate(shape) if n == 1 and a.shape[extra + i] != 1)
    return jnp.reshape(jnp.sum(a, axis=axes), shape) if axes else a


def _pairs(t, layout, half):
    """The two members ``(a, b)`` of the first ``half`` rotated pairs of ``t``."""
    if layout == "interleaved":
        return t[..., 0 : 2 * half : 2], t[..., 1 : 2 * half : 2]
    return t[..., :half], t[..., half : 2 * half]


def _first_of_pairs(values, layout, shape):
    """A ``cos``/``sin`` table of ``shape`` holding ``values`` at each pair's first copy, 0 at its second."""
    zeros = jnp.zeros_like(values)
    if layout == "interleaved":
        table = jnp.reshape(jnp.stack([values, zeros], axis=-1), (*values.shape[:-1], 2 * values.shape[-1]))
    else:
        table = jnp.concatenate([values, zeros], axis=-1)
    return _sum_to(table, shape)


def _is_integer(a):
    return jnp.issubdtype(a.dtype, jnp.integer)


@functools.lru_cache(maxsize=256)
def _rotation(inv_freq, layout, inverse, scale):
    """``rope_rotate`` with these host options, as a ``custom_vjp`` function of ``(x, positions)``."""
    freqs = np.asarray(inv_freq, dtype=np.float64)

    @jax.custom_vjp
    def rotate(x, positions):
        ndim = x.ndim

        def host(xv, pv, *, out):
            xv, pv = _batched(xv, ndim, (pv, 0))
            _numpy_kernel("rope_rotate")(xv, pv, freqs, layout=layout, inverse=inverse, scale=scale, out=out)

        key = ("rope_rotate", inv_freq, layout, inverse, scale, ndim)
        native = jax_native.rotation(x, positions, freqs, layout, inverse, scale)
        return host_call(key, host, x.shape, x.dtype, x, positions, native=native)

    def forward(x, positions):
        y = rotate(x, positions)
        return y, (positions, None if _is_integer(positions) else y)

    def backward(saved, g):
        positions, y = saved
        grad_x = _rotation(inv_freq, layout, not inverse, scale)(g, positions)
        if y is None:
            return grad_x, None
        # d angle / d position is the frequency; d (y_a, y_b) / d angle is (-y_b, y_a).
        work = jnp.promote_types(jnp.promote_types(y.dtype, positions.dtype), jnp.float32)
        y_a, y_b = _pairs(y.astype(work), layout, freqs.size)
        g_a, g_b = _pairs(g.astype(work), layout, freqs.size)
        per_token = jnp.sum((g_b * y_a - g_a * y_b) * jnp.asarray(freqs, dtype=work), axis=-1)
        per_token = -per_token if inverse else per_token
        return grad_x, _sum_to(per_token, positions.shape).astype(positions.dtype)

    rotate.defvjp(forward, backward)
    return rotate


@functools.lru_cache(maxsize=None)
def _cos_sin_rotation(layout):
    """``rope_apply`` in ``layout``, as a ``custom_vjp`` function of ``(x, cos, sin)``."""

    @jax.custom_vjp
    def apply(x, cos, sin):
        ndim, width = x.ndim, cos.shape[-1]

        def host(xv, cv, sv, *, out):
            xv, cv, sv = _batched(xv, ndim, (cv, width), (sv, width))
            _numpy_kernel("rope_apply")(xv, cv, sv, layout=layout, out=out)

        return host_call(("rope_apply", layout, ndim, width), host, x.shape, x.dtype, x, cos, sin)

    def forward(x, cos, sin):
        return apply(x, cos, sin), (x, cos, sin)

    def backward(saved, g):
        x, cos, sin = saved
        half = cos.shape[-1] // 2
        work = jnp.promote_types(jnp.promote_types(x.dtype, cos.dtype), jnp.float32)
        a, b = _pairs(x.astype(work), layout, half)
        g_a, g_b = _pairs(g.astype(work), layout, half)
        grad_cos = _first_of_pairs(g_a * a + g_b * b, layout, cos.shape).astype(cos.dtype)
        grad_sin = _first_of_pairs(g_b * a - g_a * b, layout, sin.shape).astype(sin.dtype)
        return apply(g, cos, -sin), grad_cos, grad_sin

    apply.defvjp(forward, backward)
    return apply


def _diagonal_sums(g):
    """``out[..., t] = sum over i - j + k_len - 1 == t of g[..., i, j]``, ``toeplitz_expand``'s adjoint.

    Reversing the key axis turns diagonal ``t`` into anti-diagonal ``i + j'``; padding each
    row with ``q_len`` zeros and re-reading the flat buffer with rows one longer shifts row
    ``i`` right by ``i``, so the anti-diagonals line up as columns.
    """
    q_len, k_len = g.shape[-2], g.shape[-1]
    lead = g.shape[:-2]
    padded = jnp.pad(jnp.flip(g, axis=-1), [(0, 0)] * len(lead) + [(0, 0), (0, q_len)])
    flat = jnp.reshape(padded, (*lead, q_len * (k_len + q_len)))[..., : q_len * (k_len + q_len - 1)]
    return jnp.sum(jnp.reshape(flat, (*lead, q_len, k_len + q_len - 1)), axis=-2)


@functools.lru_cache(maxsize=256)
def _expansion(q_len, k_len):
    """``toeplitz_expand`` to ``[..., q_len, k_len]``, as a ``custom_vjp`` function of ``vec``."""

    @jax.custom_vjp
    def expand(vec):
        def host(v, *, out):
            _numpy_kernel("toeplitz_expand")(v, q_len, k_len, out=out)

        return host_call(("toeplitz_expand", q_len, k_len), host, (*vec.shape[:-1], q_len, k_len), vec.dtype, vec)

    def forward(vec):
        return expand(vec), None

    def backward(_, g):
        if q_len == 0 or k_len == 0:  # an empty bias: every entry of vec (if any) unread
            return (jnp.zeros((*g.shape[:-2], max(q_len + k_len - 1, 0)), g.dtype),)
        return (_diagonal_sums(g),)

    expand.defvjp(forward, backward)
    return expand


def _per_index(kernel, values, index, n, out):
    """``kernel(values, index, n)`` into ``out`` in a host call under ``vmap``: one call for the
    batch, or one per row of a batched ``index`` (a 1-D argument of the kernels)."""
    lead = index.ndim - 1
    if all(d == 1 for d in index.shape[:-1]):
        kernel(np.broadcast_to(values, out.shape[:-1] + values.shape[-1:]), index.reshape(index.shape[-1]), n, out=out)
        return
    batch = out.shape[:lead]
    values = np.broadcast_to(values, batch + values.shape[lead:])
    index = np.broadcast_to(index, batch + index.shape[-1:])
    for row in np.ndindex(*batch):
        kernel(values[row], index[row], n, out=out[row])


def _indexed(op, adjoint_op):
    """``toeplitz_gather``/``toeplitz_scatter`` as ``custom_vjp`` functions of ``(values, index)``,
    given ``n`` (``k_len`` / ``m``); the backward is the other op."""

    @functools.lru_cache(maxsize=256)
    def of(n):
        @jax.custom_vjp
        def fn(values, index):
            def host(vv, iv, *, out):
                _per_index(_numpy_kernel(op), vv, iv, n, out)

            return host_call((op, n), host, (*values.shape[:-1], n), values.dtype, values, index)

        def forward(values, index):
            return fn(values, index), (index, values.shape[-1])

        def backward(saved, g):
            index, width = saved
            return _ops[adjoint_op](width)(g, index), None

        fn.defvjp(forward, backward)
        return fn

    return of


_ops = {"toeplitz_gather": _indexed("toeplitz_gather", "toeplitz_scatter"), "toeplitz_scatter": _indexed("toeplitz_scatter", "toeplitz_gather")}


# ---------------------------------------------------------------- registry entries (the references' signatures)

# Each runs the launcher's shape checks first (at trace time under ``jit``: shapes are static).


def rope_rotate(x, positions, inv_freq, *, layout="half", inverse=False, scale=1.0, out=None):
    freqs = guard_rotate(x, positions, inv_freq, None)
    if _traced(x, positions):
        return _rotation(tuple(freqs.tolist()), layout, bool(inverse), float(scale))(x, positions)
    return _eager("rope_rotate", x, x.shape, x, positions, freqs, layout=layout, inverse=inverse, scale=scale)


def rope_apply(x, cos, sin, *, layout="half", out=None):
    guard_apply(x, cos, sin, None)
    if _traced(x, cos, sin):
        return _cos_sin_rotation(layout)(x, cos, sin)
    return _eager("rope_apply", x, x.shape, x, cos, sin, layout=layout)


def toeplitz_expand(vec, q_len, k_len, *, out=None):
    shape = guard_expand(vec, q_len, k_len, None)
    q_len, k_len = shape[-2:]
    if _traced(vec):
        return _expansion(q_len, k_len)(vec)
    return _eager("toeplitz_expand", vec, shape, vec, q_len, k_len)


def toeplitz_gather(scores, index, k_len, *, out=None):
    shape = guard_gather(scores, index, k_len, None)
    if _traced(scores, index):
        return _ops["toeplitz_gather"](shape[-1])(scores, index)
    return _eager("toeplitz_gather", scores, shape, scores, index, shape[-1])


def toeplitz_scatter(weights, index, m, *, out=None):
    shape = guard_scatter(weights, index, m, None)
    if _traced(weights, index):
        return _ops["toeplitz_scatter"](shape[-1])(weights, index)
    return _eager("toeplitz_scatter", weights, shape, weights, index, shape[-1])
