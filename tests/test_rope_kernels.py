"""The rotary kernels (``rope_rotate``, ``rope_apply``) against their references.

Hypothesis draws shapes (empty axes and length 1 included), strides (slices, negative
steps, transposed batch axes), dtypes, layouts, partial rotary, ``inverse``, ``scale``,
``out`` (``None``, a buffer, ``x`` itself) and positions up to 2**31, with NaN and inf
in ``x``; every kernel result must equal the reference within one or two units in the
last place of the dtype. CUDA kernels run here only under the numba CUDA simulator.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from arrays import EPS, assert_float64_specials, copy_of, to_float64, ulp
from kernel_samples import kernel, on_gpu
from posenc import _dispatch
from posenc._kernels import _arrays, _codec
from posenc.rotary import _rotate

pytestmark = pytest.mark.kernels

torch = pytest.importorskip("torch")

NUMPY_DTYPES = ("float16", "float32", "float64")
TORCH_DTYPES = ("bfloat16", "float16", "float32", "float64")


def cpu_rotate():
    return kernel("rope_rotate.numba_cpu").load()


def cpu_apply():
    return kernel("rope_apply.numba_cpu").load()


def assert_matches(got, want, dtype, magnitude):
    """Equal up to two ulps of ``dtype`` (relative), or eight of ``magnitude`` (absolute: cancellation
    in ``a*cos - b*sin`` and one-ulp differences between two libraries' cos/sin)."""
    eps = EPS[dtype]
    got, want = to_float64(got), to_float64(want)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=2 * eps, atol=8 * eps * magnitude + 1e-300)


def make(data, dtype, library):
    if library == "torch":
        return torch.from_numpy(np.ascontiguousarray(data)).to(getattr(torch, dtype))
    return np.asarray(data).astype(dtype)


@st.composite
def rotary_cases(draw, libraries=("numpy", "torch"), max_side=5):
    library = draw(st.sampled_from(libraries))
    dtype = draw(st.sampled_from(NUMPY_DTYPES if library == "numpy" else TORCH_DTYPES))
    b, h, s = (draw(st.integers(0 if k == 2 else 1, max_side)) for k in range(3))
    half = draw(st.one_of(st.integers(1, 4), st.sampled_from([8, 11, 19])))  # 16-bit rows: vectors of 8 pairs
    d = 2 * half + draw(st.integers(0, 3))
    # x is a view into a larger buffer: steps along every axis, a negative step (NumPy
    # only, torch has none) and the batch axes permuted.
    steps = [draw(st.integers(1, 2)) for _ in range(4)]
    negative = library == "numpy" and draw(st.booleans())
    order = draw(st.permutations(range(3)))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    sizes = [b, h, s, d]
    buffer_shape = [sizes[k] * steps[k] + 1 for k in range(4)]
    raw = rng.standard_normal([buffer_shape[k] for k in (*order, 3)])
    if draw(st.booleans()) and raw.size:  # NaN and inf propagate like in the reference
        flat = raw.reshape(-1)
        flat[rng.integers(0, flat.size, 3)] = [np.nan, np.inf, -np.inf]
    base = make(raw, dtype, library)
    inverse_order = [order.index(k) for k in range(3)]
    base = base.permute(*inverse_order, 3) if library == "torch" else base.transpose(*inverse_order, 3)
    index = tuple(slice(None, sizes[k] * steps[k], steps[k]) for k in range(4))
    x = base[index]
    if negative:
        x = x[:, ::-1]
    assert tuple(x.shape) == (b, h, s, d)
    mode = draw(st.sampled_from(["shared", "per_batch", "per_token"]))
    large = draw(st.booleans())
    offset = 2**31 - 2 * max_side if large else 0
    shape = {"shared": (s,), "per_batch": (b, 1, s), "per_token": (b, h, s)}[mode]
    pos = offset + rng.integers(0, 2 * max_side, shape)
    pos_dtype = draw(st.sampled_from(["int64", "float64"] + ([] if large else ["int32", "float32"])))
    positions = torch.from_numpy(pos.astype(pos_dtype)) if library == "torch" else pos.astype(pos_dtype)
    inv_freq = 10000.0 ** (-np.arange(half) / half)
    options = dict(
        layout=draw(st.sampled_from(["half", "interleaved"])),
        inverse=draw(st.booleans()),
        scale=draw(st.sampled_from([1.0, 0.5, 1.7])),
    )
    out_mode = draw(st.sampled_from(["none", "buffer", "self"]))
    return library, dtype, x, positions, inv_freq, options, out_mode


