"""``rerotate``: ``out=`` (a cache shifted in place), its sequence axis said as in ``rope``."""

from __future__ import annotations

import numpy as np
import pytest

import posenc as pe
from arrays import assert_close
from formulas import exact_rope, inv_freq, rope_formula, rope_tables


def _address(a):
    """Where ``a``'s data starts: torch, NumPy or CuPy."""
    if hasattr(a, "data_ptr"):
        return a.data_ptr()
    interface = getattr(a, "__cuda_array_interface__", None) or a.__array_interface__
    return interface["data"][0]


def test_out_cache_shifts_a_cache_in_place(backend, rng):
    if backend.name in ("jax", "dask", "array_api_strict"):
        pytest.skip("immutable or lazy arrays: out= is refused (test_bad_inputs.py)")
    k = rng.standard_normal((2, 3, 7, 16))
    inv_freq, _ = pe.rope_frequencies(16)
    cache = backend.asarray(exact_rope(k, np.arange(7)), dtype="float32")
    address = _address(cache)
    got = pe.rerotate(cache, -4, inv_freq, out=cache)  # evict 4 tokens: positions 0..6 -> -4..2
    assert got is cache
    assert _address(cache) == address
    assert_close(cache, exact_rope(k, np.arange(7) - 4), backend=backend, dtype="float32")


def test_out_equals_the_allocating_call_bit_for_bit(rng):
    k = rng.standard_normal((1, 4, 9, 8)).astype(np.float32)
    inv_freq, _ = pe.rope_frequencies(8)
    new_inv, _ = pe.rope_frequencies(8, base=500000.0)
    for delta, new in ((5, None), (np.arange(9), new_inv)):
        want = pe.rerotate(k, delta, inv_freq, new_inv_freq=new)
        buf = np.empty_like(k)
        assert pe.rerotate(k, delta, inv_freq, new_inv_freq=new, out=buf) is buf
        np.testing.assert_array_equal(buf, want)
        cache = k.copy()
        pe.rerotate(cache, delta, inv_freq, new_inv_freq=new, out=cache)
        np.testing.assert_array_equal(cache, want)


def test_out_refuses_a_partial_overlap_and_a_wrong_buffer():
    cache = np.zeros((2, 6, 8))
    inv_freq, _ = pe.rope_frequencies(8)
    with pytest.raises(ValueError, match="out overlaps the memory of x"):
        pe.rerotate(cache[:, :5], 1, inv_freq, out=cache[:, 1:])
    with pytest.raises(ValueError, match="out must have dtype"):
        pe.rerotate(cache, 1, inv_freq, out=np.zeros((2, 6, 8), np.float32))


def test_seq_axis_places_positions_as_rope_does(rng):
    k = rng.standard_normal((2, 6, 3, 8))  # [batch, seq, heads, dim]
    inv_freq, _ = pe.rope_frequencies(8)
    new_inv, _ = pe.rope_frequencies(8, base=100.0)
    cache = pe.rope(k, seq_axis="bshd")
    moved = pe.rerotate(cache, np.arange(6), inv_freq, new_inv_freq=new_inv, seq_axis="bshd")
    np.testing.assert_allclose(moved, pe.rope(k, seq_axis="bshd", base=100.0), atol=1e-12)
    with pytest.raises(ValueError, match="seq_axis"):
        pe.rerotate(cache, np.arange(6), inv_freq)  # axis -2 has 3 heads, not 6 tokens


DYNAMIC = pe.scaling.DynamicNTK(2.0, 16)
LONGROPE = pe.scaling.LongRoPE([1.0] * 4, [2.0, 3.0, 4.0, 5.0], 16)


def rotated(k, positions, scaling, n):
    """float64 RoPE of ``k`` with the frequencies of length ``n`` (transcribed: HF's dynamic NTK
    base ``b (s n / L - (s - 1))^(d / (d - 2))``, LongRoPE's long factors past ``L = 16``)."""
    d = k.shape[-1]
    if scaling is DYNAMIC:
        freqs = inv_freq(d, 10000.0 * (2.0 * max(n, 16) / 16 - 1.0) ** (d / (d - 2)))
    else:
        freqs = inv_freq(d) / np.array([2.0, 3.0, 4.0, 5.0] if n > 16 else [1.0] * 4)
    return rope_formula(k, *rope_tables(positions, freqs, "half"), "half")


@pytest.mark.parametrize("scaling", [DYNAMIC, LONGROPE], ids=["dynamic", "longrope"])
def test_scaling_moves_first_rotated_keys_to_a_length_in_one_step(rng, scaling):
    k = rng.standard_normal((2, 3, 40, 8))
    cache = pe.rope(k, scaling=scaling, seq_len=16)  # the keys as first rotated: the original length
    first, _ = pe.rope_frequencies(8, scaling=scaling)
    now, _ = pe.rope_frequencies(8, scaling=scaling, seq_len=40)
    moved = pe.rerotate(cache, np.arange(40), scaling=scaling, seq_len=40)
    np.testing.assert_array_equal(moved, pe.rerotate(cache, np.arange(40), first, new_inv_freq=now))
    np.testing.assert_allclose(moved, rotated(k, np.arange(40), scaling, 40), atol=1e-12)


