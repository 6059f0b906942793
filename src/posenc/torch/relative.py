"""Relative encodings that compute their own logits from the queries and keys."""

from __future__ import annotations

import math

import torch
from torch import nn

import posenc as pe
from posenc import _validate as check
from posenc.relative.deberta import TERMS

from ._protocol import PositionalModule, allocatable, positive_int, within_int64
from .biases import _DistanceBias


class ShawRelative(PositionalModule):
    """Shaw et al.'s relative attention with learned ``table_k``/``table_v [2K+1, head_dim]``.

    ``logits``: :func:`posenc.shaw_logits` over ``sqrt(head_dim)``; ``attend`` adds
    :func:`posenc.shaw_output`'s value term ``sum_j w_ij table_v[clip(rel_ij)]``.
    ``forward`` is ``attend``. ``q, k, v`` are ``[batch, heads, seq, head_dim]``; per-token
    ``query_positions``/``key_positions`` (leading axes the batch) go to both functions.
    Never builds a ``[q_len, k_len, d]`` tensor.
    """

    takes_positions = True
    takes_row_offsets = True

    def __init__(self, head_dim: int, *, max_distance: int):
        super().__init__()
        positive_int("head_dim", head_dim)
        self.head_dim, self.max_distance = head_dim, positive_int("max_distance", max_distance, minimum=0)
        allocatable("ShawRelative", table_k=(2 * max_distance + 1, head_dim), table_v=(2 * max_distance + 1, head_dim))
        self.table_k = nn.Parameter(torch.randn(2 * max_distance + 1, head_dim) * 0.02)
        self.table_v = nn.Parameter(torch.randn(2 * max_distance + 1, head_dim) * 0.02)

    def options(self):
        return {"head_dim": self.head_dim, "max_distance": self.max_distance}

    def scores(self, q, k, offset, **positions):
        return pe.shaw_logits(q, k, self.table_k, max_distance=self.max_distance, offset=offset, **positions) / math.sqrt(q.shape[-1])

    def values(self, weights, v, offset, **positions):
        return pe.shaw_output(weights, v, self.table_v, max_distance=self.max_distance, offset=offset, **positions)


class DeBERTaRelative(PositionalModule):
    """DeBERTa's disentangled attention logits with learned relative embeddings.

    ``pos_q``/``pos_k`` are ``[heads, 2K, head_dim]`` parameters (the relative embeddings
    already projected per head; only those of the ``terms`` in use exist). ``logits``
    (and ``forward(q, k, *, offset=None)``) return :func:`posenc.deberta_logits`:
    content-to-content plus the ``terms`` (content-to-position, position-to-content),
    over ``sqrt((1 + len(terms)) * head_dim)``. ``q, k`` are ``[batch, heads, seq,
    head_dim]``; per-token ``query_positions``/``key_positions`` (leading axes the batch)
    go to :func:`posenc.deberta_logits`.
    """

    takes_positions = True
    takes_row_offsets = True

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
        tables = tuple(name for name, term in (("pos_q", "p2c"), ("pos_k", "c2p")) if term in terms)
        allocatable("DeBERTaRelative", **dict.fromkeys(tables, (heads, 2 * max_distance, head_dim)))
        self.max_distance, self.bucket_size, self.max_position = max_distance, bucket_size, max_position
        for name in ("pos_q", "pos_k"):
            self.register_parameter(name, nn.Parameter(torch.randn(heads, 2 * max_distance, head_dim) * 0.02) if name in tables else None)

    def options(self):
        return {"num_heads": self.num_heads, "head_dim": self.head_dim, "max_distance": self.max_distance,
                "bucket_size": self.bucket_size, "max_position": self.max_position, "terms": self.terms}

    def forward(self, q, k, *, offset=None, query_positions=None, key_positions=None):
        return self.logits(q, k, offset=offset, query_positions=query_positions, key_positions=key_positions)

    def scores(self, q, k, offset, **positions):
        return pe.deberta_logits(q, k, self.pos_q, self.pos_k, max_distance=self.max_distance, bucket_size=self.bucket_size,
                                 max_position=self.max_position, terms=self.terms, offset=offset, **positions)


