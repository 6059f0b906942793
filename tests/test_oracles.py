"""``posenc._oracles`` (the originals as ``posenc bench``, asv and the tests use them) equal the
originals themselves: transformers' LLaMA ``rotate_half`` and ``apply_rotary_pos_emb``, T5's
``_relative_position_bucket`` and ``compute_bias``."""

from __future__ import annotations

import numpy as np
import pytest

from formulas import hf_t5_attention
from posenc import _oracles

torch = pytest.importorskip("torch")
llama = pytest.importorskip("transformers.models.llama.modeling_llama")
t5 = pytest.importorskip("transformers.models.t5.modeling_t5")


def test_rotate_half_is_llamas():
    x = torch.randn(2, 3, 5, 8, dtype=torch.float64)
    torch.testing.assert_close(_oracles.rotate_half(x), llama.rotate_half(x), rtol=0, atol=0)


def test_rope_rotate_half_is_apply_rotary_pos_emb():
    q, k = torch.randn(2, 3, 5, 8), torch.randn(2, 3, 5, 8)
    angle = torch.rand(2, 5, 4, dtype=torch.float64) * 100
    cos, sin = (torch.cat([t, t], -1).float() for t in (angle.cos(), angle.sin()))  # [batch, seq, d], as LLaMA's module gives them
    want_q, want_k = llama.apply_rotary_pos_emb(q, k, cos, sin)
    torch.testing.assert_close(_oracles.rope_rotate_half(q, cos[:, None], sin[:, None]), want_q, rtol=0, atol=0)
    torch.testing.assert_close(_oracles.rope_rotate_half(k, cos[:, None], sin[:, None]), want_k, rtol=0, atol=0)


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("num_buckets, max_distance", [(32, 128), (8, 20), (64, 1000), (6, 4)])
def test_t5_relative_position_bucket_is_t5s(bidirectional, num_buckets, max_distance):
    rel = torch.as_tensor(np.concatenate([np.arange(-3000, 3001), [-(2**40), 2**40]]))
    got = _oracles.t5_relative_position_bucket(torch, rel, bidirectional, num_buckets, max_distance)
    want = t5.T5Attention._relative_position_bucket(rel, bidirectional, num_buckets, max_distance)
    assert torch.equal(got, want)


@pytest.mark.parametrize("is_decoder", [False, True])
def test_t5_compute_bias_is_t5s(is_decoder):
    attention = hf_t5_attention(16, 128, is_decoder)  # _oracles.t5_compute_bias keeps T5's default max_distance, 128
    with torch.no_grad():
        want = attention.compute_bias(7, 300)[0]
        got = _oracles.t5_compute_bias(torch, attention.relative_attention_bias, 7, 300, bidirectional=not is_decoder)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
