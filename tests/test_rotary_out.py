"""``out=`` of ``rope`` and ``apply_rope`` on a cached plan (a decode step's second call on):
the same numbers as allocating, written where asked, and the same refusals as the first call."""

from __future__ import annotations

import numpy as np
import pytest

import posenc as pe


def _libraries():
    yield "numpy", np.asarray
    torch = pytest.importorskip("torch")
    yield "torch", torch.from_numpy


def _calls(lib):
    inv_freq, _ = pe.rope_frequencies(16)
    arange = np.arange if lib == "numpy" else __import__("torch").arange
    cos, sin = pe.rope_cos_sin(arange(1) + 7, inv_freq)
    return {
        "rope": lambda x, **out: pe.rope(x, offset=7, **out),
        "apply_rope": lambda x, **out: pe.apply_rope(x, cos, sin, **out),
    }


@pytest.mark.parametrize("name", ["rope", "apply_rope"])
def test_out_on_a_cached_plan_is_the_allocating_result(rng, name):
    for lib, wrap in _libraries():
        call = _calls(lib)[name]
        data = rng.standard_normal((2, 4, 1, 16)).astype(np.float32)
        want = np.asarray(call(wrap(data.copy())))
        for _ in range(3):  # the first call builds each plan; the next ones use it
            buf = wrap(np.full_like(data, np.nan))
            assert call(wrap(data.copy()), out=buf) is buf
            np.testing.assert_array_equal(np.asarray(buf), want)
            x = wrap(data.copy())
            assert call(x, out=x) is x
            np.testing.assert_array_equal(np.asarray(x), want)
        function = pe.rope if name == "rope" else pe.apply_rope
        assert sum(1 for plan in function.plans.values() if plan) >= 2, "in place and a buffer: planned"


@pytest.mark.parametrize("name", ["rope", "apply_rope"])
def test_a_partial_overlap_is_refused_on_a_cached_plan_too(name):
    call = _calls("numpy")[name]
    memory = np.zeros(2 * 4 * 16 + 16, np.float32)
    x = memory[: 4 * 16 * 2].reshape(2, 4, 1, 16)
    separate = np.zeros_like(x)
    overlapping = memory[16:].reshape(2, 4, 1, 16)  # the same key as `separate`: contiguous, same shape
    for _ in range(3):
        call(x, out=separate)
    with pytest.raises(ValueError, match="out overlaps the memory of x without being x itself"):
        call(x, out=overlapping)


def test_an_out_over_the_tables_or_positions_is_refused_on_a_cached_plan_too():
    """torch tensors of two storages over one memory (``torch.from_numpy`` of two views of
    one NumPy array): a plan whose ``out`` lies over ``cos`` or the float positions it reads
    refuses it as the first call does. Its storage check compared data pointers only: the
    third call wrote over the tables as it read them (apply_rope 2.16 off, rope 1.97)."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    x = torch.from_numpy(rng.standard_normal((8, 4)))
    inv_freq, _ = pe.rope_frequencies(4)
    cos, sin = (t.numpy() for t in pe.rope_cos_sin(torch.arange(8) * 1000, inv_freq))
    calls = {
        "apply_rope": (lambda memory: memory[:32], cos, lambda tables, out: pe.apply_rope(x, tables, torch.from_numpy(sin), out=out)),
        "rope": (lambda memory: memory[8:16], np.arange(8.0) * 1000, lambda positions, out: pe.rope(x, positions, out=out)),
    }
    for name, (read, values, call) in calls.items():
        for _ in range(3):  # the first two calls build the plan
            separate = read(np.zeros(40))
            separate[...] = values.reshape(separate.shape)
            call(torch.from_numpy(separate).view(values.shape), torch.zeros(8, 4, dtype=torch.float64))
        memory = np.zeros(40)
        read(memory)[...] = values.reshape(-1)
        inputs, out = torch.from_numpy(read(memory)).view(values.shape), torch.from_numpy(memory[4:36]).view(8, 4)
        with pytest.raises(ValueError, match="out shares memory with (cos|positions)"):
            call(inputs, out)


def test_a_strided_out_buffer_is_written_by_the_full_path():
    x = np.random.default_rng(0).standard_normal((2, 4, 1, 16)).astype(np.float32)
    want = pe.rope(x, offset=7)
    for _ in range(3):
        wide = np.zeros((2, 4, 1, 32), np.float32)
        pe.rope(x, offset=7, out=wide[..., ::2])  # channels of stride 2: computed aside, copied in
        np.testing.assert_array_equal(wide[..., ::2], want)
        assert not wide[..., 1::2].any()


def test_the_other_byte_order_gives_the_native_bits():
    """A NumPy ``x`` or ``out`` in the other byte order (``>f8`` on x86), which ``out=``'s
    check accepts, gives the bits of the same values in native order: no kernel reads
    swapped bytes, and the reference they had fallen to rotated float64 one ulp apart
    (4.4e-16 here) from the kernel that ``out=None`` uses."""
    x = np.random.default_rng(0).standard_normal((2, 3, 8, 16))
    grid = np.stack(np.meshgrid(np.arange(2), np.arange(4), indexing="ij"), -1).reshape(8, 2)
    calls = {"rope": lambda x, **out: pe.rope(x, offset=1000, **out), "axial_rope": lambda x, **out: pe.axial_rope(x, grid, **out)}
    swapped = x.dtype.newbyteorder()
    for name, call in calls.items():
        want = call(x)
        for _ in range(3):  # planned calls too
            np.testing.assert_array_equal(call(x.astype(swapped)), want, err_msg=f"{name}: swapped x")
            out = np.zeros(x.shape, swapped)
            assert call(x, out=out) is out
            np.testing.assert_array_equal(out, want, err_msg=f"{name}: swapped out")
            in_place = x.astype(swapped)
            assert call(in_place, out=in_place) is in_place
            np.testing.assert_array_equal(in_place, want, err_msg=f"{name}: swapped x in place")
