"""The kernel variants of ``tests/gpu/kernel_variants.py`` still apply to ``rope_cuda``'s
source and give its bits (under the CUDA simulator in ``make test``, so that a GPU session
does not find its A/B broken)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from kernel_samples import on_gpu
from posenc._kernels import _arrays

pytestmark = [pytest.mark.kernels, pytest.mark.skipif(not _arrays.numba_cuda(), reason="no GPU and no CUDA simulator")]


def _variants():
    spec = importlib.util.spec_from_file_location("kernel_variants", Path(__file__).parent / "gpu" / "kernel_variants.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_every_variant_gives_the_products_bits(dtype):
    """27 heads of Hugging Face's layout (every loop over a thread's heads, the first eight
    loaded early or not), words of two channels: ``rope`` and ``rope_apply``."""
    from posenc._kernels import rope_cuda

    variants = _variants()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 27, 16)).astype(dtype).transpose(0, 2, 1, 3)
    positions = rng.integers(0, 500_000, (2, 1, 3))
    angles = rng.uniform(-40, 40, (2, 1, 3, 8))
    cos, sin = (np.concatenate([f(angles)] * 2, -1).astype(dtype) for f in (np.cos, np.sin))
    inv_freq = 10000.0 ** -(np.arange(8) / 8)

    def bits(module):
        (xd, pd, cd, sd), _ = on_gpu("none", [x, positions, cos, sin], {})
        rotated = module.rotate_positions(xd, pd, inv_freq).copy_to_host()
        (xd,), _ = on_gpu("none", [x], {})
        applied = module.rotate_cos_sin(xd, cd, sd, out=xd).copy_to_host()
        return [a.view(f"u{a.dtype.itemsize}") for a in (rotated, applied)]

    want = bits(rope_cuda)
    for name in variants.VARIANTS:
        for got, expected in zip(bits(variants.load(name)), want):
            np.testing.assert_array_equal(got, expected, err_msg=name)