def out_for(x, out_mode):
    if out_mode == "none":
        return None
    if out_mode == "self":
        return x
    return torch.zeros_like(x) if isinstance(x, torch.Tensor) else np.zeros_like(x)


def finite_magnitude(x, scale):
    values = to_float64(x)
    values = values[np.isfinite(values)]
    return (np.abs(values).max() if values.size else 1.0) * scale


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=rotary_cases())
def test_cpu_rope_rotate_matches_reference(case):
    library, dtype, x, positions, inv_freq, options, out_mode = case
    assert kernel("rope_rotate.numba_cpu").accepts_call(x, positions, inv_freq, **options, out=out_for(x, out_mode))
    with np.errstate(invalid="ignore"):  # inf - inf in NumPy's reference
        want = _rotate.rotate_positions(copy_of(x), positions, inv_freq, **options)
    before = copy_of(x)
    out = out_for(x, out_mode)
    got = cpu_rotate()(x, positions, inv_freq, **options, out=out)
    if out is not None:
        assert got is out
    assert type(got) is type(x) and got.dtype == x.dtype and tuple(got.shape) == tuple(x.shape)
    if out_mode != "self":  # the input is left alone
        np.testing.assert_array_equal(to_float64(x), to_float64(before))
    assert_matches(got, want, dtype, finite_magnitude(before, options["scale"]))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=rotary_cases(), per_token=st.booleans())
def test_cpu_rope_apply_matches_reference(case, per_token):
    library, dtype, x, positions, inv_freq, options, out_mode = case
    b, h, s, d = x.shape
    half = inv_freq.shape[0]
    angle = np.random.default_rng(half).uniform(-20, 20, ((b, h, s) if per_token else (s,)) + (half,))
    both = np.repeat(angle, 2, -1) if options["layout"] == "interleaved" else np.concatenate([angle, angle], -1)
    cos, sin = make(np.cos(both), dtype, library), make(np.sin(both), dtype, library)
    out = out_for(x, out_mode)
    assert kernel("rope_apply.numba_cpu").accepts_call(x, cos, sin, layout=options["layout"], out=out)
    with np.errstate(invalid="ignore"):  # inf - inf in NumPy's reference
        want = _rotate.rotate_cos_sin(copy_of(x), cos, sin, layout=options["layout"])
    magnitude = finite_magnitude(x, 1.0)
    got = cpu_apply()(x, cos, sin, layout=options["layout"], out=out)
    assert_matches(got, want, dtype, magnitude)


def test_cpu_torch_bfloat16_in_place_writes_the_tensor_itself():
    x = torch.randn(2, 4, 16, 8).to(torch.bfloat16)
    pointer, want = x.data_ptr(), _rotate.rotate_positions(x.clone(), torch.arange(16), np.array([1.0, 0.1, 0.01, 0.001]))
    got = cpu_rotate()(x, torch.arange(16), np.array([1.0, 0.1, 0.01, 0.001]), out=x)
    assert got is x and x.data_ptr() == pointer and x.dtype == torch.bfloat16
    assert_matches(x, want, "bfloat16", 4.0)


def test_cpu_out_overlapping_x_gets_the_reference_result():
    buffer = np.random.default_rng(0).standard_normal((6, 8))
    x, out = buffer[:5], buffer[1:]
    want = _rotate.rotate_positions(x.copy(), np.arange(5), np.array([1.0, 0.5]))
    cpu_rotate()(x, np.arange(5), np.array([1.0, 0.5]), out=out)
    np.testing.assert_allclose(buffer[1:], want, rtol=1e-15, atol=1e-15)


