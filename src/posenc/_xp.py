"""Namespace, device and dtype handling shared by every public function.

A public function resolves its namespace here, computes in the dtype chosen here and
casts back here, so the rules of the API contract ("any array in, same kind of array out",
"dtype in = dtype out", float16/bfloat16 computed in float32) live in one place.
"""

from __future__ import annotations

import math
import sys
from functools import lru_cache, wraps

import numpy as _numpy
from numpy import ndarray as _ndarray

from . import _compat


# ---------------------------------------------------------------- tracing
# torch.compile (Dynamo) traces posenc's Python code. Host-side helpers it cannot trace
# (read a ContextVar, read /proc, compute float64 NumPy tables) are marked trace_constant,
# so Dynamo calls them once while tracing and keeps their result as a constant of the
# graph; torch_compiling tells dispatch to route calls to the posenc:: custom ops.


def trace_constant(fn):
    """Mark ``fn`` as a host function whose result ``torch.compile`` treats as a constant.

    This is what ``torch.compiler.assume_constant_result`` does (it sets this attribute);
    setting it here keeps ``import posenc`` free of torch. ``fn`` must take Python values
    (numbers, strings, tuples, frozen dataclasses), never tensors. JAX and eager code just
    call ``fn``.
    """
    fn._dynamo_marked_constant = True
    return fn


def torch_compiling() -> bool:
    """Whether ``torch.compile`` (or ``torch.export``) is tracing the current call."""
    torch = sys.modules.get("torch")
    return torch is not None and torch.compiler.is_compiling()


def torch_transforming(*, fake=True) -> bool:
    """Whether a torch transform that a kernel would defeat is running: forward-mode AD (a
    kernel drops the dual tensors' tangents), ``torch.func`` (its wrapped tensors have no
    storage to read), ``torch.jit.trace`` (it would record a kernel's result as a constant)
    or, with ``fake``, a fake tensor mode (no data; a caller that only sees plain
    ``torch.Tensor`` objects never meets a fake one). The reference, torch operations
    throughout, serves those calls."""
    probes = _TORCH_PROBES or _torch_probes()
    if probes is None:
        return False
    forward_ad, functorch_stack, tracing_state, fake_mode = probes
    return (
        forward_ad._current_level >= 0
        or functorch_stack() is not None
        or tracing_state() is not None
        or (fake and fake_mode() is not None)
    )


def torch_func_transforming() -> bool:
    """Whether a ``torch.func`` transform (``grad``, ``vmap``, ``jacrev``, ``jvp``, ...) is running:
    one that refuses a write to a tensor it captured and a read of ``.data`` under ``vmap``."""
    probes = _TORCH_PROBES or _torch_probes()
    return probes is not None and probes[1]() is not None


def torch_without_data(tensor) -> bool:
    """Whether a torch tensor holds no data to read: one on the meta device, or a fake tensor
    (no fake one exists before its module is loaded)."""
    fake = sys.modules.get("torch._subclasses.fake_tensor")
    return tensor.is_meta or (fake is not None and isinstance(tensor, fake.FakeTensor))


_TORCH_PROBES = None  # what torch_transforming reads, found once torch is loaded


def _torch_probes():
    global _TORCH_PROBES
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    C = torch._C
    fake = C._TorchDispatchModeKey.FAKE
    _TORCH_PROBES = (torch.autograd.forward_ad, C._functorch.peek_interpreter_stack, C._get_tracing_state, lambda: C._get_dispatch_mode(fake))
    return _TORCH_PROBES


def _numpy_namespace():
    """NumPy itself where it is an Array API namespace of the 2023.12 standard (NumPy >= 2.1),
    else array-api-compat's wrapper (whose import reads every NumPy attribute, loading
    ``numpy.f2py``, ``numpy.testing``, ... : a quarter of a second)."""
    import numpy

    if getattr(numpy, "__array_api_version__", "") >= "2023.12":
        return numpy
    from array_api_compat import numpy as xp

    return xp


def _torch_namespace():
    # An import statement (not importlib): torch.compile can trace it.
    from array_api_compat import torch as xp

    return xp


def _cupy_namespace():
    from array_api_compat import cupy as xp

    return xp


def _dask_namespace():
    from array_api_compat.dask import array as xp

    return xp


def _jax_namespace():
    import jax.numpy as xp

    return xp


# The namespace of each framework module a caller may pass as ``xp=``.
_FRAMEWORK_NAMESPACES = {
    "numpy": _numpy_namespace,
    "torch": _torch_namespace,
    "cupy": _cupy_namespace,
    "dask.array": _dask_namespace,
    "jax.numpy": _jax_namespace,
}


def default_namespace():
    """The namespace used when no array argument says otherwise (NumPy)."""
    return _numpy_namespace()


def _given_namespace(xp):
    """``xp=`` as an array-api namespace: a framework module (``numpy``, ``torch``,
    ``jax.numpy``, ``cupy``, ``dask.array``) maps to its array-api-compat namespace; a
    namespace (array-api-compat's, array-api-strict, ...) is used as it is."""
    name = getattr(xp, "__name__", None)
    if not isinstance(name, str) or not callable(getattr(xp, "asarray", None)):
        raise TypeError(
            "xp must be an array namespace: numpy, torch, jax.numpy, cupy, dask.array or an "
            f"array-api-compat / array-api-strict namespace, got {type(xp).__name__}"
        )
    return _FRAMEWORK_NAMESPACES[name]() if name in _FRAMEWORK_NAMESPACES else _standard(xp)


def _standard(xp):
    """``xp``, unless it is array-api-strict set to an ``api_version`` older than the 2024.12
    standard posenc is written against (``take_along_axis``, ``where`` with a Python
    scalar): that is a ``TypeError`` saying which version to set, before any work."""
    if xp.__name__ == "array_api_strict" and xp.__array_api_version__ < "2024.12":
        raise TypeError(
            f"posenc needs the Array API standard 2024.12 or later, but array-api-strict is set to api_version "
            f"{xp.__array_api_version__!r}: call array_api_strict.set_array_api_strict_flags(api_version='2024.12')"
        )
    return xp


def torch_namespace(xp) -> bool:
    """``xp=`` names torch (the module, or its array-api-compat namespace)."""
    return xp is not None and "torch" in sys.modules and _given_namespace(xp) is _torch_namespace()


