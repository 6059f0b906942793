"""One name per idea: the concatenated-halves layout is ``"half"`` in every function;
``"split"``, its earlier name, is an alias that warns in every function and module."""

from __future__ import annotations

import numpy as np
import pytest

import posenc as pe
from formulas import sinusoid

rng = np.random.default_rng(0)
X = rng.standard_normal((2, 5, 8))
Q, K = rng.standard_normal((2, 1, 3, 4))
U = np.zeros((1, 1, 4))
INV_FREQ, _ = pe.rope_frequencies(8)
COS, SIN = pe.rope_cos_sin(np.arange(5), INV_FREQ)

CALLS = {
    "sinusoidal": lambda layout: pe.sinusoidal(np.arange(5), 8, layout=layout),
    "tener_logits": lambda layout: pe.tener_logits(Q, K, U, U, layout=layout),
    "rope": lambda layout: pe.rope(X, layout=layout),
    "rope_cos_sin": lambda layout: pe.rope_cos_sin(np.arange(5), INV_FREQ, layout=layout)[1],
    "apply_rope": lambda layout: pe.apply_rope(X, COS, SIN, layout=layout),
    "xpos_scale": lambda layout: pe.xpos_scale(np.arange(5), 8, layout=layout),
    "rerotate": lambda layout: pe.rerotate(X, 3, INV_FREQ, layout=layout),
    "linear_attention": lambda layout: pe.linear_attention(X, X, X, positions=np.arange(5), layout=layout),
}


@pytest.mark.parametrize("name", list(CALLS))
def test_half_is_accepted_and_split_is_a_warning_alias(name):
    call = CALLS[name]
    half = call("half")
    with pytest.warns(FutureWarning, match='layout="split" is the earlier name of "half".*pass layout="half"') as record:
        alias = call("split")
    assert record[0].filename == __file__  # the warning points at the caller's line
    np.testing.assert_array_equal(alias, half)
    assert not np.array_equal(call("interleaved"), half)


def test_half_sinusoid_is_sines_then_cosines():
    table = pe.sinusoidal(np.arange(7), 6, layout="half", dtype=np.float64)
    angle = np.arange(7)[:, None] * 10000.0 ** (-np.arange(3) / 3)
    np.testing.assert_allclose(table, np.concatenate([np.sin(angle), np.cos(angle)], axis=-1), atol=1e-15)
    np.testing.assert_allclose(table, sinusoid(np.arange(7), 6, layout="half"), atol=1e-15)


def test_defaults_are_the_documented_ones():
    # sinusoid and TENER: the paper's interleaved order; the rotary family: LLaMA's halves.
    np.testing.assert_array_equal(pe.sinusoidal(np.arange(5), 8), CALLS["sinusoidal"]("interleaved"))
    np.testing.assert_array_equal(pe.tener_logits(Q, K, U, U), CALLS["tener_logits"]("interleaved"))
    np.testing.assert_array_equal(pe.rope(X), CALLS["rope"]("half"))


@pytest.mark.parametrize("name", ["sinusoidal", "rope"])
def test_an_unknown_layout_names_the_vocabulary(name):
    with pytest.raises(ValueError, match="layout must be one of .*'half'.*got 'neox'"):
        CALLS[name]("neox")


def _modules():
    torch_modules = pytest.importorskip("posenc.torch")
    modules = {
        "torch.RotaryEmbedding": lambda layout: torch_modules.RotaryEmbedding(8, layout=layout),
        "torch.XPos": lambda layout: torch_modules.XPos(8, layout=layout),
        "torch.SinusoidalEmbedding": lambda layout: torch_modules.SinusoidalEmbedding(8, layout=layout),
        "torch.TransformerXLRelative": lambda layout: torch_modules.TransformerXLRelative(2, 4, layout=layout),
        "torch.TENERRelative": lambda layout: torch_modules.TENERRelative(2, 4, layout=layout),
    }
    try:
        from flax import nnx

        import posenc.flax as flax_modules
    except ImportError:
        return modules
    return modules | {
        "flax.Rotary": lambda layout: flax_modules.Rotary(8, layout=layout),
        "flax.XPos": lambda layout: flax_modules.XPos(8, layout=layout),
        "flax.Sinusoidal": lambda layout: flax_modules.Sinusoidal(8, layout=layout),
        "flax.XL": lambda layout: flax_modules.XL(2, 4, layout=layout, rngs=nnx.Rngs(0)),
        "flax.TENER": lambda layout: flax_modules.TENER(2, 4, layout=layout, rngs=nnx.Rngs(0)),
    }


@pytest.mark.parametrize("name", ["torch.RotaryEmbedding", "torch.XPos", "torch.SinusoidalEmbedding", "torch.TransformerXLRelative",
                                  "torch.TENERRelative", "flax.Rotary", "flax.XPos", "flax.Sinusoidal", "flax.XL", "flax.TENER"])  # fmt: skip
def test_modules_take_split_as_the_functions_do_and_keep_half(name):
    modules = _modules()
    if name not in modules:
        pytest.skip(f"{name.split('.')[0]} is not installed")
    with pytest.warns(FutureWarning, match='layout="split" is the earlier name of "half"') as record:
        module = modules[name]("split")
    assert len(record) == 1
    if name.startswith("torch."):  # (flax's module constructor is the caller of a flax module's __init__)
        assert record[0].filename == __file__
    assert module.layout == "half"
