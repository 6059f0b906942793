"""The formulas as the original implementations write them: the baselines ``posenc bench``
and the asv suite time posenc against, and oracles the tests compare it with.

Nothing in posenc's own computation calls these; they live in the package (not in
``tests/``) because ``posenc bench`` ships with it. Each is a transcription of one
original, named after it, kept as plain as the original is.
"""

from __future__ import annotations

import math

from ._compat import array_namespace


def rotate_half(x):
    """LLaMA's / GPT-NeoX's ``rotate_half``: ``concat(-x2, x1)`` of the two halves (any namespace)."""
    xp = array_namespace(x)
    half = x.shape[-1] // 2
    return xp.concat([-x[..., half:], x[..., :half]], axis=-1)


def hf_rope(torch, x, cos, sin):
    """Hugging Face's ``rotate_half`` and ``apply_rotary_pos_emb`` on one tensor, in torch as
    written there: ``x * cos + torch.cat((-x2, x1), dim=-1) * sin`` (no namespace lookup:
    the torch anchors of ``posenc bench --gpu``, eager and under ``torch.compile``)."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def rope_rotate_half(x, cos, sin):
    """Hugging Face's ``apply_rotary_pos_emb`` on one tensor: ``x * cos + rotate_half(x) * sin``,
    ``cos``/``sin`` ``[..., d]`` in the "half" layout."""
    return x * cos + rotate_half(x) * sin


def t5_relative_position_bucket(torch, relative_position, bidirectional=True, num_buckets=32, max_distance=128):
    """T5's ``_relative_position_bucket`` (Hugging Face ``T5Attention``) of ``key - query``, in torch."""
    buckets = 0
    if bidirectional:
        num_buckets //= 2
        buckets = (relative_position > 0).to(torch.long) * num_buckets
        relative_position = torch.abs(relative_position)
    else:
        relative_position = -torch.min(relative_position, torch.zeros_like(relative_position))
    max_exact = num_buckets // 2
    is_small = relative_position < max_exact
    large = max_exact + (
        torch.log(relative_position.float() / max_exact) / math.log(max_distance / max_exact) * (num_buckets - max_exact)
    ).to(torch.long)
    large = torch.min(large, torch.full_like(large, num_buckets - 1))
    return buckets + torch.where(is_small, relative_position, large)


def t5_compute_bias(torch, embedding, q_len, k_len, bidirectional=True):
    """T5's ``compute_bias``: bucket the ``[q, k]`` matrix of ``key - query``, look the buckets
    up in ``embedding`` (``[num_buckets, heads]``), permute to ``[heads, q, k]``."""
    device = embedding.weight.device
    context = torch.arange(q_len, dtype=torch.long, device=device)[:, None]
    memory = torch.arange(k_len, dtype=torch.long, device=device)[None, :]
    buckets = t5_relative_position_bucket(torch, memory - context, bidirectional, embedding.num_embeddings)
    return embedding(buckets).permute(2, 0, 1).contiguous()
