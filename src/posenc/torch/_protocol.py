"""The module protocol: one call shape for every positional encoding in ``posenc.torch``."""

from __future__ import annotations

import math

import torch
from torch import nn

from posenc.relative import indices
from posenc import _validate as check
from posenc._xp import namespace, on_accelerator


class PositionalModule(nn.Module):
    r"""Base of every positional module: ``embed``, ``logits`` and ``attend``.

    Every encoding answers the same three calls, so a model swaps encodings by one
    constructor argument:

    - ``embed(x, positions=None, *, offset=0)``: token embeddings ``x [batch, seq,
      d_model]`` with the absolute table added (absolute encodings) or unchanged.
    - ``logits(q, k, *, offset=None) -> [batch, heads, q_len, k_len]``: the pre-softmax
      scores with the encoding applied and the scale included (``1/sqrt(head_dim)`` unless
      the paper fixes another).
    - ``attend(q, k, v, *, causal=False, offset=None, mask=None) -> [batch, heads, q_len,
      d_v]``: :math:`\mathrm{softmax}(\text{logits} + \text{masks})\,v`, plus the
      module's own value term where its paper has one (Shaw's ``table_v``).

    ``q, k, v`` are ``[batch, heads, seq, head_dim]``, floating tensors of one dtype (of
    several under ``torch.autocast``, as its regions make them) and one device (``heads`` and ``head_dim`` the module's where its parameters fix them); ``logits``
    are of ``q``'s dtype and ``attend``'s output of ``v``'s, whatever the parameters' dtype
    (16-bit activations beside float32 parameters: computed as the functions promote them,
    rounded once). The queries sit at positions
    ``offset + arange(q_len)``, the keys at ``arange(k_len)``; ``offset=None`` is
    ``k_len - q_len`` (the queries are the last ``q_len`` keys, as after a KV cache), so
    a one-query call equals the last row of the full call. The modules of the relative
    biases and logits (``takes_row_offsets``: ``T5RelativeBias``, ``ALiBi``, ``ShawRelative``,
    ``DeBERTaRelative``, ``FIRE``, ``KERPLE``, ``Sandwich``, ``CoPE``, ``TUPE``, ``TENERRelative``) also
    take one ``offset`` per batch row, an integer tensor ``[batch]`` (a batch of caches of
    different lengths): the queries of row ``b`` at ``offset[b] + arange(q_len)``, its
    logits and output those of the call with ``offset[b]``, to the bit; the others refuse
    one with a ``TypeError``. The bias and relative-logits
    modules that take per-token positions (``takes_positions``: ``T5RelativeBias``,
    ``ALiBi``, ``ShawRelative``, ``DeBERTaRelative``, ``FIRE``, ``KERPLE``, ``Sandwich``)
    also accept integer
    ``query_positions [..., q_len]`` / ``key_positions [..., k_len]`` (leading axes: the
    batch, e.g. :func:`posenc.positions_from_mask` of a left-padded batch ``[batch, seq]``
    or :func:`posenc.positions_from_cu_seqlens` of a packed one ``[tokens]``), passed to
    their function with ``offset`` as given (which shifts ``query_positions``); the other
    modules refuse them with a ``TypeError``. ``causal`` always follows the token order
    (key ``j`` visible from query ``i`` when ``j <= offset + i``, ``offset=None`` being
    ``k_len - q_len``), whatever the positions: documents of a packed batch and padding
    are kept apart by ``mask``. ``mask`` is boolean,
    broadcasting against ``[batch, heads, q_len, k_len]``, ``True`` where the query may
    attend (torch sdpa's convention); ``causal=True`` lets query ``i`` see the keys
    ``j <= offset + i``. A query that may attend to no key gets zeros, never NaN.

    A subclass supplies what differs: ``embed`` (absolute encodings), ``scores(q, k,
    offset)`` (the logits with an int offset already resolved, or, for the modules that
    take one per batch row, a tensor: those, or a 0-d one on an accelerator, which is not
    read; default the plain scaled dot product) and ``values(weights, v, offset)`` (default ``weights @ v``), both with
    ``query_positions``/``key_positions`` keywords when ``takes_positions``. ``forward``
    is ``attend`` unless the subclass keeps an older meaning.
    """

    def embed(self, x: torch.Tensor, positions: torch.Tensor | None = None, *, offset=0) -> torch.Tensor:
        """Token embeddings with the absolute encoding applied; unchanged here."""
        return x

    def logits(self, q: torch.Tensor, k: torch.Tensor, *, offset=None, query_positions=None, key_positions=None) -> torch.Tensor:
        """Pre-softmax scores ``[batch, heads, q_len, k_len]``, scale included, of ``q``'s dtype
        (computed with the module's parameters as they are, then rounded once)."""
        _check_query_key(q, k, heads=self.num_heads, head_dim=self.head_dim)
        self._beside(q)
        offset, positions = self._alignment(q, k, offset, query_positions, key_positions, "logits")
        logits = self.scores(q, k, offset, **positions)
        return logits if logits.dtype == q.dtype else logits.to(q.dtype)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False, offset=None, mask=None,
               query_positions=None, key_positions=None) -> torch.Tensor:
        """Softmax attention ``[batch, heads, q_len, d_v]`` with this encoding, of ``v``'s dtype."""
        _check_query_key(q, k, v, heads=self.num_heads, head_dim=self.head_dim)
        self._beside(q)
        check.flag("causal", causal)
        offset, positions = self._alignment(q, k, offset, query_positions, key_positions, "attend")
        rows = (*offset.shape, 1) if indices.per_row(offset) else None  # (one offset per batch row: its axes lead)
        query_start = offset if rows or self._kept_on_device(offset, q) else indices.query_offset(offset, q.shape[-2], k.shape[-2])
        shape = (*torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], *(rows,) if rows else ()), q.shape[-2], k.shape[-2])
        allowed = allowed_keys(shape, q.device, causal=causal, offset=query_start, mask=mask)
        hidden = {"mask": allowed} if self.takes_mask and allowed is not None else {}
        logits = self.scores(q, k, offset, **positions, **hidden)
        weights = masked_softmax(logits, allowed)
        out = self.values(weights.to(v.dtype), v, offset, **positions)
        return out if out.dtype == v.dtype else out.to(v.dtype)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False, offset=None, mask=None,
                query_positions=None, key_positions=None) -> torch.Tensor:
        """:meth:`attend`."""
        return self.attend(q, k, v, causal=causal, offset=offset, mask=mask, query_positions=query_positions, key_positions=key_positions)

    #: The heads and head_dim the module's parameters fix (None: any), checked on every call.
    num_heads: int | None = None
    head_dim: int | None = None
    #: Whether ``scores``/``values`` take ``query_positions``/``key_positions`` (per-token positions).
    takes_positions = False
    #: Whether ``scores`` takes ``mask``, the keys each query may attend to (CoPE's gates count only those).
    takes_mask = False
    #: Whether ``logits`` and ``attend`` take one ``offset`` per batch row (``scores`` and ``values``
    #: giving each row the bits of its own offset's call).
    takes_row_offsets = False
    #: Whether ``scores``/``values`` take a 0-d offset tensor on an accelerator as it is (their
    #: functions clamp it there, not read it), as the modules that take one per row do.
    keeps_device_offset = False

    def _alignment(self, q, k, offset, query_positions, key_positions, call):
        """``(offset, positions)`` for ``scores``/``values``: the resolved ``offset`` and no
        positions; with per-token positions, ``offset`` as given (the functions default it:
        0 with ``query_positions``, ``k_len - q_len`` otherwise) and the positions. One
        ``offset`` per batch row is validated (:func:`row_offsets`) where the module takes it
        (``call``, the method, names it otherwise); so is a 0-d one on an accelerator
        (:meth:`_kept_on_device`), not read: the function it goes to clamps or reads it."""
        check.read_on_its_gpu("offset", offset, q.device)
        if indices.per_row(offset):
            if not self.takes_row_offsets:
                raise TypeError(f"{type(self).__name__}'s {call} takes one offset for every row, got one of shape {tuple(offset.shape)}: {ROWS}")
            offset = row_offsets(offset, q, k)
        kept = self._kept_on_device(offset, q)
        if kept:
            offset = row_offsets(offset, q, k)
        if query_positions is None and key_positions is None:
            return offset if kept or indices.per_row(offset) else indices.query_offset(offset, q.shape[-2], k.shape[-2]), {}
        if not self.takes_positions:
            raise TypeError(
                f"{type(self).__name__} takes no query_positions/key_positions (per-token positions: T5RelativeBias, ALiBi, "
                "ShawRelative, DeBERTaRelative, FIRE, KERPLE, Sandwich)"
            )
        return offset, {"query_positions": query_positions, "key_positions": key_positions}

    def _beside(self, q):
        """The module's parameters and buffers must be on ``q``'s device (``ValueError``
        naming the first that is not: torch's ``RuntimeError`` deep in the call otherwise)."""
        for tensors in (self.named_parameters(), self.named_buffers()):
            for name, t in tensors:
                if t.device != q.device:
                    raise ValueError(f"{type(self).__name__}.{name} is on {t.device}, q on {q.device}: move the module (module.to(q.device)) or q, k and v")

    def _kept_on_device(self, offset, q) -> bool:
        """Whether ``offset`` is a 0-d tensor on ``q``'s accelerator that this module's functions
        take as it is (``takes_row_offsets`` or ``keeps_device_offset``), so that it is not read
        here (a synchronisation, which a CUDA graph cannot hold)."""
        takes = self.takes_row_offsets or self.keeps_device_offset
        return takes and isinstance(offset, torch.Tensor) and offset.ndim == 0 and on_accelerator(offset) and offset.device == q.device

    def scores(self, q: torch.Tensor, k: torch.Tensor, offset) -> torch.Tensor:
        """The logits for a resolved ``offset``: here ``q k^T / sqrt(head_dim)``."""
        return dot_scores(q, k)

    def values(self, weights: torch.Tensor, v: torch.Tensor, offset, **positions) -> torch.Tensor:
        """The attention output of the softmax ``weights``: here ``weights @ v``."""
        return weights @ v

    def extra_repr(self) -> str:
        return ", ".join(f"{name}={value!r}" for name, value in self.options().items())

    def options(self) -> dict:
        """The constructor options, as shown by ``repr``."""
        return {}


