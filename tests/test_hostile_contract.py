"""The contract under hostile input (issue 35): a clear error naming the argument before any
kernel runs, never a silently wrong number, results independent of the rest of the call,
and caches that stay bounded. Numbers are compared with float64 formulas (tests/formulas.py)
or Python integers, never with posenc's own output of another path.

Numbered as the issue's items.
"""

import warnings

import numpy as np
import pytest
from formulas import exact_rope, hf_t5_bucket, inv_freq

import posenc as pe

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(35)
SLOPE = np.array([0.5])
T5_TABLE = np.arange(32.0)[:, None]  # bias = the bucket number


def strided(buffer, shape, strides):
    """A writable view of ``buffer`` with element ``strides``."""
    return np.lib.stride_tricks.as_strided(buffer, shape, tuple(s * buffer.itemsize for s in strides))


def alibi_formula(q, k, slope=0.5):
    """``-slope * (q - k)`` in Python integers, then float64."""
    return np.array([[-slope * float(int(a) - int(b)) for b in k] for a in q])


# ---------------------------------------------------------------- 1. out sharing memory with an input


def test_1_out_overlapping_cos_or_sin_is_refused_cold_and_cached():
    x = RNG.standard_normal((4, 8))
    tables = np.stack(pe.rope_cos_sin(np.arange(4), inv_freq(8), dtype=np.float64))
    cos, sin = tables[0], tables[1]
    pe.apply_rope(x, cos, sin, out=np.empty_like(x))  # a plan of this signature now exists
    for name, out in (("cos", tables[0]), ("sin", tables[1])):
        with pytest.raises(ValueError, match=f"out shares memory with {name}"):
            pe.apply_rope(x, cos, sin, out=out)
        with pytest.raises(ValueError, match=f"out shares memory with {name}"):
            pe.apply_rope(out, cos, sin, out=out)  # in place, into the tables


def test_1_out_overlapping_float_positions_or_delta_is_refused():
    buffer = np.zeros((4, 9))
    with pytest.raises(ValueError, match="out shares memory with positions"):
        pe.rope(np.ones((4, 8)), buffer[:, 0], out=buffer[:, :8])
    with pytest.raises(ValueError, match="out shares memory with delta"):
        pe.rerotate(np.ones((4, 8)), buffer[:, 0], inv_freq(8), out=buffer[:, :8])
    # Disjoint columns of the same buffer are fine (18): the positions are read, the rest written.
    buffer[:, 8] = [3.0, 5.0, 7.0, 11.0]
    x = RNG.standard_normal((4, 8))
    result = pe.rope(x, buffer[:, 8], out=buffer[:, :8])
    np.testing.assert_allclose(result, exact_rope(x, [3.0, 5.0, 7.0, 11.0]), atol=1e-12)


# ---------------------------------------------------------------- 2. stride-0 and self-overlapping out


@pytest.mark.parametrize(
    "call",
    [
        lambda x, out: pe.rope(x, out=out),
        lambda x, out: pe.rerotate(x, 3, inv_freq(8), out=out),
        lambda x, out: pe.apply_rope(x, *pe.rope_cos_sin(pe.positions_from_mask(x[:, 0] == x[:, 0]), inv_freq(8), dtype=x.dtype), out=out),
    ],
    ids=["rope", "rerotate", "apply_rope"],
)
def test_2_stride_zero_out_is_refused(call):
    with pytest.raises(ValueError, match="share memory.*stride-0"):
        call(np.ones((4, 8)), strided(np.zeros(8), (4, 8), (0, 1)))
    with pytest.raises(ValueError, match="share memory.*stride-0"):
        call(torch.ones(4, 8, dtype=torch.float64), torch.zeros(1, 8, dtype=torch.float64).expand(4, 8))


def test_2_stride_zero_out_of_per_token_alibi_and_rope_in_place_are_refused():
    with pytest.raises(ValueError, match="stride-0"):
        pe.alibi_bias(np.ones(2), 1, 3, query_positions=np.array([2]), key_positions=np.arange(3), out=strided(np.zeros(3), (2, 1, 3), (0, 0, 1)))
    expanded = torch.zeros(1, 8, dtype=torch.float64).expand(4, 8)
    with pytest.raises(ValueError, match="stride-0"):
        pe.rope(expanded, out=expanded)
    folded = strided(np.zeros(16), (4, 8), (2, 1))  # rows overlap by 6 elements
    with pytest.raises(ValueError, match="share memory"):
        pe.rope(np.ones((4, 8)), out=folded)


