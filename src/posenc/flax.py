r"""Flax NNX modules: the module protocol of :mod:`posenc.torch` for JAX models.

Every module answers the same three calls as its torch twin
(:class:`posenc.torch.PositionalModule`), on JAX arrays:

- ``embed(x, positions=None, *, offset=0)``: token embeddings ``x [batch, seq, d_model]``
  with the absolute table added (``Sinusoidal``, ``Learned``), unchanged otherwise;
- ``logits(q, k, *, offset=None) -> [batch, heads, q_len, k_len]``: the pre-softmax scores,
  scale included (``1/sqrt(head_dim)`` unless the paper fixes another);
- ``attend(q, k, v, *, causal=False, offset=None, mask=None) -> [batch, heads, q_len, d_v]``
  (also ``__call__``): :math:`\mathrm{softmax}(\text{logits} + \text{masks})\,v`, plus the
  module's own value term where its paper has one (Shaw's ``table_v``).

``q, k, v`` are ``[batch, heads, seq, head_dim]``; queries sit at ``offset + arange(q_len)``
(``offset=None``: ``k_len - q_len``, the queries being the last keys, as after a KV cache),
keys at ``arange(k_len)``; ``mask`` is boolean, ``True`` where a query may attend; a query
that may attend to no key gets zeros. The modules of the relative biases and logits
(``takes_row_offsets``: ``T5``, ``ALiBi``, ``Shaw``, ``DeBERTa``, ``FIRE``, ``KERPLE``,
``Sandwich``, ``CoPE``, ``TUPE``, ``TENER``) also take one ``offset`` per batch row, an integer
array ``[batch]``: row ``b`` is the call with ``offset[b]``, as the torch modules; the others
refuse one with a ``TypeError``. ``T5``, ``ALiBi``, ``Shaw``, ``DeBERTa``, ``FIRE``,
``KERPLE`` and ``Sandwich`` take per-token ``query_positions``/``key_positions`` too
(packed or padded batches). Learned
parts are ``nnx.Param`` (initialised as the torch modules initialise theirs, from
``rngs``), so ``nnx.jit``, ``nnx.grad`` and optax train them; each module's output is the
functional call with its parameters (:func:`posenc.t5_bias`, :func:`posenc.rope`, ...).
The parameters are stored in ``param_dtype`` (float32 by default) and cast to the inputs'
dtype where used: dtype in = dtype out, so bfloat16 ``q, k, v`` give bfloat16 logits and
outputs (float32 parameters then train in float32), as a torch module moved to bfloat16 does.

Examples
--------
>>> import jax, jax.numpy as jnp, posenc as pe
>>> from flax import nnx
>>> from posenc.flax import T5, Rotary
>>> q = k = v = jax.random.normal(jax.random.key(0), (1, 2, 5, 8))
>>> bias = T5(2, rngs=nnx.Rngs(0))
>>> bias.logits(q, k).shape
(1, 2, 5, 5)
>>> want = q @ jnp.swapaxes(k, -1, -2) / jnp.sqrt(8.0) + pe.t5_bias(bias.table[...], 5, 5)
>>> bool(jnp.allclose(bias.logits(q, k), want, atol=1e-5))
True
>>> rope = Rotary(8, scaling=pe.scaling.YaRN(4.0, 16))
>>> rope.attend(q, k, v, causal=True).shape
(1, 2, 5, 8)
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import errors as flax_errors
from flax import nnx

import posenc as pe
from posenc import _validate as check
from posenc._xp import argument_in
from posenc.absolute.sinusoidal import embedded as embedded_sinusoidal
from posenc.relative import indices
from posenc.relative.buckets import t5_bucket_options
from posenc.relative.deberta import TERMS
from posenc.rotary import _args

__all__ = [
    "ALiBi",
    "CoPE",
    "DeBERTa",
    "FIRE",
    "KERPLE",
    "Learned",
    "NoPE",
    "PositionalModule",
    "Rotary",
    "Sandwich",
    "Shaw",
    "Sinusoidal",
    "T5",
    "TENER",
    "TUPE",
    "XL",
    "XPos",
]


def dot_scores(q, k, scale=None):
    """``q k^T * scale``, ``scale = 1/sqrt(head_dim)`` by default."""
    return q @ jnp.swapaxes(k, -1, -2) * (1.0 / math.sqrt(q.shape[-1]) if scale is None else scale)


def _param_dtype(value):
    """``param_dtype`` as a dtype: a real floating one, what the parameters are stored in."""
    try:
        dtype = None if value is None else jnp.dtype(value)
    except TypeError:
        dtype = None
    if dtype is None or not jnp.issubdtype(dtype, jnp.floating):
        raise TypeError(f"param_dtype must be a floating dtype (float32, bfloat16, float16, ...), got {value!r}")
    return dtype


def _normal(rngs, shape, scale, dtype):
    """``nnx.Param`` of ``N(0, 1) * scale`` drawn in float32, then stored in ``dtype`` (torch's
    ``randn(...) * scale`` and ``.to(dtype)``)."""
    return nnx.Param((jax.random.normal(rngs.params(), shape, jnp.float32) * scale).astype(dtype))


def _value(param, dtype):
    """A parameter's value in ``dtype`` (the inputs'), so that the output keeps the inputs' dtype."""
    return None if param is None else param[...].astype(dtype)