def test_dispatch_picks_the_cpu_kernels_for_host_arrays():
    x = np.zeros((2, 3, 4))
    assert _dispatch.select("rope_rotate", x, np.arange(3), np.ones(2)) is cpu_rotate()
    assert _dispatch.select("rope_apply", x, np.ones((3, 4)), np.ones((3, 4))) is cpu_apply()


@pytest.mark.parametrize("field", ["rows", "elements"])
def test_cpu_kernels_rotate_byte_strided_fields_as_their_contiguous_copies(field):
    """A field of a packed structured array (``x``, positions, ``cos``/``sin``, ``out``) has
    strides that are no whole number of elements: the kernels declined it and the reference
    rotated it, an ulp off the kernel in about one float64 entry in eight (8.9e-16), so the
    bits followed the layout. Now the kernels copy what they cannot address (and no plan
    reads such tables in place): the contiguous copy's bits, as the result, in place
    (``out=x``) and into such an ``out``, from the first call to the planned ones, without
    writing into the other field."""
    import posenc as pe

    rng = np.random.default_rng(0)
    if field == "rows":  # a [16]-channel sub-array per record: unit-stride channels, odd row strides
        records = np.zeros((2, 3, 7), dtype=[("x", "f8", (16,)), ("tag", "i1")])
    else:  # one float per record: every stride odd
        records = np.zeros((2, 3, 7, 16), dtype=[("x", "f8"), ("tag", "i1")])
    records["x"] = rng.standard_normal(records["x"].shape)
    records["tag"] = 7
    x, contiguous = records["x"], np.ascontiguousarray(records["x"])
    positions = np.zeros(7, dtype=[("p", "f8"), ("tag", "i1")])
    positions["p"] = np.arange(7) * 5 + 100.5
    cos, sin = pe.rope_cos_sin(np.arange(7) + 1000, pe.rope_frequencies(16)[0])
    tables = np.zeros((7, 16), dtype=[("cos", "f8"), ("sin", "f8"), ("tag", "i1")])
    tables["cos"], tables["sin"] = cos, sin
    for _ in range(4):  # (plans from the third call)
        np.testing.assert_array_equal(pe.rope(x, offset=1000), pe.rope(contiguous, offset=1000))
        np.testing.assert_array_equal(pe.rope(x, positions["p"]), pe.rope(contiguous, positions["p"].copy()))
        np.testing.assert_array_equal(pe.apply_rope(x, cos, sin), pe.apply_rope(contiguous, cos, sin))
        np.testing.assert_array_equal(pe.apply_rope(contiguous, tables["cos"], tables["sin"]), pe.apply_rope(contiguous, cos, sin))
        want = pe.rope(contiguous, offset=77)
        in_place = records.copy()
        assert pe.rope(in_place["x"], offset=77, out=in_place["x"]) is not None
        np.testing.assert_array_equal(in_place["x"], want)
        into = records.copy()
        pe.rope(contiguous, offset=77, out=into["x"])
        np.testing.assert_array_equal(into["x"], want)
        assert (in_place["tag"] == 7).all() and (into["tag"] == 7).all()


def _readonly(a):
    a.flags.writeable = False
    return a


DECLINED = {
    "integer x": lambda: ((np.zeros((3, 4), np.int32), np.arange(3), np.ones(2)), {}),
    "bool positions": lambda: ((np.zeros((3, 4)), np.ones(3, bool), np.ones(2)), {}),
    "mixed libraries": lambda: ((np.zeros((3, 4)), torch.arange(3), np.ones(2)), {}),
    "autograd": lambda: ((torch.zeros(3, 4, requires_grad=True), torch.arange(3), np.ones(2)), {}),
    "read-only out": lambda: ((np.zeros((3, 4)), np.arange(3), np.ones(2)), {"out": _readonly(np.zeros((3, 4)))}),
    "broadcast out": lambda: ((np.zeros((3, 4)), np.arange(3), np.ones(2)), {"out": np.broadcast_to(np.zeros(4), (3, 4))}),
    "out of another dtype": lambda: ((np.zeros((3, 4)), np.arange(3), np.ones(2)), {"out": np.zeros((3, 4), np.float32)}),
}


