"""Every namespace form and every tracer: ``torch.compile(fullgraph=True)`` (inductor) through the
public functions, ``jax.jit`` with traced offsets and lengths, ``xp=`` as the framework module,
integers given as 0-d arrays. The expected values are the same calls made eagerly with
Python ints (themselves tested against the formulas elsewhere). Bad input: test_bad_inputs.py."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

import posenc as pe
from arrays import to_host
from formulas import rope_half_any

HAS_TORCH = importlib.util.find_spec("torch") is not None
HAS_JAX = importlib.util.find_spec("jax") is not None

# inductor imports a deprecated torch.jit helper of its own on first use.
INDUCTOR_WARNING = "ignore:`torch.jit.script_method` is deprecated:DeprecationWarning"


# --- torch.compile(fullgraph=True), inductor -------------------------------------------------


def _torch_cases():
    import torch

    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 6, 8, generator=g)
    table = torch.randn(32, 3, generator=g)
    slopes = torch.from_numpy(pe.alibi_slopes(3))
    cos, sin = pe.rope_cos_sin(torch.arange(6), pe.rope_frequencies(8)[0])
    offset = torch.tensor(5)
    keys = torch.tensor([[0, 0, 0, 1, 2, 3], [0, 1, 2, 3, 4, 5]])
    return {
        "rope": (lambda a, o: pe.rope(a, offset=o), (x, offset)),
        "rope[positions, interleaved, partial]": (
            lambda a, p: pe.rope(a, p, layout="interleaved", rotary_dim=4, scaling=pe.scaling.YaRN(4.0, 8)),
            (x, torch.arange(100, 106)),
        ),
        "rope[dynamic, traced switch]": (lambda a, o: pe.rope(a, offset=o, scaling=pe.scaling.DynamicNTK(2.0, 8)), (x, offset)),
        "rope[longrope, traced switch]": (
            lambda a, o: pe.rope(a, offset=o, scaling=pe.scaling.LongRoPE([1.0] * 4, [4.0] * 4, 8, factor=4.0)),
            (x, offset),
        ),
        "apply_rope": (lambda a, c, s: pe.apply_rope(a, c, s), (x, cos, sin)),
        "rope_cos_sin": (lambda p: pe.rope_cos_sin(p, [1.0, 0.1, 0.01], layout="interleaved"), (torch.arange(6),)),
        "rope_cos_sin[tensor inv_freq]": (lambda p, f: pe.rope_cos_sin(p, f), (torch.arange(6), torch.tensor([1.0, 0.1]))),
        "t5_bias": (lambda t, o: pe.t5_bias(t, 6, 9, offset=o, bidirectional=False), (table, offset)),
        "alibi_bias": (lambda s, o: pe.alibi_bias(s, 6, 9, offset=o), (slopes, offset)),
        "alibi_bias[per-token]": (lambda s, k: pe.alibi_bias(s, 1, 6, query_positions=k[:, -1:], key_positions=k), (slopes, keys)),
        "relative_bias": (lambda t: pe.relative_bias("deberta", t, 6, 6, max_distance=3, bucket_size=4, max_position=8), (table[:6],)),
        "shaw_logits": (lambda a, t, o: pe.shaw_logits(a, a, t, max_distance=2, offset=o), (x, torch.randn(5, 8, generator=g), offset)),
        "alibi_bias[per-row offset]": (lambda s, o: pe.alibi_bias(s, 1, 9, offset=o), (slopes, torch.tensor([5, 8]))),
        "shaw_logits[per-row offset]": (
            lambda a, t, o: pe.shaw_logits(a, a, t, max_distance=2, offset=o), (x, torch.randn(5, 8, generator=g), torch.tensor([0, 4])),
        ),
    }


TORCH_CASES = [
    "rope", "rope[positions, interleaved, partial]", "rope[dynamic, traced switch]", "rope[longrope, traced switch]",
    "apply_rope", "rope_cos_sin", "rope_cos_sin[tensor inv_freq]", "t5_bias", "alibi_bias", "alibi_bias[per-token]",
    "relative_bias", "shaw_logits", "alibi_bias[per-row offset]", "shaw_logits[per-row offset]",
]


@pytest.mark.skipif(not HAS_TORCH, reason="torch not installed")
@pytest.mark.filterwarnings(INDUCTOR_WARNING)
@pytest.mark.parametrize("name", TORCH_CASES)
def test_torch_compile_fullgraph_inductor(name):
    import torch

    fn, args = _torch_cases()[name]
    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, backend="inductor")
    got, want = compiled(*args), fn(*args)
    got, want = (got, want) if isinstance(got, tuple) else ((got,), (want,))
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not HAS_TORCH, reason="torch not installed")
@pytest.mark.filterwarnings(INDUCTOR_WARNING)
def test_torch_compile_gradients_through_the_custom_ops():
    import torch

    def loss(x, table, cos, sin):
        rotated = pe.rope(x, offset=torch.tensor(3)) + pe.apply_rope(x, cos, sin)
        return (rotated @ rotated.transpose(-1, -2) + pe.t5_bias(table, 6, 6)).square().sum()

    def inputs():
        g = torch.Generator().manual_seed(1)
        angles = torch.rand(6, 4, generator=g, dtype=torch.float64) * 6
        table = [torch.randn(2, 3, 6, 8, generator=g, dtype=torch.float64), torch.randn(32, 3, generator=g, dtype=torch.float64),
                 torch.cat([angles.cos(), angles.cos()], -1), torch.cat([angles.sin(), angles.sin()], -1)]
        return [t.requires_grad_() for t in table]

    torch._dynamo.reset()
    eager, compiled = inputs(), inputs()
    loss(*eager).backward()
    torch.compile(loss, fullgraph=True, backend="inductor")(*compiled).backward()
    for a, b in zip(eager, compiled, strict=True):
        assert b.grad is not None
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-9, atol=1e-9)


@pytest.mark.skipif(not HAS_TORCH, reason="torch not installed")
@pytest.mark.filterwarnings(INDUCTOR_WARNING)
def test_torch_compile_new_lengths_keep_working():
    # A second length makes torch.compile trace with symbolic sizes (automatic dynamic shapes).
    import torch

    def fn(x, table):
        n = x.shape[-2]
        return pe.rope(x, scaling=pe.scaling.DynamicNTK(2.0, 6)) @ x.transpose(-1, -2) + pe.t5_bias(table, n, n)

    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, backend="inductor")
    table = torch.randn(32, 2)
    for length in (5, 9, 13):
        x = torch.randn(2, length, 8)
        torch.testing.assert_close(compiled(x, table), fn(x, table), rtol=1e-5, atol=1e-5)


def _torch_shape_cases():
    """Calls whose sizes come from ``x``'s shape, as a model's do: under dynamic shapes (a
    second length, or ``dynamic=True``) the lengths are symbolic, and so under
    ``dynamic=True`` are the feature width, the tables' sizes and the float options
    (``base``, a scaling's fields) read from arguments or attributes."""
    import torch

    import posenc.torch as pt

    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    heads, dim = 3, 8
    dynamic, longrope = pe.scaling.DynamicNTK(2.0, 8), pe.scaling.LongRoPE([1.0] * 4, [4.0] * 4, 8, factor=4.0)
    table, slopes, u, v, rows, vec = r(32, heads), torch.from_numpy(pe.alibi_slopes(heads)), r(heads, 1, dim), r(heads, 1, dim), r(40, dim), r(heads, 79)
    rotary = pt.RotaryEmbedding(dim, base=500000.0, scaling=dynamic)
    n = lambda x: x.shape[-2]  # noqa: E731
    return {
        "rope": lambda x: pe.rope(x),
        "rope[yarn, base]": lambda x: pe.rope(x, base=500000.0, scaling=pe.scaling.YaRN(4.0, 8)),
        "rope[dynamic, seq_len from the shape]": lambda x: pe.rope(x, scaling=dynamic, seq_len=n(x) + 3),
        "rope[longrope, seq_len from the shape]": lambda x: pe.rope(x, scaling=longrope, seq_len=n(x)),
        "RotaryEmbedding[dynamic]": lambda x: rotary(x, x)[0],
        "rerotate": lambda x: pe.rerotate(x, 3, pe.rope_frequencies(dim)[0]),
        "axial_rope": lambda x: pe.axial_rope(x, torch.stack([torch.arange(n(x)), torch.arange(n(x))], -1)),
        "linear_attention": lambda x: pe.linear_attention(x.abs(), x.abs(), x, positions=torch.arange(n(x))),
        "rope_decay": lambda x: pe.rope_decay(torch.arange(n(x), dtype=torch.float64), dim),
        "sinusoidal": lambda x: x + pe.sinusoidal(n(x), dim, xp=torch, dtype=torch.float64),
        "t5_bias": lambda x: pe.t5_bias(table, n(x), n(x)),
        "alibi_bias": lambda x: pe.alibi_bias(slopes, n(x), n(x)),
        "xl_logits": lambda x: pe.xl_logits(x, x, rows[: n(x)], u, v),
        "tener_logits": lambda x: pe.tener_logits(x, x, u, v),
        "expand_bias": lambda x: pe.expand_bias(vec[:, : 2 * n(x) - 1], n(x), n(x)),
    }


@pytest.mark.skipif(not HAS_TORCH, reason="torch not installed")
# Dynamo warns that it traces through array-api-compat's lru_cache'd type checks (a pure
# function of the array's type: nothing to go stale).
@pytest.mark.filterwarnings("ignore:Dynamo detected a call to a `functools.lru_cache`")
@pytest.mark.parametrize("dynamic", [None, True], ids=["automatic", "dynamic=True"])
@pytest.mark.parametrize("name", list(_torch_shape_cases()) if HAS_TORCH else [])
def test_torch_compile_under_dynamic_shapes_gives_the_eager_bits(name, dynamic):
    """Three lengths through one compiled function (the second recompiles with symbolic
    sizes unless ``dynamic=True`` made them symbolic from the start, and the third compiles
    nothing): no graph break, and the eager call's bits. A length-dependent scaling's
    frequencies are computed when the op runs (``posenc::rope_rotate_at_length``), as the
    eager call computes them. (``xl_logits`` made a symbolic length a tensor with
    ``asarray``, which specialized it: one graph per length.)"""
    import torch
    from torch._dynamo.utils import counters

    fn = _torch_shape_cases()[name]
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(fn, fullgraph=True, dynamic=dynamic, backend="aot_eager")
    for length in (6, 9, 13):
        x = torch.randn(2, 3, length, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(length))
        assert torch.equal(compiled(x), fn(x)), length
    assert counters["stats"]["unique_graphs"] == (1 if dynamic else 2)


_FIRST_COMPILE = {
    "rope": "lambda x: pe.rope(x)",
    "t5_bias": "lambda x: pe.t5_bias(torch.ones(32, 3), x.shape[-2], x.shape[-2])",
}


@pytest.mark.skipif(not HAS_TORCH, reason="torch not installed")
@pytest.mark.parametrize("name", list(_FIRST_COMPILE))
def test_a_processs_first_compiled_call_is_not_compiled_again(name):
    """In a new process, a function compiled with ``dynamic=True`` and called first (before any
    eager call) compiles one graph for every length. posenc's caches of the index dtype and its
    range were filled while Dynamo traced that first call, which failed the graph's guard
    (``_FIXED_INDEX['array_api_compat.torch'] is None``, then ``not _TORCH_BOUNDS``) at the
    second call: two graphs, a whole recompile (checked in a child: this process has filled them)."""
    import subprocess
    import sys

    code = (
        "import torch, posenc as pe\n"
        "from torch._dynamo.utils import counters\n"
        f"fn = torch.compile({_FIRST_COMPILE[name]}, dynamic=True, fullgraph=True, backend='aot_eager')\n"
        "for length in (6, 9, 13):\n"
        "    fn(torch.randn(2, 3, length, 8))\n"
        "print(counters['stats']['unique_graphs'])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split()[-1] == "1", out.stdout


@pytest.mark.skipif(not HAS_TORCH, reason="torch not installed")
@pytest.mark.filterwarnings("ignore:Dynamo detected a call to a `functools.lru_cache`")
@pytest.mark.parametrize("dynamic", [None, True], ids=["automatic", "dynamic=True"])
@pytest.mark.parametrize("name", ["ShawRelative", "TransformerXLRelative", "TENERRelative", "DeBERTaRelative", "TUPE"])
def test_torch_compile_of_relative_logits_keeps_the_batch_symbolic(name, dynamic):
    """Three batch sizes through one compiled ``attend``: one graph (two, automatic), the
    eager bits. The batch shapes were checked as a set of sizes, whose hashing specialized a
    symbolic size: one graph per batch size, ``dynamic=True`` included."""
    import torch
    from torch._dynamo.utils import counters

    import posenc.torch as pt

    heads, dim = 3, 8
    module = {
        "ShawRelative": lambda: pt.ShawRelative(dim, max_distance=4),
        "TransformerXLRelative": lambda: pt.TransformerXLRelative(heads, dim),
        "TENERRelative": lambda: pt.TENERRelative(heads, dim),
        "DeBERTaRelative": lambda: pt.DeBERTaRelative(heads, dim, max_distance=4),
        "TUPE": lambda: pt.TUPE(heads, dim, max_positions=16),
    }[name]().double()
    fn = lambda q, k, v: module.attend(q, k, v, causal=True)  # noqa: E731
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(fn, fullgraph=True, dynamic=dynamic, backend="aot_eager")
    for batch in (2, 4, 5):
        q, k, v = torch.randn(3, batch, heads, 7, dim, dtype=torch.float64, generator=torch.Generator().manual_seed(batch)).unbind(0)
        assert torch.equal(compiled(q, k, v), fn(q, k, v)), batch
    assert counters["stats"]["unique_graphs"] == (1 if dynamic else 2)


@pytest.mark.skipif(not HAS_TORCH, reason="torch not installed")
@pytest.mark.filterwarnings(INDUCTOR_WARNING)
def test_a_rotary_module_with_dynamic_ntk_compiles_with_inductor_for_every_length():
    """The module computes ``seq_len`` from the shapes, a symbolic int once the length varies:
    it used to reach a constant function of the graph and stop the compile."""
    import torch

    import posenc.torch as pt

    module = pt.RotaryEmbedding(8, scaling=pe.scaling.DynamicNTK(2.0, 4))
    torch._dynamo.reset()
    compiled = torch.compile(lambda q: module(q, q)[0], fullgraph=True, backend="inductor")
    for length in (5, 9, 13):
        q = torch.randn(1, 2, length, 8, generator=torch.Generator().manual_seed(length))
        assert torch.equal(compiled(q), module(q, q)[0]), length


@pytest.mark.skipif(not HAS_TORCH, reason="torch not installed")
@pytest.mark.filterwarnings("ignore:Dynamo detected a call to a `functools.lru_cache`")
@pytest.mark.parametrize("given", ["offset", "positions", "per-row seq_len"])
def test_torch_compile_with_a_tensor_length_gives_the_eager_bits_and_gradient(given):
    """A length the compiled graph computes (a tensor ``offset``, the largest of tensor
    positions, per-row ``seq_len``) is read on the host when the op runs
    (``posenc::rope_rotate_at_lengths``): float64 used to differ from eager in a fifth of the
    elements (torch's ``pow``/``cos``/``sin``), by up to 9e-12 at offset 100,000."""
    import torch

    scalings = (pe.scaling.DynamicNTK(2.0, 64), pe.scaling.LongRoPE([1.0] * 32, np.linspace(1, 4, 32).tolist(), 64, factor=4.0))
    calls = {
        "offset": (lambda x, sc, n: pe.rope(x, offset=n, scaling=sc), lambda n: torch.tensor(n)),
        "positions": (lambda x, sc, p: pe.rope(x, p, scaling=sc), lambda n: torch.arange(4) * (n // 4) + 1),
        "per-row seq_len": (lambda x, sc, lengths: pe.rope(x, scaling=sc, seq_len=lengths, seq_axis="bhsd"), lambda n: torch.tensor([10, n])),
    }
    fn, argument = calls[given]
    for scaling in scalings:
        torch._dynamo.reset()
        compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
        for n in (12, 5000, 100000):
            x = torch.randn(2, 3, 4, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(n), requires_grad=True)
            got, want = compiled(x, scaling, argument(n)), fn(x, scaling, argument(n))
            assert torch.equal(got, want), (type(scaling).__name__, n)
            (got_grad,), (want_grad,) = torch.autograd.grad(got.sum(), x), torch.autograd.grad(want.sum(), x)
            assert torch.equal(got_grad, want_grad), (type(scaling).__name__, n)


@pytest.mark.skipif(not HAS_TORCH, reason="torch not installed")
@pytest.mark.filterwarnings("ignore:Dynamo detected a call to a `functools.lru_cache`")
@pytest.mark.parametrize("given", ["symbolic int", "tensor", "per-row tensor"])
def test_rope_frequencies_under_torch_compile_give_the_eager_table(given):
    """``rope_frequencies`` at a length the compiled graph holds: a size of a dynamic shape
    (with ``xp=torch``; it used to stop the compile) or a tensor (its frequencies came from
    torch's float64 ``pow``, an ulp off NumPy's in a few entries, even below the switch)."""
    import torch

    calls = {
        "symbolic int": (lambda sc, x: pe.rope_frequencies(64, scaling=sc, seq_len=x.shape[-2], xp=torch)[0], lambda n: torch.zeros(n, 2), lambda n: n),
        "tensor": (lambda sc, n: pe.rope_frequencies(64, scaling=sc, seq_len=n)[0], torch.tensor, lambda n: n),
        "per-row tensor": (lambda sc, n: pe.rope_frequencies(64, scaling=sc, seq_len=n)[0], lambda n: torch.tensor([6, n]), lambda n: np.array([6, n])),
    }
    fn, argument, eager_length = calls[given]
    for scaling in (pe.scaling.DynamicNTK(2.0, 8), pe.scaling.LongRoPE([1.0] * 32, np.linspace(1, 4, 32).tolist(), 8, factor=4.0)):
        torch._dynamo.reset()
        compiled = torch.compile(fn, fullgraph=True, dynamic=given == "symbolic int", backend="aot_eager")
        for n in (6, 30, 5000, 100000):
            want = pe.rope_frequencies(64, scaling=scaling, seq_len=eager_length(n))[0]
            assert np.array_equal(compiled(scaling, argument(n)).numpy(), want), (type(scaling).__name__, n)


@pytest.mark.skipif(not HAS_TORCH, reason="torch not installed")
@pytest.mark.parametrize("inverse", [False, True])
def test_the_length_op_gives_the_eager_bits(inverse):
    """``posenc::rope_rotate_at_length`` at a length: the eager ``rope`` at it (gradients: test_torch_ops.py)."""
    import torch

    from posenc.torch._ops import rope_rotate_at_length

    scaling = pe.scaling.LongRoPE([1.0, 2.0, 3.0], [4.0, 5.0, 6.0], 8, factor=4.0)
    x, positions = torch.randn(2, 6, 8, dtype=torch.float32), torch.arange(6) * 3
    for length in (8, 11):
        got = rope_rotate_at_length(x, positions, length, scaling=scaling, rotary_dim=6, base=100.0, layout="interleaved", inverse=inverse)
        want = pe.rope(x, positions, scaling=scaling, rotary_dim=6, base=100.0, layout="interleaved", seq_len=length, inverse=inverse)
        assert torch.equal(got, want), length


@pytest.mark.skipif(not HAS_TORCH, reason="torch not installed")
@pytest.mark.parametrize("strict", [True, False], ids=["strict", "non-strict"])
def test_torch_export_with_a_dynamic_sequence_gives_the_eager_bits(strict):
    """``torch.export`` with a ``Dim`` on the sequence axis: one program for every length
    (``int()`` of a size had specialized it; a length-dependent scaling's symbolic length had
    been made a tensor, specializing it too). Positions given without ``seq_axis`` guard
    against other axes of their length, which a ``Dim`` range refuses: name the axis. The
    modules' ``attend`` with ``offset=None`` (``k_len - q_len``, a symbolic size under
    non-strict export) had specialized the length (``int()``), and ``rope`` refused a
    symbolic ``offset`` (a ``TypeError`` from ``amin``)."""
    import torch
    from torch.export import Dim, export

    import posenc.torch as pt

    seq = Dim("seq", min=2, max=64)
    table, slopes = torch.randn(32, 4), torch.from_numpy(pe.alibi_slopes(4))
    attend = _Attend([pt.NoPE(), pt.RotaryEmbedding(16, scaling=pe.scaling.DynamicNTK(2.0, 8)), pt.XPos(16), pt.T5RelativeBias(4), pt.ALiBi(4)])
    calls = {
        "rope": (lambda x: pe.rope(x, offset=3), lambda n: (torch.randn(2, 4, n, 16),), ({2: seq},)),
        "rope[positions]": (lambda x, p: pe.rope(x, p, seq_axis="bhsd"), lambda n: (torch.randn(2, 4, n, 16), torch.arange(n) * 2), ({2: seq}, {0: seq})),
        "rope[dynamic]": (lambda x: pe.rope(x, offset=3, scaling=pe.scaling.DynamicNTK(2.0, 8)), lambda n: (torch.randn(2, 4, n, 16),), ({2: seq},)),
        "biases": (lambda x: pe.t5_bias(table, x.shape[-2], x.shape[-2]) + pe.alibi_bias(slopes, x.shape[-2], x.shape[-2]), lambda n: (torch.randn(n, 4),), ({0: seq},)),
        "rope[offset from the shape]": (lambda x: pe.rope(x, offset=x.shape[-2] - 1), lambda n: (torch.randn(2, 4, n, 16),), ({2: seq},)),
        "attend": (attend, lambda n: (torch.randn(2, 4, n, 16),), ({2: seq},)),
    }
    for name, (fn, make, dynamic_shapes) in calls.items():
        fn(*make(6))  # fills posenc's caches of dtype ranges first: strict export warns of the first fill as a side effect
        program = export(_Call(fn), make(6), strict=strict, dynamic_shapes=dynamic_shapes).module()
        for length in (3, 6, 17):
            args = make(length)
            assert torch.equal(program(*args), fn(*args)), (name, length)


if HAS_TORCH:
    import torch as _torch

    class _Call(_torch.nn.Module):
        """A module whose forward is ``fn`` of one or two tensors (what ``torch.export`` takes)."""

        def __init__(self, fn):
            super().__init__()
            self.fn = fn

        def forward(self, x, p=None):
            return self.fn(x) if p is None else self.fn(x, p)

    class _Attend(_torch.nn.Module):
        """The sum of ``modules``' causal ``attend(x, x, x)``."""

        def __init__(self, modules):
            super().__init__()
            self.positional = _torch.nn.ModuleList(modules)

        def forward(self, x):
            return sum(m.attend(x, x, x, causal=True) for m in self.positional)


# --- torch transforms a kernel would defeat: the reference serves them -------------------------


def _hot_calls(torch):
    """The kernels' calls, each a function of one ``[2, 4, 5, 8]`` tensor (the bias tables are built from it)."""
    cos, sin = pe.rope_cos_sin(torch.arange(5), pe.rope_frequencies(8)[0])
    return {
        "rope": lambda x: pe.rope(x, offset=3),
        "apply_rope": lambda x: pe.apply_rope(x, cos, sin),
        "t5_bias": lambda x: pe.t5_bias(x[0, :, :2, 0].T.repeat(8, 1), 5, 7),  # a [32, 2] table
        "alibi_bias": lambda x: pe.alibi_bias(x[0, :, 0, 0], 5, 7),
        "rerotate": lambda x: pe.rerotate(x, 2, pe.rope_frequencies(8)[0]),
    }


@pytest.mark.skipif(not HAS_TORCH, reason="torch not installed")
@pytest.mark.filterwarnings("ignore:`torch.jit.(script|trace)` is deprecated:DeprecationWarning")
@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning" if HAS_TORCH else "default")
@pytest.mark.parametrize("name", ["rope", "apply_rope", "t5_bias", "alibi_bias", "rerotate"])
def test_torch_transforms_a_kernel_would_defeat_take_the_reference(name):
    """Forward-mode AD (a kernel dropped the tangent: silently a constant), ``torch.func``
    (its wrapped tensors have no storage), ``torch.jit.trace`` (it recorded the kernel's
    result as a constant) and fake tensors (no data): each equals the reference's result."""
    import torch
    import torch.autograd.forward_ad as fwad
    from torch._subclasses.fake_tensor import FakeTensorMode

    fn = _hot_calls(torch)[name]
    g = torch.Generator().manual_seed(0)
    x, y, tangent = (torch.randn(2, 4, 5, 8, dtype=torch.float64, generator=g) for _ in range(3))
    with pe.use_backend("reference"):
        _, want_tangent = torch.func.jvp(fn, (x,), (tangent,))
        want_y = fn(y)
    with fwad.dual_level():
        got_tangent = fwad.unpack_dual(fn(fwad.make_dual(x, tangent))).tangent
    assert got_tangent is not None
    torch.testing.assert_close(got_tangent, want_tangent, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(torch.func.jvp(fn, (x,), (tangent,))[1], want_tangent, rtol=1e-12, atol=1e-12)
    batched = torch.func.vmap(fn)(torch.stack([x, y]))
    torch.testing.assert_close(batched, torch.stack([fn(x), fn(y)]), rtol=1e-12, atol=1e-12)
    gradient = torch.func.grad(lambda v: fn(v).square().sum())(x)
    torch.testing.assert_close(gradient, torch.autograd.grad(fn(x.requires_grad_()).square().sum(), x)[0], rtol=1e-12, atol=1e-12)
    traced = torch.jit.trace(fn, (x.detach(),), check_trace=False)
    torch.testing.assert_close(traced(y), want_y, rtol=1e-12, atol=1e-12)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:  # (apply_rope's tables are real)
        assert fn(mode.from_tensor(y)).shape == want_y.shape


@pytest.mark.skipif(not HAS_TORCH, reason="torch not installed")
@pytest.mark.parametrize("name", [*TORCH_CASES, "rope[float positions]", "t5_bias[per-token]", "positions_from_cu_seqlens"])
def test_torch_tensors_without_data_give_the_eager_shapes(name):
    """Tensors on the meta device and fake tensors hold no values: the checks that read
    positions, offsets and lengths wait as under ``torch.compile``, and each call gives the
    eager call's shape and dtype, on the meta device or fake (a tensor offset, per-row
    offsets, per-token or float positions had raised torch's RuntimeError "Tensor.item()
    cannot be called on meta tensors", or DataDependentOutputException)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    cases = {
        **_torch_cases(),
        "rope[float positions]": (lambda a, p: pe.rope(a, p), (torch.ones(2, 6, 8), torch.linspace(0.5, 1e6, 6))),
        "t5_bias[per-token]": (lambda t, p: pe.t5_bias(t, 6, 6, query_positions=p, key_positions=p), (torch.randn(32, 3), torch.arange(6))),
        "positions_from_cu_seqlens": (lambda c: pe.positions_from_cu_seqlens(c, 6), (torch.tensor([0, 2, 6]),)),
    }
    fn, args = cases[name]
    want = fn(*args)
    want = want if isinstance(want, tuple) else (want,)
    got = fn(*(a.to("meta") for a in args))
    for g, w in zip(got if isinstance(got, tuple) else (got,), want, strict=True):
        assert g.device.type == "meta" and g.dtype == w.dtype and g.shape == w.shape
    with FakeTensorMode() as mode:
        got = fn(*(mode.from_tensor(a) for a in args))
    for g, w in zip(got if isinstance(got, tuple) else (got,), want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape


@pytest.mark.skipif(not HAS_TORCH, reason="torch not installed")
def test_torch_out_without_data_is_written():
    """``out=`` on the meta device or fake is the result (its memory, data pointer 0, is not
    compared with the inputs'): the overlap check had built a NumPy view at address 0 and
    raised NumPy's ValueError "data is NULL but array contains data"."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    def calls(x, table):
        inv = pe.rope_frequencies(8)[0]  # (frequencies are read on the host)
        return {
            "rope": lambda out: pe.rope(x, offset=3, out=out),
            "rope in place": lambda _: pe.rope(x, offset=3, out=x),
            "rerotate": lambda out: pe.rerotate(x, 3, inv, out=out),
            "apply_rope": lambda out: pe.apply_rope(x, *pe.rope_cos_sin(torch.arange(6, device=x.device), inv), out=out),
            "t5_bias": lambda out: pe.t5_bias(table, 2, 8, out=out[:, :2]),
        }

    x, table = torch.ones(2, 6, 8, device="meta"), torch.ones(32, 2, device="meta")
    for name, call in calls(x, table).items():
        out = torch.empty(2, 6, 8, device="meta")
        assert call(out).device.type == "meta", name
    with FakeTensorMode():
        x, table = torch.ones(2, 6, 8), torch.ones(32, 2)
        for name, call in calls(x, table).items():
            assert call(torch.empty(2, 6, 8)).shape[-1] == 8, name


def _vmapped_over_positions(torch):
    """Calls of ``(x, positions, offset)``, one sample each: positions, a per-sample tensor
    offset or per-token positions are what ``torch.func.vmap`` batches."""
    inv = pe.rope_frequencies(8, xp=torch, dtype=torch.float64)[0]
    table, slopes = torch.linspace(-1, 1, 64, dtype=torch.float64).reshape(32, 2), torch.tensor([0.5, 0.25], dtype=torch.float64)
    return {
        "rope float positions": lambda x, p, o: pe.rope(x, p.double() + 0.5),
        "rope int positions": lambda x, p, o: pe.rope(x, p),
        "rope tensor offset": lambda x, p, o: pe.rope(x, offset=o),
        "rope DynamicNTK": lambda x, p, o: pe.rope(x, p, scaling=pe.scaling.DynamicNTK(2.0, 4)),
        "rope_cos_sin": lambda x, p, o: pe.rope_cos_sin(p.double() + 0.5, inv)[0],
        "sinusoidal": lambda x, p, o: pe.sinusoidal(p.double() + 0.5, 8, dtype=torch.float64),
        "xpos_scale": lambda x, p, o: pe.xpos_scale(p.double() + 0.5, 8, dtype=torch.float64),
        "t5_bias": lambda x, p, o: pe.t5_bias(table, 5, 5, query_positions=p, key_positions=p),
        "alibi_bias": lambda x, p, o: pe.alibi_bias(slopes, 5, 5, query_positions=p, key_positions=p),
    }


@pytest.mark.skipif(not HAS_TORCH, reason="torch not installed")
@pytest.mark.parametrize(
    "name",
    ["rope float positions", "rope int positions", "rope tensor offset", "rope DynamicNTK", "rope_cos_sin", "sinusoidal", "xpos_scale", "t5_bias", "alibi_bias"],
)
def test_torch_vmap_over_positions_equals_a_loop(name):
    """Positions are what a validation check reads (finiteness, ranges, a length): under
    ``torch.func.vmap`` a batched tensor cannot be read, so those checks wait as they do
    under ``torch.compile``, and the batch equals one call per sample."""
    import torch

    fn = _vmapped_over_positions(torch)[name]
    x = torch.randn(3, 5, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    positions = torch.tensor([[0, 1, 2, 3, 4], [7, 3, 9, 1, 0], [100, 200, 300, 400, 500]])
    offsets = torch.tensor([1, 50, 900])
    batched = torch.func.vmap(fn)(x, positions, offsets)
    looped = torch.stack([fn(x[i], positions[i], offsets[i]) for i in range(3)])
    torch.testing.assert_close(batched, looped, rtol=1e-12, atol=1e-12)


# --- jax.jit with traced offsets and lengths ---------------------------------------------------


def _jax_cases(rng):
    f = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    x, table, slopes = f(2, 6, 8), f(32, 2), pe.alibi_slopes(2)
    return {
        "rope": (lambda a, o: pe.rope(a, offset=o), (x,)),
        "rope[dynamic]": (lambda a, o: pe.rope(a, offset=o, scaling=pe.scaling.DynamicNTK(2.0, 8)), (x,)),
        "rope[longrope, seq_len]": (
            lambda a, o: pe.rope(a, scaling=pe.scaling.LongRoPE([1.0] * 4, [4.0] * 4, 8), seq_len=o + 6), (x,),
        ),
        "relative_positions": (lambda o: pe.relative_positions(3, 4, offset=o, xp=__import__("jax.numpy").numpy), ()),
        "t5_bias": (lambda t, o: pe.t5_bias(t, 6, 9, offset=o), (table,)),
        "alibi_bias": (lambda s, o: pe.alibi_bias(s, 6, 9, offset=o), (slopes,)),
        "alibi_bias[per-token]": (
            lambda s, k, o: pe.alibi_bias(s, 2, 4, offset=o, key_positions=k), (slopes, np.array([[0, 0, 1, 2]], dtype=np.int32)),
        ),
        "relative_bias_vector": (lambda t, o: pe.relative_bias_vector("shaw", t, 4, 5, offset=o, max_distance=2), (f(5, 2),)),
        "shaw_logits": (lambda a, t, o: pe.shaw_logits(a, a, t, max_distance=2, offset=o), (x, f(5, 8))),
        "shaw_output": (lambda w, v, t, o: pe.shaw_output(w, v, t, max_distance=2, offset=o), (f(2, 6, 6), x, f(5, 8))),
        "deberta_logits": (lambda a, p, o: pe.deberta_logits(a, a, p, p, max_distance=2, offset=o), (x, f(2, 4, 8))),
        "tener_logits": (lambda a, u, o: pe.tener_logits(a, a, u, u, offset=o), (x, f(2, 1, 8))),
        "apply_absolute": (lambda a, t, o: pe.apply_absolute(a, t, offset=o), (x, f(20, 8))),
        "rope_frequencies[dynamic]": (lambda o: pe.rope_frequencies(8, scaling=pe.scaling.DynamicNTK(4.0, 8), seq_len=o + 20)[0], ()),
    }


@pytest.mark.skipif(not HAS_JAX, reason="jax not installed")
@pytest.mark.parametrize("offset", [3, 9])
@pytest.mark.parametrize("name", list(_jax_cases(np.random.default_rng(0))))
def test_jax_jit_with_a_traced_offset(name, offset, rng):
    import jax
    import jax.numpy as jnp

    fn, args = _jax_cases(rng)[name]
    want = fn(*args, offset)
    got = jax.jit(fn)(*(jnp.asarray(a) for a in args), jnp.asarray(offset))
    assert np.asarray(got).shape == np.shape(want)
    np.testing.assert_allclose(np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64), rtol=3e-5, atol=3e-5)


@pytest.mark.skipif(not HAS_JAX, reason="jax not installed")
@pytest.mark.parametrize("scaling", [pe.scaling.DynamicNTK(2.0, 8), pe.scaling.LongRoPE([1.0] * 8, [4.0] * 8, 8, factor=4.0)])
def test_jax_jit_with_a_static_offset_gives_the_eager_bits_under_a_length_scaling(scaling, rng):
    """With no positions and a Python offset, the length is ``offset + seq`` however the
    positions are traced: the jitted call takes the host frequencies, as the eager one."""
    import jax
    import jax.numpy as jnp

    x = rng.standard_normal((1, 4, 6, 16)).astype(np.float32)
    for offset in (0, 5, 1000):  # below the original length 8, and past it
        jitted = jax.jit(lambda a, offset=offset: pe.rope(a, offset=offset, scaling=scaling))(jnp.asarray(x))
        np.testing.assert_array_equal(np.asarray(jitted), pe.rope(x, offset=offset, scaling=scaling))


@pytest.mark.skipif(not HAS_JAX, reason="jax not installed")
@pytest.mark.parametrize("scaling", [pe.scaling.DynamicNTK(2.0, 8), pe.scaling.LongRoPE([1.0] * 8, [4.0] * 8, 8, factor=4.0)])
def test_jax_traced_lengths_give_the_eager_bits_on_the_cpu(scaling, rng):
    """A traced offset or ``seq_len`` (a decode loop under ``jit``, ``scan``, ``vmap``): the
    host call reads the length when it runs and rotates at the eager call's frequencies.
    (It was the traced path's frequencies and tables: 30-56% of float32 elements off by up to
    6.6e-7 without x64, an ulp of a frequency with it.)"""
    import jax
    import jax.numpy as jnp

    x = rng.standard_normal((1, 4, 6, 16)).astype(np.float32)
    by_offset = jax.jit(lambda a, o: pe.rope(a, offset=o, scaling=scaling))
    by_length = jax.jit(lambda a, o, n: pe.rope(a, offset=o, scaling=scaling, seq_len=n))
    for offset in (0, 5, 1000, 1_000_003):
        want = pe.rope(x, offset=offset, scaling=scaling)
        np.testing.assert_array_equal(np.asarray(by_offset(x, jnp.asarray(offset))), want)
        np.testing.assert_array_equal(np.asarray(by_length(x, jnp.asarray(offset), jnp.asarray(offset + 6))), want)
    steps = jnp.arange(10, 14)
    _, rows = jax.jit(lambda: jax.lax.scan(lambda c, t: (c, pe.rope(jnp.asarray(x[:, :, :1]), offset=t, scaling=scaling)), 0, steps))()
    np.testing.assert_array_equal(np.asarray(rows), np.stack([pe.rope(x[:, :, :1], offset=int(t), scaling=scaling) for t in steps]))
    batched = jax.vmap(lambda o: pe.rope(jnp.asarray(x), offset=o, scaling=scaling))(jnp.asarray([3, 40]))
    np.testing.assert_array_equal(np.asarray(batched), np.stack([pe.rope(x, offset=o, scaling=scaling) for o in (3, 40)]))
    gradient = jax.grad(lambda a, o: (pe.rope(a, offset=o, scaling=scaling) ** 2).sum())(jnp.asarray(x), jnp.asarray(1000))
    with pe.use_backend("reference"):
        want = jax.grad(lambda a, o: (pe.rope(a, offset=o, scaling=scaling) ** 2).sum())(jnp.asarray(x), jnp.asarray(1000))
    np.testing.assert_allclose(np.asarray(gradient), np.asarray(want), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("tracer", ["jax.jit", "jax.jit reference", "torch.compile", "dask"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_a_length_from_traced_float_positions_is_the_eager_one(tracer, dtype):
    """The length of traced float positions, ``ceil(max) + 1``, is computed in the widest
    float: in float16 (bfloat16) ``2048 + 1`` rounded to 2048, so LongRoPE of original length
    2048 at positions up to 2048 kept the short factors under ``jax.jit`` (the CPU kernel and
    the reference of other devices), ``torch.compile`` and Dask (4.0 off), and the JAX CPU
    call took the reference instead of the eager bits."""
    pytest.importorskip({"torch.compile": "torch", "dask": "dask"}.get(tracer, "jax"))
    import ml_dtypes

    scaling = pe.scaling.LongRoPE([1.0] * 8, [4.0 + i for i in range(8)], 2048, factor=4.0)
    x = np.random.default_rng(0).standard_normal((1, 4, 16)).astype(np.float32)
    positions = np.array([2045, 2046, 2047, 2048], dtype=ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype)
    want = pe.rope(x, positions.astype(np.float64), scaling=scaling)
    if tracer == "jax.jit":
        import jax

        got = jax.jit(lambda a, p: pe.rope(a, p, scaling=scaling))(x, positions)
    elif tracer == "jax.jit reference":
        import jax

        with pe.use_backend("reference"):
            got = jax.jit(lambda a, p: pe.rope(a, p, scaling=scaling))(x, positions)
        np.testing.assert_allclose(to_host(got), want, rtol=0, atol=1e-6)  # (angles by the split reduction: not the bits)
        return
    elif tracer == "torch.compile":
        import torch

        compiled = torch.compile(lambda a, p: pe.rope(a, p, scaling=scaling), fullgraph=True, backend="eager")
        got = compiled(torch.from_numpy(x), torch.from_numpy(positions.astype(np.float32)).to(getattr(torch, dtype)))
    else:
        import dask.array as da

        got = pe.rope(da.from_array(x), da.from_array(positions, chunks=2), scaling=scaling).compute()
    np.testing.assert_array_equal(to_host(got), want)


@pytest.mark.parametrize("call", ["numpy", "jax", "jax.jit", "torch", "array-api-strict"])
@pytest.mark.parametrize("offset", ["int", "per row"])
def test_float_positions_plus_an_offset_are_summed_exactly(call, offset):
    """Float positions plus ``offset`` are summed in the widest float: in float16
    ``2048 + 3`` rounded to 2052 (1.7 off; per-row offsets of JAX and torch arrays too, where
    NumPy's promotion to float64 had summed them exactly), the offset cast to it (the Array
    API promotes no integer array with a float one: array-api-strict raised TypeError)."""
    pytest.importorskip({"numpy": "numpy", "torch": "torch", "array-api-strict": "array_api_strict"}.get(call, "jax"))
    x = np.random.default_rng(0).standard_normal((2, 4, 16)).astype(np.float32)
    positions = np.array([2045, 2046, 2047, 2048], dtype=np.float16)
    shift = 3 if offset == "int" else np.array([0, 3])
    want = pe.rope(x, positions.astype(np.float64), offset=shift)
    if call == "numpy":
        got = pe.rope(x, positions, offset=shift)
    elif call == "torch":
        import torch

        got = pe.rope(torch.from_numpy(x), torch.from_numpy(positions), offset=shift if offset == "int" else torch.from_numpy(shift))
    elif call == "array-api-strict":
        import array_api_strict as xp

        got = pe.rope(xp.asarray(x), xp.asarray(positions.astype(np.float32)), offset=shift if offset == "int" else xp.asarray(shift))  # (no float16)
    else:
        import jax
        import jax.numpy as jnp

        arrays = (jnp.asarray(x), jnp.asarray(positions), shift if offset == "int" else jnp.asarray(shift))
        if call == "jax":
            got = pe.rope(*arrays[:2], offset=arrays[2])
        else:
            got = jax.jit(lambda a, p, o: pe.rope(a, p, offset=o))(*arrays[:2], shift if offset == "int" else arrays[2])
    np.testing.assert_allclose(to_host(got), want, rtol=0, atol=1e-6)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # (NumPy's cos of the NaN angle)
@pytest.mark.parametrize("tracer", ["jax.jit", "torch.compile", "dask"])
def test_a_non_finite_traced_position_gives_its_row_nan_under_a_length_scaling(tracer):
    """A NaN or infinite traced position (the eager call refuses it) gives its row NaN, as
    without a scaling; its length counts as 0, the original frequencies for the other rows.
    The host ops that read the length had failed on int(nan) (torch.compile, Dask; JAX once
    its float lengths went to the host op)."""
    pytest.importorskip({"jax.jit": "jax", "torch.compile": "torch", "dask": "dask"}[tracer])
    scaling = pe.scaling.DynamicNTK(2.0, 8)
    x = np.random.default_rng(0).standard_normal((1, 3, 16)).astype(np.float32)
    for bad in (np.nan, np.inf):
        positions = np.array([0.0, bad, 20.0], dtype=np.float32)
        if tracer == "jax.jit":
            import jax

            got = jax.jit(lambda a, p: pe.rope(a, p, scaling=scaling))(x, positions)
        elif tracer == "torch.compile":
            import torch

            compiled = torch.compile(lambda a, p: pe.rope(a, p, scaling=scaling), fullgraph=True, backend="eager")
            got = compiled(torch.from_numpy(x), torch.from_numpy(positions))
        else:
            import dask.array as da

            got = pe.rope(da.from_array(x), da.from_array(positions), scaling=scaling).compute()
        got = to_host(got)
        assert np.isnan(got[:, 1]).all()
        np.testing.assert_allclose(got[:, ::2], pe.rope(x[:, ::2], positions[::2]), rtol=1e-6, atol=1e-6)


@pytest.mark.skipif(not HAS_JAX, reason="jax not installed")
def test_jax_traced_lengths_of_a_scaling_subclass_and_of_an_empty_batch():
    """A subclass of a scaling cannot be named to the host call (its name reads back as
    another class): the traced path computes it. An empty vmapped batch of lengths is empty."""
    import dataclasses

    import jax
    import jax.numpy as jnp

    @dataclasses.dataclass(frozen=True)
    class Mine(pe.scaling.DynamicNTK):
        pass

    x = np.random.default_rng(0).standard_normal((1, 6, 8)).astype(np.float32)
    got = jax.jit(lambda a, o: pe.rope(a, offset=o, scaling=Mine(2.0, 8)))(x, jnp.asarray(20))
    np.testing.assert_allclose(np.asarray(got), pe.rope(x, offset=20, scaling=Mine(2.0, 8)), rtol=0, atol=1e-6)
    empty = jax.vmap(lambda n: pe.rope(jnp.ones((5, 8)), seq_len=n, scaling=pe.scaling.DynamicNTK(2.0, 8)))(jnp.zeros((0,), jnp.int32))
    assert empty.shape == (0, 5, 8)


@pytest.mark.skipif(not HAS_JAX, reason="jax not installed")
def test_jax_tangents_and_cotangents_may_be_numpy_arrays():
    import jax
    import jax.numpy as jnp

    x = jnp.ones((2, 3, 5, 8), jnp.float32)
    fn = lambda a: pe.rope(a, offset=3)  # noqa: E731
    ones = np.ones(x.shape, np.float32)
    np.testing.assert_array_equal(np.asarray(jax.jvp(fn, (x,), (ones,))[1]), np.asarray(jax.jvp(fn, (x,), (jnp.asarray(ones),))[1]))
    np.testing.assert_array_equal(np.asarray(jax.vjp(fn, x)[1](ones)[0]), np.asarray(jax.vjp(fn, x)[1](jnp.asarray(ones))[0]))


@pytest.mark.skipif(not HAS_JAX, reason="jax not installed")
def test_jax_grad_reaches_learned_frequencies(rng):
    import jax
    import jax.numpy as jnp

    x = jnp.asarray(rng.standard_normal((5, 8)).astype(np.float32))
    inv_freq = jnp.asarray([1.0, 0.3, 0.1, 0.01])
    positions = jnp.arange(5)

    def ours(f):
        cos, sin = pe.rope_cos_sin(positions, f)
        return jnp.sum(pe.apply_rope(x, cos, sin) ** 3)

    def naive(f):
        return jnp.sum(rope_half_any(x, positions[:, None] * f) ** 3)

    np.testing.assert_allclose(np.asarray(jax.jit(jax.grad(ours))(inv_freq)), np.asarray(jax.grad(naive)(inv_freq)), rtol=1e-4, atol=1e-4)


# --- xp= as the framework module ---------------------------------------------------------------

# Every creator, called with an array namespace or module ``xp``.
CREATOR_CALLS = {
    "alibi_slopes": lambda xp: pe.alibi_slopes(6, xp=xp),
    "nezha_table": lambda xp: pe.nezha_table(3, 4, xp=xp),
    "relative_positions": lambda xp: pe.relative_positions(3, 4, offset=1, xp=xp),
    "rope_frequencies": lambda xp: pe.rope_frequencies(8, scaling=pe.scaling.Linear(2.0), xp=xp)[0],
    "sinusoidal": lambda xp: pe.sinusoidal(5, 8, xp=xp),
    "floater": lambda xp: pe.floater(3, 4, substeps=4, xp=xp),
    "rope_decay": lambda xp: pe.rope_decay(4, 8, xp=xp),
}


def _framework_modules():
    modules = [("numpy", "numpy")]
    if HAS_TORCH:
        modules.append(("torch", "torch"))
    if HAS_JAX:
        modules.append(("jax.numpy", "jax.numpy"))
    if importlib.util.find_spec("cupy") is not None:
        modules.append(("cupy", "cupy"))
    return modules


@pytest.mark.parametrize("module_name", [m for m, _ in _framework_modules()])
@pytest.mark.parametrize("creator", sorted(CREATOR_CALLS))
def test_xp_may_be_the_framework_module(module_name, creator):
    import importlib

    from array_api_compat import array_namespace

    module = importlib.import_module(module_name)
    namespace = array_namespace(module.asarray([1.0]))
    by_module, by_namespace = CREATOR_CALLS[creator](module), CREATOR_CALLS[creator](namespace)
    assert type(by_module) is type(by_namespace) and by_module.dtype == by_namespace.dtype
    np.testing.assert_array_equal(to_host(by_module), to_host(by_namespace))  # (CuPy: no np.asarray)


@pytest.mark.skipif(not HAS_TORCH, reason="torch not installed")
def test_xp_torch_with_torch_dtypes():
    import torch

    assert pe.alibi_slopes(6, xp=torch, dtype=torch.float64).dtype == torch.float64
    assert pe.rope_frequencies(8, xp=torch, dtype=torch.float64)[0].dtype == torch.float64
    assert pe.sinusoidal(4, 8, xp=torch, dtype=torch.bfloat16).dtype == torch.bfloat16
    assert pe.relative_positions(2, 3, xp=torch, dtype=torch.int32).dtype == torch.int32
    torch.testing.assert_close(pe.relative_positions(2, 3, offset=1, xp=torch), torch.tensor([[1, 0, -1], [2, 1, 0]]))


# --- integers as 0-d arrays -------------------------------------------------------------------


def _zero_d(kind, value):
    if kind == "numpy":
        return np.asarray(value)
    import torch

    return torch.tensor(value)


@pytest.mark.parametrize("kind", ["numpy"] + (["torch"] if HAS_TORCH else []))
def test_zero_d_integer_arrays_count_as_their_integer(kind, rng):
    x = rng.standard_normal((2, 5, 8))
    table = rng.standard_normal((32, 2))
    dyn = pe.scaling.DynamicNTK(2.0, 4)
    z = lambda v: _zero_d(kind, v)  # noqa: E731
    np.testing.assert_array_equal(pe.rope(x, offset=z(7)), pe.rope(x, offset=7))
    np.testing.assert_array_equal(pe.rope(x, scaling=dyn, seq_len=z(40)), pe.rope(x, scaling=dyn, seq_len=40))
    np.testing.assert_array_equal(pe.t5_bias(table, z(3), z(4), offset=z(2)), pe.t5_bias(table, 3, 4, offset=2))
    np.testing.assert_array_equal(pe.relative_positions(z(2), 3, offset=z(-1)), pe.relative_positions(2, 3, offset=-1))
    np.testing.assert_array_equal(pe.rope_frequencies(8, scaling=dyn, seq_len=z(9))[0], pe.rope_frequencies(8, scaling=dyn, seq_len=9)[0])


@pytest.mark.skipif(not HAS_TORCH, reason="torch not installed")
@pytest.mark.filterwarnings("ignore:Dynamo detected a call to a `functools.lru_cache`")
def test_torch_compile_of_shaw_output_with_one_offset_per_row_keeps_the_batch_symbolic():
    """``shaw_output`` of one offset per batch row under ``dynamic=True``: batches of 2, 3
    and 5 rows through one graph, the eager bits and gradients. Its rows had been a Python
    loop of one Toeplitz scatter each, unrolled to their count, and the offsets' check
    formed an array of the lengths (``asarray``), specializing them: a graph per batch size."""
    import torch
    from torch._dynamo.utils import counters

    fn = lambda w, v, t, o: pe.shaw_output(w, v, t, max_distance=3, offset=o)  # noqa: E731
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(fn, fullgraph=True, dynamic=True, backend="aot_eager")
    for batch in (2, 3, 5):
        g = torch.Generator().manual_seed(batch)
        weights = torch.rand(batch, 4, 6, 9, dtype=torch.float64, generator=g).requires_grad_()
        v, table = torch.randn(batch, 4, 9, 8, dtype=torch.float64, generator=g), torch.randn(7, 8, dtype=torch.float64, generator=g)
        offsets = torch.arange(batch) * 5 - 4
        want = fn(weights, v, table, offsets)
        got = compiled(weights, v, table, offsets)
        assert torch.equal(got, want), batch
        assert torch.equal(torch.autograd.grad(got.sum(), weights)[0], torch.autograd.grad(want.sum(), weights)[0]), batch
    assert counters["stats"]["unique_graphs"] == 1


@pytest.mark.skipif(not HAS_TORCH, reason="torch not installed")
@pytest.mark.filterwarnings("ignore:Dynamo detected a call to a `functools.lru_cache`")
@pytest.mark.parametrize("heads", [True, False], ids=["per-head uq, uk", "uq, uk without heads"])
def test_torch_compile_of_tupe_logits_with_one_offset_per_row_keeps_the_batch_symbolic(heads):
    """``tupe_logits`` of one offset per batch row under ``dynamic=True``: batches of 2, 3
    and 5 rows through one graph, the eager bits and gradients. Its rows' position terms had
    been a Python loop of one product each (a batched product rounds apart), unrolled to
    their count: a graph per batch size ('tensor k size mismatch at index 0')."""
    import torch
    from torch._dynamo.utils import counters

    fn = lambda q, k, p, uq, uk, o: pe.tupe_logits(q, k, p, uq, uk, offset=o)  # noqa: E731
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(fn, fullgraph=True, dynamic=True, backend="aot_eager")
    for batch in (2, 3, 5):
        g = torch.Generator().manual_seed(batch)
        r = lambda *shape: torch.randn(*shape, generator=g).requires_grad_()  # noqa: E731
        table = (4,) if heads else ()
        q, k, p, uq, uk = r(batch, 4, 3, 8), r(batch, 4, 5, 8), r(12, 6), r(*table, 6, 4), r(*table, 6, 4)
        offsets = torch.arange(batch) % 4 + 2
        want = fn(q, k, p, uq, uk, offsets)
        got = compiled(q, k, p, uq, uk, offsets)
        assert torch.equal(got, want), batch
        for a, b in zip(torch.autograd.grad((got * got).sum(), (q, k, p, uq, uk)), torch.autograd.grad((want * want).sum(), (q, k, p, uq, uk))):
            assert torch.equal(a, b), batch
    assert counters["stats"]["unique_graphs"] == 1


@pytest.mark.skipif(not HAS_TORCH, reason="torch not installed")
@pytest.mark.filterwarnings("ignore:Dynamo detected a call to a `functools.lru_cache`")
@pytest.mark.parametrize("path", ["tener_logits", "TENERRelative.attend"])
def test_torch_compile_of_tener_with_one_offset_per_row_keeps_the_batch_symbolic(path):
    """``tener_logits`` of one offset per batch row (and ``TENERRelative``'s causal
    ``attend``) under ``fullgraph=True, dynamic=True``: batches of 2, 3 and 5 rows through
    one graph (each row's product is one op for every row, ``posenc::tener_row_terms``, not
    a loop unrolled to their count), the eager bits and gradients."""
    import torch
    from torch._dynamo.utils import counters

    import posenc.torch as pt

    module = pt.TENERRelative(4, 8, base=100.0).double()
    if path == "tener_logits":
        fn = lambda q, k, v, o: pe.tener_logits(q, k, module.u, module.v, base=100.0, offset=o)  # noqa: E731
    else:
        fn = lambda q, k, v, o: module.attend(q, k, v, causal=True, offset=o)  # noqa: E731
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(fn, fullgraph=True, dynamic=True, backend="aot_eager")
    for batch in (2, 3, 5):
        g = torch.Generator().manual_seed(batch)
        q, k, v = (torch.randn(batch, 4, n, 8, dtype=torch.float64, generator=g).requires_grad_() for n in (3, 9, 9))
        offsets = torch.arange(batch) * 3 - 1
        want = fn(q, k, v, offsets)
        got = compiled(q, k, v, offsets)
        assert torch.equal(got, want), batch
        leaves = (q, k, v, module.u, module.v)
        for a, b in zip(torch.autograd.grad((got * got).sum(), leaves, allow_unused=True), torch.autograd.grad((want * want).sum(), leaves, allow_unused=True)):
            assert (a is None and b is None) or torch.equal(a, b), batch
    assert counters["stats"]["unique_graphs"] == 1