def _positive(name, value, minimum=1):
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be a {'positive' if minimum else 'non-negative'} integer, got {value!r}")
    return value


class PositionalModule(nnx.Module):
    """Base of every module: ``embed``, ``logits``, ``attend`` (see the module docstring).

    A subclass supplies ``embed`` (absolute encodings), ``scores(q, k, offset)`` (the
    logits for a resolved offset; default the scaled dot product) and ``values(weights, v,
    offset)`` (default ``weights @ v``), with ``query_positions``/``key_positions`` keywords
    when ``takes_positions``.
    """

    takes_positions = False
    takes_mask = False  # scores take mask, the keys each query may attend to (CoPE)
    takes_row_offsets = False  # logits and attend take one offset per batch row (the relative biases and logits)
    head_dim = None  # the queries' width, where the module fixes it (rotary modules)
    num_heads = None  # the heads, where the module's parameters or bias fix them

    def embed(self, x, positions=None, *, offset=0):
        return x

    def logits(self, q, k, *, offset=None, query_positions=None, key_positions=None):
        _check_query_key(q, k, heads=self.num_heads, head_dim=self.head_dim)
        offset, positions = self._alignment(q, k, offset, query_positions, key_positions, "logits")
        return self.scores(q, k, offset, **positions)

    def attend(self, q, k, v, *, causal=False, offset=None, mask=None, query_positions=None, key_positions=None):
        _check_query_key(q, k, v, heads=self.num_heads, head_dim=self.head_dim)
        check.flag("causal", causal)
        offset, positions = self._alignment(q, k, offset, query_positions, key_positions, "attend")
        start = offset if indices.per_row(offset) else indices.query_offset(offset, q.shape[-2], k.shape[-2])
        allowed = _allowed_keys(q.shape[-2], k.shape[-2], causal, start, mask, _logits_shape(q, k))
        hidden = {"mask": allowed} if self.takes_mask and allowed is not None else {}
        logits = self.scores(q, k, offset, **positions, **hidden)
        weights = _masked_softmax(logits, allowed)
        return self.values(weights.astype(v.dtype), v, offset, **positions)

    def __call__(self, q, k, v, **options):
        return self.attend(q, k, v, **options)

    def _alignment(self, q, k, offset, query_positions, key_positions, call):
        """``(offset, positions)`` for ``scores``/``values``, as the torch twin's: one ``offset``
        per batch row validated where the module takes it (``call`` names the method otherwise)."""
        if indices.per_row(offset):
            if not self.takes_row_offsets:
                raise TypeError(f"{type(self).__name__}'s {call} takes one offset for every row, got one of shape {tuple(offset.shape)}: {ROWS}")
            offset = _row_offsets(offset, q, k)
        if query_positions is None and key_positions is None:
            return offset if indices.per_row(offset) else indices.query_offset(offset, q.shape[-2], k.shape[-2]), {}
        if not self.takes_positions:
            raise TypeError(
                f"{type(self).__name__} takes no query_positions/key_positions (per-token positions: T5, ALiBi, Shaw, DeBERTa, FIRE, KERPLE, Sandwich)"
            )
        return offset, {"query_positions": query_positions, "key_positions": key_positions}

    def scores(self, q, k, offset):
        return dot_scores(q, k)

    def values(self, weights, v, offset, **positions):
        return weights @ v


def _check_query_key(q, k, v=None, *, heads=None, head_dim=None):
    """``q``, ``k`` (and ``v``): floating arrays shaped alike ``[batch, heads, seq, head_dim]``
    (``heads`` the module's, or one to broadcast; ``head_dim`` the module's), else a
    TypeError/ValueError naming them, as the torch twin's; two float dtypes promote, as in JAX."""
    tensors = (("q", q), ("k", k)) if v is None else (("q", q), ("k", k), ("v", v))
    for name, a in tensors:
        if not isinstance(a, (jax.Array, np.ndarray)) or a.ndim < 2:
            raise TypeError(f"{name} must be a JAX (or NumPy) array [batch, heads, seq, head_dim], got {_shown(a)}")
        dtype = a.dtype
        if not jnp.issubdtype(dtype, jnp.floating):
            raise TypeError(f"{name} must be a floating array, got {dtype}")
        if heads is not None and a.ndim >= 3 and a.shape[-3] not in (heads, 1):
            raise ValueError(f"{name} must have the module's {heads} heads on axis -3 ([batch, heads, seq, head_dim]), got shape {tuple(a.shape)}")
    if head_dim is not None and q.shape[-1] != head_dim:
        raise ValueError(f"q must have the module's head_dim = {head_dim} channels, got shape {tuple(q.shape)}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must have the same head_dim, got shapes {tuple(q.shape)} and {tuple(k.shape)}")
    if v is not None and v.shape[-2] != k.shape[-2]:
        raise ValueError(f"v must have k_len = {k.shape[-2]} rows, got shape {tuple(v.shape)}")
    try:
        jnp.broadcast_shapes(*(a.shape[:-2] for _, a in tensors))
    except ValueError:
        names = " and ".join(", ".join(name for name, _ in tensors).rsplit(", ", 1))
        shapes = ", ".join(str(tuple(a.shape)) for _, a in tensors)
        raise ValueError(f"{names} must have leading (batch, head) dimensions that broadcast together, got shapes {shapes}") from None


