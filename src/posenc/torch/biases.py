"""Bias encodings: a per-head ``[heads, q_len, k_len]`` bias added to the scaled dot product."""

from __future__ import annotations

import torch
from torch import nn

import posenc as pe

from ..relative.buckets import t5_bucket_options
from ._protocol import PositionalModule, allocatable, biased_scores, positive_int, widened


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
    takes_row_offsets = True

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
        return biased_scores(q, k, bias)


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
        allocatable("T5RelativeBias", table=(num_buckets, positive_int("num_heads", num_heads)))
        self.table = nn.Parameter(torch.randn(num_buckets, num_heads) * 0.02)
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

    @property
    def num_heads(self) -> int:
        return int(self.table.shape[1])

    def params(self):
        return self.table

    def bias_options(self):
        return {"bidirectional": self.bidirectional, "max_distance": self.max_distance, "num_buckets": int(self.table.shape[0])}

    def options(self):
        num_buckets, heads = self.table.shape
        return {"num_heads": int(heads), "num_buckets": int(num_buckets), **self.bias_options()}


class ALiBi(_DistanceBias):
    """ALiBi's fixed linear bias (:func:`posenc.alibi_bias`); ``slopes`` is a buffer of
    :func:`posenc.alibi_slopes` with ``max_bias`` (float32 at first).

    ``forward`` returns the bias ``[heads, q_len, k_len]`` (``[..., heads, q_len, k_len]``
    with per-token positions); ``logits``/``attend`` take ``q, k, v [batch, heads, seq,
    head_dim]``.

    The slopes follow ``num_heads`` and ``max_bias``, not the buffer's earlier values: a
    dtype or device move (``.double()``, ``.half().float()``, ``to_empty``) computes them
    afresh in float64, rounded once to the new dtype, and ``load_state_dict`` refuses
    ``slopes`` that are not this module's (another ``max_bias``) with the other load
    errors, even with ``strict=False``; the ones it takes, saved in any dtype, stay exact.
    """

    kind = "alibi"

    def __init__(self, num_heads: int, *, max_bias: float = 8.0, symmetric: bool = False):
        super().__init__()
        slopes = pe.alibi_slopes(positive_int("num_heads", num_heads), max_bias=max_bias, xp=torch)
        self.register_buffer("slopes", slopes)  # (on the default device, as parameters are)
        self.num_heads, self.max_bias, self.symmetric = num_heads, max_bias, symmetric

    def _exact_slopes(self, like):
        return pe.alibi_slopes(self.num_heads, max_bias=self.max_bias, xp=torch, device=like.device, dtype=like.dtype)

    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)
        slopes = self.slopes
        if slopes.is_floating_point() and slopes.device.type != "meta":
            exact = self._exact_slopes(slopes)
            if not torch.equal(slopes, exact):  # (the same tensor otherwise: share_memory keeps it shared)
                self.slopes = exact
        return self

    def params(self):
        return self.slopes

    def scores(self, q, k, offset, **positions):
        bias = pe.relative_bias("alibi", widened(self.slopes), q.shape[-2], k.shape[-2], offset=offset, **positions, **self.bias_options())
        return biased_scores(q, k, bias)

    def bias_options(self):
        return {"symmetric": self.symmetric}

    def options(self):
        return {"num_heads": self.num_heads, "max_bias": self.max_bias, "symmetric": self.symmetric}

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs):
        saved = state_dict.get(prefix + "slopes")
        if isinstance(saved, torch.Tensor) and saved.is_floating_point() and saved.device.type != "meta":
            exact = pe.alibi_slopes(self.num_heads, max_bias=self.max_bias, xp=torch, dtype=torch.float64)
            # Saved in bfloat16 at worst: each within its rounding.
            if saved.shape != exact.shape or not torch.allclose(saved.detach().to("cpu", torch.float64), exact, rtol=2.0**-7, atol=0.0):
                error_msgs.append(
                    f"{prefix}slopes: the state's ALiBi slopes {_head(saved)} are not those of this module's num_heads = "
                    f"{self.num_heads}, max_bias = {self.max_bias}, {_head(exact)}: build ALiBi with the saved model's options"
                )
                return
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs)
        if self.slopes.is_floating_point() and self.slopes.device.type != "meta":
            self.slopes = self._exact_slopes(self.slopes)


def _head(slopes):
    """``[0.5, 0.25, ...] (12)``: the first slopes and their number."""
    first = ", ".join(f"{float(s):.6g}" for s in slopes.detach().reshape(-1)[:3])
    return f"[{first}{', ...' if slopes.numel() > 3 else ''}] ({slopes.numel()})"
