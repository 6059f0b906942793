"""Per-row ``offset`` and ``seq_len`` in ``rope``: one value per batch row, each row
bit-identical to a single-row call with its value (dynamic NTK, LongRoPE)."""

from __future__ import annotations

import numpy as np
import pytest

import posenc as pe
from formulas import exact_rope

DYNAMIC = pe.scaling.DynamicNTK(2.0, 32)
LONGROPE = pe.scaling.LongRoPE([1.0] * 4, [2.0, 3.0, 4.0, 5.0], 32)


@pytest.mark.parametrize("scaling", [DYNAMIC, LONGROPE], ids=["dynamic", "longrope"])
@pytest.mark.parametrize("shape", ["[batch]", "[batch, 1, 1]"])
def test_per_row_seq_len_equals_separate_single_row_calls(rng, scaling, shape):
    x = rng.standard_normal((3, 2, 5, 8)).astype(np.float32)  # [batch, heads, seq, dim]
    lengths = np.array([40, 35, 20])
    seq_len = lengths if shape == "[batch]" else lengths[:, None, None]
    offsets = np.array([35, 30, 15])
    got = pe.rope(x, scaling=scaling, seq_len=seq_len, offset=offsets)
    for row in range(3):
        alone = pe.rope(x[row : row + 1], scaling=scaling, seq_len=int(lengths[row]), offset=int(offsets[row]))
        np.testing.assert_array_equal(got[row : row + 1], alone)
    # The rows really differ from one length for all (the frequencies of each row's own length).
    assert not np.array_equal(got, pe.rope(x, scaling=scaling, seq_len=40, offset=offsets))


@pytest.mark.parametrize("scaling", [DYNAMIC, LONGROPE], ids=["dynamic", "longrope"])
def test_per_row_offset_without_seq_len_gives_each_row_its_own_length(backend, rng, scaling):
    """A per-row ``offset`` and no ``seq_len``: each row at the length a call on that row
    alone reads (``offset[b] + seq``), as ``rope``'s docs say of per-row offsets; every row
    had taken the batch's longest (row 0 off by 0.28 with DynamicNTK, 2.0 with LongRoPE).
    array-api-strict included (its row indexing had raised)."""
    x = rng.standard_normal((3, 2, 5, 8))
    offsets = np.array([0, 30, 12])
    got = backend.call(lambda a, o: pe.rope(a, offset=o, scaling=scaling), backend.asarray(x, dtype="float32"), backend.asarray(offsets))
    for run in backend.each_run(got):
        for row in range(3):
            alone = pe.rope(x[row : row + 1].astype(np.float32), offset=int(offsets[row]), scaling=scaling)
            np.testing.assert_allclose(backend.to_numpy(run)[row : row + 1], alone, rtol=0, atol=0 if backend.name in ("numpy", "torch") else 2e-6)
    longest = pe.rope(x[:1].astype(np.float32), offset=0, scaling=scaling, seq_len=35)
    assert np.abs(pe.rope(x.astype(np.float32), offset=offsets, scaling=scaling)[:1] - longest).max() > 1e-3


def test_a_per_row_offset_whose_row_stays_negative_is_that_row_alone(backend, rng):
    """A row whose positions are all negative (offset -9, five tokens) is the call on that row
    alone (the original frequencies); its length, -4, had been refused as a row's seq_len."""
    x = rng.standard_normal((2, 2, 5, 8)).astype(np.float32)
    offsets = np.array([-9, 30])
    got = backend.call(lambda a, o: pe.rope(a, offset=o, scaling=DYNAMIC), backend.asarray(x, dtype="float32"), backend.asarray(offsets))
    for run in backend.each_run(got):
        for row in range(2):
            alone = pe.rope(x[row : row + 1], offset=int(offsets[row]), scaling=DYNAMIC)
            np.testing.assert_allclose(backend.to_numpy(run)[row : row + 1], alone, rtol=0, atol=0 if backend.name in ("numpy", "torch") else 2e-6)


