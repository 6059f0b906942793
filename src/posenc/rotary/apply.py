r"""Rotary position embedding: ``cos``/``sin`` tables, applying them, and the one-call ``rope``.

RoPE (Su et al., "RoFormer: Enhanced Transformer with Rotary Position Embedding", 2021)
rotates every pair of channels :math:`(a_i, b_i)` of a query or key at position ``m`` by
:math:`m\,\theta_i`:

.. math:: (a_i, b_i) \mapsto (a_i\cos m\theta_i - b_i \sin m\theta_i,\;
          b_i \cos m\theta_i + a_i \sin m\theta_i)

so that :math:`\langle R_m q, R_n k\rangle` depends on ``m - n`` only (the relative
position ``rel = query - key`` of the library's sign convention).

A call goes parse -> plan -> run: its arguments are parsed once into a description of the
call (``_call``: validated, in the forms the kernel takes), which selects the kernel or the
reference and runs it; ``@_plans.planned`` serves the later calls of a signature from a plan
built from that same parse (``posenc._kernels.rope_plan``).
"""

from __future__ import annotations

from .. import _dispatch, _plans
from . import _signatures
from .. import _validate as check
from .._xp import cos_sin, cos_sin_of_array, cos_sin_of_turns, device_of, has_float64, host_constants, namespace, split_as_first, unsplit
from . import _args, _call, _rows
from .scaling import nameable


@_plans.planned(_signatures.RopeCosSin)
def rope_cos_sin(positions, inv_freq, *, layout="half", dtype=None, scale=1.0):
    r"""``cos`` and ``sin`` of the rotary angles :math:`m\,\theta_i`, duplicated for every pair.

    RoPE's tables (Su et al., "RoFormer: Enhanced Transformer with Rotary Position Embedding",
    2021): :math:`\cos(m\,\theta_i)` and :math:`\sin(m\,\theta_i)` for position ``m`` and
    frequency :math:`\theta_i` (``inv_freq[i]``), each entry twice in the layout's order.

    Parameters
    ----------
    positions : array
        Integer or float positions, any shape (e.g. ``[batch, seq]`` position ids). NumPy
        positions beside an ``inv_freq`` array of another library are converted into its
        namespace and onto its device (the tables are then of that library).
    inv_freq : array or sequence ``[r/2]``, or array ``[batch, r/2]``
        Frequencies :math:`\theta_i`, e.g. from :func:`rope_frequencies`; a host (NumPy)
        array is fine for positions of any namespace (for torch GPU positions its values
        are copied to the device once and kept: no copy or wait a call). An array of the
        positions' namespace that carries a gradient (learned frequencies) or is traced (``jax.jit``,
        ``torch.compile``) is computed with in the graph: gradients reach it, and the angles
        are then formed in the namespace's widest float. ``[batch, r/2]``: one frequency
        set per row (:func:`rope_frequencies` of a per-row ``seq_len``); the positions'
        first axis is then the batch (length ``batch`` or 1), or the positions are
        ``[seq]``, shared, and row ``b`` of the tables is the call with ``inv_freq[b]``
        (bit-identical), ``[batch, ..., r]``.
    layout : {"half", "interleaved"}
        ``"half"``: ``[c_0 .. c_{n-1}, c_0 .. c_{n-1}]`` (GPT-NeoX, LLaMA);
        ``"interleaved"``: ``[c_0, c_0, c_1, c_1, ...]`` (RoFormer, GPT-J).
    dtype : float dtype, optional
        Of the result; by default the dtype of float positions, float32 for integer ones.
    scale : float
        Multiplies both tables (a scaling's ``attention_scale``, as Hugging Face does).

    Returns
    -------
    cos, sin : arrays ``positions.shape + (r,)``
        Angles in float64 (or the exact split reduction where the namespace has no
        float64), rounded once to ``dtype``.

    Examples
    --------
    >>> import numpy as np, posenc as pe
    >>> cos, sin = pe.rope_cos_sin(np.arange(3.0), [1.0, 0.5], layout="interleaved")
    >>> cos.shape, cos.dtype
    ((3, 4), dtype('float64'))
    >>> sin[2].round(4).tolist()
    [0.9093, 0.9093, 0.8415, 0.8415]
    """
    positions = _call.table_positions(positions, inv_freq)
    if check.is_array(inv_freq) and inv_freq.ndim == 2:
        return _tables_per_row(positions, inv_freq, layout=layout, dtype=dtype, scale=scale)
    call = _call.parse_tables(positions, inv_freq, layout=layout, dtype=dtype, scale=scale)
    check.allocatable_unless_blocked("rope_cos_sin", (*positions.shape, 2 * call.pairs), 8, positions)
    return call.placed(*call.tables(*call.cos_sin(call.positions, call.freqs)))