# ---------------------------------------------------------------- 3-6. the integer rule


@pytest.mark.parametrize(
    "offset",
    [2**63 - 1, np.array([2**63 - 1]), np.array(2**63 - 1), np.array([2**63], dtype=np.uint64), np.array([0, 2**63 - 1])],
    ids=["int", "per-row", "0-d", "uint64", "two rows"],
)
def test_3_offsets_beyond_int64_are_refused_on_every_path(offset):
    x = np.ones((2 if np.ndim(offset) and np.size(offset) == 2 else 1, 3, 8))
    with pytest.raises(ValueError, match="offset"):
        pe.rope(x, offset=offset)
    with pytest.raises(ValueError, match="offset"):
        pe.rope(x, np.arange(3), offset=offset)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.uint64])
def test_4_narrow_and_unsigned_positions_are_widened_before_the_offset(dtype):
    positions = np.array([0, 100, 120, min(int(np.iinfo(dtype).max), 2**40)], dtype=dtype)
    x = RNG.standard_normal((4, 8))
    for offset in (10, -1, 200):
        expected = exact_rope(x, [int(p) + offset for p in positions])
        np.testing.assert_allclose(pe.rope(x, positions, offset=offset), expected, atol=1e-9)
    tp = torch.tensor([0, 1, 200], dtype=torch.uint8)
    xt = torch.from_numpy(x[:3].copy())
    np.testing.assert_allclose(pe.rope(xt, tp, offset=-1).numpy(), exact_rope(x[:3], [-1, 0, 199]), atol=1e-12)


def test_4_torch_uint64_positions_are_widened_or_refused():
    """torch has no min/max of uint64 on the CPU; its positions are still read exactly."""
    x = torch.from_numpy(RNG.standard_normal((3, 8)))
    small = torch.tensor([0, 7, 2**40], dtype=torch.uint64)
    np.testing.assert_allclose(pe.rope(x, small, offset=-1).numpy(), exact_rope(x.numpy(), [-1, 6, 2**40 - 1]), atol=1e-9)
    q, k = torch.tensor([5], dtype=torch.uint64), torch.tensor([1, 9], dtype=torch.uint64)
    np.testing.assert_array_equal(pe.t5_bias(T5_TABLE, 1, 2, query_positions=q, key_positions=k)[0, 0].numpy(), hf_t5_bucket(np.array([1, 9]) - 5, num_buckets=32, max_distance=128).astype(float))
    for values, extent in (([3, 2**63], "from 3 to 9223372036854775808"), ([2**64 - 1, 2**63 + 1], "from 9223372036854775809 to 18446744073709551615")):
        big = torch.tensor([v - 2**64 if v >= 2**63 else v for v in values], dtype=torch.int64).view(torch.uint64)
        with pytest.raises(ValueError, match=f"positions must fit in int64 .*got values {extent}$"):
            pe.rope(x[:2], big)
    # A planned logits call reads their extremes too (from its third call on).
    qx, kx, table = torch.randn(1, 2, 1, 8), torch.randn(1, 2, 2, 8), torch.randn(9, 8)
    expected = pe.shaw_logits(qx, kx, table, max_distance=4, query_positions=q.long(), key_positions=k.long())
    for _ in range(4):
        assert torch.equal(pe.shaw_logits(qx, kx, table, max_distance=4, query_positions=q, key_positions=k), expected)


@pytest.mark.parametrize("namespace", ["jax", "array_api_strict"])
def test_4_narrow_positions_of_the_tables_and_the_decay_without_float64(namespace):
    """Without float64 (JAX without x64, array-api-strict's device without it) the angles are
    reduced from exact chunks of the positions, ``p // 2**24`` first: narrow integer positions
    are widened before it, so int8/uint8/int16/uint16 give int32's numbers. (JAX wrapped
    ``2**24`` in the narrow dtype, silently; array-api-strict refused the scalar.)"""
    ids = np.array([[5, 100, 127], [7, 100, 3], [9, 100, 0]])
    if namespace == "jax":
        jnp = pytest.importorskip("jax.numpy")
        if pytest.importorskip("jax").config.jax_enable_x64:
            pytest.skip("needs JAX without x64")
        make, host = jnp.asarray, np.asarray
    else:
        strict = pytest.importorskip("array_api_strict")
        device = strict.Device("no_float64")
        make = lambda a: strict.asarray(a, device=device)  # noqa: E731
        host = lambda t: np.asarray(t.to_device(strict.Device("CPU_DEVICE")))  # noqa: E731
    inv, _ = pe.rope_frequencies(8)
    calls = {
        "rope_cos_sin": lambda p: pe.rope_cos_sin(p[0, ...], inv),
        "mrope_cos_sin": lambda p: pe.mrope_cos_sin(p, inv, [2, 1, 1]),
        "xdrope_cos_sin": lambda p: pe.xdrope_cos_sin(p, inv, [2, 1, 1]),
        "rope_decay": lambda p: (pe.rope_decay(p[0, ...], 8),),
    }
    for name, call in calls.items():
        want = [host(t) for t in call(make(ids.astype(np.int32)))]
        for dtype in (np.int8, np.uint8, np.int16, np.uint16):
            got = [host(t) for t in call(make(ids.astype(dtype)))]
            for g, w in zip(got, want):
                np.testing.assert_array_equal(g, w, err_msg=f"{name} of {np.dtype(dtype).name} positions")


