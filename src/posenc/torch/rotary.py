"""Rotary encodings: RoPE and xPos rotate the queries and keys before the dot product."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch

import posenc as pe
from posenc import _validate as check

from ._protocol import PositionalModule, dot_scores, within_int64


class RotaryEmbedding(PositionalModule):
    """Rotary position embedding (:func:`posenc.rope`) for queries and keys.

    ``forward(q, k, positions=None, *, offset=0, seq_len=None) -> (q, k)`` rotates the first
    ``rotary_dim`` channels of both at the same positions (``[batch, heads, seq, head_dim]``,
    sequence axis ``-2``; ``positions`` as in :func:`posenc.rope`). The module holds no
    state that depends on the input: length-dependent scalings (``DynamicNTK``,
    ``LongRoPE``) are decided per call from the positions (the largest + 1, or
    ``seq_len``), exactly as :func:`posenc.rope` decides them, and q and k use the same
    frequencies. ``offset`` and ``seq_len`` may hold one value per batch row (``[batch]``
    integer tensors: a batch of requests at different lengths); without ``positions`` a
    row's length is its ``offset`` plus the longer of ``q`` and ``k``. Angles are float64; on the kernel path the rotation is the
    ``posenc::rope_rotate`` custom op (backward: the inverse rotation), so
    ``torch.compile(fullgraph=True)`` traces through it.

    The protocol's ``logits(q, k, *, offset=None)`` rotates the queries at ``offset +
    arange(q_len)`` and the keys at ``arange(k_len)`` (one ``seq_len``, the longer of the
    two, for both) and returns the dot product over ``sqrt(head_dim)``. The read-only
    ``inv_freq`` and ``attention_scale`` are :func:`posenc.rope_frequencies` of the options
    (for a length-dependent scaling: at its original length), as transformers' rotary
    modules expose them.
    """

    @property
    def keeps_device_offset(self):
        # (a length-dependent scaling reads its length, offset + the longer length, on the host)
        return not self._uses_seq_len()

    def __init__(self, head_dim: int, *, base: float = 10000.0, scaling=None, layout: str = "half", rotary_dim: int | None = None):
        super().__init__()
        self.head_dim = head_dim
        self.rotary_dim = head_dim if rotary_dim is None else rotary_dim
        if self.rotary_dim > head_dim:
            raise ValueError(f"rotary_dim must be <= head_dim = {head_dim}, got {self.rotary_dim}")
        layout = check.layout("layout", layout)
        self.base, self.scaling, self.layout = base, scaling, layout
        pe.rope_frequencies(self.rotary_dim, base=base, scaling=scaling)  # validates the arguments now

    @classmethod
    def from_hf(cls, config, *, head_dim: int | None = None, max_position_embeddings: int | None = None, layer_type=None, layout: str = "half"):
        """From a transformers config or its ``rope_parameters`` dict (see :func:`posenc.scaling.from_hf`)."""
        hf = pe.scaling.from_hf(config, head_dim=head_dim, max_position_embeddings=max_position_embeddings, layer_type=layer_type)
        head = head_dim if head_dim is not None or config is None or isinstance(config, Mapping) else pe.scaling.config_head_dim(pe.scaling.layer_config(config, layer_type))
        return cls(head if head is not None else hf.rotary_dim, base=hf.base, scaling=hf.scaling, layout=layout, rotary_dim=hf.rotary_dim)

    @property
    def inv_freq(self) -> torch.Tensor:
        """``[rotary_dim / 2]`` float64 inverse frequencies (a new tensor; read-only)."""
        return pe.rope_frequencies(self.rotary_dim, base=self.base, scaling=self.scaling, xp=torch, dtype=torch.float64)[0]

    @property
    def attention_scale(self) -> float:
        """The factor that multiplies ``cos`` and ``sin`` (YaRN's temperature, ...; 1 otherwise)."""
        return pe.rope_frequencies(self.rotary_dim, base=self.base, scaling=self.scaling)[1]

    def options(self):
        return {"head_dim": self.head_dim, "base": self.base, "scaling": self.scaling, "layout": self.layout, "rotary_dim": self.rotary_dim}

    def _rope_options(self):
        # [batch, heads, seq, head_dim]
        return {"base": self.base, "scaling": self.scaling, "layout": self.layout, "rotary_dim": self.rotary_dim, "seq_axis": -2}

    def rotate(self, x: torch.Tensor, positions: torch.Tensor | None = None, *, offset=0, inverse: bool = False, seq_len=None) -> torch.Tensor:
        """One tensor: :func:`posenc.rope` with this module's options."""
        if isinstance(x, torch.Tensor) and x.ndim and x.shape[-1] != self.head_dim:
            raise ValueError(f"x must have the module's head_dim = {self.head_dim} channels, got shape {tuple(x.shape)}")
        return pe.rope(x, positions, offset=offset, inverse=inverse, seq_len=seq_len, **self._rope_options())

    def forward(self, q, k, positions=None, *, offset=0, seq_len=None):
        for name, x in (("q", q), ("k", k)):
            _rotatable(name, x, self.head_dim)
        if seq_len is None and positions is None and self._uses_seq_len():
            # The longer of the two decides, for both; positions all negative give length 0, as rope reads them.
            seq_len = _longer(_widened(offset) + max(q.shape[-2], k.shape[-2]), 0)
        return self.rotate(q, positions, offset=offset, seq_len=seq_len), self.rotate(k, positions, offset=offset, seq_len=seq_len)

    def _uses_seq_len(self):
        return self.scaling is not None and self.scaling.uses_seq_len

    def scores(self, q, k, offset):
        seq_len = _longer(offset + q.shape[-2], k.shape[-2]) if self._uses_seq_len() else None
        return dot_scores(self.rotate(q, offset=offset, seq_len=seq_len), self.rotate(k, seq_len=seq_len))


def _rotatable(name, x, head_dim):
    """``x`` (the module's ``q`` or ``k``): a real floating tensor of ``head_dim`` channels, else the error naming it."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch tensor, got {type(x).__name__}")
    if not x.dtype.is_floating_point:
        raise TypeError(f"{name} must have a real floating dtype (float16, bfloat16, float32, float64), got {x.dtype}")
    if x.ndim == 0 or x.shape[-1] != head_dim:
        raise ValueError(f"{name} must have the module's head_dim = {head_dim} channels, got shape {tuple(x.shape)}")


def _widened(offset):
    """An integer ``offset`` whose sum with a length cannot wrap: a NumPy integer as its int,
    an array of a narrower integer dtype as int64 (uint8 ``250 + 10`` is 4, int8 ``120 + 10``
    is -126); anything else as it is, for :func:`posenc.rope` to judge."""
    if isinstance(offset, np.integer):
        return int(offset)
    if isinstance(offset, torch.Tensor) and offset.dtype in _NARROW_INTEGERS:
        return offset.to(torch.int64)
    if isinstance(offset, np.ndarray) and offset.dtype.kind in "iu" and offset.dtype.itemsize < 8:
        return offset.astype(np.int64)
    return offset


# Integer tensor dtypes that int64 holds, as posenc.rope widens them.
_NARROW_INTEGERS = (torch.int8, torch.uint8, torch.int16, torch.uint16, torch.int32, torch.uint32)


def _longer(length, other):
    """The larger of ``length`` (an int, or a tensor or NumPy array: one a row) and the int ``other``."""
    if isinstance(length, torch.Tensor):
        return torch.clamp(length, min=other)
    if isinstance(length, np.ndarray):
        return np.maximum(length, other)
    return max(length, other)


class XPos(PositionalModule):
    r"""xPos (Sun et al., 2022): RoPE whose scores decay with the distance (:func:`posenc.xpos_scale`).

    .. math:: A_{ij} = \frac{(R_{m} q_i \, \zeta^{m/\gamma}) \cdot (R_{n} k_j \, \zeta^{-n/\gamma})}{\sqrt{d}},
              \qquad m = \text{offset} + i,\ n = j

    The queries are rotated (:func:`posenc.rope`, ``base``, ``layout``) and multiplied by
    the scale, the keys rotated and divided by it, so pair ``i`` of a score gains
    :math:`\zeta_i^{(m - n)/\gamma}` with :math:`\gamma` = ``scale_base``; ``q, k`` are
    ``[batch, heads, seq, head_dim]`` (sequence axis ``-2``). Both are
    centred at ``k_len // 2`` (as torchscale does; only ``m - n`` matters) and scaled in
    float32 at least (for 16-bit inputs too), so the factors stay in range for positions
    up to about ``70 * scale_base`` from the centre.
    """

    keeps_device_offset = True

    def __init__(self, head_dim: int, *, base: float = 10000.0, scale_base: float = 512, layout: str = "half"):
        super().__init__()
        layout = check.layout("layout", layout)
        pe.xpos_scale(torch.zeros(1), head_dim, scale_base=scale_base, layout=layout)  # validates the arguments now
        pe.rope_frequencies(head_dim, base=base)
        self.head_dim, self.base, self.scale_base, self.layout = head_dim, base, scale_base, layout

    def options(self):
        return {"head_dim": self.head_dim, "base": self.base, "scale_base": self.scale_base, "layout": self.layout}

    def scores(self, q, k, offset):
        q_len, k_len = q.shape[-2], k.shape[-2]
        offset = within_int64(offset, q_len, k_len)
        center = k_len // 2
        work = torch.promote_types(q.dtype, torch.float32)
        scale = {"scale_base": self.scale_base, "layout": self.layout, "dtype": work}
        q_scale = pe.xpos_scale(offset - center + torch.arange(q_len, device=q.device), q.shape[-1], **scale)
        k_scale = pe.xpos_scale(torch.arange(k_len, device=k.device) - center, k.shape[-1], **scale)
        rope = {"base": self.base, "layout": self.layout}
        logits = dot_scores(pe.rope(q, offset=offset, **rope).to(work) * q_scale, pe.rope(k, **rope).to(work) / k_scale)
        return logits.to(q.dtype)
