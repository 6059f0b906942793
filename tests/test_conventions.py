"""One convention across the relative family (issue 22).

Query alignment: with ``offset`` left out, the queries are the last ``q_len`` positions of
the keys, so a one-query call (a decode step) and a chunk of queries (a chunked prefill)
equal the last rows of the full call, exactly. Inputs are small integers (and one-hot
queries where a table is not), so every sum is exact and any difference is a misalignment,
not rounding.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys

import numpy as np
import pytest

import posenc as pe
from arrays import assert_close

H, N, D = 2, 7, 4
RNG = np.random.default_rng(22)


def _ints(*shape):
    return RNG.integers(-3, 4, shape).astype(np.float64)


def _one_hot(*shape):
    return np.eye(shape[-1])[RNG.integers(0, shape[-1], shape[:-1])]


Q, K, V = _ints(H, N, D), _ints(H, N, D), _ints(H, N, D)
ONE_HOT = _one_hot(H, N, D)
WEIGHTS = _ints(H, N, N)
POS = pe.positions_from_cu_seqlens(np.array([0, 3, N]), N)  # two packed documents


# Each case: f(m) -> the result for the last m queries of N, offset left out; axis -2 is the query axis.
CASES = {
    "relative_positions": lambda m: pe.relative_positions(m, N),
    "relative_bias_vector t5 (expanded)": lambda m: pe.expand_bias(pe.relative_bias_vector("t5", _ints(32, H), m, N), m, N),
    "relative_bias t5": lambda m: pe.relative_bias("t5", np.arange(64.0).reshape(32, H), m, N),
    "relative_bias alibi": lambda m: pe.relative_bias("alibi", np.array([1.0, 0.5]), m, N),
    "relative_bias shaw": lambda m: pe.relative_bias("shaw", np.arange(10.0).reshape(5, H), m, N, max_distance=2),
    "relative_bias deberta": lambda m: pe.relative_bias("deberta", np.arange(8.0).reshape(4, H), m, N, max_distance=2),
    "t5_bias": lambda m: pe.t5_bias(np.arange(64.0).reshape(32, H), m, N),
    "t5_bias decoder": lambda m: pe.t5_bias(np.arange(32.0).reshape(16, H), m, N, bidirectional=False, max_distance=20),
    "alibi_bias": lambda m: pe.alibi_bias(pe.alibi_slopes(H, dtype=np.float64), m, N),
    "alibi_bias symmetric": lambda m: pe.alibi_bias(pe.alibi_slopes(H, dtype=np.float64), m, N, symmetric=True),
    "t5_bias per-token keys": lambda m: pe.t5_bias(np.arange(64.0).reshape(32, H), m, N, key_positions=POS),
    "shaw_logits": lambda m: pe.shaw_logits(Q[:, N - m :], K, _ints(5, D), max_distance=2),
    "shaw_output": lambda m: pe.shaw_output(WEIGHTS[:, N - m :], V, _ints(5, D), max_distance=2),
    "deberta_logits": lambda m: pe.deberta_logits(Q[:, N - m :], K, _ints(H, 6, D), _ints(H, 6, D), max_distance=3),
    "deberta_logits bucketed": lambda m: pe.deberta_logits(
        Q[:, N - m :], K, _ints(H, 8, D), _ints(H, 8, D), max_distance=4, bucket_size=4, max_position=12
    ),
    "tener_logits": lambda m: pe.tener_logits(ONE_HOT[:, N - m :], K, _ints(H, 1, D), np.zeros((H, 1, D))),
    "xl_logits": lambda m: pe.xl_logits(Q[:, N - m :], K, _ints(H, N + N, D), _ints(H, 1, D), _ints(H, 1, D)),
    "tupe_logits": lambda m: pe.tupe_logits(Q[:, N - m :], K, _ints(N, 3), _ints(H, 3, D), _ints(H, 3, D)),
    "tupe_logits cls": lambda m: pe.tupe_logits(Q[:, N - m :], K, _ints(N, 3), _ints(H, 3, D), _ints(H, 3, D), cls=(1.0, -1.0)),
}


def _fixed(case):
    """The case with its random inputs drawn once, so both calls see the same arrays."""
    state = RNG.bit_generator.state

    def call(m):
        RNG.bit_generator.state = state
        return case(m)

    return call


@pytest.mark.parametrize("chunk", [1, 3])
@pytest.mark.parametrize("name", sorted(CASES))
def test_last_queries_equal_the_last_rows_of_the_full_call(name, chunk):
    call = _fixed(CASES[name])
    full, part = np.asarray(call(N)), np.asarray(call(chunk))
    assert part.shape[-2] == chunk
    np.testing.assert_array_equal(part, full[..., N - chunk :, :])


@pytest.mark.parametrize("chunk", [1, 3])
def test_attention_with_a_bias_decodes_as_it_prefills(chunk):
    """The causal mask and the bias share the alignment: no offset anywhere. (The softmax's
    products are not exact: within rounding; a misaligned row would be off by far more.)"""
    table = RNG.standard_normal((32, H))

    def call(m):
        return pe.attention(Q[:, N - m :], K, V, bias=pe.t5_bias(table, m, N, bidirectional=False, max_distance=20), causal=True)

    np.testing.assert_allclose(call(chunk), call(N)[:, N - chunk :], rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("kind, params, options", [
    ("t5", np.arange(64.0).reshape(32, H), {}),
    ("alibi", np.array([1.0, 0.5]), {}),
    ("shaw", np.arange(10.0).reshape(5, H), {"max_distance": 2}),
    ("deberta", np.arange(8.0).reshape(4, H), {"max_distance": 2}),
])  # fmt: skip
def test_score_mod_one_query_is_the_last_row(kind, params, options):
    torch = pytest.importorskip("torch")
    from posenc.torch import score_mod

    def grid(q_len):
        mod = score_mod(kind, torch.from_numpy(params), q_len, N, **options)
        zero = torch.tensor(0.0, dtype=torch.float64)
        return np.array(
            [[[float(mod(zero, 0, h, torch.tensor(i), torch.tensor(j))) for j in range(N)] for i in range(q_len)] for h in range(H)]
        )

    np.testing.assert_array_equal(grid(1), grid(N)[:, -1:])
    np.testing.assert_array_equal(grid(N), pe.relative_bias(kind, params, N, N, **options))


def test_per_token_decode_step_is_the_last_row():
    table = np.arange(64.0).reshape(32, H)
    full = pe.t5_bias(table, N, N, query_positions=POS, key_positions=POS)
    step = pe.t5_bias(table, 1, N, query_positions=POS[-1:], key_positions=POS)
    np.testing.assert_array_equal(step, full[..., -1:, :])


def _tupe_formula(q, k, p, uq, uk, offset, cls=None):
    """``(q_i . k_j + (p[offset + i] U^Q) . (p[j] U^K)) / sqrt(2d)``, the [CLS] row/column
    (position 0) replaced by ``cls`` when given, written out per pair."""
    out = np.zeros(q.shape[:-1] + (k.shape[-2],))
    for i in range(q.shape[-2]):
        for j in range(k.shape[-2]):
            position = np.sum((p[offset + i] @ uq) * (p[j] @ uk), axis=-1)
            if cls is not None and offset + i == 0:
                position = np.full_like(position, cls[0] * math.sqrt(2 * q.shape[-1]))
            elif cls is not None and j == 0:
                position = np.full_like(position, cls[1] * math.sqrt(2 * q.shape[-1]))
            out[..., i, j] = (np.sum(q[..., i, :] * k[..., j, :], axis=-1) + position) / math.sqrt(2 * q.shape[-1])
    return out


@pytest.mark.parametrize("offset", [None, 0, 3, np.asarray(3)])
@pytest.mark.parametrize("cls", [None, (1.0, -1.0)])
def test_tupe_logits_offset_is_the_first_query_position(backend, offset, cls):
    q, k = RNG.standard_normal((H, 2, D)), RNG.standard_normal((H, 5, D))
    p, uq, uk = RNG.standard_normal((6, 3)), RNG.standard_normal((H, 3, D)), RNG.standard_normal((H, 3, D))
    arrays = [backend.asarray(x) for x in (q, k, p, uq, uk)]
    if isinstance(offset, np.ndarray):  # a 0-d array offset, traced under jax.jit, lazy in Dask
        got = backend.call(lambda *a: pe.tupe_logits(*a[:5], cls=cls, offset=a[5]), *arrays, backend.xp.asarray(int(offset)))
    else:
        got = backend.call(lambda *a: pe.tupe_logits(*a, cls=cls, **({} if offset is None else {"offset": offset})), *arrays)
    want = _tupe_formula(q, k, p, uq, uk, 5 - 2 if offset is None else int(offset), cls)
    assert_close(got, want, backend=backend, dtype=backend.asarray(q).dtype)


def test_tupe_logits_refuses_query_positions_past_its_table():
    q, p, u = np.zeros((H, 2, D)), np.zeros((6, 3)), np.zeros((H, 3, D))
    with pytest.raises(ValueError, match=r"p must have at least max\(offset \+ q_len, k_len\) = 7 rows"):
        pe.tupe_logits(q, q, p, u, u, offset=5)
    with pytest.raises(ValueError, match="offset must be"):
        pe.tupe_logits(q, q, p, u, u, offset=-1)


def test_explicit_offsets_still_count_from_the_given_position():
    table = np.arange(64.0).reshape(32, H)
    # offset=0: the queries are the first q_len keys (the alignment before the change).
    np.testing.assert_array_equal(pe.t5_bias(table, 2, N, offset=0), pe.t5_bias(table, N, N)[:, :2])
    np.testing.assert_array_equal(pe.t5_bias(table, 2, N, offset=np.asarray(3)), pe.t5_bias(table, N, N)[:, 3:5])


# --- pe.attention: mask=, and rows with no key to attend to -----------------------------------


def _naive_attention(q, k, v, allowed, bias=0.0):
    """Softmax over the allowed keys only, written out; a row with none gives zeros."""
    logits = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1]) + bias
    out = np.zeros(q.shape[:-1] + (v.shape[-1],))
    for index in np.ndindex(*logits.shape[:-1]):
        keep = np.broadcast_to(allowed, logits.shape)[index] & np.isfinite(logits[index])
        if keep.any():
            w = np.exp(logits[index][keep] - logits[index][keep].max())
            out[index] = (w / w.sum()) @ v[index[:-1]][keep]
    return out


def test_attention_mask_true_attends(backend):
    q, k, v = RNG.standard_normal((2, 3, 4)), RNG.standard_normal((2, 5, 4)), RNG.standard_normal((2, 5, 3))
    mask = RNG.random((2, 3, 5)) < 0.6
    mask[:, :, 0] = True
    got = backend.call(lambda *a: pe.attention(*a[:3], mask=a[3]), *(backend.asarray(x) for x in (q, k, v, mask)))
    assert_close(got, _naive_attention(q, k, v, mask), backend=backend, dtype=backend.asarray(q).dtype)


def test_attention_mask_and_causal_combine():
    q, k, v = RNG.standard_normal((2, 3, 4)), RNG.standard_normal((2, 5, 4)), RNG.standard_normal((2, 5, 3))
    padding = np.array([False, True, True, True, True])  # key 0 is padding
    causal = pe.relative_positions(3, 5) >= 0
    got = pe.attention(q, k, v, mask=padding, causal=True)
    np.testing.assert_allclose(got, _naive_attention(q, k, v, padding & causal), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("how", ["mask", "-inf bias"])
def test_attention_fully_masked_row_gives_zeros_not_nan(backend, how):
    """A left-padding query may attend to nothing: its output is zeros (documented), the
    other rows are unchanged."""
    q, k, v = RNG.standard_normal((2, 3, 4)), RNG.standard_normal((2, 5, 4)), RNG.standard_normal((2, 5, 3))
    allowed = np.ones((3, 5), dtype=bool)
    allowed[0] = False
    if how == "mask":
        call, extra = (lambda *a: pe.attention(*a[:3], mask=a[3])), allowed
    else:
        call, extra = (lambda *a: pe.attention(*a[:3], bias=a[3])), np.where(allowed, 0.0, -np.inf)
    result = backend.call(call, *(backend.asarray(x) for x in (q, k, v, extra)))
    got = backend.to_numpy(result)
    assert not np.isnan(got).any()
    np.testing.assert_array_equal(got[:, 0], 0.0)
    assert_close(result, _naive_attention(q, k, v, allowed), backend=backend, dtype=backend.asarray(q).dtype)


def test_attention_fully_masked_row_has_finite_gradients():
    torch = pytest.importorskip("torch")
    q, k, v = (torch.randn(2, 3, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))
    bias = torch.zeros(3, 3, dtype=torch.float64)
    bias[0] = -torch.inf
    pe.attention(q, k, v, bias=bias).sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


def test_attention_mask_bad_input():
    q = np.zeros((2, 3, 4))
    with pytest.raises(TypeError, match="mask must be a boolean array"):
        pe.attention(q, q, q, mask=np.ones((3, 3)))
    with pytest.raises(ValueError, match=r"mask of shape \(4,\) does not broadcast"):
        pe.attention(q, q, q, mask=np.ones(4, dtype=bool))


# --- the same mistake, the same error, in every family ----------------------------------------

MIXED = "arrays of different kinds in one call:"


def _filled(shape):
    return (np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape) * 0.37) % 1.0


def _mixed_library_calls(t, n, ti, ni):
    """Every public function that takes two or more arrays, one of them built by ``n``/``ni``
    among ``t``/``ti`` ones."""
    slopes, table = t(2), t(32, 2)
    return {
        "shaw_logits": lambda: pe.shaw_logits(t(2, 3, 4), t(2, 5, 4), n(9, 4), max_distance=4),
        "shaw_output": lambda: pe.shaw_output(t(2, 3, 5), t(2, 5, 4), n(9, 4), max_distance=4),
        "shaw_output per-token": lambda: pe.shaw_output(t(2, 1, 3), t(2, 3, 4), t(5, 4), max_distance=2, key_positions=ni(3)),
        "deberta_logits": lambda: pe.deberta_logits(t(2, 3, 4), t(2, 5, 4), n(2, 4, 4), t(2, 4, 4), max_distance=2),
        "xl_logits": lambda: pe.xl_logits(t(2, 3, 4), t(2, 5, 4), n(2, 8, 4), t(2, 1, 4), t(2, 1, 4)),
        "tener_logits": lambda: pe.tener_logits(t(2, 3, 4), t(2, 5, 4), n(2, 1, 4), t(2, 1, 4)),
        "tupe_logits": lambda: pe.tupe_logits(t(2, 3, 4), t(2, 3, 4), n(3, 4), t(2, 4, 4), t(2, 4, 4)),
        "segment_logits": lambda: pe.segment_logits(t(2, 3, 4), ni(3), ti(3), t(2, 1, 4), t(2, 1, 4), t(2, 1, 4)),
        "t5_bias per-token": lambda: pe.t5_bias(table, 1, 3, query_positions=ni(1), key_positions=ti(3)),
        "alibi_bias per-token": lambda: pe.alibi_bias(slopes, 1, 3, key_positions=ni(3)),
        "relative_bias per-token": lambda: pe.relative_bias("shaw", t(5, 2), 1, 3, max_distance=2, key_positions=ni(3)),
        "shaw_logits per-token": lambda: pe.shaw_logits(t(2, 1, 4), t(2, 3, 4), t(5, 4), max_distance=2, key_positions=ni(3)),
        "deberta_logits per-token": lambda: pe.deberta_logits(
            t(2, 1, 4), t(2, 3, 4), t(2, 4, 4), t(2, 4, 4), max_distance=2, query_positions=ni(1)
        ),
        "attention": lambda: pe.attention(t(2, 3, 4), t(2, 3, 4), n(2, 3, 4)),
        "attention bias": lambda: pe.attention(t(2, 3, 4), t(2, 3, 4), t(2, 3, 4), bias=n(3, 3)),
        "rope": lambda: pe.rope(t(2, 3, 8), ni(3)),
        "apply_rope": lambda: pe.apply_rope(t(3, 8), n(3, 8), t(3, 8)),
        "apply_absolute": lambda: pe.apply_absolute(t(3, 8), n(4, 8)),
        "axial_rope": lambda: pe.axial_rope(t(3, 8), ni(3, 2)),
        "linear_attention": lambda: pe.linear_attention(t(2, 3, 4), t(2, 3, 4), n(2, 3, 4), positions=ni(3)),
        "conv_positions": lambda: pe.conv_positions(t(5, 4), n(3, 4)),
        "complex_order": lambda: pe.complex_order(t(3, 4), n(4), t(4), ni(3)),
        "rerotate": lambda: pe.rerotate(t(2, 3, 8), ni(3), n(4)),
        "rope_cos_sin": lambda: pe.rope_cos_sin(ni(3), t(4)),
        "rerotate x": lambda: pe.rerotate(n(2, 3, 8), ti(3), t(4)),
        "rerotate x beside seq_len": lambda: pe.rerotate(
            n(2, 3, 8), 1, scaling=pe.scaling.DynamicNTK(2.0, original_max_position=2), seq_len=ti(2) + 5
        ),
        "mrope_cos_sin": lambda: pe.mrope_cos_sin(ni(3, 2), t(3), [1, 1, 1]),
        "xdrope_cos_sin": lambda: pe.xdrope_cos_sin(ni(2, 2), t(2), [1, 1]),
    }


def _out_calls(t, n):
    """Functions given an ``out=`` buffer of another library: never converted (it is written)."""
    return {
        "expand_bias out": lambda: pe.expand_bias(t(2, 5), 2, 4, out=n(2, 2, 4)),
        "t5_bias out": lambda: pe.t5_bias(t(32, 2), 2, 4, out=n(2, 2, 4)),
        "alibi_bias out": lambda: pe.alibi_bias(t(2), 2, 4, out=n(2, 2, 4)),
    }


def _torch_builders(torch):
    return (
        lambda *s: torch.asarray(_filled(s)),
        lambda *s: torch.zeros(*s, dtype=torch.int64),
    )


@pytest.mark.parametrize("order", ["=", ">"])
def test_numpy_constants_among_torch_arrays_are_converted(order):
    """A NumPy array among torch ones is a host constant: converted into torch, with its
    float64 precision; the result equals the all-torch call's. A big-endian one (``'>f8'``,
    ``'>i8'``: read from a file written so) too: torch's ``asarray`` refuses a byte-swapped
    array (a ``ValueError`` about byte order, naming no argument), so every mixed call failed
    where the all-NumPy call works."""
    torch = pytest.importorskip("torch")
    t, ti = _torch_builders(torch)
    n, ni = (lambda *s: _filled(s).astype(order + "f8")), (lambda *s: np.zeros(s, dtype=order + "i8"))
    mixed, alike = _mixed_library_calls(t, n, ti, ni), _mixed_library_calls(t, t, ti, ti)
    for case, call in mixed.items():
        got, want = call(), alike[case]()
        for g, w in zip(*((r if isinstance(r, tuple) else (r,)) for r in (got, want))):
            assert isinstance(g, torch.Tensor) and g.dtype == w.dtype, case
            torch.testing.assert_close(g, w, rtol=0, atol=0, msg=case)


def test_byte_swapped_numpy_offsets_and_positions_among_torch_arrays_are_converted():
    torch = pytest.importorskip("torch")
    x = torch.asarray(_filled((3, 2, 5, 8)), dtype=torch.float32)
    for offset in (np.array(7, dtype=">i8"), np.array([7, 7, 7], dtype=">u2")):
        torch.testing.assert_close(pe.rope(x, offset=offset), pe.rope(x, offset=7), rtol=0, atol=0)
    got = pe.sinusoidal(np.arange(4, dtype=">i4"), 8, xp=torch)
    torch.testing.assert_close(got, pe.sinusoidal(torch.arange(4), 8), rtol=0, atol=0)


def test_read_only_numpy_constants_among_torch_arrays_give_no_warning():
    """A read-only NumPy array (a broadcast, a memory map, ``np.asarray`` of a JAX array) among
    torch tensors is copied, not shared: torch warned once per process, in a UserWarning
    that ``-W error`` made an exception, that its tensor of the array might be written. Each
    of the mixed calls with read-only constants, in a fresh interpreter (the warning is
    torch's, once a process), warns of nothing and equals the all-torch call."""
    pytest.importorskip("torch")
    code = (
        "import warnings, numpy as np, torch, posenc as pe\n"
        "import test_conventions as tc\n"
        "warnings.simplefilter('error')\n"
        "def frozen(a):\n"
        "    a.flags.writeable = False\n"
        "    return a\n"
        "t, ti = tc._torch_builders(torch)\n"
        "n, ni = (lambda *s: frozen(tc._filled(s))), (lambda *s: frozen(np.zeros(s, dtype=np.int64)))\n"
        "mixed, alike = tc._mixed_library_calls(t, n, ti, ni), tc._mixed_library_calls(t, t, ti, ti)\n"
        "for case, call in mixed.items():\n"
        "    got, want = call(), alike[case]()\n"
        "    for g, w in zip(*((r if isinstance(r, tuple) else (r,)) for r in (got, want))):\n"
        "        torch.testing.assert_close(g, w, rtol=0, atol=0, msg=case)\n"
        "print(len(mixed))\n"
    )
    here = os.path.dirname(os.path.abspath(__file__))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([here, os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert int(run.stdout.split()[-1]) > 20


def test_numpy_constants_among_jax_arrays_are_converted():
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    t, ti = (lambda *s: jnp.asarray(_filled(s), dtype=jnp.float32)), (lambda *s: jnp.zeros(s, dtype=jnp.int32))
    n, ni = (lambda *s: _filled(s)), (lambda *s: np.zeros(s, dtype=np.int64))
    mixed, alike = _mixed_library_calls(t, n, ti, ni), _mixed_library_calls(t, t, ti, ti)
    for case in ("shaw_logits", "alibi_bias per-token", "rope", "apply_absolute", "rope_cos_sin"):  # JAX eager compiles each op: a few
        got, want = mixed[case](), alike[case]()
        for g, w in zip(*((r if isinstance(r, tuple) else (r,)) for r in (got, want))):
            assert isinstance(g, jax.Array) and g.dtype == w.dtype, case
            np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-6, atol=1e-6, err_msg=case)
    # the call: NumPy slopes (host constants), JAX positions
    got = pe.alibi_bias(pe.alibi_slopes(4), 3, 3, query_positions=jnp.arange(3))
    np.testing.assert_array_equal(np.asarray(got), pe.alibi_bias(pe.alibi_slopes(4), 3, 3).astype(np.float32))
    jitted = jax.jit(lambda q: pe.alibi_bias(pe.alibi_slopes(4), 3, 3, query_positions=q))(jnp.arange(3))
    np.testing.assert_array_equal(np.asarray(jitted), np.asarray(got))
    with pytest.raises(ValueError, match="key_positions holds values outside int32"):
        pe.alibi_bias(jnp.ones(2), 1, 1, key_positions=np.array([2**40]))


def test_two_device_libraries_give_one_type_error_naming_both_and_xp():
    """``TypeError`` naming both libraries and ``xp=``, the same wording in every family; the
    library is checked before the device (which once gave a ``ValueError`` about devices);
    a NumPy ``out=`` among torch arrays too (it is written, not converted)."""
    torch = pytest.importorskip("torch")
    jax = pytest.importorskip("jax")
    t, ti = _torch_builders(torch)
    n, ni = (lambda *s: jax.numpy.zeros(s)), (lambda *s: jax.numpy.zeros(s, dtype=jax.numpy.int32))
    calls = {**_mixed_library_calls(t, n, ti, ni), **_out_calls(t, lambda *s: np.zeros(s))}
    wrong = {}
    for case, call in calls.items():
        try:
            call()
        except Exception as exc:  # noqa: BLE001 - the kind of exception is what is tested
            other = "numpy" if case.endswith(" out") else "jax"
            if not (type(exc) is TypeError and str(exc).startswith(MIXED) and other in str(exc) and "torch" in str(exc) and "xp=" in str(exc)):
                wrong[case] = f"{type(exc).__name__}: {exc}"
        else:
            wrong[case] = "no error"
    assert not wrong, wrong


def _scalar_calls(t, ti):
    """Calls of ``t``/``ti``-built arrays beside one integer argument ``o``, by the argument's name."""
    x, slopes = t(2, 3, 8), t(2)
    dynamic = pe.scaling.DynamicNTK(2.0, original_max_position=2)
    return {
        "rope offset": ("offset", lambda o: pe.rope(x, offset=o)),
        "rope seq_len": ("seq_len", lambda o: pe.rope(x, scaling=dynamic, seq_len=o + 4)),
        "rope positions beside offset": ("offset", lambda o: pe.rope(x, ti(3), offset=o)),
        "rerotate seq_len": ("seq_len", lambda o: pe.rerotate(x, 1, scaling=dynamic, seq_len=o + 4)),
        "apply_absolute offset": ("offset", lambda o: pe.apply_absolute(x[0], t(9, 8), offset=o)),
        "alibi_bias offset": ("offset", lambda o: pe.alibi_bias(slopes, 2, 4, offset=o)),
        "alibi_bias q_len": ("q_len", lambda o: pe.alibi_bias(slopes, o, 4)),
        "alibi_bias per-token offset": ("offset", lambda o: pe.alibi_bias(slopes, 1, 3, offset=o, key_positions=ti(3))),
        "t5_bias offset": ("offset", lambda o: pe.t5_bias(t(32, 2), 2, 4, offset=o)),
        "relative_bias_vector offset": ("offset", lambda o: pe.relative_bias_vector("alibi", slopes, 2, 4, offset=o)),
        "shaw_logits offset": ("offset", lambda o: pe.shaw_logits(t(2, 3, 4), t(2, 5, 4), t(9, 4), max_distance=4, offset=o)),
    }


def test_zero_d_arrays_of_another_device_library_give_the_type_error_naming_them():
    """A 0-d offset, length or ``seq_len`` of another device library than the other arrays is
    the two-libraries ``TypeError``, naming the arguments: an eager JAX one beside torch
    arrays had been read as its integer (a torch result), a Dask one beside torch arrays
    had failed deep inside (torch's ``Cannot interpret 'torch.int64' as a data type``, or
    ``'Array' object has no attribute 'to'``). NumPy integers beside them, a NumPy scalar
    or a 0-d NumPy array (a host constant), keep giving the Python int's result; a NumPy
    scalar beside a NumPy array among torch ones had been taken for an array of another
    kind."""
    torch = pytest.importorskip("torch")
    jnp = pytest.importorskip("jax.numpy")
    da = pytest.importorskip("dask.array")
    t, ti = _torch_builders(torch)
    calls, wrong = _scalar_calls(t, ti), {}
    for case, (name, call) in calls.items():
        want = call(1)
        for o in (np.int64(1), np.int32(1), np.array(1), torch.tensor(1)):
            got = call(o)
            assert isinstance(got, torch.Tensor), (case, o)
            torch.testing.assert_close(got, want, rtol=0, atol=0, msg=case)
        for other, o in (("jax", jnp.asarray(1)), ("dask", da.from_array(np.array(1)))):
            try:
                call(o)
            except TypeError as exc:
                if not (str(exc).startswith(MIXED) and f"{name}: {type(o).__module__}" in str(exc) and "torch" in str(exc)):
                    wrong[case, other] = str(exc)
            else:
                wrong[case, other] = "no error"
    assert not wrong, wrong
    # NumPy integers beside a NumPy array (a host constant) among torch ones
    got = pe.alibi_bias(t(2), np.int32(1), 3, offset=np.int64(1), key_positions=np.arange(3))
    torch.testing.assert_close(got, pe.alibi_bias(t(2), 1, 3, offset=1, key_positions=torch.arange(3)), rtol=0, atol=0)


def _length_and_offset_mistakes(value):
    """``(argument, call)`` for every function taking a length, a count or an offset, each given ``value``."""
    x, table = np.zeros((3, 8)), np.zeros((32, 2))
    q, k, t = np.zeros((2, 3, 4)), np.zeros((2, 5, 4)), np.zeros((5, 4))
    lengths = {
        "relative_positions": ("q_len", lambda: pe.relative_positions(value, 3)),
        "t5_bias": ("k_len", lambda: pe.t5_bias(table, 2, value)),
        "alibi_bias": ("q_len", lambda: pe.alibi_bias(np.ones(2), value, 3)),
        "alibi_bias per-token": ("k_len", lambda: pe.alibi_bias(np.ones(2), 1, value, key_positions=np.arange(3))),
        "relative_bias": ("q_len", lambda: pe.relative_bias("shaw", np.ones((5, 2)), value, 3, max_distance=2)),
        "relative_bias_vector": ("k_len", lambda: pe.relative_bias_vector("t5", table, 2, value)),
        "expand_bias": ("q_len", lambda: pe.expand_bias(np.zeros((2, 4)), value, 3)),
        "sinusoidal": ("positions", lambda: pe.sinusoidal(value, 8)),
        "floater": ("length", lambda: pe.floater(value, 8)),
        "hierarchical_extend": ("length", lambda: pe.hierarchical_extend(np.zeros((4, 8)), value)),
        "alibi_slopes": ("num_heads", lambda: pe.alibi_slopes(value)),
        "nezha_table": ("max_distance", lambda: pe.nezha_table(value, 8)),
        "clip_relative": ("max_distance", lambda: pe.clip_relative(np.arange(3), value)),
        "shaw_logits max_distance": ("max_distance", lambda: pe.shaw_logits(q, k, t, max_distance=value)),
    }
    offsets = {
        "relative_positions offset": lambda: pe.relative_positions(2, 3, offset=value),
        "t5_bias offset": lambda: pe.t5_bias(table, 2, 3, offset=value),
        "alibi_bias offset": lambda: pe.alibi_bias(np.ones(2), 2, 3, offset=value),
        "alibi_bias per-token offset": lambda: pe.alibi_bias(np.ones(2), 1, 3, offset=value, key_positions=np.arange(3)),
        "relative_bias_vector offset": lambda: pe.relative_bias_vector("alibi", np.ones(2), 2, 3, offset=value),
        "shaw_logits offset": lambda: pe.shaw_logits(q, k, t, max_distance=2, offset=value),
        "shaw_output offset": lambda: pe.shaw_output(np.zeros((2, 3, 5)), k, t, max_distance=2, offset=value),
        "deberta_logits offset": lambda: pe.deberta_logits(q, k, np.zeros((4, 4)), np.zeros((4, 4)), max_distance=2, offset=value),
        "tener_logits offset": lambda: pe.tener_logits(q, k, np.zeros((1, 4)), np.zeros((1, 4)), offset=value),
        "tupe_logits offset": lambda: pe.tupe_logits(q, k, np.zeros((9, 4)), np.zeros((4, 4)), np.zeros((4, 4)), offset=value),
        "rope offset": lambda: pe.rope(x, offset=value),
        "apply_absolute offset": lambda: pe.apply_absolute(x, np.zeros((5, 8)), offset=value),
    }
    return lengths, offsets


def _check_all(cases, error, message):
    wrong = {}
    for case, (name, call) in cases.items():
        want = message.format(name=name)
        try:
            call()
        except Exception as exc:  # noqa: BLE001 - the kind of exception is what is tested
            if type(exc) is not error or str(exc) != want:
                wrong[case] = f"{type(exc).__name__}: {exc} (want {error.__name__}: {want})"
        else:
            wrong[case] = "no error"
    assert not wrong, wrong


def test_a_float_length_or_offset_is_one_type_error_everywhere():
    lengths, offsets = _length_and_offset_mistakes(2.5)
    _check_all(lengths, TypeError, "{name} must be an integer, got 2.5 (float)")
    _check_all({case: ("offset", call) for case, call in offsets.items()}, TypeError, "{name} must be an integer, got 2.5 (float)")


def test_a_negative_length_is_one_value_error_everywhere():
    lengths, _ = _length_and_offset_mistakes(-1)
    del lengths["alibi_slopes"]  # a head count must be positive, and says so
    _check_all(lengths, ValueError, "{name} must be a non-negative integer, got -1")
    with pytest.raises(ValueError, match="num_heads must be a positive integer, got -1"):
        pe.alibi_slopes(-1)


@pytest.mark.parametrize("per_token", [False, True])
def test_torch_kerple_power_decode_steps_are_the_last_rows(per_token):
    """torch's CPU pow rounds an entry one way in a whole vector and another in the rest of
    a row (an ulp apart in about 1% of float64 entries): every one-query call of a decode
    loop (and a chunk of 3) has the bits of the full call's row, per-distance or per token."""
    torch = pytest.importorskip("torch")
    r1, r2 = (torch.from_numpy(RNG.random(3) * 2 + 0.1) for _ in range(2))
    n = 300

    def bias(q_len, k_len):
        if per_token:
            keys = torch.arange(k_len)
            return pe.kerple_bias(r1, r2, q_len, k_len, kind="power", query_positions=keys[k_len - q_len :], key_positions=keys)
        return pe.kerple_bias(r1, r2, q_len, k_len, kind="power")

    full = bias(n, n)
    for k_len in range(1, n + 1):
        assert torch.equal(bias(1, k_len), full[:, k_len - 1 : k_len, :k_len]), k_len
        if k_len >= 3:
            assert torch.equal(bias(3, k_len), full[:, k_len - 3 : k_len, :k_len]), k_len


def test_every_public_function_has_a_docstring_example():
    """DESIGN.md: a public function's docstring gives its formula, its paper and a short
    example, a doctest that runs with the suite (``--doctest-modules``); so does each
    scaling method's class. The backend switches and ``from_hf``'s record excepted."""
    exempt = {"get_backend", "set_backend", "use_backend", "scaling", "HFRope"}
    public = {name: getattr(pe, name) for name in pe.__all__} | {name: getattr(pe.scaling, name) for name in pe.scaling.__all__}
    missing = [name for name, obj in public.items() if name not in exempt and ">>>" not in (obj.__doc__ or "")]
    assert missing == []
