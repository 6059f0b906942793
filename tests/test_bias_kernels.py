"""The Toeplitz bias kernels against the references and an independent loop transcription.

Hypothesis draws batch shapes (empty axes included), lengths (0 and 1 included), dtypes and
memory layouts (strided and transposed views, buffers whose batch axes do not merge).
Copies (expand, gather) must be bit-exact; scatter sums (in float64 on the CPU) and rounds once.
The CUDA kernels run the same checks on the numba CUDA simulator (``make test`` runs this
file again with ``NUMBA_ENABLE_CUDASIM=1``).
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc as pe  # (importing it registers the kernels)
from arrays import EPS, to_float64
from posenc import _dispatch, use_backend
from posenc._kernels import _arrays
from posenc.relative import _toeplitz

pytestmark = pytest.mark.kernels

torch = pytest.importorskip("torch")

OPS = ("toeplitz_expand", "toeplitz_gather", "toeplitz_scatter")
CPU = {op: next(k for k in _dispatch.kernels(op) if k.name.endswith("numba_cpu")).load() for op in OPS}
HAS_CUDA = _arrays.numba_cuda()


# --- independent float64 transcriptions of the definitions --------------------------------


def expand_loops(vec, q_len, k_len):
    out = np.empty((*vec.shape[:-1], q_len, k_len), dtype=vec.dtype)
    for i in range(q_len):
        for j in range(k_len):
            out[..., i, j] = vec[..., i - j + k_len - 1]
    return out


def gather_loops(scores, index, k_len):
    q_len = scores.shape[-2]
    out = np.empty((*scores.shape[:-1], k_len), dtype=scores.dtype)
    for i in range(q_len):
        for j in range(k_len):
            out[..., i, j] = scores[..., i, index[i - j + k_len - 1]]
    return out


def scatter_loops(weights, index, m):
    """float64 sums and the sums of ``|w|`` (for the rounding bound)."""
    q_len, k_len = weights.shape[-2:]
    total = np.zeros((*weights.shape[:-1], m))
    magnitude = np.zeros_like(total)
    w = weights.astype(np.float64)
    for i in range(q_len):
        for j in range(k_len):
            c = index[i - j + k_len - 1]
            total[..., i, c] += w[..., i, j]
            magnitude[..., i, c] += abs(w[..., i, j])
    return total, magnitude


# --- arrays of every layout ----------------------------------------------------------------

DTYPES = ("float16", "float32", "float64", "torch-float32", "torch-bfloat16", "torch-float16")


def as_kind(data, dtype, order, step):
    """``data`` as a NumPy array or torch tensor of ``dtype`` with permuted, gapped memory.

    The result has ``data``'s values and shape, but lives in a buffer whose axes are
    stored in ``order`` and, with ``step=2``, every other element of the last axis: kernels
    see transposed and strided arrays whose batch axes may not merge.
    """
    shape = data.shape
    wide = (*shape[:-1], shape[-1] * step) if shape else shape
    stored = tuple(wide[a] for a in order)
    if dtype.startswith("torch-"):
        torch_dtype = getattr(torch, dtype[6:])
        view = torch.zeros(stored, dtype=torch_dtype).permute(*np.argsort(order).tolist())[..., ::step]
        view.copy_(torch.from_numpy(np.asarray(data, dtype=np.float64)).to(torch_dtype))
        return view
    view = np.zeros(stored, dtype=dtype).transpose(np.argsort(order))[..., ::step]
    view[...] = data
    return view


def as_index(values, kind_of):
    if isinstance(kind_of, np.ndarray):
        return np.asarray(values, dtype=np.int64)
    return torch.from_numpy(np.asarray(values, dtype=np.int64))


def bits(a):
    """Bit patterns of ``a`` (NaN payloads and signed zeros included)."""
    if isinstance(a, np.ndarray):
        return a.view(f"u{a.dtype.itemsize}")
    width = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return a.contiguous().view(width).numpy()


@st.composite
def layouts(draw, lead_ndim, trailing):
    """Axis order and step for an array of ``lead_ndim`` batch axes and ``trailing`` more."""
    ndim = lead_ndim + trailing
    order = draw(st.permutations(range(ndim)))
    return list(order), draw(st.sampled_from([1, 2]))


@st.composite
def problems(draw):
    lead = tuple(draw(st.lists(st.integers(0, 3), max_size=2)))
    q_len, k_len, m = draw(st.integers(0, 6)), draw(st.integers(0, 6)), draw(st.integers(1, 6))
    dtype = draw(st.sampled_from(DTYPES))
    vec_layout = draw(layouts(len(lead), 1))
    in_layout = draw(layouts(len(lead), 2))
    out_layout = draw(layouts(len(lead), 2))
    index = draw(st.lists(st.integers(0, m - 1), min_size=max(q_len + k_len - 1, 0), max_size=max(q_len + k_len - 1, 0)))
    use_out = draw(st.booleans())
    seed = draw(st.integers(0, 2**16))
    return lead, q_len, k_len, m, dtype, vec_layout, in_layout, out_layout, index, use_out, seed


def _out_for(like, shape, layout, use_out):
    if not use_out:
        return None
    dtype = str(like.dtype).rsplit(".", 1)[-1]
    return as_kind(np.zeros(shape), ("torch-" + dtype) if not isinstance(like, np.ndarray) else dtype, *layout)


# --- CPU kernels ----------------------------------------------------------------------------


def _arguments(op, problem):
    """The arguments of ``op``'s kernel for ``problem``, and the shape of its result."""
    lead, q_len, k_len, m, dtype, vec_layout, in_layout, _, index, _, seed = problem
    rng = np.random.default_rng(seed)
    if op == "toeplitz_expand":
        return (as_kind(rng.standard_normal((*lead, max(q_len + k_len - 1, 0))), dtype, *vec_layout), q_len, k_len), (*lead, q_len, k_len)
    width, last = (m, k_len) if op == "toeplitz_gather" else (k_len, m)
    first = as_kind(rng.standard_normal((*lead, q_len, width)), dtype, *in_layout)
    return (first, as_index(index, first), last), (*lead, q_len, last)


