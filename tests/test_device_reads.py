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


def _per_row_calls():
    """``name -> offset -> call(c)``: the calls of an offset tensor (one per batch row, or
    0-d) whose result saturates (distances clipped to ``±K``, T5's last buckets, CoPE's
    causal gates), their arrays made by ``c``."""
    g = torch.Generator().manual_seed(0)
    r = lambda *shape: torch.randn(*shape, generator=g)  # noqa: E731
    weights, v, table_v = torch.rand(4, 2, 3, 6, generator=g), r(4, 2, 6, 5), r(2 * K + 1, 5)
    q, k, table_k, t5 = r(4, 2, 3, 8), r(4, 2, 6, 8), r(2 * K + 1, 8), r(32, 2)
    pos_q, pos_k, deberta = r(2 * K, 8), r(2 * K, 8), r(2 * K, 2)
    return {
        "shaw_output": lambda o: lambda c: pe.shaw_output(c(weights), c(v), c(table_v), max_distance=K, offset=c(torch.tensor(o))),
        "shaw_logits": lambda o: lambda c: pe.shaw_logits(c(q), c(k), c(table_k), max_distance=K, offset=c(torch.tensor(o))),
        "deberta_logits": lambda o: lambda c: pe.deberta_logits(c(q), c(k), c(pos_q), c(pos_k), max_distance=K, offset=c(torch.tensor(o))),
        "relative_bias deberta": lambda o: lambda c: pe.relative_bias("deberta", c(deberta), 3, 6, max_distance=K, offset=c(torch.tensor(o))),
        "t5_bias": lambda o: lambda c: pe.t5_bias(c(t5), 3, 6, offset=c(torch.tensor(o))),
        "t5_bias unidirectional": lambda o: lambda c: pe.t5_bias(c(t5), 3, 6, offset=c(torch.tensor(o)), bidirectional=False, max_distance=20),
        "cope_logits": lambda o: lambda c: pe.cope_logits(c(q), c(k), c(table_k[:6]), offset=c(torch.tensor(o))),
        "cope_positions": lambda o: lambda c: pe.cope_positions(c(q), c(k), offset=c(torch.tensor(o))),
    }


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


@pytest.mark.parametrize("name", list(_per_row_calls()))
def test_one_offset_per_row_reads_nothing_back_on_a_gpu(name):
    """Per-row ``shaw_output`` read every offset's range back (``_validate._sum_leaves``: two
    reads) and copied ``[low, high]`` onto the device (a pageable host copy, its result unused
    but for Dask); ``shaw_logits`` and ``t5_bias`` read eight values (the offsets' and the
    positions' extremes, ``_validate.shifted`` and ``differences``), each a synchronisation.
    Their distances saturate (clipped to ``±K``, T5's last bucket on each side): the offsets
    are clamped on the device instead, to where every distance of a row is already past."""
    call = _per_row_calls()[name]
    got, log = _on_fake_gpu(call([5, -2, 0, 9]))
    assert not log, log.lines()
    with pe.use_backend("reference"):
        want = call([5, -2, 0, 9])(lambda t: t)
    assert torch.equal(got, want)


@pytest.mark.parametrize("name", list(_per_row_calls()))
def test_offsets_past_the_int64_sums_give_the_saturated_rows_on_a_gpu(name):
    """Offsets whose sums would leave int64, refused on the host (where reading them is free),
    are clamped on a GPU: each row is the one of any offset as far out on its side."""
    call = _per_row_calls()[name]
    got, log = _on_fake_gpu(call(EXTREME))
    assert not log, log.lines()
    with pe.use_backend("reference"):
        want = call([-1000, 1000, 0, 2])(lambda t: t)
    assert torch.equal(got, want)
    with pytest.raises(ValueError, match="must stay within int64"):
        call(EXTREME)(lambda t: t)


@pytest.mark.parametrize("name", list(_per_row_calls()))
def test_one_offset_as_a_0d_array_is_clamped_not_read_on_a_gpu(name):
    """A 0-d offset tensor (a decode step's position, kept on the device for a CUDA graph)
    was read to a Python int (``_validate.integer``: one synchronisation a call) to check
    the sums; where the result saturates it is clamped on the device instead: the bits of
    the int offset, and those of an offset as far out for offsets past the int64 sums
    (refused on the host)."""
    call = _per_row_calls()[name]
    for offset, same in ((5, 5), (-(2**63), -1000), (2**63 - 1, 1000)):
        got, log = _on_fake_gpu(call(offset))
        assert not log, log.lines()
        with pe.use_backend("reference"):
            assert torch.equal(got, call(same)(lambda t: t))
    with pytest.raises(ValueError, match="int64"):
        call(2**63 - 1)(lambda t: t)


Q, KEYS = 3, 6  # the lengths of the unbounded calls
# The offsets past int64 of EXTREME as the nearest ones whose every sum fits int64.
NEAREST = [-(2**63) + KEYS - 1, 2**63 - 1 - (Q - 1), 0, 2]


