"""The test matrix: every test that takes ``backend`` runs once per array library."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from arrays import Backend, available_backends


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
