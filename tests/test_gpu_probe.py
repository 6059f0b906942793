"""The probe kernels of ``tests/gpu/probe_bounds.py`` touch every word once and rotate as the
product does (under the CUDA simulator in ``make test``, so that a GPU session does not
find them broken)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from posenc._kernels import _arrays, _codec

pytestmark = [pytest.mark.kernels, pytest.mark.skipif(not _arrays.numba_cuda(), reason="no GPU and no CUDA simulator")]

SHAPE = (1, 16, 5, 2)  # batch, heads, positions (a last block of four rows half full), words of a half


def _probe():
    spec = importlib.util.spec_from_file_location("probe_bounds", Path(__file__).parent / "gpu" / "probe_bounds.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(("storage", "word", "unroll"), [(_codec.FLOAT, np.uint64, 4), (_codec.BFLOAT16, np.uint32, 8), (_codec.BFLOAT16, np.uint64, 8)])
def test_a_copy_probe_flips_every_word_once(storage, word, unroll):
    from numba import cuda

    probe = _probe()
    batch, heads, seq, half = SHAPE
    words = np.random.default_rng(0).integers(0, np.iinfo(word).max, size=batch * heads * seq * 2 * half, dtype=word, endpoint=True)
    x = cuda.to_device(words)
    probe.launch(probe.probe_kernel(storage, word, "copy", unroll), x, SHAPE, flip=np.iinfo(word).max)
    np.testing.assert_array_equal(x.copy_to_host(), ~words)


def test_the_16_byte_probe_flips_every_word_once_and_the_flat_copies_copy():
    from numba import cuda

    probe = _probe()
    batch, heads, seq, half = SHAPE
    words = np.random.default_rng(2).integers(0, 2**63, size=batch * heads * seq * 4 * half, dtype=np.uint64)
    x = cuda.to_device(words)
    probe.launch(probe.probe_kernel16(4), x, SHAPE, flip=2**64 - 1)
    np.testing.assert_array_equal(x.copy_to_host(), ~words)
    for copy, per in ((probe.flat_copy, 1), (probe.flat_copy16, 2)):
        y = cuda.device_array_like(words)
        copy[-(-words.size // (256 * per)), 256](x, y)
        np.testing.assert_array_equal(y.copy_to_host(), ~words)


@pytest.mark.parametrize("mode", ["rotate", "rotate32"])
def test_a_rotate_probe_rotates_float32_pairs(mode):
    """float32 words: channel ``j`` and ``j + half`` of each head and position rotated by
    ``cos, sin = 0.6, 0.8``: in float64, rounded once (``rotate``: the product's arithmetic,
    NumPy's bits in the simulator, within an ulp on a GPU), or in float32 (``rotate32``:
    within an ulp or two)."""
    from numba import config, cuda

    probe = _probe()
    batch, heads, seq, half = SHAPE
    values = np.random.default_rng(1).standard_normal((batch, heads, seq, 4 * half), dtype=np.float32)
    x = cuda.to_device(values.reshape(-1).view(np.uint64))
    probe.launch(probe.probe_kernel(_codec.FLOAT, np.uint64, mode, 4), x, SHAPE)
    got = x.copy_to_host().view(np.float32).reshape(values.shape)
    a, b = values[..., : 2 * half].astype(np.float64), values[..., 2 * half :].astype(np.float64)
    want = np.concatenate([a * 0.6 - b * 0.8, b * 0.6 + a * 0.8], axis=-1).astype(np.float32)
    if mode == "rotate" and config.ENABLE_CUDASIM:
        np.testing.assert_array_equal(got, want)
    elif mode == "rotate":
        # A GPU contracts a·cos − b·sin into a float64 fused multiply-add; where the exact
        # result is a float32 tie (0.6 and 0.8 make some: (3b + 4a) / 5), either neighbour.
        np.testing.assert_array_max_ulp(got, want, maxulp=1)
    else:
        np.testing.assert_allclose(got, want, rtol=3e-7, atol=1e-7)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_products_kernel_compiled_by_the_probe_rotates_as_the_product_does(dtype):
    """``product_kernel`` (the family's kernel of the widest words, built here) launched by
    ``product_rotation`` gives ``rope_cuda.rotate_positions``'s bits."""
    from numba import cuda

    from posenc._kernels import rope_cuda

    if dtype == "bfloat16":
        dtype = pytest.importorskip("ml_dtypes").bfloat16
    name = np.dtype(dtype).name
    bits = np.uint16 if name == "bfloat16" else np.uint32

    def on_device(a):  # (through its bits: numba's copy exports a buffer, which NumPy refuses for bfloat16)
        return cuda.to_device(np.ascontiguousarray(a).view(bits)).view(a.dtype)

    probe = _probe()
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 3, 5, 16)).astype(dtype)
    positions, inv_freq = np.arange(5), 10000.0 ** -(np.arange(8) / 8)
    want = rope_cuda.rotate_positions(on_device(x), cuda.to_device(positions), inv_freq).view(bits).copy_to_host()
    xd, layout = on_device(x), rope_cuda.WORDS[name][0][0]
    probe.product_rotation(xd, cuda.to_device(positions), inv_freq, probe.product_kernel("rotate", name, layout), layout)()
    np.testing.assert_array_equal(xd.view(bits).copy_to_host(), want)
    assert not np.array_equal(want, x.view(bits))
    with pytest.raises(ValueError, match="not rotated in the words"):
        probe.product_rotation(on_device(x[..., :14]), cuda.to_device(positions), inv_freq[:7], None, layout)  # (7 pairs)
