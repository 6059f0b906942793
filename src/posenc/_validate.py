"""Argument checks shared by every public function.

Each check raises ``ValueError`` or ``TypeError`` with a message that names the argument,
the value received and what was expected, before anything is computed.
"""

from __future__ import annotations

import math
import numbers
import operator
import os
import sys
import warnings

try:
    import resource
except ImportError:  # pragma: no cover - Windows
    resource = None

from numpy import dtype as _numpy_dtype
from numpy import ndarray as _ndarray

from . import _compat
from ._xp import PLAIN, broadcast_shapes, device_of, elsewhere, index_dtype, is_integer, native_order, is_real_floating, jax_symbolic_dim, namespace, on_accelerator, result_dtype, symbolic_size, torch_compiling, torch_device_is, torch_tensor, torch_without_data, trace_constant, widest_float


def _show(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _torch():
    """The torch module if it is loaded (a torch tensor can only exist then), else None."""
    return sys.modules.get("torch")


def _zero_d_integer(name, value):
    """``value``, an array, must be a 0-d integer array (an integer argument given as an array)."""
    not_masked(name, value)
    if torch_tensor(value):
        integral = not (value.dtype.is_floating_point or value.dtype.is_complex or value.dtype == _torch().bool)
    else:
        integral = is_integer(_compat.array_namespace(value), value.dtype)
    if value.ndim != 0 or not integral:
        raise TypeError(
            f"{name} must be an integer or a 0-d integer array, got an array of shape {tuple(value.shape)} and dtype {value.dtype}"
        )


def integer(name, value, *, minimum=None, static=False):
    """``value`` as a Python int; ``bool`` and non-integral numbers are rejected.

    A 0-d integer array whose value can be read now counts as its integer. One that cannot
    (a traced JAX value, a torch tensor while torch compiles) is refused: use
    :func:`integer_or_traced` where a traced value can be computed with. A symbolic size
    of ``torch.compile`` (``torch.SymInt``) is kept symbolic, or with ``static`` (a value
    that shapes host work: a feature width, a bucket count) specialized (:func:`static_int`).
    A symbolic dimension of ``jax.export`` is kept symbolic too, or with ``static`` refused
    (:func:`_symbolic_integer`).
    """
    torch = _torch()
    if torch is not None and isinstance(value, torch.SymInt) and not static:
        if minimum is not None and value < minimum:
            raise ValueError(f"{name} must be >= {minimum}, got {value}")
        return value
    if is_array(value):
        _zero_d_integer(name, value)
        if not (is_eager(value) or concrete_jax(value)):  # (one closed over by a jitted function holds its value)
            raise TypeError(
                f"{name} must be a concrete integer here (its value is read before any work: a size, a count or a range checked), got a traced {type(value).__name__}; "
                f"pass a Python int ({STATIC_HINT})"
            )
        value = int(value.item() if torch_tensor(value) else value)  # (torch's int() of a uint64 past int64 raises RuntimeError)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        if jax_symbolic_dim(value):
            return _symbolic_integer(name, value, minimum, static)
        raise TypeError(f"{name} must be an integer, got {_show(value)} ({type(value).__name__})")
    value = static_int(value) if static else int(value)
    if minimum is not None and value < minimum:
        what = {0: "a non-negative integer", 1: "a positive integer"}.get(minimum, f"an integer >= {minimum}")
        raise ValueError(f"{name} must be {what}, got {value}")
    if not INT64_MIN <= value <= INT64_MAX:  # every integer argument becomes a shape, an index or an int64 position
        raise ValueError(f"{name} must fit in int64 ({INT64_MIN} .. {INT64_MAX}), got {value}")
    return value


INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
STATIC_HINT = "under jax.jit: a static argument, jax.jit(f, static_argnums=...) or static_argnames=..."
CONSTRAINT_HINT = "jax.export.symbolic_shape(..., constraints=[...])"


def _symbolic_integer(name, value, minimum, static):
    """A symbolic dimension of ``jax.export`` given as an integer argument: kept symbolic, its
    ``minimum`` checked where JAX decides it (with the constraints declared on its
    dimensions), else refused with the constraint to declare; refused where ``static``."""
    if static:
        raise TypeError(f"{name} must be a concrete integer here (it shapes host work), got the symbolic dimension {value} of jax.export")
    holds = True if minimum is None else _decided(lambda: value >= minimum)
    if holds is None:
        raise ValueError(f"{name} must be >= {minimum}, got {value}, which JAX cannot bound: declare '{value} >= {minimum}' ({CONSTRAINT_HINT})")
    if not holds:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def relative_offset(offset, q_len, k_len, xp=None, device=None):
    """A validated ``offset`` of the first query (an int or a symbolic dimension of
    ``jax.export``, as the lengths may be: :func:`within`; a traced array as it is) whose
    query positions ``offset .. offset + q_len - 1`` and relative positions
    ``(offset + i) - j``, down to ``offset - (k_len - 1)``, stay within the index dtype of
    ``xp`` (int64; int32 for JAX without x64; int64 when ``xp`` is not known yet). A Dask
    ``offset`` is checked when computed (the one returned, :func:`_checked_blocks`)."""
    if _compat.is_dask_array(offset):
        return _checked_blocks(_relative_offset_block, offset, dtype=offset.dtype, q_len=q_len, k_len=k_len)
    if isinstance(offset, int) or jax_symbolic_dim(offset):
        bits, bottom, top = (64, INT64_MIN, INT64_MAX) if xp is None else index_bounds(xp, device)[1:]
        low, high = offset - max(k_len - 1, 0), offset + max(q_len - 1, 0)
        if not within("the relative positions (offset + i) - j", low, high, bottom, top, (q_len, k_len)):
            raise ValueError(
                f"offset={offset} with q_len={q_len} and k_len={k_len} puts the relative positions (offset + i) - j "
                f"at {low} .. {high}, beyond int{bits} ({bottom} .. {top})"
            )
        return offset
    return computed_on("offset", offset, device)


# ---------------------------------------------------------------- the integer rule
# Integer positions, offsets and deltas of any integer dtype are widened to the namespace's
# index dtype (int64; int32 for JAX without x64) before any arithmetic, and every sum or
# difference formed from them is checked to stay within that dtype before a kernel runs
# (values that can be read now; a traced value is computed with as it is).


def _relative_offset_block(offset, *, q_len, k_len):
    relative_offset(int(offset), q_len, k_len, namespace(offset), device_of(offset))
    return offset


def index_bounds(xp, device=None):
    """``(dtype, bits, low, high)`` of the namespace's index dtype."""
    dtype = index_dtype(xp, device)
    torch = _torch()
    # NumPy's dtypes and torch's in separate caches (hashable, ranges fixed): torch.compile
    # traces the lookup in the torch one, and some versions cannot hash a NumPy dtype key.
    # While torch.compile traces, no cache: a process's first traced call filling it fails that
    # graph's guard at the second call, a recompile.
    if isinstance(dtype, _numpy_dtype):
        cache = _NUMPY_BOUNDS
    else:
        cache = _TORCH_BOUNDS if torch is not None and isinstance(dtype, torch.dtype) and not torch_compiling() else None
    bounds = cache.get(dtype) if cache is not None else None
    if bounds is None:
        info = xp.iinfo(dtype)
        bounds = dtype, int(info.bits), int(info.min), int(info.max)
        if cache is not None:
            cache[dtype] = bounds
    return bounds


_NUMPY_BOUNDS = {}  # NumPy index dtype -> index_bounds
_TORCH_BOUNDS = {}  # torch index dtype -> index_bounds


def _size(value):
    return math.prod(int(n) for n in value.shape)


def _readable(*values):
    """Whether every array among ``values`` can be read now and holds something."""
    return all(not is_array(v) or (is_eager(v) and _size(v) > 0) for v in values)


def widened(name, value, xp, device=None):
    """An integer array ``value`` as the index dtype; values beyond its range (uint64 above
    int64's, or int64 values for JAX without x64) refused, naming ``name`` (of a Dask array,
    block by block when computed: :func:`_checked_blocks`)."""
    dtype, bits, low, high = index_bounds(xp, device)
    if value.dtype == dtype:
        return value
    info = xp.iinfo(value.dtype)
    if int(info.min) < low or int(info.max) > high:
        if _compat.is_dask_array(value):
            return _checked_blocks(_widened_block, value, dtype=dtype, label=name)
        if _readable(value):
            smallest, largest = _integer_range(xp, value, dtype, bits)
            if smallest < low or largest > high:
                raise ValueError(f"{name} must fit in int{bits} ({low} .. {high}), got values from {smallest} to {largest}")
    return xp.astype(value, dtype)


def _widened_block(block, *, label):
    return widened(label, block, namespace(block), device_of(block))


def _checked_blocks(check_block, *values, dtype, **options):
    """``check_block(*blocks, **options)`` on the blocks of ``values`` (broadcast; at least one
    a Dask array, other arrays made ones, Python ints passed to every block), lazily: the check that reads values runs on each
    block when the result is computed (none could run now), before the block is used, and
    raises the eager check's ``ValueError`` for the values of that block."""
    import dask.array as da
    from dask.array.utils import meta_from_array

    ndim = max(v.ndim for v in values if is_array(v))
    axes = tuple(range(ndim))
    pairs = [(da.asarray(v), axes[ndim - v.ndim :]) if is_array(v) else (v, None) for v in values]
    meta = meta_from_array(next(v for v in values if _compat.is_dask_array(v)), ndim=ndim, dtype=dtype)
    return da.blockwise(check_block, axes, *(item for pair in pairs for item in pair), dtype=dtype, meta=meta, **options)


def rows_within(offsets, *, length, rows, error):
    """``offsets``, an array of first rows, whose rows ``offset .. offset + length - 1`` must
    all lie in a table of ``rows`` rows: checked now where they can be read, on each block of a
    Dask array when computed (the one returned), a traced array as it is. ``error(low, high)``
    is the ``ValueError``'s message for the smallest and the largest offset."""
    if is_eager(offsets):
        return _rows_within_block(offsets, length=length, rows=rows, error=error)
    if _compat.is_dask_array(offsets):
        return offsets.map_blocks(_rows_within_block, length=length, rows=rows, error=error, dtype=offsets.dtype)
    return offsets


def _rows_within_block(offsets, *, length, rows, error):
    if _size(offsets):
        xp = namespace(offsets)
        low, high = int(xp.min(offsets)), int(xp.max(offsets))
        if low < 0 or high + length > rows:
            raise ValueError(error(low, high))
    return offsets


def narrowed(name, result, dtype, low, high, xp):
    """An integer ``result`` computed in the index dtype, as ``dtype`` (a narrower integer
    dtype an argument came in) when every value it can take, ``low .. high`` (known from
    the options, not read from the data), fits there; ``ValueError`` naming ``name`` and
    the dtype otherwise. A NumPy dtype in the other byte order gives its native twin, as
    every result is."""
    dtype = native_order(dtype)
    if result.dtype == dtype:
        return result
    info = xp.iinfo(dtype)
    if low < int(info.min) or high > int(info.max):
        raise ValueError(
            f"{name} can be {low} .. {high}, beyond {getattr(info, 'dtype', dtype)} ({int(info.min)} .. {int(info.max)}): pass a wider integer dtype"
        )
    return xp.astype(result, dtype)


def _integer_range(xp, value, index_dtype, bits):
    """``(min, max)`` of an integer array as Python ints. torch has no min or max of uint64 on
    the CPU: there they are read from the array cast to the 64-bit index dtype, where values
    above its largest wrap to negatives in the same order."""
    try:
        return int(xp.min(value)), int(xp.max(value))
    except (NotImplementedError, RuntimeError):
        if not (bits == 64 and xp.iinfo(value.dtype).bits == 64 and int(xp.iinfo(value.dtype).min) == 0):
            raise
    signed = xp.astype(value, index_dtype)
    wrapped = signed < 0
    low, high = xp.iinfo(index_dtype).min, xp.iinfo(index_dtype).max
    unwrapped_min = int(xp.min(xp.where(wrapped, high, signed)))
    if not bool(xp.any(wrapped)):
        return unwrapped_min, int(xp.max(signed))
    largest = 2**64 + int(xp.max(xp.where(wrapped, signed, low)))
    return (unwrapped_min if not bool(xp.all(wrapped)) else 2**64 + int(xp.min(signed))), largest


def shifted(name, values, offset, xp, device=None, *, offset_name="offset", known=None):
    """``values + offset``, where integer ``values`` are of the index dtype (:func:`widened`)
    and ``offset`` is an int or an array of it: every sum is checked to stay within that
    dtype (``ValueError`` naming both) when the values can be read now, or for Dask arrays
    block by block when computed (:func:`_checked_blocks`). Float ``values`` are
    summed in the widest float (in float16 ``2048 + 3`` is 2052). ``known``: the
    ``(min, max)`` of ``values`` when the caller knows them (an ``arange``)."""
    if isinstance(offset, int) and offset == 0:
        return values
    if not is_integer(xp, values.dtype):
        wide = widest_float(xp, device)
        return xp.astype(values, wide, copy=False) + (xp.astype(offset, wide) if is_array(offset) else offset)
    _, bits, low, high = index_bounds(xp, device)
    if isinstance(offset, int) and not low <= offset <= high:
        raise ValueError(f"{offset_name} must fit in int{bits} ({low} .. {high}), got {offset}")
    leaves = _sum_leaves(xp, values, offset, low, high, known, what=f"{offset_name} + {name}")
    if leaves is None and (_compat.is_dask_array(values) or _compat.is_dask_array(offset)):
        return _checked_blocks(_shifted_block, values, offset, dtype=values.dtype, label=name, offset_name=offset_name)
    if leaves:
        raise ValueError(
            f"{offset_name} + {name} must stay within int{bits} ({low} .. {high}): "
            f"{name} {_extent(xp, values, known)} with {offset_name} {_extent(xp, offset)} leave it"
        )
    return values + offset


def _shifted_block(values, offset, *, label, offset_name):
    return shifted(label, values, offset, namespace(values, offset), device_of(values), offset_name=offset_name)


def _size_like(value) -> bool:
    """An int, or a size that a trace keeps symbolic (``jax.export``, ``torch.export``): one
    value, with no ``min`` or ``max`` to read."""
    return isinstance(value, int) or jax_symbolic_dim(value) or symbolic_size(value)


def _extent(xp, value, known=None):
    if _size_like(value):
        return str(value)
    smallest, largest = known if known is not None else (int(xp.min(value)), int(xp.max(value)))
    return f"from {smallest} to {largest}"


def _sum_leaves(xp, a, b, low, high, known, *, what):
    """Whether some ``a + b`` (broadcast) leaves ``[low, high]``; None where one cannot be read
    now. ``known``: ``(min, max)`` of ``a`` where the caller knows them, an ``arange`` along an
    axis (whose size, ``max - min + 1``, may be a symbolic dimension of ``jax.export``:
    :func:`within`); ``what``: the sums, as an error names them."""
    if not (_readable(b) and (known is not None or _readable(a))):
        return None
    amin, amax = known if known is not None else (int(xp.min(a)), int(xp.max(a)))
    single = _size_like(b)
    bmin, bmax = (b, b) if single else (int(xp.min(b)), int(xp.max(b)))
    lengths = () if known is None else (amax - amin + 1,)
    if within(what, amin + bmin, amax + bmax, low, high, lengths):
        return False
    if single or b.ndim == 0 or known is not None or a.ndim == 0:
        return True  # one of the two is a single value: its bounds are the sums'
    zero = xp.zeros_like(b)
    up, down = xp.where(b > 0, b, zero), xp.where(b < 0, b, zero)  # high - up and low - down stay in range
    return bool(xp.any((b > 0) & (a > high - up))) or bool(xp.any((b < 0) & (a < low - down)))


def differences(xp, q, k, device=None, *, names=("query_positions", "key_positions")):
    """``q``, whose differences ``q[..., i] - k[..., j]`` with ``k`` (integer arrays of the
    index dtype, leading axes broadcast) must stay within the index dtype for every pair:
    ``ValueError`` naming both otherwise. With a Dask array among them the check runs when
    ``q`` is computed (the ``q`` returned, whose every block waits for it)."""
    if not (is_integer(xp, q.dtype) and is_integer(xp, k.dtype)):
        return q
    readable = _readable(q, k)
    if not (readable or (_compat.is_dask_array(q) or _compat.is_dask_array(k)) and _size(q) and _size(k)):
        return q
    _, bits, low, high = index_bounds(xp, device)
    if readable and low <= int(xp.min(q)) - int(xp.max(k)) and int(xp.max(q)) - int(xp.min(k)) <= high:
        return q  # (from the extremes of all rows: half the reductions of the rows' own, 2 us each)
    qmin, qmax, kmin, kmax = xp.min(q, axis=-1), xp.max(q, axis=-1), xp.min(k, axis=-1), xp.max(k, axis=-1)
    if not readable:
        leave = _rows_leave(xp, qmin, qmax, kmin, kmax, low, high)
        extents = [xp.min(qmin), xp.max(qmax), xp.min(kmin), xp.max(kmax)]
        return _checked_blocks(_differences_block, q, leave, *extents, dtype=q.dtype, names=names, bits=bits, low=low, high=high)
    if bool(_rows_leave(xp, qmin, qmax, kmin, kmax, low, high)):
        raise _differences_error(names, bits, low, high, f"from {int(xp.min(qmin))} to {int(xp.max(qmax))}", f"from {int(xp.min(kmin))} to {int(xp.max(kmax))}")
    return q


def _rows_leave(xp, qmin, qmax, kmin, kmax, low, high):
    """Whether some ``q - k`` of a row leaves ``[low, high]``, from each row's extremes (a 0-d bool array)."""
    zero = xp.zeros_like(kmin)
    over = (kmin < 0) & (qmax > high + xp.where(kmin < 0, kmin, zero))  # qmax - kmin > high
    under = (kmax > 0) & (qmin < low + xp.where(kmax > 0, kmax, zero))  # qmin - kmax < low
    return xp.any(over) | xp.any(under)


def _differences_block(q, leave, qmin, qmax, kmin, kmax, *, names, bits, low, high):
    if bool(leave):
        raise _differences_error(names, bits, low, high, f"from {int(qmin)} to {int(qmax)}", f"from {int(kmin)} to {int(kmax)}")
    return q


def _differences_error(names, bits, low, high, q_extent, k_extent):
    return ValueError(
        f"the relative positions {names[0]} - {names[1]} must stay within int{bits} ({low} .. {high}): "
        f"{names[0]} {q_extent} (offset included) and {names[1]} {k_extent} leave it"
    )


def grown_length(length, num_positions):
    """A learned table's ``extend(length)``: an int at least its ``num_positions`` rows."""
    length = integer("length", length, minimum=0)
    if length < num_positions:
        raise ValueError(f"extend grows the table: length must be >= num_positions = {num_positions}, got {length}")
    return length


def integer_or_traced(name, value, *, minimum=None, read=True):
    """An integer argument that the computation may carry as an array (an offset, a length
    that no shape depends on): :func:`integer`, except that a 0-d integer array whose value
    cannot be read now (a traced JAX value, a torch tensor while torch compiles, a Dask
    scalar), or any with ``read=False``, is returned as it is; its range is then not checked."""
    if is_array(value):
        _zero_d_integer(name, value)
        if not (read and is_eager(value)):
            return value
    return integer(name, value, minimum=minimum)


def integer_or_on_device(name, value, *, minimum=None):
    """:func:`integer_or_traced`, except that a 0-d integer array on an accelerator (a torch
    tensor off the CPU, a CuPy array, a JAX array on a GPU) is also returned unread: reading
    it is a device synchronisation, which a CUDA graph cannot capture. Its range is then not
    checked: for a caller that computes with it where no sum can wrap (clamped, or summed in
    float64)."""
    read = not (is_array(value) and is_eager(value) and on_accelerator(value))  # (a traced one is left unread anyway)
    return integer_or_traced(name, value, minimum=minimum, read=read)


def computed_on(name, value, device):
    """A torch ``value`` computed with rather than read (an offset or length that cannot be
    read now, frequencies in the graph) on ``device``, the other arguments'; a 0-d one may
    also be on the CPU (torch takes a CPU scalar beside any device's tensors). ``ValueError``
    naming it otherwise (torch's ``RuntimeError`` once computing). Another library's array
    must be on ``device`` as :func:`posenc._xp.elsewhere` says."""
    if not torch_tensor(value):
        return _not_elsewhere(name, value, device)
    if device is None or value.ndim == 0 and value.device.type == "cpu":
        return value
    if not torch_device_is(value.device, _torch().device(device)):  # (a device= given as a string: "cuda" is any CUDA device)
        raise ValueError(f"{name} must be on device {device}, the other arguments', got {value.device}")
    return value


def read_on_its_gpu(name, value, device):
    """A torch ``value`` about to be read on the host (an offset, frequencies) beside arrays
    on ``device``: a ``ValueError`` naming it where both are accelerators but not the same
    one, before the read (a synchronisation on a GPU the call does not run on, its number
    then used on another). One on the CPU, or on a GPU beside host arrays, is read.
    Another library's array must be on ``device`` as :func:`posenc._xp.elsewhere` says
    (its library would refuse to combine it there; read, it would move unseen)."""
    if not torch_tensor(value):
        return _not_elsewhere(name, value, device)
    if device is None or value.device.type == "cpu":
        return value
    want = _torch().device(device)
    if want.type != "cpu" and not torch_device_is(value.device, want):
        raise ValueError(f"{name} is on {value.device}, the other arguments on {device}: move it to {device} (or pass a CPU value)")
    return value


def _not_elsewhere(name, value, device):
    if elsewhere(value, device):
        raise ValueError(f"{name} must be on device {device}, the other arguments', got {device_of(value)}")
    return value


def even_dim(name, value):
    """A positive even integer (feature sizes that hold (cos, sin) pairs)."""
    value = integer(name, value, minimum=1, static=True)
    if value % 2:
        raise ValueError(f"{name} must be a positive even integer, got {value}")
    return value


def real(name, value, *, positive=False, minimum=None, below=None, static=True):
    """A finite real Python number, optionally > 0, >= ``minimum``, < ``below``; with
    ``static``, a symbolic one of ``torch.compile`` specialized (:func:`static_float`)."""
    if is_array(value) and not is_eager(value):
        raise TypeError(f"{name} must be a concrete number here, got a traced {type(value).__name__}; pass a Python float ({STATIC_HINT})")
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {_show(value)} ({type(value).__name__})")
    value = static_float(value) if static else float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    if positive and value <= 0:
        raise ValueError(f"{name} must be > 0, got {value}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    if below is not None and value >= below:
        raise ValueError(f"{name} must be < {below}, got {value}")
    return value


def within(what, smallest, largest, low, high, lengths=()):
    """Whether ``smallest .. largest`` stays within ``low .. high`` (an index dtype's range).

    Bounds that are symbolic dimensions of ``jax.export`` (known when the exported function is
    called) stay within where JAX proves it (with the constraints declared on the
    dimensions), or where they are within one of ``lengths``, axis sizes, of zero: ``jax.export``
    computes sizes in JAX's default integer, the index dtype, so ``-1 - n >= low`` and ``n <=
    high`` for each. They leave where JAX proves that; a range JAX can neither prove nor
    refute is refused (``ValueError`` naming ``what``) with the constraints that decide it.
    """
    if not (jax_symbolic_dim(smallest) or jax_symbolic_dim(largest)):
        return low <= smallest and largest <= high
    floor = _decided(lambda: smallest >= low) or any(_decided(lambda n=n: smallest >= -1 - n) for n in lengths)
    ceiling = _decided(lambda: largest <= high) or any(_decided(lambda n=n: largest <= n) for n in lengths)
    if floor and ceiling:
        return True
    if _decided(lambda: smallest < low) or _decided(lambda: largest > high):
        return False
    needed = [claim for claim, holds in ((f"{smallest} >= {low}", floor), (f"{largest} <= {high}", ceiling)) if not holds]
    raise ValueError(
        f"{what} must stay within {low} .. {high}; they reach {smallest} .. {largest}, "
        f"which JAX cannot bound: declare {' and '.join(repr(c) for c in needed)} ({CONSTRAINT_HINT})"
    )


def _decided(compare):
    """``compare()``, a comparison of sizes, as a bool; None where symbolic dimensions of
    ``jax.export`` leave it undecided."""
    try:
        return bool(compare())
    except sys.modules["jax"].errors.InconclusiveDimensionOperation:
        return None


def static_int(size) -> int:
    """A size read for host work (a feature width, a table's row count) as an int: one that
    ``torch.compile(dynamic=True)`` keeps symbolic is specialized to its value, guarded
    (``operator.index``), so the graph is recompiled for another value."""
    return operator.index(size)


def static_float(value) -> float:
    """``float(value)``, and a float that ``torch.compile(dynamic=True)`` made symbolic (an
    argument or attribute it traces as a graph input) specialized to its value, guarded:
    Dynamo reads ``float.hex`` of a symbolic float as a constant, so the graph is
    recompiled for another value."""
    value = float(value)
    return float.fromhex(value.hex()) if torch_compiling() else value


def static(value):
    """A scaling's field (a number, None, or a tuple of them) with every number that
    ``torch.compile(dynamic=True)`` made symbolic specialized (:func:`static_int`,
    :func:`static_float`): what a constant function of the graph may take."""
    if isinstance(value, tuple):
        return tuple(static(v) for v in value)
    if isinstance(value, bool) or value is None:
        return value
    return static_int(value) if isinstance(value, numbers.Integral) else static_float(value)


def choice(name, value, choices):
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}, got {_show(value)}")
    return value


def is_array(value) -> bool:
    """An array of a supported namespace (NumPy scalars count as numbers, not arrays)."""
    kind = type(value)
    if kind is _ndarray:
        return True
    if kind in _NEVER_ARRAYS:
        return False
    if torch_tensor(value):
        return True
    return not isinstance(value, (numbers.Number, str, list, tuple)) and _compat.is_array_api_obj(value)


_NEVER_ARRAYS = PLAIN | {complex, list, tuple}  # said before the ABC check


def not_masked(name, value):
    """``value`` must not be a NumPy masked array, whose mask no computation here would honour."""
    if isinstance(value, _ndarray) and type(value).__module__.startswith("numpy.ma"):
        raise TypeError(
            f"{name} is a NumPy masked array, whose mask posenc would not honour: pass its filled or compressed values "
            "(numpy.ma.filled, .compressed()) or handle masked positions with a mask= of attention"
        )


def arrays(**named):
    """Each of ``named`` (``None`` skipped) must be an array (:func:`array`), checked before
    their namespace is sought: a list or a number is named, not reported as another kind."""
    for name, value in named.items():
        if value is not None:
            array(name, value)


def array(name, value):
    """``value`` must be an array of a supported namespace (not a NumPy masked array, nor a sparse
    or nested torch tensor, nor a Dask array of unknown chunk sizes)."""
    not_masked(name, value)
    if not is_array(value):
        raise TypeError(f"{name} must be an array (NumPy, CuPy, PyTorch, JAX, Dask, array-api-strict), got {type(value).__name__}")
    if type(value) is _ndarray:
        return value
    if torch_tensor(value):
        if value.layout is not _torch().strided or value.is_nested:
            got = "a nested tensor" if value.is_nested else f"the layout {value.layout}"
            raise TypeError(f"{name} must be a dense (strided) tensor, got {got}: pass {name}.to_dense() (a nested tensor: .to_padded_tensor)")
    elif _compat.is_dask_array(value) and any(n != n for n in value.shape):  # (NaN: Dask's unknown length)
        raise ValueError(f"{name} has chunks of unknown size (NaN in its shape {tuple(value.shape)}): call {name}.compute_chunk_sizes() first")
    return value


def float_array(name, value, xp):
    array(name, value)
    if not is_real_floating(xp, value.dtype):
        raise TypeError(f"{name} must have a real floating dtype (float16, bfloat16, float32, float64), got {value.dtype}")
    return value


def integer_array(name, value, xp):
    array(name, value)
    if not is_integer(xp, value.dtype):
        raise TypeError(f"{name} must have an integer dtype, got {value.dtype}")
    return value


def flag(name, value):
    """``value`` where it is a ``bool``, else a ``TypeError`` naming ``name`` (a truthy
    string or array is not taken for ``True``)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {value!r}")
    return value


def boolean_mask(name, value, xp):
    """An attention mask: a boolean array, True where a query may attend to a key."""
    array(name, value)
    if not xp.isdtype(value.dtype, "bool"):
        raise TypeError(f"{name} must be a boolean array (True = may attend), got dtype {value.dtype}")
    return value


def ndim(name, value, *, minimum=None, exactly=None):
    if exactly is not None and value.ndim != exactly:
        raise ValueError(f"{name} must have {exactly} dimension(s), got shape {tuple(value.shape)}")
    if minimum is not None and value.ndim < minimum:
        raise ValueError(f"{name} must have at least {minimum} dimension(s), got shape {tuple(value.shape)}")
    return value


def query_key_value(q, k, v, xp):
    """``q [..., n, d]``, ``k [..., m, d]`` and ``v [..., m, d_v]``: float arrays whose features and lengths agree."""
    for name, a in (("q", q), ("k", k), ("v", v)):
        float_array(name, a, xp)
        ndim(name, a, minimum=2)
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must have the same feature size (last axis), got {tuple(q.shape)} and {tuple(k.shape)}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k and v must have the same length (axis -2), got {tuple(k.shape)} and {tuple(v.shape)}")


def features(q, k, why):
    """``q`` and ``k`` have at least one feature on their last axis; ``why``: what needs one."""
    if int(q.shape[-1]) == 0:
        raise ValueError(f"q and k must have at least one feature on their last axis ({why}), got shapes {tuple(q.shape)} and {tuple(k.shape)}")


def is_eager(value) -> bool:
    """Whether ``value``'s contents can be read now: not a Dask array, not a JAX tracer, not
    a torch tensor while torch compiles, one that ``torch.func.vmap`` batches, nor one of no
    data (on the meta device, a fake tensor)."""
    if type(value) is _ndarray:
        return True
    if torch_tensor(value):
        return not (torch_compiling() or torch_without_data(value) or _vmapped(value))
    return not (_compat.is_dask_array(value) or _compat.is_jax_array(value) and (_is_tracer(value) or _jax_staging()))


def _jax_staging() -> bool:
    """Whether JAX stages its operations now (``jax.jit``, ``lax.scan``, ``jax.checkpoint``,
    under any ``vmap`` or ``grad`` between): there a concrete JAX array closed over gives
    traced results, which refuse to be read."""
    from jax._src import core
    from jax._src.interpreters.partial_eval import DynamicJaxprTrace

    trace = core.trace_ctx.trace
    while trace is not None:
        if isinstance(trace, DynamicJaxprTrace):
            return True
        trace = getattr(trace, "parent_trace", None)
    return False


def _vmapped(tensor) -> bool:
    """Whether a torch tensor is batched by ``torch.func.vmap`` at one of its wrapper levels
    (a read of its values is data-dependent control flow there)."""
    functorch = _torch()._C._functorch
    while functorch.is_functorch_wrapped_tensor(tensor):
        if functorch.is_batchedtensor(tensor):
            return True
        tensor = functorch.get_unwrapped(tensor)
    return False


def concrete_jax(value) -> bool:
    """A JAX array that holds its values (not a tracer), even where JAX stages the operations
    on it (:func:`is_eager` is False there): one closed over by a jitted function, whose
    values can be read on the host now."""
    return _compat.is_jax_array(value) and not _is_tracer(value)


def _is_tracer(value) -> bool:
    try:
        import jax

        return isinstance(value, jax.core.Tracer)
    except ImportError:  # pragma: no cover - jax arrays imply jax
        return False


def positions(name, value, xp, device=None, *, finite=True):
    """Integer positions widened to the index dtype of their device (:func:`widened`; the
    given ``device``, else theirs), or float positions that are all finite (checked when
    eager, unless ``finite=False``: a caller that leaves an accelerator's positions unread)."""
    array(name, value)
    if is_integer(xp, value.dtype):
        return widened(name, value, xp, device_of(value) if device is None else device)
    if not is_real_floating(xp, value.dtype):
        raise TypeError(f"{name} must have an integer or real floating dtype, got {value.dtype}")
    if finite and is_eager(value) and not bool(xp.all(xp.isfinite(value))):
        raise ValueError(f"{name} must be finite, got non-finite values (nan or inf)")
    return value


def leading_axes(first, second, axes, what):
    """The broadcast of the leading axes (all but the last ``axes``) of two named arrays
    ``(name, array)``; ``ValueError`` naming both when they do not broadcast."""
    (name_a, a), (name_b, b) = first, second
    try:
        return broadcast_shapes(tuple(a.shape[:-axes]), tuple(b.shape[:-axes]))
    except ValueError:
        raise ValueError(f"{name_a} of shape {tuple(a.shape)} and {name_b} of shape {tuple(b.shape)} must have {what} that broadcast together") from None


def broadcast_shape(name, shape, target):
    """``shape`` must broadcast to ``target`` without changing it."""
    shape, target = tuple(shape), tuple(target)
    ok = len(shape) <= len(target) and all(s == 1 or s == t for s, t in zip(reversed(shape), reversed(target)))  # (not `in`: sizes may be symbolic)
    if not ok:
        raise ValueError(f"{name} of shape {shape} does not broadcast against shape {target}")


def _memory(a):
    """A NumPy array over the memory addresses of array ``a`` (never read): ``a`` itself for
    NumPy, else one built from the data pointer, shape and byte strides of a torch or CuPy
    array; None for an empty array or one whose memory is not known (a torch tensor while
    torch compiles: a traced call computes its result before writing it into ``out``, and
    torch refuses to write into overlapping elements; one of no data, whose data pointer is 0)."""
    numpy = sys.modules.get("numpy")
    if numpy is None or not is_array(a) or (torch_tensor(a) and (torch_compiling() or torch_without_data(a))) or _size(a) == 0:
        return None
    if isinstance(a, numpy.ndarray):
        return a
    try:
        if torch_tensor(a):
            size = a.element_size()
            pointer, strides = a.data_ptr(), tuple(s * size for s in a.stride())
        elif _compat.is_cupy_array(a):
            pointer, strides, size = a.data.ptr, tuple(a.strides), a.itemsize
        else:
            return None
    except (RuntimeError, AttributeError, NotImplementedError):  # a tensor without storage (meta, sparse ...)
        return None
    return address_view(pointer, tuple(a.shape), strides, size)


def address_view(pointer, shape, strides, itemsize):
    """A NumPy array over the memory addresses of the elements of ``itemsize`` bytes at
    ``pointer`` with ``shape`` and byte ``strides`` (never read: memory of any device)."""
    interface = {"data": (pointer, False), "shape": shape, "strides": strides, "typestr": f"|V{itemsize}", "version": 3}
    return sys.modules["numpy"].asarray(_Interface(interface))


def byte_range(a):
    """``(low, high)``: the bytes array ``a`` views, or None for an empty or unknown one."""
    view = _memory(a)
    return None if view is None else sys.modules["numpy"].lib.array_utils.byte_bounds(view)


class _Interface:
    def __init__(self, interface):
        self.__array_interface__ = interface


def _self_overlapping(view) -> bool:
    """Whether two elements of NumPy array ``view`` share memory (:func:`self_overlapping`)."""
    return self_overlapping(tuple(view.shape), tuple(view.strides), view.itemsize)


def self_overlapping(shape, strides, itemsize) -> bool:
    """Whether two elements of an array of ``shape`` and ``strides`` (of ``itemsize`` units
    each) share memory: a stride-0 view from ``broadcast_to``/``expand``, or strides that fold
    onto themselves. Its axes sorted by stride each stepping past everything the smaller
    ones reach proves they do not; else the element addresses are compared (up to
    ``_ADDRESSES_COMPARED`` elements; a larger array that fails the proof counts as
    overlapping). An empty array has no elements to share."""
    if 0 in shape:
        return False
    reach, nested = itemsize, True
    # (no call per axis: tests/test_cuda_host_work.py counts a launch's Python calls, the same at any size)
    for stride, n in sorted([(st if st >= 0 else -st, n) for n, st in zip(shape, strides) if n > 1]):
        if stride == 0:
            return True
        nested = nested and stride >= reach
        reach += stride * (n - 1)
    if nested:
        return False
    if math.prod(shape) > _ADDRESSES_COMPARED:
        return True
    numpy = sys.modules["numpy"]
    starts = numpy.zeros((), numpy.int64)
    for n, st in zip(shape, strides):
        starts = numpy.add.outer(starts, numpy.arange(n, dtype=numpy.int64) * st)
    starts = numpy.sort(starts.reshape(-1))
    return bool(numpy.any(numpy.diff(starts) < itemsize))


_ADDRESSES_COMPARED = 2**20


def _same_memory_space(a, b) -> bool:
    """Whether the addresses of ``a`` and ``b`` can be compared: one library, or host memory both."""
    if type(a) is type(b):
        return True
    return all(_compat.is_numpy_array(v) or (torch_tensor(v) and v.device.type == "cpu") for v in (a, b))


def _shares_memory(mine, theirs) -> bool:
    """Whether an element of NumPy view ``mine`` shares memory with one of ``theirs`` (an
    overlap too hard to decide counts as shared)."""
    numpy = sys.modules["numpy"]
    if not numpy.may_share_memory(mine, theirs):
        return False
    try:
        return bool(numpy.shares_memory(mine, theirs, max_work=2**16))
    except numpy.exceptions.TooHardError:
        return True


def separate(out_value, *inputs, in_place=("x",)):
    """``out`` must not share memory with an input, by elements (disjoint slices of one
    buffer are fine), unless it is exactly that input and the input is one that may be
    written in place (``in_place``: ``x``)."""
    mine = _memory(out_value)
    if mine is None:
        return
    for name, a in inputs:
        theirs = None if a is None or not _same_memory_space(a, out_value) else _memory(a)
        if theirs is None or not _shares_memory(mine, theirs):
            continue
        exact = (
            name in in_place
            and mine.__array_interface__["data"][0] == theirs.__array_interface__["data"][0]
            and mine.shape == theirs.shape
            and mine.strides == theirs.strides
            and mine.itemsize == theirs.itemsize
        )
        if not exact:
            if name in in_place:
                raise ValueError(
                    f"out overlaps the memory of {name} without being {name} itself; "
                    f"pass out={name} to work in place, or a separate buffer"
                )
            raise ValueError(f"out shares memory with {name}, which the computation reads: pass a separate buffer")


def writable(value):
    """A caller's ``out`` (or ``x`` given as ``out``) must be writable memory of its own
    elements: not read-only (checked before any work), not a view whose elements share
    memory (stride 0), not a tensor autograd cannot write (:func:`writable_by_autograd`)."""
    if isinstance(value, _ndarray) and not value.flags.writeable:
        raise ValueError("out is read-only (its flags.writeable is False): pass a writable buffer, or out=None")
    view = _memory(value)
    if view is not None and _self_overlapping(view):
        raise ValueError(
            f"out of shape {tuple(value.shape)} has elements that share memory (a stride-0 view from "
            "broadcast_to or expand, or self-overlapping strides): the result would not fit in it; "
            "pass a buffer with one memory location per element"
        )
    writable_by_autograd(value)


def writable_by_autograd(value):
    """``out`` must not be a torch leaf that requires grad, nor a view of one, while grad mode
    is on, nor an inference tensor outside ``torch.inference_mode``.

    Torch refuses any in-place op on those (autograd cannot record the write; an inference
    tensor keeps no version counter to tell autograd of it); refused here, before anything
    is computed, as a kernel's write would not be. A non-leaf (``x = w * 1``) can be written
    in place and gets its correct gradient.
    """
    if not torch_tensor(value):
        return
    if not torch_compiling() and value.is_inference() and not _torch().is_inference_mode_enabled():  # (torch's own check while it compiles)
        raise ValueError(
            "out is an inference tensor (made under torch.inference_mode), which torch does not let "
            "an in-place write update outside inference mode: write into it under torch.inference_mode(), "
            "or pass a normal tensor (e.g. out=x.clone())"
        )
    if not value.requires_grad or not _torch().is_grad_enabled():
        return
    base = value if value._base is None else value._base
    if base.is_leaf:
        what = "a leaf tensor" if base is value else "a view of a leaf tensor"
        raise ValueError(
            f"out is {what} that requires grad: autograd cannot record an in-place write into it. "
            "Use the returned result (out=None), write into a non-leaf copy (e.g. x = x.clone()), "
            "or rotate under torch.no_grad()"
        )


def out(value, *, shape, dtype, xp, device, inputs=()):
    """A caller's ``out`` buffer: right shape, dtype, namespace and device, and not a partial
    overlap of one of ``inputs`` (``(name, array)`` pairs; exactly an input is in place).
    A JAX array is refused: it cannot be written."""
    array("out", value)
    if not torch_tensor(value) and _compat.is_jax_array(value):
        raise TypeError("out is not supported for JAX arrays (they are immutable); use the returned array")
    found = namespace(value)
    if found is not xp and not (_compat.is_numpy_namespace(found) and _compat.is_numpy_namespace(xp)):  # NumPy or its wrapper
        raise TypeError(f"out must be an array of the same namespace as the inputs ({xp.__name__}), got {type(value).__name__}")
    if tuple(value.shape) != tuple(shape):
        raise ValueError(f"out must have shape {tuple(shape)}, got {tuple(value.shape)}")
    if value.dtype != dtype and not _byte_order_only(value.dtype, dtype):
        raise ValueError(f"out must have dtype {dtype}, got {value.dtype}")
    if device is not None and device_of(value) != device:
        raise ValueError(f"out must be on device {device}, got {device_of(value)}")
    writable(value)
    separate(value, *inputs)
    return value


def _byte_order_only(a, b) -> bool:
    """Whether NumPy dtypes ``a`` and ``b`` differ in byte order only (``>f4`` and ``float32``):
    a result is computed in native order and written into an ``out`` of either."""
    numpy = sys.modules.get("numpy")
    return numpy is not None and isinstance(a, numpy.dtype) and isinstance(b, numpy.dtype) and a.newbyteorder("=") == b.newbyteorder("=")


_INTS = frozenset((int,))
_SURELY_AVAILABLE = 2**26  # bytes any machine has: smaller results skip reading /proc/meminfo


@trace_constant
def _memory_limit() -> int:
    """Bytes a result may take: the smaller of free memory and this process's address-space cap."""
    limits = []
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    limits.append(int(line.split()[1]) * 1024)
    except OSError:  # pragma: no cover - not Linux
        pass
    if not limits:  # pragma: no cover - not Linux
        try:
            limits.append(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
        except (ValueError, OSError, AttributeError):
            limits.append(2**40)
    soft, _ = resource.getrlimit(resource.RLIMIT_AS) if resource is not None else (-1, -1)
    if soft > 0:
        limits.append(soft)
    return min(limits)


def allocatable(name, shape, itemsize):
    """A result of ``shape`` must fit in this machine's memory (``ValueError`` otherwise).

    Checked before anything is allocated. Sizes that ``torch.compile`` keeps symbolic are
    known only when the compiled code runs; such a shape is not checked here.
    """
    if _INTS.issuperset(map(type, shape)):
        count = math.prod(shape)
    elif all(isinstance(s, numbers.Integral) for s in shape):
        count = math.prod([int(s) for s in shape])
    else:
        return
    if count * itemsize > _SURELY_AVAILABLE and count * itemsize > _memory_limit():
        raise ValueError(
            f"{name} of shape {tuple(shape)} needs {count * itemsize / 2**30:.1f} GiB, "
            "more than the memory available to this process"
        )


def allocatable_unless_blocked(name, shape, itemsize, like):
    """:func:`allocatable`, or where ``like`` is a Dask array (whose result is built, and
    stored, block by block, never whole) :func:`_listable`."""
    if type(like) is _ndarray or torch_tensor(like) or not _compat.is_dask_array(like):
        allocatable(name, shape, itemsize)
    else:
        _listable(name, shape, itemsize)


def _listable(name, shape, itemsize):
    """A Dask result of ``shape`` must have block sizes that fit in memory (``ValueError``
    otherwise, not Dask's ``MemoryError``): Dask lists the size of every block along every
    axis when it builds the graph, and a block holds at most its ``array.chunk-size``, so an
    axis of ``n`` takes at least ``ceil(n * itemsize / chunk-size)`` entries (an int64
    ``arange(2**62)``: 2**38 of them)."""
    if not all(isinstance(n, numbers.Integral) for n in shape) or 0 in shape:  # (an unknown length, NaN: refused with its array; an empty result: one block)
        return
    import dask
    from dask.utils import parse_bytes

    limit = parse_bytes(dask.config.get("array.chunk-size"))
    entries = sum(-(-int(n) * itemsize // limit) for n in shape)
    if entries * 8 > _SURELY_AVAILABLE and entries * 8 > _memory_limit():
        raise ValueError(
            f"{name} of shape {tuple(shape)} needs {entries} Dask blocks of at most {limit} bytes ({entries * 8 / 2**30:.1f} GiB "
            "to list their sizes), more than the memory available to this process"
        )


LAYOUT_ALIASES = {"split": "half"}


def layout(name, value, choices=("half", "interleaved")):
    """A feature-layout name, one vocabulary everywhere: ``"half"`` (the two members of every
    pair, or the sines and the cosines, in the two halves) or ``"interleaved"``. ``"split"``,
    the earlier name of ``"half"``, is accepted with a ``FutureWarning``."""
    if isinstance(value, str) and value in LAYOUT_ALIASES:
        warnings.warn(
            f'{name}="{value}" is the earlier name of "{LAYOUT_ALIASES[value]}" and will be removed: '
            f'pass {name}="{LAYOUT_ALIASES[value]}"',
            FutureWarning,
            stacklevel=_outside_stacklevel(),
        )
        value = LAYOUT_ALIASES[value]
    return choice(name, value, choices)


def _outside_stacklevel():
    """The ``stacklevel`` of the first caller outside posenc, for a warning raised in posenc."""
    package = __name__.rpartition(".")[0]
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_globals.get("__name__", "").partition(".")[0] == package:
        frame, level = frame.f_back, level + 1
    return level


def creation_dtype(name, dtype, xp, device=None):
    """The float dtype of a result built from nothing in ``xp`` (float32 by default); a dtype
    of another library is refused with the ``xp=`` that builds that library's arrays."""
    try:
        return result_dtype(xp, dtype, device)
    except TypeError as exc:
        owner = dtype.__module__ if isinstance(dtype, type) else type(dtype).__module__
        library = {"torch": "torch", "jax": "jax.numpy", "cupy": "cupy"}.get(owner.partition(".")[0])
        if library is None or library.partition(".")[0] in xp.__name__:
            raise
        raise TypeError(
            f"{exc.args[0].replace('dtype', name, 1)}: it is a {library} dtype; pass xp={library} "
            f"(and device=) to build a {library} array"
        ) from None
