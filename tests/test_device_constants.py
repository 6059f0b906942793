"""Frequencies kept on a torch GPU between table-building calls (``posenc._device_constants``):
without a GPU, the CUDA stream functions it calls are stood in for (a stream is a name, a
capture a flag), and the constants are CPU tensors."""

import threading

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import posenc as pe  # noqa: E402
from posenc import _device_constants, _xp  # noqa: E402


class _FakeCuda:
    """``torch.cuda.current_stream`` / ``is_current_stream_capturing`` / ``Tensor.record_stream``
    as a test sets them: which streams each tensor was recorded on."""

    def __init__(self, monkeypatch):
        self.stream, self.capturing, self.recorded, self.made, self.makers = "s0", False, [], 0, []
        monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: self.stream)
        monkeypatch.setattr(torch.cuda, "default_stream", lambda device=None: "s0")
        monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: self.capturing)
        monkeypatch.setattr(torch.Tensor, "record_stream", lambda t, s: self.recorded.append((t, s)))
        real = torch.tensor

        def counted(*args, **kwargs):
            self.made += 1
            self.makers.append(threading.current_thread())
            return real(*args, **kwargs)

        monkeypatch.setattr(torch, "tensor", counted)
        monkeypatch.setattr(_device_constants, "_kept", type(_device_constants._kept)())
        monkeypatch.setattr(_device_constants, "_captured", {})


@pytest.fixture
def fake_cuda(monkeypatch):
    return _FakeCuda(monkeypatch)


CPU = torch.device("cpu")


def test_a_constant_is_made_once_and_read_where_it_is(fake_cuda):
    first = _device_constants.torch_constant((1.0, 0.5), torch.float64, CPU)
    again = _device_constants.torch_constant((1.0, 0.5), torch.float64, CPU)
    assert again is first and fake_cuda.made == 1
    assert first.dtype == torch.float64 and first.tolist() == [1.0, 0.5]
    other = _device_constants.torch_constant((1.0, 0.25), torch.float64, CPU)
    assert other is not first and fake_cuda.made == 2 and fake_cuda.recorded == []
    # Made by threads of their own: a CUDA graph tree sends the allocations of the thread
    # that runs its warm-up to the graphs' private pool, which would not know of them.
    assert threading.current_thread() not in fake_cuda.makers


def test_zero_and_minus_zero_are_two_constants(fake_cuda):
    plus = _device_constants.torch_constant((0.0, 1.0), torch.float64, CPU)
    minus = _device_constants.torch_constant((-0.0, 1.0), torch.float64, CPU)
    assert torch.signbit(minus[0]) and not torch.signbit(plus[0])


def test_integer_constants_are_kept_by_their_exact_values(fake_cuda):
    """T5's bucket starts: integers past 2**53 are told apart (as float64 they would be one
    key), and a new one while a graph is captured is refused by name."""
    low = _device_constants.torch_constant((2**53, 2**53), torch.int64, CPU)
    high = _device_constants.torch_constant((2**53, 2**53 + 1), torch.int64, CPU)
    assert low.tolist() == [2**53, 2**53] and high.tolist() == [2**53, 2**53 + 1]
    fake_cuda.capturing = True
    with pytest.raises(RuntimeError, match="T5 bucket boundaries while a CUDA graph"):
        _device_constants.torch_constant((3, 5), torch.int64, CPU, what="T5 bucket boundaries")


def test_a_constant_first_made_in_inference_mode_serves_autograd_later(fake_cuda):
    with torch.inference_mode():
        made = _device_constants.torch_constant((0.5,), torch.float64, CPU)
    assert not made.is_inference()
    position = torch.tensor([3.0], dtype=torch.float64, requires_grad=True)
    (position * _device_constants.torch_constant((0.5,), torch.float64, CPU)).sum().backward()
    assert position.grad.tolist() == [0.5]


def test_no_constant_is_kept_under_a_dispatch_mode(fake_cuda):
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        assert _device_constants.torch_constant((0.5,), torch.float64, CPU) is None
    assert fake_cuda.made == 0 and not _device_constants._kept