ROWS = (
    "one per batch row is taken by the modules of the relative biases and logits (T5RelativeBias, ALiBi, DeBERTaRelative, "
    "FIRE, KERPLE, Sandwich, CoPE, TUPE, TENERRelative and ShawRelative)"
)


def within_int64(offset, q_len, k_len):
    """A module's resolved ``offset`` whose positions and distances must fit int64: an int as
    it is; a 0-d tensor kept on its accelerator (:meth:`PositionalModule._kept_on_device`)
    clamped there to the offsets the host accepts (``indices.saturated``, unbounded reach:
    their bits; past them, the nearest's), unread; a traced one as it is."""
    if not isinstance(offset, torch.Tensor):
        return offset
    clamped = indices.saturated(namespace(offset), offset, q_len, k_len, math.inf, offset.device)
    return offset if clamped is None else clamped


def row_offsets(offset, q, k):
    """One ``offset`` per batch row, an integer tensor (or NumPy array) ``[...]`` broadcasting
    against the batch axes of ``q``/``k`` before the heads axis, as an int64 tensor on their
    device; every query position ``offset + i`` and relative position ``(offset + i) - j``
    checked to stay within int64 (values that can be read now). On a GPU they are not read
    here: the function a module passes them to checks them (or, where its result saturates,
    clamps them) before any work."""
    if not isinstance(offset, torch.Tensor):
        check.array("offset", offset)
        if type(offset).__module__.split(".")[0] != "numpy":
            raise TypeError(f"offset must be a torch tensor (or a NumPy array) beside q and k, got {type(offset).__name__}")
        offset = torch.as_tensor(offset, device=q.device)
    if offset.dtype.is_floating_point or offset.dtype.is_complex or offset.dtype == torch.bool:
        raise TypeError(f"offset must have an integer dtype, got {offset.dtype}")
    if offset.device != q.device:
        raise TypeError(f"offset must be on q's device {q.device}, got {offset.device}")
    indices.module_rows(offset, q, k)
    q_len, k_len = q.shape[-2], k.shape[-2]
    xp = namespace(offset)
    offset = check.widened("offset", offset, xp, offset.device)
    if on_accelerator(offset):
        return offset
    extent = torch.tensor([min(1 - k_len, 0), max(q_len - 1, 0)], device=offset.device)
    check.shifted("i - j", extent, offset[..., None], xp, offset.device, known=(min(1 - k_len, 0), max(q_len - 1, 0)))
    return offset