def torch_tensor(value) -> bool:
    """``value`` is a torch tensor (asked without importing torch: a tensor exists only once
    torch is loaded). Said directly, so that ``torch.compile`` traces an ``isinstance``."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def tracks_gradient(a) -> bool:
    """A torch tensor whose result autograd would record: a kernel would cut it from the graph."""
    if not getattr(a, "requires_grad", False):
        return False
    import torch

    return torch.is_grad_enabled()


def on_accelerator(a) -> bool:
    """An accelerator's array (a torch tensor off the CPU, a CuPy array, a JAX array on a
    GPU): reading one of its values synchronises the device, and a CUDA graph cannot capture
    that read."""
    if type(a) is _ndarray:
        return False
    if torch_tensor(a):
        return a.device.type != "cpu"
    return _compat.is_cupy_array(a) or _compat.is_jax_array(a) and any(d.platform != "cpu" for d in a.devices())


def kept_for_gradient(x, out, tables):
    """``x``, or a copy of it (which keeps its gradient) where a write into ``out`` (``x``
    itself: an in-place call) would overwrite the values autograd saved to give ``tables``
    their gradient (learned ``cos``/``sin``, angles of float positions): torch's backward
    then raised "modified by an inplace operation" where the out-of-place call trains."""
    if out is None or not torch_tensor(x) or not sys.modules["torch"].is_grad_enabled():
        return x
    return x.clone() if any(t.requires_grad for t in tables) else x


def jax_symbolic_dim(value) -> bool:
    """A symbolic dimension of ``jax.export``: a size known when the exported function is called
    (``jax.export.symbolic_shape``). Looked up in ``sys.modules``: no JAX import."""
    if type(value) is int:
        return False
    export = sys.modules.get("jax.export")
    return export is not None and export.is_symbolic_dim(value)


def explicit_sharding(value):
    """The sharding of a JAX array sharded over an ``AxisType.Explicit`` mesh (its type
    carries the axes), else None: a JAX operation mixing it with a replicated operand may
    need the sharding spelled out there."""
    if not _compat.is_jax_array(value) or 0 in value.shape:
        return None
    jax = sys.modules["jax"]
    sharding = jax.typeof(value).sharding
    if not splits(sharding):
        return None
    return sharding if isinstance(value, jax.core.Tracer) else value.sharding  # (the concrete mesh, where values can be put)


def splits(sharding) -> bool:
    """Whether a JAX sharding (a type's) splits some axis over its mesh."""
    return any(axis is not None for axis in getattr(sharding, "spec", ()))


def length_through(top) -> int:
    """The shortest length whose positions ``0 .. length - 1`` reach position ``top`` (a
    number read now): ``ceil(top) + 1``, what a length-dependent RoPE scaling adapts to."""
    return math.ceil(top) + 1


def unsplit(a, *axes):
    """``(a, sharding)``: JAX array ``a`` gathered along ``axes`` where an explicit mesh splits
    one of them (an operation that mixes its elements, sliced, shifted or flattened along
    them, needs them whole there), and ``a``'s own sharding, to put a result back on
    (:func:`resplit`); elsewhere ``a`` unchanged and ``None``."""
    sharding = explicit_sharding(a)
    spec = split_spec(sharding, a.ndim)
    if sharding is None or all(spec[axis] is None for axis in axes):
        return a, None
    for axis in axes:
        spec[axis] = None
    return resplit(a, sharding, spec), sharding


def placed_like(a, like):
    """``a``, a result of ``like``'s shape computed outside ``jit`` piece by piece, on
    ``like``'s sharding where ``like`` is split over a mesh of Auto axes (no type carries
    that sharding: rows computed apart and stacked come back replicated); unchanged
    elsewhere (an explicit mesh's split: :func:`resplit`)."""
    sharding = getattr(like, "sharding", None)
    if not _compat.is_jax_array(like) or not splits(sharding) or explicit_sharding(like) is not None:
        return a
    import jax

    return jax.device_put(a, sharding)


def split_spec(sharding, ndim):
    """A sharding's spec as a list of ``ndim`` entries (``None``: not split)."""
    return list((*getattr(sharding, "spec", ()), *(None,) * ndim)[:ndim])


def mesh_axes(entry):
    """The mesh axes one entry of a sharding spec names (none, one, or a tuple of them)."""
    return set() if entry is None else set(entry) if isinstance(entry, tuple) else {entry}


def split_as_first(a, sharding, axis):
    """JAX array ``a`` with ``axis`` split as ``sharding`` splits its first axis (an
    operand's split carried to that axis of a result), its other axes as they are;
    unchanged where ``sharding`` is ``None`` or they already use those mesh axes."""
    if sharding is None:
        return a
    entry = split_spec(sharding, 1)[0]
    spec = split_spec(explicit_sharding(a), a.ndim)
    if mesh_axes(entry) & {name for given in spec for name in mesh_axes(given)}:
        return a
    spec[axis] = entry
    return resplit(a, sharding, spec)


def resplit(a, sharding, spec=None):
    """``a`` resharded to ``sharding`` (:func:`unsplit`'s), its spec replaced by ``spec``
    where given (a result of another shape); unchanged where ``sharding`` is ``None``."""
    if sharding is None:
        return a
    import jax

    return jax.sharding.reshard(a, sharding if spec is None else sharding.update(spec=jax.sharding.PartitionSpec(*spec)))


def heads_like(table, x):
    """A per-head ``table [..., heads, d, m]`` split as ``x [..., heads, seq, d]`` splits its
    batch and head axes under JAX's explicit sharding (an ``AxisType.Explicit`` mesh, whose
    matmul refuses a replicated operand beside a split one, or a split one beside a
    replicated one: a split table beside an unsplit ``x`` is gathered), each axis of the
    table that has ``x``'s length there (an axis of length 1 broadcasts, replicated);
    unchanged elsewhere."""
    if table.ndim < 3 or x.ndim < 3:
        return table
    given = explicit_sharding(x)
    sharding = given or explicit_sharding(table)
    spec = split_spec(given, x.ndim)
    lead = [None] * (table.ndim - 2)
    for axis in range(1, min(len(lead), x.ndim - 2) + 1):  # (right-aligned, as the matmul broadcasts them)
        if table.shape[-2 - axis] == x.shape[-2 - axis]:
            lead[-axis] = spec[-2 - axis]
    return resplit(table, sharding, (*lead, None, None))


def replicated_on_mesh(sharding):
    """A JAX sharding over several devices as the replicated one on its mesh (where arrays
    of another shape made beside it go), or ``None`` where it names no mesh or one device."""
    mesh = getattr(sharding, "mesh", None)
    if mesh is None or len(getattr(sharding, "device_set", ())) < 2:
        return None
    import jax

    return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())