def _unbounded_calls():
    """``name -> offset -> call(c)``: the calls whose result changes with the distance however
    far (ALiBi's linear bias, DeBERTa's log buckets, KERPLE's, Sandwich's, FIRE's, TENER's
    sinusoid of the signed distance), of an offset tensor (one per batch row, or 0-d)."""
    g = torch.Generator().manual_seed(2)
    r = lambda *shape: torch.randn(*shape, generator=g)  # noqa: E731
    q, k, pos_q, pos_k, deberta = r(4, 2, Q, 8), r(4, 2, KEYS, 8), r(2 * K, 8), r(2 * K, 8), r(2 * K, 2)
    u, v = r(2, 1, 8), r(2, 1, 8)
    slopes = torch.tensor([0.75, 2.0**-13, 3.0])
    log = {"bucket_size": 4, "max_position": 16}
    return {
        "alibi_bias": lambda o: lambda c: pe.alibi_bias(c(slopes), Q, KEYS, offset=c(torch.tensor(o))),
        "alibi_bias float64": lambda o: lambda c: pe.alibi_bias(c(slopes.double()), Q, KEYS, offset=c(torch.tensor(o))),
        "alibi_bias symmetric": lambda o: lambda c: pe.alibi_bias(c(slopes), Q, KEYS, offset=c(torch.tensor(o)), symmetric=True),
        "alibi_bias float16": lambda o: lambda c: pe.alibi_bias(c(slopes.half()), Q, KEYS, offset=c(torch.tensor(o))),
        "deberta_logits log buckets": lambda o: lambda c: pe.deberta_logits(c(q), c(k), c(pos_q), c(pos_k), max_distance=K, offset=c(torch.tensor(o)), **log),
        "relative_bias deberta log buckets": lambda o: lambda c: pe.relative_bias("deberta", c(deberta), Q, KEYS, max_distance=K, offset=c(torch.tensor(o)), **log),
        "kerple_bias log": lambda o: lambda c: pe.kerple_bias(c(slopes), c(slopes.flip(0)), Q, KEYS, offset=c(torch.tensor(o))),
        "kerple_bias power": lambda o: lambda c: pe.kerple_bias(c(slopes), c(slopes / 2), Q, KEYS, kind="power", offset=c(torch.tensor(o))),
        "sandwich_bias": lambda o: lambda c: pe.sandwich_bias(Q, KEYS, 8, heads=2, offset=c(torch.tensor(o))),
        "fire_bias": lambda o: lambda c: pe.fire_bias(lambda x: x @ c(slopes[None, :2]), Q, KEYS, offset=c(torch.tensor(o)), c=c(slopes[0]), threshold=c(slopes[2])),
        "tener_logits": lambda o: lambda c: pe.tener_logits(c(q), c(k), c(u), c(v), offset=c(torch.tensor(o))),
    }


def _bits(call, offset):
    with pe.use_backend("reference"):
        return call(offset)(lambda t: t)


@pytest.mark.parametrize("name", list(_unbounded_calls()))
def test_an_unbounded_bias_reads_no_offset_per_row_on_a_gpu(name):
    """ALiBi's bias and DeBERTa's log buckets change with the distance however far: their
    per-row offsets were read on a GPU (``_validate.shifted`` and ``differences``: 8 reads
    a call) to refuse a sum past int64. They are clamped on the device to the offsets whose
    sums fit int64 instead (:func:`posenc.relative.indices.saturated` with ``reach`` inf):
    the host's bits for every offset the host accepts, its extremes included."""
    call = _unbounded_calls()[name]
    for offsets in ([5, -2, 0, 9], NEAREST):
        got, log = _on_fake_gpu(call(offsets))
        assert not log, log.lines()
        assert torch.equal(got, _bits(call, offsets))


@pytest.mark.parametrize("name", list(_unbounded_calls()))
def test_an_unbounded_bias_saturates_offsets_past_int64_on_a_gpu(name):
    """Offsets whose sums would leave int64 (a ``ValueError`` on the host) give on a GPU the
    rows of the nearest offsets whose sums fit: no wrapped distance."""
    call = _unbounded_calls()[name]
    got, log = _on_fake_gpu(call(EXTREME))
    assert not log, log.lines()
    assert torch.equal(got, _bits(call, NEAREST))  # (float16's are infinite there, as on the host)
    with pytest.raises(ValueError, match="must stay within int64"):
        _bits(call, EXTREME)


@pytest.mark.parametrize("name", list(_unbounded_calls()))
def test_an_unbounded_bias_reads_no_0d_offset_on_a_gpu(name):
    """A 0-d offset tensor was read (``_validate.integer``: one synchronisation a call); it is
    clamped on the device as the per-row ones are: the int offset's bits up to the last
    offset the host accepts, the rows of those for offsets past them."""
    call = _unbounded_calls()[name]
    for offset, same in ((5, 5), *zip(NEAREST[:2], NEAREST[:2]), *zip(EXTREME[:2], NEAREST[:2])):
        got, log = _on_fake_gpu(call(offset))
        assert not log, log.lines()
        assert torch.equal(got, _bits(call, same)), offset
    with pytest.raises(ValueError, match="int64"):
        _bits(call, 2**63 - 1)


def test_alibi_of_float32_slopes_past_int64_is_the_exact_distance_rounded():
    """For float32 slopes the saturated rows are those of the exact distances (within ``Q +
    KEYS`` of ``2**63``, every one rounds to ``2**63`` in float32): ``-slope * 2**63``."""
    slopes = torch.tensor([0.75, 2.0**-13])
    got, _ = _on_fake_gpu(lambda c: pe.alibi_bias(c(slopes), Q, KEYS, offset=c(torch.tensor(2**63 - 1))))
    assert torch.equal(got, (-slopes * 2.0**63)[:, None, None].expand(2, Q, KEYS))


def test_the_per_distance_vector_of_a_0d_offset_reads_nothing_on_a_gpu():
    """``relative_bias_vector`` read a 0-d GPU offset (1 read) for every kind; it is clamped as
    ``relative_bias``'s is: the host's bits."""
    g = torch.Generator().manual_seed(3)
    params = {"alibi": (torch.rand(3, generator=g), {}), "t5": (torch.randn(32, 2, generator=g), {}), "shaw": (torch.randn(2 * K + 1, 2, generator=g), {"max_distance": K})}
    for kind, (p, options) in params.items():
        for offset in (5, -(2**63) + KEYS - 1, 2**63 - Q):
            def call(c):
                return pe.relative_bias_vector(kind, c(p), Q, KEYS, offset=c(torch.tensor(offset)), **options)

            got, log = _on_fake_gpu(call)
            assert not log, (kind, log.lines())
            with pe.use_backend("reference"):
                assert torch.equal(got, call(lambda t: t)), (kind, offset)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_rope_cos_sin_of_frequencies_on_a_gpu_reads_none_of_them(dtype):
    """``rope_cos_sin(positions, inv_freq)`` with ``inv_freq`` on the GPU (a model's own
    buffer) read each frequency to the host, ``float(inv_freq[i])``: ``r / 2`` synchronisations
    a call (64 for a head of 128). They are multiplied on the device now, the same float64
    products: the same bits."""
    inv_freq = torch.from_numpy(pe.rope_frequencies(128)[0]).to(dtype)
    positions = torch.arange(40).reshape(2, 20) * 997

    def call(c):
        return torch.stack(pe.rope_cos_sin(c(positions), c(inv_freq), dtype=torch.float32))

    got, log = _on_fake_gpu(call)
    assert not log, log.lines()
    with pe.use_backend("reference"):
        assert torch.equal(got, call(lambda t: t))