def dot_scores(q, k, scale=None):
    """``q k^T * scale``, ``scale = 1/sqrt(head_dim)`` by default."""
    return q @ k.transpose(-1, -2) * (1.0 / math.sqrt(q.shape[-1]) if scale is None else scale)


def widened(param):
    """A 16-bit parameter as float32 (exact), others as they are: a bias that grows with the
    distance (ALiBi's, KERPLE's power) computed in float32 stays finite past 16-bit range
    (float16's 65504) and is rounded once, with the scores (:func:`biased_scores`)."""
    return param.float() if param.dtype in (torch.float16, torch.bfloat16) else param


def biased_scores(q, k, bias):
    """``dot_scores(q, k) + bias`` in the wider of their dtypes (float32 parameters beside 16-bit
    queries): ``logits`` rounds the sum once, ``attend`` takes it as it is."""
    work = torch.promote_types(q.dtype, bias.dtype)
    return dot_scores(q.to(work), k.to(work)) + bias


def allowed_keys(shape, device, *, causal, offset, mask):
    """Boolean ``[..., q_len, k_len]`` of the keys each query may attend to (logits of
    ``shape`` on ``device``), or ``None`` for all."""
    allowed = None
    q_len, k_len = shape[-2:]
    if causal and isinstance(offset, torch.Tensor):
        # One per batch row ([..., 1, q_len, k_len], a head axis of 1) or a 0-d one kept on the
        # device: whether key j is visible, j <= offset + i, is the same for every offset below
        # -q_len or above k_len, so it is clamped there (validated, not read: no sum leaves int64).
        start = offset.clamp(-q_len, k_len)[..., None, None]
        allowed = start + torch.arange(q_len, device=device)[:, None] >= torch.arange(k_len, device=device)[None, :]
        allowed = allowed[..., None, :, :] if offset.ndim else allowed
    elif causal:
        positions = offset + torch.arange(q_len, device=device)
        allowed = positions[:, None] >= torch.arange(k_len, device=device)[None, :]
    if mask is not None:
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
            raise TypeError(f"mask must be a boolean tensor (True = may attend), got {type(mask).__name__ if not isinstance(mask, torch.Tensor) else mask.dtype}")
        check.computed_on("mask", mask, device)
        try:
            torch.broadcast_shapes(mask.shape, shape)
        except RuntimeError:
            raise ValueError(f"mask of shape {tuple(mask.shape)} does not broadcast against the logits {tuple(shape)}") from None
        allowed = mask if allowed is None else allowed & mask
    return allowed