def run_cpu_kernel(op, problem):
    """``op``'s CPU kernel on ``problem``, into an ``out`` of the drawn layout or not: the result
    must be that ``out``, of the input's kind, dtype and the shape of the definition."""
    args, shape = _arguments(op, problem)
    out = _out_for(args[0], shape, problem[7], problem[9])
    got = CPU[op](*args, out=out)
    if out is not None:
        assert got is out
    assert type(got) is type(args[0]) and got.dtype == args[0].dtype and tuple(got.shape) == shape
    return got, args


def _host(args):
    """A kernel's arguments as the loop transcriptions take them: float64 data, NumPy indices."""
    return (to_float64(args[0]), *(a if isinstance(a, int) else np.asarray(a) for a in args[1:]))


@pytest.mark.parametrize("op, loops", [("toeplitz_expand", expand_loops), ("toeplitz_gather", gather_loops)])
@settings(max_examples=60, deadline=None)
@given(problem=problems())
def test_copies_are_bit_exact(op, loops, problem):
    got, args = run_cpu_kernel(op, problem)
    np.testing.assert_array_equal(bits(got), bits(getattr(_toeplitz, op)(*args)))
    np.testing.assert_array_equal(to_float64(got), loops(*_host(args)))


@settings(max_examples=60, deadline=None)
@given(problem=problems())
def test_scatter_sums_within_one_rounding(problem):
    got, args = run_cpu_kernel("toeplitz_scatter", problem)
    weights, k_len = args[0], args[0].shape[-1]
    want, magnitude = scatter_loops(*_host(args))
    name = str(weights.dtype).rsplit(".", 1)[-1]
    # The kernel sums every dtype in float64 in the order scatter_loops does: one rounding.
    bound = EPS[name] * magnitude + 1e-300
    assert np.all(np.abs(to_float64(got) - want) <= bound)
    reference = _toeplitz.toeplitz_scatter(*args)
    # The reference sums in the input dtype: up to k_len roundings.
    atol = (k_len + 2) * EPS[name] * max(1.0, magnitude.max(initial=0))
    np.testing.assert_allclose(to_float64(got), to_float64(reference), rtol=0, atol=atol)


