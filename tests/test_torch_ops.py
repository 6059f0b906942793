"""posenc.torch custom ops: opcheck, float64 gradcheck, torch.compile without graph breaks."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import posenc as pe  # noqa: E402
from arrays import check_compiled_apply_rope_fuses  # noqa: E402
from formulas import rope_half_any  # noqa: E402
from posenc import _dispatch  # noqa: E402
from posenc.torch import _ops  # noqa: E402
from posenc.torch import _rows  # noqa: E402
from posenc.torch import hf as posenc_hf  # noqa: E402
from posenc.rotary.scaling import scaling_name  # noqa: E402
from posenc.torch._rows import frequencies_name, named_frequencies  # noqa: E402

INV = [10000.0 ** (-i / 4) for i in range(0, 4, 2)]  # rotary_dim 4 of a head of 6
DYNAMIC = pe.scaling.DynamicNTK(2.0, 4)


def _x(*shape, dtype=torch.float64):
    return torch.randn(*shape, dtype=dtype, requires_grad=True)


def _heads_first(batch, tokens, heads, dim):
    """``[batch, heads, tokens, dim]`` with the strides of a ``[batch, tokens, heads, dim]`` tensor, as
    attention layers hand ``q``/``k`` over (``view(...).transpose(1, 2)``): the ops' results are
    contiguous, and their fake kernels must say so for inductor's stride asserts."""
    return torch.randn(batch, tokens, heads, dim, dtype=torch.float64).transpose(1, 2).detach().requires_grad_()


def _index(m, n):
    return torch.tensor(np.random.default_rng(0).integers(0, m, n))


def _positions(*shape):
    return (torch.rand(*shape, dtype=torch.float64) * 30).requires_grad_()


def _cos_sin(shape, interleaved):
    angles = torch.rand(*shape, 2, dtype=torch.float64) * 6
    tables = [torch.cos(angles), torch.sin(angles)]
    dup = [t.repeat_interleave(2, -1) if interleaved else torch.cat([t, t], -1) for t in tables]
    return [t.detach().requires_grad_() for t in dup]


