"""Registrations of the Toeplitz bias kernels (ops ``toeplitz_expand/gather/scatter``).

Numba CPU kernels take NumPy arrays and torch CPU tensors; numba.cuda kernels take CuPy
arrays, torch CUDA tensors and numba device arrays. ``accepts`` looks at types and dtypes
only (no numba, no framework import); the launchers check shapes and index ranges.
Tensors that autograd is recording are left to the (differentiable) reference.
"""

from __future__ import annotations

import numpy as np

from .._dispatch import register
from ..relative import _toeplitz  # noqa: F401  (registers the references)
from . import _available
from ._bias_arrays import FLOAT_NAMES, dtype_name, kind
from ._host import tracks_gradient

_HOST = ("numpy", "torch-cpu")
_DEVICE = ("cupy", "torch-cuda", "numba-cuda")
_SIGNED = ("int8", "int16", "int32", "int64")
_UNSIGNED = ("uint8", "uint16", "uint32", "uint64")


def _floating(a) -> bool:
    if isinstance(a, np.ndarray):
        return a.dtype.isnative and a.dtype in (np.float16, np.float32, np.float64)
    return dtype_name(a.dtype) in FLOAT_NAMES


def _arrays_ok(kinds, values, index=None, out=None, index_dtypes=_SIGNED + _UNSIGNED) -> bool:
    which = kind(values)
    if which not in kinds or not _floating(values) or tracks_gradient(values):
        return False
    if which == "numba-cuda" and not _available.numba_cuda():
        return False
    if index is not None and (kind(index) != which or dtype_name(index.dtype) not in index_dtypes):
        return False
    return out is None or (kind(out) == which and not tracks_gradient(out))


def _host_expand(vec, q_len, k_len, *, out=None):
    return _arrays_ok(_HOST, vec, out=out)


def _host_gather(scores, index, k_len, *, out=None):
    return _arrays_ok(_HOST, scores, index, out)


def _host_scatter(weights, index, m, *, out=None):
    return _arrays_ok(_HOST, weights, index, out)


def _device_expand(vec, q_len, k_len, *, out=None):
    return _arrays_ok(_DEVICE, vec, out=out)


def _device_gather(scores, index, k_len, *, out=None):
    return _arrays_ok(_DEVICE, scores, index, out, _SIGNED)


def _device_scatter(weights, index, m, *, out=None):
    return _arrays_ok(_DEVICE, weights, index, out, _SIGNED)


# --- samples: argument sets for tests/test_kernels_match_reference.py ---------------------

_NUMPY_DTYPES = (np.float16, np.float32, np.float64)
# (leading batch shape, q_len, k_len): batch axes, one query (decoding), one key.
_SHAPES = (((3,), 4, 5), ((), 1, 6), ((2, 2), 5, 1), ((2,), 3, 3))


def _clipped_index(q_len, k_len, max_distance):
    """Shaw's index ``clip(i - j, -K, K) + K`` per distance ``t = i - j + k_len - 1``."""
    rel = np.arange(q_len + k_len - 1) - (k_len - 1)
    return np.clip(rel, -max_distance, max_distance) + max_distance


