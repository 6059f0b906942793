"""Every registered kernel equals the reference it optimises, on the samples of ``kernel_samples``.

This test picks up every registered kernel automatically (one without samples fails);
``make test`` runs it again under the numba CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``)
and with ``NUMBA_BOUNDSCHECK=1``.
"""

from __future__ import annotations

import numpy as np
import pytest

import posenc  # noqa: F401  (registers the kernels)
from arrays import copy_of, to_host, tolerance
from kernel_samples import SAMPLES, gpu_libraries, on_gpu
from posenc import _dispatch
from posenc._kernels import _arrays

KERNELS = _dispatch.kernels()


def _copy_args(args, kwargs):
    # Kernels may write in place (``out=``): each implementation gets its own copies,
    # one per object, so a sample with ``out=x`` stays in place.
    copies = {}

    def copy(value):
        if id(value) not in copies:
            copies[id(value)] = copy_of(value)
        return copies[id(value)]

    return [copy(a) for a in args], {k: copy(v) for k, v in kwargs.items()}


def test_every_kernel_has_samples():
    assert sorted(k.name for k in KERNELS if k.name not in SAMPLES) == []


def _cases():
    """(kernel, GPU library or None): the CUDA kernels once per GPU array library here."""
    for kernel in KERNELS:
        if kernel.name.endswith("numba_cuda"):
            for library in gpu_libraries():
                yield pytest.param(kernel, library, id=f"{kernel.name}-{library}")
        else:
            yield pytest.param(kernel, None, id=kernel.name)


@pytest.mark.kernels
@pytest.mark.parametrize("kernel, library", list(_cases()))
def test_kernel_matches_reference(kernel, library):
    gpu = library is not None
    if gpu and not _arrays.numba_cuda():
        pytest.skip(f"{kernel.name}: no GPU and no CUDA simulator here")
    if kernel.name.endswith("dask_blocks"):
        pytest.importorskip("dask")
    reference = _dispatch.references()[kernel.op]
    impl = kernel.load()
    cases = list(SAMPLES[kernel.name](np.random.default_rng(2024)))
    assert cases, f"kernel {kernel.name} has no samples"
    for args, kwargs in cases:
        a_args, a_kwargs = _copy_args(args, kwargs)
        r_args, r_kwargs = _copy_args(args, kwargs)
        if gpu:
            a_args, a_kwargs = on_gpu(kernel.op, a_args, a_kwargs, library)
        assert kernel.accepts_call(*a_args, **a_kwargs), f"{kernel.name} does not accept its own sample {kwargs}"
        got = impl(*a_args, **a_kwargs)
        want = reference(*r_args, **r_kwargs)
        got_np, want_np = to_host(got), to_host(want)
        assert got_np.shape == want_np.shape and got_np.dtype == want_np.dtype
        tol = tolerance(got.dtype, kernel.op)
        np.testing.assert_allclose(got_np.astype(np.float64), want_np.astype(np.float64), rtol=tol, atol=tol, err_msg=kernel.name)


def test_registry_lists_references_for_every_kernel():
    refs = _dispatch.references()
    for kernel in KERNELS:
        assert kernel.op in refs, f"kernel {kernel.name} optimises unknown reference {kernel.op}"
