"""``rope``'s sequence axis is said, not guessed: named layouts, positions aligned with the
sequence axis and the leading batch axes, axis -2 by default whatever the other lengths.

The reference rotates by transposing to ``[batch, heads, seq, dim]``, applying the float64
formula with positions ``[batch, seq]`` there, and transposing back.
"""

from __future__ import annotations

import numpy as np
import pytest

import posenc as pe
from arrays import assert_close
from formulas import inv_freq as theta
from formulas import rope_formula
from formulas import rope_tables as tables


def reference_bhsd(x_bhsd, pos_bs):
    """float64 half-layout RoPE of ``[batch, heads, seq, d]`` at positions ``[batch, seq]``."""
    return rope_formula(x_bhsd, *tables(pos_bs[:, None, :], theta(x_bhsd.shape[-1]), "half"), "half")


# layout, x shape, the permutation taking x to bhsd (with b/h axes of size 1 added by reshape)
LAYOUTS = {
    "bhsd": ((2, 3, 5, 8), lambda a: a, lambda a: a),
    "bshd": ((2, 5, 3, 8), lambda a: a.transpose(0, 2, 1, 3), lambda a: a.transpose(0, 2, 1, 3)),
    "hsd": ((3, 5, 8), lambda a: a[None], lambda a: a[0]),
    "shd": ((5, 3, 8), lambda a: a.transpose(1, 0, 2)[None], lambda a: a[0].transpose(1, 0, 2)),
    "bsd": ((2, 5, 8), lambda a: a[:, None], lambda a: a[:, 0]),
    "sd": ((5, 8), lambda a: a[None, None], lambda a: a[0, 0]),
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_named_layouts_rotate_along_their_sequence_axis(backend, rng, layout):
    shape, to_bhsd, from_bhsd = LAYOUTS[layout]
    x_np = rng.standard_normal(shape)
    batch = shape[0] if layout.startswith("b") else 1
    pos_bs = 3 + rng.integers(0, 50, size=(batch, 5))
    want = from_bhsd(reference_bhsd(to_bhsd(x_np), pos_bs))
    x = backend.asarray(x_np, dtype="float32")
    default = backend.call(lambda a: pe.rope(a, seq_axis=layout, offset=3), x)
    want_default = from_bhsd(reference_bhsd(to_bhsd(x_np), np.broadcast_to(3 + np.arange(5), (batch, 5))))
    assert_close(default, want_default, backend=backend, dtype="float32")
    pos = pos_bs if layout.startswith("b") else pos_bs[0]  # [batch, seq] or [seq]
    out = backend.call(lambda a, p: pe.rope(a, p, seq_axis=layout), x, backend.asarray(pos))
    assert_close(out, want, backend=backend, dtype="float32")


def test_hf_position_ids_batch_seq_fit_bhsd_as_they_are(backend, rng):
    x_np = rng.standard_normal((2, 3, 5, 8))
    position_ids = np.array([[0, 1, 2, 3, 4], [0, 0, 0, 1, 2]])  # a right- and a left-padded row
    out = backend.call(pe.rope, backend.asarray(x_np, dtype="float32"), backend.asarray(position_ids))
    assert_close(out, reference_bhsd(x_np, position_ids), backend=backend, dtype="float32")
    shaped = backend.call(pe.rope, backend.asarray(x_np, dtype="float32"), backend.asarray(position_ids[:, None]))
    assert_close(shaped, reference_bhsd(x_np, position_ids), backend=backend, dtype="float32")


def test_packed_tokens_thd_with_positions_of_tokens(backend, rng):
    # tokens == heads: the placement a guess would get wrong.
    x_np = rng.standard_normal((6, 6, 8))
    cu_seqlens = np.array([0, 2, 6])
    pos = np.array([0, 1, 0, 1, 2, 3])
    want = rope_formula(x_np, *tables(pos[:, None], theta(8), "half"), "half")
    out = backend.call(
        lambda a, c: pe.rope(a, pe.positions_from_cu_seqlens(c, 6, check_traced=False), seq_axis="thd"),
        backend.asarray(x_np, dtype="float32"),
        backend.asarray(cu_seqlens),
    )
    assert_close(out, want, backend=backend, dtype="float32")
    integer = pe.rope(x_np, pos, seq_axis=0)
    np.testing.assert_allclose(integer, want, atol=1e-12)


@pytest.mark.parametrize(
    ("shape", "pos_shape"),
    [
        ((1, 4, 4, 8), (1, 4)),  # Hugging Face's [batch, seq] ids on [batch, heads, seq, dim], seq == heads
        ((4, 4, 8), (4,)),  # [heads, seq, dim], seq == heads
        ((2, 4, 4, 8), (4,)),
    ],
)
def test_positions_run_along_axis_minus_2_whatever_the_other_lengths(shape, pos_shape):
    """API.md: the sequence is axis -2 unless seq_axis says otherwise, and HF's [batch, seq] ids
    work on [batch, heads, seq, dim] as they are. A sequence as long as the heads axis was
    refused (32 tokens beside 32 heads failed where 31 and 33 worked)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape)
    pos = rng.integers(0, 100, size=pos_shape)
    want = pe.rope(x, pos, seq_axis=-2)
    np.testing.assert_array_equal(pe.rope(x, pos), want)
    placed = pos.reshape(*pos_shape[:-1], *([1] * (len(shape) - 1 - len(pos_shape))), pos_shape[-1])
    np.testing.assert_allclose(want, rope_formula(x, *tables(placed, theta(8), "half"), "half"), atol=1e-12)
    other = pe.rope(x, pos, seq_axis=len(shape) - 3)  # said explicitly, the other reading is taken
    assert not np.allclose(want, other)


def test_the_default_seq_axis_is_minus_2_as_written():
    """API.md writes ``rope(..., seq_axis=-2, ...)``: the signature says so, and passing it
    changes nothing, also for one token ``[d]`` at a 0-d position (no axis to name), which
    the default rotated and an explicit -2 refused."""
    import inspect

    assert inspect.signature(pe.rope).parameters["seq_axis"].default == -2
    x, position = np.random.default_rng(1).standard_normal(8), np.array(5)
    want = rope_formula(x, *tables(position, theta(8), "half"), "half")
    np.testing.assert_allclose(pe.rope(x, position), want, atol=1e-12)
    np.testing.assert_array_equal(pe.rope(x, position, seq_axis=-2), pe.rope(x, position))
    with pytest.raises(ValueError, match="seq_axis"):
        pe.rope(x, position, seq_axis=0)  # (an axis said is checked: x's only axis holds the features)


@pytest.mark.parametrize(
    ("shape", "pos", "kwargs", "message"),
    [
        ((2, 30, 32, 8), np.arange(30), {}, r"axis 1 has length 30: seq_axis=1\?.*position_ids\[:, None\]"),
        ((30, 32, 8), np.arange(30), {}, r"axis 0 has length 30: seq_axis=0\?"),
        ((2, 3, 5, 8), np.zeros((3, 5), dtype=int), {}, r"\[batch, seq\] for \[batch, heads, seq, dim\]"),
        ((5, 2, 3, 8), np.zeros((2, 5), dtype=int), {"seq_axis": "sbhd"}, "one axis per token axis"),
        ((2, 5, 3, 8), None, {"seq_axis": "bsd"}, "names 3 axes, but x has shape"),
        ((2, 5, 3, 8), None, {"seq_axis": "bxsd"}, "one letter per axis"),
        ((2, 5, 3, 8), None, {"seq_axis": "bhds"}, "one letter per axis"),
        ((6, 3, 8), None, {"seq_axis": "thd"}, "positions_from_cu_seqlens"),
        ((5, 8), np.zeros((2, 5), dtype=int), {}, "more axes than the token axes"),
    ],
)
def test_positions_that_do_not_fit_say_what_to_do(shape, pos, kwargs, message):
    with pytest.raises(ValueError, match=message):
        pe.rope(np.ones(shape), pos, **kwargs)


def test_one_token_decode_with_per_row_positions(rng):
    x = rng.standard_normal((3, 2, 1, 8))  # [batch, heads, 1, dim]
    cache = np.array([[7], [2], [0]])  # HF decode position_ids [batch, 1]
    want = reference_bhsd(x, cache)
    np.testing.assert_allclose(pe.rope(x, cache), want, atol=1e-12)
    np.testing.assert_allclose(pe.rope(x, cache[:, 0, None, None]), want, atol=1e-12)