def test_fire_float_options_are_filled_in_on_the_gpu():
    """``fire_distances`` with Python floats ``c`` and ``threshold`` copied each from host
    memory onto the device on every call (``xp.asarray``: 2 copies); they are filled in
    there now: no copy, the same bits."""

    def call(device):
        return lambda c: pe.fire_distances(Q, KEYS, c=0.3, threshold=7.0, xp=torch, device=torch.device(device))

    got, log = _on_fake_gpu(call("cuda"))
    assert not log, log.lines()
    with pe.use_backend("reference"):
        assert torch.equal(got, call("cpu")(None))


def _on_fake_gpu_module(module, call):
    """``call(c)`` of ``module`` with its parameters and buffers on the fake GPU."""
    saved = [(d, n, t) for m in module.modules() for d in (m._parameters, m._buffers) for n, t in d.items() if t is not None]
    try:
        for d, n, t in saved:
            d[n] = fake_cuda.cuda(t)
        return _on_fake_gpu(call)
    finally:
        for d, n, t in saved:
            d[n] = t


def test_a_module_with_one_offset_per_row_reads_nothing_back_on_a_gpu():
    """The modules' protocol checked the per-row offsets itself (``_protocol.row_offsets``: two
    reads and a pageable copy of ``[low, high]``) before the function it calls checked them
    again; on a GPU that function alone does (ShawRelative's clamps them): 0 reads for
    ``ShawRelative.attend`` (3 on main), the CPU module's bits."""
    import posenc.torch as pt

    g = torch.Generator().manual_seed(1)
    m = pt.ShawRelative(8, max_distance=K).requires_grad_(False)
    q, k, v = (torch.randn(4, 2, n, 8, generator=g) for n in (1, 6, 6))

    def call(c):
        return m(c(q), c(k), c(v), offset=c(torch.tensor([5, -2, 0, 9])))

    got, log = _on_fake_gpu_module(m, call)
    assert not log, log.lines()
    with pe.use_backend("reference"):
        assert torch.equal(got, call(lambda t: t))


@pytest.mark.parametrize("name", ["Sandwich", "TENERRelative", "TransformerXLRelative", "XPos"])
def test_a_decode_step_of_a_module_built_on_host_constants_copies_none_after_the_first(name):
    """Sandwich's head scales, the sinusoidal wavelengths of TENER's and Transformer-XL's
    tables and xPos's exponents were copied from host memory onto the GPU on every call
    (``xp.asarray(host list, device=...)``: a pageable copy and a wait, which a CUDA graph
    capture refuses); they are kept on the device now (``_xp.constant_on``), as rope's
    frequencies are: 0 copies from the second call on (1-2 a call on main), the CPU
    module's bits."""
    import posenc.torch as pt

    m = {"Sandwich": lambda: pt.Sandwich(2, dim=8), "XPos": lambda: pt.XPos(8)}.get(name, lambda: getattr(pt, name)(2, 8))()
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, 2, n, 8, generator=g) for n in (1, 7, 7))

    def call(c):
        return m.attend(c(q), c(k), c(v), offset=6)

    _on_fake_gpu_module(m, call)  # (the first call keeps its constants)
    got, log = _on_fake_gpu_module(m, call)
    assert not log, log.lines()
    with pe.use_backend("reference"):
        assert torch.equal(got, call(lambda t: t))


def _modules():
    """The modules that take one offset per row (``takes_row_offsets``) and whose functions
    read no offset tensor on a GPU (TUPE's checks its rows of ``p``)."""
    import posenc.torch as pt

    return {
        "ALiBi": lambda: pt.ALiBi(2),
        "T5RelativeBias": lambda: pt.T5RelativeBias(2),
        "ShawRelative": lambda: pt.ShawRelative(8, max_distance=K),
        "DeBERTaRelative": lambda: pt.DeBERTaRelative(2, 8, max_distance=K),
        "DeBERTaRelative log buckets": lambda: pt.DeBERTaRelative(2, 8, max_distance=K, bucket_size=4, max_position=16),
        "KERPLE": lambda: pt.KERPLE(2),
        "Sandwich": lambda: pt.Sandwich(2, dim=8),
        "FIRE": lambda: pt.FIRE(2),
        "CoPE": lambda: pt.CoPE(8),
        "TENERRelative": lambda: pt.TENERRelative(2, 8),
    }


@pytest.mark.parametrize("offset", [5, [5, -2, 0, 9]], ids=["0-d", "per row"])
@pytest.mark.parametrize("name", list(_modules()))
def test_a_module_call_with_an_offset_tensor_reads_nothing_on_a_gpu(name, offset):
    """The module protocol read a 0-d offset tensor (``_alignment`` and ``attend``:
    ``indices.query_offset``, 1 read) and, for ``causal=True``, one per row twice more
    (``allowed_keys``: ``relative_positions``' range check). A 0-d one on the module's
    accelerator is now validated and passed on as per-row ones are, and the causal mask
    clamps the offsets to ``[-q_len, k_len]`` (where it stops changing): 0 reads, the CPU
    module's bits, for ``logits`` and a causal ``attend``."""
    torch.manual_seed(4)
    m = _modules()[name]().requires_grad_(False)
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(4, 2, n, 8, generator=g) for n in (Q, KEYS, KEYS))

    def call(c):
        o = c(torch.tensor(offset))
        return torch.stack([m.logits(c(q), c(k), offset=o), m.attend(c(q), c(k), c(v), causal=True, offset=o)[..., :1].expand(4, 2, Q, KEYS)])

    got, log = _on_fake_gpu_module(m, call)
    assert not log, log.lines()
    with pe.use_backend("reference"):
        assert torch.equal(got, call(lambda t: t))