class TransformerXLRelative(PositionalModule):
    r"""Transformer-XL's relative attention (:func:`posenc.xl_logits`) with its learned parts.

    .. math:: A_{ij} = \frac{(q_i + u) \cdot k_j + (q_i + v) \cdot (R_{i-j} W_R)}{\sqrt{d}}

    Dai et al., "Transformer-XL" (2019): ``R_t`` is the sinusoidal embedding
    (:func:`posenc.sinusoidal`, width ``dim``, ``base``, ``layout``) of the relative
    distance ``t = (offset + i) - j``, projected per head by the learned ``r_proj [heads,
    dim, head_dim]`` (:math:`W_{k,R}`); ``u``, ``v [heads, 1, head_dim]`` are the learned
    global content and position biases. The relative embeddings are built for the
    ``k_len + q_len`` distances of the call (future keys included, so it serves encoders
    too); Transformer-XL's memory is simply the keys before the queries (``offset=None``).
    ``q, k, v`` are ``[batch, heads, seq, head_dim]``. The released Transformer-XL and XLNet
    code lays ``R_t`` out as all sines, then all cosines: ``layout="half"`` to port their
    weights (the default, ``"interleaved"``, only permutes ``r_proj``'s rows when training).
    """

    def __init__(self, num_heads: int, head_dim: int, *, dim: int | None = None, base: float = 10000.0, layout: str = "interleaved"):
        super().__init__()
        layout = check.layout("layout", layout)
        heads = positive_int("num_heads", num_heads)
        positive_int("head_dim", head_dim)
        dim = heads * head_dim if dim is None else dim
        pe.sinusoidal(0, dim, base=base, layout=layout)  # validates the arguments now
        self.num_heads, self.head_dim, self.dim, self.base, self.layout = heads, head_dim, dim, base, layout
        allocatable("TransformerXLRelative", r_proj=(heads, dim, head_dim), u=(heads, 1, head_dim), v=(heads, 1, head_dim))
        self.r_proj = nn.Parameter(torch.randn(heads, dim, head_dim) / math.sqrt(dim))
        self.u = nn.Parameter(torch.randn(heads, 1, head_dim) * 0.02)
        self.v = nn.Parameter(torch.randn(heads, 1, head_dim) * 0.02)

    def options(self):
        return {"num_heads": self.num_heads, "head_dim": self.head_dim, "dim": self.dim, "base": self.base, "layout": self.layout}

    keeps_device_offset = True

    def relative_embeddings(self, q_len: int, k_len: int, offset) -> torch.Tensor:
        """``r [heads, k_len + q_len, head_dim]``: row ``c`` for the distance ``offset + q_len - 1 - c``
        (xl_logits' rows ``k_len - 1 .. -q_len``, moved by ``offset - (k_len - q_len)``). A 0-d
        ``offset`` tensor on an accelerator is clamped there to the offsets the host accepts
        (:func:`posenc.relative.indices.saturated`), not read."""
        offset = within_int64(offset, q_len, k_len)
        distances = (offset - (k_len - q_len)) + torch.arange(k_len - 1, -q_len - 1, -1, device=self.r_proj.device)
        return pe.sinusoidal(distances, self.dim, base=self.base, layout=self.layout, dtype=self.r_proj.dtype) @ self.r_proj

    def scores(self, q, k, offset):
        r = self.relative_embeddings(q.shape[-2], k.shape[-2], offset)
        return pe.xl_logits(q, k, r, self.u, self.v) / math.sqrt(q.shape[-1])


class TENERRelative(PositionalModule):
    r"""TENER's direction-aware relative attention (:func:`posenc.tener_logits`), unscaled.

    .. math:: A_{ij} = (q_i + u) \cdot k_j + (q_i + v) \cdot R_{i-j}

    Yan et al., "TENER" (2019): ``R_t`` is the fixed sinusoid of the signed distance
    (``base``, ``layout``), ``u``, ``v [heads, 1, head_dim]`` learned. The paper leaves the
    logits unscaled (it found the sharper attention better for NER), so ``logits`` has no
    ``1/sqrt(head_dim)``. ``q, k, v`` are ``[batch, heads, seq, head_dim]``. TENER's released
    code puts the sines first, then the cosines: ``layout="half"`` to port its weights. One
    ``offset`` per batch row gives row ``b`` the logits of the call on that row alone with
    ``offset[b]`` (one product of its queries and sinusoids per row).
    """

    takes_row_offsets = True

    def __init__(self, num_heads: int, head_dim: int, *, base: float = 10000.0, layout: str = "interleaved"):
        super().__init__()
        layout = check.layout("layout", layout)
        heads = positive_int("num_heads", num_heads)
        pe.sinusoidal(0, positive_int("head_dim", head_dim), base=base, layout=layout)  # validates the arguments now
        self.num_heads, self.head_dim, self.base, self.layout = heads, head_dim, base, layout
        allocatable("TENERRelative", u=(heads, 1, head_dim), v=(heads, 1, head_dim))
        self.u = nn.Parameter(torch.randn(heads, 1, head_dim) * 0.02)
        self.v = nn.Parameter(torch.randn(heads, 1, head_dim) * 0.02)

    def options(self):
        return {"num_heads": self.num_heads, "head_dim": self.head_dim, "base": self.base, "layout": self.layout}

    def scores(self, q, k, offset):
        return pe.tener_logits(q, k, self.u, self.v, base=self.base, offset=offset, layout=self.layout)


