"""Every public call path that reaches a Numba CPU kernel equals the ``"reference"`` backend.

``test_kernels_match_reference.py`` calls each registered kernel on fixed samples, and
``test_rope_kernels.py`` / ``test_bias_kernels.py`` / ``test_bias_rows_kernel.py`` draw the
kernels' own arguments. Here hypothesis draws the public calls in front of them: ``rope``
(an int offset, one offset per row, positions ``[S]``, ``[B, S]``, ``[B, H, S]``, strided,
reversed and broadcast ones), ``apply_rope``, ``rerotate``, ``rotate_pair`` (``cos``/``sin``
of every layout), ``expand_bias``, ``shaw_logits``, ``shaw_output``, ``deberta_logits`` and
T5's ``relative_bias``, on NumPy arrays (``ml_dtypes.bfloat16`` included) and torch CPU
tensors of every float dtype, whose memory is contiguous, strided, reversed (NumPy),
transposed or broadcast (stride 0), with ``out`` ``None``, a buffer, a transposed buffer
or ``x`` itself. Each call runs three times (the full path, then the plan its signature
gets), and each result must equal the reference's within the kernels' tolerance
(docs/precision.md); the rotary calls must have reached the kernel. The Toeplitz kernels
are drawn directly on the operands the other tests leave out (reversed and broadcast
values, strided, reversed, broadcast and int32 indices, transposed ``out``). The CUDA
kernels (on the simulator under ``make test``'s cudasim pass) are drawn on what their own
tests leave out: ``rope_apply``, q and k in one launch, and ``t5_buckets`` on drawn shapes
and maps; ``rope_rotate`` and the Toeplitz ops with bfloat16, broadcast operands and
broadcast or strided positions and indices. (The CUDA plans launch on CUDA tensors and
CuPy arrays only: their values are compared on a GPU, under ``make test-gpu``.)
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import posenc as pe
from arrays import EPS, to_float64
from kernel_samples import on_gpu
from posenc import _dispatch
from posenc._kernels import _arrays, rope_cpu, toeplitz_cpu
from posenc.relative import _toeplitz, shaw_output

pytestmark = pytest.mark.kernels

torch = pytest.importorskip("torch")
ml_dtypes = pytest.importorskip("ml_dtypes")
from posenc.rotary.apply import rotate_pair  # noqa: E402

DTYPES = ("float16", "bfloat16", "float32", "float64")
NUMPY = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16, "float32": np.float32, "float64": np.float64}
KINDS = ("contiguous", "strided", "reversed", "transposed", "broadcast")
PLANNED = (pe.rope, pe.apply_rope, pe.rerotate, rotate_pair, pe.expand_bias, pe.shaw_logits, pe.deberta_logits, pe.relative_bias)


class _Runs(dict):
    """A kernel family whose kernels count their runs (``runs[0]``), plans' included."""

    def __init__(self, family):
        super().__init__()
        self.family, self.runs = family, [0]

    def __missing__(self, key):
        kernel = self.family[key]

        def run(*args):
            self.runs[0] += 1
            return kernel(*args)

        self[key] = run
        return run


@pytest.fixture(scope="module")
def runs():
    """The runs of the rotary and Toeplitz CPU kernels, counted from each example's start."""
    counted = {module: _Runs(module.FAMILY) for module in (rope_cpu, toeplitz_cpu)}
    with pytest.MonkeyPatch.context() as patch:
        for module, family in counted.items():
            patch.setattr(module, "FAMILY", family)
        yield {module.__name__.rsplit(".", 1)[-1]: family.runs for module, family in counted.items()}
        _clear_plans()  # (none keeps a counting kernel)


def _clear_plans():
    for function in PLANNED:
        function.plans.clear()


def _make(data, library, dtype):
    if library == "torch":
        return torch.from_numpy(np.ascontiguousarray(data)).to(getattr(torch, dtype))
    return np.asarray(data).astype(NUMPY[dtype])


