"""Devices without a GPU: array-api-strict's second device, ``device1``, which refuses to
combine its arrays with those of its default device (``CPU_DEVICE``) and to be read by NumPy.

Every public function taking arrays is called here with all of them on ``device1`` (the
result is there, with the default device's bits: nothing went through NumPy), then with one
argument on the default device beside the others on ``device1`` (a ``ValueError`` naming it,
not array-api-strict's own error from inside the computation, and not a silent read of it).
The creators honour ``device=``, and refuse one that contradicts an array argument.
"""

from __future__ import annotations

import numpy as np
import pytest

import posenc as pe

strict = pytest.importorskip("array_api_strict")
DEFAULT, DEVICE1 = strict.Device("CPU_DEVICE"), strict.Device("device1")
RNG = np.random.default_rng(131)
INV = 10000.0 ** (-np.arange(4) / 4)
COS, SIN = pe.rope_cos_sin(np.arange(5), INV, dtype=np.float64)
GRID = np.stack(np.meshgrid(np.arange(2), np.arange(3), indexing="ij"), -1).reshape(6, 2)


def r(*shape):
    return RNG.standard_normal(shape)


Q, K, V = r(2, 3, 5, 8), r(2, 3, 7, 8), r(2, 3, 7, 8)
U = r(3, 1, 8)
QKV = {"q": Q, "k": K, "v": V}