def _shown(a):
    shape = getattr(a, "shape", None)
    return type(a).__name__ if shape is None else f"{type(a).__name__} of shape {tuple(shape)}"


def _logits_shape(q, k):
    """``[..., heads, q_len, k_len]`` of ``q``'s and ``k``'s leading axes broadcast (JAX's error where they do not)."""
    return jnp.broadcast_shapes(q.shape[:-2], k.shape[:-2]) + (q.shape[-2], k.shape[-2])


ROWS = "one per batch row is taken by the modules of the relative biases and logits (T5, ALiBi, Shaw, DeBERTa, FIRE, KERPLE, Sandwich, CoPE, TUPE and TENER)"


def _row_offsets(offset, q, k):
    """One ``offset`` per batch row: an integer JAX (or NumPy) array broadcasting against the
    batch axes of ``q``/``k`` before the heads axis, as a JAX array (the functions check the
    positions it gives; a NumPy one is converted as the functions convert host constants,
    values beyond int32 refused without x64)."""
    if not jnp.issubdtype(offset.dtype, jnp.integer):
        raise TypeError(f"offset must have an integer dtype, got {offset.dtype}")
    indices.module_rows(offset, q, k)
    return argument_in("offset", offset, jnp)[1]


def _allowed_keys(q_len, k_len, causal, offset, mask, shape):
    allowed = None
    if causal and indices.per_row(offset):  # [..., 1, q_len, k_len]: the batch axes lead, a head axis of 1
        allowed = indices.relative_positions(q_len, k_len, offset=offset)[..., None, :, :] >= 0
    elif causal:
        queries = check.shifted("the query positions", jnp.arange(q_len), offset, jnp, known=(0, q_len - 1) if q_len else None)
        allowed = queries[:, None] >= jnp.arange(k_len)[None, :]
    if mask is not None:
        if getattr(mask, "dtype", None) != jnp.bool_:
            raise TypeError(f"mask must be a boolean array (True = may attend), got {getattr(mask, 'dtype', type(mask).__name__)}")
        try:
            jnp.broadcast_shapes(tuple(mask.shape), tuple(shape))
        except ValueError:
            raise ValueError(f"mask of shape {tuple(mask.shape)} does not broadcast against the logits {tuple(shape)}") from None
        allowed = mask if allowed is None else allowed & mask
    return allowed


def _masked_softmax(logits, allowed):
    """Softmax over the keys (float32 for 16-bit logits); a row with no allowed key gets zeros."""
    if logits.dtype in (jnp.float16, jnp.bfloat16):
        logits = logits.astype(jnp.float32)
    if allowed is None:
        return jax.nn.softmax(logits, axis=-1)
    some = jnp.any(allowed, axis=-1, keepdims=True)
    logits = jnp.where(some, jnp.where(allowed, logits, -jnp.inf), 0.0)
    return jax.nn.softmax(logits, axis=-1) * some


# ---------------------------------------------------------------- absolute


class NoPE(PositionalModule):
    """No positional encoding: the plain scaled dot product (a causal mask gives the order)."""


class Sinusoidal(PositionalModule):
    """The fixed sinusoidal table (:func:`posenc.sinusoidal`) added to the token embeddings
    (``embed(x, positions=None, *, offset=0)``: ``offset`` an int or one per batch row)."""

    def __init__(self, dim: int, *, base: float = 10000.0, layout: str = "interleaved"):
        layout = check.layout("layout", layout)
        pe.sinusoidal(0, dim, base=base, layout=layout)  # validates the arguments now
        self.dim, self.base, self.layout = dim, base, layout

    def embed(self, x, positions=None, *, offset=0):
        return x + embedded_sinusoidal(x, positions, offset, self.dim, base=self.base, layout=self.layout)