def size(n):
    """An axis size as an int (``int()``: a NumPy integer), or kept as it is where it is
    symbolic: a ``torch.SymInt`` of ``torch.export`` or ``make_fx`` (``int()`` would
    specialize it), a symbolic dimension of ``jax.export``."""
    return n if jax_symbolic_dim(n) or symbolic_size(n) else int(n)


def symbolic_size(value) -> bool:
    """A ``torch.SymInt``: a size that ``torch.export`` (or ``make_fx``) keeps symbolic. (Dynamo
    shows its symbolic sizes to the code it traces as ints.)"""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.SymInt)


def empty_result(xp, shape, like):
    """Zeros of ``shape``, which holds a 0, of ``like``'s dtype and device: on Dask in one
    block (Dask's ``"auto"`` chunks of an empty array divide by its size)."""
    chunks = {"chunks": -1} if _compat.is_dask_array(like) else {}
    return xp.zeros(shape, dtype=like.dtype, device=device_of(like), **chunks)


def reshaped(xp, a, shape):
    """``xp.reshape(a, shape)``; an empty Dask array, which Dask cannot reshape, as the
    :func:`empty_result` of ``shape`` (its ``-1``, if any, is 0)."""
    if _compat.is_dask_array(a) and 0 in a.shape:
        return empty_result(xp, tuple(0 if n == -1 else n for n in shape), a)
    return xp.reshape(a, shape)


def chunked_like(a, like):
    """``a``, an array of ``like``'s shape, in ``like``'s chunks where both are Dask arrays
    (a shifted slice of a padded array: its chunks are offset by the shift, and a sum of
    such slices is cut at every offset boundary, slivers of a row); any other as it is."""
    if not type(a).__module__.startswith("dask.") or a.chunks == like.chunks:  # (a type test, as below)
        return a
    return a.rechunk(like.chunks)


def without_empty_chunks(a):
    """``a`` to reduce along its axes: a Dask array with its chunks of length 0 merged away
    (Dask's ``max`` of an axis with one raises, and ``compute_chunk_sizes`` after boolean
    indexing leaves them); any other array as it is."""
    if not type(a).__module__.startswith("dask.") or all(map(all, a.chunks)):  # (a type test: torch.compile warns of array-api-compat's cached helpers)
        return a
    return a.rechunk(tuple(tuple(n for n in axis if n) or axis for axis in a.chunks))


def dimension_value(dim):
    """A symbolic dimension of ``jax.export`` as the 0-d JAX integer it is inside the computation."""
    return _jax_namespace().asarray(dim)


def namespace(*arrays, xp=None):
    """The Array-API namespace of ``arrays`` (``None`` and Python scalars are skipped).

    Arrays of two different kinds in one call raise ``TypeError`` naming both (NumPy arrays
    among another library's arrays are converted before this, by :func:`host_constants`,
    in the functions that take them as constants); with no array at all the default
    namespace (NumPy) is returned. ``xp``, when given, wins; it may be a framework module
    (``numpy``, ``torch``, ``jax.numpy``, ``cupy``) or a namespace.
    """
    if xp is not None:
        return _given_namespace(xp)
    found = [a for a in arrays if a is not None and not isinstance(a, (bool, int, float, complex))]
    if not found:
        return default_namespace()
    if all(type(a) is _ndarray for a in found):
        return _numpy_namespace()
    if all(torch_tensor(a) for a in found):
        # Not through array-api-compat, whose caches torch.compile does not trace.
        return _torch_namespace()
    try:
        xp = _compat.array_namespace(*found)
    except TypeError as exc:
        raise _mixed(found) from exc
    return _standard(xp)


def argument_in(name, value, xp, device=None):
    """``(namespace, value)`` for an array argument of a function that also takes ``xp=``
    and ``device=``: with ``xp`` given, a NumPy ``value`` is a host constant, converted into
    it (onto ``device``), and an array of another library is a ``TypeError`` naming both."""
    if xp is None:
        return namespace(value), _on_given_device(name, value, device)
    given = _given_namespace(xp)
    found = namespace(value)
    if found is given:
        return given, _on_given_device(name, value, device)
    if type(value) is _ndarray:
        return given, _converted(given, name, value, device)
    raise TypeError(f"{name} is a {type(value).__module__}.{type(value).__qualname__} but xp={given.__name__}: pass one namespace")


def _on_given_device(name, value, device):
    """A torch ``value`` with axes beside ``device=``: on that device (``"cuda"``: any CUDA
    device), else a ``ValueError`` naming both, rather than a result on ``value``'s device.
    A 0-d one (an offset) is checked where it is read or computed with. Another library's
    array (array-api-strict's, CuPy's) is held to ``device`` as :func:`elsewhere` says."""
    if device is None or getattr(value, "ndim", 0) == 0:
        return value
    if not torch_tensor(value):
        if elsewhere(value, device):
            raise ValueError(f"{name} is on {device_of(value)} but device={device}: pass one device")
        return value
    import torch

    if not torch_device_is(value.device, torch.device(device)):
        raise ValueError(f"{name} is on {value.device} but device={device}: pass one device")
    return value


def torch_device_is(device, want):
    """Whether torch ``device`` is ``want`` (a ``torch.device``; one without an index: any
    device of its type, as ``"cuda"`` names the current one)."""
    return device.type == want.type and (want.index is None or device.index == want.index)


def arguments_in(xp, device, **arrays):
    """``(namespace, arrays)`` for several array arguments (``None`` skipped) of a function
    that also takes ``xp=`` and ``device=``: each as :func:`argument_in` gives it with
    ``xp`` given, else unchanged in their common namespace."""
    if xp is None:
        return namespace(*arrays.values()), {name: _on_given_device(name, a, device) for name, a in arrays.items()}
    given = {name: argument_in(name, a, xp, device)[1] for name, a in arrays.items() if a is not None}
    return _given_namespace(xp), {**arrays, **given}


def host_constant_like(name, value, like):
    """``value`` converted into the namespace and onto the device of array ``like`` where it
    is a NumPy array and ``like`` is not (a host constant); otherwise ``value`` itself. For
    an argument :func:`host_constants` must not convert with the others (one read on the
    host, as ``rerotate``'s frequencies)."""
    if type(value) is not _ndarray or type(like) is _ndarray or not _device_array(like):
        return value
    return _converted(namespace(like), name, value, device_of(like))


def one_kind(**named):
    """The namespace of the arrays ``named``, which must be of one library, 0-d ones too (an
    offset or a length given as an array is computed with the others, or would be read as if
    it were of their library): else :func:`namespace`'s ``TypeError``, naming the arguments
    (one library's own refusal, such as an outdated array-api-strict's, as it is)."""
    try:
        return namespace(*named.values())
    except TypeError as exc:
        if len({_kind(a) for a in named.values()}) < 2:
            raise
        raise _mixed(named.values(), named) from exc


