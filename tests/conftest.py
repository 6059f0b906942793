"""The test matrix: every test that takes ``backend`` runs once per array library."""

from __future__ import annotations

import importlib.util
import os
import sys

# Before any of JAX or Numba is imported. JAX takes 75 % of a GPU's memory when its GPU
# client starts (every process that touches a JAX array), which leaves torch and CuPy out of
# memory on tiny tensors; Numba warns of low occupancy on the small grids of the tests'
# shapes, which filterwarnings=error would make failures (its other performance warnings,
# a host array passed to a kernel say, stay errors).
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
os.environ.setdefault("NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS", "0")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from arrays import Backend, available_backends, gpu_run  # noqa: E402


if gpu_run() and importlib.util.find_spec("jax") is not None:
    # JAX puts new arrays on its first device, the GPU here: the suite's JAX arrays stay on
    # the CPU, where posenc's JAX kernels run (tests/test_jax_gpu.py places its own on the
    # GPU), and so do those of the processes tests start (bounds checking, sharding).
    import jax

    jax.config.update("jax_default_device", jax.devices("cpu")[0])
    os.environ.setdefault("JAX_PLATFORMS", "cpu")


def pytest_report_header(config):
    return "posenc array backends: " + ", ".join(available_backends())


@pytest.fixture(params=available_backends())
def backend(request) -> Backend:
    return Backend(request.param)


@pytest.fixture
def xp(backend):
    return backend.xp


@pytest.fixture
def rng():
    return np.random.default_rng(12345)


def has_module(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


@pytest.fixture
def uncached_compile():
    """torch.compile without its on-disk caches: a test that asks which path a compiled graph
    takes must not be served a graph compiled by an earlier version of the code."""
    import torch._functorch.config
    import torch._inductor.config

    with torch._inductor.config.patch(fx_graph_cache=False), torch._functorch.config.patch(enable_autograd_cache=False):
        yield


@pytest.fixture(autouse=gpu_run())
def _free_gpu_memory():
    """On the GPU run: each test's device memory goes back to the device when it ends (torch's
    and CuPy's caching allocators keep it otherwise, which the next test cannot use)."""
    yield
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    cupy = sys.modules.get("cupy")
    if cupy is not None:
        cupy.cuda.Device().synchronize()
        cupy.get_default_memory_pool().free_all_blocks()
        cupy.get_default_pinned_memory_pool().free_all_blocks()