OPCHECK_CASES = [
    (_ops.rope_rotate_op, lambda: (_x(2, 5, 6), torch.arange(5), INV, False, False, 1.0)),
    (_ops.rope_rotate_op, lambda: (_x(2, 5, 6, dtype=torch.float32), torch.arange(3, 8), INV, True, True, 0.5)),
    # float positions are differentiable (broadcast [5] against [2, 5])
    (_ops.rope_rotate_op, lambda: (_x(2, 5, 6), _positions(5), INV, False, False, 1.25)),
    (_ops.rope_rotate_op, lambda: (_x(2, 5, 6), _positions(2, 1), INV, True, True, 0.5)),
    # a length-dependent scaling at a length read when the op runs (DynamicNTK past its original 4)
    (_ops.rope_rotate_at_length_op, lambda: (_x(2, 5, 6), torch.arange(5), 9, scaling_name(DYNAMIC), 4, 100.0, False, False, False)),
    (_ops.rope_rotate_at_length_op, lambda: (_x(2, 5, 6), _positions(5), 11, scaling_name(DYNAMIC), 4, 100.0, True, True, True)),
    (_ops.rope_frequencies_at_length_op, lambda: (9, scaling_name(DYNAMIC), 4, 100.0, torch.device("cpu"))),
    # ... at a length a compiled graph computes (a CPU tensor): 0-d, or one per row on x's token axes
    (_ops.rope_rotate_at_lengths_op, lambda: (_x(2, 5, 6), torch.arange(5), torch.tensor(9), scaling_name(DYNAMIC), 4, 100.0, False, False, False)),
    (_ops.rope_rotate_at_lengths_op, lambda: (_x(2, 5, 6), _positions(5), torch.tensor([[6], [11]]), scaling_name(DYNAMIC), 4, 100.0, True, True, True)),
    (_ops.rope_rotate_at_lengths_op, lambda: (_x(3, 5, 6), _positions(3, 5), torch.tensor([[6], [11], [6]]), scaling_name(DYNAMIC), 4, 100.0, False, False, False)),
    (_ops.rope_frequencies_at_lengths_op, lambda: (torch.tensor([[6], [11]]), scaling_name(DYNAMIC), 4, 100.0, torch.device("cpu"))),
    (_ops.rope_apply_op, lambda: (_x(5, 6), *_cos_sin((5,), False), False)),
    (_ops.rope_apply_op, lambda: (_x(2, 5, 6), *_cos_sin((5,), True), True)),
    (_ops.rope_rotate_op, lambda: (_heads_first(2, 5, 3, 6), torch.arange(5), INV, False, False, 1.0)),
    (_ops.rope_apply_op, lambda: (_heads_first(2, 5, 3, 6), *_cos_sin((5,), False), False)),
    (_ops.toeplitz_expand_op, lambda: (_x(3, 4 + 5 - 1), 4, 5)),
    (_ops.toeplitz_gather_op, lambda: (_x(2, 4, 7), _index(7, 4 + 5 - 1), 5)),
    (_ops.toeplitz_scatter_op, lambda: (_x(2, 4, 5), _index(7, 4 + 5 - 1), 7)),
    # one index per row of the first axis (one offset per batch row)
    (_ops.toeplitz_gather_rows_op, lambda: (_x(3, 2, 4, 7), torch.stack([_index(7, 4 + 5 - 1).roll(r) for r in range(3)]), 5)),
    (_ops.toeplitz_scatter_rows_op, lambda: (_x(3, 2, 4, 5), torch.stack([_index(7, 4 + 5 - 1).roll(r) for r in range(3)]), 7)),
    # TUPE's position terms of one offset per batch row (heads on uk alone: broadcast)
    (_ops.tupe_row_terms_op, lambda: (_x(9, 4), torch.tensor([[0, 1], [4, 5], [2, 3]]), _x(4, 3), _x(2, 4, 3), 5, 0.25)),
    # TENER's position scores of one offset per batch row (each row's queries against its sinusoids)
    (_ops.tener_row_terms_op, lambda: (_x(3, 2, 4, 6), _x(3, 7, 6))),
    (_ops.tener_row_terms_op, lambda: (_x(2, 4, 6), _x(2, 5, 6))),
    # a Toeplitz index clamped into [0, m) (a compiled graph's own: nothing differentiable)
    (_ops.index_in_range_op, lambda: (torch.tensor([-2, 0, 3, 9]), 4)),
    # integer positions only: nothing differentiable (rows kept between calls, then computed afresh)
    (_ops.rope_cos_sin_op, lambda: (torch.arange(5)[None], frequencies_name(tuple(INV), 1.0), torch.float32)),
    (_ops.rope_cos_sin_op, lambda: (torch.arange(70000, 70006).reshape(2, 3), frequencies_name(tuple(INV), 0.5), torch.bfloat16)),
    # rows kept for positions 0..7 (constants, float32: nothing differentiable); beyond them, rope_cos_sin
    (_ops.rope_cos_sin_rows_op, lambda: (torch.tensor([[3, 0, 7]]), torch.randn(8, 2, 4), frequencies_name(tuple(INV), 1.0), torch.float32)),
    (_ops.rope_cos_sin_rows_op, lambda: (torch.tensor([[3, 8]]), torch.randn(8, 2, 4), frequencies_name(tuple(INV), 1.0), torch.float32)),
]


@pytest.mark.parametrize("op, make", OPCHECK_CASES, ids=lambda v: getattr(v, "__name__", ""))
def test_opcheck(op, make):
    torch.library.opcheck(op, make())


@pytest.mark.parametrize("op, make", OPCHECK_CASES, ids=lambda v: getattr(v, "__name__", ""))
def test_gradcheck_float64(op, make):
    # Every floating-point tensor argument is differentiable and must get its gradient
    # (integer tensors are indices and positions, not differentiable).
    args = make()
    differentiable = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.dtype.is_floating_point]
    if not differentiable:
        pytest.skip("no floating-point tensor argument")
    if args[0].dtype != torch.float64:
        pytest.skip("gradcheck needs float64")
    assert all(args[i].requires_grad for i in differentiable), "a case must ask for every gradient"

    def f(*inputs):
        full = list(args)
        for i, value in zip(differentiable, inputs):
            full[i] = value
        return op(*full)

    assert torch.autograd.gradcheck(f, tuple(args[i] for i in differentiable))