def masked_softmax(logits, allowed):
    """Softmax over the keys (float32 for 16-bit logits); a row with no allowed key gets zeros."""
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    if allowed is None:
        return torch.softmax(logits, dim=-1)
    some = allowed.any(dim=-1, keepdim=True)
    # A row with no allowed key is filled with zeros before the softmax, so no NaN appears,
    # not even in the backward pass; its weights are then set to zero.
    logits = torch.where(allowed, logits, float("-inf"))
    logits = torch.where(some, logits, 0.0)
    return torch.softmax(logits, dim=-1) * some


def _check_query_key(q, k, v=None, *, heads=None, head_dim=None):
    """``q``, ``k`` (and ``v``): floating tensors of one dtype (floating ones of several under
    ``torch.autocast``, as its regions make them) and one device, shaped alike ``[batch,
    heads, seq, head_dim]`` (``heads`` the module's, or one to broadcast; ``head_dim`` the
    module's, for ``q`` and ``k``)."""
    tensors = (("q", q), ("k", k)) if v is None else (("q", q), ("k", k), ("v", v))
    for name, a in tensors:
        if not isinstance(a, torch.Tensor):
            raise TypeError(f"{name} must be a torch tensor, got {type(a).__name__}")
        if a.ndim < 2:
            raise ValueError(f"{name} must be [batch, heads, seq, head_dim], got shape {tuple(a.shape)}")
        if heads is not None and a.ndim >= 3 and a.shape[-3] != heads and a.shape[-3] != 1:
            raise ValueError(f"{name} must have the module's {heads} heads on axis -3 ([batch, heads, seq, head_dim]), got shape {tuple(a.shape)}")
    dtype, device = q.dtype, q.device
    if not dtype.is_floating_point:
        raise TypeError(f"q must be a floating tensor, got {dtype}")
    for name, a in tensors[1:]:
        if a.device != device or (a.dtype != dtype and not (a.dtype.is_floating_point and torch.is_autocast_enabled(device.type))):
            raise TypeError(f"q, k and v must have one dtype and device, got {name} {a.dtype} on {a.device} and q {dtype} on {device}")
    if head_dim is not None and q.shape[-1] != head_dim:
        raise ValueError(f"q must have the module's head_dim = {head_dim} channels, got shape {tuple(q.shape)}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must have the same head_dim, got shapes {tuple(q.shape)} and {tuple(k.shape)}")
    if v is not None and v.shape[-2] != k.shape[-2]:
        raise ValueError(f"v must have k_len = {k.shape[-2]} rows, got shape {tuple(v.shape)}")
    try:
        torch.broadcast_shapes(*(a.shape[:-2] for _, a in tensors))
    except RuntimeError:
        names = " and ".join(", ".join(name for name, _ in tensors).rsplit(", ", 1))
        shapes = ", ".join(str(tuple(a.shape)) for _, a in tensors)
        raise ValueError(f"{names} must have leading (batch, head) dimensions that broadcast together, got shapes {shapes}") from None


def positive_int(name, value, minimum=1):
    """A Python int >= ``minimum`` (1 or 0), else a ValueError naming ``name``."""
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be a {'positive' if minimum else 'non-negative'} integer, got {value!r}")
    return value


def allocatable(owner, **shapes):
    """Parameters ``name=shape`` of torch's default dtype, made as ``randn(shape) * scale``
    (twice their bytes at once), refused with the ValueError of :func:`posenc._validate.allocatable`
    before anything is allocated where they cannot be: beyond the memory available to this
    process on the CPU, beyond int64 bytes on any device (a meta module allocates nothing,
    a GPU has memory of its own)."""
    itemsize = torch.get_default_dtype().itemsize
    on_cpu = torch.get_default_device().type == "cpu"
    for name, shape in shapes.items():
        if on_cpu or math.prod(shape) * itemsize > check.INT64_MAX:
            check.allocatable(f"{owner}'s {name}", shape, 2 * itemsize)
