"""Absolute encodings (and none): they act on the token embeddings, attention is plain."""

from __future__ import annotations

import torch
from torch import nn

import posenc as pe
from posenc import _validate as check
from posenc.absolute.sinusoidal import embedded as embedded_sinusoidal
from posenc.rotary import _args

from ._protocol import PositionalModule, allocatable, positive_int


class NoPE(PositionalModule):
    """No positional encoding (Kazemnejad et al., 2023): ``embed`` returns ``x``, ``logits``
    is the plain scaled dot product of ``q, k [batch, heads, seq, head_dim]``; a causal
    mask is the only source of order."""

    keeps_device_offset = True


class SinusoidalEmbedding(PositionalModule):
    """Fixed sinusoidal table (:func:`posenc.sinusoidal`), added to the token embeddings.

    ``forward(positions) -> [..., dim]`` gives the table rows (float32 unless ``dtype``);
    ``embed(x, positions=None, *, offset=0)`` adds them to ``x [batch, seq, dim]`` in
    ``x``'s dtype, at ``positions + offset`` (``arange(seq)`` by default; ``offset`` an int or one per
    batch row). ``logits``/``attend``
    are plain scaled dot-product attention on ``q, k, v [batch, heads, seq, head_dim]``.
    """

    keeps_device_offset = True

    def __init__(self, dim: int, *, base: float = 10000.0, layout: str = "interleaved", dtype=None):
        super().__init__()
        layout = check.layout("layout", layout)
        pe.sinusoidal(0, dim, base=base, layout=layout, dtype=dtype, xp=torch)  # validates the arguments now
        self.dim, self.base, self.layout, self.dtype = dim, base, layout, dtype

    def options(self):
        return {"dim": self.dim, "base": self.base, "layout": self.layout, "dtype": self.dtype}

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        return pe.sinusoidal(positions, self.dim, base=self.base, layout=self.layout, dtype=self.dtype)

    def embed(self, x, positions=None, *, offset=0):
        return x + embedded_sinusoidal(x, positions, offset, self.dim, base=self.base, layout=self.layout)


class LearnedEmbedding(PositionalModule):
    """Learned absolute table ``weight [num_positions, dim]`` with hierarchical extension.

    ``forward(positions)`` looks rows up (a position outside ``[0, num_positions)`` is a
    ``ValueError`` that points to :meth:`extend`; under ``torch.compile`` or
    ``torch.func.vmap``, whose values cannot be read, torch's own indexing error); ``embed(x, positions=None, *,
    offset=0)`` adds them to ``x [batch, seq, dim]`` (``offset`` an int or one per batch row). ``logits``/``attend`` are plain
    scaled dot-product attention on ``q, k, v [batch, heads, seq, head_dim]``.
    """

    keeps_device_offset = True

    def __init__(self, num_positions: int, dim: int, *, alpha: float = 0.4):
        super().__init__()
        positive_int("num_positions", num_positions)
        positive_int("dim", dim)
        self.alpha = check.real("alpha", alpha, minimum=0.0, below=1.0)  # (extend's, checked now)
        allocatable("LearnedEmbedding", weight=(num_positions, dim))
        self.weight = nn.Parameter(torch.randn(num_positions, dim) * 0.02)

    @property
    def num_positions(self) -> int:
        return int(self.weight.shape[0])

    def options(self):
        return {"num_positions": self.num_positions, "dim": int(self.weight.shape[1]), "alpha": self.alpha}

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        if not isinstance(positions, torch.Tensor) or positions.dtype.is_floating_point or positions.dtype.is_complex or positions.dtype == torch.bool:
            raise TypeError(f"positions must be an integer tensor, got {getattr(positions, 'dtype', type(positions).__name__)}")
        if positions.dtype not in (torch.int32, torch.int64):  # (embedding reads these; uint64 beyond int64 reads negative: refused)
            positions = positions.to(torch.int64)
        if check.is_eager(positions) and positions.numel():
            low, high = int(positions.min()), int(positions.max())
            if low < 0 or high >= self.num_positions:
                hint = f": grow the table first with extend({high + 1})" if low >= 0 else ""
                raise ValueError(f"positions must lie in [0, num_positions = {self.num_positions}), got {low}..{high}{hint}")
        return nn.functional.embedding(positions, self.weight)

    def embed(self, x, positions=None, *, offset=0):
        return x + self(_args.embedded_positions(x, positions, offset)).to(x.dtype)

    @torch.no_grad()
    def extend(self, length: int) -> LearnedEmbedding:
        """Grow the table to ``length <= num_positions**2`` rows with :func:`posenc.hierarchical_extend`.

        The first ``num_positions`` rows stay the trained ones. ``weight`` is *replaced* by a
        new ``Parameter``: an optimizer built before holds the old one and no longer
        trains the table, so build the optimizer again (or add ``weight`` to it) after
        extending. Returns the module.
        """
        length = check.grown_length(length, self.num_positions)
        self.weight = nn.Parameter(pe.hierarchical_extend(self.weight.detach(), length, alpha=self.alpha))
        return self