def test_the_backward_of_tupe_row_terms_is_opchecked_and_once_differentiable():
    """``posenc::tupe_row_terms_backward`` (the rows' gradients, an op of its own so that a
    compiled graph keeps the rows' count symbolic) passes opcheck (whose checks run it under
    dispatch modes, which switch off the autograd it runs), gives autograd's gradients of
    the rows' loop, under a dispatch mode too, and refuses to be differentiated again."""
    from posenc.relative.tupe import row_terms

    p, every, uq, uk = _x(9, 4), torch.tensor([[0, 1], [4, 5], [2, 3]]), _x(4, 3), _x(2, 4, 3)
    grad = torch.randn(3, 2, 2, 5, dtype=torch.float64)
    args = (grad, p.detach(), every, uq.detach(), uk.detach(), 5, 0.25)
    from torch.utils.flop_counter import FlopCounterMode

    torch.library.opcheck(torch.ops.posenc.tupe_row_terms_backward.default, args)
    want = torch.autograd.grad(row_terms(p, every, uq, uk, 5, 0.25), (p, uq, uk), grad)
    assert all(torch.equal(a, b) for a, b in zip(torch.ops.posenc.tupe_row_terms_backward(*args), want))
    with FlopCounterMode(display=False):
        assert all(torch.equal(a, b) for a, b in zip(torch.ops.posenc.tupe_row_terms_backward(*args), want))
    first = torch.autograd.grad((_ops.tupe_row_terms_op(p, every, uq, uk, 5, 0.25) * grad).sum(), p, create_graph=True)[0]
    with pytest.raises(RuntimeError):
        torch.autograd.grad(first.sum(), p)


def test_the_backward_of_tener_row_terms_is_opchecked_and_once_differentiable():
    """``posenc::tener_row_terms_backward``, as TUPE's: opchecked, autograd's gradients of the
    rows' loop (under a dispatch mode too), not differentiable again."""
    from torch.utils.flop_counter import FlopCounterMode

    from posenc.relative.xl import row_terms

    queries, tables = _x(3, 2, 4, 6), _x(3, 7, 6)
    grad = torch.randn(3, 2, 4, 7, dtype=torch.float64)
    args = (grad, queries.detach(), tables.detach())
    torch.library.opcheck(torch.ops.posenc.tener_row_terms_backward.default, args)
    want = torch.autograd.grad(row_terms(queries, tables), (queries, tables), grad)
    assert all(torch.equal(a, b) for a, b in zip(torch.ops.posenc.tener_row_terms_backward(*args), want))
    with FlopCounterMode(display=False):
        assert all(torch.equal(a, b) for a, b in zip(torch.ops.posenc.tener_row_terms_backward(*args), want))
    assert all(torch.equal(g, torch.zeros_like(g)) for g in torch.ops.posenc.tener_row_terms_backward(grad[:0], queries[:0].detach(), tables[:0].detach()))
    first = torch.autograd.grad((_ops.tener_row_terms_op(queries, tables) * grad).sum(), queries, create_graph=True)[0]
    with pytest.raises(RuntimeError):
        torch.autograd.grad(first.sum(), tables)


def test_diagonal_sums_is_adjoint_of_expand():
    vec = torch.randn(2, 3 + 4 - 1, dtype=torch.float64)
    grad = torch.randn(2, 3, 4, dtype=torch.float64)
    with pe.use_backend("reference"):
        expanded = _dispatch.call("toeplitz_expand", vec, 3, 4)
    lhs = (expanded * grad).sum()
    rhs = (vec * _ops.diagonal_sums(grad)).sum()
    torch.testing.assert_close(lhs, rhs)