def _laid_out(data, library, dtype, kind):
    """``data``'s values in memory of ``kind``: a gapped view, reversed axes (NumPy; torch has
    no negative strides: a copy), the last two axes transposed, or stride 0 along axis 0."""
    if kind == "strided":
        wide = np.zeros((*data.shape[:-1], 2 * data.shape[-1] + 1))
        wide[..., 1::2] = data
        return _make(wide, library, dtype)[..., 1::2]
    if kind == "reversed":
        flipped = _make(np.flip(data).copy(), library, dtype)
        return flipped[(slice(None, None, -1),) * data.ndim] if library == "numpy" else flipped.flip(list(range(data.ndim)))
    if kind == "transposed" and data.ndim >= 2:
        stored = _make(np.swapaxes(data, -1, -2), library, dtype)
        return np.swapaxes(stored, -1, -2) if library == "numpy" else stored.transpose(-1, -2)
    if kind == "broadcast" and data.ndim >= 2:
        one = _make(data[:1], library, dtype)
        return np.broadcast_to(one, data.shape) if library == "numpy" else one.expand(*data.shape)
    return _make(data, library, dtype)


def _integers(values, library):
    return torch.from_numpy(np.ascontiguousarray(values)) if library == "torch" else values


def _copy(a):
    return a.clone() if isinstance(a, torch.Tensor) else np.array(a, copy=True)


def _writable(x, kind):
    """The ``x`` a call may write (``out=x``): a broadcast one is read only, so it is passed as it is."""
    return x if kind == "broadcast" else _copy(x)


def _buffer(x, mode):
    shape = tuple(x.shape)
    if mode == "transposed":
        swapped = (*shape[:-3], shape[-2], shape[-3], shape[-1])
        z = torch.zeros(swapped, dtype=x.dtype) if isinstance(x, torch.Tensor) else np.zeros(swapped, x.dtype)
        return z.transpose(-3, -2) if isinstance(z, torch.Tensor) else np.swapaxes(z, -3, -2)
    return torch.zeros(shape, dtype=x.dtype) if isinstance(x, torch.Tensor) else np.zeros(shape, x.dtype)


def _close(got, want, dtype, magnitude, what):
    """Two ulps of ``dtype``, or eight of ``magnitude`` where ``a cos - b sin`` cancels (``test_rope_kernels``' bound)."""
    got, want = to_float64(got), to_float64(want)
    assert got.shape == want.shape, what
    eps = EPS[dtype]
    np.testing.assert_allclose(got, want, rtol=2 * eps, atol=8 * eps * magnitude + 1e-300, err_msg=what)


def _magnitude(*arrays):
    return 2 * max(float(np.abs(to_float64(a)).max(initial=0)) for a in arrays)


@st.composite
def rotary_inputs(draw, x_kinds=KINDS):
    library = draw(st.sampled_from(("numpy", "torch")))
    dtype = draw(st.sampled_from(DTYPES))
    b, h, s = (draw(st.integers(1, 3)) for _ in range(3))
    d = draw(st.sampled_from((4, 10, 16, 38)))  # 16-bit rows: vectors of 8 pairs, and 3 pairs on their own
    kind = draw(st.sampled_from(x_kinds))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    x = _laid_out(rng.standard_normal((b, h, s, d)), library, dtype, kind)
    return library, dtype, kind, x, rng


POSITIONS = ("offset", "large offset", "offset per row", "[S]", "[B, S] int32", "[B, H, S]", "strided [B, S]", "reversed [S]", "broadcast [B, S]")