def _tables_per_row(positions, inv_freq, **options):
    """``rope_cos_sin`` of a frequency set per row: row ``b`` is the call with ``inv_freq[b]``
    and the positions' row ``b`` (or their only row, or all of ``[seq]`` positions)."""
    check.array("positions", positions)
    xp = namespace(positions)
    rows = int(inv_freq.shape[0])
    if rows == 0:
        raise ValueError(f"inv_freq of shape {tuple(inv_freq.shape)} holds no row")
    shared = positions.ndim < 2
    if not shared and positions.shape[0] not in (1, rows):
        raise ValueError(
            f"positions of shape {tuple(positions.shape)} do not fit inv_freq's {rows} rows: their first axis "
            f"is the batch, of length {rows} or 1 (or give [seq] positions, shared by every row)"
        )
    inv_freq, split = unsplit(inv_freq, 0)  # (row by row: the rows are gathered, the tables' rows put back on their split)
    if not shared:
        positions, positions_split = unsplit(positions, 0)
        split = split or positions_split
    tables = [
        rope_cos_sin(positions if shared else positions[b if positions.shape[0] > 1 else 0, ...], inv_freq[b, ...], **options)
        for b in range(rows)
    ]
    return split_as_first(xp.stack([c for c, _ in tables]), split, 0), split_as_first(xp.stack([s for _, s in tables]), split, 0)


@_plans.planned(_signatures.ApplyRope)
@host_constants
def apply_rope(x, cos, sin, *, layout="half", out=None):
    r"""Rotate the channels of ``x`` with precomputed ``cos`` and ``sin``.

    The first ``r = cos.shape[-1]`` channels are rotated, the rest pass through (partial
    rotary, GPT-NeoX / Phi style). ``layout="half"`` pairs ``(x[i], x[i + r/2])``: the
    result is LLaMA's ``x * cos + rotate_half(x) * sin``; ``layout="interleaved"`` pairs
    ``(x[2i], x[2i+1])`` (RoFormer, GPT-J). Each pair ``(a, b)`` becomes
    ``(a*cos - b*sin, b*cos + a*sin)``, a rotation by ``+angle`` (Su et al., "RoFormer:
    Enhanced Transformer with Rotary Position Embedding", 2021).

    The tables hold each angle twice, as :func:`rope_cos_sin` and transformers make them
    (``cos[..., i] == cos[..., i + r/2]`` for ``"half"``, ``cos[..., 2i] == cos[..., 2i+1]``
    for ``"interleaved"``). A pair reads the entries of its first channel (``i``, or
    ``2i``): the second copy is not read and gets no gradient, so tables whose two copies
    differ (not a rotation) give another result than ``x * cos + rotate_half(x) * sin``.

    Parameters
    ----------
    x : array ``[..., d]``, real floating
    cos, sin : arrays ``[..., r]`` with ``r <= d`` even, as :func:`rope_cos_sin` makes them;
        they broadcast against ``x.shape[:-1] + (r,)`` (e.g. ``[seq, r]`` for
        ``x`` of shape ``[batch, heads, seq, d]``).
    layout : {"half", "interleaved"}
    out : array like ``x``, optional
        Written with the result and returned; ``out=x`` rotates in place.

    Returns
    -------
    array like ``x`` (same dtype). The rotation runs in float64 where available.

    Examples
    --------
    >>> import numpy as np, posenc as pe
    >>> cos, sin = pe.rope_cos_sin(np.array([1]), [np.pi / 2])
    >>> pe.apply_rope(np.array([[1.0, 0.0]]), cos, sin).round(6).tolist()
    [[0.0, 1.0]]
    """
    return _call.parse_apply(x, cos, sin, layout=layout, out=out).run()