@pytest.mark.parametrize("lengths", [(0, 5), (3, 0), (0, 0)])
def test_an_empty_bias_gives_its_parameters_a_zero_gradient(lengths):
    """No query or no key: the per-distance vector is empty ([heads, 0]) and so is its
    gradient; the parameters get zeros, not the backward's shape error."""
    q_len, k_len = lengths
    for name, bias, param in (
        ("t5_bias", lambda t: pe.t5_bias(t, q_len, k_len), torch.randn(32, 2)),
        ("alibi_bias", lambda t: pe.alibi_bias(t, q_len, k_len), torch.rand(2)),
        ("kerple_bias", lambda t: pe.kerple_bias(t, t, q_len, k_len), torch.rand(2)),
    ):
        param.requires_grad_()
        out = bias(param)
        assert tuple(out.shape) == (2, q_len, k_len), name
        out.sum().backward()
        assert torch.equal(param.grad, torch.zeros_like(param)), name


def test_rope_rotate_backward_is_inverse_rotation():
    x = _x(1, 4, 6)
    y = _ops.rope_rotate_op(x, torch.arange(4), INV, False, False, 1.0)
    g = torch.randn_like(y)
    (gx,) = torch.autograd.grad(y, x, g)
    expected = _ops.rope_rotate_op(g, torch.arange(4), INV, False, True, 1.0)
    torch.testing.assert_close(gx, expected)


@pytest.mark.parametrize("layout", ["channels_last", "as_strided"])
def test_the_custom_ops_planned_calls_read_x_of_strided_channels(layout):
    """From a signature's third call on, ``rope_rotate``'s kernel call (each training step's)
    runs from a plan, which reads unit-stride channels: on an ``x`` whose channels are
    strided (``channels_last``, ``as_strided``) it rotated other elements, off by up to 4.8."""
    g = torch.Generator().manual_seed(0)
    if layout == "channels_last":
        x = torch.randn(2, 3, 5, 16, generator=g).contiguous(memory_format=torch.channels_last)
    else:
        x = torch.randn(4000, generator=g).as_strided((2, 3, 5, 16), (700, 3, 100, 5))
    for step in range(4):
        positions = torch.arange(5) * (step + 1)
        got = pe.rope(x.detach().requires_grad_(), positions)
        assert torch.equal(got, pe.rope(x.contiguous(), positions)), step


def test_dispatch_routes_grad_tensors_through_custom_op():
    x = _x(2, 5, 6)
    y = _dispatch.call("rope_rotate", x, torch.arange(5), np.asarray(INV))
    assert "posenc_rope_rotate" in y.grad_fn.name()
    y.sum().backward()
    assert x.grad is not None and x.grad.shape == x.shape


def test_compile_fullgraph_through_ops():
    def f(x, vec):
        y = _ops.rope_rotate_op(x, torch.arange(x.shape[-2]), INV, False, False, 1.0)
        bias = _ops.toeplitz_expand_op(vec, x.shape[-2], x.shape[-2])
        return (y @ y.transpose(-1, -2)) + bias

    x = torch.randn(3, 5, 6)
    vec = torch.randn(3, 9)
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(x, vec), f(x, vec))


def test_every_differentiable_argument_of_every_op_is_gradchecked():
    covered = {}
    for op, make in OPCHECK_CASES:
        args = make()
        floats = {i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.dtype.is_floating_point}
        covered.setdefault(op, set()).update(floats if not isinstance(args[0], torch.Tensor) or args[0].dtype == torch.float64 else ())
    ops = {v for v in vars(_ops).values() if isinstance(v, (torch._library.custom_ops.CustomOpDef, torch._ops.OpOverload))}
    assert ops == set(covered)
    expected = {_ops.rope_rotate_op: {0, 1}, _ops.rope_rotate_at_length_op: {0, 1}, _ops.rope_frequencies_at_length_op: set(),
                _ops.rope_rotate_at_lengths_op: {0, 1}, _ops.rope_frequencies_at_lengths_op: set(),
                _ops.rope_apply_op: {0, 1, 2}, _ops.toeplitz_expand_op: {0},
                _ops.toeplitz_gather_op: {0}, _ops.toeplitz_scatter_op: {0}, _ops.rope_cos_sin_op: set(),
                _ops.toeplitz_gather_rows_op: {0}, _ops.toeplitz_scatter_rows_op: {0},
                _ops.rope_cos_sin_rows_op: set(), _ops.index_in_range_op: set(),
                _ops.tupe_row_terms_op: {0, 2, 3}, _ops.tener_row_terms_op: {0, 1}}
    assert covered == expected