def _positions(mode, rng, library, b, h, s):
    """``(positions, offset)`` of ``mode``."""
    if mode == "offset":
        return None, int(rng.integers(0, 5000))
    if mode == "large offset":
        return None, int(2**31 + rng.integers(0, 5000))
    if mode == "offset per row":
        return None, _integers(rng.integers(0, 5000, b), library)
    if mode == "[S]":
        return _integers(rng.integers(0, 5000, s), library), 0
    if mode == "[B, S] int32":
        return _integers(rng.integers(0, 5000, (b, s)).astype(np.int32), library), 0
    if mode == "[B, H, S]":
        return _integers(rng.integers(0, 5000, (b, h, s)), library), 0
    if mode == "strided [B, S]":
        return _integers(rng.integers(0, 5000, (b, 2 * s)), library)[:, ::2], 0
    if mode == "reversed [S]":
        values = rng.integers(0, 5000, s)
        return (values[::-1] if library == "numpy" else torch.from_numpy(values).flip(0)), 0
    one = _integers(rng.integers(0, 5000, (1, s)), library)
    return (np.broadcast_to(one, (b, s)) if library == "numpy" else one.expand(b, s)), 0


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    inputs=rotary_inputs(), mode=st.sampled_from(POSITIONS), out_mode=st.sampled_from(("none", "buffer", "transposed", "self")),
    layout=st.sampled_from(("half", "interleaved")), inverse=st.booleans(), partial=st.booleans(),
    scaling=st.sampled_from((None, "linear", "yarn")),
)  # fmt: skip
def test_rope_calls_match_the_reference_backend(runs, inputs, mode, out_mode, layout, inverse, partial, scaling):
    library, dtype, kind, x, rng = inputs
    b, h, s, d = x.shape
    if kind == "broadcast" and out_mode == "self":
        out_mode = "buffer"
    positions, offset = _positions(mode, rng, library, b, h, s)
    options = {"layout": layout, "inverse": inverse, "offset": offset}
    if partial:
        options["rotary_dim"] = 2 * int(rng.integers(1, d // 2 + 1))
    if scaling is not None:
        options["scaling"] = pe.scaling.Linear(2.0) if scaling == "linear" else pe.scaling.YaRN(4.0, 64)
    with pe.use_backend("reference"):
        want = pe.rope(_copy(x), positions, **options)
    _clear_plans()
    for call in range(3):  # the full path, then the plan
        runs["rope_cpu"][0] = 0
        x_call = _writable(x, kind)
        out = None if out_mode == "none" else x_call if out_mode == "self" else _buffer(x, out_mode)
        got = pe.rope(x_call, positions, **options, out=out)
        assert out is None or got is out
        _close(got, want, dtype, _magnitude(x), f"call {call}")
        assert runs["rope_cpu"][0], f"call {call} did not reach the kernel"


def _tables(rng, library, dtype, shape, kind, layout):
    angles = rng.uniform(-20, 20, (*shape[:-1], shape[-1] // 2))
    pairs = np.repeat(angles, 2, -1) if layout == "interleaved" else np.concatenate([angles, angles], -1)
    return _laid_out(np.cos(pairs), library, dtype, kind), _laid_out(np.sin(pairs), library, dtype, kind)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    inputs=rotary_inputs(), op=st.sampled_from(("apply_rope", "rotate_pair", "rerotate")), table_kind=st.sampled_from(KINDS),
    table_shape=st.sampled_from(("[S, r]", "[B, 1, S, r]", "[B, H, S, r]")), out_mode=st.sampled_from(("none", "buffer", "self")),
    layout=st.sampled_from(("half", "interleaved")), k_kind=st.sampled_from(("contiguous", "transposed", "strided")),
    delta=st.sampled_from(("int", "[S]")),
)  # fmt: skip
def test_apply_rope_rerotate_and_rotate_pair_match_the_reference_backend(runs, inputs, op, table_kind, table_shape, out_mode, layout, k_kind, delta):
    library, dtype, kind, x, rng = inputs
    b, h, s, d = x.shape
    if kind == "broadcast" and out_mode == "self":
        out_mode = "buffer"
    r = 2 * int(rng.integers(1, d // 2 + 1))
    if op == "rotate_pair" and table_shape == "[B, H, S, r]":
        table_shape = "[B, 1, S, r]"  # (k has heads of its own)
    cos, sin = _tables(rng, library, dtype, {"[S, r]": (s, r), "[B, 1, S, r]": (b, 1, s, r), "[B, H, S, r]": (b, h, s, r)}[table_shape], table_kind, layout)
    k = _laid_out(rng.standard_normal((b, int(rng.integers(1, 4)), s, d)), library, dtype, k_kind)
    inv_freq = 10000.0 ** (-np.arange(r // 2) / (r // 2))
    shift = int(rng.integers(-3000, 3000)) if delta == "int" else _integers(rng.integers(-3000, 3000, s), library)

    def call(x, out):
        if op == "apply_rope":
            return (pe.apply_rope(x, cos, sin, layout=layout, out=out),)
        if op == "rotate_pair":
            return rotate_pair(x, _copy(k), cos, sin, layout=layout)
        return (pe.rerotate(x, shift, inv_freq, layout=layout, out=out),)

    with pe.use_backend("reference"):
        want = call(_copy(x), None)
    _clear_plans()
    for n in range(3):
        runs["rope_cpu"][0] = 0
        x_call = _writable(x, kind)
        out = None if out_mode == "none" or op == "rotate_pair" else x_call if out_mode == "self" else _buffer(x, "buffer")
        got = call(x_call, out)
        for g, w, a in zip(got, want, (x, k)):
            _close(g, w, dtype, _magnitude(a), f"{op}, call {n}")
        assert runs["rope_cpu"][0], f"call {n} did not reach the kernel"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    library=st.sampled_from(("numpy", "torch")), dtype=st.sampled_from(DTYPES), op=st.sampled_from(("expand_bias", "shaw_logits", "shaw_output", "deberta_logits", "t5 relative_bias")),
    shape=st.tuples(st.integers(1, 3), st.integers(1, 3), st.integers(1, 6), st.integers(1, 6), st.integers(1, 4)),
    kind=st.sampled_from(("contiguous", "reversed", "transposed", "broadcast")), offset=st.sampled_from(("none", "int", "per row")),
    use_out=st.booleans(), seed=st.integers(0, 2**32 - 1),
)  # fmt: skip
def test_toeplitz_calls_match_the_reference_backend(runs, library, dtype, op, shape, kind, offset, use_out, seed):
    """The public calls whose full path ends in a Toeplitz kernel (``expand``: ``expand_bias``,
    ``relative_bias``; ``gather``: Shaw's and DeBERTa's logits; ``scatter``: ``shaw_output``)."""
    b, h, q_len, k_len, max_distance = shape
    rng = np.random.default_rng(seed)
    offset = {"none": None, "int": int(rng.integers(0, 50)), "per row": _integers(rng.integers(0, 50, b), library)}[offset]
    q = _laid_out(rng.standard_normal((b, h, q_len, 8)), library, dtype, kind)
    k = _laid_out(rng.standard_normal((b, h, k_len, 8)), library, dtype, "transposed")
    table = _laid_out(rng.standard_normal((2 * max_distance + 1, 8)), library, dtype, "reversed")
    weights = _laid_out(rng.random((b, h, q_len, k_len)), library, dtype, kind)
    vec = _laid_out(rng.standard_normal((b, h, q_len + k_len - 1)), library, dtype, kind)
    buckets = _laid_out(rng.standard_normal((32, h)), library, dtype, kind)
    calls = {
        "expand_bias": lambda: pe.expand_bias(vec, q_len, k_len, out=_buffer(_make(np.zeros((b, h, q_len, k_len)), library, dtype), "buffer") if use_out else None),
        "shaw_logits": lambda: pe.shaw_logits(q, k, table, max_distance=max_distance, offset=offset),
        "shaw_output": lambda: shaw_output(weights, k, table, max_distance=max_distance, offset=offset),
        "deberta_logits": lambda: pe.deberta_logits(q, k, table[1:], table[1:], max_distance=max_distance, offset=offset),
        "t5 relative_bias": lambda: pe.relative_bias("t5", buckets, q_len, k_len, offset=None if offset is None or hasattr(offset, "shape") else offset),
    }
    with pe.use_backend("reference"):
        want = to_float64(calls[op]())
    # Copies are exact; products and sums round as docs/precision.md says (float64 sums, once).
    exact = op in ("expand_bias", "t5 relative_bias")
    tol = 0.0 if exact else 4 * EPS[dtype] * (np.abs(want).max(initial=0) + 1) * (k_len + 8)
    _clear_plans()
    for n in range(3):
        got = to_float64(calls[op]())
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=0, atol=tol, err_msg=f"{op}, call {n}")


OPS = ("toeplitz_expand", "toeplitz_gather", "toeplitz_scatter")
INDEX_KINDS = ("contiguous", "reversed", "strided", "int32", "broadcast")


def _index(values, library, kind):
    if kind == "int32":
        values = values.astype(np.int32)
    if library == "torch":
        tensor = torch.from_numpy(values)
        return {"strided": lambda: torch.from_numpy(np.repeat(values, 2))[::2], "broadcast": lambda: tensor[:1].expand(values.size)}.get(kind, lambda: tensor)()
    if kind == "reversed":
        return values[::-1].copy()[::-1]
    if kind == "strided":
        return np.repeat(values, 2)[::2]
    return np.broadcast_to(values[:1], values.shape) if kind == "broadcast" else values


@settings(max_examples=60, deadline=None)
@given(
    op=st.sampled_from(OPS), library=st.sampled_from(("numpy", "torch")), dtype=st.sampled_from(DTYPES),
    lead=st.lists(st.integers(1, 3), max_size=2), lengths=st.tuples(st.integers(1, 5), st.integers(1, 5), st.integers(1, 5)),
    kind=st.sampled_from(("contiguous", "reversed", "broadcast", "transposed")), index_kind=st.sampled_from(INDEX_KINDS),
    out_kind=st.sampled_from(("none", "contiguous", "transposed")), seed=st.integers(0, 2**32 - 1),
)  # fmt: skip
def test_toeplitz_kernels_take_reversed_broadcast_and_strided_operands(op, library, dtype, lead, lengths, kind, index_kind, out_kind, seed):
    q_len, k_len, m = lengths
    rng = np.random.default_rng(seed)
    if op == "toeplitz_expand":
        args, shape = (_laid_out(rng.standard_normal((*lead, q_len + k_len - 1)), library, dtype, kind), q_len, k_len), (*lead, q_len, k_len)
    else:
        width, last = (m, k_len) if op == "toeplitz_gather" else (k_len, m)
        values = rng.standard_normal((*lead, q_len, width)) if op == "toeplitz_gather" else rng.random((*lead, q_len, width))
        index = _index(rng.integers(0, m, q_len + k_len - 1), library, index_kind)
        args, shape = (_laid_out(values, library, dtype, kind), index, last), (*lead, q_len, last)
    out = None if out_kind == "none" else _laid_out(np.zeros(shape), library, dtype, out_kind)
    kernel = next(k for k in _dispatch.kernels(op) if k.name.endswith("numba_cpu"))
    assert kernel.accepts_call(*args, out=out)
    want = to_float64(getattr(_toeplitz, op)(*args))
    got = kernel.load()(*args, out=out)
    assert out is None or got is out
    if op == "toeplitz_scatter":  # float64 sums rounded once; the reference sums in the input dtype
        tol = (k_len + 2) * EPS[dtype] * max(1.0, float(np.abs(want).max(initial=0)))
        np.testing.assert_allclose(to_float64(got), want, rtol=0, atol=tol)
    else:  # copies
        np.testing.assert_array_equal(to_float64(got), want)


# ------------------------------------------------------------------ CUDA (simulator)

cuda_only = pytest.mark.skipif(not _arrays.numba_cuda(), reason="no GPU and no CUDA simulator")
# (the simulator's NumPy scalars warn where the hardware gives NaN silently)
simulated_arithmetic = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")


@cuda_only
@simulated_arithmetic
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    dtype=st.sampled_from(DTYPES), shape=st.tuples(st.integers(1, 2), st.integers(1, 3), st.integers(1, 3), st.sampled_from((4, 6, 10))),
    kind=st.sampled_from(("contiguous", "strided", "transposed", "broadcast")), table_kind=st.sampled_from(("contiguous", "strided", "broadcast")),
    per_head=st.booleans(), layout=st.sampled_from(("half", "interleaved")), out_mode=st.sampled_from(("none", "buffer", "self")),
    seed=st.integers(0, 2**32 - 1),
)  # fmt: skip
def test_cuda_rope_apply_matches_the_reference(dtype, shape, kind, table_kind, per_head, layout, out_mode, seed):
    b, h, s, d = shape
    rng = np.random.default_rng(seed)
    x = _laid_out(rng.standard_normal(shape), "numpy", dtype, kind)
    if kind == "broadcast":
        x = x.copy() if out_mode == "self" else x
    r = 2 * int(rng.integers(1, d // 2 + 1))
    cos, sin = _tables(rng, "numpy", dtype, (b, h if per_head else 1, s, r), table_kind, layout)
    reference = _dispatch.references()["rope_apply"]
    with np.errstate(all="ignore"):
        want = reference(x.copy(), cos, sin, layout=layout)
    out = {"none": None, "self": x, "buffer": np.zeros(shape, x.dtype)}[out_mode]
    (xd, cd, sd), kwargs = on_gpu("rope_apply", [x, cos, sin], {"out": out})
    kernel = next(k for k in _dispatch.kernels("rope_apply") if k.name.endswith("numba_cuda"))
    assert kernel.accepts_call(xd, cd, sd, layout=layout, **kwargs)
    got = kernel.load()(xd, cd, sd, layout=layout, **kwargs)
    _close(got, want, dtype, _magnitude(x), "rope_apply.numba_cuda")


@cuda_only
@simulated_arithmetic
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    dtype=st.sampled_from(DTYPES), shape=st.tuples(st.integers(1, 2), st.integers(1, 3), st.integers(1, 3), st.sampled_from((4, 6, 10))),
    kind=st.sampled_from(("contiguous", "strided", "transposed", "broadcast")),
    positions_kind=st.sampled_from(("[S]", "[B, 1, S]", "[B, H, S]", "broadcast [B, 1, S]", "strided [S]")),
    positions_dtype=st.sampled_from(("int32", "int64", "float32", "float64")), layout=st.sampled_from(("half", "interleaved")),
    inverse=st.booleans(), out_mode=st.sampled_from(("none", "buffer", "self")), seed=st.integers(0, 2**32 - 1),
)  # fmt: skip
def test_cuda_rope_rotate_matches_the_reference(dtype, shape, kind, positions_kind, positions_dtype, layout, inverse, out_mode, seed):
    """bfloat16 (``ml_dtypes``), broadcast ``x`` and broadcast or strided positions beside ``test_rope_kernels``' draws."""
    b, h, s, d = shape
    rng = np.random.default_rng(seed)
    x = _laid_out(rng.standard_normal(shape), "numpy", dtype, kind)
    if kind == "broadcast" and out_mode == "self":
        x = x.copy()
    positions = {
        "[S]": lambda: rng.integers(0, 5000, s),
        "[B, 1, S]": lambda: rng.integers(0, 5000, (b, 1, s)),
        "[B, H, S]": lambda: rng.integers(0, 5000, (b, h, s)),
        "broadcast [B, 1, S]": lambda: np.broadcast_to(rng.integers(0, 5000, (1, 1, s)), (b, 1, s)),
        "strided [S]": lambda: rng.integers(0, 5000, 2 * s)[::2],
    }[positions_kind]().astype(positions_dtype, copy=False)
    inv_freq = 10000.0 ** (-np.arange(d // 2) / (d // 2))
    options = {"layout": layout, "inverse": inverse}
    with np.errstate(all="ignore"):
        want = _dispatch.references()["rope_rotate"](x.copy(), positions, inv_freq, **options)
    out = {"none": None, "self": x, "buffer": np.zeros(shape, x.dtype)}[out_mode]
    (xd, pd, inv_freq), kwargs = on_gpu("rope_rotate", [x, positions, inv_freq], {"out": out})
    kernel = next(k for k in _dispatch.kernels("rope_rotate") if k.name.endswith("numba_cuda"))
    assert kernel.accepts_call(xd, pd, inv_freq, **options, **kwargs)
    got = kernel.load()(xd, pd, inv_freq, **options, **kwargs)
    _close(got, want, dtype, _magnitude(x), "rope_rotate.numba_cuda")


@cuda_only
@settings(max_examples=15, deadline=None)
@given(
    num_buckets=st.integers(4, 64), max_distance=st.integers(64, 10**6), bidirectional=st.booleans(),
    dtype=st.sampled_from(("int32", "int64")), strided=st.booleans(), seed=st.integers(0, 2**32 - 1),
)  # fmt: skip
def test_cuda_t5_buckets_match_the_reference(num_buckets, max_distance, bidirectional, dtype, strided, seed):
    rng = np.random.default_rng(seed)
    info = np.iinfo(dtype)
    rel = np.concatenate([rng.integers(-2 * max_distance, 2 * max_distance, 40), rng.integers(info.min, info.max, 10, endpoint=True)]).astype(dtype)
    rel = np.repeat(rel, 2)[::2] if strided else rel
    options = {"num_buckets": num_buckets, "max_distance": max_distance, "bidirectional": bidirectional}
    want = _dispatch.references()["t5_buckets"](rel, **options)
    (rd,), _ = on_gpu("t5_buckets", [rel], {})
    kernel = next(k for k in _dispatch.kernels("t5_buckets") if k.name.endswith("numba_cuda"))
    assert kernel.accepts_call(rd, **options)
    got = kernel.load()(rd, **options)
    np.testing.assert_array_equal(to_float64(got), to_float64(want))


@cuda_only
@simulated_arithmetic
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    dtype=st.sampled_from(DTYPES), shape=st.tuples(st.integers(1, 2), st.integers(1, 3), st.integers(1, 3), st.integers(1, 3), st.sampled_from((4, 6, 10))),
    q_kind=st.sampled_from(("contiguous", "transposed", "strided")), k_kind=st.sampled_from(("contiguous", "transposed", "strided")),
    table_kind=st.sampled_from(("contiguous", "strided", "broadcast")), layout=st.sampled_from(("half", "interleaved")),
    in_place=st.booleans(), seed=st.integers(0, 2**32 - 1),
)  # fmt: skip
def test_cuda_q_and_k_pair_matches_the_reference(dtype, shape, q_kind, k_kind, table_kind, layout, in_place, seed):
    """``rope_cuda.rotate_cos_sin_pair`` (``rotate_pair``'s one launch, or one each where rows
    do not line up) on drawn layouts of q, k ``[b, h, s, d]`` and tables ``[b, 1, s, r]``."""
    from posenc._kernels import rope_cuda

    b, hq, hk, s, d = shape
    rng = np.random.default_rng(seed)
    q, k = (_laid_out(rng.standard_normal((b, h, s, d)), "numpy", dtype, kind) for h, kind in ((hq, q_kind), (hk, k_kind)))
    r = 2 * int(rng.integers(1, d // 2 + 1))
    cos, sin = _tables(rng, "numpy", dtype, (b, 1, s, r), table_kind, layout)
    reference = _dispatch.references()["rope_apply"]
    with np.errstate(all="ignore"):
        want = [reference(a.copy(), cos, sin, layout=layout) for a in (q, k)]
    (qd, kd, cd, sd), _ = on_gpu("rope_apply", [q, k, cos, sin], {})
    outs = {"out_q": qd, "out_k": kd} if in_place else {}
    got = rope_cuda.rotate_cos_sin_pair(qd, kd, cd, sd, layout=layout, **outs)
    for g, w, a in zip(got, want, (q, k)):
        _close(g, w, dtype, _magnitude(a), "rotate_cos_sin_pair")


@cuda_only
@settings(max_examples=10, deadline=None)
@given(
    op=st.sampled_from(OPS), dtype=st.sampled_from(DTYPES), lead=st.lists(st.integers(1, 2), max_size=2),
    lengths=st.tuples(st.integers(1, 4), st.integers(1, 4), st.integers(1, 4)), kind=st.sampled_from(("contiguous", "strided", "transposed", "broadcast")),
    index_kind=st.sampled_from(("contiguous", "strided", "int32", "broadcast")), out_kind=st.sampled_from(("none", "contiguous", "transposed")),
    seed=st.integers(0, 2**32 - 1),
)  # fmt: skip
def test_cuda_toeplitz_kernels_match_the_reference(op, dtype, lead, lengths, kind, index_kind, out_kind, seed):
    """bfloat16 (``ml_dtypes``), broadcast and transposed operands, strided, int32 and broadcast
    indices and ``out`` for every op, beside ``test_bias_kernels``' draws."""
    q_len, k_len, m = lengths
    rng = np.random.default_rng(seed)
    if op == "toeplitz_expand":
        args, shape = [_laid_out(rng.standard_normal((*lead, q_len + k_len - 1)), "numpy", dtype, kind), q_len, k_len], (*lead, q_len, k_len)
    else:
        width, last = (m, k_len) if op == "toeplitz_gather" else (k_len, m)
        values = rng.standard_normal((*lead, q_len, width)) if op == "toeplitz_gather" else rng.random((*lead, q_len, width))
        index = _index(rng.integers(0, m, q_len + k_len - 1), "numpy", index_kind)
        args, shape = [_laid_out(values, "numpy", dtype, kind), index, last], (*lead, q_len, last)
    want = to_float64(getattr(_toeplitz, op)(*args))
    out = None if out_kind == "none" else _laid_out(np.zeros(shape), "numpy", dtype, out_kind)
    args, kwargs = on_gpu(op, args, {"out": out})
    kernel = next(k for k in _dispatch.kernels(op) if k.name.endswith("numba_cuda"))
    assert kernel.accepts_call(*args, **kwargs)
    got = kernel.load()(*args, **kwargs)
    assert out is None or got is kwargs["out"]
    if op == "toeplitz_scatter":  # float64 sums rounded once; the reference sums in the input dtype
        tol = (k_len + 2) * EPS[dtype] * max(1.0, float(np.abs(want).max(initial=0)))
        np.testing.assert_allclose(to_float64(got), want, rtol=0, atol=tol)
    else:
        np.testing.assert_array_equal(to_float64(got), want)
