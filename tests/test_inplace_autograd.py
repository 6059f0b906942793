"""In-place rotation (``out=x``) of torch tensors that autograd tracks.

flash-attention rotates ``q``/``k`` in place. A leaf that requires grad (or a view of one)
cannot be written in place while grad mode is on; posenc refuses it with its own
``ValueError`` before anything is computed. A non-leaf is rotated in place with the same
gradient as the out-of-place call; under ``torch.no_grad()`` a leaf is rotated in place.
"""

from __future__ import annotations

import numpy as np
import pytest

import posenc as pe

torch = pytest.importorskip("torch")

INV_FREQ = [1.0, 0.3, 0.1, 0.02]


def _calls():
    positions = torch.arange(5, dtype=torch.float64)
    cos, sin = pe.rope_cos_sin(positions, INV_FREQ)
    return {
        "rope": lambda x, out: pe.rope(x, out=out),
        "apply_rope": lambda x, out: pe.apply_rope(x, cos, sin, out=out),
        "rerotate": lambda x, out: pe.rerotate(x, 3, INV_FREQ, out=out),
    }


@pytest.mark.parametrize("name", ["rope", "apply_rope", "rerotate"])
@pytest.mark.parametrize("view", [False, True])
def test_a_leaf_that_requires_grad_is_refused_before_anything_runs(name, view):
    leaf = torch.randn(2, 5, 8, dtype=torch.float64, requires_grad=True)
    before = leaf.detach().clone()
    target = leaf[1] if view else leaf
    what = "a view of a leaf tensor" if view else "a leaf tensor"
    with pytest.raises(ValueError, match=f"out is {what} that requires grad"):
        _calls()[name](target, target)
    assert torch.equal(leaf.detach(), before)  # nothing written
    with pytest.raises(ValueError, match="out is a leaf tensor that requires grad"):
        _calls()[name](torch.randn(2, 5, 8, dtype=torch.float64), leaf)  # a separate out buffer, too


@pytest.mark.parametrize("name", ["rope", "apply_rope", "rerotate"])
def test_a_non_leaf_rotated_in_place_gets_the_out_of_place_gradient(name):
    call = _calls()[name]
    weight = torch.randn(2, 5, 8, dtype=torch.float64, requires_grad=True)
    upstream = torch.randn(2, 5, 8, dtype=torch.float64)

    expected = call(weight * 2.0, None)
    (grad_expected,) = torch.autograd.grad((expected * upstream).sum(), weight)

    x = weight * 2.0  # a non-leaf
    result = call(x, x)
    assert result is x
    (grad,) = torch.autograd.grad((result * upstream).sum(), weight)
    np.testing.assert_allclose(result.detach().numpy(), expected.detach().numpy(), rtol=0, atol=1e-12)
    np.testing.assert_allclose(grad.numpy(), grad_expected.numpy(), rtol=0, atol=1e-12)
    # a rotation is orthogonal: the gradient is the upstream one turned back (times the 2 of x = 2w)
    assert torch.allclose(grad.norm(dim=-1), 2 * upstream.norm(dim=-1), rtol=0, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16])