def test_mrope_tables_of_gpu_frequencies_copy_no_index_after_the_first_call():
    """``mrope_cos_sin`` with ``inv_freq`` on the GPU copied the indices of the frequencies
    each section takes from a host list on every call (one pageable copy); they are kept
    on the device now: none from the second call on, the CPU call's bits."""
    inv_freq = torch.from_numpy(pe.rope_frequencies(16)[0])
    positions = torch.arange(15).reshape(3, 5) * 7

    def call(c):
        return torch.stack(pe.mrope_cos_sin(c(positions), c(inv_freq), [4, 2, 2], interleaved=True))

    _on_fake_gpu(call)
    got, log = _on_fake_gpu(call)
    assert not log, log.lines()
    with pe.use_backend("reference"):
        assert torch.equal(got, call(lambda t: t))


@pytest.mark.parametrize("name", ["TENERRelative", "TransformerXLRelative"])
def test_a_sinusoid_module_reads_no_0d_offset_on_a_gpu(name):
    """``TENERRelative`` and ``TransformerXLRelative`` (one offset for every row) read a 0-d
    offset tensor in the protocol (1 read); they keep it on the device (``tener_logits`` and
    ``relative_embeddings`` clamp it): 0 reads, the CPU module's bits, for offsets 5, the
    extremes the host accepts, and past int64 (those of the nearest accepted)."""
    import posenc.torch as pt

    torch.manual_seed(8)
    m = getattr(pt, name)(2, 8).requires_grad_(False)
    g = torch.Generator().manual_seed(9)
    q, k, v = (torch.randn(4, 2, n, 8, generator=g) for n in (Q, KEYS, KEYS))
    for offset, same in ((5, 5), *zip(NEAREST[:2], NEAREST[:2]), *zip(EXTREME[:2], NEAREST[:2])):
        got, log = _on_fake_gpu_module(m, lambda c: m.attend(c(q), c(k), c(v), causal=True, offset=c(torch.tensor(offset))))
        assert not log, log.lines()
        with pe.use_backend("reference"):
            assert torch.equal(got, m.attend(q, k, v, causal=True, offset=torch.tensor(same)))


@pytest.mark.parametrize("name", ["NoPE", "SinusoidalEmbedding", "LearnedEmbedding", "RotaryEmbedding", "XPos"])
def test_a_module_of_one_offset_for_every_row_reads_no_0d_offset_on_a_gpu(name):
    """The protocol read a 0-d offset tensor of these modules (``_alignment``: 1 read a call),
    whose logits take it as ``pe.rope`` does (float64 sums on the device), clamp it as ALiBi
    does (xPos's scale) or use it only in the causal mask (which clamps it): 0 reads, the
    CPU module's bits for offset 5 and the extremes the host accepts; past int64 (refused on
    the host) those of the nearest accepted offsets. (A RotaryEmbedding of a length-dependent
    scaling reads it once, for the length that decides its frequencies on the host.)"""
    import posenc.torch as pt

    torch.manual_seed(10)
    m = {
        "NoPE": lambda: pt.NoPE(),
        "SinusoidalEmbedding": lambda: pt.SinusoidalEmbedding(8),
        "LearnedEmbedding": lambda: pt.LearnedEmbedding(16, 8),
        "RotaryEmbedding": lambda: pt.RotaryEmbedding(8),
        "XPos": lambda: pt.XPos(8),
    }[name]().requires_grad_(False)
    g = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(4, 2, n, 8, generator=g) for n in (Q, KEYS, KEYS))
    cases = [(5, 5), *zip(NEAREST[:2], NEAREST[:2])]
    if name != "RotaryEmbedding":  # (rope rotates past int64 at the float64 sums: tested with pe.rope)
        cases += list(zip(EXTREME[:2], NEAREST[:2]))
    for offset, same in cases:
        got, log = _on_fake_gpu_module(m, lambda c: m.attend(c(q), c(k), c(v), causal=True, offset=c(torch.tensor(offset))))
        assert not log, log.lines()
        with pe.use_backend("reference"):
            assert torch.equal(got, m.attend(q, k, v, causal=True, offset=torch.tensor(same)))


def test_a_causal_module_call_with_offsets_past_int64_is_masked_as_the_nearest_on_a_gpu():
    """The causal mask of offsets past the int64 sums (refused on the host) is that of the
    nearest offsets whose sums fit, as ALiBi's bias is: no wrapped position."""
    import posenc.torch as pt

    m = pt.ALiBi(2)
    g = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(4, 2, n, 8, generator=g) for n in (Q, KEYS, KEYS))
    for offset, nearest in ((EXTREME, NEAREST), (2**63 - 1, NEAREST[1]), (-(2**63), NEAREST[0])):
        got, log = _on_fake_gpu_module(m, lambda c: m.attend(c(q), c(k), c(v), causal=True, offset=c(torch.tensor(offset))))
        assert not log, log.lines()
        with pe.use_backend("reference"):
            assert torch.equal(got, m.attend(q, k, v, causal=True, offset=torch.tensor(nearest)))


@pytest.mark.parametrize("name", list(_modules()) + ["RotaryEmbedding"])
def test_a_module_refuses_an_offset_mask_or_query_on_another_device_before_computing(name):
    """A module on ``cuda:0`` had read a 0-d offset on ``cuda:1`` (``indices.query_offset``: a
    synchronisation on a GPU the call does not run on), and had let a mask on the CPU or on
    ``cuda:1`` (and, for ALiBi, T5, KERPLE and FIRE, queries on another device than its
    parameters) go on to torch's ``RuntimeError`` deep in the call. Now each is a
    ``ValueError`` naming it, before anything is read or computed."""
    import posenc.torch as pt

    m = {**_modules(), "RotaryEmbedding": lambda: pt.RotaryEmbedding(8)}[name]().requires_grad_(False)
    g = torch.Generator().manual_seed(8)
    q, k, v = (torch.randn(4, 2, n, 8, generator=g) for n in (Q, KEYS, KEYS))
    c, c1, mask = fake_cuda.cuda, (lambda t: fake_cuda.cuda(t, 1)), torch.ones(Q, KEYS, dtype=torch.bool)
    calls = {
        "^offset is on cuda:1": lambda: m.attend(c(q), c(k), c(v), causal=True, offset=c1(torch.tensor(2))),
        "^mask must be on device cuda:0.*got cpu": lambda: m.attend(c(q), c(k), c(v), mask=mask),
        "^mask must be on device cuda:0.*got cuda:1": lambda: m.attend(c(q), c(k), c(v), mask=c1(mask)),
    }
    if any(True for _ in m.parameters()) or any(True for _ in m.buffers()):
        calls["is on cuda:0, q on cpu"] = lambda: m.attend(q, k, v)
        calls["is on cuda:0, q on cuda:1"] = lambda: m.logits(c1(q), c1(k))
    else:  # (its constants are made on q's device)
        calls["^offset is on cuda:0"] = lambda: m.attend(c1(q), c1(k), c1(v), causal=True, offset=c(torch.tensor(2)))
    for message, call in calls.items():
        _, log = _on_fake_gpu_module(m, lambda _: _refused(message, call))
        assert not log, (message, log.lines())