class Learned(PositionalModule):
    """A learned absolute table ``weight [num_positions, dim]`` (``nnx.Param``) added to the
    tokens, grown by :meth:`extend` (hierarchical extension with ``alpha``, checked now). A
    concrete position outside ``[0, num_positions)`` is a ``ValueError`` (one past the end
    points to :meth:`extend`), as for ``posenc.torch.LearnedEmbedding``; a traced one gives a
    NaN row (negative ones too, not a row from the end)."""

    def __init__(self, num_positions: int, dim: int, *, alpha: float = 0.4, param_dtype=jnp.float32, rngs: nnx.Rngs):
        shape = (_positive("num_positions", num_positions), _positive("dim", dim))
        self.alpha = check.real("alpha", alpha, minimum=0.0, below=1.0)
        self.weight = _normal(rngs, shape, 0.02, _param_dtype(param_dtype))

    @property
    def num_positions(self) -> int:
        return int(self.weight.shape[0])

    def embed(self, x, positions=None, *, offset=0):
        positions = _args.embedded_positions(x, positions, offset)
        if not jnp.issubdtype(positions.dtype, jnp.integer):
            raise TypeError(f"positions must be integers, got {positions.dtype}")
        n = self.num_positions
        if check.is_eager(positions) and positions.size:
            low, high = int(jnp.min(positions)), int(jnp.max(positions))
            if low < 0 or high >= n:
                hint = f": grow the table first with extend({high + 1})" if low >= 0 else ""
                raise ValueError(f"positions must lie in [0, num_positions = {n}), got {low}..{high}{hint}")
        rows = jnp.where(positions < 0, n, positions)  # (jnp.take reads a negative index from the end)
        return x + jnp.take(self.weight[...], rows, axis=0, mode="fill", fill_value=jnp.nan).astype(x.dtype)

    def extend(self, length: int) -> Learned:
        r"""Grow the table to ``length <= num_positions**2`` rows with :func:`posenc.hierarchical_extend`.

        .. math::

            u = \frac{W - \alpha W_0}{1 - \alpha}, \qquad
            W'_p = \alpha\, u_{\lfloor p / n \rfloor} + (1 - \alpha)\, u_{p \bmod n}

        Su, "Hierarchically decomposed position encoding" (2020), with ``n = num_positions``:
        the first ``n`` rows stay the trained ones, bit for bit. ``weight`` is *replaced* by a
        new ``nnx.Param`` of ``length`` rows (in its dtype): an ``nnx.Optimizer`` built before
        holds state shaped as the old table (Adam's moments), so build it again after
        extending. Returns the module.
        """
        length = check.grown_length(length, self.num_positions)
        self.weight = nnx.Param(pe.hierarchical_extend(self.weight[...], length, alpha=self.alpha))
        return self


# ---------------------------------------------------------------- rotary


class Rotary(PositionalModule):
    """RoPE (:func:`posenc.rope`) of queries and keys, every scaling of :mod:`posenc.scaling`.

    ``rotate(x, positions=None, *, offset=0, seq_len=None)`` rotates one array
    (``[batch, heads, seq, head_dim]``); ``logits`` rotates the queries at ``offset +
    arange(q_len)`` and the keys at ``arange(k_len)`` with one length for both (the longer:
    what ``DynamicNTK`` and ``LongRoPE`` adapt to, traced or not).
    """

    def __init__(self, head_dim: int, *, base: float = 10000.0, scaling=None, layout: str = "half", rotary_dim: int | None = None):
        self.head_dim, self.rotary_dim = head_dim, head_dim if rotary_dim is None else rotary_dim
        if self.rotary_dim > head_dim:
            raise ValueError(f"rotary_dim must be <= head_dim = {head_dim}, got {self.rotary_dim}")
        layout = check.layout("layout", layout)
        pe.rope_frequencies(self.rotary_dim, base=base, scaling=scaling)  # validates the arguments now
        self.base, self.scaling, self.layout = base, scaling, layout

    def rotate(self, x, positions=None, *, offset=0, seq_len=None):
        options = {"base": self.base, "scaling": self.scaling, "layout": self.layout, "rotary_dim": self.rotary_dim}
        return pe.rope(x, positions, offset=offset, seq_len=seq_len, seq_axis=-2, **options)

    def scores(self, q, k, offset):
        seq_len = None
        if self.scaling is not None and self.scaling.uses_seq_len:
            end = offset + q.shape[-2]
            seq_len = max(end, k.shape[-2]) if isinstance(end, int) else jnp.maximum(end, k.shape[-2])
        return dot_scores(self.rotate(q, offset=offset, seq_len=seq_len), self.rotate(k, seq_len=seq_len))