def test_4_narrow_per_token_positions_of_the_biases():
    q, k = np.array([0], np.uint8), np.array([1, 255], np.uint8)
    np.testing.assert_array_equal(pe.alibi_bias(SLOPE, 1, 2, query_positions=q, key_positions=k)[0], alibi_formula([0], [1, 255]))
    q8, k8 = np.array([100], np.int8), np.array([-100], np.int8)
    np.testing.assert_array_equal(pe.alibi_bias(np.array([1.0]), 1, 1, query_positions=q8, key_positions=k8)[0], [[-200.0]])
    t5 = pe.t5_bias(T5_TABLE, 1, 2, query_positions=q, key_positions=k)[0, 0]
    np.testing.assert_array_equal(t5, hf_t5_bucket(np.array([1, 255]) - 0, num_buckets=32, max_distance=128).astype(float))
    shaw = pe.relative_bias("shaw", np.arange(5.0)[:, None], 1, 2, max_distance=2, query_positions=q, key_positions=k)[0, 0]
    np.testing.assert_array_equal(shaw, [np.clip(0 - 1, -2, 2) + 2, np.clip(0 - 255, -2, 2) + 2])


@pytest.mark.parametrize("kind", ["alibi", "t5"])
def test_5_per_token_differences_beyond_int64_are_refused(kind):
    params = SLOPE if kind == "alibi" else T5_TABLE
    for q, k in (([-(2**63)], [1]), ([2**63 - 1], [-1])):
        with pytest.raises(ValueError, match="query_positions - key_positions must stay within int64"):
            pe.relative_bias(kind, params, 1, 1, query_positions=np.array(q), key_positions=np.array(k))
    with pytest.raises(ValueError, match="offset"):  # the offset added to the query positions
        pe.relative_bias(kind, params, 1, 1, offset=2**62, query_positions=np.array([2**62]), key_positions=np.array([0]))
    # A difference at the very edge is exact.
    edge = pe.alibi_bias(np.array([1.0]), 1, 1, query_positions=np.array([2**62]), key_positions=np.array([-(2**62) + 1]))
    assert float(edge[0, 0, 0]) == -float(2**63 - 1)


@pytest.mark.parametrize("lib", ["numpy", "torch"])
@pytest.mark.parametrize("kind", ["alibi", "t5"])
def test_5_per_token_distances_up_to_int64s_greatest_are_computed(kind, lib):
    """Distances repeated across a batch are computed once each, over their span up to
    2**63 - 1 (torch's ``arange`` refused the end past it: a RuntimeError)."""
    params = SLOPE if kind == "alibi" else T5_TABLE
    q, k = np.full((2, 1), 2**63 - 1), np.arange(4)
    want = pe.relative_bias(kind, params, 1, 4, query_positions=q[:1], key_positions=k)  # one row: no repeats
    if lib == "torch":
        torch = pytest.importorskip("torch")
        params, q, k = torch.from_numpy(params), torch.from_numpy(q), torch.from_numpy(k)
    got = pe.relative_bias(kind, params, 1, 4, query_positions=q, key_positions=k)
    np.testing.assert_array_equal(np.asarray(got), np.broadcast_to(want, (2, *want.shape[1:])))