# name -> (call(a), {argument name: NumPy value}); ``a`` maps each name to its array.
CALLS = {
    "attention": (lambda a: pe.attention(a["q"], a["k"], a["v"], bias=a["bias"], mask=a["mask"]), {**QKV, "bias": r(3, 5, 7), "mask": np.ones((5, 7), bool)}),
    "apply_absolute": (lambda a: pe.apply_absolute(a["x"], a["table"], offset=a["offset"]), {"x": r(2, 5, 8), "table": r(9, 8), "offset": np.array(2)}),
    "complex_order": (lambda a: pe.complex_order(a["amplitude"], a["frequency"], a["phase"], a["positions"]), {"amplitude": r(5, 8), "frequency": r(5, 8), "phase": r(5, 8), "positions": np.arange(5)}),
    "conv_positions": (lambda a: pe.conv_positions(a["x"], a["kernel"]), {"x": r(2, 6, 8), "kernel": r(3, 8)}),
    "alibi_bias": (lambda a: pe.alibi_bias(a["slopes"], 3, 6, offset=a["offset"]), {"slopes": np.array([0.5, 0.25]), "offset": np.array(1)}),
    "alibi_bias per-token": (lambda a: pe.alibi_bias(a["slopes"], 3, 6, query_positions=a["query_positions"], key_positions=a["key_positions"]), {"slopes": np.array([0.5, 0.25]), "query_positions": np.array([[3, 4, 5]]), "key_positions": np.arange(6)[None]}),
    "alibi_bias out": (lambda a: pe.alibi_bias(a["slopes"], 3, 6, out=a["out"]), {"slopes": np.array([0.5, 0.25]), "out": np.zeros((2, 3, 6))}),
    "deberta_logits": (lambda a: pe.deberta_logits(a["q"], a["k"], a["pos_q"], a["pos_k"], max_distance=3, query_positions=a["query_positions"]), {"q": Q, "k": K, "pos_q": r(3, 6, 8), "pos_k": r(3, 6, 8), "query_positions": np.arange(2, 7)}),
    "expand_bias": (lambda a: pe.expand_bias(a["vec"], 3, 6, out=a["out"]), {"vec": r(2, 8), "out": np.zeros((2, 3, 6))}),
    "relative_bias": (lambda a: pe.relative_bias("t5", a["params"], 3, 6, query_positions=a["query_positions"], key_positions=a["key_positions"]), {"params": r(32, 2), "query_positions": np.array([3, 4, 5]), "key_positions": np.arange(6)}),
    "relative_bias_vector": (lambda a: pe.relative_bias_vector("t5", a["params"], 3, 6, offset=a["offset"]), {"params": r(32, 2), "offset": np.array(2)}),
    "segment_logits": (lambda a: pe.segment_logits(a["q"], a["seg_q"], a["seg_k"], a["s_same"], a["s_diff"], a["b"]), {"q": Q, "seg_q": np.array([0, 0, 1, 1, 1]), "seg_k": np.array([0, 0, 0, 1, 1, 1, 1]), "s_same": U, "s_diff": U, "b": U}),
    "shaw_logits": (lambda a: pe.shaw_logits(a["q"], a["k"], a["table_k"], max_distance=2, offset=a["offset"]), {"q": Q, "k": K, "table_k": r(5, 8), "offset": np.array(2)}),
    "shaw_logits per-token": (lambda a: pe.shaw_logits(a["q"], a["k"], a["table_k"], max_distance=2, query_positions=a["query_positions"], key_positions=a["key_positions"]), {"q": Q, "k": K, "table_k": r(5, 8), "query_positions": np.arange(2, 7), "key_positions": np.arange(7)}),
    "shaw_output": (lambda a: pe.shaw_output(a["weights"], a["v"], a["table_v"], max_distance=2, query_positions=a["query_positions"]), {"weights": r(2, 3, 5, 7), "v": V, "table_v": r(5, 8), "query_positions": np.arange(2, 7)}),
    "t5_bias": (lambda a: pe.t5_bias(a["table"], 3, 6, offset=a["offset"]), {"table": r(32, 2), "offset": np.array(2)}),
    "t5_bias out": (lambda a: pe.t5_bias(a["table"], 3, 6, out=a["out"]), {"table": r(32, 2), "out": np.zeros((2, 3, 6))}),
    "tener_logits": (lambda a: pe.tener_logits(a["q"], a["k"], a["u"], a["v"], offset=a["offset"]), {"q": Q, "k": K, "u": U, "v": U, "offset": np.array(2)}),
    "tupe_logits": (lambda a: pe.tupe_logits(a["q"], a["k"], a["p"], a["uq"], a["uk"], bias=a["bias"], cls=(a["cls[0]"], a["cls[1]"])), {"q": Q, "k": K, "p": r(7, 8), "uq": r(8, 8), "uk": r(8, 8), "bias": r(3, 5, 7), "cls[0]": r(3), "cls[1]": r(3)}),
    "xl_logits": (lambda a: pe.xl_logits(a["q"], a["k"], a["r"], a["u"], a["v"]), {"q": Q, "k": K, "r": r(2, 3, 7, 8), "u": U, "v": U}),
    "cope_logits": (lambda a: pe.cope_logits(a["q"], a["k"], a["pos_emb"], mask=a["mask"]), {"q": Q, "k": K, "pos_emb": r(8, 8), "mask": np.ones((5, 7), bool)}),
    "cope_positions": (lambda a: pe.cope_positions(a["q"], a["k"]), {"q": Q, "k": K}),
    "fire_distances": (lambda a: pe.fire_distances(3, 6, query_positions=a["query_positions"], key_positions=a["key_positions"]), {"query_positions": np.array([3, 4, 5]), "key_positions": np.arange(6)}),
    "fire_bias": (lambda a: pe.fire_bias(lambda d: d * 2.0, 3, 6, query_positions=a["query_positions"], key_positions=a["key_positions"]), {"query_positions": np.array([3, 4, 5]), "key_positions": np.arange(6)}),
    "kerple_bias": (lambda a: pe.kerple_bias(a["r1"], a["r2"], 3, 6, query_positions=a["query_positions"]), {"r1": np.array([0.5, 1.0]), "r2": np.array([0.3, 0.7]), "query_positions": np.array([3, 4, 5])}),
    "sandwich_bias": (lambda a: pe.sandwich_bias(3, 6, 8, query_positions=a["query_positions"], key_positions=a["key_positions"]), {"query_positions": np.array([3, 4, 5]), "key_positions": np.arange(6)}),
    "apply_rope": (lambda a: pe.apply_rope(a["x"], a["cos"], a["sin"], out=a["out"]), {"x": r(2, 3, 5, 8), "cos": COS, "sin": SIN, "out": np.zeros((2, 3, 5, 8))}),
    "axial_rope": (lambda a: pe.axial_rope(a["x"], a["grid"]), {"x": r(2, 6, 8), "grid": GRID}),
    "linear_attention": (lambda a: pe.linear_attention(a["q"], a["k"], a["v"], positions=a["positions"]), {"q": r(2, 3, 7, 8), "k": K, "v": V, "positions": np.arange(7)}),
    "mrope_cos_sin": (lambda a: pe.mrope_cos_sin(a["positions"], a["inv_freq"], (2, 1, 1)), {"positions": np.stack([np.arange(5)] * 3), "inv_freq": INV}),
    "xdrope_cos_sin": (lambda a: pe.xdrope_cos_sin(a["positions"], a["inv_freq"], (2, 2)), {"positions": np.stack([np.arange(5)] * 2), "inv_freq": INV}),
    "rerotate": (lambda a: pe.rerotate(a["x"], a["delta"], a["inv_freq"], new_inv_freq=a["new_inv_freq"], out=a["out"]), {"x": r(2, 5, 8), "delta": np.arange(5), "inv_freq": INV, "new_inv_freq": INV / 2, "out": np.zeros((2, 5, 8))}),
    "rope positions": (lambda a: pe.rope(a["x"], a["positions"], offset=a["offset"], out=a["out"]), {"x": r(2, 3, 5, 8), "positions": np.arange(5), "offset": np.array(3), "out": np.zeros((2, 3, 5, 8))}),
    "rope per-row offset": (lambda a: pe.rope(a["x"], offset=a["offset"]), {"x": r(2, 3, 5, 8), "offset": np.array([3, 5])[:, None]}),
    "rope seq_len": (lambda a: pe.rope(a["x"], scaling=pe.scaling.DynamicNTK(2.0, 4), seq_len=a["seq_len"]), {"x": r(2, 3, 5, 8), "seq_len": np.array(9)}),
    "rope_cos_sin": (lambda a: pe.rope_cos_sin(a["positions"], a["inv_freq"]), {"positions": np.arange(5), "inv_freq": INV}),
    # one array argument: only the first test applies
    "hierarchical_extend": (lambda a: pe.hierarchical_extend(a["table"], 12), {"table": r(4, 8)}),
    "floater": (lambda a: pe.floater(4, 8, p0=a["p0"], substeps=2), {"p0": r(8)}),
    "sinusoidal": (lambda a: pe.sinusoidal(a["positions"], 8), {"positions": np.arange(6) / 3}),
    "clip_relative": (lambda a: pe.clip_relative(a["rel"], 2), {"rel": pe.relative_positions(3, 6)}),
    "deberta_bucket": (lambda a: pe.deberta_bucket(a["rel"], bucket_size=4, max_position=16), {"rel": pe.relative_positions(3, 20)}),
    "t5_bucket": (lambda a: pe.t5_bucket(a["rel"]), {"rel": pe.relative_positions(3, 60)}),
    "rel_shift": (lambda a: pe.rel_shift(a["x"]), {"x": r(2, 3, 5, 7)}),
    "convert_layout": (lambda a: pe.convert_layout(a["x"], "half", "interleaved"), {"x": r(2, 5, 8)}),
    "permute_qk_weight": (lambda a: pe.permute_qk_weight(a["w"], "half", "interleaved", head_dim=8), {"w": r(16, 12)}),
    "positions_from_cu_seqlens": (lambda a: pe.positions_from_cu_seqlens(a["cu_seqlens"], 7), {"cu_seqlens": np.array([0, 3, 7])}),
    "positions_from_mask": (lambda a: pe.positions_from_mask(a["mask"]), {"mask": np.array([[0, 1, 1, 1], [1, 1, 1, 0]], bool)}),
    "rope_decay": (lambda a: pe.rope_decay(a["distances"], 8), {"distances": np.arange(5)}),
    "xpos_scale": (lambda a: pe.xpos_scale(a["positions"], 8), {"positions": np.arange(5)}),
}