@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")  # inductor's own import
@pytest.mark.parametrize("backend", [None, "aot_eager", "inductor"])
@pytest.mark.parametrize("dynamic", [False, True])
def test_rope_cos_sin_rows_gathers_kept_rows_or_calls_rope_cos_sin(backend, dynamic, monkeypatch, uncached_compile):
    """``posenc::rope_cos_sin_rows`` gives ``rope_cos_sin``'s tables: gathered from the 8 rows
    kept where every position has its row, else from ``rope_cos_sin`` (whose body is
    counted). Eager and under aot_eager the op's own kernel decides; inductor decomposes it
    into a ``torch.cond`` over the gather for a single position of static shapes (rows
    included), ``rope_cos_sin`` otherwise."""
    name = frequencies_name(tuple(INV), 1.0)
    rows = _ops.rope_cos_sin_op(torch.arange(8), name, torch.float32)
    op = _ops.rope_cos_sin_rows_op
    if backend:
        torch._dynamo.reset()
        _ops.decomposed_by_inductor()
        op = torch.compile(op, backend=backend, fullgraph=True, dynamic=dynamic)
    calls = []
    body = _rows.stacked_tables  # the torch table op's body
    monkeypatch.setattr(_rows, "stacked_tables", lambda *a: calls.append(1) or body(*a))
    for positions in ([[3]], [[7]], [[8]], [[-1]], [[70000]], [[3, 0, 7]], [[3, 8]]):
        positions = torch.tensor(positions)
        kept = bool((positions >= 0).all() and (positions < 8).all())
        gathered = kept and (backend != "inductor" or (positions.numel() == 1 and not dynamic))
        del calls[:]
        got = op(positions, rows, name, torch.float32)
        assert len(calls) == (0 if gathered else 1), (backend, positions)
        assert torch.equal(got, body(*named_frequencies(name), torch.float32, positions)), (backend, positions)


def test_frequencies_name_reads_back_every_bit():
    rng = np.random.default_rng(0)
    for inv_freq in (tuple(INV), tuple(rng.random(64).tolist()), (5e-324, 1.0 / 3.0, 1e308)):
        for scale in (1.0, 0.1, 1.0 + 2.0**-52):
            assert named_frequencies(frequencies_name(inv_freq, scale)) == (inv_freq, scale)


def test_learned_frequencies_get_their_gradient():
    # cos/sin from a learned inv_freq through rope_cos_sin and apply_rope: the gradient of
    # inv_freq equals that of Hugging Face's rotation in plain torch.
    x = torch.randn(2, 7, 8, dtype=torch.float64)
    positions = torch.arange(7)

    def ours(inv_freq):
        cos, sin = pe.rope_cos_sin(positions, inv_freq, dtype=torch.float64)
        return (pe.apply_rope(x, cos, sin) ** 3).sum()

    def naive(inv_freq):
        return (rope_half_any(x, positions[:, None] * inv_freq) ** 3).sum()

    learned, reference = (torch.tensor([1.0, 0.3, 0.1, 0.02], dtype=torch.float64, requires_grad=True) for _ in range(2))
    ours(learned).backward()
    naive(reference).backward()
    torch.testing.assert_close(learned.grad, reference.grad)
    assert torch.autograd.gradcheck(ours, (reference.detach().clone().requires_grad_(),))


def test_float_positions_get_their_gradient_through_rope():
    x = torch.randn(3, 5, 8, dtype=torch.float64)
    positions = (torch.rand(5, dtype=torch.float64) * 50).requires_grad_()
    assert torch.autograd.gradcheck(lambda p: pe.rope(x, p, scaling=pe.scaling.YaRN(2.0, 16)), (positions,))


@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")  # inductor's own import
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_compiled_apply_rope_fuses_in_the_kernels_arithmetic(dtype, monkeypatch):
    """Under inductor, ``apply_rope`` on CPU tensors of one dtype is torch operations, not the opaque
    custom op (a decode step's compiled graph fuses it), and its result is the eager kernel's bit for
    bit (``arrays.check_compiled_apply_rope_fuses``)."""
    check_compiled_apply_rope_fuses(dtype, "cpu", monkeypatch)