def test_6_jax_without_x64_checks_int32_with_posencs_error():
    jnp = pytest.importorskip("jax.numpy")
    import jax

    if jax.config.jax_enable_x64:
        pytest.skip("x64 is on")
    x = jnp.ones((2, 8))
    with pytest.raises(ValueError, match="int32"):
        pe.rope(x, offset=2**31 - 1)
    with pytest.raises(ValueError, match="offset must fit in int32"):
        pe.rope(x, offset=2**31)
    with pytest.raises(ValueError, match="int32"):
        pe.t5_bias(jnp.asarray(T5_TABLE), 1, 3, offset=-(2**31) + 1)
    with pytest.raises(ValueError, match="beyond int32"):
        pe.kerple_bias(jnp.ones(1), jnp.ones(1), 1, 3, offset=-(2**31) + 1)
    with pytest.raises(ValueError, match="beyond int32"):
        pe.sandwich_bias(3, 1, 4, offset=2**31 - 2, xp=jnp)
    with pytest.raises(ValueError, match="int32"):
        pe.alibi_bias(jnp.ones(1), 1, 1, query_positions=jnp.asarray([2**31 - 1]), key_positions=jnp.asarray([-5]))
    with pytest.raises(ValueError, match="delta must fit in int32"):
        pe.rerotate(x, 2**31, [1.0])
    # shaw_output had checked its offset against int64: 2**31 - 1 wrapped silently, 2**31 + 1 raised JAX's OverflowError.
    weights, v, table = jnp.ones((1, 2, 3)), jnp.ones((1, 3, 4)), jnp.ones((5, 4))
    for offset in (2**31 - 1, 2**31 + 1):
        with pytest.raises(ValueError, match="int32"):
            pe.shaw_output(weights, v, table, max_distance=2, offset=offset)


# ---------------------------------------------------------------- 7. rows independent of the call


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16])
def test_7_a_position_beyond_the_fast_limit_changes_no_other_row(dtype):
    x = RNG.standard_normal((64, 8)).astype(dtype)
    positions = np.arange(64) * 7919
    positions[-1] = 5 * 10**9  # angle beyond rope_cpu.FAST_ANGLE_LIMIT
    together = pe.rope(x, positions)
    np.testing.assert_array_equal(together[:-1], pe.rope(x[:-1], positions[:-1]))
    np.testing.assert_array_equal(together[-1:], pe.rope(x[-1:], positions[-1:]))
    in_place = x.copy()
    pe.rope(in_place, positions, out=in_place)
    np.testing.assert_array_equal(in_place, together)


@pytest.mark.parametrize(("dtype", "shape"), [("float64", (1, 4, 8, 16)), ("float32", (1, 4, 8, 16)), ("float32", (4, 2048, 64))])
def test_7_jitted_jax_a_position_beyond_the_fast_limit_changes_no_other_row(dtype, shape):
    """Under ``jax.jit`` on CPU: a decode-size call (the compiled FFI handler's plan, which
    hands a call holding a far angle to the Python handler) and a large one (the Python
    handler itself). float64 with int64 positions under x64; float32 with float32
    positions (int32 positions cannot reach the limit)."""
    jax = pytest.importorskip("jax")
    jnp = pytest.importorskip("jax.numpy")
    rope = jax.jit(lambda x, p: pe.rope(x, p))
    with jax.enable_x64(dtype == "float64"):
        x = jnp.asarray(RNG.standard_normal(shape).astype(dtype))
        positions = np.arange(shape[-2]) * 7919
        positions[-1] = 5 * 10**9  # angle beyond rope_cpu.FAST_ANGLE_LIMIT
        p = jnp.asarray(positions if dtype == "float64" else positions.astype(np.float32))
        if shape[-2] == 8:
            assert f"posenc_rope_rotate_{dtype}_half_{p.dtype.name}" in rope.lower(x, p).as_text()
        together = np.asarray(rope(x, p))
        np.testing.assert_array_equal(together[..., :-1, :], np.asarray(rope(x[..., :-1, :], p[:-1])))
        np.testing.assert_array_equal(together[..., -1:, :], np.asarray(rope(x[..., -1:, :], p[-1:])))
    tolerance = 1e-9 if dtype == "float64" else 1e-5
    np.testing.assert_allclose(together, exact_rope(np.asarray(x, np.float64), np.asarray(p, np.float64)), atol=tolerance)


# ---------------------------------------------------------------- 8, 17. size checks before allocating


def _huge(*lead):
    return np.broadcast_to(np.ones(8), (*lead, 8))