class XPos(PositionalModule):
    """xPos (Sun et al., 2022): RoPE whose scores decay with the distance (:func:`posenc.xpos_scale`),
    both sides centred at ``k_len // 2`` and scaled in float32 at least, as ``posenc.torch.XPos``."""

    def __init__(self, head_dim: int, *, base: float = 10000.0, scale_base: float = 512, layout: str = "half"):
        layout = check.layout("layout", layout)
        pe.xpos_scale(np.zeros(1), head_dim, scale_base=scale_base, layout=layout)  # validates the arguments now
        pe.rope_frequencies(head_dim, base=base)
        self.head_dim, self.base, self.scale_base, self.layout = head_dim, base, scale_base, layout

    def scores(self, q, k, offset):
        q_len, k_len = q.shape[-2], k.shape[-2]
        center = k_len // 2
        work = jnp.promote_types(q.dtype, jnp.float32)
        scale = {"scale_base": self.scale_base, "layout": self.layout, "dtype": work}
        centred = check.shifted("the query positions", jnp.arange(q_len) - center, offset, jnp, known=(-center, q_len - 1 - center) if q_len else None)
        q_scale = pe.xpos_scale(centred, q.shape[-1], **scale)
        k_scale = pe.xpos_scale(jnp.arange(k_len) - center, k.shape[-1], **scale)
        rope = {"base": self.base, "layout": self.layout}
        logits = dot_scores(pe.rope(q, offset=offset, **rope).astype(work) * q_scale, pe.rope(k, **rope).astype(work) / k_scale)
        return logits.astype(q.dtype)


# ---------------------------------------------------------------- biases


class _Bias(PositionalModule):
    """The scaled dot product plus a bias ``[heads, q_len, k_len]`` from ``bias(q_len, k_len, offset=)``."""

    def scores(self, q, k, offset, **positions):
        return dot_scores(q, k) + self.bias(q.shape[-2], k.shape[-2], offset=offset, **positions).astype(q.dtype)


class T5(_Bias):
    """T5's learned bucketed bias (:func:`posenc.t5_bias`): ``table [num_buckets, heads]``."""

    takes_positions = True
    takes_row_offsets = True

    def __init__(self, num_heads: int, *, num_buckets: int = 32, max_distance: int = 128, bidirectional: bool = True,
                 param_dtype=jnp.float32, rngs: nnx.Rngs):  # fmt: skip
        t5_bucket_options(num_buckets, max_distance, bidirectional)
        self.table = _normal(rngs, (num_buckets, _positive("num_heads", num_heads)), 0.02, _param_dtype(param_dtype))
        self.max_distance, self.bidirectional = max_distance, bidirectional

    @property
    def num_heads(self) -> int:
        return int(self.table.shape[1])

    def bias(self, q_len, k_len, *, offset=None, **positions):
        table = self.table[...]
        options = {"bidirectional": self.bidirectional, "max_distance": self.max_distance, "num_buckets": table.shape[0]}
        return pe.relative_bias("t5", table, q_len, k_len, offset=offset, **positions, **options)


class _FixedBias(_Bias):
    """A bias without parameters, computed in the dtype ``scores`` asks of ``bias(..., dtype=)``:
    the queries' (float32 at least, ``bias_dtype``), as the torch twin's."""

    def bias_dtype(self, dtype):
        return jnp.promote_types(dtype, jnp.float32)

    def scores(self, q, k, offset, **positions):
        bias = self.bias(q.shape[-2], k.shape[-2], offset=offset, **positions, dtype=self.bias_dtype(q.dtype))
        return dot_scores(q, k) + bias.astype(q.dtype)


class ALiBi(_FixedBias):
    """ALiBi's fixed linear bias (:func:`posenc.alibi_bias`) with :func:`posenc.alibi_slopes`,
    in float32 (float64 for float64 queries: the slopes rounded once from float64, as
    ``posenc.torch.ALiBi(...).double()``'s)."""

    takes_positions = True
    takes_row_offsets = True

    def __init__(self, num_heads: int, *, max_bias: float = 8.0, symmetric: bool = False):
        self.num_heads = _positive("num_heads", num_heads)
        self.slopes = pe.alibi_slopes(self.num_heads, max_bias=max_bias, dtype=np.float64)  # a host constant
        self.max_bias = max_bias  # (shown by the repr: the slopes alone do not say it)
        self.symmetric = symmetric

    def bias(self, q_len, k_len, *, offset=None, dtype=jnp.float32, **positions):
        slopes = jnp.asarray(self.slopes, dtype)
        return pe.alibi_bias(slopes, q_len, k_len, offset=offset, symmetric=self.symmetric, **positions)


def _torch_linear(fan_in, fan_out, rngs, param_dtype):
    """``nnx.Linear`` initialised as torch's ``nn.Linear``: weights and biases uniform in
    ``(-1/sqrt(fan_in), 1/sqrt(fan_in))``, drawn in float32 and stored in ``param_dtype``."""
    bound = 1.0 / math.sqrt(fan_in)

    def uniform(key, shape, dtype):
        return jax.random.uniform(key, shape, jnp.float32, -bound, bound).astype(dtype)

    return nnx.Linear(fan_in, fan_out, kernel_init=uniform, bias_init=uniform, param_dtype=param_dtype, rngs=rngs)


