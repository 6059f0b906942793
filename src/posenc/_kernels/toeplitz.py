"""Registrations of the Toeplitz bias kernels (ops ``toeplitz_expand/gather/scatter``), and their launchers' guard.

In the order the registry tries them:

* ``<op>.torch_autograd``: torch tensors that autograd records, and every torch tensor
  while ``torch.compile`` traces (``_arrays.to_custom_op``): ``posenc.torch._ops``'s custom
  ops (backward: the diagonal sums for expand; gather and scatter each other's adjoint);
* ``<op>.numba_cpu``: NumPy arrays and torch CPU tensors, in ``toeplitz_cpu``;
* ``<op>.numba_cuda``: CuPy arrays, torch CUDA tensors and numba device arrays, in
  ``toeplitz_cuda``.

``accepts`` looks at types and dtypes only (no numba, no framework import). The ``guard_*`` functions
are the checks every launcher runs before a kernel indexes anything: shapes, lengths,
``out`` and the range of ``index`` (the public functions validated the arguments; these
keep a direct ``_dispatch.call`` from reading or writing out of bounds). Each returns the
result's shape.
"""

from __future__ import annotations

from .. import _validate as check
from .._dispatch import register
from ..relative import _toeplitz  # noqa: F401  (registers the references)
from . import _arrays

# ---------------------------------------------------------------- accepts


def _accepts(values, index=None, out=None, *, gpu):
    lib = _arrays.library(values)
    if (
        lib is None
        or _arrays.storage(values) is None
        or not (_arrays.on_gpu(values) if gpu else _arrays.on_host(values))
        or not (_arrays.numba_cuda() if gpu else _arrays.numba_cpu())
    ):
        return False
    # CUDA kernels index with signed integers only.
    if index is not None and (_arrays.library(index) != lib or _arrays.dtype_name(index.dtype) not in (_arrays.SIGNED if gpu else _arrays.INTEGERS)):
        return False
    # CUDA kernels address memory from each array's first element: whole, non-negative strides.
    if gpu and not all(_arrays.forward_strides(a) for a in (values, index, out) if a is not None):
        return False
    # An out the kernel cannot write as it is (another dtype, a byte-swapped one): the reference's.
    return out is None or (
        _arrays.library(out) == lib and out.dtype == values.dtype and (_arrays.on_gpu(out) if gpu else _arrays.on_host(out))
    )


def _expand(gpu):
    return lambda a: _accepts(a["vec"], out=a["out"], gpu=gpu)


def _gather(gpu):
    return lambda a: _accepts(a["scores"], a["index"], a["out"], gpu=gpu)


def _scatter(gpu):
    return lambda a: _accepts(a["weights"], a["index"], a["out"], gpu=gpu)


# ---------------------------------------------------------------- specialisations and launcher guard

# Expand and gather copy bits: one kernel per element size. Scatter sums: one per dtype.
_COPIES = {"uint16": {"float16", "bfloat16"}, "uint32": {"float32"}, "uint64": {"float64"}}
SPECIALISATIONS = [(op, bits) for op in ("expand", "gather") for bits in _COPIES] + [("scatter", d) for d in _arrays.STORAGE]


def serves(key):
    """The dtypes a Toeplitz kernel handles."""
    return _COPIES.get(key[1], {key[1]})


def kernel_key(op, a):
    """The specialisation of ``op`` for values ``a``: by element size for the copies, by dtype for scatter."""
    return op, (f"uint{8 * a.dtype.itemsize}" if op != "scatter" else _arrays.dtype_name(a.dtype))


def _fail(message):
    raise ValueError(f"{message} (kernel launcher check)")


def _length(name, value):
    return check.integer(name, value, minimum=0)


def _distances(q_len, k_len):
    return max(q_len + k_len - 1, 0)


def _distances_match(n, q_len, k_len):
    """A per-distance vector has ``q_len + k_len - 1`` entries; an empty bias may also have none."""
    return n == _distances(q_len, k_len) or (n == 0 and q_len * k_len == 0)


def _ndim(name, a, minimum):
    if a.ndim < minimum:
        _fail(f"{name} must have at least {minimum} dimension(s), got shape {tuple(a.shape)}")