class TUPE(PositionalModule):
    r"""TUPE's untied positional attention (:func:`posenc.tupe_logits`) with a learned table.

    .. math:: A_{ij} = \frac{q_i \cdot k_j + (p_{i} U^Q) \cdot (p_j U^K)}{\sqrt{2d}}

    Ke, He and Liu (2021): the absolute table ``p [max_positions, dim]`` is not added to
    the tokens (``embed`` returns ``x``) but correlated apart through the learned
    projections ``uq``, ``uk [heads, dim, head_dim]``. ``untie_cls=True`` learns the
    paper's :math:`\theta_1, \theta_2` per head (``cls [2, heads]``: the positional term
    of the ``[CLS]`` token at position 0 to the others and of the others to it). Queries
    sit at ``offset + arange(q_len)``, keys at ``arange(k_len)``, both below
    ``max_positions``. ``bias``, a bias module (``T5RelativeBias``, ``ALiBi``), adds its
    relative bias: TUPE-R (with ``untie_cls``, not in the ``[CLS]`` row and column, which
    ``cls`` replaces whole). ``q, k, v`` are ``[batch, heads, seq, head_dim]``. ``offset``
    goes to :func:`posenc.tupe_logits`, which takes the queries' rows of ``p`` at ``offset
    + arange(q_len)``: a decode step costs ``O(q_len k_len)``, and a tensor offset stays a
    tensor under ``torch.compile``; one per batch row makes one such product per row.
    """

    takes_row_offsets = True

    def __init__(self, num_heads: int, head_dim: int, *, max_positions: int, dim: int | None = None, untie_cls: bool = False, bias=None):
        super().__init__()
        heads = positive_int("num_heads", num_heads)
        positive_int("head_dim", head_dim)
        positive_int("max_positions", max_positions)
        dim = positive_int("dim", heads * head_dim if dim is None else dim)
        check.flag("untie_cls", untie_cls)
        if bias is not None and not isinstance(bias, _DistanceBias):
            raise TypeError(f"bias must be a bias module (T5RelativeBias, ALiBi) or None, got {type(bias).__name__}")
        allocatable("TUPE", p=(max_positions, dim), uq=(heads, dim, head_dim), uk=(heads, dim, head_dim))
        self.num_heads, self.head_dim, self.max_positions, self.dim = heads, head_dim, max_positions, dim
        self.p = nn.Parameter(torch.randn(max_positions, dim) * 0.02)
        self.uq = nn.Parameter(torch.randn(heads, dim, head_dim) / math.sqrt(dim))
        self.uk = nn.Parameter(torch.randn(heads, dim, head_dim) / math.sqrt(dim))
        self.register_parameter("cls", nn.Parameter(torch.zeros(2, heads)) if untie_cls else None)
        self.bias = bias

    def options(self):
        return {"num_heads": self.num_heads, "head_dim": self.head_dim, "max_positions": self.max_positions, "dim": self.dim,
                "untie_cls": self.cls is not None}

    def scores(self, q, k, offset):
        q_len, k_len = q.shape[-2], k.shape[-2]
        if isinstance(offset, int) and max(offset + q_len, k_len) > self.max_positions:  # a traced offset is not checked
            raise ValueError(
                f"TUPE positions must lie in [0, max_positions = {self.max_positions}), got queries {offset}..{offset + q_len - 1} "
                f"and keys 0..{k_len - 1}"
            )
        cls = None if self.cls is None else (self.cls[0], self.cls[1])
        bias = None if self.bias is None else self.bias(q_len, k_len, offset=offset).to(torch.promote_types(q.dtype, self.p.dtype))
        return pe.tupe_logits(q, k, self.p, self.uq, self.uk, offset=offset, bias=bias, cls=cls)