@pytest.mark.parametrize("kernels", [True, False])
def test_a_traced_apply_rope_on_a_gpu_fuses_where_the_cuda_kernel_runs_eagerly(kernels, monkeypatch):
    """On CUDA tensors (fake ones here) the fused formula stands in for the numba.cuda kernel,
    whose arithmetic it is: only where that kernel runs (else eager calls take the reference,
    and so does the custom op), for one 16-bit or float32 dtype on one device."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    monkeypatch.setattr(_ops, "_cuda_kernels", lambda: kernels)
    with FakeTensorMode():
        for dtype in (torch.bfloat16, torch.float16, torch.float32, torch.float64):
            x, cos, sin = (torch.empty(1, 2, 3, 8, dtype=dtype, device="cuda") for _ in range(3))
            assert _ops._fuses(x, cos, sin) == (kernels and dtype != torch.float64)
        x = torch.empty(1, 2, 3, 8, dtype=torch.bfloat16, device="cuda")
        recorded = torch.empty(1, 2, 3, 8, dtype=torch.bfloat16, device="cuda", requires_grad=True)
        assert not _ops._fuses(x, x, x, recorded)  # (an eager call writing into it takes the reference)
        assert not _ops._fuses(x, x.float(), x.float())
        assert not _ops._fuses(x, torch.empty(3, 8, dtype=torch.bfloat16), torch.empty(3, 8, dtype=torch.bfloat16))


def test_compiled_calls_write_into_out_as_eager_ones_do():
    """``out=`` (a buffer, or ``x`` in place) traces under ``fullgraph=True``: the memory checks
    that need addresses are left to the run (the traced call computes its result before writing
    it into ``out``), and the result is the eager call's, in ``out``."""
    torch._dynamo.reset()
    x = torch.randn(2, 3, 5, 8)
    cos, sin = pe.rope_cos_sin(torch.arange(5), pe.rope_frequencies(8)[0])
    buffer = torch.empty_like(x)
    applied = torch.compile(lambda x: pe.apply_rope(x, cos, sin, out=buffer), fullgraph=True)(x)
    assert applied.data_ptr() == buffer.data_ptr() and torch.equal(buffer, pe.apply_rope(x, cos, sin))
    y = x.clone()
    rotated = torch.compile(lambda y: pe.rope(y, torch.arange(5), out=y), fullgraph=True)(y)
    assert rotated.data_ptr() == y.data_ptr() and torch.equal(y, pe.rope(x, torch.arange(5)))


def test_compiled_apply_rope_keeps_the_custom_op_for_gradients_and_float64():
    """Where the formula's bits or backward could differ from the kernel's (float64 rows, recorded
    gradients), the compiled graph keeps the custom op."""
    torch._dynamo.reset()
    cos, sin = (t.detach() for t in _cos_sin((5,), False))
    x = torch.randn(3, 5, 4, dtype=torch.float64, requires_grad=True)
    compiled = torch.compile(lambda x: pe.apply_rope(x, cos, sin), fullgraph=True, backend="aot_eager")
    y = compiled(x)
    torch.testing.assert_close(y, pe.apply_rope(x, cos, sin), rtol=0, atol=0)
    y.sum().backward()
    torch.testing.assert_close(x.grad, pe.apply_rope(torch.ones_like(x), cos, -sin), rtol=0, atol=0)


def test_float_positions_that_require_grad_read_a_dynamic_length_without_torch_warning():
    """``DynamicNTK`` reads the length of float positions on the host: ``float()`` of their
    max, which requires grad, made torch warn "Converting a tensor with requires_grad=True
    to a scalar" (an error under this suite's filters) on every training call. The
    positions' gradient is the reference's."""
    x = torch.randn(2, 5, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    positions = torch.rand(5, dtype=torch.float64, generator=torch.Generator().manual_seed(1)) * 9
    scaling = pe.scaling.DynamicNTK(2.0, 4)
    grads = {}
    for backend in ("auto", "reference"):
        p = positions.clone().requires_grad_()
        with pe.use_backend(backend):
            (grads[backend],) = torch.autograd.grad(pe.rope(x, p, scaling=scaling).square().sum(), p)
    torch.testing.assert_close(grads["auto"], grads["reference"], rtol=1e-12, atol=1e-12)
