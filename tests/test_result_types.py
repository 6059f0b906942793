"""One result type per public function, whichever path serves the call.

A function has several paths: the Array-API reference, the Numba kernels, the decode-step
plans kept after a few calls, one offset per batch row, per-token positions, the Toeplitz
expansion. NumPy inputs held in the other byte order (``>f4`` on x86), read-only, in an
``np.memmap`` or in another subclass of ``np.ndarray`` give on every path, and on every call, a plain ``np.ndarray`` in this
machine's byte order, of the dtype, shape and values of the native inputs' result (what
the kernels, which read native copies, always gave: ``pe.rope(x.astype(">f8"))`` is
float64). ``out=`` of either byte order is written and returned as it is.
"""

from __future__ import annotations

import numpy as np
import pytest

import posenc as pe

H, D = 2, 8
ROWS = np.array([4, 3])  # one offset per batch row
STORAGES = ("native", "swapped", "readonly", "memmap", "subclass")
CALLS_PER_PATH = 5  # a decode step is planned after a few calls


def _inputs():
    rng = np.random.default_rng(0)

    def f(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    return {
        "table": f(32, H), "slopes": np.abs(f(H)) + 0.1, "shaw": f(9, H), "deberta": f(8, H), "vec": f(H, 9),
        "r1": np.abs(f(H)) + 0.1, "r2": np.abs(f(H)) + 0.1, "x": f(2, H, 3, D), "x1": f(2, H, 1, D),
        "q": f(2, H, 3, D), "q1": f(2, H, 1, D), "k": f(2, H, 5, D), "v": f(2, H, 5, D), "w": f(2, H, 3, 5), "w1": f(2, H, 1, 5),
        "table_k": f(9, D), "pos_q": f(H, 8, D), "pos_k": f(H, 8, D), "r": f(2, H, 5, D), "u": f(H, 1, D), "cope": f(H, 6, D),
        "p": f(5, D), "uq": f(D, D), "uk": f(D, D), "absolute": f(10, D), "kernel": f(3, D), "amplitude": f(5, D),
        "positions": np.arange(5), "query_positions": np.array([[4], [3]]), "float_positions": np.arange(0.0, 15.0, 3.0, dtype=np.float32),
        "inv_freq": pe.rope_frequencies(D)[0], "grid": np.stack([np.arange(3), np.zeros(3, np.int64)], -1),
        "rel": np.arange(-6, 6).reshape(3, 4), "weight": f(2 * D, 4), "distances": np.arange(4.0, dtype=np.float32),
    }  # fmt: skip


class _Subclass(np.ndarray):
    """A subclass of NumPy's array that keeps its type through ufuncs and indexing."""


def _stored(storage, a, directory):
    if storage == "native":
        return a
    if storage == "subclass":
        return a.view(_Subclass)
    if storage == "swapped":
        return a.astype(a.dtype.newbyteorder())
    if storage == "readonly":
        a = a.copy()
        a.flags.writeable = False
        return a
    path = directory / f"{len(list(directory.iterdir()))}.bin"
    written = np.memmap(path, dtype=a.dtype, mode="w+", shape=a.shape)
    written[...] = a
    written.flush()
    return np.memmap(path, dtype=a.dtype, mode="r", shape=a.shape)


def _bias_paths(bias):
    """A bias's paths: ``bias(a, q_len, k_len, **kw)``."""
    return {
        "decode": lambda a: bias(a, 1, 5),
        "prefill": lambda a: bias(a, 3, 5),
        "offset per row": lambda a: bias(a, 1, 5, offset=ROWS),
        "query positions": lambda a: bias(a, 1, 5, query_positions=a["query_positions"]),
        "key positions": lambda a: bias(a, 1, 5, key_positions=a["positions"]),
    }


def _logits_paths(logits, one="q1", many="q"):
    """A logits function's paths: ``logits(a, queries, **kw)``."""
    return {
        "decode": lambda a: logits(a, a[one]),
        "prefill": lambda a: logits(a, a[many]),
        "offset per row": lambda a: logits(a, a[one], offset=ROWS),
        "positions": lambda a: logits(a, a[one], query_positions=a["query_positions"], key_positions=a["positions"]),
    }


def _relative(kind, **options):
    return _bias_paths(lambda a, q, k, **kw: pe.relative_bias(kind, a[kind], q, k, **options, **kw))


# Biases read from a table (gathered): the gather keeps the table's byte order and subclass.
TABLE_BIASES = {
    "t5_bias": _bias_paths(lambda a, q, k, **kw: pe.t5_bias(a["table"], q, k, **kw)),
    "relative_bias shaw": _relative("shaw", max_distance=4),
    "relative_bias deberta": _relative("deberta", max_distance=4),
    "relative_bias_vector t5": {
        "decode": lambda a: pe.relative_bias_vector("t5", a["table"], 1, 5),
        "prefill": lambda a: pe.relative_bias_vector("t5", a["table"], 3, 5),
    },
    "relative_bias_vector shaw": {
        "decode": lambda a: pe.relative_bias_vector("shaw", a["shaw"], 1, 5, max_distance=4),
        "prefill": lambda a: pe.relative_bias_vector("shaw", a["shaw"], 3, 5, max_distance=4),
    },
}

BIASES = {
    "alibi_bias": _bias_paths(lambda a, q, k, **kw: pe.alibi_bias(a["slopes"], q, k, **kw)),
    "relative_bias_vector alibi": {
        "decode": lambda a: pe.relative_bias_vector("alibi", a["slopes"], 1, 5),
        "prefill": lambda a: pe.relative_bias_vector("alibi", a["slopes"], 3, 5),
    },
    "expand_bias": {"decode": lambda a: pe.expand_bias(a["vec"][:, 4:], 1, 5), "prefill": lambda a: pe.expand_bias(a["vec"][:, 2:], 3, 5)},
    "kerple_bias log": _bias_paths(lambda a, q, k, **kw: pe.kerple_bias(a["r1"], a["r2"], q, k, **kw)),
    "kerple_bias power": _bias_paths(lambda a, q, k, **kw: pe.kerple_bias(a["r1"], a["r2"], q, k, kind="power", **kw)),
    "fire_bias": _bias_paths(lambda a, q, k, **kw: pe.fire_bias(lambda z: z * np.asarray(a["slopes"]), q, k, **kw)),
    "sandwich_bias": _bias_paths(lambda a, q, k, **kw: pe.sandwich_bias(q, k, D, heads=H, **kw)),
}

LOGITS = {
    "cope_logits": {
        "decode": lambda a: pe.cope_logits(a["q1"], a["k"], a["cope"]),
        "prefill": lambda a: pe.cope_logits(a["q"], a["k"], a["cope"]),
        "offset per row": lambda a: pe.cope_logits(a["q1"], a["k"], a["cope"], offset=ROWS),
    },
    "shaw_logits": _logits_paths(lambda a, q, **kw: pe.shaw_logits(q, a["k"], a["table_k"], max_distance=4, **kw)),
    "shaw_output": _logits_paths(lambda a, w, **kw: pe.shaw_output(w, a["v"], a["table_k"], max_distance=4, **kw), "w1", "w"),
    "deberta_logits": _logits_paths(lambda a, q, **kw: pe.deberta_logits(q, a["k"], a["pos_q"], a["pos_k"], max_distance=4, **kw)),
    "xl_logits": {
        "decode": lambda a: pe.xl_logits(a["q1"], a["k"], a["r"], a["u"], a["u"]),
        "prefill": lambda a: pe.xl_logits(a["q"], a["k"], a["r"], a["u"], a["u"]),
    },
    "tener_logits": {
        "decode": lambda a: pe.tener_logits(a["q1"], a["k"], a["u"], a["u"]),
        "prefill": lambda a: pe.tener_logits(a["q"], a["k"], a["u"], a["u"]),
    },
    "tupe_logits": {
        "decode": lambda a: pe.tupe_logits(a["q1"], a["k"], a["p"], a["uq"], a["uk"]),
        "prefill": lambda a: pe.tupe_logits(a["q"], a["k"], a["p"], a["uq"], a["uk"]),
    },
}

ROTARY = {
    "rope": {
        "decode": lambda a: pe.rope(a["x1"], offset=4),
        "prefill": lambda a: pe.rope(a["x"]),
        "offset per row": lambda a: pe.rope(a["x1"], offset=ROWS[:, None, None]),
        "positions": lambda a: pe.rope(a["x1"], a["query_positions"]),
        "partial": lambda a: pe.rope(a["x"], rotary_dim=4),
    },
    "apply_rope": {
        "decode": lambda a: pe.apply_rope(a["x1"], *pe.rope_cos_sin(a["positions"][4:], a["inv_freq"])),
        "prefill": lambda a: pe.apply_rope(a["x"], *pe.rope_cos_sin(a["positions"][:3], a["inv_freq"])),
    },
    "rope_cos_sin": {
        "integer positions": lambda a: pe.rope_cos_sin(a["positions"], a["inv_freq"])[0],
        "float positions": lambda a: pe.rope_cos_sin(a["float_positions"], a["inv_freq"])[1],
    },
    "rerotate": {"one delta": lambda a: pe.rerotate(a["x"], 3, a["inv_freq"]), "delta per row": lambda a: pe.rerotate(a["x1"], ROWS[:, None, None], a["inv_freq"])},
    "axial_rope": {"grid": lambda a: pe.axial_rope(a["x"], a["grid"])},
    "xpos_scale": {"positions": lambda a: pe.xpos_scale(a["float_positions"], D)},
}

ABSOLUTE = {
    "sinusoidal": {
        "integer positions": lambda a: pe.sinusoidal(a["positions"], D),
        "float positions": lambda a: pe.sinusoidal(a["float_positions"], D),
        "half": lambda a: pe.sinusoidal(a["float_positions"], D, layout="half"),
    },
    "apply_absolute": {
        "add": lambda a: pe.apply_absolute(a["x"], a["absolute"], offset=2),
        "decode": lambda a: pe.apply_absolute(a["x1"], a["absolute"], offset=4),
        "multiply": lambda a: pe.apply_absolute(a["x"], a["absolute"], mode="multiply"),
    },
    "hierarchical_extend": {"extended": lambda a: pe.hierarchical_extend(a["absolute"], 30), "as long": lambda a: pe.hierarchical_extend(a["absolute"], 10)},
    "conv_positions": {"prefill": lambda a: pe.conv_positions(a["x"], a["kernel"]), "decode": lambda a: pe.conv_positions(a["x1"], a["kernel"])},
    "complex_order": {"positions": lambda a: pe.complex_order(a["amplitude"], a["amplitude"], a["amplitude"], a["float_positions"])},
}

# One path each, but the rule is the library's: indices cast back to rel's dtype, rows taken from w.
SINGLE = {
    "t5_bucket": {"rel": lambda a: pe.t5_bucket(a["rel"])},
    "deberta_bucket": {"rel": lambda a: pe.deberta_bucket(a["rel"], bucket_size=4, max_position=16)},
    "clip_relative": {"rel": lambda a: pe.clip_relative(a["rel"], 2)},
    "permute_qk_weight": {"rows": lambda a: pe.permute_qk_weight(a["weight"], "interleaved", "half", head_dim=D)},
    "rope_decay": {"distances": lambda a: pe.rope_decay(a["distances"], D)},
}

FUNCTIONS = {**TABLE_BIASES, **BIASES, **LOGITS, **ROTARY, **ABSOLUTE, **SINGLE}


def _kind(result):
    return type(result).__name__, result.dtype.str, tuple(result.shape)


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_every_path_and_storage_gives_one_result_type(name, tmp_path):
    """Every storage of the inputs, every path, every call: a plain native ``ndarray`` of the
    native inputs' dtype and values."""
    native = _inputs()
    paths = FUNCTIONS[name]
    want = {path: call(native) for path, call in paths.items()}
    assert len({w.dtype for w in want.values()}) == 1, f"{name}: one dtype on every path of native inputs"
    assert all(type(w) is np.ndarray and w.dtype.isnative for w in want.values()), name
    for storage in STORAGES:
        arrays = {key: _stored(storage, a, tmp_path) for key, a in native.items()}
        for path, call in paths.items():
            for n in range(CALLS_PER_PATH):
                got = call(arrays)
                where = f"{name}, {storage} inputs, {path}, call {n + 1}"
                assert _kind(got) == _kind(want[path]), f"{where}: {_kind(got)}, not {_kind(want[path])}"
                np.testing.assert_array_equal(got, want[path], err_msg=where)


OUT = {
    "t5_bias": lambda a, out: pe.t5_bias(a["table"], 1, 5, out=out),
    "alibi_bias": lambda a, out: pe.alibi_bias(a["slopes"], 1, 5, out=out),
    "relative_bias shaw": lambda a, out: pe.relative_bias("shaw", a["shaw"], 1, 5, max_distance=4, out=out),
    "expand_bias": lambda a, out: pe.expand_bias(a["vec"][:, 4:], 1, 5, out=out),
    "rope": lambda a, out: pe.rope(a["x1"], offset=4, out=out),
    "rerotate": lambda a, out: pe.rerotate(a["x1"], 3, a["inv_freq"], out=out),
}


@pytest.mark.parametrize("name", sorted(OUT))
def test_out_of_either_byte_order_is_the_result_on_every_call(name, tmp_path):
    native = _inputs()
    want = OUT[name](native, None)
    for storage in STORAGES:
        arrays = {key: _stored(storage, a, tmp_path) for key, a in native.items()}
        for order in ("=", "S"):
            for n in range(CALLS_PER_PATH):
                out = np.full(want.shape, np.nan, want.dtype.newbyteorder(order))
                assert OUT[name](arrays, out) is out
                np.testing.assert_array_equal(out, want, err_msg=f"{name}, {storage} inputs, out {out.dtype.str}, call {n + 1}")


def test_a_numpy_subclass_among_torch_tensors_is_a_host_constant(tmp_path):
    """An ``np.memmap`` (or other subclass) beside torch tensors is converted as a plain NumPy
    array is, not refused as an array of another library."""
    torch = pytest.importorskip("torch")
    x = torch.from_numpy(_inputs()["x"])
    positions = np.arange(3)
    want = pe.rope(x, positions)
    for storage in ("memmap", "subclass"):
        got = pe.rope(x, _stored(storage, positions, tmp_path))
        assert type(got) is torch.Tensor and torch.equal(got, want), storage