@pytest.mark.parametrize("out", ["x", "a buffer"])
def test_a_call_autograd_records_writes_the_kernels_bits_into_out(out, dtype):
    # it took the reference: 25,403 of 262,144 float64 entries 1-2 ulps off, 15 in float16
    weight = (torch.randn(4, 8, 64, 128, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 3).to(dtype)
    options = {"offset": 1000, "scaling": pe.scaling.YaRN(4.0, 64)}
    expected = pe.rope(weight, **options)
    x = weight.clone().requires_grad_() * 1  # a non-leaf
    result = pe.rope(x, **options, out=x if out == "x" else torch.empty_like(x))
    assert torch.equal(result.detach(), expected) and result.grad_fn is not None


def test_a_leaf_is_rotated_in_place_under_no_grad():
    leaf = torch.randn(2, 5, 8, dtype=torch.float64, requires_grad=True)
    expected = pe.rope(leaf.detach())
    with torch.no_grad():
        result = pe.rope(leaf, out=leaf)
    assert result is leaf and leaf.is_leaf and leaf.requires_grad
    np.testing.assert_allclose(leaf.detach().numpy(), expected.numpy(), rtol=0, atol=1e-12)


def _bias_calls():
    table = torch.randn(32, 2, dtype=torch.float64)
    return {
        "t5_bias": lambda out: pe.t5_bias(table, 5, 8, out=out),
        "alibi_bias": lambda out: pe.alibi_bias(table[0], 5, 8, out=out),
        "expand_bias": lambda out: pe.expand_bias(table[:12].T.contiguous(), 5, 8, out=out),
    }


@pytest.mark.parametrize("name", ["rope", "apply_rope", "rerotate", "rope_into", "t5_bias", "alibi_bias", "expand_bias"])
@pytest.mark.parametrize("backend", ["auto", "reference"])
def test_a_written_out_that_another_op_saved_fails_its_backward_as_torch_would(name, backend):
    """A kernel writes ``out`` through a NumPy view, which torch's version counter does not
    see: a tensor saved for another op's backward (``w = (a * out).sum()`` saves ``out``)
    and then written by posenc must make that backward raise, as ``out.mul_(2)`` does,
    not give a gradient of the new values. Four calls: the full path, then the plans."""
    shape = (2, 5, 8)  # [batch, seq, dim] for the rotations, [heads, q_len, k_len] for the biases
    for _ in range(4):
        a = torch.randn(shape, dtype=torch.float64, requires_grad=True)
        out = torch.randn(shape, dtype=torch.float64)
        w = (a * out).sum()
        with pe.use_backend(backend):
            if name in _bias_calls():
                _bias_calls()[name](out)
            elif name == "rope_into":
                pe.rope(torch.randn(shape, dtype=torch.float64), out=out)
            else:
                _calls()[name](out, out)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            w.backward()


def test_an_inference_tensor_is_written_only_in_inference_mode():
    with torch.inference_mode():
        x = torch.randn(2, 5, 8)
        want = pe.rope(x.clone())
    before = x.clone()
    for _ in range(3):  # the full path, then a plan's signature
        with pytest.raises(ValueError, match="out is an inference tensor"):
            pe.rope(x, out=x)
        assert torch.equal(x, before)
        with pytest.raises(ValueError, match="out is an inference tensor"):
            pe.t5_bias(torch.randn(32, 2), 5, 8, out=x)
    with torch.inference_mode():
        for _ in range(3):
            y = x.clone()
            assert pe.rope(y, out=y) is y
            torch.testing.assert_close(y, want, rtol=0, atol=0)


def _calls_with_trained_angles():
    """In-place calls whose angles autograd records: learned ``cos``/``sin``, float positions."""
    positions = (torch.rand(5, dtype=torch.float64, generator=torch.Generator().manual_seed(1)) * 9).requires_grad_()
    cos, sin = (t.requires_grad_() for t in pe.rope_cos_sin(torch.arange(5), INV_FREQ, dtype=torch.float64))
    return (cos, sin, positions), {
        "apply_rope": lambda x, out: pe.apply_rope(x, cos, sin, out=out),
        "rope": lambda x, out: pe.rope(x, positions, out=out),
        "rerotate": lambda x, out: pe.rerotate(x, positions, INV_FREQ, out=out),
    }


@pytest.mark.parametrize("name", ["apply_rope", "rope", "rerotate"])
@pytest.mark.parametrize("backend", ["auto", "reference"])
def test_a_non_leaf_rotated_in_place_gives_trained_angles_the_out_of_place_gradient(name, backend):
    """The gradient of ``cos``/``sin`` (or float positions) reads ``x`` as it was: the
    in-place write had overwritten the copy autograd saved, and backward raised torch's
    "modified by an inplace operation" (the custom op of ``apply_rope``; the reference, for
    every call), where the out-of-place call and torch's own ``x.mul_(cos)`` train."""
    weight = torch.randn(2, 5, 8, dtype=torch.float64, requires_grad=True)
    upstream = torch.randn(2, 5, 8, dtype=torch.float64)
    angles, calls = _calls_with_trained_angles()
    with pe.use_backend(backend):
        expected = calls[name](weight * 2.0, None)
        want = torch.autograd.grad((expected * upstream).sum(), (weight, *angles), allow_unused=True)
        x = weight * 2.0
        result = calls[name](x, x)
        got = torch.autograd.grad((result * upstream).sum(), (weight, *angles), allow_unused=True)
    assert result is x
    torch.testing.assert_close(result, expected, rtol=0, atol=1e-12)
    for g, w in zip(got, want, strict=True):
        assert (g is None) == (w is None)
        if w is not None:
            torch.testing.assert_close(g, w, rtol=0, atol=1e-12)