@_plans.planned(_signatures.RotatePair)
def rotate_pair(q, k, cos, sin, *, layout="half"):
    """``(apply_rope(q, cos, sin), apply_rope(k, cos, sin))``, the query and key of one
    attention layer (Hugging Face's ``apply_rotary_pos_emb``): one CUDA launch for both where
    both go to the numba.cuda kernel and their rows line up (``rope_cuda.rotate_cos_sin_pair``:
    q ``[b, hq, s, d]`` and k ``[b, hk, s, d]``, transposed views of ``[b, s, h, d]``
    included, read where they lie), else each through :func:`apply_rope`. The later calls of
    a signature launch from a plan (``rope_plan.build_pair``: the one launch on CUDA tensors,
    the two ``apply_rope`` plans on a CPU).
    """
    layout = _args.layout("layout", layout)
    launcher = cuda_pair_launcher(q, k, cos, sin, layout)
    if launcher is not None:
        return launcher(q, k, cos, sin, layout=layout)
    return apply_rope(q, cos, sin, layout=layout), apply_rope(k, cos, sin, layout=layout)


def cuda_pair_launcher(q, k, cos, sin, layout):
    """``rope_cuda.rotate_cos_sin_pair`` where the kernel registry sends both ``q`` and ``k``
    (with these tables, in ``layout``) to the numba.cuda kernel, else None."""
    pair = [_dispatch.select("rope_apply", x, cos, sin, layout=layout, out=None) for x in (q, k)]
    if pair[0] is pair[1] and getattr(pair[0], "__module__", None) == "posenc._kernels.rope_cuda":
        import sys

        return sys.modules["posenc._kernels.rope_cuda"].rotate_cos_sin_pair
    return None