def _on(values, devices=None):
    return {name: strict.asarray(v, device=(devices or {}).get(name, DEVICE1)) for name, v in values.items()}


def _results(value):
    return value if isinstance(value, tuple) else (value,)


@pytest.mark.parametrize("name", list(CALLS))
def test_every_function_on_device1_gives_its_results_there_with_the_default_devices_bits(name):
    call, values = CALLS[name]
    want = _results(call(_on(values, dict.fromkeys(values, DEFAULT))))
    got = _results(call(_on(values)))
    for w, g in zip(want, got, strict=True):
        assert g.device == DEVICE1
        assert g.dtype == w.dtype and np.array_equal(np.asarray(w), np.asarray(g.to_device(DEFAULT)), equal_nan=True)


MIXED = [(name, moved) for name, (_, values) in CALLS.items() if len(values) > 1 for moved in values]


@pytest.mark.parametrize(("name", "moved"), MIXED, ids=[f"{n}-{m}" for n, m in MIXED])
def test_one_argument_on_the_default_device_is_refused_naming_it(name, moved):
    """Each argument in turn on the default device beside the others on ``device1``. Before:
    most calls refused it as ``arrays on different devices in one call: [Device('device1'),
    Device('CPU_DEVICE')]``, naming no argument; a 0-d ``offset``/``seq_len`` and the
    frequencies of ``rope_cos_sin``, ``mrope_cos_sin``, ``xdrope_cos_sin`` and ``rerotate``
    were read on the host and the call went on (a result on another device than theirs, or
    for ``rope`` on ``x``'s while the offset was elsewhere); CoPE's ``pos_emb`` and ``mask``,
    TUPE's ``cls`` and ``linear_attention``'s ``positions`` reached array-api-strict's own
    error from inside the computation. Now a ``ValueError`` naming the argument (where two
    arrays differ, either one), before any work."""
    call, values = CALLS[name]
    with pytest.raises(ValueError) as refused:
        call(_on(values, {moved: DEFAULT}))
    message = str(refused.value)
    named = [moved] if len(values) > 2 else list(values)
    assert any(f"{n} " in message for n in named), message
    assert "can not be combined" not in message and "must all use the same device" not in message