@pytest.mark.parametrize(
    "call",
    [
        lambda: pe.rope(_huge(2, 2**40), seq_len=np.array([4, 5]), scaling=pe.scaling.DynamicNTK(2.0, original_max_position=2)),
        lambda: pe.rope(_huge(2**22, 2**20)),
        lambda: pe.apply_rope(_huge(2**22, 2**20), *pe.rope_cos_sin(np.arange(1), inv_freq(8))),
        lambda: pe.rerotate(_huge(2**22, 2**20), 3, inv_freq(8)),
        lambda: pe.positions_from_cu_seqlens(np.array([0, 2**45]), 2**45),
        lambda: pe.positions_from_mask(np.broadcast_to(np.ones(1, bool), (2**22, 2**20))),
        lambda: pe.attention(_huge(2**20), _huge(2**20), _huge(2**20)),
    ],
    ids=["rope per-row seq_len", "rope", "apply_rope", "rerotate", "positions_from_cu_seqlens", "positions_from_mask", "attention"],
)
def test_8_17_results_too_large_are_refused_before_allocating(call):
    with pytest.raises(ValueError, match=r"of shape \(.*\) needs .* GiB"):
        call()


# ---------------------------------------------------------------- 13, 14, 15, 16. late or unclear refusals


def test_13_read_only_out_is_refused_before_any_work(monkeypatch):
    from posenc import _dispatch

    monkeypatch.setattr(_dispatch, "call", lambda *a, **k: pytest.fail("a kernel ran"))
    read_only = np.zeros((4, 8))
    read_only.flags.writeable = False
    for call in (lambda: pe.rope(np.ones((4, 8)), out=read_only), lambda: pe.rope(read_only, out=read_only)):
        with pytest.raises(ValueError, match="out is read-only"):
            call()


@pytest.mark.parametrize("seq_axis", [1.5, True, "zz", 99, -1])
def test_14_seq_axis_is_validated_with_0d_positions_and_an_integer_delta(seq_axis):
    error = TypeError if isinstance(seq_axis, (bool, float)) else ValueError
    with pytest.raises(error, match="seq_axis"):
        pe.rope(np.ones((4, 8)), np.array(3), seq_axis=seq_axis)
    with pytest.raises(error, match="seq_axis"):
        pe.rerotate(np.ones((4, 8)), 3, inv_freq(8), seq_axis=seq_axis)


def test_15_position_dtype_problems_name_the_argument():
    with pytest.raises(ValueError, match="key_positions must fit in int64"):
        pe.t5_bias(T5_TABLE, 1, 1, query_positions=np.array([0], np.uint64), key_positions=np.array([2**63], np.uint64))
    with pytest.raises(ValueError, match="positions must fit in int64"):
        pe.rope(np.ones((1, 8)), np.array([2**63], np.uint64))
    with pytest.raises(TypeError, match="query_positions must have an integer dtype"):
        pe.t5_bias(T5_TABLE, 1, 1, query_positions=np.array([0.5]), key_positions=np.array([0]))
    # torch's narrow unsigned positions of a table lookup: widened, the rows right.
    shaw = pe.relative_bias(
        "shaw", torch.arange(5.0)[:, None], 1, 2, max_distance=2,
        query_positions=torch.tensor([0], dtype=torch.uint8), key_positions=torch.tensor([1, 255], dtype=torch.uint8),
    )  # fmt: skip
    assert shaw[0, 0].tolist() == [1.0, 0.0]


def test_16_an_empty_batch_with_a_per_row_seq_len():
    dynamic = pe.scaling.DynamicNTK(2.0, original_max_position=2)
    result = pe.rope(np.ones((0, 4, 8)), seq_len=np.zeros(0, np.int64), scaling=dynamic)
    assert result.shape == (0, 4, 8) and result.dtype == np.float64


# ---------------------------------------------------------------- 18, 19, odd dimension


@pytest.mark.parametrize("library", ["numpy", "torch"])
def test_18_disjoint_slices_of_one_buffer_are_accepted(library):
    cache = RNG.standard_normal((2, 3, 16))
    expected = exact_rope(cache[:, :, :4], np.arange(3))
    buffer = cache.copy() if library == "numpy" else torch.from_numpy(cache.copy())
    result = pe.rope(buffer[:, :, :4], out=buffer[:, :, 4:8])
    np.testing.assert_allclose(np.asarray(result), expected, atol=1e-12)
    np.testing.assert_array_equal(np.asarray(buffer[:, :, 8:]), cache[:, :, 8:])  # nothing else written
    with pytest.raises(ValueError, match="overlaps the memory of x"):
        pe.rope(buffer[:, :, :4], out=buffer[:, :, 2:6])