def test_scaling_with_a_per_row_seq_len_equals_single_row_calls(rng):
    cache = pe.rope(rng.standard_normal((3, 2, 24, 8)).astype(np.float32))  # dynamic NTK below 16: plain RoPE
    lengths = np.array([24, 17, 40])
    got = pe.rerotate(cache, np.arange(24), scaling=DYNAMIC, seq_len=lengths)
    for row, length in enumerate(lengths):
        alone = pe.rerotate(cache[row : row + 1], np.arange(24), scaling=DYNAMIC, seq_len=int(length))
        np.testing.assert_array_equal(got[row : row + 1], alone)
    in_place = cache.copy()
    assert pe.rerotate(in_place, np.arange(24), scaling=DYNAMIC, seq_len=lengths, out=in_place) is in_place
    np.testing.assert_array_equal(in_place, got)


def test_a_chained_rerotation_of_memory_rerotate_wrote_warns(rng):
    cache = pe.rope(rng.standard_normal((1, 2, 20, 8)))
    f16, f17, f18 = (pe.rope_frequencies(8, scaling=DYNAMIC, seq_len=n)[0] for n in (16, 17, 18))
    pe.rerotate(cache, np.arange(20), f16, new_inv_freq=f17, out=cache)  # a one-time switch, in place: fine
    with pytest.warns(RuntimeWarning, match="already moved to other frequencies"):
        pe.rerotate(cache, np.arange(20), f17, new_inv_freq=f18, out=cache)
    moved = pe.rerotate(pe.rope(rng.standard_normal((1, 2, 20, 8))), np.arange(20), scaling=DYNAMIC, seq_len=17)
    with pytest.warns(RuntimeWarning, match="already moved"):  # a slice of it, with the scaling form too
        pe.rerotate(moved[:, :, :10], np.arange(10), scaling=DYNAMIC, seq_len=18)


def test_memory_moved_by_two_threads_at_once_is_noted_for_each(rng, monkeypatch):
    """Another thread's frequency-changing ``rerotate`` noting its memory while this one's
    note reads the list: the copy taken before it was written back over it, and the chain
    of that thread's keys went unwarned."""
    from posenc.rotary import _chain

    f16, f17, f18 = (pe.rope_frequencies(8, scaling=DYNAMIC, seq_len=n)[0] for n in (16, 17, 18))
    mine, theirs = (pe.rope(rng.standard_normal((1, 2, 20, 8))) for _ in range(2))

    class Raced(list):
        reads = 0

        def __iter__(self):  # the other thread's call once this one's note has read every entry
            yield from list(super().__iter__())
            Raced.reads += 1
            if Raced.reads == 2:  # (the first read: this call's own check for a chain)
                pe.rerotate(theirs, np.arange(20), f16, new_inv_freq=f17, out=theirs)

    monkeypatch.setattr(_chain, "_NOTED", Raced())
    pe.rerotate(mine, np.arange(20), f16, new_inv_freq=f17, out=mine)
    for moved in (mine, theirs):
        with pytest.warns(RuntimeWarning, match="already moved to other frequencies"):
            pe.rerotate(moved, np.arange(20), f17, new_inv_freq=f18)


def test_the_one_step_recipe_into_a_buffer_does_not_warn(rng):
    import warnings

    raw = rng.standard_normal((1, 2, 40, 8)).astype(np.float32)
    cache = pe.rope(raw)  # every key as first rotated
    work = np.empty_like(cache)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for n in range(17, 41):
            keys = pe.rerotate(cache[:, :, :n], np.arange(n), scaling=DYNAMIC, seq_len=n, out=work[:, :, :n])
        pe.rerotate(keys, -1, pe.rope_frequencies(8)[0])  # a plain shift never warns
    np.testing.assert_allclose(keys, rotated(raw, np.arange(40), DYNAMIC, 40), atol=3e-6)


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "message"),
    [
        ((pe.rope_frequencies(8)[0],), {"scaling": DYNAMIC, "seq_len": 20}, ValueError, "either inv_freq .* or scaling="),
        ((), {}, TypeError, "rerotate needs inv_freq"),
        ((), {"scaling": DYNAMIC}, TypeError, "needs seq_len"),
        ((pe.rope_frequencies(8)[0],), {"seq_len": 20}, ValueError, "seq_len and rotary_dim are read with scaling= only"),
        ((), {"scaling": DYNAMIC, "seq_len": np.array([20, 30])}, ValueError, "seq_len of shape \\(2,\\) must hold one value per batch row"),
        ((), {"scaling": DYNAMIC, "seq_len": np.array([20.0, 30.0, 40.0])}, TypeError, "seq_len must be an integer or an integer array"),
        ((), {"scaling": DYNAMIC, "seq_len": np.array([20, -3, 40])}, ValueError, "seq_len must be >= 0 in every row"),
        ((), {"scaling": DYNAMIC, "seq_len": 20, "rotary_dim": 10}, ValueError, "rotary_dim must be <= x.shape"),
    ],
)
def test_bad_rerotate_arguments_are_refused(args, kwargs, error, message):
    with pytest.raises(error, match=message):
        pe.rerotate(np.zeros((3, 2, 5, 8)), np.arange(5), *args, **kwargs)