class FIRE(_Bias):
    """FIRE (Li et al., 2024): :func:`posenc.fire_bias` of a learned MLP ``1 -> mlp_width -> heads``
    (ReLU), learned ``c`` and threshold multiplier, as ``posenc.torch.FIRE``."""

    takes_positions = True
    takes_row_offsets = True

    def __init__(self, num_heads: int, *, mlp_width: int = 32, c: float = 0.1, threshold: float = 512.0, eps: float = 1e-6,
                 param_dtype=jnp.float32, rngs: nnx.Rngs):  # fmt: skip
        pe.fire_distances(1, 1, c=c, threshold=threshold, eps=eps)  # validates the options now
        dtype = _param_dtype(param_dtype)
        self.hidden = _torch_linear(1, _positive("mlp_width", mlp_width), rngs, dtype)
        self.out = _torch_linear(mlp_width, _positive("num_heads", num_heads), rngs, dtype)
        self.c = nnx.Param(jnp.asarray(float(c), dtype))
        self.L_multiplier = nnx.Param(jnp.asarray(1.0, dtype))
        self.threshold, self.eps, self.num_heads = threshold, eps, num_heads

    def mlp(self, distances):
        return self.out(jax.nn.relu(self.hidden(distances)))

    def bias(self, q_len, k_len, *, offset=None, **positions):
        c, threshold = self.c[...], self.L_multiplier[...] * self.threshold
        return pe.fire_bias(self.mlp, q_len, k_len, offset=offset, c=c, threshold=threshold, eps=self.eps, **positions, xp=jnp, dtype=c.dtype)


class KERPLE(_Bias):
    """KERPLE (Chi et al., 2022): :func:`posenc.kerple_bias` with learned ``r1, r2 [heads]``,
    clamped at ``eps`` (``r2 <= 2`` for ``"power"``) before each use, the clamped values
    stored, while the gradient passes unclamped: the paper's in-place clamp of ``.data``, so
    training steps move the stored values as the torch module's (a value left unclamped
    drifted below ``eps`` and stayed there). Stored eagerly and under nnx's transforms; a
    plain ``jax.jit`` closing over the module cannot change its state, and uses the clamped
    values only."""

    takes_positions = True
    takes_row_offsets = True

    def __init__(self, num_heads: int, *, kind: str = "log", eps: float = 1e-2, param_dtype=jnp.float32, rngs: nnx.Rngs):
        if kind not in pe.relative.kerple.KERPLE_KINDS:
            raise ValueError(f"kind must be 'log' or 'power', got {kind!r}")
        heads, dtype = _positive("num_heads", num_heads), _param_dtype(param_dtype)
        up_to_2 = jax.random.uniform(rngs.params(), (heads,)) * 2
        up_to_1 = jax.random.uniform(rngs.params(), (heads,))
        r1, r2 = (up_to_2, up_to_1) if kind == "log" else (up_to_1, up_to_2)
        self.r1, self.r2, self.kind, self.eps = nnx.Param(r1.astype(dtype)), nnx.Param(r2.astype(dtype)), kind, eps
        self.num_heads = heads

    def bias(self, q_len, k_len, *, offset=None, **positions):
        def clamp(param, high):
            value = param[...]
            # clip(value) exactly (value - value is 0), as torch's in-place clamp; the gradient that of value
            clamped = jax.lax.stop_gradient(jnp.clip(value, self.eps, high)) + (value - jax.lax.stop_gradient(value))
            try:
                param[...] = clamped
            except flax_errors.TraceContextError:  # a jax.jit closing over the module: no state to update there
                pass
            return clamped

        r1, r2 = clamp(self.r1, None), clamp(self.r2, 2.0 if self.kind == "power" else None)
        return pe.kerple_bias(r1, r2, q_len, k_len, kind=self.kind, offset=offset, **positions)


class Sandwich(_FixedBias):
    """Sandwich (Chi et al., 2023): the parameter-free :func:`posenc.sandwich_bias`, in the
    queries' dtype (float32 by default), as ``posenc.torch.Sandwich``."""

    takes_positions = True
    takes_row_offsets = True

    def __init__(self, num_heads: int, *, dim: int = 128, base: float = 10000.0):
        pe.sandwich_vector(1, 1, dim, heads=num_heads, base=base)  # validates the options now
        self.num_heads, self.dim, self.base = num_heads, dim, base

    def bias_dtype(self, dtype):
        return dtype

    def bias(self, q_len, k_len, *, offset=None, dtype=None, **positions):
        return pe.sandwich_bias(q_len, k_len, self.dim, heads=self.num_heads, offset=offset, base=self.base, **positions, xp=jnp, dtype=dtype)