def _installed(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def _expand_cases(rng, as_array, batch_shapes=_SHAPES):
    for lead, q_len, k_len in batch_shapes:
        vec = as_array(rng.standard_normal((*lead, q_len + k_len - 1)))
        yield (vec, q_len, k_len), {}
        out = as_array(np.zeros((*lead, q_len, k_len)))
        yield (vec, q_len, k_len), {"out": out}


def _gather_cases(rng, as_array, as_index, batch_shapes=_SHAPES):
    for lead, q_len, k_len in batch_shapes:
        m = 5
        scores = as_array(rng.standard_normal((*lead, q_len, m)))
        yield (scores, as_index(_clipped_index(q_len, k_len, 2)), k_len), {}
        index = as_index(rng.integers(0, m, q_len + k_len - 1))
        yield (scores, index, k_len), {"out": as_array(np.zeros((*lead, q_len, k_len)))}


def _scatter_cases(rng, as_array, as_index, batch_shapes=_SHAPES):
    for lead, q_len, k_len in batch_shapes:
        m = 5
        # Attention weights are non-negative; the reference sums in the input dtype.
        weights = as_array(rng.random((*lead, q_len, k_len)))
        yield (weights, as_index(_clipped_index(q_len, k_len, 2)), m), {}
        index = as_index(rng.integers(0, m, q_len + k_len - 1))
        yield (weights, index, m), {"out": as_array(np.zeros((*lead, q_len, m)))}


def _numpy_makers():
    for dtype in _NUMPY_DTYPES:
        yield (lambda a, dtype=dtype: np.asarray(a, dtype=dtype)), (lambda i: np.asarray(i, dtype=np.int64))
    yield (lambda a: np.asarray(a, dtype=np.float32)), (lambda i: np.asarray(i, dtype=np.int32))


def _torch_makers():
    if not _installed("torch"):
        return
    import torch

    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
        yield (lambda a, dtype=dtype: torch.from_numpy(np.ascontiguousarray(a)).to(dtype)), (lambda i: torch.from_numpy(np.asarray(i, dtype=np.int64)))


def _torch_strided_cases(op, rng):
    """Transposed torch views (``clone`` keeps their strides) with batch axes that do not merge."""
    if not _installed("torch"):
        return
    import torch

    q_len, k_len, m = 3, 4, 5
    if op == "expand":
        vec = torch.from_numpy(rng.standard_normal((q_len + k_len - 1, 3))).T
        out = torch.zeros(k_len, q_len, 3, dtype=torch.float64).permute(2, 1, 0)
        yield (vec, q_len, k_len), {"out": out}
        out = torch.zeros(3, 2, q_len, k_len, dtype=torch.float64).transpose(0, 1)
        yield (torch.from_numpy(rng.standard_normal((2, 3, q_len + k_len - 1))), q_len, k_len), {"out": out}
        return
    index = torch.from_numpy(rng.integers(0, m, q_len + k_len - 1))
    if op == "gather":
        scores = torch.from_numpy(rng.standard_normal((m, q_len, 2))).permute(2, 1, 0)
        out = torch.zeros(2, k_len, q_len, dtype=torch.float64).transpose(1, 2)
        yield (scores, index, k_len), {"out": out}
    else:
        weights = torch.from_numpy(rng.random((k_len, q_len, 2))).permute(2, 1, 0)
        out = torch.zeros(2, m, q_len, dtype=torch.float64).transpose(1, 2)
        yield (weights, index, m), {"out": out}


def _host_samples(op):
    def samples(rng):
        cases = []
        for as_array, as_index in [*_numpy_makers(), *_torch_makers()]:
            if op == "expand":
                cases += _expand_cases(rng, as_array)
            elif op == "gather":
                cases += _gather_cases(rng, as_array, as_index)
            else:
                cases += _scatter_cases(rng, as_array, as_index)
        cases += _torch_strided_cases(op, rng)
        return cases

    return samples


# The CUDA simulator runs every GPU thread as a Python thread: keep device samples small.
_DEVICE_SHAPES = (((2,), 3, 4), ((), 1, 5), ((2, 1), 4, 1))


def _device_samples(op):
    def samples(rng):
        if not _available.numba_cuda():
            return []
        cases = []
        for as_array, as_index in _numpy_makers():
            if op == "expand":
                cases += _expand_cases(rng, as_array, _DEVICE_SHAPES)
            elif op == "gather":
                cases += _gather_cases(rng, as_array, as_index, _DEVICE_SHAPES)
            else:
                cases += _scatter_cases(rng, as_array, as_index, _DEVICE_SHAPES)
        return cases

    return samples


def _to_device(args, kwargs):
    from numba import cuda

    def move(a):
        return cuda.to_device(a) if isinstance(a, np.ndarray) else a

    return [move(a) for a in args], {k: move(v) for k, v in kwargs.items()}


# The references sum float16 in float16; the kernels sum in float64 (CPU) or float32
# (CUDA) and round once.
_SCATTER_RTOL = {"float16": 1e-2}

for _op, _host, _device, _rtol in (
    ("expand", _host_expand, _device_expand, None),
    ("gather", _host_gather, _device_gather, None),
    ("scatter", _host_scatter, _device_scatter, _SCATTER_RTOL),
):
    register(
        f"toeplitz_{_op}",
        f"toeplitz_{_op}.numba_cpu",
        accepts=_host,
        loader=f"posenc._kernels.bias_cpu:toeplitz_{_op}",
        samples=_host_samples(_op),
        rtol=_rtol,
    )
    register(
        f"toeplitz_{_op}",
        f"toeplitz_{_op}.numba_cuda",
        accepts=_device,
        loader=f"posenc._kernels.bias_cuda:toeplitz_{_op}",
        samples=_device_samples(_op),
        rtol=_rtol,
        to_device=_to_device,
    )
