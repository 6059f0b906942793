"""The CUDA launchers on Hugging Face's layouts, q and k in one launch, and the inputs they refuse.

Run on numba device arrays: the CUDA simulator's under ``make test``'s cudasim pass, a GPU's
under ``make test-gpu``. Results are compared with the NumPy references
(``posenc.rotary._rotate``) within the kernels' tolerance (``arrays.tolerance``).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from arrays import counting_kernel_keys, to_host, tolerance
from kernel_samples import on_gpu
import posenc as pe
from posenc._kernels import _arrays
from posenc.rotary import _rotate

pytestmark = [pytest.mark.kernels, pytest.mark.skipif(not _arrays.numba_cuda(), reason="no GPU and no CUDA simulator")]


def _device(a):
    return on_gpu("none", [a], {})[0][0]


def _close(got, want, dtype):
    tol = tolerance(np.dtype(dtype), "rope_apply")
    np.testing.assert_allclose(to_host(got).astype(np.float64), want.astype(np.float64), rtol=tol, atol=tol)


def _hf_views(rng, b, s, heads, d, dtype):
    """``[b, heads, s, d]`` as the transposed view of a ``[b, s, heads, d]`` projection."""
    return rng.standard_normal((b, s, heads, d)).astype(dtype).transpose(0, 2, 1, 3)


def _tables(rng, b, s, rotary, layout, dtype):
    angles = rng.uniform(-40, 40, (b, 1, s, rotary // 2))
    pairs = np.repeat(angles, 2, -1) if layout == "interleaved" else np.concatenate([angles, angles], -1)
    return np.cos(pairs).astype(dtype), np.sin(pairs).astype(dtype)


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("in_place", [True, False])
def test_q_and_k_together_match_the_reference(dtype, layout, in_place):
    from posenc._kernels import rope_cuda

    rng = np.random.default_rng(5)
    q, k = _hf_views(rng, 2, 3, 4, 8, dtype), _hf_views(rng, 2, 3, 2, 8, dtype)
    cos, sin = _tables(rng, 2, 3, 6, layout, dtype)  # partial rotary: 6 of 8 channels
    want = [_rotate.rotate_cos_sin(a.copy(), cos, sin, layout=layout) for a in (q, k)]
    qd, kd, cd, sd = (_device(a) for a in (q, k, cos, sin))
    outs = dict(out_q=qd, out_k=kd) if in_place else {}
    got = rope_cuda.rotate_cos_sin_pair(qd, kd, cd, sd, layout=layout, **outs)
    if in_place:
        assert got[0] is qd and got[1] is kd
    for g, w in zip(got, want):
        _close(g, w, dtype)


def test_q_and_k_whose_rows_do_not_line_up_take_one_launch_each():
    """k with another batch size than q (cos/sin broadcast over it): still each rotated right."""
    from posenc._kernels import rope_cuda

    rng = np.random.default_rng(6)
    q, k = _hf_views(rng, 1, 3, 4, 8, "float32"), _hf_views(rng, 2, 3, 2, 8, "float32")
    cos, sin = _tables(rng, 1, 3, 8, "half", "float32")
    want = [_rotate.rotate_cos_sin(a.copy(), cos, sin) for a in (q, k)]
    got = rope_cuda.rotate_cos_sin_pair(*(_device(a) for a in (q, k, cos, sin)))
    for g, w in zip(got, want):
        _close(g, w, "float32")


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("positions_dtype", ["int32", "int64", "float64"])
def test_rope_on_hf_views_in_place(dtype, positions_dtype):
    """The transposed ``[b, s, h, d]`` view rotated in place, per-batch positions converted on the device."""
    from posenc._kernels import rope_cuda

    rng = np.random.default_rng(7)
    x = _hf_views(rng, 2, 5, 3, 10, dtype)
    positions = rng.integers(0, 5000, (2, 1, 5)).astype(positions_dtype)
    inv_freq = 10000.0 ** -(np.arange(4) / 4)  # partial rotary: 8 of 10 channels
    want = _rotate.rotate_positions(x.copy(), positions, inv_freq, layout="interleaved")
    xd = _device(x)
    got = rope_cuda.rotate_positions(xd, _device(positions), inv_freq, layout="interleaved", out=xd)
    assert got is xd
    _close(xd, want, dtype)


@pytest.mark.parametrize("columns", [1, 3, 4, 5, 8, 9, 16, 17, 31, 32])
def test_a_block_of_short_rows_gives_every_warp_thread_a_column(columns):
    """Rows of 32 columns or fewer: ``x`` threads a power of two dividing a warp, fewer than
    twice the columns (4 at least, so that ``z`` stays within the device's 64 a block); longer
    rows take whole warps. Two ``y`` threads share a row's heads where the block is told to
    split them (float32 and float64), one takes them all otherwise (16-bit elements)."""
    from posenc._kernels import rope_cuda

    for heads, split in itertools.product((1, 2, 32), (True, False)):
        bx, by, bz = rope_cuda._block(columns, heads, split)
        assert 32 % bx == 0 and columns <= bx and (bx < 2 * columns or bx == 4)
        assert bx * by * bz == rope_cuda._THREADS and bz <= 64 and by == (2 if split and heads > 1 else 1)
    assert rope_cuda._block(33, 32, True) == (64, 2, 2) and rope_cuda._block(33, 32, False) == (64, 1, 4)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_short_rows_with_warps_across_heads_and_positions_match_the_reference(dtype):
    """Head dim 16 in words (4 columns in place: a warp's threads span two heads and four
    positions) and a rotary dim of 4 of 16 with out a new array (the pass-through channels
    copied by the same threads): the reference's values."""
    from posenc._kernels import rope_cuda

    rng = np.random.default_rng(11)
    x = _hf_views(rng, 2, 9, 6, 16, dtype)
    positions = rng.integers(0, 5000, (2, 1, 9))
    for rotary in (16, 4):
        inv_freq = 10000.0 ** -(np.arange(rotary // 2) / (rotary // 2))
        want = _rotate.rotate_positions(x.copy(), positions, inv_freq)
        xd = _device(x)
        got = rope_cuda.rotate_positions(xd, _device(positions), inv_freq, out=xd if rotary == 16 else None)
        _close(got, want, dtype)


def test_rope_with_five_unmergeable_leading_axes():
    """More leading axes than one launch walks (AXES): one launch per index of the extra ones, still right."""
    from posenc._kernels import _device_flat, rope_cuda

    rng = np.random.default_rng(8)
    lead = (2, 3, 2, 2, 2, 2, 5)  # seven leading axes, in reversed memory order so none merge
    x = rng.standard_normal(lead[::-1] + (4,)).transpose(*range(len(lead) - 1, -1, -1), len(lead))
    assert x.shape == lead + (4,) and len(lead) - 1 > _device_flat.AXES
    positions = rng.integers(0, 100, lead[-1])
    inv_freq = np.array([1.0, 0.01])
    want = _rotate.rotate_positions(x.copy(), positions, inv_freq)
    _close(rope_cuda.rotate_positions(_device(x), _device(positions), inv_freq), want, "float64")


# ------------------------------------------------------------------ refused before any launch


def _refused(launcher, args, kwargs, error, words):
    from numba import cuda

    del cuda  # (the simulator or a GPU: the refusal comes before either runs anything)
    with pytest.raises(error) as raised:
        launcher(*args, **kwargs)
    for word in words:
        assert word in str(raised.value), str(raised.value)


def test_host_arrays_beside_device_ones_are_refused(monkeypatch):
    from posenc._kernels import rope_cuda, toeplitz_cuda

    launched = []
    monkeypatch.setattr(rope_cuda, "FAMILY", type("F", (), {"__getitem__": lambda self, key: launched.append(key)})())
    x = _device(np.zeros((2, 3, 4), np.float32))
    inv_freq = np.ones(2)
    _refused(rope_cuda.rotate_positions, (x, np.arange(3), inv_freq), {}, TypeError, ["positions", "GPU array"])
    _refused(rope_cuda.rotate_positions, (x, _device(np.arange(3)), inv_freq), {"out": np.zeros((2, 3, 4), np.float32)}, TypeError, ["out"])
    cos = np.ones((3, 4), np.float32)
    _refused(rope_cuda.rotate_cos_sin, (x, _device(cos), cos), {}, TypeError, ["sin"])
    scores = _device(np.zeros((2, 5), np.float32))
    _refused(toeplitz_cuda.toeplitz_gather, (scores, np.zeros(5, np.int64), 4), {}, TypeError, ["index"])
    assert launched == []


def test_operands_with_negative_strides_are_refused_before_any_launch(monkeypatch):
    """The rotary launchers called directly (past the registry's accepts) with an input read
    backwards: refused with the argument named, since the kernels address an operand from its
    lowest element up at unsigned indices (a negative offset would read outside it)."""
    from posenc._kernels import rope_cuda

    launched = []
    monkeypatch.setattr(rope_cuda, "FAMILY", type("F", (), {"__getitem__": lambda self, key: launched.append(key)})())
    inv_freq = np.ones(2)
    x = _device(np.zeros((2, 3, 4), np.float32))
    backwards = _arrays.strided(_device(np.zeros(24, np.float32))[23:], (2, 3, 4), (-12, -4, -1))
    positions = _device(np.arange(3))
    cos = _device(np.ones((3, 4), np.float32))
    cos_backwards = _arrays.strided(_device(np.ones(12, np.float32))[11:], (3, 4), (-4, -1))
    _refused(rope_cuda.rotate_positions, (backwards, positions, inv_freq), {}, ValueError, ["x has strides (-12, -4, -1)"])
    _refused(rope_cuda.rotate_positions, (x, _arrays.strided(_device(np.arange(3))[2:], (3,), (-1,)), inv_freq), {}, ValueError, ["positions has strides"])
    _refused(rope_cuda.rotate_cos_sin, (x, cos_backwards, cos), {}, ValueError, ["cos has strides"])
    _refused(rope_cuda.rotate_cos_sin_pair, (x, backwards, cos, cos), {}, ValueError, ["k has strides"])
    assert launched == []


def test_toeplitz_indices_are_checked_and_converted_on_their_arrays_device(monkeypatch):
    """A gather's or scatter's index is read (its range) and converted to int64 under the
    launch's device context (``_arrays.launch_context``), as the rotary launchers' positions
    are: for an array on a GPU that is not the current one, that is its own device and
    stream. Out of range, it is refused there, before any launch."""
    import contextlib

    from posenc._kernels import toeplitz_cuda

    inside, seen = [False], []

    @contextlib.contextmanager
    def device_context():
        inside[0] = True
        yield
        inside[0] = False

    context = _arrays.launch_context
    monkeypatch.setattr(_arrays, "launch_context", lambda a: (context(a)[0], device_context()))
    convert = toeplitz_cuda._index
    monkeypatch.setattr(toeplitz_cuda, "_index", lambda i, m: seen.append(inside[0]) or convert(i, m))
    from posenc.relative import _toeplitz

    scores, weights, index = np.arange(10, dtype=np.float32).reshape(2, 5), np.ones((2, 3), np.float32), np.array([4, 0, 2, 1], np.int32)
    gathered = toeplitz_cuda.toeplitz_gather(_device(scores), _device(index), 3)
    np.testing.assert_array_equal(to_host(gathered), _toeplitz.toeplitz_gather(scores, index, 3))
    scattered = toeplitz_cuda.toeplitz_scatter(_device(weights), _device(index), 5)
    np.testing.assert_array_equal(to_host(scattered), _toeplitz.toeplitz_scatter(weights, index, 5))
    _refused(toeplitz_cuda.toeplitz_gather, (_device(scores), _device(index + 1), 3), {}, ValueError, ["index"])
    assert seen == [True, True, True]


def _fake_cuda_toeplitz(monkeypatch, torch):
    """torch CPU tensors standing in for CUDA ones on the way to the CUDA Toeplitz launchers:
    the registry sends them to ``toeplitz_cuda`` (``on_gpu``), which runs as on a GPU up to
    the driver, where its launches are recorded, not run (their results are not computed).
    Returns ``(launches, bounds)``: the kernels launched, and ``_arrays.bounds``'s arguments
    (the read-back of an index's range)."""
    import contextlib

    from numba import cuda

    from posenc import _built
    from posenc._kernels import _device_flat, toeplitz_cuda
    from posenc.relative import _rows

    on_gpu, on_host = _arrays.on_gpu, _arrays.on_host
    cpu_tensor = lambda a: isinstance(a, torch.Tensor) and a.device.type == "cpu"  # noqa: E731
    monkeypatch.setattr(_arrays, "on_gpu", lambda a: on_host(a) if cpu_tensor(a) else on_gpu(a))
    monkeypatch.setattr(_arrays, "on_host", lambda a: not cpu_tensor(a) and on_host(a))
    launchable = _built.launchable
    monkeypatch.setattr(_built, "launchable", lambda a: cpu_tensor(a) or launchable(a))
    monkeypatch.setattr(_rows, "served", lambda *args, **kwargs: False)  # (the host's row-by-row path, which no GPU array takes)
    monkeypatch.setattr(_arrays, "launch_context", lambda a: (cuda.default_stream(), contextlib.nullcontext()))
    launches, bounds = [], []
    monkeypatch.setattr(toeplitz_cuda, "FAMILY", {key: key for key in toeplitz_cuda.SPECIALISATIONS})
    monkeypatch.setattr(_device_flat, "launch", lambda kernel, *args: launches.append(kernel))
    read = _arrays.bounds
    monkeypatch.setattr(_arrays, "bounds", lambda index: bounds.append(index) or read(index))
    return launches, bounds


def _own_index_calls(torch, *, grad=False):
    """``name -> (function, arguments)``: the public functions whose Toeplitz index posenc
    forms itself, on tensors (``grad``: the floating-point ones require it)."""
    g = torch.Generator().manual_seed(0)
    r = lambda *shape: torch.randn(*shape, generator=g).requires_grad_(grad)  # noqa: E731
    q, k, table_k, table_v, pos = r(2, 3, 4, 8), r(2, 3, 6, 8), r(7, 8), r(7, 5), r(6, 8)
    weights, v, u = torch.rand(4, 2, 1, 6, generator=g).requires_grad_(grad), r(4, 2, 6, 5), r(3, 1, 8)
    return {
        "shaw_logits": (lambda q, k, t: pe.shaw_logits(q, k, t, max_distance=3), (q, k, table_k)),
        "shaw_logits offset": (lambda q, k, t, o: pe.shaw_logits(q, k, t, max_distance=3, offset=o), (q, k, table_k, torch.tensor(9))),
        "shaw_output": (lambda w, v, t: pe.shaw_output(w, v, t, max_distance=3, offset=5), (weights, v, table_v)),
        "shaw_output per row": (lambda w, v, t, o: pe.shaw_output(w, v, t, max_distance=3, offset=o), (weights, v, table_v, torch.arange(4))),
        "deberta_logits": (lambda q, k, a, b: pe.deberta_logits(q, k, a, b, max_distance=3), (q, k, pos, pos)),
        "deberta_logits buckets": (lambda q, k, a, b: pe.deberta_logits(q, k, a, b, max_distance=3, bucket_size=2, max_position=8), (q, k, pos, pos)),
        "xl_logits": (pe.xl_logits, (q, k, pos, u, u)),
        "tener_logits": (pe.tener_logits, (q, k, u, u)),
    }


_OWN_INDEX_CALLS = ["shaw_logits", "shaw_logits offset", "shaw_output", "shaw_output per row", "deberta_logits", "deberta_logits buckets", "xl_logits", "tener_logits"]


@pytest.mark.parametrize("name", _OWN_INDEX_CALLS)
def test_an_index_posenc_builds_is_not_read_back_on_the_cuda_path(monkeypatch, name):
    """The Toeplitz index of a relative logit or output is formed by posenc in ``[0, m)``
    (clipped distances, an ``arange``): the CUDA launcher reads none of its values back (a
    reduction and a synchronisation a call, one per batch row for one offset per row, on
    main; no CUDA graph could capture the call). The CUDA path is faked on torch CPU tensors
    (the simulator has no torch CUDA tensors)."""
    import gc

    torch = pytest.importorskip("torch")
    launches, bounds = _fake_cuda_toeplitz(monkeypatch, torch)
    from posenc import _built

    fn, args = _own_index_calls(torch)[name]
    for public in (pe.shaw_logits, pe.shaw_output, pe.deberta_logits, pe.xl_logits, pe.tener_logits):
        getattr(public, "plans", {}).clear()  # (a plan serves torch CPU tensors from a signature's third call)
    before = set(_built._RECORDED)
    fn(*args)
    assert launches and not bounds, (len(launches), len(bounds))
    gc.collect()
    assert set(_built._RECORDED) <= before  # (a record goes with its array)


@pytest.mark.parametrize("name", _OWN_INDEX_CALLS)
def test_an_index_posenc_builds_is_not_read_back_in_a_compiled_graph(monkeypatch, name):
    """Under ``torch.compile`` the Toeplitz op receives the graph's index, not the tensor
    posenc recorded while tracing: on main its CUDA launcher read each one back (1 a call, 2
    for DeBERTa's two terms, one per batch row for one offset per row: 4), so no compiled
    call could be captured in a CUDA graph. The graph now forms the index through
    ``posenc::index_in_range``, whose result the launcher takes unread. The CUDA path is
    faked on torch CPU tensors as above (the fake tensors tracing sees say "cpu")."""
    torch = pytest.importorskip("torch")
    launches, bounds = _fake_cuda_toeplitz(monkeypatch, torch)
    fn, args = _own_index_calls(torch)[name]
    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    for _ in range(2):
        compiled(*args)
    assert launches and not bounds, (len(launches), len(bounds))


@pytest.mark.parametrize("name", ["shaw_logits", "shaw_output per row"])
def test_an_index_posenc_builds_is_not_read_back_by_inductor_forward_or_backward(monkeypatch, name):
    """The same through inductor's generated code, and the backward's op (the adjoint,
    given the index saved by the forward): nothing read back (on main, 2 and 8 reads)."""
    torch = pytest.importorskip("torch")
    launches, bounds = _fake_cuda_toeplitz(monkeypatch, torch)
    fn, args = _own_index_calls(torch, grad=True)[name]
    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, backend="inductor")
    for _ in range(2):
        compiled(*args).sum().backward()
    assert len(launches) == 2 * (4 if "per row" in name else 1) * 2 and not bounds, (len(launches), len(bounds))


def test_an_index_inductor_writes_into_a_recorded_buffer_is_launched_in_range(monkeypatch):
    """Inductor reuses a buffer once its last reader in the graph is done: here the tensor
    ``posenc::index_in_range`` recorded for ``shaw_logits`` receives a caller's index (out of
    range) written by generated code, which bumps no version, and goes to a Toeplitz op. On
    main the launcher took it unread, a gather past the scores' row on a GPU; an index
    recorded in a compiled graph is now clamped into range on the device before the launch
    (posenc's own values unchanged), never read back."""
    torch = pytest.importorskip("torch")
    from posenc import _dispatch
    from posenc._kernels import _device_flat

    launches, bounds = _fake_cuda_toeplitz(monkeypatch, torch)
    launched = []
    device_values = _device_flat.device_values
    monkeypatch.setattr(_device_flat, "device_values", lambda a, dtype: launched.append(a.clone()) or device_values(a, dtype))

    def fn(q, k, table, scores, n):
        logits = pe.shaw_logits(q, k, table, max_distance=3)
        index = (torch.arange(9) * 0 + n).to(torch.int64)  # (the caller's, all n: out of [0, 7) for n = 50)
        return logits, _dispatch.call("toeplitz_gather", scores, index, 6)

    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, backend="inductor")
    g = torch.Generator().manual_seed(4)
    compiled(torch.randn(2, 3, 4, 8, generator=g), torch.randn(2, 3, 6, 8, generator=g), torch.randn(7, 8, generator=g), torch.zeros(4, 7), 50)
    indices = [a for a in launched if a.dtype == torch.int64 and a.ndim == 1 and a.shape[0] == 9]
    assert len(launches) == 2 and len(indices) == 2, (len(launches), len(indices))
    assert all(0 <= int(v) < 7 for a in indices for v in a), [a.tolist() for a in indices]


def test_an_index_a_caller_passes_is_checked_in_a_compiled_graph(monkeypatch):
    """A caller's index reaches the compiled graph's Toeplitz op as it was given: read back
    and checked on every call, out of range refused. ``posenc::index_in_range`` takes any
    index: what it records is clamped into its range, so no kernel reads out of bounds."""
    torch = pytest.importorskip("torch")
    from posenc import _dispatch

    launches, bounds = _fake_cuda_toeplitz(monkeypatch, torch)
    torch._dynamo.reset()
    gather = torch.compile(lambda s, i: _dispatch.call("toeplitz_gather", s, i, 3), fullgraph=True, backend="aot_eager")
    scores = torch.zeros(3, 4)
    gather(scores, torch.tensor([0, 1, 3, 0, 0]))
    gather(scores, torch.tensor([0, 1, 3, 2, 0]))
    assert len(bounds) == 2 and len(launches) == 2
    with pytest.raises(ValueError, match=r"index values must lie in \[0, 4\)"):
        gather(scores, torch.tensor([0, 1, 4, 0, 0]))
    assert len(bounds) == 3 and len(launches) == 2
    clamped = torch.ops.posenc.index_in_range(torch.tensor([-5, 1, 4, 0, 9]), 4)
    assert clamped.tolist() == [0, 1, 3, 0, 3]
    _dispatch.call("toeplitz_gather", scores, clamped, 3)
    assert len(bounds) == 3 and len(launches) == 3
    with pytest.raises(ValueError, match=r"index values must lie in \[0, 0\)"):
        _dispatch.call("toeplitz_gather", torch.zeros(3, 0), torch.ops.posenc.index_in_range(torch.tensor([0, 1, 0, 0, 0]), 0), 3)


def test_an_index_in_range_result_a_caller_writes_in_place_is_checked_again(monkeypatch):
    """``posenc::index_in_range`` called directly hands its recorded result to the caller: on
    main, one written in place after (``clamped[2] = 99``) still counted as in range, and the
    CUDA launcher read it unchecked (a gather past the scores' row). Its record now holds the
    tensor's version counter: a write since sends it to the check and its refusal."""
    torch = pytest.importorskip("torch")
    from posenc import _dispatch
    from posenc.torch import _ops  # noqa: F401  (registers the op)

    launches, bounds = _fake_cuda_toeplitz(monkeypatch, torch)
    scores = torch.zeros(3, 4)
    clamped = torch.ops.posenc.index_in_range(torch.tensor([0, 1, 3, 0, 0]), 4)
    _dispatch.call("toeplitz_gather", scores, clamped, 3)
    assert not bounds and len(launches) == 1
    clamped[2] = 99
    with pytest.raises(ValueError, match=r"index values must lie in \[0, 4\)"):
        _dispatch.call("toeplitz_gather", scores, clamped, 3)
    assert len(bounds) == 1 and len(launches) == 1


def test_an_index_a_caller_passes_is_checked_on_the_cuda_path(monkeypatch):
    """An index given to ``toeplitz_gather``/``toeplitz_scatter`` directly is read back and
    checked, as before: out of range, refused before any launch; a copy of an index posenc
    recorded, or one recorded with a larger bound than this call's, is checked too."""
    torch = pytest.importorskip("torch")
    from posenc import _dispatch
    from posenc._built import built_in_range

    launches, bounds = _fake_cuda_toeplitz(monkeypatch, torch)
    scores, weights = torch.zeros(3, 4), torch.zeros(3, 3)
    with pytest.raises(ValueError, match=r"index values must lie in \[0, 4\)"):
        _dispatch.call("toeplitz_gather", scores, torch.tensor([0, 1, 4, 0, 0]), 3)
    with pytest.raises(ValueError, match=r"index values must lie in \[0, 3\)"):
        _dispatch.call("toeplitz_scatter", weights, torch.tensor([0, 1, 2, 3, 0]), 3)
    assert len(bounds) == 2 and not launches
    recorded = built_in_range(torch.tensor([0, 1, 3, 0, 0]), 4)
    _dispatch.call("toeplitz_gather", scores, recorded, 3)
    assert len(bounds) == 2 and len(launches) == 1
    _dispatch.call("toeplitz_gather", scores, recorded.clone(), 3)
    assert len(bounds) == 3
    with pytest.raises(ValueError, match=r"index values must lie in \[0, 3\)"):
        _dispatch.call("toeplitz_scatter", weights, recorded, 3)
    assert len(bounds) == 4 and len(launches) == 2


def test_an_index_posenc_built_gives_the_kernels_values_unread(monkeypatch):
    """On numba device arrays (the simulator's, or a GPU's), a recorded index runs the same
    kernels to the reference's values without its range read; the same values unrecorded
    are read."""
    from posenc._kernels import toeplitz_cuda
    from posenc._built import built_in_range
    from posenc.relative import _toeplitz

    scores, weights, index = np.arange(10, dtype=np.float32).reshape(2, 5), np.ones((2, 3), np.float32), np.array([4, 0, 2, 1], np.int64)
    read, bounds = _arrays.bounds, []
    monkeypatch.setattr(_arrays, "bounds", lambda i: bounds.append(i) or read(i))
    recorded = built_in_range(_device(index), 5)
    gathered = toeplitz_cuda.toeplitz_gather(_device(scores), recorded, 3)
    scattered = toeplitz_cuda.toeplitz_scatter(_device(weights), recorded, 5)
    assert not bounds
    toeplitz_cuda.toeplitz_gather(_device(scores), _device(index), 3)
    assert len(bounds) == 1
    np.testing.assert_array_equal(to_host(gathered), _toeplitz.toeplitz_gather(scores, index, 3))
    np.testing.assert_array_equal(to_host(scattered), _toeplitz.toeplitz_scatter(weights, index, 5))


def test_out_the_kernel_cannot_write_is_refused():
    from numba import cuda

    from posenc._kernels import rope_cuda

    x = _device(np.zeros((2, 3, 4), np.float32))
    broadcast = _arrays.strided(cuda.to_device(np.zeros(4, np.float32)), (2, 3, 4), (0, 0, 1))  # every row the same memory
    _refused(rope_cuda.rotate_positions, (x, _device(np.arange(3)), np.ones(2)), {"out": broadcast}, ValueError, ["out", "each element once"])


def test_operands_a_launcher_cannot_write_or_read_safely_are_refused_before_any_launch(monkeypatch):
    """What a direct launch had accepted (the public functions refuse these first): an
    in-place ``x`` of a stride-0 axis (three rotations over one row), an ``out`` whose
    strides fold onto themselves, an ``out`` of another dtype (a float32 ``out`` of float16
    ``x`` had taken the bits of the wrong width), a Toeplitz ``out`` over part of its input
    (the kernel read what it had written), an overlapping ``out`` numba cannot copy into
    (it raised after the launch), ``cos``/``sin`` that are 0-d or of no pair (a bare
    ``IndexError``, or an unchanged ``q``), and a rotary ``out`` over the tables, the
    positions or the other one of q and k (the kernel read what it had written: a race on a
    GPU, between the heads' threads of a row)."""
    from numba import cuda

    from posenc._kernels import rope_cuda, toeplitz_cuda
    from posenc.rotary.apply import rotate_pair

    launches = counting_kernel_keys(monkeypatch, rope_cuda), counting_kernel_keys(monkeypatch, toeplitz_cuda)
    positions, inv_freq = _device(np.arange(3)), np.array([1.0, 0.1, 0.01, 0.001])
    row = _arrays.strided(cuda.to_device(np.ones(8)), (3, 8), (0, 1))
    _refused(rope_cuda.rotate_positions, (row, positions, inv_freq), {"out": row}, ValueError, ["out", "each element once"])
    x = _device(np.ones((3, 8)))
    folded = _arrays.strided(cuda.to_device(np.zeros(16)), (3, 8), (4, 1))
    _refused(rope_cuda.rotate_positions, (x, positions, inv_freq), {"out": folded}, ValueError, ["out", "each element once"])
    _refused(toeplitz_cuda.toeplitz_expand, (_device(np.arange(5.0)), 3, 3), {"out": _arrays.strided(cuda.to_device(np.zeros(8)), (3, 3), (2, 1))}, ValueError, ["out", "each element once"])
    half = _device(np.ones((3, 8), np.float16))
    _refused(rope_cuda.rotate_positions, (half, positions, inv_freq), {"out": _device(np.zeros((3, 8), np.float32))}, TypeError, ["out", "dtype"])
    memory = cuda.to_device(np.arange(19.0))
    _refused(toeplitz_cuda.toeplitz_expand, (memory[0:7], 4, 4), {"out": _arrays.strided(memory[3:], (4, 4), (4, 1))}, ValueError, ["out", "vec"])
    base = cuda.to_device(np.zeros((3, 9)))
    _refused(rope_cuda.rotate_positions, (_arrays.strided(base, (3, 8), (9, 1)), positions, inv_freq), {"out": _arrays.strided(base[0, 1:], (3, 8), (9, 1))}, ValueError, ["out", "non-contiguous"])
    q, k = _device(np.ones((1, 2, 3, 8), np.float32)), _device(np.ones((1, 1, 3, 8), np.float32))
    for table in (np.ones((3, 0), np.float32), np.ones((), np.float32)):
        _refused(rotate_pair, (q, k, _device(table), _device(table)), {}, ValueError, ["cos/sin", "do not fit"])
    tables, sin = cuda.to_device(np.ones((2, 3, 8), np.float32)), _device(np.ones((3, 8), np.float32))
    _refused(rope_cuda.rotate_cos_sin, (_device(np.ones((2, 3, 8), np.float32)), tables[0], sin), {"out": tables}, ValueError, ["out shares memory with cos"])
    _refused(rope_cuda.rotate_cos_sin, (tables, sin, tables[1]), {"out": tables}, ValueError, ["out shares memory with sin"])
    memory = cuda.to_device(np.zeros((3, 8)))
    _refused(rope_cuda.rotate_positions, (x, memory[:, 0], inv_freq), {"out": memory}, ValueError, ["out shares memory with positions"])
    both = cuda.to_device(np.ones((1, 2, 3, 8), np.float32))
    _refused(rope_cuda.rotate_cos_sin_pair, (q, both[:, :1], sin, sin), {"out_q": both}, ValueError, ["out_q shares memory with k"])
    _refused(rope_cuda.rotate_cos_sin_pair, (both, k, sin, sin), {"out_k": both[:, 1:]}, ValueError, ["out_k shares memory with q"])
    assert launches == ([], [])
    fused = cuda.to_device(np.ones((3, 2, 8), np.float32))  # q and k of one projection: disjoint elements, rotated in place
    q_rows, k_rows = fused[:, 0], fused[:, 1]
    assert rope_cuda.rotate_cos_sin_pair(q_rows, k_rows, sin, sin, out_q=q_rows, out_k=k_rows) == (q_rows, k_rows)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_rotate_pair_sends_q_and_k_to_one_launch(monkeypatch, dtype):
    """``posenc.rotary.apply.rotate_pair`` (under ``posenc.torch.hf.apply_rotary_pos_emb``): device
    q and k go to the CUDA kernel together, once (in words of two channels:
    ``rope_cuda.WORDS``); the results equal the reference's."""
    from posenc._kernels import rope_cuda
    from posenc.rotary.apply import rotate_pair

    launches = counting_kernel_keys(monkeypatch, rope_cuda)
    rng = np.random.default_rng(9)
    q, k = _hf_views(rng, 2, 4, 4, 8, dtype), _hf_views(rng, 2, 4, 2, 8, dtype)
    cos, sin = _tables(rng, 2, 4, 8, "half", dtype)
    got = rotate_pair(*(_device(a) for a in (q, k, cos, sin)))
    assert launches == [("apply", dtype, rope_cuda.WORDS_LAYOUT)]
    for g, a in zip(got, (q, k)):
        _close(g, _rotate.rotate_cos_sin(a.copy(), cos, sin), dtype)


def _apart(rng):
    """``(q, k, cos, sin)`` whose k cannot share q's launch, by what sets it apart, and one
    whose k can though its heads span two axes."""
    standard = rng.standard_normal
    heads = [t[:, :, None] for t in _tables(rng, 2, 5, 8, "half", "float64")]  # [b, 1, 1, s, d]: shared by two head axes
    return {
        # partial rotary tables (6 channels) beside q of 8 channels and k of 10
        "channels": (standard((2, 4, 3, 8)), standard((2, 2, 3, 10)), *_tables(rng, 2, 3, 6, "half", "float64")),
        # k [h, s, d] beside q [b, h, s, d], tables [s, d] broadcast over both
        "leading axes": (standard((2, 4, 3, 8)), standard((4, 3, 8)), *[t[0, 0] for t in _tables(rng, 1, 3, 8, "half", "float64")]),
        # two head axes, which merge into one in q; k takes the first two heads of the second (their strides do not merge)
        "head axes": (standard((2, 3, 4, 5, 8)), standard((2, 3, 4, 5, 8))[:, :, :2], *heads),
        # k takes every other head of the second: its two head axes merge too
        "head axes that merge": (standard((2, 3, 4, 5, 8)), standard((2, 3, 4, 5, 8))[:, :, ::2], *heads),
    }


@pytest.mark.parametrize("case", ["channels", "leading axes", "head axes", "head axes that merge"])
def test_q_and_k_share_a_launch_only_where_their_rows_line_up(monkeypatch, case):
    """``rotate_pair`` of a k whose channels, count of leading axes or head axes do not line
    up with q's (``_device_flat.NotAligned``): one launch each, each the reference's values;
    one launch for both where k's two head axes merge, as q's do, though it has fewer heads."""
    from posenc._kernels import rope_cuda
    from posenc.rotary.apply import rotate_pair

    q, k, cos, sin = _apart(np.random.default_rng(13))[case]
    launches = counting_kernel_keys(monkeypatch, rope_cuda)
    got = rotate_pair(*(_device(a) for a in (q, k, cos, sin)))
    assert launches == [("apply", "float64", "half")] * (1 if case == "head axes that merge" else 2)
    for g, a in zip(got, (q, k)):
        np.testing.assert_array_equal(to_host(g), _rotate.rotate_cos_sin(a.copy(), cos, sin))


def test_an_out_overlapping_x_other_than_exactly_gets_the_reference_values():
    """``out`` one element past ``x`` in the same memory: computed aside, then copied in."""
    from numba import cuda

    from posenc._kernels import rope_cuda

    rng = np.random.default_rng(10)
    memory = cuda.to_device(rng.standard_normal(3 * 8 + 1))
    x = _arrays.strided(memory, (3, 8), (8, 1))
    out = _arrays.strided(memory[1:], (3, 8), (8, 1))
    positions, inv_freq = np.arange(3), np.array([1.0, 0.1, 0.01, 0.001])
    want = _rotate.rotate_positions(x.copy_to_host(), positions, inv_freq)
    assert rope_cuda.rotate_positions(x, _device(positions), inv_freq, out=out) is out
    _close(out, want, "float64")


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32", "float64"])
@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("heads", [3, 11, 27])
def test_cuda_rotation_is_within_one_ulp_of_the_cpu_kernel(dtype, layout, heads):
    """The same HF-layout rotation by the CUDA kernel and by the Numba CPU kernel (angles up to
    5e5 radians from the same float64 products): one ulp of the dtype at the result, plus, for
    the results that cancel in ``a*cos - b*sin``, a few ulps of the inputs' magnitude (the CPU
    kernel's cos and sin are within 2**-52 absolute, docs/precision)."""
    from arrays import EPS, ulp

    from posenc._kernels import rope_cpu, rope_cuda

    rng = np.random.default_rng(11)
    x = _hf_views(rng, 2, 6, heads, 16, dtype)
    positions = rng.integers(0, 500_000, (2, 1, 6))
    inv_freq = 10000.0 ** -(np.arange(8) / 8)
    cpu = rope_cpu.rotate_positions(x.copy(), positions, inv_freq, layout=layout).astype(np.float64)
    gpu = to_host(rope_cuda.rotate_positions(_device(x), _device(positions), inv_freq, layout=layout)).astype(np.float64)
    assert np.all(np.abs(gpu - cpu) <= ulp(cpu, dtype) + 4 * EPS[dtype] * np.abs(x.astype(np.float64)).max())


@pytest.mark.parametrize("op", ["rotate", "apply"])
@pytest.mark.parametrize("where", ["words", "one channel at a time"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_a_head_rotates_to_the_same_bits_alone_or_among_others(dtype, where, op):
    """A thread rotates its heads eight at a time (16-bit elements), then four, then one at a
    time: 27 heads (16-bit: one thread takes all 27, ``rope_apply`` in words loading the
    first eight before its tables; float32: two y threads, 14 and 13 heads each) against
    each head alone (one at a time only), bit for bit, so no result depends on how many
    heads share a call; in words of two channels, and one channel at a time (the same
    values one element into their memory)."""
    from posenc._kernels import rope_cuda

    rng = np.random.default_rng(12)
    x = _hf_views(rng, 2, 3, 27, 16, dtype)
    positions = _device(rng.integers(0, 500_000, (2, 1, 3)))
    inv_freq = 10000.0 ** -(np.arange(8) / 8)
    cos, sin = (_device(t) for t in _tables(rng, 2, 3, 16, "half", dtype))
    placed = np.ascontiguousarray if where == "words" else _one_element_on

    def rotated(a):
        if op == "apply":
            return to_host(rope_cuda.rotate_cos_sin(_device(placed(a)), cos, sin))
        return to_host(rope_cuda.rotate_positions(_device(placed(a)), positions, inv_freq))

    together = rotated(x)
    for h in range(x.shape[1]):
        np.testing.assert_array_equal(together[:, h], rotated(x[:, h : h + 1])[:, 0])


def _one_element_on(a):
    """``a``'s values in a host array that starts one element into its memory (so on a
    device one element past an address the kernels' words could be read at)."""
    buffer = np.zeros(a.size + 1, a.dtype)
    view = buffer[1:].reshape(a.shape)
    view[...] = a
    return view


def _rotated_on_device(op, x, positions, inv_freq, cos, sin, *, layout="half", out=None):
    """``rope_cuda``'s ``op`` of host arrays on the device, ``out``: ``None``, ``"x"`` (in
    place) or a host array (a device buffer)."""
    from posenc._kernels import rope_cuda

    x = _device(x)
    out = x if isinstance(out, str) else None if out is None else _device(out)
    if op == "rotate":
        return to_host(rope_cuda.rotate_positions(x, _device(positions), inv_freq, layout=layout, out=out))
    return to_host(rope_cuda.rotate_cos_sin(x, _device(cos), _device(sin), layout=layout, out=out))


@pytest.mark.parametrize("rotary", [16, 8], ids=["every channel", "partial rotary"])
@pytest.mark.parametrize("in_place", [False, True], ids=["new result", "in place"])
@pytest.mark.parametrize("op", ["rotate", "apply"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_words_of_two_channels_give_the_bits_of_one_channel_at_a_time(monkeypatch, dtype, op, in_place, rotary):
    """Where every operand allows, the "half"-layout kernels read and write words of two
    adjacent channels (``rope_cuda.WORDS``): the same bits as the kernel of one channel at a
    time, which the same values one element further on take (27 heads of Hugging Face's
    layout: every loop over a thread's heads; with pass-through channels, copied as words)."""
    from posenc._kernels import rope_cuda

    keys = counting_kernel_keys(monkeypatch, rope_cuda)
    rng = np.random.default_rng(13)
    x = rng.standard_normal((2, 3, 27, 16)).astype(dtype)
    positions = rng.integers(0, 500_000, (2, 1, 3))
    inv_freq = 10000.0 ** -(np.arange(rotary // 2) / (rotary // 2))
    cos, sin = _tables(rng, 2, 3, rotary, "half", dtype)
    out = "x" if in_place else None
    words = _rotated_on_device(op, x.transpose(0, 2, 1, 3), positions, inv_freq, cos, sin, out=out)
    elements = _rotated_on_device(op, _one_element_on(x).transpose(0, 2, 1, 3), positions, inv_freq, cos, sin, out=out)
    assert [key[2] for key in keys] == [rope_cuda.WORDS_LAYOUT, "half"]
    bits = f"u{x.dtype.itemsize}"
    np.testing.assert_array_equal(words.view(bits), elements.view(bits))


def _words_refused(rng, case):
    """``(x, out, layout, dtype, rotary)`` of a call some operand of which cannot be read in words."""
    dtype = "float64" if case == "float64" else "float32"
    layout, rotary, out = "interleaved" if case == "interleaved" else "half", 6 if case == "an odd number of pairs" else 16, None
    x = rng.standard_normal((2, 4, 3, 16)).astype(dtype)
    if case == "channels two apart":
        x = rng.standard_normal((2, 4, 3, 32)).astype(dtype)[..., ::2]
    elif case == "an odd stride":
        x = rng.standard_normal((2, 4, 3, 17)).astype(dtype)[..., :16]
    elif case == "out one element off":
        out = _one_element_on(np.zeros(x.shape, dtype))
    return x, out, layout, dtype, rotary


@pytest.mark.parametrize("op", ["rotate", "apply"])
@pytest.mark.parametrize("case", ["channels two apart", "an odd stride", "an odd number of pairs", "out one element off", "float64", "interleaved"])
def test_the_kernel_moves_one_channel_at_a_time_where_an_operand_does_not_allow_words(monkeypatch, case, op):
    """Words (of two channels, or four) only where every operand's channels are adjacent, its
    other strides even, its address a multiple of a word, the pairs and channels even, the
    layout "half" and the elements 16- or 32-bit; otherwise the kernel of one channel at a
    time, with the reference's values."""
    from posenc._kernels import rope_cuda

    keys = counting_kernel_keys(monkeypatch, rope_cuda)
    rng = np.random.default_rng(14)
    x, out, layout, dtype, rotary = _words_refused(rng, case)
    positions = rng.integers(0, 5_000, (1, 3))
    inv_freq = 10000.0 ** -(np.arange(rotary // 2) / (rotary // 2))
    cos, sin = _tables(rng, 2, 3, rotary, layout, dtype)
    got = _rotated_on_device(op, x, positions, inv_freq, cos, sin, layout=layout, out=out)
    assert [key[2] for key in keys] == [layout]
    if op == "rotate":
        want = _rotate.rotate_positions(x.copy(), positions, inv_freq, layout=layout)
    else:
        want = _rotate.rotate_cos_sin(x.copy(), cos, sin, layout=layout)
    _close(got, want, dtype)


def test_q_and_k_take_one_channel_at_a_time_where_k_starts_between_words(monkeypatch):
    """q in words of two channels, k one element into its memory: one launch for both, one
    channel at a time, with the reference's values."""
    from posenc._kernels import rope_cuda

    keys = counting_kernel_keys(monkeypatch, rope_cuda)
    rng = np.random.default_rng(15)
    q, k = _hf_views(rng, 2, 4, 4, 8, "bfloat16"), _hf_views(rng, 2, 4, 2, 8, "bfloat16")
    k = _one_element_on(k.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)
    cos, sin = _tables(rng, 2, 4, 8, "half", "bfloat16")
    got = rope_cuda.rotate_cos_sin_pair(*(_device(a) for a in (q, k, cos, sin)))
    assert keys == [("apply", "bfloat16", "half")]
    for g, a in zip(got, (q, k)):
        _close(g, _rotate.rotate_cos_sin(a.copy(), cos, sin), "bfloat16")


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_cuda_16_bit_rotation_is_within_one_ulp_of_float64_under_cancellation(dtype, layout):
    """The CUDA kernel rotates 16-bit elements in float32, ``cos`` and ``sin`` cut into a head
    whose products with the elements are exact and a rest: ``a*cos - b*sin`` with ``a == b``
    at angles near pi/4 cancels up to 23 bits, where plain float32 would be many ulps off; the
    result stays within one ulp of float64 (angles given as float positions at frequency 1)."""
    from arrays import ulp

    from posenc._kernels import rope_cuda

    rng = np.random.default_rng(13)
    rows, pairs = 48, 3
    a = rng.uniform(0.5, 2.0, (rows, pairs)).astype(dtype).astype(np.float64)
    angle = np.pi / 4 + np.pi * rng.integers(0, 1000, rows) + rng.choice([-1, 1], rows) * 10.0 ** rng.uniform(-7, -2, rows)
    c, s = np.cos(angle)[:, None], np.sin(angle)[:, None]
    exact = np.stack([a * c - a * s, a * c + a * s], axis=-1)
    if layout == "half":
        x, exact = np.concatenate([a, a], -1), np.concatenate([exact[..., 0], exact[..., 1]], -1)
    else:
        x, exact = np.repeat(a, 2, -1), exact.reshape(rows, 2 * pairs)
    got = to_host(rope_cuda.rotate_positions(_device(x.astype(dtype)), _device(angle), np.ones(pairs), layout=layout))
    assert np.all(np.abs(got.astype(np.float64) - exact) <= ulp(exact, dtype))


# (inf * 0 makes the NaNs meant here; NumPy, which runs the simulator's threads and the reference, says so)
@pytest.mark.filterwarnings("ignore:.*invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_cuda_16_bit_rotation_keeps_infinities_as_float64_does(dtype):
    """An infinite element stays out of the rests' terms of the float32 rotation (they take
    it clamped to the largest float32), so that it never makes ``inf * 0`` there: the
    infinities and NaNs are those of the float64 formula, the finite results within one ulp
    of it."""
    from arrays import assert_float64_specials

    from posenc._kernels import rope_cuda

    rng = np.random.default_rng(14)
    x = rng.standard_normal((2, 3, 6, 8)).astype(dtype)
    x[..., 0], x[..., 5], x[0, 1, 2, 2] = np.inf, -np.inf, np.nan
    positions, inv_freq = rng.integers(0, 10_000, (2, 1, 6)), 10000.0 ** -(np.arange(4) / 4)
    positions[..., 0] = 0  # cos 1 and sin 0: rests of zero, which an infinity turns to NaN
    want = _rotate.rotate_positions(x.astype(np.float64), positions, inv_freq)
    got = to_host(rope_cuda.rotate_positions(_device(x), _device(positions), inv_freq)).astype(np.float64)
    assert_float64_specials(got, want, dtype)


@pytest.mark.filterwarnings("ignore:.*(overflow|invalid value) encountered:RuntimeWarning")
@pytest.mark.parametrize("dtype", ["bfloat16", "float32", "float64"])
def test_an_angle_beyond_float64_gives_nan_channels_as_the_reference(dtype):
    """Position ``1e308`` at frequency 2: an angle that overflows float64 has no cosine, so
    its channels are NaN (docs/precision.md), on the device (libdevice's ``sincos``) and in
    the simulator (whose Python ``sin`` and ``cos`` raised ``ValueError``)."""
    from posenc._kernels import rope_cuda

    x, positions, inv_freq = np.ones((2, 4), dtype), np.array([1e308, 3.0]), np.array([2.0, 0.5])
    want = _rotate.rotate_positions(x.astype(np.float64), positions, inv_freq)
    got = to_host(rope_cuda.rotate_positions(_device(x), _device(positions), inv_freq)).astype(np.float64)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    assert np.isnan(got[0, [0, 2]]).all()
    _close(got[1], want[1], dtype)


# (inf * 0 makes the NaNs meant here; NumPy, which runs the simulator's threads and the reference, says so)
@pytest.mark.filterwarnings("ignore:.*invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_cuda_16_bit_apply_with_infinite_tables_gives_the_float64_formulas_values(dtype):
    """An infinite ``cos``/``sin`` entry is its own head with a rest of 0, not ``inf - inf``:
    the infinities and NaNs of the float64 formula (as the CPU kernel, and the fused formula
    of a compiled call, give them)."""
    from arrays import assert_float64_specials

    from posenc._kernels import rope_cuda

    rng = np.random.default_rng(16)
    x = rng.standard_normal((2, 3, 5, 8)).astype(dtype)
    cos, sin = (rng.uniform(-1, 1, (5, 8)).astype(dtype) for _ in range(2))
    cos[1, :2], sin[2, 4:6], cos[3, 1], sin[3, 1] = np.inf, -np.inf, np.inf, np.inf
    want = _rotate.rotate_cos_sin(*(t.astype(np.float64) for t in (x, cos, sin)))
    got = to_host(rope_cuda.rotate_cos_sin(_device(x), _device(cos), _device(sin))).astype(np.float64)
    assert_float64_specials(got, want, dtype)


def test_direct_launch_lays_out_arguments_as_numba_does():
    """On a GPU, ``_device_flat.launch`` hands the driver numba's layout of each argument
    (a 1-D C array as meminfo, parent, size, itemsize, data, shape, stride), checked against
    the kernel's signature: a wrong element type or tuple length is refused, never launched.
    The driver receives each parameter as the 8 bytes of an int64 or a float64."""
    from numba import types

    from posenc._kernels import _device_flat

    writers = _device_flat.parameter_writers(
        (types.Array(types.uint16, 1, "C"), types.UniTuple(types.int64, 3), types.int64, types.float64)
    )
    params = []
    arguments = (_device_flat.Flat(4096, 10, np.dtype(np.uint16)), (1, -2, 3), 7, 0.5)
    for write, a in zip(writers, arguments):
        write(a, params)
    assert params == [0, 0, 10, 2, 4096, 10, 2, 1, -2, 3, 7, 0.5]
    assert [type(p) for p in params] == [int] * 11 + [float]
    assert _driver_bytes(params) == np.array(params[:-1], np.int64).tobytes() + np.float64(0.5).tobytes()
    with pytest.raises(TypeError, match="reads uint16"):
        writers[0](_device_flat.Flat(4096, 10, np.dtype(np.float32)), [])
    with pytest.raises(TypeError, match="reads 3"):
        writers[1]((1, 2), [])
    with pytest.raises(TypeError, match="no direct launch"):
        _device_flat.parameter_writers((types.Array(types.float32, 2, "C"),))


def _driver_bytes(params):
    """The parameter bytes ``cuda.core.launch`` hands the driver for ``params`` (its ``ParamHolder``)."""
    import ctypes

    handler = pytest.importorskip("cuda.core._kernel_arg_handler")
    held = handler.ParamHolder(params)
    addresses = (ctypes.c_void_p * len(params)).from_address(held.ptr)
    return b"".join([ctypes.string_at(a, 8) for a in addresses])


def _numba_device_contexts(monkeypatch, current):
    """Device contexts as ``_arrays.on_device`` sees them: each GPU's primary context is
    ``10 + index``, the thread's current one ``current[0]``; numba's manager of GPU ``i``
    (``cuda.gpus[i]``) makes ``10 + i`` current and restores the one before."""
    import contextlib

    from numba import cuda

    class Gpus:
        def __getitem__(self, index):
            @contextlib.contextmanager
            def manager():
                before, current[0] = current[0], 10 + index
                yield
                current[0] = before

            return manager()

    monkeypatch.setattr(cuda, "gpus", Gpus())
    monkeypatch.setattr(_arrays, "current_context", lambda: current[0])
    monkeypatch.setattr(_arrays, "_primary_context", lambda index: 10 + index)


def test_a_launch_enters_numbas_device_context_only_where_another_is_current(monkeypatch):
    """``_arrays.on_device``: a launch on GPU ``i`` runs in its primary context; numba's
    context manager (a push and a pop through Python) is entered only where another context
    is current on the thread (torch and CuPy make it current on the threads they use)."""
    current = [11]
    _numba_device_contexts(monkeypatch, current)
    inside = []
    for index, now in ((1, 11), (0, 11), (1, 0), (1, 10)):
        current[0] = now
        with _arrays.on_device(index):
            inside.append(current[0])
        assert current[0] == now
    assert inside == [11, 10, 11, 11]


def test_a_span_reads_each_librarys_own_metadata(monkeypatch):
    """``_device_flat.span`` of a CuPy array (byte strides) and of a numba device array on a
    GPU (its device pointer; neither exists here, so each is stood in for by its metadata
    over a NumPy array's memory): the address, shape and element strides of the view,
    negative and transposed ones too, 16-bit floats as ``uint16`` bits (or every element as
    its unsigned width); CuPy positions converted by CuPy's own ``astype`` (``device_values``)."""
    import types as pytypes

    from posenc._kernels import _device_flat

    class Cupy:
        def __init__(self, a):
            self.data, self.shape, self.strides, self.dtype = pytypes.SimpleNamespace(ptr=a.ctypes.data), a.shape, a.strides, a.dtype
            self.astype = a.astype

    class NumbaOnGpu:
        __module__ = "numba.cuda.cudadrv.devicearray"

        def __init__(self, a):
            self.device_ctypes_pointer, self.shape, self.strides, self.dtype = pytypes.SimpleNamespace(value=a.ctypes.data), a.shape, a.strides, a.dtype

    monkeypatch.setattr(_arrays._compat, "is_cupy_array", lambda a: type(a) is Cupy)
    base = np.arange(60, dtype=np.float16).reshape(3, 4, 5)
    for view in (base, base[:, ::-2, 1:].transpose(2, 0, 1)):
        want = _device_flat.Span(view.ctypes.data, view.shape, tuple(st // 2 for st in view.strides), np.dtype(np.uint16))
        for stand_in in (Cupy(view), NumbaOnGpu(view)):
            assert _device_flat.span(stand_in) == want
            assert _device_flat.span(stand_in, unsigned=True) == want
            assert _device_flat.span(stand_in, bits16=False) == want._replace(dtype=np.dtype(np.float16))
    positions = np.array([3, 1, 2], np.int32)
    assert np.array_equal(_device_flat.device_values(Cupy(positions), np.float64), positions.astype(np.float64))


def test_a_flat_argument_read_as_words_is_whole_words_or_refused():
    """``_device_flat.words`` on a GPU's flat argument (``Flat``): the same memory and owner
    counted in words; an address or a size in bytes that is not a multiple of the word's
    size is a ``ValueError`` (a kernel would read past the array), never a launch."""
    from posenc._kernels import _device_flat

    owner, u16, u32 = object(), np.dtype(np.uint16), np.dtype(np.uint32)
    assert _device_flat.words(_device_flat.Flat(4096, 6, u16, owner), u32) == (4096, 3, u32, owner)
    for address, size in ((4098, 6), (4096, 5)):
        with pytest.raises(ValueError, match="not whole words of 4 bytes"):
            _device_flat.words(_device_flat.Flat(address, size, u16), u32)


def test_the_kept_constants_are_the_last_64_and_one_dropped_is_made_again(monkeypatch):
    """``_device_flat.constant``: the last ``_KEPT`` constants are kept (a dynamic-NTK decode
    loop brings new frequencies each step), the oldest dropped first; one dropped is copied
    again when asked for, one kept is not."""
    import types as pytypes

    from posenc._kernels import _device_flat

    copies = []

    def to_device(values, stream):
        copies.append(values.tolist())
        return values

    monkeypatch.setattr(_device_flat, "cuda", pytypes.SimpleNamespace(to_device=to_device))
    monkeypatch.setattr(_device_flat, "_constants", type(_device_flat._constants)())
    monkeypatch.setattr(_arrays, "cuda_simulator", lambda: True)
    stream = pytypes.SimpleNamespace(synchronize=lambda: None)
    made = [_device_flat.constant(0, np.array([float(n)]), stream) for n in range(_device_flat._KEPT + 2)]
    assert len(_device_flat._constants) == _device_flat._KEPT and len(copies) == _device_flat._KEPT + 2
    assert _device_flat.constant(0, np.array([float(_device_flat._KEPT + 1)]), stream) is made[-1] and len(copies) == _device_flat._KEPT + 2
    assert _device_flat.constant(0, np.array([0.0]), stream) is not made[0] and copies[-1] == [0.0]


def test_a_prepared_launch_changes_only_the_addresses_it_names(monkeypatch):
    """``_device_flat.Prepared`` (the CUDA plans' launch): each call hands the driver the
    parameters of its build but for the data pointers of the arrays given by role, in its
    device's primary context whatever context is current on the calling thread."""
    from numba import types

    from posenc._kernels import _device_flat

    launched, current = [], [11]
    writers = _device_flat.parameter_writers((types.Array(types.float32, 1, "C"), types.UniTuple(types.int64, 2), types.Array(types.int64, 1, "C")))

    def direct(kernel, device):
        return "function", writers, lambda stream, config, function, *params: launched.append((current[0], params)), lambda grid, block: (grid, block), kernel

    _numba_device_contexts(monkeypatch, current)
    monkeypatch.setattr(_device_flat, "_direct_launch", direct)
    monkeypatch.setattr(_device_flat, "_core_stream", lambda stream: stream)
    x, positions = _device_flat.Flat(1000, 8, np.dtype(np.float32)), _device_flat.Flat(2000, 1, np.dtype(np.int64))
    prepared = _device_flat.Prepared([("kernel", 3, (64, 2, 2), (x, (5, 6), positions))], 1, {1000: "x", 2000: "positions"})
    assert prepared.ready
    prepared("stream", {"x": 4096, "positions": 8192})
    current[0] = 0  # a thread with no current context (or another device's)
    prepared("stream", {"x": 112, "positions": 224})
    (context, first), (second_context, second) = launched
    assert first[:7] == (0, 0, 8, 4, 4096, 8, 4) and first[9:] == (0, 0, 1, 8, 8192, 1, 8)
    assert len(launched) == 2 and second[4] == 112 and second[13] == 224
    assert first[7:9] == second[7:9] == (5, 6)
    assert context == second_context == 11 and current[0] == 0


def test_a_prepared_launch_is_not_ready_where_a_role_names_no_argument(monkeypatch):
    """A plan's role whose address no launch argument has (a table viewed at another
    address than the caller's array, say) would launch every call with the build's
    address: such a ``Prepared`` is not ``ready`` (its call keeps the full path)."""
    device_flat, _ = _fake_driver(monkeypatch, capturing=False)
    x, freqs = device_flat.Flat(1000, 8, np.dtype(np.float32)), device_flat.Flat(5000, 4, np.dtype(np.float64))
    launches = [("kernel", 1, (32, 1, 1), (freqs, x))]
    assert device_flat.Prepared(launches, 0, {1000: "x"}).ready
    assert not device_flat.Prepared(launches, 0, {1000: "x", 3000: "cos"}).ready
    assert not device_flat.Prepared(launches, 0, {1004: "x"}).ready  # (inside x, not its first element)


def _fake_plan_launches(monkeypatch, torch, element=np.float32):
    """The CUDA plans (``rope_cuda_plan``) built and launched on torch CPU tensors standing in
    for CUDA ones: the launchers' geometry (``apply_rotation``, ``pair_rotation``) gives a
    launch of three arrays and three ints per two operands, the driver is a list. The kernel
    reads its arrays as ``element`` (``np.uint64``: float32 channels in words of two)."""
    import contextlib
    import types as pytypes

    import numba
    from numba import types

    from posenc._kernels import _device_flat, rope_cuda

    launched = []
    writers = _device_flat.parameter_writers((types.Array(numba.from_dtype(np.dtype(element)), 1, "C"), types.int64) * 3)

    def direct(kernel, device):
        return "function", writers, lambda stream, config, function, *params: launched.append(params), lambda grid, block: (grid, block), kernel

    def flat(a):
        return _device_flat.Flat(a.data_ptr(), a.numel() * 4 // np.dtype(element).itemsize, np.dtype(element))

    def operand(x, out):
        return pytypes.SimpleNamespace(result=torch.empty(x.shape) if out is None else out)

    def apply_rotation(x, cos, sin, *, out, **_):
        result = operand(x, out)
        return result, [("kernel", 1, (32, 1, 1), (flat(x), 1, flat(result.result), 2, flat(cos), 3)), ("kernel", 1, (32, 1, 1), (flat(sin), 4, flat(x), 5, flat(x), 6))]

    def pair_rotation(q, k, cos, sin, **_):
        results = [operand(x, None) for x in (q, k)]
        flats = [flat(a) for a in (q, k, cos, sin, results[0].result, results[1].result)]
        return results, [("kernel", 1, (32, 1, 1), (flats[0], 1, flats[4], 2, flats[1], 3)), ("kernel", 1, (32, 1, 1), (flats[5], 4, flats[2], 5, flats[3], 6))]

    monkeypatch.setattr(_device_flat, "_direct_launch", direct)
    monkeypatch.setattr(_device_flat, "_core_stream", lambda stream: stream)
    monkeypatch.setattr(_device_flat, "capturing", lambda stream: False)
    monkeypatch.setattr(_arrays, "on_device", lambda index: contextlib.nullcontext())
    monkeypatch.setattr(_arrays, "torch_stream", lambda torch, index: 0)
    monkeypatch.setattr(rope_cuda, "_context", lambda x: ("stream", contextlib.nullcontext(), 0))
    monkeypatch.setattr(rope_cuda, "apply_rotation", apply_rotation)
    monkeypatch.setattr(rope_cuda, "pair_rotation", pair_rotation)
    return launched


def _fake_rotation(monkeypatch, torch, element=np.float32):
    """``rope_cuda``'s rotation faked for ``rope_cuda_plan.RotatePlan`` (a launch of x, the
    result and the positions, by address, read as ``element``: ``_fake_plan_launches``);
    returns the list of the positions each call of the plan hands the kernel."""
    import types as pytypes

    from posenc._kernels import _device_flat, rope_cuda, rope_cuda_plan

    def flat(address, count):
        return _device_flat.Flat(address, count * 4 // np.dtype(element).itemsize, np.dtype(element))

    def rotation(x, positions, inv_freq, *, out, **_):
        result = pytypes.SimpleNamespace(x_flat=flat(x.data_ptr(), x.numel()))
        result.o_flat = result.x_flat if out is x else flat(torch.empty(x.shape).data_ptr(), x.numel())
        positions_flat = flat(positions.data_ptr(), positions.numel())
        return result, [("kernel", 1, (32, 1, 1), (result.x_flat, 1, result.o_flat, 2, positions_flat, 3))], positions_flat

    _fake_plan_launches(monkeypatch, torch, element)
    monkeypatch.setattr(rope_cuda, "guard_rotate", lambda x, positions, inv_freq, out: inv_freq)
    monkeypatch.setattr(rope_cuda, "kernel_positions", lambda positions: positions)
    monkeypatch.setattr(rope_cuda, "rotation", rotation)
    formed, geometry = [], rope_cuda_plan._geometry
    monkeypatch.setattr(rope_cuda_plan, "_geometry", lambda a: formed.append(a) or geometry(a))
    return formed


def test_a_rope_plan_without_positions_keeps_no_array_and_makes_each_calls_arange(monkeypatch):
    """``rope_cuda_plan.RotatePlan`` of ``rope(x, offset=...)``: the arange its build's parse
    made is not kept (a device array kept by a plan would be read by calls on other streams
    before its writes, and by a captured graph after the plan is gone); each call forms the
    positions ``offset .. offset + n - 1`` itself, as int64."""
    import types as pytypes

    torch = pytest.importorskip("torch")
    from posenc._kernels import rope_cuda_plan, rope_plan

    formed = _fake_rotation(monkeypatch, torch)
    x, base = torch.randn(1, 4, 3, 8), torch.arange(3).reshape(1, 1, 3)
    call = pytypes.SimpleNamespace(positions=base + 2, inv_freq=np.ones(4), inverse=False, scale=1.0)
    plan = rope_cuda_plan.RotatePlan(x, call, rope_plan._Source(None, base, None, "small", None), False, "half")
    assert plan.ready
    kept = [*vars(plan).values(), *vars(plan.source).values()]
    assert not any(isinstance(v, torch.Tensor) for v in kept)
    formed.clear()
    for offset in (5, 0, 2**40):
        plan((x,), {"offset": offset})
    assert [f.dtype for f in formed] == [torch.int64] * 3
    assert [f.flatten().tolist() for f in formed] == [[5, 6, 7], [0, 1, 2], [2**40, 2**40 + 1, 2**40 + 2]]


# name: (torch, t) -> (positions or None, offset): CPU tensors, made FakeCuda ones (an int stays an int)
SUMMED_ON_DEVICE = {
    "0-d offset": lambda torch, t: (None, torch.tensor(t)),
    "per-row offset": lambda torch, t: (None, torch.tensor([t, t // 3])),
    "int64 positions, int offset": lambda torch, t: (torch.tensor([7, 8, 2**40]), t),
    # (on main: int64 sums, whose float64 rounding is not the float64 sum's past 2**53, and a read past 2**62)
    "int32 positions, int offset": lambda torch, t: (torch.tensor([1, 2, 3], dtype=torch.int32), t),
    "int32 positions [B, S], 0-d offset": lambda torch, t: (torch.tensor([[1, 2, 3], [4, 5, 6]], dtype=torch.int32), torch.tensor(t)),
    "int64 positions, per-row offset": lambda torch, t: (torch.tensor([0, 1, 2**52 + 1]), torch.tensor([t, -(t // 2)])),
    "int32 offset, per row": lambda torch, t: (None, torch.tensor([t % 2**31, 7], dtype=torch.int32)),
    "float32 positions, 0-d offset": lambda torch, t: (torch.tensor([0.5, 1.25, 3.0]), torch.tensor(t)),
    "float16 positions, per-row offset": lambda torch, t: (torch.tensor([2045.0, 2046.0, 2047.0]).half(), torch.tensor([t, 3])),
}
# ints, the float64 rounding of their sums, and past int64 (the full path's float64 sums, unread)
SUMMED_STEPS = (5, 2**40, 2**53 - 8, -(2**52), 2**60 + 128, 2**63 - 1, -(2**63), 0)


@pytest.mark.parametrize("name", SUMMED_ON_DEVICE)
def test_a_rope_cuda_plan_sums_an_offset_on_the_device_as_the_full_path_reading_nothing(monkeypatch, name):
    """``rope_cuda_plan.RotatePlan`` of a call whose full path sums positions and offset in
    float64 on the device unread (``rotary._args.shifted``: an offset tensor, 0-d or per
    row, or given positions with an int offset) serves it with the same float64 sums, bit
    for bit (the full path's ``parse_rope`` positions, on ``fake_cuda`` tensors), reading
    nothing back (``fake_cuda.recording``), at offsets up to int64's ends (on main such a
    call returned NotImplemented: the full path, its host work and, before, its reads)."""
    import inspect

    torch = pytest.importorskip("torch")
    import fake_cuda
    from posenc._kernels import rope_cuda_plan, rope_plan
    from posenc.rotary._call import parse_rope

    formed = _fake_rotation(monkeypatch, torch)
    options = dict(inspect.unwrap(pe.rope).__kwdefaults__)

    def arguments(t):
        return tuple(a if a is None or type(a) is int else fake_cuda.cuda(a) for a in SUMMED_ON_DEVICE[name](torch, t))

    with fake_cuda.recording() as log:
        x = fake_cuda.cuda(torch.randn(2, 4, 3, 8))
        positions, offset = arguments(3)
        call = parse_rope(x, positions, **{**options, "offset": offset})
        plan = rope_cuda_plan.RotatePlan(x, call, rope_plan._source(call, positions, offset), False, "half")
        assert plan.ready and not plan.counting
        for t in SUMMED_STEPS:
            positions, offset = arguments(t)
            expected = fake_cuda.host(parse_rope(x, positions, **{**options, "offset": offset}).positions)
            log.clear()
            formed.clear()
            result = plan((x,) if positions is None else (x, positions), {"offset": offset})
            if type(offset) is int and offset == 0 and positions is not None:
                continue  # (the int64 positions as they are: not summed)
            assert result is not NotImplemented and isinstance(result, fake_cuda.FakeCuda), t
            assert log.lines() == [], t
            (held,) = formed
            assert expected.dtype == torch.float64 and torch.equal(fake_cuda.host(held).flatten(), expected.flatten()), (t, held, expected)


def test_a_rope_cuda_plan_for_int64_positions_serves_an_int_offset_only_where_its_sums_are_the_full_paths(monkeypatch):
    """A plan built at offset 0 launches the kernel of int64 positions; a later call with an
    int offset, which the full path sums in float64, is served by int64 sums only where they
    round to the same float64 values (positions of at most 32 bits, |offset| <= 2**53)."""
    import inspect

    torch = pytest.importorskip("torch")
    import fake_cuda
    from posenc._kernels import rope_cuda_plan, rope_plan
    from posenc.rotary._call import parse_rope

    formed = _fake_rotation(monkeypatch, torch)
    options = dict(inspect.unwrap(pe.rope).__kwdefaults__)
    with fake_cuda.recording() as log:
        x = fake_cuda.cuda(torch.randn(1, 4, 3, 8))
        positions = fake_cuda.cuda(torch.tensor([1, 2, 3], dtype=torch.int32))
        call = parse_rope(x, positions, **{**options, "offset": 0})
        plan = rope_cuda_plan.RotatePlan(x, call, rope_plan._source(call, positions, 0), False, "half")
        assert plan.ready and plan.counting
        for offset in (5, 2**53, -(2**53)):
            expected = fake_cuda.host(parse_rope(x, positions, **{**options, "offset": offset}).positions)
            log.clear()
            formed.clear()
            assert plan((x, positions), {"offset": offset}) is not NotImplemented and log.lines() == []
            assert torch.equal(fake_cuda.host(formed[0]).to(torch.float64).flatten(), expected.flatten())
        for offset in (2**53 + 1, 2**60 + 128):
            assert plan((x, positions), {"offset": offset}) is NotImplemented


# name: (torch, t) -> (positions or None, offset, whether the plan serves it): an offset in host
# memory beside CUDA x (the full path reads it: a plan serves it only where its int64 sums
# cannot leave int64), uint64 positions (which the full path reads to widen)
READ_BY_THE_FULL_PATH = {
    "CPU int32 offset": lambda torch, t: (None, torch.tensor(t % 2**31, dtype=torch.int32), True),
    "CPU int32 offset, int32 positions": lambda torch, t: (torch.tensor([4, 0, 9], dtype=torch.int32), torch.tensor(-(t % 2**31), dtype=torch.int32), True),
    "CPU int64 offset": lambda torch, t: (None, torch.tensor(t), False),
    "uint64 positions, int offset": lambda torch, t: (torch.tensor([1, 2, 2**40], dtype=torch.uint64), t, False),
}


@pytest.mark.parametrize("name", READ_BY_THE_FULL_PATH)
def test_a_rope_cuda_plan_serves_offsets_the_full_path_reads_only_with_its_positions(monkeypatch, name):
    """A ``rope`` plan on CUDA tensors whose calls give an offset in host memory, or uint64
    positions, which the full path reads: each call is served with the int64 positions the
    full path gives (``parse_rope``), reading nothing on the device, or left to the full
    path (``NotImplemented``) where only a read could keep its sums within int64."""
    import inspect

    torch = pytest.importorskip("torch")
    import fake_cuda
    from posenc._kernels import rope_cuda_plan, rope_plan
    from posenc.rotary._call import parse_rope

    formed = _fake_rotation(monkeypatch, torch)
    options = dict(inspect.unwrap(pe.rope).__kwdefaults__)

    def arguments(t):
        positions, offset, served = READ_BY_THE_FULL_PATH[name](torch, t)
        return (None if positions is None else fake_cuda.cuda(positions)), offset, served

    with fake_cuda.recording() as log:
        x = fake_cuda.cuda(torch.randn(1, 4, 3, 8))
        positions, offset, _ = arguments(3)
        call = parse_rope(x, positions, **{**options, "offset": offset})
        plan = rope_cuda_plan.RotatePlan(x, call, rope_plan._source(call, positions, offset), False, "half")
        assert plan.ready
        for t in (5, 0, 2**31 - 1, 2**62 + 1):
            positions, offset, served = arguments(t)
            log.clear()
            formed.clear()
            result = plan((x,) if positions is None else (x, positions), {"offset": offset})
            assert log.lines() == [], t
            if not served:
                assert result is NotImplemented and formed == [], t
                continue
            expected = fake_cuda.host(parse_rope(x, positions, **{**options, "offset": offset}).positions)
            assert isinstance(result, fake_cuda.FakeCuda), t
            (held,) = formed
            # (the kernel reads int64 positions as float64: the float64 values are what it rotates by)
            assert torch.equal(fake_cuda.host(held).to(torch.float64).flatten(), expected.to(torch.float64).flatten()), (t, held, expected)


def test_a_rope_cuda_plan_leaves_an_offset_in_the_memory_it_rotates_to_the_full_path(monkeypatch):
    """In place, an offset tensor summed on the device is served, but one in x's own
    storage is left to the full path (which refuses it), as positions there are."""
    import inspect

    torch = pytest.importorskip("torch")
    import fake_cuda
    from posenc._kernels import rope_cuda_plan, rope_plan
    from posenc.rotary._call import parse_rope

    _fake_rotation(monkeypatch, torch)
    options = {**inspect.unwrap(pe.rope).__kwdefaults__, "offset": None}
    with fake_cuda.recording():
        x = fake_cuda.cuda(torch.randn(1, 4, 3, 8, dtype=torch.float64))
        apart = fake_cuda.cuda(torch.tensor(3))
        call = parse_rope(x, None, **{**options, "offset": apart, "out": x})
        plan = rope_cuda_plan.RotatePlan(x, call, rope_plan._source(call, None, apart), True, "half")
        assert plan.ready
        assert plan((x,), {"offset": fake_cuda.cuda(torch.tensor(9))}) is x
        assert plan((x,), {"offset": x.view(torch.int64)[0, 0, 0, 0]}) is NotImplemented


def _launched_data(launched):
    """Per launch of ``_fake_plan_launches``: its arrays' data pointers (numba's layout, an int between), then its ints."""
    return [params[i] for params in launched for i in (4, 12, 20)], [params[i] for params in launched for i in (7, 15, 23)]


def test_a_q_and_k_pair_plan_launches_with_each_calls_six_addresses(monkeypatch):
    """``rope_cuda_plan.PairPlan`` (``rotate_pair`` on CUDA tensors): its build finds q, k,
    ``cos``, ``sin`` and the two results among the launch's arguments by address; each call
    launches with that call's q, k, tables and two new results in those places and returns
    the results. Tables at one address leave it unready (the full path keeps the call)."""
    torch = pytest.importorskip("torch")
    from posenc._kernels import rope_cuda_plan

    launched = _fake_plan_launches(monkeypatch, torch)
    arrays = lambda: [torch.randn(1, 4, 1, 8), torch.randn(1, 2, 1, 8), torch.randn(1, 1, 8), torch.randn(1, 1, 8)]  # noqa: E731
    plan = rope_cuda_plan.PairPlan(*arrays(), "half")
    assert plan.ready
    launched.clear()
    q, k, cos, sin = arrays()
    got_q, got_k = plan((q, k, cos, sin), {})
    assert got_q.shape == q.shape and got_k.shape == k.shape
    data, ints = _launched_data(launched)
    assert data == [q.data_ptr(), got_q.data_ptr(), k.data_ptr(), got_k.data_ptr(), cos.data_ptr(), sin.data_ptr()]
    assert ints == [1, 2, 3, 4, 5, 6]
    q, k, cos, _ = arrays()
    assert not rope_cuda_plan.PairPlan(q, k, cos, cos, "half").ready


@pytest.mark.parametrize("in_place", [False, True], ids=["new result", "in place"])
def test_an_apply_rope_plan_launches_with_each_calls_addresses(monkeypatch, in_place):
    """``rope_cuda_plan.ApplyPlan`` (``apply_rope`` on CUDA tensors): each call launches with
    that call's x, tables and result (new, or x itself) where its build found theirs; in
    place, tables in x's own memory leave the call to the full path (which judges overlap by
    elements), and nothing is launched."""
    torch = pytest.importorskip("torch")
    from posenc._kernels import rope_cuda_plan

    launched = _fake_plan_launches(monkeypatch, torch)
    arrays = lambda: [torch.randn(1, 4, 1, 8), torch.randn(1, 8), torch.randn(1, 8)]  # noqa: E731
    assert rope_cuda_plan.ApplyPlan(*arrays(), "half", in_place).ready
    plan = rope_cuda_plan.ApplyPlan(*arrays(), "half", in_place)
    launched.clear()
    x, cos, sin = arrays()
    got = plan((x, cos, sin), {})
    assert (got is x) is in_place and got.shape == x.shape
    data, ints = _launched_data(launched)
    assert data == [x.data_ptr(), got.data_ptr(), cos.data_ptr(), sin.data_ptr(), x.data_ptr(), x.data_ptr()] and ints == [1, 2, 3, 4, 5, 6]
    buffer = torch.randn(5, 8)  # (x in its first four rows, cos in the last)
    launched.clear()
    result = plan((buffer[:4].view(1, 4, 1, 8), buffer[4:], sin), {})
    assert (result is NotImplemented and not launched) if in_place else len(launched) == 2


@pytest.mark.parametrize("plan", ["rope", "apply_rope", "rotate_pair"])
def test_a_plan_whose_kernel_reads_words_leaves_an_array_between_words_to_the_full_path(monkeypatch, plan):
    """A CUDA plan built where its kernel reads float32 ``x`` (or q) in words of two channels
    (``rope_cuda.WORDS``) meets a later call of its key whose array starts one element into
    a word (a view one float32 into its memory: the same shape and strides): the plan
    launches nothing and returns ``NotImplemented`` (the full path serves the call, one
    channel at a time); a call at a word's address is launched by the plan."""
    torch = pytest.importorskip("torch")
    from posenc._kernels import rope_cuda_plan

    if plan == "rope":
        _fake_rotation(monkeypatch, torch, np.uint64)
    launched = _fake_plan_launches(monkeypatch, torch, np.uint64)

    def x(between):
        return torch.randn(2 * 4 * 3 * 8 + 1)[int(between) : int(between) + 2 * 4 * 3 * 8].reshape(2, 4, 3, 8)

    def tables():
        return torch.randn(3, 8), torch.randn(3, 8)

    if plan == "rope":
        import types as pytypes

        from posenc._kernels import rope_plan

        call = pytypes.SimpleNamespace(positions=torch.arange(3), inv_freq=np.ones(4), inverse=False, scale=1.0)
        built = rope_cuda_plan.RotatePlan(x(False), call, rope_plan._Source((3,), None, None, "int64", None), False, "half")
        run = lambda a: built((a, torch.arange(3)), {})  # noqa: E731
    elif plan == "apply_rope":
        built = rope_cuda_plan.ApplyPlan(x(False), *tables(), "half", False)
        run = lambda a: built((a, *tables()), {})  # noqa: E731
    else:
        built = rope_cuda_plan.PairPlan(x(False), x(False), *tables(), "half")
        run = lambda a: built((a, x(False), *tables()), {})  # noqa: E731
    assert built.ready
    launched.clear()
    assert run(x(True)) is NotImplemented and launched == []
    assert run(x(False)) is not NotImplemented and launched


def test_the_cuda_plan_builders_plan_only_the_calls_a_plan_serves(monkeypatch):
    """``rope_cuda_plan.build``, ``build_apply`` and ``build_pair`` (what ``rope_plan`` asks on
    torch CUDA tensors; the simulator has none, so here the plans are recorded, not built):
    a plan for a call whose full path ended in the kernel's launcher, into a new result or
    ``x`` itself, at frequencies that do not depend on the positions, with torch positions
    on ``x``'s device, a q and k that ``rotate_pair`` launches together, and a plan that is
    ``ready``; None for any other call (its full path serves it)."""
    import types as pytypes

    torch = pytest.importorskip("torch")
    import fake_cuda
    import posenc.rotary.apply
    from posenc._kernels import rope_cuda, rope_cuda_plan

    ready = [True]

    class Recorded:
        def __init__(self, *args):
            self.args, self.ready = args, ready[0]

    for name in ("RotatePlan", "ApplyPlan", "PairPlan"):
        monkeypatch.setattr(rope_cuda_plan, name, Recorded)
    monkeypatch.setattr(_arrays, "cuda_simulator", lambda: False)
    x, positions, cos = torch.randn(1, 2, 3, 8), torch.arange(3), torch.randn(3, 8)
    call = pytypes.SimpleNamespace(kernel=lambda: rope_cuda.rotate_positions, positions=positions)
    fixed, by_length = pytypes.SimpleNamespace(uses_seq_len=False), pytypes.SimpleNamespace(uses_seq_len=True)

    def rope(out=None, scaling=None, call=call):
        plan = rope_cuda_plan.build(x, call, "source", out=out, layout="half", scaling=scaling)
        return plan and plan.args[3]  # (in place)

    assert rope() is False and rope(out=x) is True and rope(scaling=fixed) is False
    assert rope(out=torch.empty_like(x)) is None and rope(scaling=by_length) is None
    for other in (np.arange(3), fake_cuda.cuda(positions)):  # not torch, not on x's device
        assert rope(call=pytypes.SimpleNamespace(kernel=call.kernel, positions=other)) is None
    assert rope(call=pytypes.SimpleNamespace(kernel=lambda: rope_cuda.rotate_cos_sin, positions=positions)) is None

    applied = pytypes.SimpleNamespace(kernel=lambda: rope_cuda.rotate_cos_sin)
    assert rope_cuda_plan.build_apply(x, cos, cos, applied, out=x, layout="half").args[4] is True
    assert rope_cuda_plan.build_apply(x, cos, cos, applied, out=None, layout="interleaved").args[3:] == ("interleaved", False)
    assert rope_cuda_plan.build_apply(x, cos, cos, applied, out=torch.empty_like(x), layout="half") is None
    assert rope_cuda_plan.build_apply(x, cos, cos, call, out=None, layout="half") is None

    together = [rope_cuda.rotate_cos_sin_pair]
    monkeypatch.setattr(posenc.rotary.apply, "cuda_pair_launcher", lambda q, k, cos, sin, layout: together[0])
    assert rope_cuda_plan.build_pair(x, x[:, :1], cos, cos, layout="half").args[1].shape == (1, 1, 3, 8)
    for q, k, layout in ((x, x, "neox"), (x[:0], x, "half"), (x, x[..., :0, :], "half")):
        assert rope_cuda_plan.build_pair(q, k, cos, cos, layout=layout) is None
    together[0] = None
    assert rope_cuda_plan.build_pair(x, x, cos, cos, layout="half") is None
    together[0], ready[0] = rope_cuda.rotate_cos_sin_pair, False
    assert rope_cuda_plan.build_pair(x, x, cos, cos, layout="half") is None and rope() is None
    assert rope_cuda_plan.build_apply(x, cos, cos, applied, out=None, layout="half") is None


def test_torch_stream_is_the_raw_handle_of_the_current_stream():
    """``_arrays.torch_stream``: torch's raw current-stream query where torch has it (no
    ``torch.cuda.Stream`` object made a call), else the current stream's ``cuda_stream``."""
    import types as pytypes

    calls = []
    current = pytypes.SimpleNamespace(cuda_stream=7)
    cuda = pytypes.SimpleNamespace(current_stream=lambda index: calls.append(("stream", index)) or current)
    with_raw = pytypes.SimpleNamespace(_C=pytypes.SimpleNamespace(_cuda_getCurrentRawStream=lambda index: calls.append(("raw", index)) or 9), cuda=cuda)
    assert _arrays.torch_stream(with_raw, 1) == 9 and calls == [("raw", 1)]
    without = pytypes.SimpleNamespace(_C=pytypes.SimpleNamespace(), cuda=cuda)
    assert _arrays.torch_stream(without, 0) == 7 and calls[1:] == [("stream", 0)]


class _Constant:
    """Stands for the numba device array a constant ``Flat`` owns (weakly referenced by the tests)."""


def _fake_driver(monkeypatch, capturing, second=np.float32):
    """``_device_flat`` launching into a list, its streams capturing a CUDA graph or not (the
    kernel reads a float64 array and one of ``second``)."""
    import contextlib

    import numba
    from numba import types

    from posenc._kernels import _device_flat

    launched = []
    writers = _device_flat.parameter_writers((types.Array(types.float64, 1, "C"), types.Array(numba.from_dtype(np.dtype(second)), 1, "C")))

    def direct(kernel, device):
        return "function", writers, lambda stream, config, function, *params: launched.append(params), lambda grid, block: (grid, block), kernel

    monkeypatch.setattr(_device_flat, "_direct_launch", direct)
    monkeypatch.setattr(_device_flat, "_core_stream", lambda stream: stream)
    monkeypatch.setattr(_arrays, "on_device", lambda index: contextlib.nullcontext())
    monkeypatch.setattr(_device_flat, "capturing", lambda stream: capturing)
    monkeypatch.setattr(_device_flat, "_captured", {})
    monkeypatch.setattr(_device_flat, "_constants", type(_device_flat._constants)())
    return _device_flat, launched


def test_a_prepared_launch_holds_the_constants_it_reads(monkeypatch):
    """A CUDA plan's launch keeps the addresses of its constants (frequencies), not the
    arrays: it holds those arrays itself, so a constant that leaves the last ``_KEPT`` is not
    freed under a plan that still reads it (which would read freed or reused memory)."""
    import gc
    import weakref

    device_flat, launched = _fake_driver(monkeypatch, capturing=False)
    owner = _Constant()
    gone = weakref.ref(owner)
    freqs = device_flat.Flat(5000, 64, np.dtype(np.float64), owner)
    x = device_flat.Flat(1000, 8, np.dtype(np.float32))
    prepared = device_flat.Prepared([("kernel", 1, (32, 1, 1), (freqs, x))], 0, {1000: "x"})
    del owner, freqs
    gc.collect()
    assert gone() is not None
    prepared("stream", {"x": 2048})
    assert launched[0][4] == 5000 and launched[0][11] == 2048
    del prepared
    gc.collect()
    assert gone() is None  # (held by the plan, not for good)


def test_a_prepared_launch_of_words_launches_nothing_at_an_address_between_words(monkeypatch):
    """A plan built where the kernel reads ``x`` in words (``rope_cuda.WORDS``) is not for a
    later ``x`` at an address that is not a multiple of a word: the call launches nothing
    and says so (the plan's call then takes the full path)."""
    device_flat, launched = _fake_driver(monkeypatch, capturing=False, second=np.uint64)
    freqs, x = device_flat.Flat(5000, 64, np.dtype(np.float64)), device_flat.Flat(1000, 8, np.dtype(np.uint64))
    prepared = device_flat.Prepared([("kernel", 1, (32, 1, 1), (freqs, x))], 0, {1000: "x"})
    assert prepared("stream", {"x": 2052}) is False and not launched
    assert prepared("stream", {"x": 2056}) is True and launched[0][11] == 2056


@pytest.mark.parametrize("planned", [False, True], ids=["launch", "prepared"])
def test_constants_a_cuda_graph_capture_reads_are_kept_for_good(monkeypatch, planned):
    """A launch recorded into a CUDA graph reads its constants at every replay: those it
    reads while its stream is capturing stay alive for the rest of the process, those of an
    ordinary launch only as long as the constants cache (or a plan) holds them."""
    import gc
    import weakref

    from posenc._kernels import _device_flat

    for capturing in (False, True):
        device_flat, _ = _fake_driver(monkeypatch, capturing)
        owner, empty = _Constant(), _Constant()
        gone = weakref.ref(owner)
        args = (device_flat.Flat(5000, 64, np.dtype(np.float64), owner), device_flat.Flat(7000, 0, np.dtype(np.float32), empty))
        if planned:
            prepared = device_flat.Prepared([("kernel", 1, (32, 1, 1), args)], 0, {})
            prepared("stream", {})
            del prepared
        else:
            device_flat.launch("kernel", 0, 1, (32, 1, 1), "stream", *args)
        del owner, args
        gc.collect()
        assert (gone() is not None) is capturing
        assert list(_device_flat._captured) == ([5000] if capturing else [])  # (an empty one has no memory to keep)


def test_a_new_constant_is_on_the_device_before_any_stream_reads_it(monkeypatch):
    """A constant's copy from host memory is queued behind the caller's stream; the constant
    then serves calls on every stream, so the copy is waited for once, when it is made:
    not on a later call that finds it, nor for an empty one (nothing copied)."""
    import types as pytypes

    from posenc._kernels import _device_flat

    events = []

    class Stream:
        def synchronize(self):
            events.append("synchronize")

    def to_device(values, stream):
        events.append(("copy", values.tolist()))
        return values

    monkeypatch.setattr(_device_flat, "cuda", pytypes.SimpleNamespace(to_device=to_device))
    monkeypatch.setattr(_device_flat, "_constants", type(_device_flat._constants)())
    monkeypatch.setattr(_arrays, "cuda_simulator", lambda: True)  # (the constant as to_device returned it)
    stream = Stream()
    first = _device_flat.constant(0, np.array([0.5, 0.25]), stream)
    assert events == [("copy", [0.5, 0.25]), "synchronize"]
    assert _device_flat.constant(0, np.array([0.5, 0.25]), stream) is first and len(events) == 2
    _device_flat.empty(0, np.float64, stream)
    assert events[2:] == [("copy", [])]


def test_a_new_constant_while_a_cuda_graph_is_captured_is_refused_before_any_driver_call(monkeypatch):
    """A capture refuses an allocation, a copy from host memory and a synchronisation, and
    the refusal ends the capture: a new constant (a kernel's frequencies, T5's bucket starts)
    while the caller's stream captures is a ``RuntimeError`` that says to call once outside
    the capture, before anything reaches the driver; made outside the capture, the same
    constant is found while capturing, and an empty one (nothing copied) is made either way.
    (The simulator has no graphs: here the stream's capture state is given; on main numba's
    to_device ran on the capturing stream, whose CUDA error came from inside numba.)"""
    import types as pytypes

    from posenc._kernels import _device_flat

    events, capture = [], [True]

    class Stream:
        def synchronize(self):
            events.append("synchronize")

    def to_device(values, stream):
        events.append(("copy", values.tolist()))
        return pytypes.SimpleNamespace(device_ctypes_pointer=pytypes.SimpleNamespace(value=4096), shape=values.shape, dtype=values.dtype)

    monkeypatch.setattr(_device_flat, "cuda", pytypes.SimpleNamespace(to_device=to_device))
    monkeypatch.setattr(_device_flat, "_constants", type(_device_flat._constants)())
    monkeypatch.setattr(_arrays, "cuda_simulator", lambda: False)
    monkeypatch.setattr(_device_flat, "_core_stream", lambda stream: stream)
    monkeypatch.setattr(_device_flat, "capturing", lambda stream: capture[0])
    stream, starts = Stream(), np.array([9, 12, 17], np.int64)
    with pytest.raises(RuntimeError, match="captured.*outside the capture first"):
        _device_flat.constant(0, starts, stream)
    assert events == [] and len(_device_flat._constants) == 0
    capture[0] = False
    made = _device_flat.constant(0, starts, stream)
    assert events == [("copy", [9, 12, 17]), "synchronize"] and made.ptr == 4096
    capture[0] = True
    assert _device_flat.constant(0, starts, stream) is made and len(events) == 2
    _device_flat.empty(0, np.float64, stream)
    assert events[2:] == [("copy", [])]


def test_numbas_views_of_streams_are_kept_for_the_last_64_handles(monkeypatch):
    """A program may make a CUDA stream per request: the launchers' views of streams are
    kept for the last 64 handles, not one per handle ever met."""
    from numba import cuda

    monkeypatch.setattr(cuda, "external_stream", lambda handle: ("stream", handle), raising=False)
    _arrays._stream.cache_clear()
    try:
        views = [_arrays._stream(handle) for handle in range(1, 1001)]
        assert views[-1] == ("stream", 1000) and _arrays._stream(1000) is views[-1]
        assert _arrays._stream.cache_info().currsize == 64
    finally:
        _arrays._stream.cache_clear()


def test_a_cupy_launch_takes_the_current_stream_of_the_arrays_device(monkeypatch):
    """CuPy keeps a current stream per device: a kernel on an array of GPU 1 launches on GPU
    1's current stream, whichever device is current on the thread."""
    import sys
    import types as pytypes

    streams = {0: pytypes.SimpleNamespace(ptr=100), 1: pytypes.SimpleNamespace(ptr=111)}
    cupy = pytypes.SimpleNamespace(cuda=pytypes.SimpleNamespace(get_current_stream=lambda device_id=-1: streams[0 if device_id == -1 else device_id]))
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    monkeypatch.setattr(_arrays, "library", lambda a: "cupy")
    monkeypatch.setattr(_arrays, "_stream", lambda handle: ("stream", handle))
    monkeypatch.setattr(_arrays, "on_device", lambda index: ("device", index))
    on_gpu_1 = pytypes.SimpleNamespace(device=pytypes.SimpleNamespace(id=1))
    assert _arrays.launch_context(on_gpu_1) == (("stream", 111), ("device", 1))


def test_the_t5_bucket_launcher_refuses_what_its_kernel_cannot_read(monkeypatch):
    """``buckets_cuda.t5_buckets`` called directly (past the registry's accepts): a host array,
    another dtype, another shape, a negative stride or an invalid bucket map is refused with
    the argument named, before any launch."""
    from posenc._kernels import buckets_cuda

    launched = []
    monkeypatch.setattr(buckets_cuda, "FAMILY", type("F", (), {"__getitem__": lambda self, key: launched.append(key)})())
    options = {"num_buckets": 32, "max_distance": 128, "bidirectional": True}
    rel = np.arange(-4, 5)
    _refused(buckets_cuda.t5_buckets, (rel,), options, TypeError, ["GPU array"])
    _refused(buckets_cuda.t5_buckets, (_device(rel.astype(np.int16)),), options, TypeError, ["rel", "int16"])
    _refused(buckets_cuda.t5_buckets, (_device(np.zeros((2, 3), np.int64)),), options, ValueError, ["rel", "dimension"])
    _refused(buckets_cuda.t5_buckets, (_arrays.strided(_device(rel)[8:], (5,), (-2,)),), options, ValueError, ["rel", "stride"])
    _refused(buckets_cuda.t5_buckets, (_device(rel),), {**options, "num_buckets": 3}, ValueError, ["num_buckets"])
    _refused(buckets_cuda.t5_buckets, (_device(rel),), {**options, "max_distance": 8}, ValueError, ["max_distance"])
    assert launched == []


def test_the_t5_bucket_kernel_searches_the_bucket_starts(monkeypatch):
    """A thread reads about log2 of the 32767 starts of 65536 buckets one way (a binary
    search; it read every one), and finds the bucket of its distance."""
    import types as pytypes

    from posenc._kernels import buckets_cuda
    from posenc.relative.buckets import t5_starts_array

    class Reads:
        def __init__(self, values):
            self.values, self.shape, self.count = values, (len(values),), 0

        def __getitem__(self, k):
            self.count += 1
            return self.values[k]

    monkeypatch.setattr(buckets_cuda, "cuda", pytypes.SimpleNamespace(grid=lambda ndim: 0))  # the thread of distance 0
    starts = t5_starts_array(2**16, 10**6)
    for rel, want in ((2**40, 2**16 - 1), (starts[100], 2**15 + 101), (starts[100] - 1, 2**15 + 100), (3, 3), (-5, 0)):
        reads, out = Reads(np.asarray(starts, np.int64)), np.zeros(1, np.int64)
        buckets_cuda._buckets(1, np.array([rel]), 1, reads, 2**15, 2**16, 0, -(2**63 - 1), out)
        assert out[0] == want and reads.count <= 16, (rel, out[0], reads.count)