def test_the_kept_constants_are_bounded_and_the_last_used_stay(fake_cuda):
    kept = _device_constants.torch_constant((1.0,), torch.float64, CPU)
    for step in range(3 * _device_constants._KEPT):  # a dynamic-NTK loop: a new set per step
        _device_constants.torch_constant((1.0 / (step + 2),), torch.float64, CPU)
        assert _device_constants.torch_constant((1.0,), torch.float64, CPU) is kept  # used every step
    assert len(_device_constants._kept) == _device_constants._KEPT
    assert fake_cuda.made == 1 + 3 * _device_constants._KEPT


def test_a_call_on_another_stream_records_it_and_a_capture_keeps_the_constant_for_good(fake_cuda):
    made = _device_constants.torch_constant((2.0,), torch.float64, CPU)
    fake_cuda.stream = "s1"
    assert _device_constants.torch_constant((2.0,), torch.float64, CPU) is made
    assert fake_cuda.recorded == [(made, "s1")]
    fake_cuda.capturing = True
    assert _device_constants.torch_constant((2.0,), torch.float64, CPU) is made
    assert len(fake_cuda.recorded) == 1  # a captured read is kept instead
    with pytest.raises(RuntimeError, match="outside the capture first"):
        _device_constants.torch_constant((7.0,), torch.float64, CPU)  # a copy cannot be captured
    assert fake_cuda.made == 1
    fake_cuda.capturing = False
    for step in range(2 * _device_constants._KEPT):
        _device_constants.torch_constant((float(step + 3),), torch.float64, CPU)
    assert (CPU, torch.float64, (2.0,)) not in _device_constants._kept
    made_before = fake_cuda.made
    assert _device_constants.torch_constant((2.0,), torch.float64, CPU) is made  # still the graph's memory
    assert fake_cuda.made == made_before


def test_rope_cos_sin_of_gpu_positions_reads_the_kept_frequencies(fake_cuda, monkeypatch):
    """The table builder on a "cuda" device (positions on the CPU standing in) takes its
    frequencies from the kept constants: made once over many calls, the same tables."""
    real_device_of = _xp.device_of
    cuda = torch.device("cuda", 0)
    monkeypatch.setattr("posenc._xp.has_float64", lambda xp, device=None: True)
    asked, real_constant = [], _device_constants.torch_constant

    def constant(values, dtype, device, what=None):
        assert device == cuda
        asked.append(values)
        return real_constant(values, dtype, CPU)

    monkeypatch.setattr(_device_constants, "torch_constant", constant)
    positions = torch.arange(5)
    inv_freq = pe.rope_frequencies(8)[0]
    want = pe.rope_cos_sin(positions, inv_freq)
    monkeypatch.setattr("posenc.rotary._call.device_of", lambda *a: cuda if a[0] is positions else real_device_of(*a))
    for _ in range(3):
        pe.rope_cos_sin.plans.clear()  # (a CPU plan would serve these CPU positions; none serves GPU ones)
        got = pe.rope_cos_sin(positions, inv_freq)
        assert all(torch.equal(g, w) for g, w in zip(got, want))
    assert asked == [tuple(np.asarray(inv_freq, dtype=np.float64).tolist())] * 3 and fake_cuda.made == 1


class _CountingNamespace:
    """An array namespace whose ``asarray`` (a copy onto its "device") is counted."""

    __name__ = "counting"

    def __init__(self):
        self.made = 0

    def asarray(self, values, *, dtype, device, copy):
        self.made += 1
        return np.array(values, dtype=dtype, copy=True)