def test_19_byte_order_of_x_and_out():
    x = RNG.standard_normal((4, 8))
    expected = exact_rope(x, np.arange(4))
    big = x.astype(">f8")
    assert pe.rope(big).dtype == np.float64  # native order out
    for order in (">f8", "<f8"):
        out = np.zeros((4, 8), order)
        assert pe.rope(big, out=out) is out
        np.testing.assert_allclose(out, expected, atol=1e-12)


def test_odd_last_dimension_does_not_blame_rotary_dim():
    with pytest.raises(ValueError, match=r"x.shape\[-1\] = 7 cannot be rotated whole") as info:
        pe.rope(np.ones((4, 7)))
    assert "got 7" not in str(info.value)
    with pytest.raises(ValueError, match="rotary_dim must be a positive even integer, got 7"):
        pe.rope(np.ones((4, 8)), rotary_dim=7)


@pytest.mark.parametrize(
    "positions, offset",
    [
        (np.array([2**31 - 1, 0], np.int32), 1),
        (np.array([2**63 - 1, 0], np.int64), 2**63 - 1),
        (np.array([2**63, 0], np.uint64), 0),
        (np.array([0, 1], np.int64), np.array([2**63], np.uint64)),
    ],
    ids=["int32 past its range", "int64 wrap", "uint64", "uint64 per-row offset"],
)
def test_3_4_the_integer_rule_holds_on_planned_calls(positions, offset):
    """The first call of a signature is served by the full path, later ones by a plan: both
    widen first and refuse the same sums."""
    x = RNG.standard_normal((1, 2, 8))
    small = np.zeros_like(positions)
    small_offset = 0 if isinstance(offset, int) else np.zeros_like(offset)
    np.testing.assert_allclose(pe.rope(x, small, offset=small_offset), x[..., :8], atol=0)  # position 0: x itself
    if positions.dtype == np.int32:  # within int64 once widened: the true sum
        np.testing.assert_allclose(pe.rope(x, positions, offset=offset), exact_rope(x, [2**31, 1]), atol=1e-9)
        return
    with pytest.raises(ValueError, match="int64"):
        pe.rope(x, positions, offset=offset)


@pytest.mark.parametrize("dtype", [np.int8, np.int64, np.uint64])
@pytest.mark.parametrize("kind", ["alibi", "t5"])
def test_4_5_per_token_biases_keep_the_integer_rule_when_planned(kind, dtype):
    """A first call of small positions makes the plan; later calls of the same signature
    with narrow values that wrap in their own dtype, or differences beyond int64, get the
    cold call's numbers or its error."""
    params = SLOPE if kind == "alibi" else T5_TABLE
    call = lambda q, k, **kw: pe.relative_bias(kind, params, 1, 2, query_positions=np.array(q, dtype), key_positions=np.array(k, dtype), **kw)  # noqa: E731
    call([0], [0, 1])
    info = np.iinfo(dtype)
    q, k = [int(info.max)], [int(info.min), 0]
    rel = [q[0] - k[0], q[0] - k[1]]
    if rel[0] > 2**63 - 1:
        with pytest.raises(ValueError, match="int64"):
            call(q, k)
        return
    got = call(q, k)[0, 0]
    if kind == "alibi":
        np.testing.assert_array_equal(got, [-0.5 * r for r in rel])
    else:
        np.testing.assert_array_equal(got, hf_t5_bucket(-np.array(rel), num_buckets=32, max_distance=128))
    if dtype == np.int8:
        np.testing.assert_array_equal(call([100], [0, 1], offset=100)[0, 0], call([0], [0, 1], offset=200)[0, 0])


@pytest.mark.parametrize("library", ["numpy", "torch"])
def test_1_planned_rope_refuses_positions_inside_out(library):
    """Plans of the signatures exist (first calls: positions in a buffer of their own, of
    the same strides); a later call whose float positions lie inside ``out`` (or inside
    ``x``, rotated in place) gets the cold call's error, not a rotation by positions being
    overwritten."""
    wrap = (lambda a: a) if library == "numpy" else torch.from_numpy

    def buffers():
        return wrap(RNG.standard_normal((4, 9))), wrap(RNG.standard_normal((4, 9)))

    for _ in range(2):
        data, apart = buffers()
        pe.rope(data[:, 1:], apart[:, 1], out=wrap(np.zeros((4, 9)))[:, 1:])
        pe.rope(data[:, 1:], apart[:, 1], out=data[:, 1:])
    data, _ = buffers()
    with pytest.raises(ValueError, match="out shares memory with positions"):
        pe.rope(wrap(RNG.standard_normal((4, 9)))[:, 1:], data[:, 1], out=data[:, 1:])
    with pytest.raises(ValueError, match="out shares memory with positions"):
        pe.rope(data[:, 1:], data[:, 1], out=data[:, 1:])