def _refused(message, call):
    with pytest.raises(ValueError, match=message):
        call()


def test_offsets_beside_positions_are_still_refused_on_a_gpu():
    """Per-row offsets added to given query positions are read and checked on a GPU too (the
    sums of both are not clamped), so one past the int64 sums is still a ``ValueError``."""
    import posenc.torch as pt

    m = pt.ALiBi(2)
    positions = torch.arange(6).expand(4, 6)
    with pytest.raises(ValueError, match="must stay within int64"):
        _on_fake_gpu_module(m, lambda c: m(1, 6, offset=c(torch.tensor(EXTREME)), query_positions=c(positions[:, -1:]), key_positions=c(positions)))


def test_the_alibi_module_saturates_offsets_past_int64_on_a_gpu():
    """``ALiBi`` with one offset per row read them (10 reads: its protocol's ``row_offsets``
    left them to ``alibi_bias``, which read and refused those past int64, a ``ValueError``
    on main); it now reads none and gives the rows of the nearest offsets whose sums fit."""
    import posenc.torch as pt

    m = pt.ALiBi(2)
    got, log = _on_fake_gpu_module(m, lambda c: m(Q, KEYS, offset=c(torch.tensor(EXTREME))))
    assert not log, log.lines()
    assert torch.equal(got, m(Q, KEYS, offset=torch.tensor(NEAREST)))


def test_what_needs_host_values_or_another_device_still_reads_them():
    """GPU frequencies beside CPU positions, GPU frequencies of ``rerotate`` beside host
    ones, and a GPU offset beside a CPU table are read as before (and work)."""
    freqs = torch.from_numpy(pe.rope_frequencies(8)[0])
    with pe.use_backend("reference"), fake_cuda.recording() as log:
        cos, _ = pe.rope_cos_sin(torch.arange(3), fake_cuda.cuda(freqs))
        assert cos.device.type == "cpu" and len(log) == 4
        pe.rerotate(fake_cuda.cuda(torch.randn(2, 3, 8)), fake_cuda.cuda(torch.tensor(2)), inv_freq=fake_cuda.cuda(freqs), new_inv_freq=freqs.numpy())
        assert len(log) == 8
        assert pe.t5_bias(torch.randn(32, 2), 1, 6, offset=fake_cuda.cuda(torch.tensor(5))).device.type == "cpu" and len(log) == 9


def _frequency_calls():
    """``name -> call(a, f)``: calls of frequencies ``f`` (``new_inv_freq``'s where named),
    their other arrays made by ``a``."""
    x, freqs = torch.randn(2, 3, 8, generator=torch.Generator().manual_seed(5)), torch.from_numpy(pe.rope_frequencies(8)[0])
    return {
        "rope_cos_sin": lambda a, f: pe.rope_cos_sin(a(torch.arange(3)), f),
        "mrope_cos_sin": lambda a, f: pe.mrope_cos_sin(a(torch.zeros(3, 4, dtype=torch.int64)), f, [2, 1, 1]),
        "rerotate": lambda a, f: pe.rerotate(a(x), a(torch.tensor(2)), f),
        "rerotate new_inv_freq": lambda a, f: pe.rerotate(a(x), a(torch.arange(3)), a(freqs), new_inv_freq=f),
        "rerotate new_inv_freq beside host inv_freq": lambda a, f: pe.rerotate(a(x), a(torch.arange(3)), freqs.numpy(), new_inv_freq=f),
    }, freqs


@pytest.mark.parametrize("name", list(_frequency_calls()[0]))
def test_frequencies_on_another_gpu_are_refused_unread(name):
    """Frequencies on ``cuda:1`` beside positions or keys on ``cuda:0`` (or the other way
    round) were read back value by value (``_args._host_floats``: one synchronisation each,
    on a GPU the call does not run on) and the call went on. Now a ``ValueError`` naming
    them, before anything is read; on the CPU they are read as before."""
    calls, freqs = _frequency_calls()
    call, what = calls[name], "new_inv_freq" if "new_inv_freq" in name else "inv_freq"
    with pe.use_backend("reference"), fake_cuda.recording() as log:
        for arrays, there in ((fake_cuda.cuda, 1), (lambda t: fake_cuda.cuda(t, 1), 0)):
            with pytest.raises(ValueError, match=f"^{what} is on cuda:{there}"):
                call(arrays, fake_cuda.cuda(freqs, there))
        assert not log, log.lines()
        got = call(fake_cuda.cuda, freqs)
    with pe.use_backend("reference"):
        want = call(lambda t: t, freqs)
    for g, w in zip(got if isinstance(got, tuple) else [got], want if isinstance(want, tuple) else [want]):
        assert torch.equal(fake_cuda.host(g), w)


