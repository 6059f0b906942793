"""The formulas and original implementations the tests compare posenc with, written once.

Float64 NumPy transcriptions of the papers' definitions (relative distances, sinusoids,
inverse frequencies, RoPE in both layouts), and the released code itself where it exists:
transformers' T5 and DeBERTa buckets, and ``posenc._oracles`` (LLaMA's ``rotate_half``,
Hugging Face's ``apply_rotary_pos_emb``), which tests/test_oracles.py holds equal to
transformers.
"""

from __future__ import annotations

import numpy as np
import pytest
from array_api_compat import array_namespace

from posenc import _oracles


def rel_matrix(q_len, k_len, offset=0):
    """``query - key``: ``(offset + i) - j`` for ``i < q_len``, ``j < k_len``."""
    return (offset + np.arange(q_len))[:, None] - np.arange(k_len)[None, :]


def hf_t5_bucket(key_minus_query, **kwargs):
    """transformers' ``T5Attention._relative_position_bucket`` (it takes ``key - query``)."""
    torch = pytest.importorskip("torch")
    t5 = pytest.importorskip("transformers.models.t5.modeling_t5")
    rel = torch.as_tensor(np.asarray(key_minus_query, dtype=np.int64))
    return t5.T5Attention._relative_position_bucket(rel, **kwargs).numpy()


def hf_t5_attention(num_buckets, max_distance, is_decoder):
    """A transformers ``T5Attention`` layer (two heads) with a random relative-position table:
    its ``compute_bias`` is T5's original."""
    torch = pytest.importorskip("torch")
    t5 = pytest.importorskip("transformers.models.t5.modeling_t5")
    config = t5.T5Config(
        d_model=8, d_kv=4, num_heads=2, relative_attention_num_buckets=num_buckets, relative_attention_max_distance=max_distance, is_decoder=is_decoder
    )
    attention = t5.T5Attention(config, has_relative_attention_bias=True)
    torch.nn.init.normal_(attention.relative_attention_bias.weight)
    return attention


def hf_deberta_bucket(rel, bucket_size, max_position):
    """transformers' DeBERTa-v2 ``make_log_bucket_position``, as int64 (``.long()`` as the model casts)."""
    torch = pytest.importorskip("torch")
    deberta = pytest.importorskip("transformers.models.deberta_v2.modeling_deberta_v2")
    return deberta.make_log_bucket_position(torch.as_tensor(rel), bucket_size, max_position).long().numpy()


def inv_freq(dim, base=10000.0):
    """RoPE's and the sinusoid's inverse frequencies ``base**(-2i/dim)``, ``i < dim/2``."""
    return base ** (-2.0 * np.arange(dim // 2) / dim)


def sinusoid(positions, dim, base=10000.0, layout="interleaved"):
    """The Transformer's sinusoid of (signed, float) positions: ``sin`` and ``cos`` of
    ``p / base**(2i/dim)``, interleaved pairs or the two halves (``"half"``)."""
    angle = np.asarray(positions, dtype=np.float64)[..., None] / base ** (2 * np.arange(dim // 2) / dim)
    if layout == "half":
        return np.concatenate([np.sin(angle), np.cos(angle)], axis=-1)
    out = np.empty(angle.shape[:-1] + (dim,))
    out[..., 0::2], out[..., 1::2] = np.sin(angle), np.cos(angle)
    return out


def rope_tables(positions, frequencies, layout):
    """float64 ``cos``/``sin`` of ``p * f``, each frequency twice: halves (``"half"``) or pairs."""
    angle = np.asarray(positions, dtype=np.float64)[..., None] * frequencies
    if layout == "half":
        return np.concatenate([np.cos(angle)] * 2, -1), np.concatenate([np.sin(angle)] * 2, -1)
    return np.repeat(np.cos(angle), 2, axis=-1), np.repeat(np.sin(angle), 2, axis=-1)


def rotate_every_two(x):
    """GPT-J's ``rotate_every_two``: ``(-x2, x1)`` of each interleaved pair."""
    out = np.empty_like(x)
    out[..., 0::2] = -x[..., 1::2]
    out[..., 1::2] = x[..., 0::2]
    return out


def rope_formula(x, cos, sin, layout):
    """float64 RoPE of the first ``cos.shape[-1]`` channels, the rest passed through:
    LLaMA's ``x * cos + rotate_half(x) * sin`` (``"half"``), GPT-J's with ``rotate_every_two``."""
    x = np.asarray(x, dtype=np.float64)
    r = cos.shape[-1]
    rot = x[..., :r]
    turned = _oracles.rotate_half(rot) if layout == "half" else rotate_every_two(rot)
    return np.concatenate([rot * cos + turned * sin, x[..., r:]], axis=-1)


def exact_rope(x, positions, base=10000.0):
    """float64 half-layout RoPE of every channel at ``positions``."""
    return rope_formula(x, *rope_tables(positions, inv_freq(x.shape[-1], base), "half"), "half")


def rope_half_any(x, angle, rotary_dim=None):
    """LLaMA's rotation in ``x``'s own namespace (differentiable there): Hugging Face's
    ``apply_rotary_pos_emb`` with ``cos``/``sin`` of ``angle`` (``[..., rotary_dim / 2]``) on the
    first ``rotary_dim`` channels, the rest passed through. A NumPy ``angle`` is taken in
    float64 (``cos``/``sin`` rounded once to ``x``'s dtype); another is differentiated through."""
    xp = array_namespace(x)
    rotary_dim = x.shape[-1] if rotary_dim is None else rotary_dim
    if isinstance(angle, np.ndarray):
        cos, sin = (xp.asarray(t, dtype=x.dtype) for t in (np.cos(angle), np.sin(angle)))
    else:
        cos, sin = xp.cos(angle), xp.sin(angle)
    cos, sin = xp.concat([cos, cos], axis=-1), xp.concat([sin, sin], axis=-1)
    turned = _oracles.rope_rotate_half(x[..., :rotary_dim], cos, sin)
    return xp.concat([turned, x[..., rotary_dim:]], axis=-1)