@pytest.mark.parametrize("why", DECLINED)
def test_cpu_kernel_declines_what_it_cannot_do(why):
    args, kwargs = DECLINED[why]()
    assert not kernel("rope_rotate.numba_cpu").accepts_call(*args, **kwargs), why
    chosen = _dispatch.select("rope_rotate", *args, **kwargs)
    if why == "autograd":  # recorded by autograd: the custom op, whose backward is the kernel
        from posenc.torch import _ops

        assert chosen is _ops.rope_rotate
    else:
        assert chosen is _rotate.rotate_positions


def test_accepts_imports_neither_numba_nor_torch():
    code = (
        "import sys, numpy as np, posenc\n"
        "from posenc import _dispatch\n"
        "x = np.zeros((2, 3, 4))\n"
        "k = {k.name: k for k in _dispatch.kernels()}\n"
        "assert k['rope_rotate.numba_cpu'].accepts_call(x, np.arange(3), np.ones(2))\n"
        "assert k['rope_apply.numba_cpu'].accepts_call(x, np.ones((3, 4)), np.ones((3, 4)))\n"
        "assert not k['rope_rotate.numba_cuda'].accepts_call(x, np.arange(3), np.ones(2))\n"
        "print(' '.join(m for m in ('numba', 'torch', 'cupy') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_codec_round_trips_every_16_bit_pattern_and_rounds_to_nearest_even():
    bits = np.arange(2**16, dtype=np.uint32)
    half = bits.astype(np.uint16).view(np.float16).astype(np.float64)
    with np.errstate(invalid="ignore"):  # signalling NaN patterns
        brain = (bits << 16).view(np.float32).astype(np.float64)
    sample = bits[::97]
    for kind, values in ((_codec.FLOAT16, half), (_codec.BFLOAT16, brain)):
        loaded = np.array([_codec.load(np.uint16(b), kind) for b in sample])
        np.testing.assert_array_equal(loaded, values[sample])
        row = np.zeros(1, np.uint16)
        finite = sample[np.isfinite(values[sample])]
        for b in finite:
            _codec.store(row, 0, values[b], kind)
            assert values[row[0]] == values[b]
    # Ties between neighbours go to the even one; just above a tie rounds up.
    row = np.zeros(1, np.uint16)
    for kind, values in ((_codec.FLOAT16, half), (_codec.BFLOAT16, brain)):
        for lo in (0x3C00, 0x3C01, 0x0001, 0x0002):
            a, b = values[lo], values[lo + 1]
            _codec.store(row, 0, (a + b) / 2, kind)
            assert row[0] == (lo if lo % 2 == 0 else lo + 1)
            _codec.store(row, 0, np.nextafter((a + b) / 2, np.inf), kind)
            assert row[0] == lo + 1


def test_codec_float16_store_equals_numpy_cast():
    rng = np.random.default_rng(7)
    values = np.concatenate([rng.standard_normal(3000) * 10.0 ** rng.integers(-8, 6, 3000), [65519.9, 65520.0, -7e4, 1e-9]])
    row = np.zeros(1, np.uint16)
    with np.errstate(over="ignore"):  # NumPy warns when it rounds to inf
        want = values.astype(np.float16).view(np.uint16)
    for v, w in zip(values, want):
        _codec.store(row, 0, v, _codec.FLOAT16)
        assert row[0] == w, v


# ------------------------------------------------------------------ CUDA (simulator)

cuda_only = pytest.mark.skipif(not _arrays.numba_cuda(), reason="no GPU and no CUDA simulator")
# The CUDA simulator runs a kernel's arithmetic as NumPy scalars, which warn on inf * 0 where the
# hardware silently gives NaN (the value the reference gives too): not an error of the kernel.
simulated_arithmetic = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")


@cuda_only
@simulated_arithmetic
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=rotary_cases(libraries=("numpy",), max_side=3))
def test_cuda_rope_rotate_matches_reference(case):
    library, dtype, x, positions, inv_freq, options, out_mode = case
    if any(st < 0 for st in x.strides):  # the CUDA kernels take non-negative strides
        x = x.copy()
    with np.errstate(invalid="ignore"):  # inf - inf in NumPy's reference
        want = _rotate.rotate_positions(x.copy(), positions, inv_freq, **options)
    out = {"none": None, "self": x, "buffer": np.zeros_like(x)}[out_mode]
    (xd, pd, inv_freq), kwargs = on_gpu("rope_rotate", [x, positions, inv_freq], dict(options, out=out))
    assert kernel("rope_rotate.numba_cuda").accepts_call(xd, pd, inv_freq, **kwargs)
    got = _dispatch.call("rope_rotate", xd, pd, inv_freq, **kwargs)
    assert_matches(got, want, dtype, finite_magnitude(x, options["scale"]))