@pytest.mark.parametrize("scaling", [DYNAMIC, LONGROPE], ids=["dynamic", "longrope"])
@pytest.mark.parametrize("shared", [True, False], ids=["positions [seq]", "positions [batch, 1, seq]"])
def test_per_row_offset_with_positions_gives_each_row_its_own_length(backend, rng, scaling, shared):
    """A per-row ``offset`` beside given ``positions``: each row at the length of its own
    shifted positions, bit-identical to the single-row call (API.md: per-row values), as
    without positions; the batch's largest had been every row's (row 0 off by 2.0 with
    LongRoPE). Under ``jax.jit`` and ``torch.compile`` too (the backends' runs)."""
    x = rng.standard_normal((3, 2, 4, 8))
    offsets = np.array([0, 40, 11])
    positions = np.arange(4) if shared else np.array([[0, 1, 2, 3], [5, 9, 2, 0], [1, 1, 1, 30]])[:, None, :]
    got = backend.call(
        lambda a, p, o: pe.rope(a, p, offset=o, scaling=scaling), backend.asarray(x, dtype="float32"), backend.asarray(positions), backend.asarray(offsets)
    )  # fmt: skip
    for run in backend.each_run(got):
        for row in range(3):
            own = positions if shared else positions[row : row + 1]
            alone = pe.rope(x[row : row + 1].astype(np.float32), own, offset=int(offsets[row]), scaling=scaling)
            np.testing.assert_allclose(backend.to_numpy(run)[row : row + 1], alone, rtol=0, atol=0 if backend.name in ("numpy", "torch") else 2e-6)
    batch_longest = pe.rope(x[:1].astype(np.float32), positions if shared else positions[:1], offset=0, scaling=scaling, seq_len=int((positions + offsets[:, None, None]).max()) + 1)
    assert np.abs(pe.rope(x.astype(np.float32), positions, offset=offsets, scaling=scaling)[:1] - batch_longest).max() > 1e-3


def test_per_row_offset_is_a_cache_length_per_row(backend, rng):
    x_np = rng.standard_normal((2, 3, 4, 8))
    offsets = np.array([10, 3])
    out = backend.call(lambda a, o: pe.rope(a, offset=o), backend.asarray(x_np, dtype="float32"), backend.asarray(offsets))
    want = np.stack([exact_rope(x_np[i], o + np.arange(4)) for i, o in enumerate(offsets)])
    np.testing.assert_allclose(backend.to_numpy(next(iter(backend.each_run(out)))), want, atol=2e-6)


def test_per_row_with_positions_and_seq_axis_and_out(rng):
    x = rng.standard_normal((2, 6, 3, 8))  # [batch, seq, heads, dim]
    position_ids = np.array([[0, 1, 2, 3, 4, 5], [0, 0, 0, 1, 2, 3]])
    lengths = np.array([70, 33])
    out = np.empty_like(x)
    got = pe.rope(x, position_ids, scaling=DYNAMIC, seq_len=lengths, offset=np.array([64, 29]), seq_axis="bshd", out=out)
    assert got is out
    for row, (length, offset) in enumerate(zip(lengths, (64, 29))):
        alone = pe.rope(x[row : row + 1], position_ids[row : row + 1] + offset, scaling=DYNAMIC, seq_len=int(length), seq_axis="bshd")
        np.testing.assert_array_equal(out[row : row + 1], alone)


def test_per_row_seq_len_under_jax_jit_equals_single_row_jitted_calls(rng):
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    x = jnp.asarray(rng.standard_normal((3, 2, 5, 8)).astype(np.float32))
    lengths = np.array([40, 35, 20])
    call = jax.jit(lambda a, s: pe.rope(a, scaling=DYNAMIC, seq_len=s))
    got = np.asarray(call(x, jnp.asarray(lengths)))
    for row in range(3):
        alone = np.asarray(call(x[row : row + 1], jnp.asarray(lengths[row])))
        np.testing.assert_array_equal(got[row : row + 1], alone)
    if jax.default_backend() == "cpu":  # the host call reads the lengths: the eager NumPy call's bits
        np.testing.assert_array_equal(got, pe.rope(np.asarray(x), scaling=DYNAMIC, seq_len=lengths))


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"seq_len": np.array([40, 35])}, ValueError, r"seq_len of shape \(2,\) must hold one value per batch row"),
        ({"offset": np.array([[1, 2, 3, 4, 5]])}, ValueError, "offset of shape .* one value per batch row"),
        ({"seq_len": np.array([40.0, 35.0, 33.0])}, TypeError, "seq_len must be an integer or an integer array"),
        ({"seq_len": np.array([40, -1, 33])}, ValueError, "seq_len must be >= 0 in every row"),
    ],
)
def test_per_row_arrays_that_do_not_fit_the_batch_are_refused(kwargs, error, message):
    with pytest.raises(error, match=message):
        pe.rope(np.ones((3, 2, 5, 8)), scaling=DYNAMIC, **kwargs)


def test_a_per_row_array_of_another_device_library_is_a_type_error():
    torch = pytest.importorskip("torch")
    jnp = pytest.importorskip("jax").numpy
    with pytest.raises(TypeError, match="different kinds in one call: jaxlib.*, torch.Tensor"):
        pe.rope(jnp.ones((3, 2, 5, 8)), offset=torch.tensor([1, 2, 3]))