def test_5_the_relative_position_int64_min_is_exact():
    """``rel = -2**63`` is within int64, but its negation and its absolute value are not: the
    biases take them in float (ALiBi, KERPLE) or saturate them (T5's buckets)."""
    q, k = np.array([-(2**63)]), np.array([0])
    beyond = hf_t5_bucket(np.array([2**63 - 1]), num_buckets=32, max_distance=128)[0]  # key - query, saturated
    assert pe.t5_bias(T5_TABLE, 1, 1, query_positions=q, key_positions=k).item() == beyond
    assert pe.t5_bias(T5_TABLE, 1, 1, offset=-(2**63)).item() == beyond
    assert pe.alibi_bias(np.array([1.0]), 1, 1, query_positions=q, key_positions=k).item() == 2.0**63
    assert pe.alibi_bias(np.array([1.0]), 1, 1, offset=-(2**63), symmetric=True).item() == -(2.0**63)
    assert pe.kerple_bias(np.ones(1), np.ones(1), 1, 1, offset=-(2**63), kind="power").item() == -(2.0**63)


def _negated_view(values):
    """``values`` as torch holds ``z.conj().imag``: a view with the negative bit set, which
    NumPy cannot view (``Tensor.numpy`` raises)."""
    view = torch.complex(torch.zeros_like(values), -values).conj().imag
    assert view.is_neg() and torch.equal(view, values)
    return view


NEGATED_CALLS = {
    "rope x": lambda v: pe.rope(v["x"], offset=7),
    "apply_rope cos": lambda v: pe.apply_rope(v["x"], v["cos"], v["sin"]),
    "alibi_bias decode": lambda v: pe.alibi_bias(v["slopes"], 1, 6),
    "alibi_bias": lambda v: pe.alibi_bias(v["slopes"], 3, 6),
    "t5_bias decode": lambda v: pe.t5_bias(v["table"], 1, 6),
    "expand_bias": lambda v: pe.expand_bias(v["vec"], 3, 4),
}


@pytest.mark.parametrize("call", list(NEGATED_CALLS))
def test_a_negated_torch_view_gives_its_values_on_every_call(call):
    """A tensor with the negative bit goes to the reference on every call, planned ones
    included: the third alibi/t5 decode step and the first ``expand_bias`` raised
    "Can't call numpy() on Tensor that has negative bit set"."""
    values = {
        "x": torch.randn(2, 5, 8), "cos": torch.rand(5, 8), "sin": torch.rand(5, 8), "slopes": torch.tensor([0.5, 0.25, 0.125]),
        "table": torch.randn(32, 3), "vec": torch.randn(3, 6),
    }  # fmt: skip
    fn = NEGATED_CALLS[call]
    want = fn(values)
    for _ in range(3):  # cold, then the signature seen, then planned
        negated = {name: _negated_view(v) for name, v in values.items()}
        assert torch.equal(fn(negated), want)


# ---------------------------------------------------------------- later hunts


@pytest.mark.parametrize(
    "call",
    [
        lambda q, k: pe.deberta_logits(q, k, np.ones((5, 0)), np.ones((5, 0)), max_distance=2),
        lambda q, k: pe.tupe_logits(q, k, np.ones((4, 2)), np.ones((2, 2)), np.ones((2, 2))),
        lambda q, k: pe.attention(q, k, k),
        lambda q, k: pe.linear_attention(q, k, k),
        lambda q, k: pe.cope_logits(q, k, np.ones((4, 0))),
    ],
    ids=["deberta_logits", "tupe_logits", "attention", "linear_attention", "cope_logits"],
)
def test_q_and_k_without_features_are_refused_where_d_divides_or_normalises(call):
    """Head dimension 0: a ValueError naming q and k (deberta_logits and linear_attention had
    returned NaN, attention and tupe_logits raised ZeroDivisionError)."""
    q = k = np.ones((1, 2, 0))
    with pytest.raises(ValueError, match="at least one feature on their last axis"):
        call(q, k)
    np.testing.assert_array_equal(pe.attention(q, k, np.ones((1, 2, 3)), scale=1.0), np.ones((1, 2, 3)))  # a scale given: uniform weights