# ---------------------------------------------------------------- relative logits


class Shaw(PositionalModule):
    """Shaw et al.'s relative attention: :func:`posenc.shaw_logits` over ``sqrt(head_dim)`` with
    ``table_k``, and :func:`posenc.shaw_output`'s value term with ``table_v`` ``[2K+1, head_dim]``."""

    takes_positions = True
    takes_row_offsets = True

    def __init__(self, head_dim: int, *, max_distance: int, param_dtype=jnp.float32, rngs: nnx.Rngs):
        rows, dtype = 2 * _positive("max_distance", max_distance, minimum=0) + 1, _param_dtype(param_dtype)
        self.table_k = _normal(rngs, (rows, _positive("head_dim", head_dim)), 0.02, dtype)
        self.table_v = _normal(rngs, (rows, head_dim), 0.02, dtype)
        self.max_distance = max_distance

    def scores(self, q, k, offset, **positions):
        logits = pe.shaw_logits(q, k, _value(self.table_k, q.dtype), max_distance=self.max_distance, offset=offset, **positions)
        return logits / math.sqrt(q.shape[-1])

    def values(self, weights, v, offset, **positions):
        return pe.shaw_output(weights, v, _value(self.table_v, v.dtype), max_distance=self.max_distance, offset=offset, **positions)


class DeBERTa(PositionalModule):
    """DeBERTa's disentangled attention (:func:`posenc.deberta_logits`) with ``pos_q``/``pos_k
    [heads, 2K, head_dim]`` (those of the ``terms`` in use)."""

    takes_positions = True
    takes_row_offsets = True

    def __init__(self, num_heads: int, head_dim: int, *, max_distance: int, bucket_size=None, max_position=None, terms=TERMS,
                 param_dtype=jnp.float32, rngs: nnx.Rngs):  # fmt: skip
        terms = tuple(terms)
        if not terms or any(t not in TERMS for t in terms) or len(set(terms)) != len(terms):
            raise ValueError(f"terms must be a non-empty subset of {TERMS!r}, got {terms!r}")
        shape = (_positive("num_heads", num_heads), 2 * _positive("max_distance", max_distance), _positive("head_dim", head_dim))
        dtype = _param_dtype(param_dtype)
        self.pos_q = _normal(rngs, shape, 0.02, dtype) if "p2c" in terms else None
        self.pos_k = _normal(rngs, shape, 0.02, dtype) if "c2p" in terms else None
        self.max_distance, self.bucket_size, self.max_position, self.terms = max_distance, bucket_size, max_position, terms
        self.num_heads = num_heads

    def scores(self, q, k, offset, **positions):
        tables = [_value(t, q.dtype) for t in (self.pos_q, self.pos_k)]
        return pe.deberta_logits(q, k, *tables, max_distance=self.max_distance, bucket_size=self.bucket_size,
                                 max_position=self.max_position, terms=self.terms, offset=offset, **positions)  # fmt: skip


class XL(PositionalModule):
    """Transformer-XL's relative attention (:func:`posenc.xl_logits`): sinusoids of the distances
    projected by ``r_proj [heads, dim, head_dim]``, global biases ``u``, ``v [heads, 1, head_dim]``."""

    def __init__(self, num_heads: int, head_dim: int, *, dim: int | None = None, base: float = 10000.0, layout: str = "interleaved",
                 param_dtype=jnp.float32, rngs: nnx.Rngs):  # fmt: skip
        layout = check.layout("layout", layout)
        heads, head_dim, dtype = _positive("num_heads", num_heads), _positive("head_dim", head_dim), _param_dtype(param_dtype)
        dim = heads * head_dim if dim is None else dim
        pe.sinusoidal(0, dim, base=base, layout=layout)  # validates the arguments now
        self.r_proj = _normal(rngs, (heads, dim, head_dim), 1 / math.sqrt(dim), dtype)
        self.u, self.v = _normal(rngs, (heads, 1, head_dim), 0.02, dtype), _normal(rngs, (heads, 1, head_dim), 0.02, dtype)
        self.dim, self.base, self.layout, self.num_heads = dim, base, layout, heads

    def scores(self, q, k, offset):
        q_len, k_len = q.shape[-2], k.shape[-2]
        distances = check.shifted("the distances", jnp.arange(q_len - 1, -k_len - 1, -1), offset, jnp, known=(-k_len, q_len - 1))  # (offset + i) - j, and one past
        r = pe.sinusoidal(distances, self.dim, base=self.base, layout=self.layout, dtype=q.dtype) @ _value(self.r_proj, q.dtype)
        return pe.xl_logits(q, k, r, _value(self.u, q.dtype), _value(self.v, q.dtype)) / math.sqrt(q.shape[-1])