def _index(index, q_len, k_len):
    if _arrays.dtype_name(index.dtype) not in _arrays.INTEGERS:
        raise TypeError(f"index must have an integer dtype, got {index.dtype} (kernel launcher check)")
    if index.ndim != 1 or not _distances_match(int(index.shape[0]), q_len, k_len):
        _fail(f"index must have shape ({_distances(q_len, k_len)},) (q_len + k_len - 1 distances), got {tuple(index.shape)}")


def guard_index_values(index, m):
    """The values of a non-empty ``index`` must lie in ``[0, m)`` (a small reduction over ``index``)."""
    low, high = _arrays.bounds(index)
    if low < 0 or high >= m:
        _fail(f"index values must lie in [0, {m}) (m = {m}), got values in [{low}, {high}]")


def _out(out, like, shape):
    if out is None:
        return
    if _arrays.library(out) != _arrays.library(like) or getattr(out, "device", None) != getattr(like, "device", None):
        raise TypeError(f"out must be an array of the same kind and device as the input ({type(like).__name__}), got {type(out).__name__}")
    if tuple(out.shape) != tuple(shape):
        _fail(f"out must have shape {tuple(shape)}, got {tuple(out.shape)}")
    if out.dtype != like.dtype:
        _fail(f"out must have dtype {like.dtype}, got {out.dtype}")
    if not _arrays.writeable(out) or not _arrays.writes_each_element_once(out):
        _fail("out must be a writeable array that holds each element once")


def guard_expand(vec, q_len, k_len, out):
    q_len, k_len = _length("q_len", q_len), _length("k_len", k_len)
    _ndim("vec", vec, 1)
    vec_shape = tuple(vec.shape)  # the CUDA simulator's shapes reject negative indices
    if not _distances_match(vec_shape[-1], q_len, k_len):
        _fail(f"vec must have {_distances(q_len, k_len)} entries (q_len + k_len - 1) on its last axis, got shape {vec_shape}")
    shape = (*vec_shape[:-1], q_len, k_len)
    _out(out, vec, shape)
    return shape


def _guard_indexed(name, values, index, k_len, width, out):
    """``values [..., q_len, *]`` read or written through a per-distance ``index`` of
    ``q_len + k_len - 1`` entries (``k_len=None``: ``values``' last axis), into a result
    ``[..., q_len, width]``."""
    _ndim(name, values, 2)
    shape = tuple(values.shape)
    _index(index, shape[-2], shape[-1] if k_len is None else k_len)
    result = (*shape[:-1], width)
    _out(out, values, result)
    return result


def guard_gather(scores, index, k_len, out):
    k_len = _length("k_len", k_len)
    return _guard_indexed("scores", scores, index, k_len, k_len, out)


def guard_scatter(weights, index, m, out):
    return _guard_indexed("weights", weights, index, None, _length("m", m), out)


# ---------------------------------------------------------------- registry

for _op, _accepts_of, _values in (("expand", _expand, "vec"), ("gather", _gather, "scores"), ("scatter", _scatter, "weights")):
    register(
        f"toeplitz_{_op}",
        f"toeplitz_{_op}.torch_autograd",
        accepts=lambda a, name=_values: _arrays.to_custom_op([a[name]]),
        loader=f"posenc.torch._ops:toeplitz_{_op}",
    )
    register(f"toeplitz_{_op}", f"toeplitz_{_op}.numba_cpu", accepts=_accepts_of(False), loader=f"posenc._kernels.toeplitz_cpu:toeplitz_{_op}")
    register(f"toeplitz_{_op}", f"toeplitz_{_op}.numba_cuda", accepts=_accepts_of(True), loader=f"posenc._kernels.toeplitz_cuda:toeplitz_{_op}")

# One offset per batch row while torch compiles: one opaque op for every row, whose count stays
# symbolic (the references loop over the rows, each row's kernel above).
for _op, _values in (("gather_rows", "scores"), ("scatter_rows", "weights")):
    register(
        f"toeplitz_{_op}",
        f"toeplitz_{_op}.torch_autograd",
        accepts=lambda a, name=_values: _arrays.to_custom_op([a[name]]),
        loader=f"posenc.torch._ops:toeplitz_{_op}",
    )
