"""Argument sets for the torch autograd entries (used by the kernel/reference test)."""

import numpy as np
import torch


def _t(rng, shape, dtype=torch.float64):
    return torch.tensor(rng.standard_normal(shape), dtype=dtype, requires_grad=True)


def _rope_rotate(rng):
    inv = 10000.0 ** (-np.arange(0, 6, 2) / 6)
    for layout in ("half", "interleaved"):
        for dtype in (torch.float32, torch.float64):
            yield (_t(rng, (2, 3, 5, 8), dtype), torch.arange(5), inv), {"layout": layout, "inverse": layout == "half", "scale": 1.25}


def _rope_apply(rng):
    angles = rng.uniform(-3, 3, (5, 2))
    for layout in ("half", "interleaved"):
        dup = np.concatenate([angles, angles], -1) if layout == "half" else np.repeat(angles, 2, -1)
        cos, sin = torch.tensor(np.cos(dup)), torch.tensor(np.sin(dup))
        yield (_t(rng, (3, 5, 6)), cos, sin), {"layout": layout}


def _expand(rng):
    yield (_t(rng, (2, 4 + 6 - 1)), 4, 6), {}
    yield (_t(rng, (3, 1)), 1, 1), {}


def _gather(rng):
    q, k, m = 4, 6, 5
    yield (_t(rng, (2, q, m)), torch.tensor(rng.integers(0, m, q + k - 1)), k), {}


def _scatter(rng):
    q, k, m = 4, 6, 5
    yield (_t(rng, (2, q, k)), torch.tensor(rng.integers(0, m, q + k - 1)), m), {}


SAMPLES = {
    "rope_rotate": lambda rng: list(_rope_rotate(rng)),
    "rope_apply": lambda rng: list(_rope_apply(rng)),
    "toeplitz_expand": lambda rng: list(_expand(rng)),
    "toeplitz_gather": lambda rng: list(_gather(rng)),
    "toeplitz_scatter": lambda rng: list(_scatter(rng)),
}