@pytest.mark.parametrize("name", ["cope_logits pos_emb", "cope_logits mask", "cope_positions mask"])
def test_cope_refuses_a_table_or_mask_on_another_device_before_computing(name):
    """CoPE checked ``q`` and ``k`` for one device but not ``pos_emb`` nor ``mask``: one on
    the CPU or on ``cuda:1`` beside ``cuda:0`` queries went on to the matmul or ``where``
    (torch's ``RuntimeError`` there on a GPU; here the harness records the CPU operand).
    Now a ``ValueError`` naming it first; a 0-d CPU mask (a scalar) is taken as before."""
    g = torch.Generator().manual_seed(6)
    q, k, table, mask = torch.randn(2, 3, 4, 8, generator=g), torch.randn(2, 3, 6, 8, generator=g), torch.randn(6, 8, generator=g), torch.rand(4, 6, generator=g) > 0.3
    c = fake_cuda.cuda
    call, value = {
        "cope_logits pos_emb": (lambda t: pe.cope_logits(c(q), c(k), t, mask=c(mask)), table),
        "cope_logits mask": (lambda m: pe.cope_logits(c(q), c(k), c(table), mask=m), mask),
        "cope_positions mask": (lambda m: pe.cope_positions(c(q), c(k), mask=m), mask),
    }[name]
    with pe.use_backend("reference"), fake_cuda.recording() as log:
        for other in (value, c(value, 1)):
            with pytest.raises(ValueError, match=f"^{name.split()[1]} must be on device cuda:0"):
                call(other)
        assert not log, log.lines()
        if value is mask:
            assert torch.equal(fake_cuda.host(call(torch.tensor(True))), fake_cuda.host(call(c(torch.ones(4, 6, dtype=torch.bool)))))


@pytest.mark.parametrize("name", ["alibi_bias", "relative_bias", "expand_bias", "tupe_logits"])
def test_an_argument_on_another_device_is_named(name):
    """A bias's ``out`` (or ``tupe_logits``' ``p``) on the CPU, on ``cuda:1`` or of NumPy beside
    ``cuda:0`` arrays was refused as ``arrays on different devices in one call: [device(type=
    'cuda', index=0), device(type='cpu')]`` (or of different kinds), naming no argument. Now
    the message says which argument is where, before any work."""
    g = torch.Generator().manual_seed(7)
    slopes, table, vec, q, k, p, u = (torch.randn(*s, generator=g) for s in ((2,), (32, 2), (2, 8), (2, 3, 4, 8), (2, 3, 6, 8), (6, 8), (8, 8)))
    c, result = fake_cuda.cuda, torch.empty(2, 3, 6)
    call, what = {
        "alibi_bias": (lambda o: pe.alibi_bias(c(slopes), 3, 6, out=o), "out"),
        "relative_bias": (lambda o: pe.relative_bias("t5", c(table), 3, 6, out=o), "out"),
        "expand_bias": (lambda o: pe.expand_bias(c(vec), 3, 6, out=o), "out"),
        "tupe_logits": (lambda o: pe.tupe_logits(c(q), c(k), o, c(u), c(u)), "p"),
    }[name]
    value = p if name == "tupe_logits" else result
    with pe.use_backend("reference"), fake_cuda.recording() as log:
        for other, where in ((value, "cpu"), (c(value, 1), "cuda:1")):
            with pytest.raises(ValueError, match=f"{what} on {where}"):
                call(other)
        if what == "out":
            with pytest.raises(TypeError, match=f"{what}: numpy.ndarray"):
                call(value.numpy())
    assert not log, log.lines()


@pytest.mark.parametrize("device", ["cpu", "cuda:1"])
@pytest.mark.parametrize("name", ["sinusoidal", "fire_distances", "sandwich_bias", "sandwich_bias xp=torch"])
def test_a_device_argument_other_than_the_positions_is_refused(name, device):
    """Positions on ``cuda:0`` with ``device="cpu"`` or ``"cuda:1"`` gave a result on
    ``cuda:0``, the ``device=`` dropped without a word (and ``sandwich_bias``/``fire_distances``
    read the positions' range there). Now a ``ValueError`` naming both, nothing read;
    ``device="cuda"`` (any CUDA device) still takes them."""
    positions = torch.arange(3)
    call = {
        "sinusoidal": lambda p, d: pe.sinusoidal(p, 8, device=d),
        "fire_distances": lambda p, d: pe.fire_distances(3, 6, query_positions=p, device=d),
        "sandwich_bias": lambda p, d: pe.sandwich_bias(3, 6, 8, query_positions=p, device=d),
        "sandwich_bias xp=torch": lambda p, d: pe.sandwich_bias(3, 6, 8, query_positions=p, xp=torch, device=d),
    }[name]
    with pe.use_backend("reference"), fake_cuda.recording() as log:
        with pytest.raises(ValueError, match=f"positions is on cuda:0 but device={device}"):
            call(fake_cuda.cuda(positions), device)
        assert not log, log.lines()
        got = call(fake_cuda.cuda(positions), "cuda")
    assert got.device == torch.device("cuda", 0)
    with pe.use_backend("reference"):
        assert torch.equal(fake_cuda.host(got), call(positions, None))


def _offset_calls():
    """``name -> call(a, o)``: calls whose 0-d offset (or ``seq_len``) ``o`` is read on the
    host where it is not on an accelerator beside theirs, their arrays made by ``a``."""
    g = torch.Generator().manual_seed(4)
    r = lambda *shape: torch.randn(*shape, generator=g)  # noqa: E731
    x, q, k, table, slopes, u = r(1, 4, 3, 8), r(2, 3, 4, 8), r(2, 3, 6, 8), r(32, 2), r(2), r(8, 8)
    table_k, p, v = r(7, 8), r(6, 8), r(2, 3, 8)
    return {
        "rope": lambda a, o: pe.rope(a(x), offset=o),
        "rope dynamic seq_len": lambda a, o: pe.rope(a(x), scaling=pe.scaling.DynamicNTK(2.0, 4), seq_len=o),
        "t5_bias": lambda a, o: pe.t5_bias(a(table), 3, 6, offset=o),
        "alibi_bias": lambda a, o: pe.alibi_bias(a(slopes), 3, 6, offset=o),
        "relative_bias t5": lambda a, o: pe.relative_bias("t5", a(table), 3, 6, offset=o),
        "kerple_bias": lambda a, o: pe.kerple_bias(a(slopes.abs()), a(slopes.abs()), 3, 6, offset=o),
        "sandwich_bias": lambda a, o: pe.sandwich_bias(3, 6, 8, offset=o, xp=torch, device=a(x).device),
        "shaw_logits": lambda a, o: pe.shaw_logits(a(q), a(k), a(table_k), max_distance=K, offset=o),
        "cope_positions": lambda a, o: pe.cope_positions(a(q), a(k), offset=o),
        "tupe_logits": lambda a, o: pe.tupe_logits(a(q), a(k), a(p), a(u), a(u), offset=o),
        "apply_absolute": lambda a, o: pe.apply_absolute(a(v), a(p), offset=o),
    }