def test_a_kept_array_is_made_once_per_device_dtype_and_values(monkeypatch):
    """``kept_array`` (CuPy's T5 bucket boundaries): one copy per ``(device, dtype, values)``,
    the same array for every later call; another device, dtype or values make their own,
    and only the last ``_KEPT`` are kept."""
    monkeypatch.setattr(_device_constants, "_kept_arrays", type(_device_constants._kept_arrays)())
    xp, values = _CountingNamespace(), np.array([3, 5, 9], dtype=np.int64)
    first = _device_constants.kept_array(xp, values, np.int64, "gpu0")
    assert _device_constants.kept_array(xp, values.copy(), np.int64, "gpu0") is first and xp.made == 1
    assert first.tolist() == [3, 5, 9]
    others = [(values, np.int64, "gpu1"), (values, np.int32, "gpu0"), (values[:2], np.int64, "gpu0")]
    assert all(_device_constants.kept_array(xp, *other) is not first for other in others) and xp.made == 4
    for n in range(_device_constants._KEPT):
        _device_constants.kept_array(xp, np.array([n]), np.int64, "gpu0")
    assert len(_device_constants._kept_arrays) == _device_constants._KEPT
    assert _device_constants.kept_array(xp, values, np.int64, "gpu0") is not first  # (dropped, made again)


def test_a_kept_array_dropped_is_released_after_its_device_finished(monkeypatch):
    """A kept CuPy array dropped past ``_KEPT`` was let go at once: CuPy's pool could hand its
    memory to the stream that made it while a call queued on another stream still read it
    (CuPy has no ``record_stream``). Each dropped array now goes through ``_released``, which
    waits for its device first (here recorded: the arrays dropped, oldest first, none kept)."""
    monkeypatch.setattr(_device_constants, "_kept_arrays", type(_device_constants._kept_arrays)())
    released = []
    monkeypatch.setattr(_device_constants, "_released", released.append, raising=False)
    xp = _CountingNamespace()
    made = [_device_constants.kept_array(xp, np.array([n]), np.int64, "gpu0") for n in range(_device_constants._KEPT + 3)]
    assert [a.tolist() for a in released] == [[0], [1], [2]] and all(a is m for a, m in zip(released, made))
    assert not any(a is kept for a in released for kept in _device_constants._kept_arrays.values())


def test_t5_bucket_boundaries_on_cupy_are_copied_once(monkeypatch):
    """T5's bucket boundaries (64 or more a direction: searched) were copied from host memory
    onto a CuPy device on every reference-path call, where torch's are kept on its GPU; a
    CuPy ``rel`` (here a NumPy one taken for CuPy) now takes the kept array: one copy for
    every call, the same buckets."""
    from types import SimpleNamespace

    from posenc.relative import buckets

    monkeypatch.setattr(_device_constants, "_kept_arrays", type(_device_constants._kept_arrays)())
    xp = _xp.namespace(np.zeros(1))
    rel = np.arange(-3000, 3000, 7, dtype=np.int64)
    want = buckets.t5_buckets(xp, rel, 256, 2000, True)
    copies = []
    monkeypatch.setattr(buckets, "_compat", SimpleNamespace(is_cupy_array=lambda a: True))
    real = xp.asarray
    monkeypatch.setattr(xp, "asarray", lambda *a, **kw: copies.append(a) or real(*a, **kw), raising=False)
    for _ in range(3):
        assert np.array_equal(buckets.t5_buckets(xp, rel, 256, 2000, True), want)
    assert len(copies) == 1 and len(_device_constants._kept_arrays) == 1


def test_host_constants_on_a_cupy_device_are_copied_once(monkeypatch):
    """``_xp.constant_on`` (rope's frequencies on the reference path, the sinusoidal
    wavelengths, xPos's exponents, mrope's indices) copied its host numbers onto a CuPy
    device on every call, where torch's are kept on its GPU; on a CuPy device (here a stand-in
    namespace and device) it takes the kept array: one copy for every call, the same values."""
    monkeypatch.setattr(_device_constants, "_kept_arrays", type(_device_constants._kept_arrays)())
    copies = []

    class Device:  # (a device of CuPy's, as constant_on tells them)
        __module__ = "cupy.cuda.device"

    class Namespace:
        __name__ = "cupy"

        @staticmethod
        def asarray(values, dtype=None, device=None, copy=None):
            copies.append(device)
            return np.array(values, dtype=dtype)

    device, values = Device(), (0.5, 1e-3, 3.0)
    got = [_xp.constant_on(Namespace, values, np.float32, device) for _ in range(3)]
    assert len(copies) == 1 and copies[0] is device and all(g is got[0] for g in got)
    assert np.array_equal(got[0], np.asarray(values, dtype=np.float32))
    assert _xp.constant_on(Namespace, (1, 2), np.int64, device).tolist() == [1, 2] and len(copies) == 2