@pytest.mark.parametrize("scaling", [DYNAMIC, LONGROPE, None], ids=["dynamic", "longrope", "none"])
def test_per_row_frequencies_are_the_single_row_tables(scaling):
    lengths = np.array([[40], [20], [33]])
    inv_freq, scale = pe.rope_frequencies(8, scaling=scaling, seq_len=lengths)
    assert inv_freq.shape == (3, 1, 4)
    for row, length in enumerate(lengths[:, 0]):
        alone, alone_scale = pe.rope_frequencies(8, scaling=scaling, seq_len=int(length))
        np.testing.assert_array_equal(inv_freq[row, 0], alone)
        assert scale == alone_scale
    if scaling is not None:  # past the original length 32 the rows differ
        assert not np.array_equal(inv_freq[0], inv_freq[1])


def test_per_row_frequencies_of_a_torch_array_in_its_namespace():
    torch = pytest.importorskip("torch")
    inv_freq, _ = pe.rope_frequencies(8, scaling=DYNAMIC, seq_len=torch.tensor([40, 20]), xp=torch, dtype=torch.float32)
    assert inv_freq.dtype == torch.float32 and tuple(inv_freq.shape) == (2, 4)
    want, _ = pe.rope_frequencies(8, scaling=DYNAMIC, seq_len=40, xp=torch, dtype=torch.float32)
    assert torch.equal(inv_freq[0], want)


@pytest.mark.parametrize("scaling", [DYNAMIC, LONGROPE], ids=["dynamic", "longrope"])
def test_per_row_frequencies_under_jax_jit_equal_single_row_jitted_calls(scaling):
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    table = jax.jit(lambda s: pe.rope_frequencies(8, scaling=scaling, seq_len=s)[0])
    lengths = np.array([40, 35, 20])
    got = np.asarray(table(jnp.asarray(lengths)))
    assert got.shape == (3, 4)
    for row, length in enumerate(lengths):
        np.testing.assert_array_equal(got[row], np.asarray(table(jnp.asarray(length))))
    # and the jitted table is the eager one
    np.testing.assert_allclose(got, pe.rope_frequencies(8, scaling=scaling, seq_len=lengths)[0], rtol=1e-6)


@pytest.mark.parametrize(
    ("seq_len", "error", "message"),
    [
        (np.array([40.0, 35.0]), TypeError, "seq_len must be an integer or an integer array"),
        (np.array([40, -1]), ValueError, "seq_len must be >= 0 in every row"),
    ],
)
def test_bad_per_row_frequencies_are_refused(seq_len, error, message):
    with pytest.raises(error, match=message):
        pe.rope_frequencies(8, scaling=DYNAMIC, seq_len=seq_len)


def test_rotary_embedding_module_takes_per_row_offset_and_seq_len():
    torch = pytest.importorskip("torch")
    from posenc.torch import RotaryEmbedding

    module = RotaryEmbedding(8, scaling=DYNAMIC)
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 3, 2, 1, 8, generator=gen)  # one decode step of 3 requests
    offsets, lengths = torch.tensor([40, 20, 33]), torch.tensor([41, 21, 34])
    for seq_len in (None, lengths):  # by default each row's offset + 1
        rq, rk = module(q, k, offset=offsets, seq_len=seq_len)
        for row in range(3):
            aq, ak = module(q[row : row + 1], k[row : row + 1], offset=int(offsets[row]), seq_len=int(lengths[row]))
            assert torch.equal(rq[row : row + 1], aq) and torch.equal(rk[row : row + 1], ak)
    with pytest.raises(ValueError, match="seq_len of shape \\(2,\\) must hold one value per batch row"):
        module(q, k, offset=offsets, seq_len=lengths[:2])


def test_rotary_embedding_module_length_of_a_narrow_integer_offset():
    """RotaryEmbedding.forward's length ``offset + max(q_len, k_len)`` under a length-dependent
    scaling is summed in int64 at least, as rope sums positions and offset: in a uint8 offset's
    own dtype 250 + 10 wrapped to 4 (the original frequencies, 3.5 off rope's rotation at
    offset 250), and an int8 120 + 10 to -126 (a ValueError for valid input)."""
    torch = pytest.importorskip("torch")
    from posenc.torch import RotaryEmbedding

    module = RotaryEmbedding(8, scaling=DYNAMIC)
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 1, 2, 10, 8, generator=gen, dtype=torch.float64)
    offsets = (
        np.uint8(250), np.int8(120), np.int16(32760), torch.tensor(250, dtype=torch.uint8), torch.tensor(120, dtype=torch.int8),
        torch.tensor([250], dtype=torch.uint8), torch.tensor(2**31 - 20, dtype=torch.int32), np.array([250], dtype=np.uint8),
    )  # fmt: skip
    for offset in offsets:
        value = int(offset.item())
        rq, rk = module(q, k, offset=offset)
        assert torch.equal(rq, pe.rope(q, offset=value, scaling=DYNAMIC)), offset
        assert torch.equal(rk, pe.rope(k, offset=value, scaling=DYNAMIC)), offset


