"""The host-side work of a CUDA kernel call does not grow with the array (issue 30, item 7).

Each launcher is called on numba device arrays (the CUDA simulator's, under ``make
test``'s ``test-kernels-cudasim`` run; a GPU's with ``make test-gpu``) with its kernel
replaced by a recorder, so what is measured is the host's work alone: the launches (exactly
one a call), the host-side indexing of device arrays (none: on a GPU, numba walks every
element of a strided view in Python to index it, which made a call grow with the array), and
every Python-level call the launcher makes (``sys.setprofile``), which must be the same
count for a sequence of 1, 64 and 4096 positions. The layouts include Hugging Face's
transposed ``[b, s, h, d]`` views and batch axes that do not merge (which used to take one
launch per index of the axes outside the kernel's grid).
"""

from __future__ import annotations

import gc
import sys

import numpy as np
import pytest

from posenc._kernels import _arrays

pytestmark = [pytest.mark.kernels, pytest.mark.skipif(not _arrays.numba_cuda(), reason="no GPU and no CUDA simulator")]

LENGTHS = (1, 64, 4096)


class _Recorder:
    """Stands for a kernel family: ``family[key][config](*args)`` records a launch, runs nothing."""

    def __init__(self):
        self.launches = []

    def __getitem__(self, key):
        return self

    def __call__(self, *args):
        self.launches.append(args)


def _device_array_types():
    from numba import cuda

    found = [type(cuda.to_device(np.zeros(1)))]
    if not _arrays.cuda_simulator():
        from numba.cuda.cudadrv.devicearray import DeviceNDArray

        found.append(DeviceNDArray)
    return found


def _host_work(monkeypatch, module, call):
    """``(launches, host-side device-array indexings, Python calls)`` of one ``call()``, after a
    first call (which may fill caches: compiled plans, frequencies on the device)."""
    from posenc._kernels import _device_flat

    recorder = _Recorder()
    monkeypatch.setattr(module, "FAMILY", recorder)
    monkeypatch.setattr(_device_flat, "_convert", recorder)  # a conversion on the device is a launch too
    indexing = [0]
    for cls in _device_array_types():
        original = cls.__getitem__

        def counted(self, item, original=original):
            indexing[0] += 1
            return original(self, item)

        monkeypatch.setattr(cls, "__getitem__", counted)
    call()
    recorder.launches.clear()
    indexing[0] = 0
    calls = [0]

    def profile(frame, event, arg):
        if event in ("call", "c_call"):
            calls[0] += 1

    from numba import cuda

    gc.collect()  # (a collection inside the call would run finalizers there)
    if not _arrays.cuda_simulator():  # frees pending from earlier calls made: each measurement starts alike
        context = cuda.current_context()
        getattr(context.memory_manager, "deallocations", context.deallocations).clear()
    gc.disable()
    result = None
    # On a GPU, numba frees device memory in batches once enough is pending, which a call
    # that allocates its result may happen to trigger: freeing is deferred while measuring.
    with cuda.defer_cleanup():
        sys.setprofile(profile)
        try:
            result = call()  # (held: freeing it here would run numba's finalizers, whose work depends on what is pending)
        finally:
            sys.setprofile(None)
            gc.enable()
    del result
    return len(recorder.launches), indexing[0], calls[0]


def _device(a):
    """A device copy of NumPy array ``a`` with ``a``'s strides (as ``kernel_samples.on_gpu``)."""
    from kernel_samples import on_gpu

    return on_gpu("none", [a], {})[0][0]


def _rope_cases(s):
    """``name -> (x, positions)``: [B, H, S, D] contiguous, HF's transposed [b, s, h, d], and
    four batch axes that do not merge (positions shared by all but S)."""
    rng = np.random.default_rng(0)
    contiguous = rng.standard_normal((1, 4, s, 8)).astype(np.float32)
    hf = rng.standard_normal((2, s, 4, 8)).astype(np.float32).transpose(0, 2, 1, 3)
    unmerged = rng.standard_normal((3, 2, s, 2, 8)).transpose(1, 0, 3, 2, 4)  # [2, 3, 2, S, 8]
    positions = np.arange(s, dtype=np.float64) + 5
    return {
        "contiguous": (contiguous, positions),
        "hf": (hf, np.stack([positions, positions + 3])[:, None, :]),
        "unmerged": (unmerged, positions),
    }


def _assert_constant(counts):
    launches = {n: c[0] for n, c in counts.items()}
    indexing = {n: c[1] for n, c in counts.items()}
    calls = {n: c[2] for n, c in counts.items()}
    assert set(launches.values()) == {1}, f"launches per call by sequence length: {launches}"
    assert set(indexing.values()) == {0}, f"device arrays indexed on the host, by sequence length: {indexing}"
    assert len(set(calls.values())) == 1, f"Python calls on the host by sequence length: {calls}"


