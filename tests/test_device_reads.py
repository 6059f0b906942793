"""What a call on arrays already on a GPU reads back to the host (issue 30: none, on the calls
of a decode step): each read is a synchronisation, and a CUDA graph cannot capture it.

Run without a GPU: ``fake_cuda.FakeCuda`` tensors say they are on ``cuda:0`` (posenc takes its
GPU branches) and compute on the CPU, and every read of their values on the host and every
copy of host memory onto them is recorded with the line of posenc it comes from. Without
numba-cuda the registry sends them to the Array-API reference, as on a GPU with torch alone.
"""

from __future__ import annotations

import pytest

import posenc as pe
from posenc._kernels import _arrays

torch = pytest.importorskip("torch")
import fake_cuda  # noqa: E402  (imports torch)

pytestmark = pytest.mark.skipif(_arrays.numba_cuda() or torch.cuda.is_available(), reason="FakeCuda tensors stand in for CUDA ones where there is none")

K = 3  # Shaw's max_distance
EXTREME = [-(2**63), 2**63 - 1, 0, 2]  # beyond the int64 sums on the host: refused there


def _shaw_output(offset):
    g = torch.Generator().manual_seed(0)
    weights, v, table = torch.rand(4, 2, 3, 6, generator=g), torch.randn(4, 2, 6, 5, generator=g), torch.randn(2 * K + 1, 5, generator=g)
    return lambda c: pe.shaw_output(c(weights), c(v), c(table), max_distance=K, offset=c(torch.tensor(offset)))


def _on_fake_gpu(call):
    with pe.use_backend("reference"), fake_cuda.recording() as log:
        got = call(fake_cuda.cuda)
    return fake_cuda.host(got), log


def test_the_harness_records_reads_and_copies_and_refuses_numpy():
    with fake_cuda.recording() as log:
        x = fake_cuda.cuda(torch.arange(4))
        assert x.device.type == "cuda" and int(x.sum()) == 6 and x.tolist() == [0, 1, 2, 3]
        y = torch.asarray([1, 2], device=x.device) + x[:2]
        assert isinstance(y, fake_cuda.FakeCuda) and bool((y.cpu() == torch.tensor([1, 3])).all())
        with pytest.raises(TypeError, match="cuda:0 device type tensor to numpy"):
            x.numpy()
    assert [(kind, what) for kind, what, _ in log] == [("read", "__int__"), ("read", "tolist"), ("copy", "asarray of host data onto the device"), ("read", "cpu to the CPU"), ("read", "numpy")]


def test_shaw_output_with_one_offset_per_row_reads_nothing_back_on_a_gpu():
    """Per-row ``shaw_output`` read every offset's range back (``_validate._sum_leaves``: two
    reads) and copied ``[low, high]`` onto the device (a pageable host copy, its result unused
    but for Dask) on each call. The distances are clipped to ``±K``: the offsets are clamped
    on the device instead, to where every distance of a row is already beyond ``K``."""
    got, log = _on_fake_gpu(_shaw_output([5, -2, 0, 9]))
    assert not log, log.lines()
    with pe.use_backend("reference"):
        want = _shaw_output([5, -2, 0, 9])(lambda t: t)
    assert torch.equal(got, want)


def test_offsets_past_the_int64_sums_give_the_saturated_rows_on_a_gpu():
    """Offsets whose sums would leave int64, refused on the host (where reading them is free),
    are clamped on a GPU: each row is the one of any offset as far out on its side."""
    got, log = _on_fake_gpu(_shaw_output(EXTREME))
    assert not log, log.lines()
    with pe.use_backend("reference"):
        want = _shaw_output([-(K + 3) - 100, K + 6 + 100, 0, 2])(lambda t: t)
    assert torch.equal(got, want)
    with pytest.raises(ValueError, match=r"offset \+ i - j must stay within int64"):
        _shaw_output(EXTREME)(lambda t: t)