@_plans.planned(_signatures.Rope)
@host_constants
def rope(
    x,
    positions=None,
    *,
    base=10000.0,
    scaling=None,
    layout="half",
    rotary_dim=None,
    offset=0,
    seq_axis=-2,
    inverse=False,
    seq_len=None,
    out=None,
):
    r"""Rotary position embedding in one call: angles from positions, computed in the kernel.

    Rotates pair ``i`` of the first ``rotary_dim`` channels of a token at position ``m`` by
    :math:`m\,\theta_i` and multiplies the rotated channels by the scaling's attention
    scale (see :func:`apply_rope` for the pairing of each ``layout``):
    :math:`(a, b) \mapsto (a \cos m\theta_i - b \sin m\theta_i,\ b \cos m\theta_i + a \sin m\theta_i)`
    with :math:`\theta_i` = ``rope_frequencies(rotary_dim, base=base, scaling=scaling)``
    (:math:`\text{base}^{-2i/r}` unscaled; Su et al., "RoFormer: Enhanced Transformer with
    Rotary Position Embedding", 2021).

    Parameters
    ----------
    x : array ``[..., d]``, real floating (queries or keys, e.g. ``[batch, heads, seq, d]``)
    positions : array, optional
        Integer or finite float positions (per-token ids for KV-cache decoding, packed
        batches: :func:`positions_from_cu_seqlens`, padding: :func:`positions_from_mask`).
        Their last axis runs along the sequence axis and their leading axes along the
        leading (batch) axes of ``x``: ``[seq]`` and Hugging Face's ``[batch, seq]``
        position ids fit ``[batch, heads, seq, d]`` as they are; positions with
        ``x.ndim - 1`` axes broadcast axis by axis. Default: ``arange(L)`` along the
        sequence axis.
    base : float
    scaling : posenc.scaling object, optional
    layout : {"half", "interleaved"}
    rotary_dim : int, optional
        Channels rotated (default ``d``); the others pass through unchanged.
    offset : int, 0-d integer array, or integer array of one value per batch row
        Added to the positions (the number of cached tokens when decoding); a traced value
        (``jax.jit``, ``torch.compile``) is fine. Per row: ``[batch]`` (or shaped like the
        token axes of ``x`` with length 1 along the sequence), on the leading batch axes.
        Integer sums that would leave int64 are a ``ValueError`` in host memory. On an
        accelerator (a CUDA tensor, CuPy, JAX on a GPU with float64) nothing is read back
        to check them (each read is a synchronisation, and a CUDA graph cannot capture it):
        positions and offset are added in float64 on the device, the float64 positions
        the rotation converts integer ones to anyway, so the host's bits wherever they
        and their sums lie within :math:`\pm 2^{53}`, and past that the rotation at the
        float64 sum (never at a wrapped int64 one); float positions' finiteness is not
        read there either (a non-finite position gives NaN). A length-dependent scaling
        (dynamic NTK, LongRoPE) without ``seq_len`` still reads its length on the host.
    seq_axis : int or str
        The sequence axis of ``x`` (not the feature axis), or a named layout, one letter
        per axis: ``"bhsd"`` (batch, heads, seq, features: Hugging Face), ``"bshd"``
        (flash-attention, JAX), ``"thd"`` (packed tokens: ``positions`` required),
        ``"hsd"``, ``"bsd"``, ``"sd"``... Default: axis -2, whatever the lengths of the
        other axes (a ``"bshd"`` or ``"thd"`` input needs its ``seq_axis``).
    inverse : bool
        Undo the embedding: rotate by ``-angle`` and divide by the attention scale, so
        ``rope(rope(x), inverse=True) == x``. (With attention scale 1 this is also the
        transpose, i.e. the backward pass.)
    seq_len : int, 0-d integer array, or integer array of one value per batch row, optional
        The sequence length that ``DynamicNTK`` and ``LongRoPE`` adapt to; per row (placed
        as ``offset``), each row gets the frequencies of its own length, bit-identical to
        a single-row call with its value. Default: the
        largest position + 1 (rounded up: fractional positions switch LongRoPE where
        transformers' ``max + 1 > original`` does), decided per call; with a per-row
        ``offset``, each row's own (its largest position, rounded up, + ``offset[b]`` + 1), as a call on
        that row alone. Where the positions (or ``seq_len``) cannot
        be read now (``jax.jit``, ``torch.compile``, Dask) the frequencies are computed
        from that traced length inside the computation, with the same result; the
        rotation then takes ``cos``/``sin`` tables (``apply_rope``'s path), angles in the
        namespace's widest float.
    out : array like ``x``, optional
        ``out=x`` rotates in place (not for JAX).

    Returns
    -------
    array like ``x`` (same dtype); angles in float64 (or the exact split reduction where
    the namespace/device has no float64), the rotation in float64 where available.

    Examples
    --------
    >>> import numpy as np, posenc as pe
    >>> q = np.ones((1, 3, 4))                            # [heads, seq, dim]
    >>> pe.rope(q)[0, 1].round(4).tolist()               # position 1
    [-0.3012, 0.99, 1.3818, 1.0099]
    >>> bool(np.allclose(pe.rope(pe.rope(q, offset=5), offset=5, inverse=True), q, atol=1e-6))
    True
    >>> k = np.ones((2, 3, 1, 4))                          # [batch, seq, heads, dim]
    >>> bool(np.allclose(pe.rope(k, seq_axis="bshd")[:, 1, 0], pe.rope(q)[0, 1]))
    True
    """
    call = _call.parse_rope(
        x, positions, base=base, scaling=scaling, layout=layout, rotary_dim=rotary_dim, offset=offset,
        seq_axis=seq_axis, inverse=inverse, seq_len=seq_len, out=out,
    )  # fmt: skip
    if call.path in ("rows", "offsets"):
        return _rows_written(call)
    if call.path == "traced":
        return _rotate_traced_length(call)
    if call.path == "length":
        return _dispatch.call("rope_rotate_at_length", call.x, call.positions, call.seq_len, **call.length_options(), out=call.out)
    if call.path == "split":
        c, s = cos_sin(call.positions, call.inv_freq, xp=call.xp, device=call.device, offset=call.offset)
        return _call.rotate_by(call.x, c, -s if call.inverse else s, call.scale, call.layout, call.out)
    return call.run()