def _mixed(arrays, named=None):
    kinds = sorted({_kind(a) for a in arrays})
    which = "" if named is None else " (" + ", ".join(f"{name}: {_kind(a)}" for name, a in named.items()) + ")"
    return TypeError(
        f"arrays of different kinds in one call: {', '.join(kinds)}{which}; pass arrays of a single namespace "
        "(convert with that library's asarray; posenc's array-building functions take xp=, e.g. "
        "xp=jax.numpy or xp=torch)"
    )


def _kind(a) -> str:
    return f"{type(a).__module__}.{type(a).__qualname__}"


# A call's plain values (never arrays, nothing to convert or key by metadata), and those with NumPy's arrays.
PLAIN = frozenset((type(None), bool, int, float, str))
NDARRAY_OR_PLAIN = PLAIN | {_ndarray}


def _device_array(value) -> bool:
    # (not a NumPy scalar nor a dtype class such as numpy.float64, which have __array_namespace__ too)
    return type(value) is not _ndarray and not isinstance(value, (type, _numpy.generic)) and (torch_tensor(value) or _compat.is_array_api_obj(value))


def host_constants(fn):
    """Decorate a public function whose array arguments may be host constants: a NumPy
    array among arrays of another library (JAX, torch, CuPy, Dask) is converted into that
    library, onto their device, with the precision it carries (its dtype, or the widest the
    namespace holds: float32 / int32 for JAX without x64, whose int32 range is checked).
    Arrays of two device libraries stay a ``TypeError`` naming them (:func:`one_kind`), a 0-d
    one among them too; ``out=`` is never converted (it is written, not read). An array of a
    subclass of NumPy's (``np.memmap``, ``np.matrix``) is read as a plain ``ndarray``: a
    path that computes with its ufuncs or indexing would otherwise return the subclass,
    where a kernel returns ``ndarray``. Arrays on two devices (:func:`device_of`'s
    ``ValueError``) are refused naming each argument's device (:func:`one_device`)."""

    @wraps(fn)
    def call(*args, **kwargs):
        try:
            values = (*args, *kwargs.values())
            kinds = set(map(type, values))
            if not NDARRAY_OR_PLAIN.issuperset(kinds):  # NumPy scalars (an np.int64 offset) are passed as they are: no array
                kinds = {kind for kind in kinds if not issubclass(kind, _numpy.generic)}
            # All NumPy (a decode step's planned call), or no NumPy and one type beyond plain values: nothing to convert or check.
            if NDARRAY_OR_PLAIN.issuperset(kinds):
                return fn(*args, **kwargs)
            others = _libraries(kinds - PLAIN)
            if _ndarray not in kinds and len(others) < 2 and not issubclass(others.pop() if others else type(None), _ndarray):
                return fn(*args, **kwargs)
            if _ndarray not in kinds and torch_compiling():  # (what Dynamo traces holds torch tensors only)
                return fn(*args, **kwargs)
            bound = _signature(fn).bind(*args, **kwargs)
            for n, v in bound.arguments.items():
                if n != "out" and type(v) is not _ndarray and isinstance(v, _ndarray) and not isinstance(v, _numpy.ma.MaskedArray):
                    bound.arguments[n] = _numpy.asarray(v)  # (masked arrays are refused by name where they are validated)
            host = [n for n, v in bound.arguments.items() if type(v) is _ndarray and n != "out"]
            others = {n: v for n, v in bound.arguments.items() if n != "out" and _device_array(v)}
            xp = one_kind(**others)
            if host and others:
                device = device_of(*others.values())
                for n in host:
                    bound.arguments[n] = _converted(xp, n, bound.arguments[n], device)
            return fn(*bound.args, **bound.kwargs)
        except DevicesDiffer:  # (named here, where the arguments are known: nothing to check on a call that passes)
            one_device(**_array_arguments(fn, args, kwargs))
            raise

    return call


