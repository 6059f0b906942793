"""torch CUDA tensors through the numba.cuda kernels: q and k in one launch, CUDA graphs,
``torch.compile(mode="reduce-overhead")`` of a patched model, tensors on two GPUs.

These need a CUDA GPU and a CUDA build of torch (``make test-gpu``: ``POSENC_TEST_GPU=1``);
without one every test here is skipped (the CUDA simulator has no torch CUDA tensors: the
kernel-level counterparts run under it in ``test_cuda_launchers.py`` and
``test_cuda_host_work.py``).
"""

from __future__ import annotations

import pytest

from arrays import counting_kernel_keys, gpu_run
from posenc._kernels import _arrays

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.skipif(
    not (gpu_run() and torch.cuda.is_available() and _arrays.numba_cuda() and not _arrays.cuda_simulator()),
    reason="needs a CUDA GPU, a CUDA build of torch and POSENC_TEST_GPU=1 (make test-gpu)",
)

import posenc as pe  # noqa: E402


def _hf_view(b, s, heads, d, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(b, s, heads, d, generator=g, device="cuda", dtype=dtype).transpose(1, 2)


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


@pytest.fixture
def counted_launches(monkeypatch):
    from posenc._kernels import rope_cuda

    return counting_kernel_keys(monkeypatch, rope_cuda)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_hf_apply_rotary_pos_emb_rotates_q_and_k_in_one_launch(dtype, counted_launches):
    from posenc.rotary.apply import rotate_pair
    from posenc.torch.hf import apply_rotary_pos_emb

    rotate_pair.plans.clear()  # (a plan left by another test would serve this call without the lookup counted)
    q, k = _hf_view(2, 16, 8, 64, dtype, 0), _hf_view(2, 16, 2, 64, dtype, 1)
    angles = torch.rand(2, 16, 32, device="cuda", dtype=torch.float64) * 50
    cos, sin = (f(torch.cat([angles, angles], -1)) for f in (torch.cos, torch.sin))
    got_q, got_k = apply_rotary_pos_emb(q, k, cos.to(dtype), sin.to(dtype))
    from posenc._kernels import rope_cuda

    # (one launch, in words of two channels: torch's allocations are aligned, the strides even)
    assert counted_launches == [("apply", str(dtype).split(".")[-1], rope_cuda.WORDS_LAYOUT)]
    for got, x in ((got_q, q), (got_k, k)):  # the formula in float64 from the same 16-bit tables
        c, s = cos.to(dtype).double()[:, None], sin.to(dtype).double()[:, None]
        want = (x.double() * c + _rotate_half(x.double()) * s).to(dtype)
        torch.testing.assert_close(got, want, atol=0, rtol=2 * torch.finfo(dtype).eps)


def _captured(fn):
    """``fn()`` captured in a CUDA graph after warm-up calls on a side stream: ``(graph, output)``."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_rope_decode_step_in_a_cuda_graph_replays_bit_identically(dtype):
    x = torch.randn(1, 32, 1, 128, device="cuda", dtype=dtype)
    position = torch.tensor([5], device="cuda")
    graph, out = _captured(lambda: pe.rope(x, position))
    for step in (6, 700, 40000):
        x.copy_(torch.randn_like(x))
        position.fill_(step)
        graph.replay()
        assert torch.equal(out, pe.rope(x, position))


def _decode_calls():
    """``name -> call(x, step)``: decode steps of ``pe.rope`` on CUDA tensors as models make them."""
    long = lambda step: torch.tensor([[step]], device="cuda")  # noqa: E731
    return {
        "position_ids": lambda x, step: pe.rope(x, long(100 + step)),
        "int32 positions": lambda x, step: pe.rope(x, torch.tensor([7 * step], device="cuda", dtype=torch.int32)),
        "float positions": lambda x, step: pe.rope(x, torch.tensor([0.5 + step], device="cuda")),
        "offset": lambda x, step: pe.rope(x, offset=4000 + step),
        "offset tensor": lambda x, step: pe.rope(x, offset=torch.tensor(9 + step, device="cuda", dtype=torch.int32)),
        "int64 offset tensor": lambda x, step: pe.rope(x, offset=torch.tensor(9 + step, device="cuda")),
        "per-row offset tensor": lambda x, step: pe.rope(x, offset=torch.tensor([9 + step], device="cuda")),
        "out buffer": lambda x, step: pe.rope(x.clone(), long(step), out=x.clone()),
        "in place, interleaved, inverse": lambda x, step: (lambda y: pe.rope(y, long(3 * step), out=y, layout="interleaved", inverse=True))(x.clone()),
        "linear scaling": lambda x, step: pe.rope(x, long(step), scaling=pe.scaling.Linear(4.0)),
    }


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("name", list(_decode_calls()))
def test_planned_decode_steps_give_the_full_paths_bits(dtype, name):
    """From a signature's third call on, a decode step on CUDA tensors is planned
    (``rope_cuda_plan``): its result equals the full path's (empty plan caches) bit for bit."""
    call = _decode_calls()[name]
    x = torch.randn(1, 32, 1, 128, device="cuda").to(dtype)
    pe.rope.plans.clear()
    cold = []
    for step in range(4):
        cold.append(call(x, step))
        pe.rope.plans.clear()
    for step in range(4):
        assert torch.equal(call(x, step), cold[step]), (name, step)
    if name != "out buffer":  # (a buffer other than x: no plan)
        assert any(type(plan).__module__.endswith("rope_cuda_plan") for plan in pe.rope.plans.values() if plan), name
    pe.rope.plans.clear()


@pytest.mark.parametrize("name", ["position_ids", "int32 positions", "float positions", "offset", "offset tensor", "in place, interleaved, inverse"])
def test_a_planned_decode_step_launches_without_the_full_path(monkeypatch, name):
    """What makes a decode step cheap on the host: once planned, a call of the signature
    launches from its plan and never reaches the launcher's geometry (``rope_cuda.rotation``)."""
    from posenc._kernels import rope_cuda

    call = _decode_calls()[name]
    x = torch.randn(1, 32, 1, 128, device="cuda")
    pe.rope.plans.clear()
    for step in range(3):
        call(x, step)
    full_path = []
    original = rope_cuda.rotation  # (what the launcher computes its launches with; a plan has them)
    monkeypatch.setattr(rope_cuda, "rotation", lambda *a, **k: full_path.append(1) or original(*a, **k))
    for step in range(3, 6):
        call(x, step)
    pe.rope.plans.clear()
    assert not full_path, f"{name}: {len(full_path)} of 3 planned calls took the full path"


def test_a_plan_in_words_sends_an_x_between_words_to_the_full_path(monkeypatch):
    """A decode step planned on an x the kernel read in words of two bfloat16 channels
    (``rope_cuda.WORDS``): a later x of the same shape and strides one element into its
    memory is not launched by the plan (an address between words) but by the full path,
    with the full path's bits."""
    from posenc._kernels import rope_cuda

    shape, positions = (1, 32, 1, 128), torch.tensor([[77]], device="cuda")
    x = torch.randn(shape, device="cuda").to(torch.bfloat16)
    between = torch.empty(x.numel() + 1, device="cuda", dtype=torch.bfloat16)[1:].view(shape)
    between.copy_(x)
    pe.rope.plans.clear()
    for _ in range(3):
        want = pe.rope(x, positions)
    full_path = []
    original = rope_cuda.rotation
    monkeypatch.setattr(rope_cuda, "rotation", lambda *a, **k: full_path.append(1) or original(*a, **k))
    assert torch.equal(pe.rope(x, positions), want) and not full_path  # (planned)
    assert torch.equal(pe.rope(between, positions), want) and full_path == [1]
    pe.rope.plans.clear()


def test_a_plan_built_on_a_busy_stream_serves_another_stream():
    """``pe.rope(x, offset=...)`` forms its positions (an arange) on each call's stream: a plan
    built on a stream still busy serves a call on another stream with the call's own
    positions, not memory the busy stream has yet to write."""
    x = torch.randn(1, 32, 4, 128, device="cuda")
    pe.rope.plans.clear()
    want = pe.rope(x, offset=7)
    pe.rope.plans.clear()
    busy, other = torch.cuda.Stream(), torch.cuda.Stream()
    for stream in (busy, other):
        stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(busy):
        torch.cuda._sleep(200_000_000)  # (about a tenth of a second of queued work)
        for _ in range(2):
            pe.rope(x, offset=7)  # (the second builds the plan, its own calls queued behind the sleep)
    with torch.cuda.stream(other):
        got = pe.rope(x, offset=7)
    torch.cuda.synchronize()
    assert any(type(plan).__module__.endswith("rope_cuda_plan") for plan in pe.rope.plans.values() if plan)
    pe.rope.plans.clear()
    assert torch.equal(got, want)


def test_a_captured_planned_rope_without_positions_outlives_its_plan():
    """A graph captured through a plan of ``pe.rope(x, offset=...)`` replays its own positions
    after the plan is dropped and torch's allocator has handed out freed memory again."""
    x = torch.randn(1, 32, 1, 128, device="cuda")
    pe.rope.plans.clear()
    for _ in range(3):
        pe.rope(x, offset=5)  # (warm-up on this stream: planned from the second call)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = pe.rope(x, offset=5)
    pe.rope.plans.clear()
    reused = [torch.full((n,), -(2**40), dtype=torch.int64, device="cuda") for n in (1, 1, 2, 4) * 256]
    for _ in range(2):
        x.copy_(torch.randn_like(x))
        graph.replay()
        assert torch.equal(out, pe.rope(x, offset=5))
    del reused


def test_a_planned_decode_step_refuses_an_int64_sum_as_the_full_path_does():
    """int64 positions with an int32 offset tensor: a sum past int64 meets the full path's
    error from a planned signature too, never a wrapped position (the CUDA plan has no angle
    bound behind it, as the CPU plan has)."""
    x = torch.randn(1, 32, 1, 128, device="cuda")
    one = torch.tensor(1, dtype=torch.int32, device="cuda")
    pe.rope.plans.clear()
    for _ in range(3):
        pe.rope(x, torch.tensor([5], device="cuda"), offset=one)
    with pytest.raises(ValueError, match="int64") as planned:
        pe.rope(x, torch.tensor([2**63 - 1], device="cuda"), offset=one)
    pe.rope.plans.clear()
    with pytest.raises(ValueError, match="int64") as cold:
        pe.rope(x, torch.tensor([2**63 - 1], device="cuda"), offset=one)
    assert str(planned.value) == str(cold.value)


def _replace_constants():
    """More than ``_KEPT`` new frequency constants in the launchers' cache, the ones they
    replace freed (numba's pending deallocations flushed) and their memory allocated again."""
    from numba import cuda

    from posenc._kernels import _device_flat

    y = torch.randn(1, 1, 1, 128, device="cuda")
    for round in range(2):
        for k in range(2 * _device_flat._KEPT):
            pe.rope(y, offset=1, base=20000.0 + 1000 * round + k)
        context = cuda.current_context()
        getattr(context.memory_manager, "deallocations", context.deallocations).clear()  # (where numba-cuda queues frees)
    torch.cuda.synchronize()


def test_plans_and_cuda_graphs_read_their_frequencies_after_the_cache_replaced_them(monkeypatch):
    """The rotation's frequencies are a device constant that the launchers keep among the
    last ``_KEPT``: a decode plan and a captured graph (full path and planned) still read
    their own after that cache has replaced and freed them, bit for bit a fresh call's."""
    from posenc._kernels import rope_cuda

    monkeypatch.setattr(pe.rope.plans, "limit", 4096)  # (the 256 new signatures below would evict the plan under test)
    x = torch.randn(1, 32, 1, 128, device="cuda")
    position = torch.tensor([5], device="cuda")
    pe.rope.plans.clear()
    full = _captured(lambda: pe.rope.plans.clear() or pe.rope(x, position, base=12345.0))
    planned = _captured(lambda: pe.rope(x, position, base=23456.0))  # (planned from the warm-up's third call)
    cold = pe.rope(x, position + 1, base=34567.0)
    assert any(type(plan).__module__.endswith("rope_cuda_plan") for plan in pe.rope.plans.values() if plan)
    for _ in range(2):
        pe.rope(x, position + 1, base=34567.0)  # (its plan built)
    _replace_constants()
    for graph, _ in (full, planned):
        graph.replay()
    full_path, original = [], rope_cuda.rotation
    monkeypatch.setattr(rope_cuda, "rotation", lambda *a, **k: full_path.append(1) or original(*a, **k))
    later = pe.rope(x, position + 1, base=34567.0)
    monkeypatch.setattr(rope_cuda, "rotation", original)
    assert not full_path  # (from its plan, which still holds its frequencies)
    pe.rope.plans.clear()
    assert torch.equal(later, cold)
    for (_, captured), base in zip((full, planned), (12345.0, 23456.0)):
        assert torch.equal(captured, pe.rope(x, position, base=base))


def test_frequencies_copied_behind_a_busy_stream_are_complete_for_another_stream():
    """A rotation's first call copies its frequencies to the device on the caller's stream,
    behind that stream's queued work; a call on another stream right after reads the same
    constant: it gets the rotation's numbers, not memory the copy has yet to fill."""
    x = torch.randn(1, 8, 4, 128, device="cuda")
    positions = torch.arange(4, device="cuda")
    busy, other = torch.cuda.Stream(), torch.cuda.Stream()
    for stream in (busy, other):
        stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(busy):
        torch.cuda._sleep(200_000_000)  # (about a tenth of a second of queued work)
        pe.rope(x, positions, base=45678.0)
    with torch.cuda.stream(other):
        raced = pe.rope(x, positions, base=45678.0)
    torch.cuda.synchronize()
    assert torch.equal(raced, pe.rope(x, positions, base=45678.0))


_APPLIES = ("decode bf16", "decode f32 in place", "hf prefill f32, partial rotary", "interleaved bf16", "in place, tables in x's buffer")


def _apply_call(name):
    """``call(step)``: ``pe.apply_rope`` on CUDA tensors, new tables (and a new x in place) each step."""

    def tables(lead, width, dtype, step):
        angles = torch.rand(*lead, width // 2, device="cuda", dtype=torch.float64, generator=torch.Generator(device="cuda").manual_seed(step)) * 100
        return [f(torch.cat([angles, angles], -1)).to(dtype) for f in (torch.cos, torch.sin)]

    g = torch.Generator(device="cuda").manual_seed(7)
    x16, x32 = (torch.randn(1, 32, 1, 128, device="cuda", generator=g).to(dtype) for dtype in (torch.bfloat16, torch.float32))
    if name == "decode bf16":
        return lambda step: pe.apply_rope(x16, *tables((1,), 128, torch.bfloat16, step))
    if name == "decode f32 in place":
        return lambda step: (lambda y: pe.apply_rope(y, *tables((1,), 128, torch.float32, step), out=y))(x32.clone())
    if name == "hf prefill f32, partial rotary":
        x = _hf_view(2, 16, 8, 64, torch.float32, 4)
        return lambda step: pe.apply_rope(x, *[t[:, None] for t in tables((2, 16), 32, torch.float32, step)])
    if name == "interleaved bf16":
        return lambda step: pe.apply_rope(x16, *tables((1,), 128, torch.bfloat16, step), layout="interleaved")
    buffer = torch.randn(1, 33, 1, 128, device="cuda", generator=g)  # x in its first 32 heads, cos in the last

    def in_buffer(step):
        b = buffer.clone()
        cos, sin = tables((1,), 128, torch.float32, step)
        b[0, 32].copy_(cos)
        x = b[:, :32]
        return pe.apply_rope(x, b[0, 32], sin, out=x)

    return in_buffer


@pytest.mark.parametrize("name", _APPLIES)
def test_planned_apply_rope_steps_give_the_full_paths_bits(monkeypatch, name):
    """From a signature's third call on, ``apply_rope`` on CUDA tensors launches from its plan
    (``rope_cuda_plan.ApplyPlan``), never reaching the launcher's geometry, and equals the
    full path (empty plan caches) bit for bit; in place with its tables in x's own memory,
    the plan leaves each call to the full path."""
    from posenc._kernels import rope_cuda

    call = _apply_call(name)
    pe.apply_rope.plans.clear()
    cold = []
    for step in range(4):
        cold.append(call(step))
        pe.apply_rope.plans.clear()
    for step in range(2):
        call(step)
    full_path, original = [], rope_cuda.apply_rotation
    monkeypatch.setattr(rope_cuda, "apply_rotation", lambda *a, **k: full_path.append(1) or original(*a, **k))
    for step in range(4):
        assert torch.equal(call(step), cold[step]), (name, step)
    assert any(type(plan).__module__.endswith("rope_cuda_plan") for plan in pe.apply_rope.plans.values() if plan), name
    assert len(full_path) == (4 if name == "in place, tables in x's buffer" else 0), name
    pe.apply_rope.plans.clear()


_PAIRS = ("hf decode bf16", "hf prefill f32, partial rotary", "contiguous q and k, interleaved", "k without the batch axis (two launches)")


def _pair_call(name):
    """``call(step)``: an attention layer's q and k rotated together on CUDA tensors (the
    Hugging Face drop-in's ``apply_rotary_pos_emb``, ``rotate_pair``), new tables each step."""
    from posenc.rotary.apply import rotate_pair
    from posenc.torch.hf import apply_rotary_pos_emb

    def tables(batch, rows, width, dtype, step):
        angles = torch.rand(batch, rows, width // 2, device="cuda", dtype=torch.float64, generator=torch.Generator(device="cuda").manual_seed(step)) * 100
        return [f(torch.cat([angles, angles], -1)).to(dtype) for f in (torch.cos, torch.sin)]

    if name == "hf decode bf16":
        q, k = _hf_view(1, 1, 32, 128, torch.bfloat16, 0), _hf_view(1, 1, 8, 128, torch.bfloat16, 1)
        return lambda step: apply_rotary_pos_emb(q, k, *tables(1, 1, 128, torch.bfloat16, step))
    q, k = _hf_view(2, 16, 8, 64, torch.float32, 2), _hf_view(2, 16, 2, 64, torch.float32, 3)
    if name == "hf prefill f32, partial rotary":
        return lambda step: apply_rotary_pos_emb(q, k, *tables(2, 16, 32, torch.float32, step))
    if name == "contiguous q and k, interleaved":
        q, k = q.contiguous(), k.contiguous()
        return lambda step: rotate_pair(q, k, *[t[:, None] for t in tables(2, 16, 64, torch.float32, step)], layout="interleaved")
    return lambda step: rotate_pair(q, k[0], *[t[0] for t in tables(1, 16, 64, torch.float32, step)])


@pytest.mark.parametrize("name", _PAIRS)
def test_planned_q_and_k_pairs_give_the_full_paths_bits(monkeypatch, name):
    """From a signature's third call on, ``rotate_pair`` on CUDA tensors (what the HF drop-in
    and ``patch_hf`` call every layer) launches from its plan (``rope_cuda_plan.PairPlan``),
    never reaching the launcher's geometry, and equals the full path (empty plan caches)
    bit for bit."""
    from posenc._kernels import rope_cuda
    from posenc.rotary.apply import rotate_pair

    call = _pair_call(name)
    rotate_pair.plans.clear()
    cold = []
    for step in range(4):
        cold.append(call(step))
        rotate_pair.plans.clear()
    for step in range(2):
        call(step)
    full_path, original = [], rope_cuda.pair_rotation
    monkeypatch.setattr(rope_cuda, "pair_rotation", lambda *a, **k: full_path.append(1) or original(*a, **k))
    for step in range(4):
        got = call(step)
        assert torch.equal(got[0], cold[step][0]) and torch.equal(got[1], cold[step][1]), (name, step)
    assert any(type(plan).__module__.endswith("rope_cuda_plan") for plan in rotate_pair.plans.values() if plan), name
    assert not full_path, f"{name}: {len(full_path)} of 4 planned calls took the full path"
    rotate_pair.plans.clear()


def test_a_planned_q_and_k_pair_in_a_cuda_graph_replays_bit_identically():
    from posenc.rotary.apply import rotate_pair
    from posenc.torch.hf import apply_rotary_pos_emb

    q, k = _hf_view(1, 1, 32, 128, torch.bfloat16, 0), _hf_view(1, 1, 8, 128, torch.bfloat16, 1)
    cos, sin = torch.empty(1, 1, 128, device="cuda", dtype=torch.bfloat16), torch.empty(1, 1, 128, device="cuda", dtype=torch.bfloat16)
    rotate_pair.plans.clear()
    graph, (rotated_q, rotated_k) = _captured(lambda: apply_rotary_pos_emb(q, k, cos, sin))  # (planned from the warm-up's third call)
    assert any(type(plan).__module__.endswith("rope_cuda_plan") for plan in rotate_pair.plans.values() if plan)
    for seed in range(3):
        angles = torch.rand(1, 1, 64, device="cuda", dtype=torch.float64, generator=torch.Generator(device="cuda").manual_seed(seed)) * 100
        cos.copy_(torch.cat([angles, angles], -1).cos())
        sin.copy_(torch.cat([angles, angles], -1).sin())
        q.copy_(torch.randn_like(q))
        graph.replay()
        rotate_pair.plans.clear()
        want_q, want_k = apply_rotary_pos_emb(q, k, cos, sin)  # (the full path)
        assert torch.equal(rotated_q, want_q) and torch.equal(rotated_k, want_k)


def _device_offset_calls():
    """``name -> (call, offset)``: decode steps whose offset is a tensor on the GPU that no
    part of the call reads (rope's float64 sums, the relative functions' clamps, the
    modules' protocol), the offset (0-d or one per batch row) it takes."""
    import posenc.torch as pt

    g = torch.Generator(device="cuda").manual_seed(3)
    r = lambda *shape: torch.randn(*shape, generator=g, device="cuda")  # noqa: E731
    x, q, k, v, t5, shaw = r(2, 32, 1, 128), r(2, 8, 1, 64), r(2, 8, 512, 64), r(2, 8, 512, 64), r(32, 8), r(17, 64)
    slopes = pe.alibi_slopes(8, xp=torch, device="cuda")
    one, rows = torch.tensor(511, device="cuda"), torch.tensor([511, 100], device="cuda")
    alibi, rotary = pt.ALiBi(8).cuda(), pt.RotaryEmbedding(64).cuda()
    return {
        "rope 0-d": (lambda: pe.rope(x, offset=one), one),
        "rope per row": (lambda: pe.rope(x, offset=rows), rows),
        "alibi_bias per row": (lambda: pe.alibi_bias(slopes, 1, 512, offset=rows), rows),
        "t5_bias 0-d": (lambda: pe.t5_bias(t5, 1, 512, offset=one), one),
        "shaw_logits per row": (lambda: pe.shaw_logits(q, k, shaw, max_distance=8, offset=rows), rows),
        "ALiBi.attend per row": (lambda: alibi.attend(q, k, v, causal=True, offset=rows), rows),
        "RotaryEmbedding.attend 0-d": (lambda: rotary.attend(q, k, v, causal=True, offset=one), one),
    }


@pytest.mark.parametrize("name", ["rope 0-d", "rope per row", "alibi_bias per row", "t5_bias 0-d", "shaw_logits per row", "ALiBi.attend per row", "RotaryEmbedding.attend 0-d"])
def test_decode_steps_of_device_offsets_replay_in_a_cuda_graph_bit_identically(name):
    """A decode step whose offset tensor stays on the GPU captures in a CUDA graph (a read of
    it, or a host copy, would fail the capture) and replays the eager call's bits for new
    offsets written into it, the host's extremes included."""
    call, offset = _device_offset_calls()[name]
    graph, out = _captured(call)
    for values in ([600, 7], [0, 40000], [2**62, -(2**62)], [-(2**63) + 600, 2**63 - 1]):
        offset.copy_(torch.tensor(values[: offset.numel()], device="cuda").reshape(offset.shape))
        graph.replay()
        assert torch.equal(out, call()), values


def test_apply_rope_and_t5_bias_in_a_cuda_graph_replay_bit_identically():
    x = torch.randn(1, 32, 1, 128, device="cuda", dtype=torch.bfloat16)
    cos = torch.empty(1, 128, device="cuda", dtype=torch.bfloat16)
    sin = torch.empty_like(cos)
    table = torch.randn(32, 8, device="cuda")
    pe.apply_rope.plans.clear()
    graph, (rotated, bias) = _captured(lambda: (pe.apply_rope(x, cos, sin), pe.t5_bias(table, 1, 4096, offset=4095, max_distance=64)))
    assert any(type(plan).__module__.endswith("rope_cuda_plan") for plan in pe.apply_rope.plans.values() if plan)
    for seed in range(3):
        angles = torch.rand(1, 64, device="cuda", dtype=torch.float64, generator=torch.Generator(device="cuda").manual_seed(seed)) * 100
        cos.copy_(torch.cat([angles, angles], -1).cos())
        sin.copy_(torch.cat([angles, angles], -1).sin())
        table.copy_(torch.randn_like(table))
        graph.replay()
        pe.apply_rope.plans.clear()  # (the comparison on the full path; the capture launched from the plan)
        assert torch.equal(rotated, pe.apply_rope(x, cos, sin))
        assert torch.equal(bias, pe.t5_bias(table, 1, 4096, offset=4095, max_distance=64))


def test_t5_bias_on_cuda_buckets_its_distances_in_one_launch(monkeypatch):
    """A T5 bias of CUDA tensors buckets its per-distance vector with the bucket kernel (one
    launch, not the reference's thirty small operations), to the CPU's numbers bit for bit;
    ``pe.t5_bucket`` of a 1-D CUDA tensor too, an int32 one widened to the index dtype first
    (``check.widened``: its own arithmetic would wrap at the most negative int32)."""
    from posenc._kernels import buckets_cuda

    launches = counting_kernel_keys(monkeypatch, buckets_cuda)
    table = torch.randn(32, 8)
    for q_len, k_len, bidirectional in ((7, 300, True), (1, 4096, False)):
        got = pe.t5_bias(table.cuda(), q_len, k_len, bidirectional=bidirectional)
        assert torch.equal(got.cpu(), pe.t5_bias(table, q_len, k_len, bidirectional=bidirectional))
    rel = torch.arange(-5000, 5000, dtype=torch.int32)
    assert torch.equal(pe.t5_bucket(rel.cuda()).cpu(), pe.t5_bucket(rel))
    assert launches == [("int64",), ("int64",), ("int64",)]


@pytest.mark.parametrize("name", ["llama[default]", "gpt_neox[partial]", "llama[yarn]"])
def test_a_patched_model_on_cuda_gives_the_originals_logits_and_greedy_tokens(name):
    """A patched model on the GPU against the original on the GPU (the tolerance and the
    inputs of test_hf.py): its decode steps rotate q and k from ``rotate_pair``'s CUDA plan."""
    import copy

    from hf_models import PROMPT, build, generate, inputs, logits

    from posenc.rotary.apply import rotate_pair
    from posenc.torch import patch_hf

    original = build(name).cuda()
    patched = patch_hf(copy.deepcopy(original))
    ids, mask = (t.cuda() for t in inputs())
    real = mask.bool()[..., None].expand(-1, -1, original.config.vocab_size)
    want, got = logits(original, ids, mask)[real], logits(patched, ids, mask)[real]
    assert float((want - got).abs().max()) <= 1e-5 * float(got.abs().max())
    rotate_pair.plans.clear()
    prompt, prompt_mask = ids[:, :PROMPT], mask[:, :PROMPT]
    assert torch.equal(generate(original, prompt, prompt_mask), generate(patched, prompt, prompt_mask))
    assert any(type(plan).__module__.endswith("rope_cuda_plan") for plan in rotate_pair.plans.values() if plan)


def _recorded_graphs():
    """How many CUDA graphs ``torch.compile(mode="reduce-overhead")``'s graph trees have
    recorded on the current device."""
    from torch._inductor import cudagraph_trees

    manager = cudagraph_trees.get_manager(torch.cuda.current_device(), create_if_none_exists=False)
    nodes = [] if manager is None else [n for ns in manager.roots.values() for n in ns]
    count = 0
    while nodes:
        count += len(nodes)
        nodes = [c for n in nodes for cs in n.children.values() for c in cs]
    return count


# torch 2.11's CUDA graph trees capture an empty graph of their own when they start, and say so.
@pytest.mark.filterwarnings("ignore:The CUDA Graph is empty:UserWarning")
def test_patched_model_under_reduce_overhead_compile_gives_the_eager_greedy_tokens():
    """transformers' own compiled decoding (a static cache made before the compiled step, the
    decode step compiled with ``mode="reduce-overhead"``, the prefill eager): the graph trees
    record decode steps and replay them, the rotary tables of the GPU position ids
    (``posenc::rope_cos_sin``) and q and k's rotation inside captured graphs, and the tokens
    are eager decoding's."""
    from hf_models import build
    from transformers import CompileConfig

    from posenc.torch import patch_hf

    model = patch_hf(build("llama[default]")).cuda()
    ids = torch.arange(1, 11, device="cuda")[None]
    options = dict(max_new_tokens=12, do_sample=False, pad_token_id=0, cache_implementation="static")
    with torch.no_grad():
        eager = model.generate(ids, disable_compile=True, **options)
        recorded = _recorded_graphs()
        compiled = model.generate(ids, compile_config=CompileConfig(mode="reduce-overhead", fullgraph=False), **options)
    assert _recorded_graphs() > recorded
    assert torch.equal(compiled, eager)


# (torch 2.11's graph trees say when a graph they capture is empty)
@pytest.mark.filterwarnings("ignore:The CUDA Graph is empty:UserWarning")
def test_frequencies_first_made_in_a_graph_tree_warm_up_stay_out_of_its_memory_pool(monkeypatch):
    """The op a compiled patched model calls for GPU position ids, first called inside a
    ``reduce-overhead`` graph tree's warm-up (nothing kept yet): its kept frequencies are
    made outside the trees' private memory pool, whose checks (``slow_path_cudagraph_asserts``)
    find no tensor they do not track, and the replayed steps give the eager op's bits."""
    from collections import OrderedDict

    from posenc import _device_constants
    from posenc.torch import _ops
    from posenc.torch._rows import frequencies_name

    monkeypatch.setattr(_device_constants, "_kept", OrderedDict())
    name = frequencies_name(tuple(pe.rope_frequencies(32, base=777.0)[0].tolist()), 1.0)
    step = torch.compile(lambda p: _ops.rope_cos_sin_op(p, name, torch.float32) * 2.0, mode="reduce-overhead")
    recorded = _recorded_graphs()
    with torch._inductor.config.patch({"triton.slow_path_cudagraph_asserts": True}):
        for position in range(6):
            p = torch.tensor([[position * 1000]], device="cuda")
            got = step(p).clone()
            assert torch.equal(got, _ops.rope_cos_sin_op(p, name, torch.float32) * 2.0)
    assert _recorded_graphs() > recorded


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_tables_of_gpu_positions_in_a_cuda_graph_replay_bit_identically(dtype):
    """``rope_cos_sin`` of positions on the GPU, and the op a compiled patched model calls
    for them, neither copy from the host nor wait once their frequencies are kept on the
    device: they can be captured, and a replay gives a fresh call's bits."""
    from posenc.torch import _ops
    from posenc.torch._rows import frequencies_name

    inv_freq = pe.rope_frequencies(128)[0]
    name = frequencies_name(tuple(inv_freq.tolist()), 1.0)
    positions = torch.tensor([[5]], device="cuda")
    graph, (cos, sin, stacked) = _captured(lambda: (*pe.rope_cos_sin(positions, inv_freq, dtype=dtype), _ops.rope_cos_sin_op(positions, name, dtype)))
    for step in (6, 700, 40000, 1_000_000):
        positions.fill_(step)
        graph.replay()
        want_cos, want_sin = pe.rope_cos_sin(positions, inv_freq, dtype=dtype)
        assert torch.equal(cos, want_cos) and torch.equal(sin, want_sin)
        assert torch.equal(stacked, torch.stack([want_cos, want_sin], dim=-2))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_compiled_apply_rope_on_cuda_fuses_in_the_kernels_arithmetic(dtype, monkeypatch):
    """Under inductor, ``apply_rope`` on CUDA tensors is torch operations (a Triton kernel fused
    with its neighbours), not the custom op, and gives the numba.cuda kernel's bits
    (``arrays.check_compiled_apply_rope_fuses``)."""
    from arrays import check_compiled_apply_rope_fuses

    check_compiled_apply_rope_fuses(dtype, "cuda", monkeypatch)


def test_tensors_on_two_gpus_are_refused_before_any_launch(counted_launches):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    x = torch.randn(1, 4, 3, 8, device="cuda:0")
    with pytest.raises(ValueError, match="different devices"):
        pe.rope(x, torch.arange(3, device="cuda:1"))
    with pytest.raises(ValueError, match="out"):
        pe.rope(x, torch.arange(3, device="cuda:0"), out=torch.empty_like(x, device="cuda:1"))
    assert counted_launches == []


def test_a_cpu_tensor_beside_a_cuda_one_is_refused(counted_launches):
    x = torch.randn(1, 4, 3, 8, device="cuda")
    with pytest.raises(ValueError, match="different devices"):
        pe.rope(x, torch.arange(3))
    with pytest.raises(ValueError, match="out"):
        pe.apply_rope(x, torch.ones(3, 8, device="cuda"), torch.zeros(3, 8, device="cuda"), out=torch.empty(1, 4, 3, 8))
    assert counted_launches == []