@pytest.mark.parametrize("name", list(_offset_calls()))
def test_an_offset_on_another_gpu_is_refused_unread(name):
    """A 0-d offset (``seq_len``) on ``cuda:1`` beside arrays on ``cuda:0``, or on ``cuda:0``
    beside arrays on ``cuda:1``, was read on the host (a synchronisation on a GPU the call
    does not run on) and the call went on with its number, one way round or both, by every
    function here but ``rope`` with a plain offset. Now a ``ValueError`` naming it, before
    anything is read. On the CPU it is read as before."""
    call = _offset_calls()[name]
    what = "seq_len" if "seq_len" in name else "offset"
    with pe.use_backend("reference"), fake_cuda.recording() as log:
        for arrays, there in ((fake_cuda.cuda, 1), (lambda t: fake_cuda.cuda(t, 1), 0)):
            with pytest.raises(ValueError, match=f"^{what} (is|must be) on") as refused:
                call(arrays, fake_cuda.cuda(torch.tensor(2), there))
            assert f"cuda:{there}" in str(refused.value)
        assert not log, log.lines()
        got = fake_cuda.host(call(fake_cuda.cuda, torch.tensor(2)))
    with pe.use_backend("reference"):
        assert torch.equal(got, call(lambda t: t, 2))


def _rope_calls():
    """``name -> (offset, positions) -> call(c)``: ``rope`` calls whose offset (an int, 0-d
    or one per batch row) or positions are on the GPU, their arrays made by ``c``."""
    x = torch.randn(2, 4, 3, 8, generator=torch.Generator().manual_seed(2))
    tensor = torch.tensor
    return {
        "0-d offset": lambda o, p: lambda c: pe.rope(c(x), offset=c(tensor(o))),
        "per-row offset": lambda o, p: lambda c: pe.rope(c(x), offset=c(tensor([o, 3]))),
        "positions + 0-d offset": lambda o, p: lambda c: pe.rope(c(x), c(tensor(p)), offset=c(tensor(o))),
        "positions + int offset": lambda o, p: lambda c: pe.rope(c(x), c(tensor(p)), offset=o),
        "positions + per-row offset": lambda o, p: lambda c: pe.rope(c(x), c(tensor(p)), offset=c(tensor([o, 1]))),
        "float positions + 0-d offset": lambda o, p: lambda c: pe.rope(c(x), c(tensor(p).double() / 4), offset=c(tensor(o))),
        "float positions": lambda o, p: lambda c: pe.rope(c(x), c(tensor(p).double() / 4)),
        "0-d offset, seq_len given": lambda o, p: lambda c: pe.rope(c(x), scaling=pe.scaling.DynamicNTK(2.0, 4), offset=c(tensor(o)), seq_len=9),
        "0-d offset, half": lambda o, p: lambda c: pe.rope(c(x.half()), c(tensor(p)), offset=c(tensor(o)), layout="interleaved", rotary_dim=4),
    }


SMALL = [(5, [0, 7, 2]), (-3, [4, 0, 1]), (2**40, [0, 2**40, 5]), (2**53 - 8, [0, 3, 7]), (-(2**52), [-(2**52), 1, 2])]


@pytest.mark.parametrize("name", list(_rope_calls()))
@pytest.mark.parametrize("offset, positions", SMALL)
def test_rope_with_an_offset_or_positions_on_a_gpu_reads_nothing_back(name, offset, positions):
    """``rope`` read a 0-d offset on the GPU (``_validate.integer``: 1 read), a per-row one's
    extremes (``_sum_leaves``: 2 reads), given positions' extremes (2 more) and float
    positions' finiteness (1), to check the int64 sums: each a synchronisation, no CUDA
    graph. On an accelerator the positions are now summed with the offset in float64 on the
    device, unread: every rotation converts integer positions to float64 anyway, so where
    positions and sums are within ``2**53`` these are the host's bits."""
    call = _rope_calls()[name](offset, positions)
    got, log = _on_fake_gpu(call)
    assert not log, log.lines()
    with pe.use_backend("reference"):
        want = call(lambda t: t)
    assert got.dtype == want.dtype and torch.equal(got, want)


WRAPPING = [(2**63 - 1, [0, 1, 2]), (2**62, [2**62, 2**62 + 5, 2**62 - 1]), (-(2**63), [-1, -2, 0]), (2**53 + 1, [0, 1, 2])]


@pytest.mark.parametrize("name", ["0-d offset", "positions + 0-d offset", "positions + int offset", "per-row offset"])
@pytest.mark.parametrize("offset, positions", WRAPPING)
def test_rope_sums_past_int64_on_a_gpu_rotate_at_the_float64_sums_not_wrapped_ones(name, offset, positions):
    """Offsets and positions whose int64 sums would wrap (refused on the host, where reading
    them is free) or are past ``2**53``: on a GPU the rotation at the float64 sum
    ``float64(position) + float64(offset)`` (what a float64 angle can hold of them), never
    at a wrapped position."""
    call = _rope_calls()[name](offset, positions)
    got, log = _on_fake_gpu(call)
    assert not log, log.lines()
    x = torch.randn(2, 4, 3, 8, generator=torch.Generator().manual_seed(2))
    given = torch.tensor(positions) if "positions" in name else torch.arange(3)
    offsets = torch.tensor([offset, 3] if "per-row" in name else offset)
    at = given.double() + offsets.double().reshape(-1, 1, 1)  # the float64 sums, [rows, 1, seq]
    with pe.use_backend("reference"):
        assert torch.equal(got, pe.rope(x, at))
        if not all(-(2**63) <= p + o < 2**63 for p in given.tolist() for o in offsets.reshape(-1).tolist()):
            with pytest.raises(ValueError, match="int64"):
                call(lambda t: t)