def test_copies_keep_nan_payloads_and_signed_zeros():
    special = np.array([np.nan, -0.0, np.inf, -np.inf, 0.0], dtype=np.float32)
    special.view(np.uint32)[0] = 0x7FA00001  # a signalling NaN with a payload
    got = CPU["toeplitz_expand"](special, 3, 3)
    np.testing.assert_array_equal(got.view(np.uint32), expand_loops(special.view(np.uint32), 3, 3))
    half = torch.from_numpy(np.array([0x7F81, 0x8000, 0x0001, 0x3F80, 0xFF80], dtype=np.uint16).view(np.int16)).view(torch.bfloat16)
    got = CPU["toeplitz_gather"](half[None], torch.tensor([4, 0, 1, 2, 3]), 5)
    assert torch.equal(got.view(torch.int16)[0], torch.tensor([0x3F80, 0x0001, -0x8000, 0x7F81, -0x0080], dtype=torch.int16))


def test_scatter_rounds_16_bit_sums_once():
    # 2049 = 2048 + 1 is not a float16; summed in float16 one by one 2048 + 1 + 1 stays 2048.
    weights = np.array([[2048.0, 1.0, 1.0]], dtype=np.float16)
    got = CPU["toeplitz_scatter"](weights, np.zeros(3, dtype=np.int64), 1)
    assert got.dtype == np.float16 and float(got[0, 0]) == 2050.0
    weights = torch.tensor([[256.0, 1.0, 1.0]], dtype=torch.bfloat16)
    got = CPU["toeplitz_scatter"](weights, torch.zeros(3, dtype=torch.int64), 1)
    assert got.dtype == torch.bfloat16 and float(got[0, 0]) == 258.0


def test_16_bit_loads_are_exact_and_stores_round_to_nearest_even():
    """The scatter kernel's compiled ``_codec`` conversions, every 16-bit pattern loaded."""
    from posenc._kernels import _codec, toeplitz_cpu

    every = np.arange(2**16, dtype=np.uint16)
    as_half = every.view(np.float16).astype(np.float64)
    with np.errstate(invalid="ignore"):  # signalling NaN patterns
        as_brain = (every.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    half = np.array([toeplitz_cpu._load(h, _codec.FLOAT16) for h in every])
    brain = np.array([toeplitz_cpu._load(h, _codec.BFLOAT16) for h in every])
    np.testing.assert_array_equal(half, as_half)  # NaNs compare equal by position
    np.testing.assert_array_equal(brain, as_brain)
    rng = np.random.default_rng(7)
    x = np.concatenate([
        rng.integers(0, 2**32, 20000, dtype=np.uint64).astype(np.uint32).view(np.float32),
        (rng.standard_normal(20000) * np.exp(rng.uniform(-20, 12, 20000))).astype(np.float32),
        np.float32([65504.0, 65519.0, 65520.0, 2.0**-25, 2.0**-24 * 1.5, 2.0**-24 * 2.5, -0.0, np.inf, 1 + 2.0**-11]),
    ])
    finite = ~np.isnan(x)
    with np.errstate(over="ignore"):
        want_half = x[finite].astype(np.float16).view(np.uint16)
    want_brain = torch.from_numpy(x[finite]).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)

    def stored(v, kind):
        row = np.zeros(1, dtype=np.uint16)
        toeplitz_cpu._store(row, 0, v, kind)
        return row[0]

    np.testing.assert_array_equal([stored(v, _codec.FLOAT16) for v in x[finite].tolist()], want_half)
    np.testing.assert_array_equal([stored(v, _codec.BFLOAT16) for v in x[finite].tolist()], want_brain)
    for nan in x[~finite][:50].tolist():
        assert np.isnan(stored(nan, _codec.FLOAT16).view(np.float16))
        assert (stored(nan, _codec.BFLOAT16) & 0x7FC0) == 0x7FC0


