"""Thin ``torch.nn.Module`` wrappers over posenc's functions.

Each module holds its parameters (or buffers) and calls the public function; gradients go
through posenc's custom ops (``posenc.torch._ops``), so the Numba kernels do the work
forward and backward.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from torch import nn

import posenc as pe

from . import _ops


def _positions(x, positions, offset):
    if positions is None:
        return torch.arange(offset, offset + x.shape[-2], device=x.device)
    return positions


class SinusoidalEmbedding(nn.Module):
    """Fixed sinusoidal table (:func:`posenc.sinusoidal`): ``forward(positions) -> [..., dim]``.

    ``positions`` is an integer or float tensor; the result is float32 unless ``dtype``.
    """

    def __init__(self, dim: int, *, base: float = 10000.0, layout: str = "interleaved", dtype=None):
        super().__init__()
        pe.sinusoidal(0, dim, base=base, layout=layout)  # validates the arguments now
        self.dim, self.base, self.layout, self.dtype = dim, base, layout, dtype

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        return pe.sinusoidal(positions, self.dim, base=self.base, layout=self.layout, dtype=self.dtype)


class LearnedEmbedding(nn.Module):
    """Learned absolute table ``weight [num_positions, dim]`` with hierarchical extension.

    ``forward(positions)`` looks rows up; ``extend(length)`` grows the table to ``length <=
    num_positions**2`` rows with :func:`posenc.hierarchical_extend` (the first rows stay the
    trained ones) and returns the module.
    """

    def __init__(self, num_positions: int, dim: int, *, alpha: float = 0.4):
        super().__init__()
        if not isinstance(num_positions, int) or isinstance(num_positions, bool) or num_positions < 1:
            raise ValueError(f"num_positions must be a positive integer, got {num_positions!r}")
        if not isinstance(dim, int) or isinstance(dim, bool) or dim < 1:
            raise ValueError(f"dim must be a positive integer, got {dim!r}")
        self.alpha = alpha
        self.weight = nn.Parameter(torch.randn(num_positions, dim) * 0.02)

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        return nn.functional.embedding(positions, self.weight)

    @torch.no_grad()
    def extend(self, length: int) -> LearnedEmbedding:
        self.weight = nn.Parameter(pe.hierarchical_extend(self.weight.detach(), length, alpha=self.alpha))
        return self


class RotaryEmbedding(nn.Module):
    """Rotary position embedding (:func:`posenc.rope`) for queries and keys.

    ``forward(q, k, positions=None, *, offset=0, seq_len=None) -> (q, k)`` rotates the first
    ``rotary_dim`` channels of both (sequence axis ``-2``; ``positions`` broadcast against
    ``x.shape[:-1]``). The module holds no state that depends on the input: length-dependent
    scalings (``DynamicNTK``, ``LongRoPE``) are decided per call from the positions (the
    largest + 1, or ``seq_len``), exactly as :func:`posenc.rope` decides them, and q and k
    use the same frequencies. Angles are float64; on the kernel path the rotation is the
    ``posenc::rope_rotate`` custom op (backward: the inverse rotation), so
    ``torch.compile(fullgraph=True)`` traces through it.
    """

    def __init__(self, head_dim: int, *, base: float = 10000.0, scaling=None, layout: str = "half", rotary_dim: int | None = None):
        super().__init__()
        self.head_dim = head_dim
        self.rotary_dim = head_dim if rotary_dim is None else rotary_dim
        if self.rotary_dim > head_dim:
            raise ValueError(f"rotary_dim must be <= head_dim = {head_dim}, got {self.rotary_dim}")
        if layout not in ("half", "interleaved"):
            raise ValueError(f"layout must be 'half' or 'interleaved', got {layout!r}")
        self.base, self.scaling, self.layout = base, scaling, layout
        pe.rope_frequencies(self.rotary_dim, base=base, scaling=scaling)  # validates the arguments now

    @classmethod
    def from_hf(cls, config, *, head_dim: int | None = None, max_position_embeddings: int | None = None, layer_type=None, layout: str = "half"):
        """From a transformers config or its ``rope_parameters`` dict (see :func:`posenc.scaling.from_hf`)."""
        hf = pe.scaling.from_hf(config, head_dim=head_dim, max_position_embeddings=max_position_embeddings, layer_type=layer_type)
        head = head_dim if head_dim is not None or config is None or isinstance(config, Mapping) else pe.scaling.config_head_dim(config)
        return cls(head if head is not None else hf.rotary_dim, base=hf.base, scaling=hf.scaling, layout=layout, rotary_dim=hf.rotary_dim)

    def _options(self):
        return {"base": self.base, "scaling": self.scaling, "layout": self.layout, "rotary_dim": self.rotary_dim}

    def rotate(self, x: torch.Tensor, positions: torch.Tensor | None = None, *, offset=0, inverse: bool = False, seq_len=None) -> torch.Tensor:
        """One tensor: :func:`posenc.rope` with this module's options."""
        return pe.rope(x, positions, offset=offset, inverse=inverse, seq_len=seq_len, **self._options())

    def forward(self, q, k, positions=None, *, offset=0, seq_len=None):
        if seq_len is None and positions is None and self.scaling is not None and self.scaling.uses_seq_len:
            seq_len = offset + max(q.shape[-2], k.shape[-2])  # the longer of the two decides, for both
        return self.rotate(q, positions, offset=offset, seq_len=seq_len), self.rotate(k, positions, offset=offset, seq_len=seq_len)