def test_a_constant_the_device_cannot_make_raises_its_error_in_the_callers_thread(fake_cuda, monkeypatch):
    """A constant is made by a thread of its own: an error there (the device out of memory,
    say) is the caller's ``torch_constant`` error, the same exception, and nothing is kept;
    the next call makes it."""
    refused = RuntimeError("CUDA out of memory")
    real = torch.tensor

    def failing(*args, **kwargs):
        raise refused

    monkeypatch.setattr(torch, "tensor", failing)
    with pytest.raises(RuntimeError) as raised:
        _device_constants.torch_constant((1.0, 0.5), torch.float64, CPU)
    assert raised.value is refused and not _device_constants._kept
    monkeypatch.setattr(torch, "tensor", real)
    assert _device_constants.torch_constant((1.0, 0.5), torch.float64, CPU).tolist() == [1.0, 0.5]


def test_a_capture_on_another_gpu_than_the_current_one_is_asked_on_that_gpu(fake_cuda, monkeypatch):
    """A constant for ``cuda:1`` while ``cuda:0`` is current (two GPUs): whether a CUDA graph
    is being captured is asked of ``cuda:1``'s current stream (inside ``torch.cuda.device``),
    so a new constant while it captures is refused there, and one on a GPU whose stream does
    not capture is made, whatever another GPU captures."""
    import contextlib

    current, capturing = [0], {0: False, 1: True}

    @contextlib.contextmanager
    def on(device):
        before, current[0] = current[0], device.index
        try:
            yield
        finally:
            current[0] = before

    monkeypatch.setattr(torch.cuda, "current_device", lambda: current[0])
    monkeypatch.setattr(torch.cuda, "device", on)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing[current[0]])
    second = torch.device("cuda", 1)
    monkeypatch.setattr(_device_constants, "_made_apart", lambda torch, values, dtype, device: torch.tensor(values, dtype=dtype))
    with pytest.raises(RuntimeError, match="outside the capture first"):
        _device_constants.torch_constant((3.0,), torch.float64, second)
    assert current == [0]
    capturing.update({0: True, 1: False})
    assert _device_constants.torch_constant((3.0,), torch.float64, second).tolist() == [3.0] and current == [0]


def test_a_kept_cupy_array_is_waited_for_when_made_and_its_device_when_dropped(monkeypatch):
    """On CuPy: the copy that makes a kept array is waited for on the current stream
    (``_copied``: a call on any stream then reads it whole), and one dropped past ``_KEPT``
    waits for its device's work first (``_released``). CuPy and its arrays stood in for."""
    import sys
    import types as pytypes

    events = []

    class Array(np.ndarray):
        device = pytypes.SimpleNamespace(synchronize=lambda: events.append("device"))

    stream = pytypes.SimpleNamespace(synchronize=lambda: events.append("stream"))
    cupy = pytypes.SimpleNamespace(cuda=pytypes.SimpleNamespace(get_current_stream=lambda: stream))
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    monkeypatch.setattr(_device_constants, "_compat", pytypes.SimpleNamespace(is_cupy_array=lambda a: isinstance(a, Array)))
    monkeypatch.setattr(_device_constants, "_kept_arrays", type(_device_constants._kept_arrays)())
    xp = pytypes.SimpleNamespace(__name__="cupy", asarray=lambda values, dtype, device, copy: np.array(values, dtype=dtype).view(Array))
    first = _device_constants.kept_array(xp, np.array([0]), np.int64, "gpu0")
    assert events == ["stream"] and isinstance(first, Array)
    for n in range(1, _device_constants._KEPT + 1):
        _device_constants.kept_array(xp, np.array([n]), np.int64, "gpu0")
    assert events == ["stream"] * (_device_constants._KEPT + 1) + ["device"]