def test_expand_peak_memory_is_the_output():
    vec = np.random.default_rng(0).standard_normal((16, 2 * 256 - 1)).astype(np.float32)
    CPU["toeplitz_expand"](vec, 256, 256)  # compile outside the measurement
    tracemalloc.start()
    try:
        out = CPU["toeplitz_expand"](vec, 256, 256)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak <= 1.1 * out.nbytes
    tracemalloc.start()
    try:
        CPU["toeplitz_expand"](vec, 256, 256, out=out)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak <= 0.05 * out.nbytes


# --- dispatch --------------------------------------------------------------------------------


def test_dispatch_picks_the_cpu_kernel_for_numpy_and_torch_cpu():
    vec = np.zeros((2, 5), dtype=np.float32)
    assert _dispatch.select("toeplitz_expand", vec, 3, 3) is CPU["toeplitz_expand"]
    assert _dispatch.select("toeplitz_expand", torch.zeros(2, 5, dtype=torch.bfloat16), 3, 3) is CPU["toeplitz_expand"]
    with use_backend("reference"):
        assert _dispatch.select("toeplitz_expand", vec, 3, 3) is _toeplitz.toeplitz_expand


def test_dispatch_leaves_other_arrays_and_autograd_to_the_reference():
    index = torch.zeros(5, dtype=torch.int64)
    weights = torch.zeros(3, 3, requires_grad=True)
    from posenc.torch import _ops  # tensors that autograd records go through the custom op

    assert _dispatch.select("toeplitz_scatter", weights, index, 2) is _ops.toeplitz_scatter
    with torch.no_grad():
        assert _dispatch.select("toeplitz_scatter", weights, index, 2) is CPU["toeplitz_scatter"]
    assert _dispatch.select("toeplitz_gather", np.zeros((3, 2)), torch.zeros(5, dtype=torch.int64), 3) is _toeplitz.toeplitz_gather
    assert _dispatch.select("toeplitz_expand", np.zeros(5, dtype=np.int64), 3, 3) is _toeplitz.toeplitz_expand
    swapped = np.arange(5, dtype=">f4")  # no kernel reads the other byte order: the kernel's call on a native copy
    run = _dispatch.select("toeplitz_expand", swapped, 3, 3)
    assert run is not _toeplitz.toeplitz_expand
    np.testing.assert_array_equal(run(swapped, 3, 3), CPU["toeplitz_expand"](swapped.astype("=f4"), 3, 3))
    jnp = pytest.importorskip("jax.numpy")  # JAX CPU arrays have kernels of their own (tests/test_jax_kernels.py)
    from posenc._jax import cpu as jax_cpu

    assert _dispatch.select("toeplitz_expand", jnp.zeros(5), 3, 3) is jax_cpu.toeplitz_expand
    assert _dispatch.select("toeplitz_expand", jnp.zeros(5, dtype=jnp.int32), 3, 3) is _toeplitz.toeplitz_expand


# --- CUDA kernels (on a GPU or the numba CUDA simulator) -----------------------------------


@pytest.fixture(scope="module")
def cuda():
    if not HAS_CUDA:
        pytest.skip("no GPU and no CUDA simulator (NUMBA_ENABLE_CUDASIM=1) here")
    from numba import cuda

    return cuda


def _gpu(op):
    return next(k for k in _dispatch.kernels(op) if k.name.endswith("numba_cuda")).load()


@st.composite
def small_problems(draw):
    """Small shapes: the simulator runs every GPU thread as a Python thread."""
    lead = tuple(draw(st.lists(st.integers(0, 2), max_size=2)))
    q_len, k_len, m = draw(st.integers(0, 4)), draw(st.integers(0, 4)), draw(st.integers(1, 4))
    dtype = draw(st.sampled_from(("float16", "float32", "float64")))
    n = max(q_len + k_len - 1, 0)
    index = draw(st.lists(st.integers(0, m - 1), min_size=n, max_size=n))
    return lead, q_len, k_len, m, dtype, index, draw(st.booleans()), draw(st.integers(0, 2**16))