class TENER(PositionalModule):
    r"""TENER's direction-aware relative attention (:func:`posenc.tener_logits`), unscaled.

    .. math:: A_{ij} = (q_i + u) \cdot k_j + (q_i + v) \cdot R_{i-j}

    Yan et al., "TENER" (2019): ``R_t`` is the fixed sinusoid of the signed distance
    (``base``, ``layout``), ``u``, ``v [heads, 1, head_dim]`` learned. The paper leaves the
    logits unscaled, so ``logits`` has no ``1/sqrt(head_dim)``; as ``posenc.torch.TENERRelative``.
    One ``offset`` per batch row gives row ``b`` the logits of the call on that row alone with
    ``offset[b]`` (one product of its queries and sinusoids per row).
    """

    takes_row_offsets = True

    def __init__(self, num_heads: int, head_dim: int, *, base: float = 10000.0, layout: str = "interleaved", param_dtype=jnp.float32,
                 rngs: nnx.Rngs):  # fmt: skip
        layout = check.layout("layout", layout)
        heads, dtype = _positive("num_heads", num_heads), _param_dtype(param_dtype)
        pe.sinusoidal(0, _positive("head_dim", head_dim), base=base, layout=layout)  # validates the arguments now
        self.u, self.v = _normal(rngs, (heads, 1, head_dim), 0.02, dtype), _normal(rngs, (heads, 1, head_dim), 0.02, dtype)
        self.base, self.layout, self.num_heads = base, layout, heads

    def scores(self, q, k, offset):
        return pe.tener_logits(q, k, _value(self.u, q.dtype), _value(self.v, q.dtype), base=self.base, offset=offset, layout=self.layout)


class TUPE(PositionalModule):
    """TUPE's untied positional attention (:func:`posenc.tupe_logits`): a learned table ``p
    [max_positions, dim]`` correlated through ``uq``, ``uk [heads, dim, head_dim]``; ``cls [2,
    heads]`` with ``untie_cls``; ``bias`` a bias module (``T5``, ``ALiBi``: TUPE-R)."""

    def __init__(self, num_heads: int, head_dim: int, *, max_positions: int, dim: int | None = None, untie_cls: bool = False,
                 bias=None, param_dtype=jnp.float32, rngs: nnx.Rngs):  # fmt: skip
        heads, head_dim, dtype = _positive("num_heads", num_heads), _positive("head_dim", head_dim), _param_dtype(param_dtype)
        dim = _positive("dim", heads * head_dim if dim is None else dim)
        if bias is not None and not isinstance(bias, _Bias):
            raise TypeError(f"bias must be a bias module (T5, ALiBi) or None, got {type(bias).__name__}")
        self.p = _normal(rngs, (_positive("max_positions", max_positions), dim), 0.02, dtype)
        self.uq, self.uk = (_normal(rngs, (heads, dim, head_dim), 1 / math.sqrt(dim), dtype) for _ in range(2))
        self.cls = nnx.Param(jnp.zeros((2, heads), dtype)) if untie_cls else None
        self.max_positions, self.bias, self.num_heads = max_positions, bias, heads

    takes_row_offsets = True

    def scores(self, q, k, offset):
        q_len, k_len = q.shape[-2], k.shape[-2]
        if isinstance(offset, int) and max(offset + q_len, k_len) > self.max_positions:
            raise ValueError(f"TUPE positions must lie in [0, max_positions = {self.max_positions}), got queries up to {offset + q_len - 1}")
        p, uq, uk, cls = (_value(param, q.dtype) for param in (self.p, self.uq, self.uk, self.cls))
        bias = None if self.bias is None else self.bias.bias(q_len, k_len, offset=offset).astype(q.dtype)
        return pe.tupe_logits(q, k, p, uq, uk, offset=offset, bias=bias, cls=None if cls is None else (cls[0], cls[1]))


class CoPE(PositionalModule):
    """CoPE (Golovneva et al., 2024): :func:`posenc.cope_logits` with learned ``pos_emb [npos_max,
    head_dim]`` (zeros at first, as in the paper's code); ``attend``'s ``mask`` and ``causal``
    hide keys from the count too; ``scale`` as in :func:`posenc.cope_logits` (default
    ``1/sqrt(head_dim)``)."""

    def __init__(self, head_dim: int, *, npos_max: int = 64, causal: bool = True, scale: float | None = None, param_dtype=jnp.float32):
        shape = (_positive("npos_max", npos_max), _positive("head_dim", head_dim))
        self.pos_emb = nnx.Param(jnp.zeros(shape, _param_dtype(param_dtype)))
        self.causal = causal
        self.scale = None if scale is None else check.real("scale", scale, positive=True)

    takes_mask = True
    takes_row_offsets = True

    def scores(self, q, k, offset, mask=None):
        return pe.cope_logits(q, k, _value(self.pos_emb, q.dtype), causal=self.causal, offset=offset, scale=self.scale, mask=mask)
