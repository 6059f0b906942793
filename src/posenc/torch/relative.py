"""Relative encodings that compute their own logits from the queries and keys."""

from __future__ import annotations

import math

import torch
from torch import nn

import posenc as pe
from posenc.relative.deberta import TERMS

from ._protocol import PositionalModule, positive_int


class ShawRelative(PositionalModule):
    """Shaw et al.'s relative attention with learned ``table_k``/``table_v [2K+1, head_dim]``.

    ``logits``: :func:`posenc.shaw_logits` over ``sqrt(head_dim)``; ``attend`` adds
    :func:`posenc.shaw_output`'s value term ``sum_j w_ij table_v[clip(rel_ij)]``.
    ``forward`` is ``attend``. Never builds a ``[q_len, k_len, d]`` tensor.
    """

    def __init__(self, head_dim: int, *, max_distance: int):
        super().__init__()
        positive_int("head_dim", head_dim)
        self.head_dim, self.max_distance = head_dim, positive_int("max_distance", max_distance, minimum=0)
        self.table_k = nn.Parameter(torch.randn(2 * max_distance + 1, head_dim) * 0.02)
        self.table_v = nn.Parameter(torch.randn(2 * max_distance + 1, head_dim) * 0.02)

    def options(self):
        return {"head_dim": self.head_dim, "max_distance": self.max_distance}

    def scores(self, q, k, offset):
        return pe.shaw_logits(q, k, self.table_k, max_distance=self.max_distance, offset=offset) / math.sqrt(q.shape[-1])

    def values(self, weights, v, offset):
        return pe.shaw_output(weights, v, self.table_v, max_distance=self.max_distance, offset=offset)


class DeBERTaRelative(PositionalModule):
    """DeBERTa's disentangled attention logits with learned relative embeddings.

    ``pos_q``/``pos_k`` are ``[heads, 2K, head_dim]`` parameters (the relative embeddings
    already projected per head; only those of the ``terms`` in use exist). ``logits``
    (and ``forward(q, k, *, offset=None)``) return :func:`posenc.deberta_logits`:
    content-to-content plus the ``terms`` (content-to-position, position-to-content),
    over ``sqrt((1 + len(terms)) * head_dim)``.
    """

    def __init__(self, num_heads: int, head_dim: int, *, max_distance: int, bucket_size: int | None = None,
                 max_position: int | None = None, terms=TERMS):
        super().__init__()
        heads = positive_int("num_heads", num_heads)
        positive_int("head_dim", head_dim)
        positive_int("max_distance", max_distance)
        terms = tuple(terms)
        if not terms or any(t not in TERMS for t in terms) or len(set(terms)) != len(terms):
            raise ValueError(f"terms must be a non-empty subset of {TERMS!r}, got {terms!r}")
        self.num_heads, self.head_dim, self.terms = heads, head_dim, terms
        self.max_distance, self.bucket_size, self.max_position = max_distance, bucket_size, max_position
        for name, term in (("pos_q", "p2c"), ("pos_k", "c2p")):
            table = nn.Parameter(torch.randn(heads, 2 * max_distance, head_dim) * 0.02) if term in terms else None
            self.register_parameter(name, table)

    def options(self):
        return {"num_heads": self.num_heads, "head_dim": self.head_dim, "max_distance": self.max_distance,
                "bucket_size": self.bucket_size, "max_position": self.max_position, "terms": self.terms}

    def forward(self, q, k, *, offset=None):
        return self.logits(q, k, offset=offset)

    def scores(self, q, k, offset):
        return pe.deberta_logits(q, k, self.pos_q, self.pos_k, max_distance=self.max_distance, bucket_size=self.bucket_size,
                                 max_position=self.max_position, terms=self.terms, offset=offset)