def _device_strided(cuda, data):
    """A device view with a gapped last axis (``[..., ::2]`` of a wider device array)."""
    wide = np.zeros((*data.shape[:-1], 2 * data.shape[-1]), dtype=data.dtype)
    wide[..., ::2] = data
    if not data.size:  # (numba's device arrays refuse a step slice of an empty axis, and take no Ellipsis)
        return cuda.to_device(data)
    every_other = (slice(None),) * (data.ndim - 1) + (slice(None, None, 2),)
    return cuda.to_device(wide)[every_other]


@settings(max_examples=15, deadline=None)
@given(small_problems())
def test_cuda_kernels_match_the_cpu_definitions(cuda, problem):
    lead, q_len, k_len, m, dtype, index, strided, seed = problem
    rng = np.random.default_rng(seed)
    put = (lambda a: _device_strided(cuda, a)) if strided else cuda.to_device
    idx = np.asarray(index, dtype=np.int64)

    vec = rng.standard_normal((*lead, max(q_len + k_len - 1, 0))).astype(dtype)
    got = _gpu("toeplitz_expand")(put(vec), q_len, k_len).copy_to_host()
    np.testing.assert_array_equal(got, expand_loops(vec, q_len, k_len))

    scores = rng.standard_normal((*lead, q_len, m)).astype(dtype)
    out = put(np.zeros((*lead, q_len, k_len), dtype=dtype))
    got = _gpu("toeplitz_gather")(put(scores), cuda.to_device(idx), k_len, out=out)
    assert got is out
    np.testing.assert_array_equal(got.copy_to_host(), gather_loops(scores, idx, k_len))

    weights = rng.standard_normal((*lead, q_len, k_len)).astype(dtype)
    got = _gpu("toeplitz_scatter")(put(weights), cuda.to_device(idx), m).copy_to_host()
    want, magnitude = scatter_loops(weights, idx, m)
    # Summed in float64 (in a tree, not in scatter_loops' order), rounded once.
    assert np.all(np.abs(got.astype(np.float64) - want) <= (EPS[dtype] + EPS["float64"] * k_len) * magnitude + 1e-300)