def test_cpu_cos_sin_split_of_half_pi_and_accuracy():
    mpmath = pytest.importorskip("mpmath")
    from posenc._kernels import rope_cpu

    mpmath.mp.prec = 200
    parts = (rope_cpu._P1, rope_cpu._P2, rope_cpu._P3, rope_cpu._P4)
    assert abs(sum(mpmath.mpf(p) for p in parts) - mpmath.pi / 2) < mpmath.mpf(2) ** -118
    for part in parts[:3]:  # 21 significant bits: n * part is exact for |n| < 2**32
        mantissa, _ = np.frexp(part)
        assert float(mantissa * 2**21) == int(mantissa * 2**21)
    rng = np.random.default_rng(3)
    limit = rope_cpu.FAST_ANGLE_LIMIT
    # Uniform angles, small ones, and the float64 nearest to k*pi/2 (the reduction cancels most there).
    near = [float(mpmath.mpf(int(k)) * mpmath.pi / 2) for k in rng.integers(1, int(limit / 1.6), 200)]
    angles = np.concatenate([rng.uniform(-limit, limit, 300), rng.uniform(-4, 4, 300), near])
    for angle in angles:
        cos, sin = rope_cpu._cos_sin.py_func(angle)
        exact = mpmath.mpf(float(angle))
        assert abs(cos - float(mpmath.cos(exact))) <= 2**-52 and abs(sin - float(mpmath.sin(exact))) <= 2**-52


def test_cpu_angles_beyond_the_reduction_go_to_the_reference():
    """The tokens whose angles pass the limit take the reference; the others keep the
    kernel's numbers of a call without them (a row never depends on the rest of the call)."""
    from posenc._kernels import rope_cpu

    x = np.random.default_rng(4).standard_normal((2, 5, 8))
    positions = np.array([3.0, 7.0, 2.0**40, 11.0, 2.0**33])  # 2**40 and 2**33 * 1.0 are beyond FAST_ANGLE_LIMIT
    inv_freq = np.array([1.0, 0.1, 0.01, 0.001])
    got = cpu_rotate()(x, positions, inv_freq)
    beyond, near = [2, 4], [0, 1, 3]
    assert 2.0**33 > rope_cpu.FAST_ANGLE_LIMIT
    np.testing.assert_array_equal(got[:, beyond], _rotate.rotate_positions(x[:, beyond], positions[beyond], inv_freq))
    np.testing.assert_array_equal(got[:, near], cpu_rotate()(x[:, near], positions[near], inv_freq))


# ------------------------------------------------------------------ 16-bit CPU path