@pytest.mark.parametrize("scaling", [DYNAMIC, LONGROPE], ids=["dynamic", "longrope"])
def test_rotary_embedding_module_takes_an_offset_that_leaves_every_position_negative(scaling):
    """RotaryEmbedding.forward reads a length-dependent scaling's length as rope does: 0
    where every position is negative (offset -9, five tokens: the original frequencies).
    Its length offset + max(q_len, k_len) was -4, refused as a seq_len (ValueError), where
    rope itself rotates (a context shift moves cached tokens below 0)."""
    torch = pytest.importorskip("torch")
    from posenc.torch import RotaryEmbedding

    module = RotaryEmbedding(8, scaling=scaling)
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 2, 2, 5, 8, generator=gen, dtype=torch.float64)
    for offset in (-9, torch.tensor(-9), torch.tensor([-9, 40]), np.array([-9, 40])):
        rq, rk = module(q, k, offset=offset)
        assert torch.equal(rq, pe.rope(q, offset=offset, scaling=scaling)), offset
        assert torch.equal(rk, pe.rope(k, offset=offset, scaling=scaling)), offset


def test_per_row_tables_are_the_single_row_tables_and_rotate_as_rope_does(rng):
    lengths = np.array([40, 20, 33])
    inv_freq, _ = pe.rope_frequencies(8, scaling=DYNAMIC, seq_len=lengths)
    position_ids = np.array([[35, 36, 37, 38, 39], [15, 16, 17, 18, 19], [28, 29, 30, 31, 32]])
    cos, sin = pe.rope_cos_sin(position_ids, inv_freq, dtype=np.float64)
    assert cos.shape == (3, 5, 8)
    for row in range(3):
        alone = pe.rope_cos_sin(position_ids[row], inv_freq[row], dtype=np.float64)
        np.testing.assert_array_equal(cos[row], alone[0])
        np.testing.assert_array_equal(sin[row], alone[1])
    shared, _ = pe.rope_cos_sin(np.arange(5), inv_freq)  # [seq] positions: every row's own frequencies
    np.testing.assert_array_equal(shared[1], pe.rope_cos_sin(np.arange(5), inv_freq[1])[0])
    x = rng.standard_normal((3, 2, 5, 8))  # [batch, heads, seq, dim]: the tables take a heads axis
    rotated = pe.apply_rope(x, cos[:, None], sin[:, None])
    want = pe.rope(x, position_ids, scaling=DYNAMIC, seq_len=lengths)
    np.testing.assert_allclose(rotated, want, atol=1e-12)


def test_per_row_tables_of_torch_positions():
    torch = pytest.importorskip("torch")
    inv_freq, _ = pe.rope_frequencies(8, scaling=LONGROPE, seq_len=torch.tensor([40, 20]), xp=torch)
    cos, sin = pe.rope_cos_sin(torch.arange(6).reshape(2, 3), inv_freq)
    assert tuple(cos.shape) == (2, 3, 8) and cos.dtype == torch.float32
    assert torch.equal(sin[1], pe.rope_cos_sin(torch.arange(3, 6), inv_freq[1])[1])


def test_per_row_tables_under_jax_jit_equal_single_row_jitted_calls():
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    tables = jax.jit(lambda p, s: pe.rope_cos_sin(p, pe.rope_frequencies(8, scaling=DYNAMIC, seq_len=s)[0])[0])
    positions, lengths = np.arange(10).reshape(2, 5) + 30, np.array([40, 36])
    got = np.asarray(tables(jnp.asarray(positions), jnp.asarray(lengths)))
    for row in range(2):
        alone = np.asarray(tables(jnp.asarray(positions[row]), jnp.asarray(lengths[row])))
        np.testing.assert_array_equal(got[row], alone)


def test_per_row_tables_with_positions_of_another_batch_are_refused():
    inv_freq, _ = pe.rope_frequencies(8, scaling=DYNAMIC, seq_len=np.array([40, 20, 33]))
    with pytest.raises(ValueError, match="positions of shape \\(2, 5\\) do not fit inv_freq's 3 rows"):
        pe.rope_cos_sin(np.zeros((2, 5), int), inv_freq)