@pytest.mark.parametrize("case", ["contiguous", "hf", "unmerged"])
@pytest.mark.parametrize("out", ["new", "in place", "buffer"])
@pytest.mark.parametrize("positions_dtype", ["float64", "int64"])  # int64: read as they are, no conversion
def test_rope_rotate_host_work_does_not_grow(monkeypatch, case, out, positions_dtype):
    from posenc._kernels import rope_cuda

    counts = {}
    for s in LENGTHS:
        x, positions = _rope_cases(s)[case]
        xd, pd = _device(x), _device(positions.astype(positions_dtype))
        target = {"new": None, "in place": xd, "buffer": _device(np.zeros_like(x))}[out]
        inv_freq = 10000.0 ** -(np.arange(4) / 4)
        counts[s] = _host_work(monkeypatch, rope_cuda, lambda: rope_cuda.rotate_positions(xd, pd, inv_freq, out=target))
    _assert_constant(counts)


@pytest.mark.parametrize("case", ["contiguous", "hf", "unmerged"])
@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_rope_apply_host_work_does_not_grow(monkeypatch, case, layout):
    from posenc._kernels import rope_cuda

    counts = {}
    for s in LENGTHS:
        x, _ = _rope_cases(s)[case]
        angles = np.random.default_rng(1).uniform(-3, 3, (s, 6)).astype(x.dtype)  # partial rotary: 6 of 8
        cos, sin = _device(np.cos(angles)), _device(np.sin(angles))
        xd = _device(x)
        counts[s] = _host_work(monkeypatch, rope_cuda, lambda: rope_cuda.rotate_cos_sin(xd, cos, sin, layout=layout))
    _assert_constant(counts)


def test_rope_apply_q_and_k_together_is_one_launch(monkeypatch):
    """q [b, 4, s, d] and k [b, 2, s, d] as transposed views of [b, s, h, d]: one launch for both."""
    from posenc._kernels import rope_cuda

    counts = {}
    rng = np.random.default_rng(2)
    for s in LENGTHS:
        q = _device(rng.standard_normal((2, s, 4, 8)).astype(np.float32).transpose(0, 2, 1, 3))
        k = _device(rng.standard_normal((2, s, 2, 8)).astype(np.float32).transpose(0, 2, 1, 3))
        angles = rng.uniform(-3, 3, (2, 1, s, 4)).astype(np.float32)
        cos, sin = (_device(np.concatenate([f(angles)] * 2, -1)) for f in (np.cos, np.sin))
        counts[s] = _host_work(monkeypatch, rope_cuda, lambda: rope_cuda.rotate_cos_sin_pair(q, k, cos, sin, out_q=q, out_k=k))
    _assert_constant(counts)


def _toeplitz_cases(k_len):
    """``op -> (args, kwargs)`` of one decoding query against ``k_len`` keys, batch axes that do not merge."""
    rng = np.random.default_rng(3)
    n, m = k_len, 5
    index = np.clip(np.arange(n) - (k_len - 1), -2, 2) + 2
    return {
        "expand": ((_device(rng.standard_normal((3, 2, n)).transpose(1, 0, 2)), 1, k_len), {}),
        "gather": ((_device(rng.standard_normal((3, 2, 1, m)).transpose(1, 0, 2, 3)), _device(index), k_len), {}),
        "scatter": ((_device(rng.random((3, 2, 1, k_len)).transpose(1, 0, 2, 3)), _device(index), m), {}),
    }


@pytest.mark.parametrize("op", ["expand", "gather", "scatter"])
def test_toeplitz_host_work_does_not_grow(monkeypatch, op):
    from posenc._kernels import toeplitz_cuda

    counts = {}
    for k_len in LENGTHS:
        args, kwargs = _toeplitz_cases(k_len)[op]
        launcher = getattr(toeplitz_cuda, f"toeplitz_{op}")
        counts[k_len] = _host_work(monkeypatch, toeplitz_cuda, lambda: launcher(*args, **kwargs))
    _assert_constant(counts)


@pytest.mark.parametrize("bidirectional", [True, False])
def test_t5_buckets_host_work_does_not_grow(monkeypatch, bidirectional):
    """T5's buckets of a bias's distances (what a T5 bias on a GPU launches besides its
    expansion): one launch, whatever the number of distances."""
    from posenc._kernels import buckets_cuda

    counts = {}
    for n in LENGTHS:
        rel = _device(np.arange(n, dtype=np.int64) - n // 2)
        call = lambda rel=rel: buckets_cuda.t5_buckets(rel, num_buckets=32, max_distance=128, bidirectional=bidirectional)  # noqa: E731
        counts[n] = _host_work(monkeypatch, buckets_cuda, call)
    _assert_constant(counts)