POSITIONS = strict.asarray(np.arange(3), device=DEVICE1)
OFFSET = strict.asarray(2, device=DEVICE1)
# name -> call(device): a creator given an array on device1 and ``device=``.
CREATORS = {
    "sinusoidal": lambda d: pe.sinusoidal(POSITIONS, 8, device=d),
    "sinusoidal xp": lambda d: pe.sinusoidal(POSITIONS, 8, xp=strict, device=d),
    "floater": lambda d: pe.floater(3, 8, p0=strict.asarray(np.ones(8), device=DEVICE1), substeps=2, device=d),
    "rope_decay": lambda d: pe.rope_decay(POSITIONS, 8, device=d),
    "fire_distances": lambda d: pe.fire_distances(3, 6, query_positions=POSITIONS, device=d),
    "fire_distances offset": lambda d: pe.fire_distances(3, 6, offset=OFFSET, xp=strict, device=d),
    "fire_bias": lambda d: pe.fire_bias(lambda z: z * 2.0, 3, 6, query_positions=POSITIONS, device=d),
    "sandwich_bias": lambda d: pe.sandwich_bias(3, 6, 8, query_positions=POSITIONS, device=d),
    "sandwich_bias offset": lambda d: pe.sandwich_bias(3, 6, 8, offset=OFFSET, xp=strict, device=d),
    "sandwich_vector": lambda d: pe.sandwich_vector(3, 6, 8, offset=OFFSET, xp=strict, device=d),
    "relative_positions": lambda d: pe.relative_positions(3, 6, offset=OFFSET, device=d),
}


@pytest.mark.parametrize("name", list(CREATORS))
def test_a_device_argument_is_honoured_and_one_contradicting_an_array_refused(name):
    """``device=device1`` beside arrays on ``device1`` gives a result there. ``device=`` the
    default device beside them was dropped without a word by ``sinusoidal``, ``floater`` and
    ``rope_decay`` (a result on ``device1``), read the 0-d offset of ``relative_positions`` and
    ``sandwich_vector`` into a result on the default device, and ended in array-api-strict's
    own error inside ``fire_distances``, ``fire_bias`` and ``sandwich_bias``. Now a
    ``ValueError`` naming the argument, as torch's positions are refused (``test_device_reads``)."""
    assert CREATORS[name](DEVICE1).device == DEVICE1
    with pytest.raises(ValueError, match=r"^(\w+) (is on|must be on device) array_api_strict\.Device\('(device1|CPU_DEVICE)'\)") as refused:
        CREATORS[name](DEFAULT)
    assert "can not be combined" not in str(refused.value)


@pytest.mark.parametrize("name", ["floater", "sinusoidal", "rope_decay", "alibi_slopes", "rope_frequencies", "sincos_2d", "nezha_table", "axial_frequencies", "relative_positions", "randomized_positions"])
def test_a_creator_of_xp_array_api_strict_makes_its_result_on_the_device_given(name):
    call = {
        "floater": lambda d: pe.floater(3, 8, substeps=2, xp=strict, device=d),
        "sinusoidal": lambda d: pe.sinusoidal(6, 8, xp=strict, device=d),
        "rope_decay": lambda d: pe.rope_decay(5, 8, xp=strict, device=d),
        "alibi_slopes": lambda d: pe.alibi_slopes(3, xp=strict, device=d),
        "rope_frequencies": lambda d: pe.rope_frequencies(8, xp=strict, device=d)[0],
        "sincos_2d": lambda d: pe.sincos_2d(2, 3, 8, xp=strict, device=d),
        "nezha_table": lambda d: pe.nezha_table(3, 8, xp=strict, device=d),
        "axial_frequencies": lambda d: pe.axial_frequencies(8, xp=strict, device=d),
        "relative_positions": lambda d: pe.relative_positions(3, 6, xp=strict, device=d),
        "randomized_positions": lambda d: pe.randomized_positions(4, 10, rng=np.random.default_rng(0), xp=strict, device=d),
    }[name]
    got, want = call(DEVICE1), call(DEFAULT)
    assert got.device == DEVICE1 and want.device == DEFAULT
    assert np.array_equal(np.asarray(want), np.asarray(got.to_device(DEFAULT)))


def test_floater_converts_a_numpy_p0_into_the_namespace_given():
    """``floater(p0=<NumPy>, xp=torch)`` raised ``AttributeError: 'numpy.dtypes.Float64DType'
    object has no attribute 'is_floating_point'``; ``p0`` is converted as the other creators'
    arrays are now, onto ``device=``."""
    got = pe.floater(3, 8, p0=np.ones(8), substeps=2, xp=strict, device=DEVICE1)
    assert got.device == DEVICE1
    assert np.array_equal(np.asarray(got.to_device(DEFAULT)), pe.floater(3, 8, p0=np.ones(8), substeps=2))