def _rotate_traced_length(call):
    """``rope`` for a length known only inside the computation: the kernel op that reads it
    when it runs where one takes it (JAX on the CPU: the eager call's bits), else
    :func:`rotate_at_traced_length`."""
    seq_len = call.seq_len
    if not check.is_array(seq_len):  # a symbolic size of torch.compile
        seq_len = call.xp.asarray(seq_len, device=call.device)
    options = call.length_options()
    if call.carried:  # (the op reads summed positions)
        return rotate_at_traced_length(call.x, call.positions, seq_len, **options, out=call.out, offset=call.offset)
    if nameable(call.scaling):  # (the op takes the scaling by name)
        kernel = _dispatch.select("rope_rotate_at_length", call.x, call.positions, seq_len, **options, out=call.out)
        if kernel is not _dispatch.references()["rope_rotate_at_length"]:
            return kernel(call.x, call.positions, seq_len, **options, out=call.out)
    return rotate_at_traced_length(call.x, call.positions, seq_len, **options, out=call.out)


def rotate_at_traced_length(x, positions, seq_len, *, scaling, rotary_dim, base, layout, inverse, out=None, offset=0):
    """``x`` rotated at the frequencies ``scaling`` gives at ``seq_len``, a 0-d or per-row
    array that cannot be read now (integers, or the whole-number floats of float positions:
    ``_args.sequence_length``): the frequencies computed from it in the namespace, then the
    rotation by ``cos``/``sin`` tables (``rope_apply``), at ``positions + offset``."""
    xp, device = namespace(x), device_of(x)
    if seq_len.ndim:  # per row: a frequency set for each, [..., 1, r/2] against the positions' [..., seq]
        seq_len = seq_len[..., None]
    if has_float64(xp, device):
        inv_freq, scale = scaling.traced_frequencies(xp, rotary_dim, base, seq_len, device)
        c, s = cos_sin_of_array(positions, inv_freq, xp=xp, device=device, offset=offset)
    else:  # the frequencies in double-float, the angles by the exact split reduction
        turns, scale = scaling.traced_turns(xp, rotary_dim, base, seq_len, device)
        c, s = cos_sin_of_turns(positions, turns, xp=xp, offset=offset)
    if inverse:
        s, scale = -s, 1.0 / scale
    return _call.rotate_by(x, c, s, scale, layout, out)


def _rows_written(call):
    """A per-row ``seq_len`` or, float positions without float64, a per-row ``offset``, eagerly:
    each row rotated by the call a single row makes."""
    options = {"base": call.base, "scaling": call.scaling, "layout": call.layout, "rotary_dim": call.rotary_dim, "inverse": call.inverse}

    rows = call.path == "rows"
    seq_len, every = (call.seq_len, None) if rows else (None, call.seq_len)  # ("offsets": a length read now, every row's)

    def one_row(x_row, positions_row, length, offset=0):
        return rope(x_row, positions_row, offset=offset, seq_axis=-2, seq_len=length if rows else every, **options)

    offset = call.offset if call.carried else None  # (else in the positions)
    result = _rows.rotate_each_row(call.xp, call.x, call.positions, seq_len, one_row, offset=offset)
    if call.out is None:
        return result
    call.out[...] = result
    return call.out