@pytest.mark.parametrize("monotone", [True, False])
def test_cuda_scatter_sums_do_not_depend_on_timing_or_layout(cuda, monotone):
    """Sums in float64 in an order the shape fixes: 2**24 + 1 + 1 is 2**24 + 2 (float32
    accumulators gave 2**24 or 2**24 + 2 by the order the threads' atomics landed), and the
    bits are the same on every run and for a strided copy, for a monotone index (its runs
    added in parallel) and for one of interleaved classes (added one by one)."""
    weights = np.array([[2.0**24, 1.0, 1.0]], np.float32)
    got = _gpu("toeplitz_scatter")(cuda.to_device(weights), cuda.to_device(np.zeros(3, np.int64)), 1)
    assert got.copy_to_host()[0, 0] == 2.0**24 + 2
    rng = np.random.default_rng(5)
    q_len, k_len, m = 2, 70, 5
    if monotone:
        idx = np.clip(np.arange(q_len + k_len - 1) - k_len // 2, -2, 2) + 2
    else:
        idx = rng.integers(0, m, q_len + k_len - 1)
    weights = (rng.standard_normal((q_len, k_len)) * 10.0 ** rng.integers(-6, 7, (q_len, k_len))).astype(np.float32)
    runs = [_gpu("toeplitz_scatter")(put(weights), cuda.to_device(idx), m).copy_to_host() for put in (cuda.to_device, lambda a: _device_strided(cuda, a)) * 2]
    for other in runs[1:]:
        np.testing.assert_array_equal(other.view(np.uint32), runs[0].view(np.uint32))
    want, magnitude = scatter_loops(weights, idx, m)
    assert np.all(np.abs(runs[0].astype(np.float64) - want) <= (EPS["float32"] + EPS["float64"] * k_len) * magnitude)


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_cuda_copies_of_long_rows_are_bit_exact(cuda, dtype):
    """Rows of 600 keys: each thread copies four keys at a time (128 threads along a row),
    then the rest one at a time; expand and gather both, bit for bit."""
    rng = np.random.default_rng(3)
    q_len, k_len, m = 2, 600, 7
    vec = rng.standard_normal((2, q_len + k_len - 1)).astype(dtype)
    got = _gpu("toeplitz_expand")(cuda.to_device(vec), q_len, k_len).copy_to_host()
    np.testing.assert_array_equal(got, expand_loops(vec, q_len, k_len))
    scores = rng.standard_normal((2, q_len, m)).astype(dtype)
    idx = rng.integers(0, m, q_len + k_len - 1)
    got = _gpu("toeplitz_gather")(cuda.to_device(scores), cuda.to_device(idx), k_len).copy_to_host()
    np.testing.assert_array_equal(got, gather_loops(scores, idx, k_len))


def test_dispatch_picks_the_cuda_kernel_for_device_arrays(cuda):
    vec = cuda.to_device(np.zeros((2, 5), dtype=np.float32))
    assert _dispatch.select("toeplitz_expand", vec, 3, 3) is _gpu("toeplitz_expand")


@pytest.mark.parametrize("backend", ["auto", "reference"])
def test_a_byte_swapped_out_is_written_on_every_backend(backend):
    """``out`` of dtype ``>f4`` for float32 inputs: the same values as a native buffer on
    both backends (the kernel was chosen, then its launcher refused the byte order)."""
    vec, table, slopes = np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4), np.linspace(-1, 1, 64, dtype=np.float32).reshape(32, 2), pe.alibi_slopes(2)
    calls = {
        "expand_bias": lambda out: pe.expand_bias(vec, 2, 3, out=out),
        "t5_bias": lambda out: pe.t5_bias(table, 2, 3, out=out),
        "alibi_bias": lambda out: pe.alibi_bias(slopes, 2, 3, out=out),
    }
    with use_backend(backend):
        for name, call in calls.items():
            native, swapped = np.zeros((2, 2, 3), np.float32), np.zeros((2, 2, 3), ">f4")
            assert call(swapped) is swapped, name
            call(native)
            np.testing.assert_array_equal(swapped, native, err_msg=name)


@pytest.mark.parametrize("field", ["rows", "elements"])
def test_fields_of_packed_records_are_read_and_written_where_they_are(field):
    """A field of a packed structured array has strides that are no whole number of
    elements. The CPU kernels read and wrote it at strides rounded down: ``shaw_output`` of
    such weights gave values near 6e36, and ``expand_bias`` into such an ``out`` wrote
    elsewhere in it and over 107 of the 135 bytes of the neighbouring field. Now they copy
    what they cannot address: the contiguous copy's bits, nothing written outside ``out``."""
    rng = np.random.default_rng(0)

    def record_field(values):
        shape, dtype = (values.shape[:-1], [("a", values.dtype, values.shape[-1:]), ("tag", "i1")]) if field == "rows" else (values.shape, [("a", values.dtype), ("tag", "i1")])
        records = np.zeros(shape, dtype)
        records["a"], records["tag"] = values, 7
        return records

    weights = rng.standard_normal((2, 3, 5, 5)).astype(np.float32)
    v, table = rng.standard_normal((2, 3, 5, 8)).astype(np.float32), rng.standard_normal((9, 8)).astype(np.float32)
    vec = rng.standard_normal((3, 13)).astype(np.float32)
    for _ in range(3):  # (plans from the third call)
        want = pe.shaw_output(weights, v, table, max_distance=4)
        np.testing.assert_array_equal(pe.shaw_output(record_field(weights)["a"], v, table, max_distance=4), want)
        np.testing.assert_array_equal(pe.expand_bias(record_field(vec)["a"], 5, 9), pe.expand_bias(vec, 5, 9))
        out = record_field(np.zeros((3, 5, 9), np.float32))
        pe.expand_bias(vec, 5, 9, out=out["a"])
        np.testing.assert_array_equal(out["a"], pe.expand_bias(vec, 5, 9))
        assert (out["tag"] == 7).all()