def _libraries(kinds):
    """``kinds`` with torch's ``Parameter`` counted as ``Tensor`` beside it (a module's
    parameter and a tensor argument, its offset or positions: one library, nothing to convert)."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.Tensor in kinds and torch.nn.Parameter in kinds:
        return kinds - {torch.nn.Parameter}
    return kinds


def _array_arguments(fn, args, kwargs):
    """The arguments of a call of ``fn`` that are arrays of a library (NumPy's, host
    constants, go where the others are), by name."""
    bound = _signature(fn).bind(*args, **kwargs)
    return {n: v for n, v in bound.arguments.items() if _device_array(v)}


@lru_cache(maxsize=None)
def _signature(fn):
    import inspect

    return inspect.signature(fn)


def _converted(xp, name, value, device):
    """NumPy ``value`` as an array of ``xp`` on ``device``, keeping its precision where the
    namespace holds it."""
    import numpy

    value = host_plain(value)  # (torch refuses a byte-swapped array: a '>i8' offset from a big-endian file)
    dtype = getattr(xp, value.dtype.name, None) if value.dtype.kind in "fiub" else None
    if value.dtype == numpy.float64 and not has_float64(xp, device):
        dtype = xp.float32
    elif value.dtype.kind in "iu" and value.dtype.itemsize > 4 and index_dtype(xp, device) == xp.int32:
        if value.size and (value.min() < -(2**31) or value.max() >= 2**31):
            raise ValueError(f"{name} holds values outside int32, the widest integer of {xp.__name__} here (JAX without x64)")
        dtype = xp.int32
    if not value.flags.writeable and torch_namespace(xp):
        # torch shares a NumPy array and warns that a read-only one's tensor may be written:
        # its distinct elements are copied instead (a broadcast stays one, of their copy).
        distinct = value[tuple(slice(None) if stride else slice(0, 1) for stride in value.strides)].copy()
        return xp.broadcast_to(xp.asarray(distinct, dtype=dtype, device=device), value.shape)
    return xp.asarray(value, dtype=dtype, device=device)


def elsewhere(value, device) -> bool:
    """Whether ``value``, an array of a library that refuses to combine arrays of two devices
    (array-api-strict, CuPy, a committed JAX array: anything but torch, whose CPU scalars mix
    with any device's tensors, and NumPy, host constants), is on another device than
    ``device``, the other arguments'. An unknown device (``None``) is anywhere."""
    if device is None or isinstance(value, _HOST_VALUES) or torch_tensor(value) or not _device_array(value):  # (isinstance first: torch.compile guards no type() of a constant)
        return False
    found = device_of(value)
    return found is not None and found != device


_HOST_VALUES = (_ndarray, tuple, list, *PLAIN)


class DevicesDiffer(ValueError):
    """:func:`device_of`'s refusal: arrays of one call on two devices (a public function
    decorated by :func:`host_constants` names each argument's device in it)."""


def device_of(*arrays):
    """The common device of ``arrays`` (``None`` when there is no array).

    Two arrays on different devices raise ``ValueError``. An array whose device is not
    known (``None``: JAX tracers under ``jit``, ``grad`` or ``vmap``) matches any device.
    """
    devices = []
    for a in arrays:
        if a is None or isinstance(a, (bool, int, float, complex)):
            continue
        if type(a) is _ndarray:
            d = "cpu"
        elif torch_tensor(a):
            d = a.device
        else:
            d = _compat.device(a)
            if d is not None and _compat.is_jax_array(a):
                d = _jax_placement(a, d)
        if d is None:
            continue
        if all(d != e for e in devices):
            devices.append(d)
    if len(devices) > 1:
        raise DevicesDiffer(f"arrays on different devices in one call: {devices}; move them to one device first")
    return devices[0] if devices else None


def one_device(**named):
    """:func:`device_of` of the arrays ``named``, its ``ValueError`` naming each one's device."""
    try:
        return device_of(*named.values())
    except DevicesDiffer:
        raise _named_devices(named) from None


def _named_devices(named):
    where = ", ".join(f"{name} on {device_of(a)}" for name, a in named.items())
    return DevicesDiffer(f"arrays on different devices in one call: {where}; move them to one device first")


def _jax_placement(a, device):
    """Where arrays made for a call beside concrete JAX array ``a`` go: nowhere in particular
    (``None``) for an uncommitted array, which JAX moves to wherever it is used; replicated
    over the mesh of a sharding over several devices (``a``'s own sharding would describe
    another shape, and two shardings over one mesh are one placement); else ``device``."""
    if not a.committed:
        return None
    return replicated_on_mesh(device) or device


def broadcast_shapes(*shapes) -> tuple:
    """NumPy's broadcasting rule on shape tuples (``ValueError`` when they do not broadcast)."""
    ndim = 0
    for s in shapes:  # plain loops: torch.compile traces them
        ndim = max(ndim, len(s))
    result = []
    for axis in range(-ndim, 0):
        n = 1
        for s in shapes:  # compared, not hashed into a set: hashing a symbolic size specializes it
            m = size(s[axis]) if len(s) >= -axis else 1
            if m != 1 and n != 1 and m != n:
                raise ValueError(f"shapes {', '.join(str(tuple(s)) for s in shapes)} do not broadcast together")
            if m != 1:
                n = m
        result.append(n)
    return tuple(result)


def shifted(values, offset):
    """``values + offset``; ``offset`` an int or a 0-d integer array (a traced offset)."""
    if isinstance(offset, int) and offset == 0:
        return values
    return values + offset


def is_real_floating(xp, dtype) -> bool:
    if xp is _numpy and type(dtype) in _NUMPY_DTYPE_KINDS:  # a NumPy dtype of a kind isdtype knows: by its kind
        return dtype.kind == "f"
    try:
        if xp.isdtype(dtype, "real floating"):
            return True
    except TypeError:  # NumPy's isdtype refuses the dtypes of ml_dtypes (Dask's says False)
        pass
    return (dtype.__name__ if isinstance(dtype, type) else str(dtype)) == "bfloat16"


def is_integer(xp, dtype) -> bool:
    if xp is _numpy and type(dtype) in _NUMPY_DTYPE_KINDS:
        return dtype.kind in "iu"
    try:
        return xp.isdtype(dtype, "integral")
    except TypeError:
        return False


# The classes of NumPy's boolean, integer and float dtypes (ml_dtypes' bfloat16 is none of them).
_NUMPY_DTYPE_KINDS = frozenset(type(_numpy.dtype(c)) for c in "?bhilqBHILQefdg")


def has_float64(xp, device=None) -> bool:
    """Whether ``xp`` can hold float64 on ``device`` (not so for JAX without x64, MPS, ...)."""
    always = _ALWAYS_FLOAT64.get(getattr(xp, "__name__", None))
    if always is True or always is not None and always == getattr(device, "type", None):
        return True  # (the namespace info builds its dict of dtypes each call: 3.5 us for torch)
    info = getattr(xp, "__array_namespace_info__", None)
    if info is None:
        return True
    try:
        return "float64" in info().dtypes(device=device, kind="real floating")
    except (TypeError, ValueError):
        return "float64" in info().dtypes(kind="real floating")


_ALWAYS_FLOAT64 = {"numpy": True, "array_api_compat.numpy": True, "array_api_compat.torch": "cpu"}  # namespace -> True, or the device type that has it


def searched(xp, starts, n):
    """``searchsorted(starts, n, side="right")``, or :func:`_reached` where that cannot run:
    JAX's refuses arrays split over an explicit mesh, and array-api-strict's gives int64
    even on its ``no_x64`` device, which refuses it (the index dtype int32 there). A strided
    torch ``starts`` is searched contiguous (torch's searchsorted warns of one, and copies it)."""
    if torch_tensor(starts) and not starts.is_contiguous():
        starts = starts.contiguous()
    if hasattr(xp, "searchsorted") and not _compat.is_jax_namespace(xp) and index_dtype(xp, device_of(n)) != xp.int32:
        return xp.searchsorted(starts, n, side="right")
    return _reached(xp, starts, n)


def _reached(xp, starts, n):
    """How many of the sorted 1-D ``starts`` each ``n`` reaches (``starts[i] <= n``): a binary
    search in integer arithmetic, a gather for each power of two up to ``len(starts)``."""
    length = int(starts.shape[0])
    split = explicit_sharding(n)  # (a gather by split indices from a replicated array is told its result's sharding)
    count = xp.zeros_like(n)
    step = 1 << (length.bit_length() - 1)
    while step:
        probe = count + step  # reaching starts[probe - 1] is reaching every start before it
        index = xp.clip(probe - 1, None, length - 1)
        start = xp.take(starts, index) if split is None else starts.at[index].get(out_sharding=split)
        count = xp.where((probe <= length) & (start <= n), probe, count)
        step >>= 1
    return count


def index_dtype(xp, device=None):
    """The namespace's default index dtype (int64, or int32 for JAX without x64)."""
    name = getattr(xp, "__name__", None)
    if name == "array_api_compat.torch":
        # Every device's, and no cache: one filled while torch.compile traces a process's first
        # call fails that graph's guard at the second call, a recompile.
        return xp.int64
    if name not in _FIXED_INDEX:
        return _asked_index_dtype(xp, device)
    dtype = _FIXED_INDEX[name]  # one for every device of NumPy: asked once
    if dtype is None:
        dtype = _FIXED_INDEX[name] = _asked_index_dtype(xp, None)
    return dtype


def _asked_index_dtype(xp, device):
    info = getattr(xp, "__array_namespace_info__", None)
    return info().default_dtypes(device=device)["indexing"] if info is not None else xp.int64


_FIXED_INDEX = {"numpy": None}  # namespace -> its index dtype, once asked


def widest_float(xp, device=None):
    """float64 where the namespace/device has it, else float32."""
    return xp.float64 if has_float64(xp, device) else xp.float32


def compute_dtype(xp, dtype):
    """The dtype to compute in for a result of ``dtype``: 16-bit floats compute in float32.
    A NumPy dtype in the other byte order (``>f8`` on x86) computes in its native twin."""
    dtype = native_order(dtype)
    if dtype == xp.float32 or dtype == getattr(xp, "float64", None):
        return dtype
    return xp.float32


def result_dtype(xp, dtype, device=None):
    """The float dtype of a result built from nothing: ``dtype`` or float32 by default; float64
    on a ``device`` that has none (array-api-strict's ``no_float64``) is a ``ValueError``
    (JAX without x64 keeps its own rule: float32, with its warning)."""
    if dtype is None:
        return xp.float32
    try:
        ok = is_real_floating(xp, dtype)
    except (TypeError, ValueError, AttributeError):
        ok = False
    if not ok:
        raise TypeError(f"dtype must be a real floating dtype of {xp.__name__}, got {dtype!r}")
    if dtype == getattr(xp, "float64", None) and xp is not _numpy and not _compat.is_jax_namespace(xp) and not has_float64(xp, device):
        raise ValueError(f"dtype={dtype} is not available on device {device}, which has no float64: ask for float32")
    return dtype


def integer_result_dtype(xp, dtype, device=None):
    """The integer dtype of a result built from nothing: ``dtype``, or the index dtype by
    default; one the ``device`` lacks (int64 on array-api-strict's ``no_x64``) is a
    ``ValueError`` naming ``dtype=`` (JAX without x64 keeps its own rule: int32, with its warning)."""
    if dtype is None:
        return index_dtype(xp, device)
    if not xp.isdtype(dtype, "integral"):
        raise TypeError(f"dtype must be an integer dtype, got {dtype!r}")
    info = getattr(xp, "__array_namespace_info__", None)
    if info is not None and xp is not _numpy and not _compat.is_jax_namespace(xp) and dtype not in info().dtypes(device=device, kind="integral").values():
        raise ValueError(f"dtype={dtype} is not available on device {device}, which has no such integers: ask for {index_dtype(xp, device)}")
    return dtype


def pairwise_sum(xp, terms):
    """``sum(terms, axis=-1)`` added pairwise in one fixed order (the first half plus the
    second, until one term is left): each entry's bits its own terms', whatever the other
    axes hold (``xp.sum``'s order is the library's: XLA's depends on the array's size), and
    the same under ``jax.jit``. No terms sum to zeros."""
    if terms.shape[-1] == 0:
        return xp.sum(terms, axis=-1)
    while terms.shape[-1] > 1:
        half = terms.shape[-1] // 2
        pairs = terms[..., :half] + terms[..., half : 2 * half]
        terms = xp.concat([pairs, terms[..., 2 * half :]], axis=-1) if terms.shape[-1] % 2 else pairs
    return terms[..., 0]


def cast(xp, array, dtype):
    """``array`` as ``dtype`` (no copy when it already is). A float64 array cast to float16 or
    bfloat16 is rounded once, to nearest, ties to even (``rounded_once``). A NumPy ``dtype``
    in the other byte order (``>f4`` on x86, an input's) gives its native twin: every result
    is in this machine's order, whichever path computed it."""
    dtype = native_order(dtype)
    if array.dtype == dtype:
        return array
    bits = _rounding(xp, array, dtype)
    if bits is not None:
        array = rounded_once(xp, array, *bits)
    return _astype(xp, array, dtype)


def native_order(dtype):
    """``dtype``, or its native twin where it is a NumPy dtype in the other byte order."""
    return dtype if getattr(dtype, "isnative", True) else dtype.newbyteorder("=")


def host_plain(a):
    """A NumPy array as a plain ``ndarray`` in native byte order (itself when it is one: no
    copy), any other array as it is: what a path that gathers from ``a`` returns keeps
    ``a``'s subclass (``np.memmap``) and byte order, where the others return plain native
    arrays."""
    if type(a) is _ndarray and a.dtype.isnative or not isinstance(a, _ndarray):
        return a
    a = _numpy.asarray(a)
    return a.astype(native_order(a.dtype), copy=False)


def host_as(xp, values, dtype, device=None):
    """Host float64 ``values`` (a tuple of numbers, or a NumPy array) as a ``dtype`` array of
    ``xp``, each rounded once: to float16 or bfloat16 as ``cast`` rounds (a namespace's own
    conversion of float64 goes through float32 and rounds twice)."""
    name = _dtype_name(dtype)
    if name in _SIXTEEN:
        if isinstance(values, tuple):
            values = _host_rounded(values, name)
        else:
            values = round_sixteen(_numpy, _numpy.asarray(values, dtype=_numpy.float64), *_SIXTEEN[name])
    return xp.asarray(values, dtype=dtype, device=device)


@trace_constant
def _host_rounded(values: tuple, name: str) -> tuple:
    return tuple(round_sixteen(_numpy, _numpy.asarray(values, dtype=_numpy.float64), *_SIXTEEN[name]).tolist())


def _astype(xp, array, dtype):
    if type(array) is _ndarray:
        if dtype == _numpy.float16:  # (past float16's range: inf, the contract's rounding, without a warning)
            with _numpy.errstate(over="ignore"):
                return array.astype(dtype)
        return array.astype(dtype)  # (the method: numpy.astype's checks are Python code, 2 us)
    return xp.astype(array, dtype)


def cast_pair(xp, a, b, dtype):
    """``cast`` of ``a`` and ``b`` of one shape and dtype (a table's cos and sin), rounded in
    one pass where they are rounded (the same values: the rounding is elementwise)."""
    dtype = native_order(dtype)
    if a.dtype != b.dtype or tuple(a.shape) != tuple(b.shape):
        return cast(xp, a, dtype), cast(xp, b, dtype)
    if a.dtype == dtype:
        return a, b
    if _rounding(xp, a, dtype) is None:
        return _astype(xp, a, dtype), _astype(xp, b, dtype)
    both = cast(xp, xp.stack([a, b]), dtype)
    return both[0, ...], both[1, ...]


def _rounding(xp, array, dtype):
    """The 16-bit format's ``(bits, tiny)`` where ``cast`` rounds ``array`` to ``dtype``
    itself: float64 to float16 or bfloat16, but NumPy's own float16 (it rounds once)."""
    if array.dtype != getattr(xp, "float64", None):  # (first: the name is read for float64 only)
        return None
    bits = _SIXTEEN.get(_dtype_name(dtype))
    return None if bits is None or (type(array) is _ndarray and bits[0] == 11) else bits


# The 16-bit floats: significant bits, and the step of their subnormals.
_SIXTEEN = {"float16": (11, 2.0**-24), "bfloat16": (8, 2.0**-133)}


def _dtype_name(dtype):
    if isinstance(dtype, _numpy.dtype):  # (its type's name: str() of a NumPy dtype is Python code, 3 us)
        return dtype.type.__name__
    return dtype.__name__ if isinstance(dtype, type) else str(dtype).rpartition(".")[2]


def rounded_once(xp, a, bits, tiny):
    """``round_sixteen`` of ``a`` whose gradient is ``a``'s (straight through, as ``astype``
    passes it): a torch tensor that carries one, or a JAX array (maybe differentiated
    later), gets ``rounded - (a - a)`` with ``rounded`` and the first ``a`` detached, the
    same value, signed zeros included, and infinities and NaN as they are."""
    if torch_tensor(a):
        if not a.requires_grad:
            if not torch_compiling() and a.is_cpu and a.numel() <= 2**14 and not a.is_neg() and not torch_transforming():  # (NumPy's steps cost less on small tables; the same exact operations)
                return sys.modules["torch"].from_numpy(round_sixteen(_numpy, a.numpy(), bits, tiny))
            return round_sixteen(xp, a, bits, tiny)
        detach = lambda v: v.detach()  # noqa: E731
    elif _compat.is_jax_array(a):
        from jax.lax import stop_gradient as detach
    else:
        return round_sixteen(xp, a, bits, tiny)
    # rounded - (a - a): a - a is +0 (its gradient 1), and rounded - +0 is rounded, -0 too
    # (rounded + (+0) would make a -0 +0; a + (rounded - a) did)
    fixed = detach(round_sixteen(xp, detach(a), bits, tiny)) - (detach(a) - a)
    return xp.where(xp.isfinite(a), fixed, a)


def round_sixteen(xp, a, bits, tiny):
    """Float64 ``a`` rounded to ``bits`` significant bits (steps of at least ``tiny``, the
    16-bit format's subnormals), to nearest, ties to even, in float64: the value the one
    rounding of ``a`` to that format gives, which ``astype`` then converts exactly.

    torch's, JAX's and ml_dtypes' float64 -> float16 / bfloat16 conversions go through
    float32 and round twice (NumPy's float16 rounds once): about one value in 17,000 (float16)
    and 125,000 (bfloat16) of random ones lands a step from the one rounding, so the tables
    of one float64 computation differed between NumPy and torch or JAX. Values too large for
    the format round to infinity in ``astype`` as they should (a value at or past the
    largest's half step is rounded up here to a power of two beyond it); infinities and NaN
    pass unchanged."""
    if bits == 11 and type(a) is _ndarray:  # (NumPy's float16 conversion rounds once)
        return a.astype(_numpy.float16).astype(_numpy.float64)
    m = xp.abs(a)
    if bits == 8 and type(a) is _ndarray and _numpy.min(m, initial=_numpy.inf, where=m != 0) >= 2.0**-126:
        return _bfloat16_normals(a)
    finite = m < 2.0**900  # (False for inf and NaN; larger ones overflow any 16-bit format)
    m = xp.where(finite, m, xp.zeros_like(m))  # (arrays only: torch.compile traces no scalar here)
    c = m * (2.0**52 + 1.0)
    top = c - (c - m)  # m to one significant bit: 2**e or 2**(e + 1), for 2**e <= m < 2**(e + 1)
    top = xp.where(top > m, top * 0.5, top)
    step = xp.maximum(top * 2.0 ** (1 - bits), xp.full_like(top, tiny))
    return xp.where(finite, xp.round(a / step) * step, a)


def _bfloat16_normals(a):
    """NumPy float64 ``a`` of zeros, infinities and values in bfloat16's normal range rounded
    to its 8 significant bits, to nearest, ties to even, on the bits: add just under half the
    dropped 45 bits' weight, and the kept bits' last, then drop them (a carry moves the
    exponent: overflow reaches infinity in the conversion). ``round_sixteen``'s values in
    5 steps instead of 13."""
    words = a.view(_numpy.uint64)
    kept = (words >> _DROPPED) & _ONE
    return ((words + _BELOW_HALF + kept) & _KEEP).view(_numpy.float64)


_DROPPED, _ONE = _numpy.uint64(45), _numpy.uint64(1)
_BELOW_HALF, _KEEP = _numpy.uint64(2**44 - 1), _numpy.uint64(2**64 - 2**45)


@lru_cache(maxsize=64)  # frequency sets (a dynamic-NTK decode loop brings a new one per step): at most 64 kept
def _split_chunks_cache(values: tuple, nchunks: int):
    return _split_float64(values, nchunks)


def _split_float64(values, nchunks):
    """Split float64 numbers into ``nchunks`` float32-exact numbers of 12 significant bits.

    ``sum(chunks) == value`` to 12*nchunks bits; any product of two 12-bit numbers is exact
    in float32, which is what the split angle reduction below relies on.
    """
    chunks = []
    rest = [float(v) for v in values]
    for _ in range(nchunks):
        chunk = []
        for i, r in enumerate(rest):
            if r == 0.0:
                chunk.append(0.0)
                continue
            e = math.frexp(r)[1]
            q = math.ldexp(round(math.ldexp(r, 12 - e)), e - 12)
            chunk.append(q)
            rest[i] = r - q
        chunks.append(tuple(chunk))
    return chunks


def _split_positions(xp, positions):
    """Exact 12-bit float32 chunks of integer or float32 ``positions``: an integer's 12-bit
    digits from the lowest (``p % 4096``, then the quotient's), the last one signed, three
    for int32 and six for int64, each times its power of 4096 (exact in float32)."""
    if is_integer(xp, positions.dtype):
        bits = xp.iinfo(positions.dtype).bits
        if bits < 32:  # (2**24 does not fit: JAX would wrap it)
            positions, bits = xp.astype(positions, xp.int32), 32
        chunks, rest = [], positions
        for k in range(-(-(bits - 1) // 12) - 1):  # the last digit is the quotient, at most 12 bits with its sign
            chunks.append(xp.astype(rest % 4096, xp.float32) * 4096.0**k)
            rest = rest // 4096
        return [xp.astype(rest, xp.float32) * 4096.0 ** len(chunks), *chunks[::-1]]
    p = xp.astype(positions, xp.float32)
    # Veltkamp split of a 24-bit significand into two 12-bit halves.
    t = p * 4097.0
    hi = t - (t - p)
    return [hi, p - hi]


def _integer_chunks(n):
    """A Python int as Python floats exact in float32: its 12-bit digits from the lowest, each
    times its power of 4096, the last one the signed quotient (none for 0)."""
    chunks, k = [], 0
    while not -4096 < n < 4096:
        n, digit = divmod(n, 4096)
        chunks.append(float(digit * 4096**k))
        k += 1
    return [*chunks, float(n * 4096**k)] if n or chunks else []


def _two_sum(a, b):
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


def cos_sin_of_array(positions, freqs, *, xp, device=None, offset=0):
    """``cos`` and ``sin`` of ``positions[..., None] * freqs`` for frequencies given as an
    array of ``xp`` (traced, or carrying a gradient): the float64 product, or where the
    namespace/device has no float64, ``freqs / (2*pi)`` as a double-float reduced exactly
    with the positions' chunks (:func:`cos_sin_of_turns`; a float32 product was off by
    ``|p f| * 2**-24``, 1e-2 at position 10**6). ``offset``: as in :func:`cos_sin`."""
    if has_float64(xp, device):
        angle = _widened_positions(xp, positions, offset)[..., None] * xp.astype(freqs, xp.float64)
        return xp.cos(angle), xp.sin(angle)
    from . import _doublefloat

    f = xp.astype(freqs, xp.float32)
    turns = _doublefloat.mul((f, xp.zeros_like(f)), _doublefloat.constant(xp, 1.0 / (2.0 * math.pi), device))
    return cos_sin_of_turns(positions, turns, xp=xp, offset=offset)


def cos_sin(positions, freqs, *, xp, device=None, offset=0):
    """``cos`` and ``sin`` of ``(positions + offset)[..., None] * freqs`` with exact angle reduction.

    ``freqs`` is a host sequence (or NumPy array) of float64 frequencies. Where ``xp`` has
    float64 on ``device`` the angles are float64 products. Elsewhere (JAX without x64, MPS,
    ...) the angle in turns, ``p * f / (2*pi)``, is a sum of exact float32 products of
    12-bit chunks of the position and of ``f / (2*pi)``, reduced modulo 1 term by term with
    compensated summation, so a position of 2**24 - 1 keeps the accuracy of position 10.
    ``offset`` (an int, or an integer array broadcasting against ``positions``) is added in
    float64 there, and elsewhere enters the sum as chunks of its own, so float positions
    plus an offset keep the exact sum (float32's rounds it: ``0.1 + 10**6``).
    Returns float64 or float32 arrays of shape ``positions.shape + (len(freqs),)``.
    """
    freqs = tuple(float(f) for f in freqs)
    if has_float64(xp, device):
        f = constant_on(xp, freqs, xp.float64, device)
        angle = _widened_positions(xp, positions, offset)[..., None] * f
        return xp.cos(angle), xp.sin(angle)
    turns = tuple(f / (2.0 * math.pi) for f in freqs)
    g_chunks = [xp.asarray(c, dtype=xp.float32, device=device) for c in _split_chunks_cache(turns, 4)]
    return _reduced_cos_sin(xp, positions, g_chunks, offset)


def _widened_positions(xp, positions, offset):
    """float64 ``positions + offset``, summed as ``check.shifted`` sums float positions."""
    wide = xp.astype(positions, xp.float64)
    if type(offset) is int and offset == 0:
        return wide
    return wide + (xp.astype(offset, xp.float64) if not isinstance(offset, int) else offset)


def constant_on(xp, values, dtype, device, what="rotary tables of new frequencies"):
    """``xp.asarray(values, dtype=dtype, device=device)`` of host numbers ``values`` (a
    tuple of floats, or of ints for an integer ``dtype``): kept on a torch GPU or a CuPy
    device between calls (``_device_constants``: no copy or wait a call, and a CUDA graph
    can capture the calls after the first), else made afresh (a constant of the graph
    ``torch.compile`` traces). ``what`` names them in the error of a new one during a
    capture."""
    if not torch_compiling() and getattr(device, "type", None) == "cuda":
        from ._device_constants import torch_constant

        kept = torch_constant(values, dtype, device, what)
        if kept is not None:
            return kept
    elif type(device).__module__.startswith("cupy"):
        from ._device_constants import kept_array

        return kept_array(xp, _numpy.asarray(values), dtype, device)
    return xp.asarray(values, dtype=dtype, device=device)


def cos_sin_of_turns(positions, turns, *, xp, offset=0):
    """``cos`` and ``sin`` of ``2*pi * (positions + offset)[..., None] * turns`` for frequencies in turns
    computed inside the computation as a double-float ``(hi, lo)`` of float32 arrays (a
    traced ``DynamicNTK`` length without float64): the exact split reduction of
    :func:`cos_sin`, each half cut into two 12-bit chunks."""
    from ._doublefloat import split12

    return _reduced_cos_sin(xp, positions, [*split12(turns[0]), *split12(turns[1])], offset)


def _reduced_cos_sin(xp, positions, g_chunks, offset=0):
    """The split reduction: ``(p + offset) * g`` in turns as a compensated sum of exact float32
    products of 12-bit chunks of the positions, of the integer ``offset`` and of ``g_chunks``
    (12-bit float32 arrays), each reduced modulo 1."""
    p_chunks = [c[..., None] for c in _split_positions(xp, positions)]
    if isinstance(offset, int):
        p_chunks += _integer_chunks(offset)
    else:
        p_chunks += [c[..., None] for c in _split_positions(xp, offset)]
    total = None
    comp = None
    for pc in p_chunks:
        for gc in g_chunks:
            term = pc * gc
            term = term - xp.round(term)
            if total is None:
                total, comp = term, xp.zeros_like(term)
            else:
                total, err = _two_sum(total, term)
                comp = comp + err
                k = xp.round(total)
                total = total - k
    r = total + comp
    r = r - xp.round(r)
    angle = r * (2.0 * math.pi)
    return xp.cos(angle), xp.sin(angle)