def test_rope_of_a_non_finite_float_position_on_a_gpu_gives_nan_unread():
    """Float positions' finiteness was read back (``bool(all(isfinite))``: one synchronisation
    a call); on a GPU it is not checked: a non-finite position rotates its token to NaN,
    the others as on the host. In host memory it is still a ``ValueError``."""
    x = torch.randn(2, 3, 8)
    positions = torch.tensor([0.5, float("nan"), 2.0], dtype=torch.float64)
    got, log = _on_fake_gpu(lambda c: pe.rope(c(x), c(positions), offset=c(torch.tensor(1))))
    assert not log, log.lines()
    assert bool(got[:, 1].isnan().all()) and not bool(got[:, ::2].isnan().any())
    with pe.use_backend("reference"):
        assert torch.equal(got[:, ::2], pe.rope(x[:, ::2], positions[::2] + 1))
        with pytest.raises(ValueError, match="finite"):
            pe.rope(x, positions, offset=torch.tensor(1))


def test_rope_offsets_of_a_length_dependent_scaling_are_read_as_before_on_a_gpu():
    """DynamicNTK without ``seq_len`` takes its length from the offset and positions, on the
    host (its frequencies are the kernel's constants): the offset is read there as before,
    the same bits as the CPU's."""
    x = torch.randn(2, 4, 3, 8)

    def call(c):
        return pe.rope(c(x), scaling=pe.scaling.DynamicNTK(2.0, 4), offset=c(torch.tensor(5)))

    got, log = _on_fake_gpu(call)
    assert len(log) == 1
    with pe.use_backend("reference"):
        assert torch.equal(got, call(lambda t: t))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("delta", [torch.tensor(-3), torch.tensor([[5, 2, 2**40]]), torch.tensor(2.5)])
@pytest.mark.parametrize("moved", [False, True])
def test_rerotate_by_frequencies_on_a_gpu_reads_none_of_them(dtype, delta, moved):
    """``rerotate`` with ``inv_freq`` (and ``new_inv_freq``) on the GPU read every frequency to
    the host, ``float(inv_freq[i])``: ``r / 2`` synchronisations a call (the kernel took
    them as constants). They are multiplied on the device now, the same float64 products
    (``cos``/``sin`` tables, ``rope_apply``): the host call's bits, nothing read."""
    inv_freq = torch.from_numpy(pe.rope_frequencies(16)[0]).to(dtype)
    new = torch.from_numpy(pe.rope_frequencies(16, base=40000.0)[0]).to(dtype) if moved else None
    x = torch.randn(2, 3, 16, generator=torch.Generator().manual_seed(3))

    def call(c):
        return pe.rerotate(c(x), c(delta), inv_freq=c(inv_freq), new_inv_freq=None if new is None else c(new))

    got, log = _on_fake_gpu(call)
    assert not log, log.lines()
    with pe.use_backend("reference"):
        assert torch.equal(got, call(lambda t: t))


@pytest.mark.parametrize("offset", [5, -3, 2**40, 2**53 - 8])
@pytest.mark.parametrize("kind", ["0-d", "per row", "positions + 0-d", "positions + int"])
def test_a_sinusoidal_embedding_with_an_offset_on_a_gpu_reads_nothing_back(kind, offset):
    """``SinusoidalEmbedding.embed`` read a 0-d offset (1 read), a per-row one's extremes (2),
    given positions' extremes (2 more), and copied its wavelengths from host memory onto the
    device on every call. Its angles are of float64 positions: on a GPU the positions and
    offset are summed in float64 unread, as ``rope``'s are, and the wavelengths are a device
    constant kept between calls: nothing read or copied, the host's bits."""
    import posenc.torch as pt

    m = pt.SinusoidalEmbedding(8)
    x = torch.randn(2, 3, 8, generator=torch.Generator().manual_seed(4))
    positions = torch.tensor([[0, 7, 2], [offset, 1, 0]])
    given = {"0-d": (None, offset), "per row": (None, [offset, 1]), "positions + 0-d": (positions, offset), "positions + int": (positions, offset)}

    def call(c):
        p, o = given[kind]
        o = o if kind == "positions + int" else c(torch.tensor(o))
        return m.embed(c(x), None if p is None else c(p), offset=o)

    got, log = _on_fake_gpu(call)
    assert not log, log.lines()
    with pe.use_backend("reference"):
        assert torch.equal(got, call(lambda t: t))


def test_a_sinusoidal_embedding_past_int64_on_a_gpu_embeds_the_float64_sums():
    """An offset whose int64 sums would wrap (refused on the host): on a GPU the table at the
    float64 sums, never at wrapped positions."""
    import posenc.torch as pt

    m, x = pt.SinusoidalEmbedding(8), torch.randn(2, 3, 8)
    got, log = _on_fake_gpu(lambda c: m.embed(c(x), offset=c(torch.tensor(2**63 - 1))))
    assert not log, log.lines()
    with pe.use_backend("reference"):
        assert torch.equal(got, x + pe.sinusoidal(torch.arange(3).double() + float(2**63 - 1), 8, dtype=x.dtype))
        with pytest.raises(ValueError, match="int64"):
            m.embed(x, offset=torch.tensor(2**63 - 1))


def test_a_sinusoidal_table_of_float_positions_on_a_gpu_reads_nothing_back():
    """``sinusoidal`` of float positions read their finiteness back (and copied its wavelengths
    onto the device): on a GPU neither, the host's bits (a non-finite position gives NaN)."""
    positions = torch.tensor([[0.5, 3.25, 1e6], [float("nan"), 2.0, -7.5]], dtype=torch.float64)
    got, log = _on_fake_gpu(lambda c: pe.sinusoidal(c(positions), 8))
    assert not log, log.lines()
    assert bool(got[1, 0].isnan().all()) and not bool(got[0].isnan().any())
    assert torch.equal(got[0], pe.sinusoidal(positions[0], 8))


@pytest.mark.parametrize("positions", [torch.arange(-5, 7) * 97, torch.tensor([0.5, -3.25, 1e4], dtype=torch.float64)])
def test_xpos_scale_on_a_gpu_reads_and_copies_nothing(positions):
    """``xpos_scale`` of GPU positions copied its exponents from host memory onto the device
    every call (a pageable copy, a synchronisation), and read float positions' finiteness
    back; the exponents are a device constant kept between calls now, and the finiteness is
    not read there: the host's bits."""
    got, log = _on_fake_gpu(lambda c: pe.xpos_scale(c(positions), 16))
    assert not log, log.lines()
    assert torch.equal(got, pe.xpos_scale(positions, 16))