def test_deberta_bucket_of_unsigned_64_bit_distances():
    """uint64 ``rel`` within int64 gets the int64 input's buckets in its own dtype (its
    dtype's maximum, 2**64 - 1, had overflowed the range check: OverflowError)."""
    rel = np.array([0, 1, 300, 2**40], dtype=np.uint64)
    want = pe.deberta_bucket(rel.astype(np.int64))
    for array in (rel, torch.from_numpy(rel.astype(np.int64)).to(torch.uint64)):
        got = pe.deberta_bucket(array)
        assert got.dtype == array.dtype and np.asarray(got.to(torch.int64) if isinstance(got, torch.Tensor) else got).tolist() == want.tolist()


@pytest.mark.parametrize("dtype", ["uint8", "uint16", "uint32", "uint64", "int16"])
def test_positions_from_cu_seqlens_of_every_torch_integer_dtype(dtype):
    """torch has no ``>=`` of uint16/32/64 (NotImplementedError): the boundaries are widened first."""
    cu = torch.tensor([0, 2, 5], dtype=getattr(torch, dtype))
    assert pe.positions_from_cu_seqlens(cu, 5).tolist() == [0, 1, 0, 1, 2]
    with pytest.raises(ValueError, match="non-decreasing"):
        pe.positions_from_cu_seqlens(torch.tensor([0, 3, 2, 5], dtype=getattr(torch, dtype)), 5)


def test_positions_from_cu_seqlens_of_strided_torch_boundaries_warn_nothing():
    """A strided ``cu_seqlens`` (a view of every other boundary) is searched contiguous: torch's
    ``searchsorted`` had warned of it (a UserWarning, an error under ``-W error``)."""
    cu = torch.tensor([0, 0, 2, 2, 5, 5])[::2]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert pe.positions_from_cu_seqlens(cu, 5).tolist() == [0, 1, 0, 1, 2]


def test_alibi_slopes_of_no_heads_are_refused_as_a_t5_table_of_no_heads_is():
    """Head counts are positive (API.md): empty slopes had given a [0, q, k] bias."""
    for call in (
        lambda s: pe.alibi_bias(s, 2, 2),
        lambda s: pe.relative_bias("alibi", s, 2, 2),
        lambda s: pe.alibi_bias(s, 1, 2, query_positions=np.array([1]), key_positions=np.arange(2)),
    ):
        with pytest.raises(ValueError, match="slopes must hold at least one head"):
            call(np.zeros(0))
    with pytest.raises(ValueError, match="at least one head column"):
        pe.t5_bias(np.zeros((32, 0)), 2, 2)


def test_positions_from_cu_seqlens_under_jax_jit_is_checked_traced_or_closed_over():
    """Boundaries passed to a jitted function are traced: checked by ``checkify`` (a plain
    ``jax.jit`` refuses to stage the check), never silently unchecked unless
    ``check_traced=False`` says so. Boundaries closed over by it are concrete arrays: read at
    trace time as the eager call reads them (3f2107d; they were taken as traced), a bad one
    the eager ``ValueError`` there (they had raised ConcretizationTypeError, valid or not)."""
    jax = pytest.importorskip("jax")
    from jax.experimental import checkify

    traced = jax.jit(lambda c: pe.positions_from_cu_seqlens(c, 5))
    for dtype in (jax.numpy.int8, jax.numpy.int32):
        bad, good = (jax.numpy.asarray(b, dtype=dtype) for b in ([0, 3, 2, 5], [0, 2, 5]))
        with pytest.raises(ValueError, match="checkify"):
            traced(good)
        err, _ = checkify.checkify(traced)(bad)
        with pytest.raises(Exception, match="non-decreasing|0 to total|cu_seqlens"):
            err.throw()
        err, positions = checkify.checkify(traced)(good)
        err.throw()
        assert positions.tolist() == [0, 1, 0, 1, 2]
        assert jax.jit(lambda c: pe.positions_from_cu_seqlens(c, 5, check_traced=False))(good).tolist() == [0, 1, 0, 1, 2]
        with pytest.raises(ValueError, match="^cu_seqlens must be non-decreasing from 0 to total = 5"):
            jax.jit(lambda: pe.positions_from_cu_seqlens(bad, 5))()
        assert jax.jit(lambda: pe.positions_from_cu_seqlens(good, 5))().tolist() == [0, 1, 0, 1, 2]