def test_cpu_codec_loads_every_16_bit_pattern_and_stores_float32_like_numpy_and_torch():
    from llvmlite import ir
    from numba import njit, types
    from numba.extending import intrinsic

    from posenc._kernels import _codec_f32

    @intrinsic(prefer_literal=True)
    def narrow(typingctx, value, brain):  # the kernels' store, as a scalar
        return types.uint16(value, brain), lambda context, builder, sig, args: _codec_f32.narrow(builder, args[0], sig.args[1].literal_value)

    @intrinsic(prefer_literal=True)
    def narrow8(typingctx, values, i, brain):  # and as a vector of 8
        def codegen(context, builder, sig, args):
            data = context.make_array(sig.args[0])(context, builder, args[0]).data
            vector = ir.VectorType(ir.FloatType(), 8)
            loaded = builder.load(builder.bitcast(builder.gep(data, [args[1]]), vector.as_pointer()), align=4)
            bits = _codec_f32.narrow(builder, loaded, sig.args[2].literal_value)
            return builder.extract_element(bits, ir.Constant(ir.IntType(32), 3))

        return types.uint16(values, i, brain), codegen

    @njit
    def loads(bits, kind, out):
        for i in range(bits.shape[0]):
            out[i] = _codec_f32.from_bfloat16(bits[i]) if kind == _codec.BFLOAT16 else _codec_f32.from_float16(bits[i])

    @njit
    def stores(values, kind, out):
        for i in range(values.shape[0]):
            out[i] = narrow(values[i], True) if kind == _codec.BFLOAT16 else narrow(values[i], False)

    @njit
    def vector_stores(values, kind, out):  # lane 3 of the 8 from values[i - 3]
        padded = np.zeros(values.shape[0] + 8, np.float32)
        padded[3 : 3 + values.shape[0]] = values
        for i in range(values.shape[0]):
            out[i] = narrow8(padded, i, True) if kind == _codec.BFLOAT16 else narrow8(padded, i, False)

    bits = np.arange(2**16, dtype=np.uint32).astype(np.uint16)
    rng = np.random.default_rng(5)
    values = (rng.standard_normal(100_000) * 10.0 ** rng.integers(-45, 39, 100_000)).astype(np.float32)
    values = np.concatenate([values, np.float32([0.0, -0.0, np.inf, -np.inf, 65504.0, 65520.0, 3.4e38, 2.0**-24, 2.0**-25])])
    # Exact ties between neighbouring 16-bit values, both formats.
    with np.errstate(invalid="ignore", over="ignore"):
        half = bits.view(np.float16).astype(np.float32)
        brain = (bits.astype(np.uint32) << 16).view(np.float32)
    for grid in (half, brain):
        finite = np.sort(grid[np.isfinite(grid)])
        values = np.concatenate([values, ((finite[:-1].astype(np.float64) + finite[1:]) / 2).astype(np.float32)])
    for kind, exact, want in (
        (_codec.FLOAT16, half, lambda v: v.astype(np.float16).view(np.uint16)),
        (_codec.BFLOAT16, brain, lambda v: torch.from_numpy(v).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)),
    ):
        loaded = np.empty(bits.size, np.float32)
        loads(bits, kind, loaded)
        np.testing.assert_array_equal(loaded, exact)  # NaN patterns compare equal as NaN
        with np.errstate(over="ignore"):
            expected = want(values)
        for store in (stores, vector_stores):
            stored = np.empty(values.size, np.uint16)
            store(values, kind, stored)
            np.testing.assert_array_equal(stored, expected)
            nan = np.empty(1, np.uint16)
            store(np.float32([np.nan]), kind, nan)
            assert np.isnan(_codec.load(nan[0], kind))


@pytest.mark.parametrize("pairs", [1, 19])  # 19: two vectors of 8 pairs and 3 pairs on their own
@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_cpu_16_bit_rotation_is_within_one_ulp_of_float64_under_cancellation(dtype, layout, pairs):
    """``a*cos - b*sin`` with ``a == b`` at angles near pi/4 cancels up to 23 bits: plain float32
    arithmetic would be many ulps off there; the kernel stays within one ulp of float64."""
    rng = np.random.default_rng(11)
    rows = 4096 // pairs
    a = make(rng.uniform(0.5, 2.0, (rows, pairs)), dtype, "torch").double().numpy()
    angle = np.pi / 4 + np.pi * rng.integers(0, 1000, rows) + rng.choice([-1, 1], rows) * 10.0 ** rng.uniform(-7, -2, rows)
    c, s = np.cos(angle)[:, None], np.sin(angle)[:, None]
    exact = np.stack([a * c - a * s, a * c + a * s], axis=-1)  # [rows, pairs, 2]
    if layout == "half":
        x, exact = np.concatenate([a, a], -1), np.concatenate([exact[..., 0], exact[..., 1]], -1)
    else:
        x, exact = np.repeat(a, 2, -1), exact.reshape(rows, 2 * pairs)
    got = cpu_rotate()(make(x, dtype, "torch"), torch.from_numpy(angle), np.ones(pairs), layout=layout)
    assert np.all(np.abs(to_float64(got) - exact) <= ulp(exact, dtype))


