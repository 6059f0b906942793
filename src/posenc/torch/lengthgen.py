"""Modules for the encodings built for length generalisation: FIRE, KERPLE, Sandwich, CoPE and
randomised positions (module protocol: :class:`posenc.torch.PositionalModule`)."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

import posenc as pe
from posenc import _validate as check
from posenc._xp import torch_func_transforming

from ._protocol import PositionalModule, allocatable, biased_scores, dot_scores, positive_int, widened


class FIRE(PositionalModule):
    """FIRE (Li et al., ICLR 2024): the scaled dot product plus :func:`posenc.fire_bias` of
    a learned MLP ``1 -> mlp_width -> heads`` (ReLU), learned ``c`` and threshold ``L``.

    As in the paper's code, ``L = |threshold * L_multiplier|`` with ``threshold`` fixed and
    ``L_multiplier`` (initialised to 1) learned. FIRE is meant for causal attention. Takes per-token positions (``takes_positions``).
    """

    takes_positions = True
    takes_row_offsets = True

    def __init__(self, num_heads: int, *, mlp_width: int = 32, c: float = 0.1, threshold: float = 512.0, eps: float = 1e-6):
        super().__init__()
        heads, width = positive_int("num_heads", num_heads), positive_int("mlp_width", mlp_width)
        pe.fire_distances(1, 1, c=c, threshold=threshold, eps=eps)  # validates the options now
        allocatable("FIRE", **{"mlp weight": (heads, width)})
        self.num_heads, self.mlp_width, self.init_c, self.threshold, self.eps = heads, width, c, threshold, eps
        self.mlp = nn.Sequential(nn.Linear(1, width), nn.ReLU(), nn.Linear(width, heads))
        self.c = nn.Parameter(torch.tensor(float(c)))
        self.L_multiplier = nn.Parameter(torch.tensor(1.0))

    def options(self):
        return {"num_heads": self.num_heads, "mlp_width": self.mlp_width, "c": self.init_c, "threshold": self.threshold, "eps": self.eps}

    def bias(self, q_len: int, k_len: int, *, offset=None, query_positions=None, key_positions=None) -> torch.Tensor:
        """``[heads, q_len, k_len]`` (``[..., heads, q_len, k_len]`` with per-token positions)."""
        return pe.fire_bias(
            self.mlp, q_len, k_len, offset=offset, c=self.c, threshold=self.L_multiplier * self.threshold, eps=self.eps,
            query_positions=query_positions, key_positions=key_positions, xp=torch, dtype=self.c.dtype,
        )  # fmt: skip

    def scores(self, q, k, offset, **positions):
        return biased_scores(q, k, self.bias(q.shape[-2], k.shape[-2], offset=offset, **positions))


class KERPLE(PositionalModule):
    """KERPLE (Chi et al., NeurIPS 2022): the scaled dot product plus
    :func:`posenc.kerple_bias` with learned ``r1, r2 [heads]``, kept positive by clamping at
    ``eps`` (``r2 <= 2`` too for ``kind="power"``) in place before each use, as the paper's code
    does (under a ``torch.func`` transform the clamped values are used, not written back). Initial values as in the authors' ``ParallelKerpleLog`` / ``ParallelKerplePower``
    (github.com/chijames/KERPLE, ``megatron/mpu/layers.py``): the parameter that may reach 2 is
    drawn first, uniform in ``(0, 2)``, then the other, uniform in ``(0, 1)``, from torch's
    generator: the multiplier ``r1 ~ U(0, 2)`` and ``r2 ~ U(0, 1)`` inside the logarithm for
    ``kind="log"``; the exponent ``r2 ~ U(0, 2)`` and the multiplier ``r1 ~ U(0, 1)`` for
    ``kind="power"``. Takes per-token positions (``takes_positions``).
    """

    takes_positions = True
    takes_row_offsets = True

    def __init__(self, num_heads: int, *, kind: str = "log", eps: float = 1e-2):
        super().__init__()
        heads = positive_int("num_heads", num_heads)
        if kind not in pe.relative.kerple.KERPLE_KINDS:
            raise ValueError(f"kind must be 'log' or 'power', got {kind!r}")
        self.num_heads, self.kind, self.eps = heads, kind, eps
        allocatable("KERPLE", r1=(heads,), r2=(heads,))
        up_to_2, up_to_1 = torch.rand(heads) * 2, torch.rand(heads)
        r1, r2 = (up_to_2, up_to_1) if kind == "log" else (up_to_1, up_to_2)
        self.r1, self.r2 = nn.Parameter(r1), nn.Parameter(r2)

    def options(self):
        return {"num_heads": self.num_heads, "kind": self.kind, "eps": self.eps}

    def _clamped(self):
        """``(r1, r2)`` clamped to their range, the gradient passing unclamped. The paper's code
        clamps the values (``.data``) in place; torch.export traces no ``.data``: there the
        parameter itself, outside autograd. A ``torch.func`` transform may neither write to a
        parameter it captured nor read ``.data`` under ``vmap``: there the clamped values are
        ``clamp(p).detach() + (p - p.detach())``, the same values (``p - p.detach()`` is 0) and
        gradients, not written back."""
        ranges = ((self.r1, None), (self.r2, 2.0 if self.kind == "power" else None))
        if torch_func_transforming():
            return tuple(p.detach().clamp(self.eps, high) + (p - p.detach()) for p, high in ranges)
        exporting = torch.compiler.is_exporting()
        with torch.no_grad():
            for parameter, high in ranges:
                (parameter if exporting else parameter.data).clamp_(self.eps, high)
        return self.r1, self.r2

    def bias(self, q_len: int, k_len: int, *, offset=None, query_positions=None, key_positions=None) -> torch.Tensor:
        r1, r2 = self._clamped()
        return pe.kerple_bias(r1, r2, q_len, k_len, kind=self.kind, offset=offset, query_positions=query_positions, key_positions=key_positions)

    def scores(self, q, k, offset, **positions):
        r1, r2 = self._clamped()
        bias = pe.kerple_bias(widened(r1), widened(r2), q.shape[-2], k.shape[-2], kind=self.kind, offset=offset, **positions)
        return biased_scores(q, k, bias)


class Sandwich(PositionalModule):
    """Sandwich (Chi et al., ACL 2023): the scaled dot product plus the parameter-free
    :func:`posenc.sandwich_bias` of ``dim``-dimensional sinusoids, one compression per head.
    Takes per-token positions (``takes_positions``)."""

    takes_positions = True
    takes_row_offsets = True

    def __init__(self, num_heads: int, *, dim: int = 128, base: float = 10000.0):
        super().__init__()
        pe.sandwich_vector(1, 1, dim, heads=num_heads, base=base)  # validates the options now
        self.num_heads, self.dim, self.base = num_heads, dim, base

    def options(self):
        return {"num_heads": self.num_heads, "dim": self.dim, "base": self.base}

    def bias(self, q_len: int, k_len: int, *, offset=None, query_positions=None, key_positions=None, device=None, dtype=None) -> torch.Tensor:
        return pe.sandwich_bias(
            q_len, k_len, self.dim, heads=self.num_heads, offset=offset, base=self.base, query_positions=query_positions,
            key_positions=key_positions, xp=torch, device=device, dtype=dtype,
        )  # fmt: skip

    def scores(self, q, k, offset, **positions):
        return dot_scores(q, k) + self.bias(q.shape[-2], k.shape[-2], offset=offset, **positions, device=q.device, dtype=q.dtype)


class CoPE(PositionalModule):
    """CoPE (Golovneva et al., 2024): :func:`posenc.cope_logits` with learned position
    embeddings ``pos_emb [npos_max, head_dim]`` (zeros at first, as in the paper's code),
    shared by the heads. Gates count the keys up to the query (``causal=True``, decoders)
    or every key from ``j`` on (``causal=False``); ``attend``'s ``mask`` (and ``causal``)
    hide keys from the count too, as the paper's code gates the masked logits. ``scale``
    multiplies ``q.k`` in the gates and the logits (default ``1/sqrt(head_dim)``, as the
    paper's code; ``scale=1.0`` is the paper's text)."""

    def __init__(self, head_dim: int, *, npos_max: int = 64, causal: bool = True, scale: float | None = None):
        super().__init__()
        self.head_dim, self.npos_max, self.causal = positive_int("head_dim", head_dim), positive_int("npos_max", npos_max), causal
        self.scale = None if scale is None else check.real("scale", scale, positive=True)
        allocatable("CoPE", pos_emb=(npos_max, head_dim))
        self.pos_emb = nn.Parameter(torch.zeros(npos_max, head_dim))

    def options(self):
        return {"head_dim": self.head_dim, "npos_max": self.npos_max, "causal": self.causal, "scale": self.scale}

    takes_mask = True
    takes_row_offsets = True

    def scores(self, q, k, offset, mask=None):
        work = torch.promote_types(q.dtype, self.pos_emb.dtype)  # (16-bit queries: the float32 logits, rounded once by logits)
        return pe.cope_logits(q.to(work), k.to(work), self.pos_emb.to(work), causal=self.causal, offset=offset, scale=self.scale, mask=mask)


class RandomizedRoPE(PositionalModule):
    """RoPE on randomised positions (Ruoss et al., ACL 2023).

    ``embed`` draws, for every batch row, a sorted random subset of ``range(max_length)``
    (:func:`posenc.randomized_positions`, from the module's own seeded generator) and
    leaves ``x`` unchanged; every ``attend``/``logits`` call until the next ``embed`` then
    rotates q and k at those positions (key ``j`` at ``drawn[j]``, query ``i`` at
    ``drawn[offset + i]``). The paper samples at evaluation time too; so does this module.
    Without drawn positions for ``k_len`` keys that cover the queries, positions are the
    plain ``arange`` (RoPE).
    """

    def __init__(self, head_dim: int, *, max_length: int, base: float = 10000.0, seed: int = 0):
        super().__init__()
        max_length = check.integer("max_length", positive_int("max_length", max_length))  # (its positions are int64)
        self.head_dim, self.max_length, self.base, self.seed = positive_int("head_dim", head_dim), max_length, base, seed
        self.rng = np.random.default_rng(seed)
        self.positions = None

    def options(self):
        return {"head_dim": self.head_dim, "max_length": self.max_length, "base": self.base, "seed": self.seed}

    def embed(self, x, positions=None, *, offset=0):
        if positions is None:
            positions = pe.randomized_positions(x.shape[-2], self.max_length, rng=self.rng, batch=x.shape[0], xp=torch, device=x.device)
        self.positions = positions
        return x

    def scores(self, q, k, offset):
        q_len, k_len = q.shape[-2], k.shape[-2]
        drawn = self.positions
        if drawn is not None and drawn.shape[-1] == k_len and isinstance(offset, int) and 0 <= offset <= k_len - q_len:
            keys = drawn[:, None, :] if drawn.ndim == 2 else drawn
            queries = keys[..., offset : offset + q_len]
        else:
            keys, queries = torch.arange(k_len, device=k.device), offset + torch.arange(q_len, device=q.device)
        return dot_scores(pe.rope(q, queries, base=self.base, seq_axis=-2), pe.rope(k, keys, base=self.base, seq_axis=-2))
