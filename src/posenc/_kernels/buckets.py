"""Registration of the T5 bucket kernel (op ``t5_buckets``), its accepts and its launcher's guard.

* ``t5_buckets.numba_cuda``: 1-D int32/int64 CuPy arrays, torch CUDA tensors and numba
  device arrays, in ``buckets_cuda``. A T5 bias on a GPU buckets its per-distance vector
  here in one launch, where the Array-API reference takes about thirty small operations (a
  comparison, a conversion and a sum for each of T5's 7 boundaries of the log-spaced
  buckets; a ``searchsorted`` from ``SEARCHED_STARTS`` boundaries on), each a launch of its
  own in torch and CuPy.

Other arrays keep the reference: on the CPU the bias buckets each distance once (``O(q +
k)``, small beside the expansion) and a decode step's plan keeps the buckets
(``relative/_decode``); JAX fuses the reference's operations into one computation;
``torch.compile`` traces the reference.
"""

from __future__ import annotations

from .. import _validate as check
from .._dispatch import register
from .._xp import torch_compiling
from ..relative.buckets import t5_bucket_options
from . import _arrays

DISTANCES = ("int32", "int64")  # the dtypes of distances (and buckets) the kernel reads
SPECIALISATIONS = [(name,) for name in DISTANCES]


def serves(key):
    """The table dtypes a bucket kernel serves: all (it reads distances, not the table)."""
    return {"float16", "bfloat16", "float32", "float64"}


def _accepts(a):
    rel = a["rel"]
    return (
        _arrays.library(rel) in ("torch", "cupy", "numba")
        and not torch_compiling()
        and _arrays.on_gpu(rel)
        and rel.ndim == 1
        and _arrays.dtype_name(rel.dtype) in DISTANCES
        and _arrays.forward_strides(rel)
        and _arrays.numba_cuda()
    )


def guard(rel, num_buckets, max_distance, bidirectional):
    """The checks before the kernel reads ``rel``: a 1-D int32/int64 GPU array with a whole,
    non-negative stride (the kernel addresses it from its first element), T5's options
    (``t5_bucket_options``). Returns the validated options."""
    if not _arrays.on_gpu(rel):
        raise TypeError(f"rel must be a GPU array (CuPy, torch CUDA, numba device), got {type(rel).__module__}.{type(rel).__name__} (kernel launcher check)")
    name = _arrays.dtype_name(rel.dtype)
    if name not in DISTANCES:
        raise TypeError(f"rel must be int32 or int64, got {name} (kernel launcher check)")
    check.ndim("rel", rel, exactly=1)
    if not _arrays.forward_strides(rel):
        raise ValueError(f"rel has stride {_arrays.element_strides(rel)} (elements): the CUDA kernel reads whole, non-negative strides (kernel launcher check)")
    return t5_bucket_options(num_buckets, max_distance, bidirectional)


register("t5_buckets", "t5_buckets.numba_cuda", accepts=_accepts, loader="posenc._kernels.buckets_cuda:t5_buckets")