class _DistanceBias(nn.Module):
    """A bias ``[heads, q_len, k_len]`` from a per-distance vector (:func:`posenc.relative_bias_vector`)."""

    kind = ""

    def options(self) -> dict:
        return {}

    def params(self) -> torch.Tensor:
        raise NotImplementedError

    def vector(self, q_len: int, k_len: int, offset: int = 0) -> torch.Tensor:
        return pe.relative_bias_vector(self.kind, self.params(), q_len, k_len, offset=offset, **self.options())

    def forward(self, q_len: int, k_len: int, *, offset: int = 0) -> torch.Tensor:
        return pe.expand_bias(self.vector(q_len, k_len, offset), q_len, k_len)


class T5RelativeBias(_DistanceBias):
    """T5's learned bucketed bias: ``table [num_buckets, heads]`` -> :func:`posenc.t5_bias`.

    Backward: the Toeplitz diagonal sums, then a bucketed scatter-add into the table.
    """

    kind = "t5"

    def __init__(self, num_heads: int, *, num_buckets: int = 32, max_distance: int = 128, bidirectional: bool = True):
        super().__init__()
        pe.t5_bucket(torch.zeros(1, dtype=torch.int64), bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance)
        self.table = nn.Parameter(torch.randn(num_buckets, _heads(num_heads)) * 0.02)
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

    def options(self):
        return {"bidirectional": self.bidirectional, "max_distance": self.max_distance}


class ALiBi(_DistanceBias):
    """ALiBi's fixed linear bias (:func:`posenc.alibi_bias`); ``slopes`` is a buffer."""

    kind = "alibi"

    def __init__(self, num_heads: int, *, symmetric: bool = False):
        super().__init__()
        self.register_buffer("slopes", torch.from_numpy(pe.alibi_slopes(_heads(num_heads))))
        self.symmetric = symmetric

    def params(self):
        return self.slopes

    def options(self):
        return {"symmetric": self.symmetric}


class ShawRelative(nn.Module):
    """Shaw et al.'s relative attention with learned ``table_k``/``table_v [2K+1, head_dim]``.

    ``forward(q, k, v, causal=False) -> [..., heads, q_len, head_dim]``: softmax of
    :func:`posenc.shaw_logits` over ``sqrt(d)``, then :func:`posenc.shaw_output`.
    Never builds a ``[q_len, k_len, d]`` tensor.
    """

    def __init__(self, head_dim: int, *, max_distance: int):
        super().__init__()
        if not isinstance(max_distance, int) or isinstance(max_distance, bool) or max_distance < 0:
            raise ValueError(f"max_distance must be a non-negative integer, got {max_distance!r}")
        self.max_distance = max_distance
        self.table_k = nn.Parameter(torch.randn(2 * max_distance + 1, head_dim) * 0.02)
        self.table_v = nn.Parameter(torch.randn(2 * max_distance + 1, head_dim) * 0.02)

    def forward(self, q, k, v, *, causal: bool = False, offset: int = 0):
        logits = pe.shaw_logits(q, k, self.table_k, max_distance=self.max_distance, offset=offset) / math.sqrt(q.shape[-1])
        if causal:
            rel = pe.relative_positions(q.shape[-2], k.shape[-2], offset=offset, xp=pe._xp.namespace(q), device=q.device)
            logits = logits.masked_fill(rel < 0, float("-inf"))
        weights = torch.softmax(logits, dim=-1)
        return pe.shaw_output(weights, v, self.table_v, max_distance=self.max_distance, offset=offset)


class DeBERTaRelative(nn.Module):
    """DeBERTa's disentangled attention logits with learned relative embeddings.

    ``pos_q``/``pos_k`` are ``[heads, 2K, head_dim]`` parameters (the relative embeddings
    already projected per head); ``forward(q, k)`` returns :func:`posenc.deberta_logits`
    (content-to-content + content-to-position + position-to-content, over ``sqrt(3d)``).
    """

    def __init__(self, num_heads: int, head_dim: int, *, max_distance: int, bucket_size: int | None = None, max_position: int | None = None):
        super().__init__()
        if not isinstance(max_distance, int) or isinstance(max_distance, bool) or max_distance < 1:
            raise ValueError(f"max_distance must be a positive integer, got {max_distance!r}")
        heads = _heads(num_heads)
        self.max_distance, self.bucket_size, self.max_position = max_distance, bucket_size, max_position
        self.pos_q = nn.Parameter(torch.randn(heads, 2 * max_distance, head_dim) * 0.02)
        self.pos_k = nn.Parameter(torch.randn(heads, 2 * max_distance, head_dim) * 0.02)

    def forward(self, q, k):
        return pe.deberta_logits(
            q, k, self.pos_q, self.pos_k, max_distance=self.max_distance, bucket_size=self.bucket_size, max_position=self.max_position
        )


def _heads(num_heads):
    if not isinstance(num_heads, int) or isinstance(num_heads, bool) or num_heads < 1:
        raise ValueError(f"num_heads must be a positive integer, got {num_heads!r}")
    return num_heads