# (inf * 0 in the float64 reference: the NaNs meant here)
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_cpu_16_bit_apply_with_infinite_tables_gives_the_float64_formulas_values(dtype):
    """An infinite ``cos``/``sin`` entry is its own head with a rest of 0 (Veltkamp's split
    of it would be ``inf - inf``): the infinities and NaNs of the float64 formula."""
    from posenc.rotary import _rotate

    rng = np.random.default_rng(15)
    x = make(rng.standard_normal((2, 3, 5, 8)), dtype, "torch")
    cos, sin = (make(rng.uniform(-1, 1, (5, 8)), dtype, "torch") for _ in range(2))
    cos[1, :2], sin[2, 4:6], cos[3, 1], sin[3, 1] = float("inf"), -float("inf"), float("inf"), float("inf")
    got = to_float64(cpu_apply()(x, cos, sin))
    want = _rotate.rotate_cos_sin(*(to_float64(t) for t in (x, cos, sin)))
    assert_float64_specials(got, want, dtype)


@pytest.mark.parametrize("op", ["rotate", "apply"])
def test_cpu_bfloat16_nan_of_every_payload_stays_nan(op):
    """The bfloat16 store rounds without a NaN select (``_codec_f32.narrow``): every NaN
    the rotation computes from bfloat16 operands keeps an operand's payload (zero low 16 bits)
    or is the default NaN, so the rounding increment never carries out of it."""
    bits = np.arange(2**16, dtype=np.uint32).astype(np.uint16)
    nan_bits = bits[np.isnan((bits.astype(np.uint32) << 16).view(np.float32))]
    n = nan_bits.size
    rng = np.random.default_rng(17)
    x = torch.from_numpy(np.stack([nan_bits, rng.integers(0x3000, 0x4000, n).astype(np.uint16)], axis=-1).view(np.int16)).view(torch.bfloat16)
    x = torch.cat([x, x.flip(-1)])  # the NaN as a and as b
    if op == "rotate":
        got = cpu_rotate()(x, torch.from_numpy(rng.uniform(0, 1000, 2 * n)), np.array([1.0]))
    else:
        angle = torch.from_numpy(np.repeat(rng.uniform(-4, 4, (2 * n, 1)), 2, axis=-1))
        got = cpu_apply()(x, torch.cos(angle).to(torch.bfloat16), torch.sin(angle).to(torch.bfloat16))
    assert torch.isnan(got.float()).all(dim=-1).all()  # a NaN in a pair makes both outputs NaN


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("storage", ["uint16", "float32", "float64"])
def test_cpu_vector_pairs_check_every_index_under_bounds_checking(storage, interleaved):
    """``_pairs.rotate_16``/``rotate_wide`` index raw pointers; with Numba's bounds checking on
    (as in ``make test-kernels-boundscheck``) a pair beyond a row or a table row raises instead."""
    from numba import njit

    from posenc._kernels._pairs import rotate_16, rotate_wide

    def eight_pairs(src, dst, c, table, i):
        if storage == "uint16":
            if interleaved:
                rotate_16(src, dst, c, table, table, table, i, 8, 8, True, True)
            else:
                rotate_16(src, dst, c, table, table, table, i, 8, 8, True, False)
        elif interleaved:
            rotate_wide(src, dst, c, table, i, 8, 8, True)
        else:
            rotate_wide(src, dst, c, table, i, 8, 8, False)

    checked = njit(boundscheck=True)(eight_pairs)
    row, table = np.zeros(16, storage), np.zeros(8, np.float32 if storage == "uint16" else np.float64)
    checked(row, row, table, table, 0)  # the whole row, in place
    cases = ((row, row, table, 1), (row, row, table, -1), (row[:15], row, table, 0), (row, row[:15], table, 0), (row, row, table[:7], 0))
    for src, dst, c, i in cases:
        with pytest.raises(IndexError):
            checked(src, dst, c, table, i)
