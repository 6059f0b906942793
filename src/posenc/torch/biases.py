"""Bias encodings: a per-head ``[heads, q_len, k_len]`` bias added to the scaled dot product."""

from __future__ import annotations

import torch
from torch import nn

import posenc as pe

from ..relative.buckets import t5_bucket_options
from ._protocol import PositionalModule, dot_scores, positive_int


class _DistanceBias(PositionalModule):
    """A bias ``[heads, q_len, k_len]`` from a per-distance vector (:func:`posenc.relative_bias_vector`).

    ``forward(q_len, k_len, *, offset=None, query_positions=None, key_positions=None)``
    returns the bias (queries at ``offset + arange(q_len)``, ``offset=None`` meaning
    ``k_len - q_len``); with per-token positions (integer ``[..., q_len]`` /
    ``[..., k_len]``, leading axes the batch) it is :func:`posenc.relative_bias` at
    ``rel = query_positions[..., i] - key_positions[..., j]``, ``[..., heads, q_len,
    k_len]``. The protocol's ``logits`` adds it to ``q k^T / sqrt(head_dim)`` for ``q, k
    [batch, heads, seq, head_dim]``.
    """

    kind = ""
    takes_positions = True

    def bias_options(self) -> dict:
        return {}

    def params(self) -> torch.Tensor:
        raise NotImplementedError

    def vector(self, q_len: int, k_len: int, offset=None) -> torch.Tensor:
        return pe.relative_bias_vector(self.kind, self.params(), q_len, k_len, offset=offset, **self.bias_options())

    def forward(self, q_len: int, k_len: int, *, offset=None, query_positions=None, key_positions=None) -> torch.Tensor:
        return pe.relative_bias(self.kind, self.params(), q_len, k_len, offset=offset, query_positions=query_positions,
                                key_positions=key_positions, **self.bias_options())

    def scores(self, q, k, offset, **positions):
        bias = self(q.shape[-2], k.shape[-2], offset=offset, **positions)
        return dot_scores(q, k) + bias.to(q.dtype)


class T5RelativeBias(_DistanceBias):
    """T5's learned bucketed bias: ``table [num_buckets, heads]`` -> :func:`posenc.t5_bias`.

    ``forward`` returns the bias ``[heads, q_len, k_len]`` (``[..., heads, q_len, k_len]``
    with per-token positions); ``logits``/``attend`` take ``q, k, v [batch, heads, seq,
    head_dim]``.

    Backward: the Toeplitz diagonal sums, then a bucketed scatter-add into the table.
    ``logits`` scales the dot product by ``1/sqrt(head_dim)`` (the released T5 folds that
    scale into its query projection instead).
    """

    kind = "t5"

    def __init__(self, num_heads: int, *, num_buckets: int = 32, max_distance: int = 128, bidirectional: bool = True):
        super().__init__()
        t5_bucket_options(num_buckets, max_distance, bidirectional)
        self.table = nn.Parameter(torch.randn(num_buckets, positive_int("num_heads", num_heads)) * 0.02)
        self.max_distance, self.bidirectional = max_distance, bidirectional

    @classmethod
    def from_hf(cls, module):
        """Wrap a transformers T5 (or mT5, UMT5, ...) attention layer's ``relative_attention_bias``.

        The module's ``table`` *is* the layer's embedding weight ``[num_buckets, heads]``
        (shared, not copied: training either trains both); ``bidirectional`` is ``not
        module.is_decoder`` and ``max_distance`` its ``relative_attention_max_distance``.
        """
        embedding = getattr(module, "relative_attention_bias", None)
        if not isinstance(embedding, nn.Embedding):
            raise ValueError(
                f"module must be a transformers T5 attention layer with a relative_attention_bias embedding, got {type(module).__name__}"
            )
        num_buckets, heads = embedding.weight.shape
        bias = cls(
            heads,
            num_buckets=num_buckets,
            max_distance=module.relative_attention_max_distance,
            bidirectional=not module.is_decoder,
        )
        bias.table = embedding.weight
        return bias

    def params(self):
        return self.table

    def bias_options(self):
        return {"bidirectional": self.bidirectional, "max_distance": self.max_distance, "num_buckets": int(self.table.shape[0])}

    def options(self):
        num_buckets, heads = self.table.shape
        return {"num_heads": int(heads), "num_buckets": int(num_buckets), **self.bias_options()}


class ALiBi(_DistanceBias):
    """ALiBi's fixed linear bias (:func:`posenc.alibi_bias`); ``slopes`` is a buffer of
    :func:`posenc.alibi_slopes` with ``max_bias``.

    ``forward`` returns the bias ``[heads, q_len, k_len]`` (``[..., heads, q_len, k_len]``
    with per-token positions); ``logits``/``attend`` take ``q, k, v [batch, heads, seq,
    head_dim]``.
    """

    kind = "alibi"

    def __init__(self, num_heads: int, *, max_bias: float = 8.0, symmetric: bool = False):
        super().__init__()
        slopes = pe.alibi_slopes(positive_int("num_heads", num_heads), max_bias=max_bias)
        self.register_buffer("slopes", torch.tensor(slopes, dtype=torch.float32))  # (on the default device, as parameters are)
        self.num_heads, self.max_bias, self.symmetric = num_heads, max_bias, symmetric

    def params(self):
        return self.slopes

    def bias_options(self):
        return {"symmetric": self.symmetric}

    def options(self):
        return {"num_heads": self.num_heads, "max_bias": self.max_bias, "symmetric": self.symmetric}
