"""Differential fuzz of the CPU (and, with ``NUMBA_ENABLE_CUDASIM=1``, CUDA) kernels against the
Array-API reference under hostile layouts (run as a script, seeded; a few minutes on 2 cores).

Each case draws a call of a public function (``rope``, ``apply_rope``, ``rerotate``,
``t5_bias``, ``alibi_bias``, ``kerple_bias``, ``relative_bias_vector``) or of a Toeplitz op
through the registry, with operands laid out as transposed, sliced, negatively strided,
unaligned, byte-swapped or broadcast (stride 0) views of NumPy arrays or torch CPU tensors,
positions of every integer and float dtype with values near their limits, offsets as NumPy
scalars, 0-d arrays and bools, and ``out=`` that is ``x`` itself, a strided window of a
larger buffer, a partial overlap, a stride-0 view, read-only, or of the wrong
dtype/shape/library. It checks:

* the kernel backend and the reference backend agree: both raise ``ValueError``/``TypeError``,
  or both return results within the dtype's tolerance (bit-exact where the docs say so);
* the kernel's result does not depend on the layout (bit-identical to the same values laid
  out C-contiguous) nor on a call's repetition (the plan that a signature's third call runs);
* ``out`` receives exactly the result and nothing outside ``out`` changes (guard cells);
* a refused call leaves ``out`` and ``x`` untouched.

Prints one JSON line per function (cases, how they ended, the defects found), then a
summary line. ``python tests/hostile/fuzz_kernel_layouts.py [cases_per_function] [seed]
[function ...]``; by default every CPU function, or with ``NUMBA_ENABLE_CUDASIM=1`` every
CUDA kernel (``FUZZ_VERBOSE=1`` also counts the refusals by message).
"""

from __future__ import annotations

import collections
import json
import os
import sys
import traceback
import warnings

import ml_dtypes
import numpy as np
import torch

import posenc as pe
from posenc import _dispatch

warnings.simplefilter("ignore")

BF16 = np.dtype(ml_dtypes.bfloat16)
FLOATS = ("float16", "bfloat16", "float32", "float64")
EPS = {"float16": 2.0**-10, "bfloat16": 2.0**-7, "float32": 2.0**-23, "float64": 2.0**-52}
TORCH = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32, "float64": torch.float64}
POSITION_DTYPES = ("int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64", "bool", "float16", "float32", "float64")


def np_dtype(name):
    return BF16 if name == "bfloat16" else np.dtype(name)


# ---------------------------------------------------------------- arrays of hostile layouts


class Made:
    """A view of ``shape`` over a larger buffer; ``view_of(b)`` takes the same view of another
    buffer ``b`` of the buffer's shape (to find the cells the view covers)."""

    def __init__(self, view, buffer, kind, view_of=lambda b: b):
        self.view, self.buffer, self.kind, self.view_of = view, buffer, kind, view_of

    def covered(self):
        """Boolean mask over the buffer's cells: those the view reaches."""
        if isinstance(self.buffer, torch.Tensor):
            mask = torch.zeros(self.buffer.shape, dtype=torch.bool)
            self.view_of(mask)[...] = True
            return mask.numpy()
        mask = np.zeros(self.buffer.shape, bool)
        if self.kind == "unaligned":
            return np.ones(self.buffer.shape, bool)
        view = self.view_of(mask)
        if view.flags.writeable:
            view[...] = True
        return mask


def _values(rng, shape, dtype, lib, scale=1.0):
    data = rng.standard_normal(shape) * scale
    if lib == "torch":
        return torch.from_numpy(data).to(TORCH[dtype])
    return data.astype(np_dtype(dtype))


def hostile(rng, shape, dtype, lib, *, values=None, allow=("transpose", "slice", "negative", "unaligned", "swapped", "broadcast")):
    """An array of ``shape`` laid out in one of several hostile ways (or C-contiguous)."""
    shape = tuple(shape)
    kinds = ["contiguous", "transpose", "slice", "mixed"]
    if any(n <= 1 for n in shape):
        kinds.append("odd-unit-strides")
    if lib == "numpy":
        kinds += [k for k in ("negative", "unaligned", "swapped") if k in allow]
    if "broadcast" in allow and any(n > 1 for n in shape):
        kinds.append("broadcast")
    kind = kinds[rng.integers(len(kinds))]
    fill = values if values is not None else (lambda s: _values(rng, s, dtype, lib))
    nd = len(shape)
    if kind == "contiguous" or nd == 0:
        buf = fill(shape)
        return Made(buf, buf, "contiguous")
    if kind == "broadcast":
        axes = [i for i, n in enumerate(shape) if n > 1]
        ax = axes[rng.integers(len(axes))]
        small = tuple(1 if i == ax else n for i, n in enumerate(shape))
        inner = hostile(rng, small, dtype, lib, values=values, allow=tuple(a for a in allow if a != "broadcast"))
        spread = (lambda b: np.broadcast_to(b, shape)) if lib == "numpy" else (lambda b: b.expand(shape))
        return Made(spread(inner.view), inner.buffer, "broadcast+" + inner.kind, lambda b: spread(inner.view_of(b)))
    if kind == "odd-unit-strides":  # axes of length 0 or 1 with strides nothing else would give them
        buf = fill(shape)
        picks = (0, 3, 2**40, -7) if lib == "numpy" else (0, 3, 2**40)
        odd = [int(rng.choice(picks)) if n <= 1 else None for n in shape]

        def view_of(b):
            if lib == "torch":
                steps = [st if o is None else o for st, o in zip(b.stride(), odd)]
                return b.as_strided(shape, steps)
            steps = [st if o is None else o * b.itemsize for st, o in zip(b.strides, odd)]
            return np.lib.stride_tricks.as_strided(b, shape, steps)

        return Made(view_of(buf), buf, kind, view_of)
    if kind == "unaligned":
        itemsize = np_dtype(dtype).itemsize
        size = int(np.prod(shape)) if shape else 1
        raw = np.zeros(size * itemsize + 1, np.uint8)[1:]
        v = raw.view(np_dtype(dtype)).reshape(shape)
        v[...] = fill(shape)
        return Made(v, v, "unaligned")
    if kind == "swapped":
        if dtype == "bfloat16":
            buf = fill(shape)
            return Made(buf, buf, "contiguous")
        v = fill(shape).astype(np_dtype(dtype).newbyteorder(">"))
        return Made(v, v, "swapped")
    perm = rng.permutation(nd) if kind in ("transpose", "mixed") else np.arange(nd)
    steps = [int(rng.choice([1, 2, 3])) if kind in ("slice", "mixed", "negative") else 1 for _ in range(nd)]
    starts = [int(rng.integers(0, 2)) if kind in ("slice", "mixed", "negative") else 0 for _ in range(nd)]
    mem = [shape[p] * steps[p] + starts[p] + int(rng.integers(0, 2)) for p in perm]
    flips = tuple(i for i in range(nd) if rng.random() < 0.6) if kind == "negative" else ()

    def view_of(b):
        v = b[tuple(slice(starts[p], starts[p] + shape[p] * steps[p], steps[p]) for p in perm)]
        v = v.permute(*np.argsort(perm).tolist()) if lib == "torch" else v.transpose(np.argsort(perm))
        return np.flip(v, axis=flips) if flips else v

    buf = fill(tuple(mem))
    v = view_of(buf)
    assert tuple(v.shape) == shape
    return Made(v, buf, kind, view_of)


def contiguous(a):
    if isinstance(a, np.ndarray):
        return np.array(a, dtype=a.dtype.newbyteorder("="), order="C", copy=True)
    return a.contiguous().clone()


def to64(a):
    if a is None:
        return None
    if isinstance(a, torch.Tensor):
        return a.detach().to(torch.float64).numpy() if a.is_floating_point() else a.numpy()
    if a.dtype == BF16:
        return a.astype(np.float64)
    return np.asarray(a, dtype=np.float64) if a.dtype.kind in "fc" else np.asarray(a)


def snapshot(a):
    """The bits of every cell of a buffer (guard cells included)."""
    return bits(a).copy()


def bits(a):
    if isinstance(a, torch.Tensor):
        a = a.detach()
        if a.is_floating_point() and a.element_size() == 2:
            return a.contiguous().view(torch.int16).numpy().copy()
        return a.contiguous().numpy().copy()
    a = np.ascontiguousarray(a)
    return a.astype(a.dtype.newbyteorder("=")).view(f"u{a.dtype.itemsize}") if a.dtype.kind in "fV" or a.dtype == BF16 else a


def same_bits(a, b):
    """The same bits, but for the payloads of NaNs."""
    va, vb = bits(a), bits(b)
    if va.shape != vb.shape:
        return False
    differ = va != vb
    return not differ.any() or bool(np.all(np.isnan(to64(a)[differ]) & np.isnan(to64(b)[differ])))


# ---------------------------------------------------------------- outcomes


class Outcome:
    def __init__(self, value=None, error=None, crash=None):
        self.value, self.error, self.crash = value, error, crash


def attempt(fn, backend):
    try:
        with pe.use_backend(backend):
            return Outcome(value=fn())
    except (ValueError, TypeError) as exc:
        if not str(exc):
            return Outcome(crash=f"{type(exc).__name__} without a message")
        return Outcome(error=f"{type(exc).__name__}: {exc}")
    except Exception as exc:  # noqa: BLE001 (the fuzz's finding)
        return Outcome(crash=f"{type(exc).__name__}: {exc} @ {traceback.format_exc().strip().splitlines()[-3].strip()}")


def dtype_of(a):
    if isinstance(a, np.ndarray):
        return "bfloat16" if a.dtype == BF16 else a.dtype.newbyteorder("=").name
    return str(a.dtype).rsplit(".", 1)[-1]


def close(got, want, dtype, magnitude):
    """Within two ulps of the result plus four of the operands' magnitude (float: the
    docs' 'a few ulps'; cancellation costs ulps of the row, not of the result)."""
    g, w = to64(got), to64(want)
    if g.shape != w.shape:
        return False, f"shapes {g.shape} != {w.shape}"
    if not np.array_equal(np.isnan(g), np.isnan(w)):
        return False, "NaNs differ"
    ok = np.isnan(w) | (g == w) | (np.abs(g - w) <= EPS[dtype] * (2 * np.abs(w) + 4 * magnitude))
    if ok.all():
        return True, ""
    k = np.argwhere(~ok)[0]
    return False, f"at {tuple(k)}: kernel {g[tuple(k)]!r} reference {w[tuple(k)]!r} (|x| {magnitude if np.ndim(magnitude) == 0 else magnitude[tuple(k)]!r})"


# ---------------------------------------------------------------- the generic differential check


class Fuzz:
    def __init__(self):
        self.cases = collections.Counter()
        self.ends = collections.defaultdict(collections.Counter)
        self.defects = collections.defaultdict(list)
        self.refusals = collections.defaultdict(collections.Counter)

    def defect(self, fn, what, case):
        found = self.defects[fn]
        if len(found) < 12 and all(what.split(":")[0] != d["what"].split(":")[0] for d in found):
            found.append({"what": what, "case": case})
        self.ends[fn]["defect"] += 1

    def outcomes_agree(self, fn, case, ref, ker):
        """Whether neither backend crashed and both returned or both refused (else a defect)."""
        for name, o in (("reference", ref), ("kernel", ker)):
            if o.crash:
                self.defect(fn, f"{name} crashed: {o.crash}", case)
                return False
        if (ref.error is None) != (ker.error is None):
            self.defect(fn, f"outcomes differ: reference {ref.error or 'ok'} / kernel {ker.error or 'ok'}", case)
            return False
        return True

    def check(self, fn, case, build, *, dtype=None, magnitude=0.0, exact=False, out_name=None, warm=False, same_layout_bits=True):
        """``build(copy)`` returns ``(call, operands)``: a zero-argument call and the arrays it
        reads and writes (fresh ones each time, from the same draw).

        Runs the call with the reference backend, with the kernels, with the kernels again on
        C-contiguous copies of the operands, and twice more with the kernels (the plan of
        the signature's third call), and compares.
        """
        self.cases[fn] += 1
        if warm:  # the same signature twice with operands apart: the hostile call then meets a plan
            CLEAN[0] = True
            try:
                for _ in range(2):
                    call, _ops = build()
                    attempt(call, "auto")
            finally:
                CLEAN[0] = False
        ref_call, ref_ops = build()
        ker_call, ker_ops = build()
        before = {name: snapshot(m.buffer) for name, m in ker_ops.items()}
        ref = attempt(ref_call, "reference")
        ker = attempt(ker_call, "auto")
        if not self.outcomes_agree(fn, case, ref, ker):
            return
        if ker.error is not None:
            self.ends[fn]["refused"] += 1
            self.refusals[fn][ker.error[:70]] += 1
            for name, m in ker_ops.items():
                if not np.array_equal(snapshot(m.buffer), before[name]):
                    self.defect(fn, f"refused call ({ker.error[:60]}) wrote into {name}", case)
            return
        written = ker_ops.get(out_name)
        for name, m in ker_ops.items():
            after = snapshot(m.buffer)
            if written is not None and m.buffer is written.buffer:
                outside = ~written.covered()
                if not np.array_equal(after[outside], before[name][outside]):
                    self.defect(fn, f"wrote outside out ({m.kind})", case)
                    return
            elif not np.array_equal(after, before[name]):
                self.defect(fn, f"wrote into {name}, which is not out ({m.kind})", case)
                return
        got, want = ker.value, ref.value
        if isinstance(got, tuple):
            got, want = got[0], want[0]
        if type(got) is not type(want) or dtype_of(got) != dtype_of(want) or tuple(got.shape) != tuple(want.shape):
            self.defect(fn, f"result kind differs: kernel {type(got).__name__} {dtype_of(got)} {tuple(got.shape)} / reference {type(want).__name__} {dtype_of(want)} {tuple(want.shape)}", case)
            return
        d = dtype or dtype_of(want)
        if exact:
            if not np.array_equal(to64(got), to64(want), equal_nan=True):
                diff = np.argwhere(~((to64(got) == to64(want)) | (np.isnan(to64(got)) & np.isnan(to64(want)))))
                k = tuple(diff[0])
                self.defect(fn, f"kernel != reference (exact): at {k} {to64(got)[k]!r} vs {to64(want)[k]!r}", case)
                return
        else:
            ok, why = close(got, want, d, magnitude)
            if not ok:
                self.defect(fn, f"kernel != reference beyond tolerance: {why}", case)
                return
        if out_name is not None and ker.value is not ker_ops[out_name].view:
            self.defect(fn, "the call with out= did not return out", case)
        # layout independence: the same values, C-contiguous, and the plan of repeated calls
        for attempt_no in range(3):
            call, ops = build(contiguous_ops=(attempt_no == 0))
            again = attempt(call, "auto")
            if again.crash or again.error:
                self.defect(fn, f"repeat {attempt_no} ended differently: {again.crash or again.error}", case)
                return
            value = again.value[0] if isinstance(again.value, tuple) else again.value
            if not same_layout_bits and close(value, got, dtype or dtype_of(got), magnitude)[0]:
                continue  # (a BLAS matmul's rounding follows the operands' strides: docs/conventions.md)
            if not same_bits(value, got):
                g, w = to64(value), to64(got)
                diff = np.argwhere(~((g == w) | (np.isnan(g) & np.isnan(w))))
                k = tuple(diff[0]) if len(diff) else ()
                what = "C-contiguous copy" if attempt_no == 0 else f"repeat {attempt_no} (plan)"
                self.defect(fn, f"result depends on layout/repetition ({what}): at {k} {g[k] if k else ''!r} vs {w[k] if k else ''!r}", case)
                return
        self.ends[fn]["ok"] += 1

    def report(self):
        for fn in self.cases:
            print(json.dumps({"function": fn, "cases": self.cases[fn], "ends": dict(self.ends[fn]), "defects": self.defects[fn]}, default=str))
            if os.environ.get("FUZZ_VERBOSE"):
                for message, count in self.refusals[fn].most_common():
                    print(f"  {count:5d} {message}")
        defects = [f"{fn}: {d['what']} {d['case']}" for fn in self.cases for d in self.defects[fn]]
        print(json.dumps({"functions": len(self.cases), "cases": sum(self.cases.values()), "defects": defects}, default=str))


# ---------------------------------------------------------------- draws shared by the rotary cases

SIZES = (0, 1, 1, 2, 3, 5)


def draw_shape(rng, ndim, last):
    return tuple(int(rng.choice(SIZES)) for _ in range(ndim - 1)) + (last,)


def limits(name):
    if name == "bool":
        return 0, 1
    if name.startswith(("int", "uint")):
        info = np.iinfo(name)
        return int(info.min), int(info.max)
    return -float(np.finfo(name).max), float(np.finfo(name).max)


def position_values(rng, name, shape):
    """Positions of dtype ``name``: small ones, negative ones, or values near the type's limits."""
    mode = rng.choice(["small", "small", "negative", "limits", "large"])
    low, high = limits(name)
    size = int(np.prod(shape))
    if name == "bool":
        return rng.integers(0, 2, shape).astype(bool)
    if name.startswith("float"):
        if mode == "limits":
            v = rng.choice([2.0**24 - 1, 2.0**31, 65504.0, -65504.0, 1e6 + 0.5, 2.0**32 + 1, -3.25], shape)
        elif mode == "large":
            v = rng.integers(0, 2**30, shape) * (rng.random(shape) + 0.5)
        else:
            v = rng.integers(-64 if mode == "negative" else 0, 64, shape) + rng.random(shape)
        return np.asarray(np.clip(v, low, high)).astype(name)
    if mode == "limits":
        pool = [low, high, high - 1, low + 1, 0]
        v = [pool[int(k)] for k in rng.integers(0, len(pool), size)]
    elif mode == "large":
        v = [int(k) for k in rng.integers(0, 2**30, size)]
    else:
        v = [int(k) for k in rng.integers(-64 if mode == "negative" else 0, 64, size)]
    return np.array([min(max(k, low), high) for k in v], dtype=object).reshape(shape).astype(name)


def as_lib(a, lib):
    if lib == "numpy" or a is None:
        return a
    if a.dtype == np.uint16 or a.dtype == np.uint32 or a.dtype == np.uint64:
        return torch.from_numpy(a.view(a.dtype.str.replace("u", "i")).copy()).view(getattr(torch, a.dtype.name))
    return torch.from_numpy(np.ascontiguousarray(a))


def draw_offset(rng, lib):
    """An offset: an int, a NumPy scalar, a 0-d array (NumPy or torch), a bool."""
    value = int(rng.choice([0, 1, 3, 17, -2, 2**20, 2**40, -(2**40)]))
    form = rng.choice(["int", "int", "int", "np_scalar", "np_0d", "lib_0d", "lib_0d", "bool", "np_bool", "uint8", "float"])
    if form == "int":
        return value, "int"
    if form == "np_scalar":
        return np.int64(value), "np.int64"
    if form == "np_0d":
        return np.array(value), "np.array(int)"
    if form == "lib_0d":
        return (np.array(value) if lib == "numpy" else torch.tensor(value)), f"{lib} 0-d"
    if form == "bool":
        return bool(value & 1), "bool"
    if form == "np_bool":
        return np.bool_(value & 1), "np.bool_"
    if form == "uint8":
        return np.uint8(abs(value) % 256), "np.uint8"
    return float(value), "float"


def out_for(rng, form, shape, dtype, lib):
    """``(out Made or None, out name in ops)`` for ``out=`` of kind ``form``."""
    if form in ("none", "over_input"):  # (over_input: the case places it)
        return None
    if form == "window":
        return hostile(rng, shape, dtype, lib, allow=("transpose", "slice", "negative", "unaligned", "swapped"))
    if form == "broadcast":
        made = hostile(rng, shape, dtype, lib, allow=("broadcast",))
        return made
    if form == "readonly":
        made = hostile(rng, shape, dtype, "numpy", allow=())
        made.view = made.view.view()
        made.view.flags.writeable = False
        return made if lib == "numpy" else Made(torch.from_numpy(np.zeros(shape)), torch.zeros(1), "readonly-torch-other-dtype")
    if form == "wrong_dtype":
        other = "float32" if dtype != "float32" else "float64"
        return hostile(rng, shape, other, lib, allow=())
    if form == "wrong_shape":
        return hostile(rng, shape[:-1] + (shape[-1] + 2,), dtype, lib, allow=())
    if form == "other_lib":
        return hostile(rng, shape, dtype, "torch" if lib == "numpy" else "numpy", allow=())
    raise AssertionError(form)


OUT_FORMS = ("none", "none", "none", "none", "x", "x", "x", "window", "window", "window", "overlap", "overlap", "over_input", "over_input", "broadcast", "readonly", "wrong_dtype", "wrong_shape", "other_lib")


def over_input(r, lib, shape, input_shape):
    """``(input Made, out Made)``: float64 ``input_shape`` and ``out`` of ``shape`` over one
    memory, ``out`` starting inside the input (torch: two storages), or apart under ``CLEAN``."""
    n, k = int(np.prod(shape)), int(np.prod(input_shape))
    start = int(r.integers(0, max(k, 1)))
    take = shared(r, k + n + 1, lib)
    inp, memory = take(0, input_shape)
    out, _ = take(start, shape)
    if CLEAN[0]:
        return Made(inp, inp.numpy() if lib == "torch" else inp, "apart"), Made(out, out.numpy() if lib == "torch" else out, "apart")
    return Made(inp, memory, "shared", lambda b: b[:k].reshape(input_shape)), Made(out, memory, "shared", lambda b: b[start : start + n].reshape(shape))


CLEAN = [False]  # draw the same layouts with every operand in memory of its own (a signature's warm-up calls)


def shared(rng, size, lib):
    """Two torch storages (or NumPy views) over one float64 memory: ``take(start, shape)``
    views ``shape`` elements from ``start``; with ``CLEAN`` each take gets memory of its own."""
    memory = rng.standard_normal(size)

    def take(start, shape):
        n = int(np.prod(shape))
        region = memory[start : start + n] if not CLEAN[0] else memory[start : start + n].copy()
        v = region.reshape(shape)
        return (torch.from_numpy(v) if lib == "torch" else v), memory

    return take


def x_and_out(rng, lib, dtype, shape, out_form):
    """``{"x": Made}`` of :func:`draw_x`, with ``"out"`` where ``out`` is a buffer apart from ``x``."""
    x, out = draw_x(rng, lib, dtype, shape, out_form)
    return {"x": x} if out is None or out is x else {"x": x, "out": out}


def draw_x(rng, lib, dtype, shape, out_form):
    """``(x Made, out Made or None)``; ``overlap``: ``x`` and ``out`` one row apart in one
    buffer (for torch, two storages over it half of the time)."""
    if out_form == "overlap":
        big = _values(rng, (shape[0] + 1, *shape[1:]), dtype, lib)
        if lib == "torch" and dtype != "bfloat16" and rng.random() < 0.5:
            held = big.numpy()
            x_np, o_np = (held[1:], held[:-1]) if not CLEAN[0] else (held[1:].copy(), held[:-1].copy())
            return Made(torch.from_numpy(x_np), x_np if CLEAN[0] else held, "overlap-storages", (lambda b: b) if CLEAN[0] else (lambda b: b[1:])), Made(
                torch.from_numpy(o_np), o_np if CLEAN[0] else held, "overlap-storages", (lambda b: b) if CLEAN[0] else (lambda b: b[:-1]))
        if CLEAN[0]:
            other = _values(rng, (shape[0] + 1, *shape[1:]), dtype, lib)
            return Made(big[1:], big, "overlap-clean", lambda b: b[1:]), Made(other[:-1], other, "overlap-clean", lambda b: b[:-1])
        x = Made(big[1:], big, "overlap", lambda b: b[1:])
        return x, Made(big[:-1], big, "overlap", lambda b: b[:-1])
    x = hostile(rng, shape, dtype, lib)
    if out_form == "x":
        return x, x
    return x, out_for(rng, out_form, shape, dtype, lib)


def finish_ops(ops, contiguous_ops):
    """The operands as drawn, or as C-contiguous copies (``out=x`` kept as ``x``)."""
    if not contiguous_ops:
        return ops
    copies = {}
    for name, m in ops.items():
        if m is None:
            continue
        if id(m) not in copies:
            v = contiguous(m.view) if not (isinstance(m.view, np.ndarray) and not m.view.flags.writeable) else m.view
            copies[id(m)] = Made(v, v, "contiguous")
        ops[name] = copies[id(m)]
    return ops


def magnitude_of(x):
    v = to64(x)
    return float(np.max(np.abs(v[np.isfinite(v)]))) if v.size and np.isfinite(v).any() else 0.0


# ---------------------------------------------------------------- rope, apply_rope, rerotate


def draw_rotation(rng):
    """``(lib, dtype, ndim, dim, shape, layout)`` of a rotation case, drawn in that order."""
    lib = rng.choice(["numpy", "torch"])
    dtype = str(rng.choice(FLOATS))
    ndim = int(rng.integers(1, 5))
    dim = int(rng.choice([2, 4, 6, 8, 16, 18, 34]))
    return lib, dtype, ndim, dim, draw_shape(rng, ndim, dim), str(rng.choice(["half", "interleaved"]))


def case_rope(fuzz, rng, seed):
    lib, dtype, ndim, dim, shape, layout = draw_rotation(rng)
    rotary_dim = int(rng.choice([0, dim] + list(range(2, dim + 1, 2))[:3])) or None
    out_form = str(rng.choice(OUT_FORMS))
    seq_axis = None if ndim < 3 or rng.random() < 0.7 else int(rng.choice([-2, -3]))
    given = rng.random() < 0.6 or out_form == "over_input"
    pdtype = str(rng.choice(POSITION_DTYPES)) if out_form != "over_input" else "float64"
    if out_form == "over_input":
        dtype = "float64"
    s_len = shape[seq_axis if seq_axis is not None else -2] if ndim >= 2 else shape[-1]
    pshape = () if ndim == 1 else (s_len,) if ndim < 3 or rng.random() < 0.5 else (shape[0], s_len)
    offset_seed = int(rng.integers(2**31))
    inverse = bool(rng.random() < 0.3)
    base = float(rng.choice([10000.0, 500000.0, 1.5]))
    scaling = rng.choice([None, None, None, "linear", "dynamic"])
    case = dict(lib=lib, dtype=dtype, shape=shape, layout=layout, rotary_dim=rotary_dim, out=out_form, seq_axis=seq_axis,
                positions=(pdtype, pshape) if given else None, inverse=inverse, base=base, scaling=scaling, seed=seed)

    def build(contiguous_ops=False):
        r = np.random.default_rng(seed)
        ops = x_and_out(r, lib, dtype, shape, out_form)
        if given:
            pv = position_values(r, pdtype, pshape)
            pm = hostile(r, pshape, "float64", lib, values=lambda s: as_lib(np.resize(pv, s).astype(pv.dtype) if s != pshape else pv, lib),
                         allow=("transpose", "slice", "negative", "broadcast"))
            ops["positions"] = pm
        if out_form == "over_input":
            ops["positions"], ops["out"] = over_input(r, lib, shape, pshape)
        ops = finish_ops(ops, contiguous_ops)
        offset, _ = draw_offset(np.random.default_rng(offset_seed), lib)
        kw = dict(layout=layout, inverse=inverse, base=base, offset=offset)
        if rotary_dim is not None:
            kw["rotary_dim"] = rotary_dim
        if seq_axis is not None:
            kw["seq_axis"] = seq_axis
        if scaling == "linear":
            kw["scaling"] = pe.scaling.Linear(2.0)
        elif scaling == "dynamic":
            kw["scaling"] = pe.scaling.DynamicNTK(2.0, 8)
        if out_form != "none":
            kw["out"] = ops["out"].view if out_form != "x" else ops["x"].view
        args = (ops["x"].view,) + ((ops["positions"].view,) if given else ())
        return (lambda: pe.rope(*args, **kw)), ops

    _, offset_name = draw_offset(np.random.default_rng(offset_seed), lib)
    case["offset"] = offset_name
    fuzz.check("rope", case, build, magnitude=4.5, out_name=("x" if out_form == "x" else "out" if out_form != "none" else None), warm=True)


def case_apply_rope(fuzz, rng, seed):
    lib, dtype, ndim, dim, shape, layout = draw_rotation(rng)
    rotary = int(rng.choice(list(range(2, dim + 1, 2))))
    out_form = str(rng.choice(OUT_FORMS))
    # cos/sin broadcasting against x: drop leading axes, or make some 1
    cshape = list(shape[:-1]) + [rotary]
    drop = int(rng.integers(0, len(cshape)))
    cshape = cshape[drop:]
    cshape = tuple(1 if (i < len(cshape) - 1 and rng.random() < 0.3) else n for i, n in enumerate(cshape))
    cdtype = dtype if rng.random() < 0.9 else str(rng.choice(FLOATS))
    if out_form == "over_input":
        dtype = cdtype = "float64"
    case = dict(lib=lib, dtype=dtype, shape=shape, layout=layout, cos_shape=cshape, cos_dtype=cdtype, out=out_form, seed=seed)

    def build(contiguous_ops=False):
        r = np.random.default_rng(seed)
        ops = x_and_out(r, lib, dtype, shape, out_form)
        angles = r.uniform(-1e4, 1e4, cshape[:-1] + (rotary // 2,))
        full = np.concatenate([angles, angles], -1) if layout == "half" else np.repeat(angles, 2, -1)
        for name, f in (("cos", np.cos), ("sin", np.sin)):
            table = f(full)
            ops[name] = hostile(r, cshape, cdtype, lib, values=lambda s, t=table: as_lib(np.resize(t, s).astype(np_dtype(cdtype)), lib) if lib == "numpy" else torch.from_numpy(np.resize(t, s).copy()).to(TORCH[cdtype]),
                                allow=("transpose", "slice", "negative", "broadcast", "unaligned"))
        if out_form == "over_input":
            which = str(r.choice(["cos", "sin"]))
            ops[which], ops["out"] = over_input(r, lib, shape, cshape)
        ops = finish_ops(ops, contiguous_ops)
        kw = dict(layout=layout)
        if out_form != "none":
            kw["out"] = ops["out"].view if out_form != "x" else ops["x"].view
        args = (ops["x"].view, ops["cos"].view, ops["sin"].view)
        return (lambda: pe.apply_rope(*args, **kw)), ops

    fuzz.check("apply_rope", case, build, magnitude=4.5, out_name=("x" if out_form == "x" else "out" if out_form != "none" else None), warm=True)


def case_rerotate(fuzz, rng, seed):
    lib = rng.choice(["numpy", "torch"])
    dtype = str(rng.choice(FLOATS))
    ndim = int(rng.integers(1, 5))
    dim = int(rng.choice([2, 4, 8, 16, 18]))
    shape = draw_shape(rng, ndim, dim)
    layout = str(rng.choice(["half", "interleaved"]))
    out_form = str(rng.choice([f for f in OUT_FORMS if f != "over_input"]))
    delta_form = str(rng.choice(["int", "np_scalar", "np_0d", "lib_0d", "array", "bool", "uint64", "float"]))
    freq_form = str(rng.choice(["numpy", "numpy_strided", "none", "lib", "float32"]))
    case = dict(lib=lib, dtype=dtype, shape=shape, layout=layout, out=out_form, delta=delta_form, inv_freq=freq_form, seed=seed)

    def build(contiguous_ops=False):
        r = np.random.default_rng(seed)
        ops = x_and_out(r, lib, dtype, shape, out_form)
        ops = finish_ops(ops, contiguous_ops)
        value = int(r.choice([0, 1, -1, 5, -300, 2**33, 2**62]))
        delta = {"int": value, "np_scalar": np.int64(value), "np_0d": np.array(value), "lib_0d": np.array(value) if lib == "numpy" else torch.tensor(value),
                 "bool": True, "uint64": np.uint64(abs(value)), "float": float(value) + 0.5}.get(delta_form)
        if delta_form == "array":
            lead = shape[:-2] if ndim >= 2 else ()
            d = r.integers(-50, 50, lead[-1:] if lead else ())
            delta = as_lib(np.asarray(d), lib)
        inv_freq = 10000.0 ** (-np.arange(0, dim, 2) / dim)
        if freq_form == "numpy_strided":
            inv_freq = np.repeat(inv_freq, 2)[::2]
        elif freq_form == "none":
            inv_freq = None
        elif freq_form == "lib":
            inv_freq = as_lib(inv_freq, lib)
        elif freq_form == "float32":
            inv_freq = inv_freq.astype(np.float32)
        kw = dict(layout=layout)
        if out_form != "none":
            kw["out"] = ops["out"].view if out_form != "x" else ops["x"].view
        xv = ops["x"].view
        return (lambda: pe.rerotate(xv, delta, inv_freq, **kw)), ops

    fuzz.check("rerotate", case, build, magnitude=4.5, out_name=("x" if out_form == "x" else "out" if out_form != "none" else None))


def case_rotate_pair(fuzz, rng, seed):
    from posenc.rotary.apply import rotate_pair

    lib = str(rng.choice(["numpy", "torch"]))
    dtype = str(rng.choice(FLOATS))
    b, s, hq, hk = (int(rng.choice([1, 2, 3])) for _ in range(4))
    dim = int(rng.choice([2, 4, 8, 18]))
    rotary = int(rng.choice(list(range(2, dim + 1, 2))))
    layout = str(rng.choice(["half", "interleaved"]))
    bshd = bool(rng.random() < 0.5)
    cshape = (b, 1, s, rotary) if rng.random() < 0.5 else (s, rotary)
    case = dict(lib=lib, dtype=dtype, q=(b, hq, s, dim), k=(b, hk, s, dim), bshd=bshd, cos=cshape, layout=layout, seed=seed)

    def build(contiguous_ops=False):
        r = np.random.default_rng(seed)
        ops = {}
        for name, h in (("q", hq), ("k", hk)):
            if bshd:  # [b, s, h, d] transposed to [b, h, s, d]
                m = hostile(r, (b, s, h, dim), dtype, lib, allow=("slice",))
                v = m.view.transpose(1, 2) if lib == "torch" else m.view.transpose(0, 2, 1, 3)
                ops[name] = Made(v, m.buffer, "bshd+" + m.kind, lambda buf, m=m: m.view_of(buf).transpose(1, 2) if lib == "torch" else m.view_of(buf).transpose(0, 2, 1, 3))
            else:
                ops[name] = hostile(r, (b, h, s, dim), dtype, lib)
        angles = r.uniform(-1e4, 1e4, cshape[:-1] + (rotary // 2,))
        full = np.concatenate([angles, angles], -1) if layout == "half" else np.repeat(angles, 2, -1)
        for name, f in (("cos", np.cos), ("sin", np.sin)):
            t = f(full)
            ops[name] = hostile(r, cshape, dtype, lib, values=lambda sh, t=t: as_lib(np.resize(t, sh).astype(np_dtype(dtype)), lib) if lib == "numpy" else torch.from_numpy(np.resize(t, sh).copy()).to(TORCH[dtype]),
                                allow=("transpose", "slice", "negative", "broadcast"))
        ops = finish_ops(ops, contiguous_ops)
        a = tuple(ops[n].view for n in ("q", "k", "cos", "sin"))

        def call():
            rq, rk = rotate_pair(*a, layout=layout)
            return torch.cat([rq.reshape(-1), rk.reshape(-1)]) if lib == "torch" else np.concatenate([rq.reshape(-1), rk.reshape(-1)])

        return call, ops

    fuzz.check("rotate_pair", case, build, magnitude=4.5)


def case_rope_rows(fuzz, rng, seed):
    """``rope`` with per-row offsets (and ``seq_len``): each row must be bit-identical to a
    single-row call with its value, and the kernel the reference's."""
    lib = str(rng.choice(["numpy", "torch"]))
    dtype = str(rng.choice(FLOATS))
    b, h, s = int(rng.choice([1, 2, 3])), int(rng.choice([1, 2])), int(rng.choice([1, 2, 5]))
    dim = int(rng.choice([4, 8, 18]))
    bshd = bool(rng.random() < 0.5)
    odtype = str(rng.choice(["int8", "uint8", "int16", "int32", "uint32", "int64", "uint64"]))
    scaling = rng.choice([None, "dynamic", "longrope", "linear"])
    with_seq_len = scaling in ("dynamic", "longrope") and rng.random() < 0.5
    given = rng.random() < 0.5
    pdtype = str(rng.choice(["int32", "int64", "uint8", "float32", "float64"]))
    case = dict(lib=lib, dtype=dtype, shape=(b, s, h, dim) if bshd else (b, h, s, dim), bshd=bshd, offset_dtype=odtype, scaling=scaling,
                seq_len=with_seq_len, positions=pdtype if given else None, seed=seed)
    shape = case["shape"]

    def make_scaling():
        if scaling == "dynamic":
            return pe.scaling.DynamicNTK(2.0, 8)
        if scaling == "longrope":
            half = dim // 2
            return pe.scaling.LongRoPE([1.0] * half, [2.0 + k for k in range(half)], 8)
        if scaling == "linear":
            return pe.scaling.Linear(3.0)
        return None

    def values(r):
        x = hostile(r, shape, dtype, lib)
        off = position_values(r, odtype, (b,))
        pos = None
        if given:
            pos = position_values(r, pdtype, (b, s)) if r.random() < 0.5 else position_values(r, pdtype, (s,))
        seq = None
        if with_seq_len:
            seq = np.asarray(r.integers(0, 40, (b,)))
        return x, off, pos, seq

    def kwargs_of(off, pos, seq, rows=slice(None)):
        kw = dict(scaling=make_scaling(), offset=as_lib(np.ascontiguousarray(off[rows]), lib))
        if bshd:
            kw["seq_axis"] = "bshd"
        if seq is not None:
            kw["seq_len"] = as_lib(np.ascontiguousarray(seq[rows]), lib)
        args = ()
        if pos is not None:
            args = (as_lib(np.ascontiguousarray(pos[rows] if pos.ndim == 2 else pos), lib),)
        return args, kw

    def build(contiguous_ops=False):
        r = np.random.default_rng(seed)
        x, off, pos, seq = values(r)
        ops = finish_ops({"x": x}, contiguous_ops)
        args, kw = kwargs_of(off, pos, seq)
        xv = ops["x"].view
        return (lambda: pe.rope(xv, *args, **kw)), ops

    fuzz.check("rope per-row", case, build, magnitude=4.5)
    # each row alone
    r = np.random.default_rng(seed)
    x, off, pos, seq = values(r)
    whole = attempt(lambda: pe.rope(x.view, *kwargs_of(off, pos, seq)[0], **kwargs_of(off, pos, seq)[1]), "auto")
    if whole.error or whole.crash:
        return
    for row in range(b):
        args, kw = kwargs_of(off, pos, seq, slice(row, row + 1))
        one = attempt(lambda: pe.rope(x.view[row : row + 1], *args, **kw), "auto")
        if one.error or one.crash:
            fuzz.defect("rope per-row", f"row {row} alone ended differently: {one.error or one.crash}", case)
            return
        if not same_bits(one.value, whole.value[row : row + 1]):
            fuzz.defect("rope per-row", f"row {row} alone differs from the per-row call", case)
            return


# ---------------------------------------------------------------- relative biases

LENGTHS = (0, 1, 1, 2, 3, 7, 33)


def draw_length(rng, lib):
    n = int(rng.choice(LENGTHS))
    form = rng.choice(["int", "int", "int", "np", "0d"])
    if form == "np" and lib == "numpy":
        return np.int64(n)
    if form == "0d":
        return np.array(n) if lib == "numpy" else torch.tensor(n)
    return n


def per_token(rng, lib, lead, n, name):
    """Per-token positions ``[*lead, n]`` of dtype ``name``: ``arange`` shifted, or near the limits."""
    if name == "bool" or rng.random() < 0.3:
        v = position_values(rng, name, (*lead, n))
    else:
        start = rng.integers(-5, 20, (*lead, 1))
        v = np.clip(start + np.arange(n), *limits(name)).astype(name)
    return as_lib(np.asarray(v), lib)


def case_bias(fuzz, rng, seed, fn):
    lib = str(rng.choice(["numpy", "torch"]))
    dtype = str(rng.choice(FLOATS))
    heads = int(rng.choice([1, 2, 3, 5]))
    kind = {"t5_bias": "t5", "alibi_bias": "alibi", "kerple_bias": "kerple"}.get(fn) or str(rng.choice(["t5", "alibi", "shaw", "deberta"]))
    num_buckets = int(rng.choice([4, 8, 32]))
    max_distance = int(rng.choice([num_buckets, 128])) if kind == "t5" else int(rng.choice([1, 4, 128]))
    per = fn != "relative_bias_vector" and rng.random() < 0.3
    pdtype = str(rng.choice(POSITION_DTYPES))
    lead = tuple(int(rng.choice([1, 2])) for _ in range(int(rng.integers(0, 2))))
    out_form = str(rng.choice(["none", "none", "window", "window", "broadcast", "readonly", "wrong_dtype", "wrong_shape", "other_lib"])) if fn in ("t5_bias", "alibi_bias") else "none"
    offset_given = rng.random() < 0.5
    options = {}
    if kind == "t5":
        options = dict(bidirectional=bool(rng.random() < 0.5), max_distance=max_distance)
    elif kind == "alibi":
        options = dict(symmetric=bool(rng.random() < 0.3))
    elif kind in ("shaw", "deberta"):
        options = dict(max_distance=max_distance)
        if kind == "deberta" and rng.random() < 0.5:
            options.update(bucket_size=int(rng.choice([2, 4, 8])), max_position=int(rng.choice([8, 64])))
    elif kind == "kerple":
        options = dict(kind=str(rng.choice(["log", "power"])))
    pshape = {"t5": (num_buckets, heads), "alibi": (heads,), "shaw": (2 * max_distance + 1, heads), "deberta": (2 * max_distance, heads), "kerple": (heads,)}[kind]
    case = dict(fn=fn, kind=kind, lib=lib, dtype=dtype, params=pshape, options=options, per_token=(pdtype, lead) if per else None, out=out_form, seed=seed)

    def build(contiguous_ops=False):
        r = np.random.default_rng(seed)
        q_len, k_len = draw_length(r, lib), draw_length(r, lib)
        q, k = int(q_len), int(k_len)
        ops = {}
        if kind == "kerple":
            ops["r1"] = hostile(r, pshape, dtype, lib, values=lambda s: as_lib(np.abs(r.standard_normal(s)).astype(np_dtype(dtype)), lib) if lib == "numpy" else torch.from_numpy(np.abs(r.standard_normal(s))).to(TORCH[dtype]))
            ops["r2"] = hostile(r, pshape, dtype, lib, values=lambda s: as_lib(r.uniform(0.1, 2.0, s).astype(np_dtype(dtype)), lib) if lib == "numpy" else torch.from_numpy(r.uniform(0.1, 2.0, s)).to(TORCH[dtype]))
        else:
            ops["params"] = hostile(r, pshape, dtype, lib)
        kw = dict(options)
        if per:
            kw["query_positions"] = per_token(r, lib, lead, q, pdtype)
            kw["key_positions"] = per_token(r, lib, lead, k, pdtype)
        if offset_given:
            kw["offset"], _ = draw_offset(r, lib)
        shape = (*(lead if per else ()), heads, q, k)
        if out_form != "none":
            ops["out"] = out_for(r, out_form, shape, dtype, lib)
        ops = finish_ops(ops, contiguous_ops)
        if "out" in ops:
            kw["out"] = ops["out"].view
        if fn == "kerple_bias":
            a = (ops["r1"].view, ops["r2"].view, q_len, k_len)
            return (lambda: pe.kerple_bias(*a, **kw)), ops
        if fn == "relative_bias_vector":
            a = (kind, ops["params"].view, q_len, k_len)
            return (lambda: pe.relative_bias_vector(*a, **kw)), ops
        a = (ops["params"].view, q_len, k_len)
        return (lambda: getattr(pe, fn)(*a, **kw)), ops

    exact = kind in ("t5", "shaw", "deberta")
    fuzz.check(fn, case, build, exact=exact, magnitude=0.0, out_name="out" if out_form != "none" else None)


CASES_BIAS = {name: (lambda fuzz, rng, seed, name=name: case_bias(fuzz, rng, seed, name)) for name in ("t5_bias", "alibi_bias", "kerple_bias", "relative_bias_vector")}


def case_logits(fuzz, rng, seed, fn):
    """``shaw_logits``, ``shaw_output``, ``deberta_logits`` (Toeplitz gather and scatter
    inside), ``axial_rope`` and ``expand_bias`` on hostile operands."""
    lib = str(rng.choice(["numpy", "torch"]))
    dtype = str(rng.choice(FLOATS))
    b, h, q, k = int(rng.choice([1, 2])), int(rng.choice([1, 3])), int(rng.choice([1, 2, 5])), int(rng.choice([1, 3, 6]))
    d = int(rng.choice([2, 4, 8]))
    K = int(rng.choice([1, 2, 4]))
    offset_given = rng.random() < 0.4
    out_form = str(rng.choice(["none", "none", "x", "window", "overlap", "broadcast", "readonly"])) if fn == "axial_rope" else "none"
    case = dict(fn=fn, lib=lib, dtype=dtype, b=b, h=h, q=q, k=k, d=d, K=K, out=out_form, seed=seed)

    def build(contiguous_ops=False):
        r = np.random.default_rng(seed)
        ops, kw = {}, {}
        if offset_given and fn != "axial_rope" and fn != "expand_bias":
            kw["offset"] = int(r.integers(-3, 8))
        if fn == "shaw_logits":
            ops["q"] = hostile(r, (b, h, q, d), dtype, lib)
            ops["k"] = hostile(r, (b, h, k, d), dtype, lib)
            ops["table"] = hostile(r, (2 * K + 1, d), dtype, lib)
            names, kw["max_distance"] = ("q", "k", "table"), K
            call = pe.shaw_logits
        elif fn == "shaw_output":
            ops["weights"] = hostile(r, (b, h, q, k), dtype, lib, values=lambda sh: _values(r, sh, dtype, lib, 0.3))
            ops["v"] = hostile(r, (b, h, k, d), dtype, lib)
            ops["table"] = hostile(r, (2 * K + 1, d), dtype, lib)
            names, kw["max_distance"] = ("weights", "v", "table"), K
            call = pe.shaw_output
        elif fn == "deberta_logits":
            ops["q"] = hostile(r, (b, h, q, d), dtype, lib)
            ops["k"] = hostile(r, (b, h, k, d), dtype, lib)
            ops["pos_q"] = hostile(r, (h, 2 * K, d), dtype, lib)
            ops["pos_k"] = hostile(r, (h, 2 * K, d), dtype, lib)
            names, kw["max_distance"] = ("q", "k", "pos_q", "pos_k"), K
            call = pe.deberta_logits
        elif fn == "expand_bias":
            ops["vec"] = hostile(r, (h, max(q + k - 1, 0)), dtype, lib)
            names = ("vec",)
            call = lambda vec, **o: pe.expand_bias(vec, q, k, **o)  # noqa: E731
        else:  # axial_rope: tokens on a 2-D grid
            gh, gw = int(r.integers(1, 3)), int(r.integers(1, 3))
            ops.update(x_and_out(r, lib, dtype, (b, h, gh * gw, 4 * d), out_form))
            grid = np.stack(np.meshgrid(np.arange(gh), np.arange(gw), indexing="ij"), -1).reshape(-1, 2)
            kw["_grid"] = as_lib(grid, lib)
            names = ("x",)
            call = lambda x, _grid, **o: pe.axial_rope(x, _grid, **o)  # noqa: E731
        ops = finish_ops(ops, contiguous_ops)
        if out_form not in ("none",) and fn == "axial_rope":
            kw["out"] = ops["x"].view if out_form == "x" else ops["out"].view
        args = tuple(ops[n].view for n in names)
        return (lambda: call(*args, **kw)), ops

    magnitude = 30.0 * d if fn != "axial_rope" and fn != "expand_bias" else 4.5
    fuzz.check(fn, case, build, magnitude=magnitude, exact=fn == "expand_bias", same_layout_bits=fn in ("expand_bias", "axial_rope"),
               out_name=("x" if out_form == "x" else "out" if out_form != "none" else None), warm=True)


CASES_LOGITS = {name: (lambda fuzz, rng, seed, name=name: case_logits(fuzz, rng, seed, name)) for name in ("shaw_logits", "shaw_output", "deberta_logits", "expand_bias", "axial_rope")}


# ---------------------------------------------------------------- kernels through the registry (CPU, CUDA simulator)


def _kernel(name):
    (found,) = [k for k in _dispatch.kernels() if k.name == name]
    return found


def simulator():
    return os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"


def device_copy(a):
    """A simulated device copy of host array ``a`` with ``a``'s (non-negative) strides."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
    from kernel_samples import _device_copy

    return _device_copy(a, "numba")


def check_kernel(fuzz, fn, case, draw, op, target, *, exact, tol_dtype=None):
    """``draw(rng)`` gives ``(args, kwargs, out)``: host operands (NumPy views, maybe hostile)
    of kernel op ``op``, ``out`` the Made of ``kwargs["out"]`` or None. The kernel (``target``:
    ``"numba_cpu"``, ``"numba_cuda"`` on device copies) must give the reference's numbers, the
    same bits on C-contiguous copies, and write nothing outside ``out``."""
    fuzz.cases[fn] += 1
    kernel = _kernel(f"{op}.{target}")
    reference = _dispatch.references()[op]
    impl = kernel.load()
    seed = case["seed"]

    def run(contiguous_ops, which):
        args, kwargs, out = draw(np.random.default_rng(seed))
        if contiguous_ops:
            args = [contiguous(a) if isinstance(a, np.ndarray) else a for a in args]
            if out is not None:
                kwargs["out"] = contiguous(out.view)
                out = Made(kwargs["out"], kwargs["out"], "contiguous")
        if which == "reference":
            return attempt(lambda: reference(*args, **kwargs), "reference"), out, None
        if target == "numba_cuda":
            dev = {id(a): device_copy(a) for a in [*args, *kwargs.values()] if isinstance(a, np.ndarray)}
            d_args = [dev.get(id(a), a) for a in args]
            d_kwargs = {k: dev.get(id(v), v) for k, v in kwargs.items()}
            if not kernel.accepts_call(*d_args, **d_kwargs):
                return None, out, None
            o = attempt(lambda: impl(*d_args, **d_kwargs), "auto")
            if o.value is not None:
                o.value = o.value.copy_to_host()
            return o, out, None
        if not kernel.accepts_call(*args, **kwargs):
            return None, out, None
        before = snapshot(out.buffer) if out is not None else None
        return attempt(lambda: impl(*args, **kwargs), "auto"), out, before

    ref, _, _ = run(False, "reference")
    ker, out, before = run(False, "kernel")
    if ker is None:
        fuzz.ends[fn]["not accepted"] += 1
        return
    if not fuzz.outcomes_agree(fn, case, ref, ker):
        return
    if ker.error:
        fuzz.ends[fn]["refused"] += 1
        fuzz.refusals[fn][ker.error[:70]] += 1
        return
    got, want = ker.value, ref.value
    if op == "toeplitz_scatter" and (dtype_of(got), dtype_of(want)) == ("bfloat16", "float32"):
        fuzz.ends[fn]["reference float32 (NumPy bfloat16 matmul)"] += 1  # internal: the public callers cast
        want = want.astype(BF16)
    if tuple(got.shape) != tuple(want.shape) or dtype_of(got) != dtype_of(want):
        fuzz.defect(fn, f"result kind differs: {dtype_of(got)} {tuple(got.shape)} / {dtype_of(want)} {tuple(want.shape)}", case)
        return
    g, w = to64(got), to64(want)
    if exact:
        ok = (g == w) | (np.isnan(g) & np.isnan(w))
    else:
        d = tol_dtype or dtype_of(want)
        ok = (g == w) | (np.isnan(g) & np.isnan(w)) | (np.abs(g - w) <= EPS[d] * (4 * np.abs(w) + 8 * case.get("magnitude", 4.5)))
    if not ok.all():
        k = tuple(np.argwhere(~ok)[0])
        fuzz.defect(fn, f"kernel != reference: at {k} {g[k]!r} vs {w[k]!r}", case)
        return
    if out is not None and before is not None:
        after = snapshot(out.buffer)
        outside = ~out.covered()
        if not np.array_equal(after[outside], before[outside]):
            fuzz.defect(fn, f"wrote outside out ({out.kind})", case)
            return
    again, _, _ = run(True, "kernel")
    if again is None or again.error or again.crash or not same_bits(again.value, got):
        fuzz.defect(fn, "result depends on layout (C-contiguous copy differs)", case)
        return
    fuzz.ends[fn]["ok"] += 1


def _host_view(rng, shape, dtype, target, values=None):
    allow = ("transpose", "slice", "broadcast") if target == "numba_cuda" else ("transpose", "slice", "negative", "unaligned", "swapped", "broadcast")
    return hostile(rng, shape, dtype, "numpy", values=values, allow=allow)


def case_toeplitz(fuzz, rng, seed, op, target):
    dtype = str(rng.choice(FLOATS))
    q, k = int(rng.choice(LENGTHS)), int(rng.choice(LENGTHS))
    lead = tuple(int(rng.choice([1, 2, 3])) for _ in range(int(rng.integers(0, 3))))
    idx_dtype = str(rng.choice(["int8", "uint8", "int16", "int32", "int64", "uint64"]))
    m = int(rng.choice([1, 3, 9]))
    with_out = rng.random() < 0.4
    case = dict(op=op, target=target, dtype=dtype, q=q, k=k, lead=lead, index=idx_dtype, m=m, out=with_out, seed=seed)
    n = max(q + k - 1, 0)

    def draw(r):
        if op == "toeplitz_expand":
            vec = _host_view(r, (*lead, n), dtype, target)
            shape, args = (*lead, q, k), [vec.view, q, k]
        else:
            width = k if op == "toeplitz_gather" else m
            cols = r.integers(0, 9 if op == "toeplitz_gather" else m, n)
            if op == "toeplitz_gather":
                values = _host_view(r, (*lead, q, 9), dtype, target)
                index = np.clip(cols, 0, 8).astype(idx_dtype)
            else:
                values = _host_view(r, (*lead, q, k), dtype, target)
                index = cols.astype(idx_dtype)
            shape, args = (*lead, q, width), [values.view, index, k if op == "toeplitz_gather" else m]
        kwargs, out = {}, None
        if with_out:
            allow = ("transpose", "slice") if target == "numba_cuda" else ("transpose", "slice", "negative", "unaligned")
            out = hostile(r, shape, dtype, "numpy", allow=allow)
            kwargs["out"] = out.view
        return args, kwargs, out

    exact = op != "toeplitz_scatter"
    check_kernel(fuzz, f"{op}.{target}", case, draw, op, target, exact=exact, tol_dtype=None if exact else ("float32" if dtype in ("float16", "bfloat16") else dtype))


def case_rope_kernel(fuzz, rng, seed, op, target):
    dtype = str(rng.choice(FLOATS))
    ndim = int(rng.integers(1, 5))
    dim = int(rng.choice([2, 4, 6, 8, 18, 34]))
    shape = draw_shape(rng, ndim, dim)
    layout = str(rng.choice(["half", "interleaved"]))
    half = int(rng.integers(1, dim // 2 + 1))
    pdtype = str(rng.choice([d for d in POSITION_DTYPES if d != "bool"]))
    out_form = str(rng.choice(["none", "x", "window"]))
    inverse = bool(rng.random() < 0.3)
    scale = float(rng.choice([1.0, 1.0, 0.7]))
    case = dict(op=op, target=target, dtype=dtype, shape=shape, layout=layout, half=half, positions=pdtype, out=out_form, seed=seed, magnitude=4.5)

    def draw(r):
        x = _host_view(r, shape, dtype, target)
        kwargs = dict(layout=layout)
        if op == "rope_rotate":
            pshape = shape[:-1][int(r.integers(0, len(shape))):] if len(shape) > 1 else ()
            pshape = tuple(1 if r.random() < 0.3 else n for n in pshape)
            pos = position_values(r, pdtype, pshape)
            pm = _host_view(r, pshape, pdtype, target, values=lambda s: np.resize(pos, s).astype(pos.dtype) if s != pshape else pos)
            inv_freq = 10000.0 ** (-np.arange(half) / half) * float(r.choice([1.0, 3.0]))
            args = [x.view, pm.view, inv_freq]
            kwargs.update(inverse=inverse, scale=scale)
        else:
            rotary = 2 * half
            cshape = shape[:-1][int(r.integers(0, len(shape))):] + (rotary,)
            angles = r.uniform(-1e4, 1e4, cshape[:-1] + (half,))
            full = np.concatenate([angles, angles], -1) if layout == "half" else np.repeat(angles, 2, -1)
            c = _host_view(r, cshape, dtype, target, values=lambda s: np.resize(np.cos(full), s).astype(np_dtype(dtype)))
            sn = _host_view(r, cshape, dtype, target, values=lambda s: np.resize(np.sin(full), s).astype(np_dtype(dtype)))
            args = [x.view, c.view, sn.view]
        out = None
        if out_form == "x":
            if isinstance(x.view, np.ndarray) and x.view.flags.writeable and not _overlapping(x.view):
                kwargs["out"] = x.view
                out = x
        elif out_form == "window":
            allow = ("transpose", "slice") if target == "numba_cuda" else ("transpose", "slice", "negative", "unaligned")
            out = hostile(r, shape, dtype, "numpy", allow=allow)
            kwargs["out"] = out.view
        return args, kwargs, out

    check_kernel(fuzz, f"{op}.{target}", case, draw, op, target, exact=False)


def _overlapping(a):
    from posenc._validate import self_overlapping

    return self_overlapping(a.shape, a.strides, a.itemsize)


def case_rope_ulps(fuzz, rng, seed, target):
    """``rope_rotate``'s kernel against the float64 formula, by the documented bounds: 16-bit
    results within one ulp of it where ``a cos - b sin`` cancels by fewer than 24 bits (2**-20
    here), float32 within one ulp, float64 within 4 ulps of ``|a| + |b|``."""
    fn = f"rope_rotate.{target} ulps"
    fuzz.cases[fn] += 1
    dtype = str(rng.choice(FLOATS))
    n, half = int(rng.integers(1, 40)), int(rng.integers(1, 9))
    layout = str(rng.choice(["half", "interleaved"]))
    scale = float(rng.choice([1.0, 0.7, 1.3]))
    pos_kind = str(rng.choice(["small", "large", "float"]))
    x = (rng.standard_normal((n, 2 * half)) * 10.0 ** rng.uniform(-3, 3, (n, 1))).astype(np_dtype(dtype))
    pos = {"small": rng.integers(0, 4096, n), "large": rng.integers(0, 2**31, n), "float": rng.uniform(-1e5, 1e5, n)}[pos_kind]
    inv_freq = 10000.0 ** (-np.arange(half) / half)
    kernel = _kernel(f"rope_rotate.{target}").load()
    inverse = bool(rng.random() < 0.3)
    if target == "numba_cuda":
        got = kernel(device_copy(x), device_copy(pos), inv_freq, layout=layout, inverse=inverse, scale=scale).copy_to_host()
    else:
        got = kernel(x, pos, inv_freq, layout=layout, inverse=inverse, scale=scale)
    x64 = x.astype(np.float64)
    angle = pos.astype(np.float64)[:, None] * inv_freq[None, :]
    c, sn = np.cos(angle) * scale, np.sin(angle) * scale * (-1 if inverse else 1)
    a, b = (x64[:, :half], x64[:, half:]) if layout == "half" else (x64[:, 0::2], x64[:, 1::2])
    ra, rb = a * c - b * sn, b * c + a * sn
    g = got.astype(np.float64)
    ga, gb = (g[:, :half], g[:, half:]) if layout == "half" else (g[:, 0::2], g[:, 1::2])
    size = (np.abs(a) + np.abs(b)) * scale
    eps = EPS[dtype]
    tiny = {"float16": 2.0**-24, "bfloat16": 2.0**-133, "float32": 2.0**-149, "float64": 2.0**-1074}[dtype]
    for got_part, want in ((ga, ra), (gb, rb)):
        ulp = eps * 2.0 ** np.floor(np.log2(np.maximum(np.abs(want), tiny / eps)))
        if dtype == "float64":
            ok = np.abs(got_part - want) <= 4 * eps * size
        else:
            bound = ulp + (8 * 2.0**-52 * size if dtype == "float32" else 0)
            ok = (np.abs(got_part - want) <= bound) | (np.abs(want) < 2.0**-20 * size) | ~np.isfinite(want)
        if not ok.all():
            k = tuple(np.argwhere(~ok)[0])
            fuzz.defect(fn, f"beyond the documented bound: at {k} kernel {got_part[k]!r} float64 {want[k]!r} ({dtype}, |a|+|b| {size[k]!r})",
                        dict(dtype=dtype, n=n, half=half, layout=layout, scale=scale, positions=pos_kind, inverse=inverse, seed=seed))
            return
    fuzz.ends[fn]["ok"] += 1


KERNEL_CASES = {}
for _target in ("numba_cpu", "numba_cuda"):
    for _op in ("toeplitz_expand", "toeplitz_gather", "toeplitz_scatter"):
        KERNEL_CASES[f"{_op}.{_target}"] = lambda fuzz, rng, seed, op=_op, target=_target: case_toeplitz(fuzz, rng, seed, op, target)
    KERNEL_CASES[f"rope_rotate.{_target} ulps"] = lambda fuzz, rng, seed, target=_target: case_rope_ulps(fuzz, rng, seed, target)
    for _op in ("rope_rotate", "rope_apply"):
        KERNEL_CASES[f"{_op}.{_target}"] = lambda fuzz, rng, seed, op=_op, target=_target: case_rope_kernel(fuzz, rng, seed, op, target)


CASES = {"rope": case_rope, "apply_rope": case_apply_rope, "rerotate": case_rerotate, "rotate_pair": case_rotate_pair, "rope per-row": case_rope_rows, **CASES_BIAS, **CASES_LOGITS, **KERNEL_CASES}


def main(argv):
    n = int(argv[0]) if argv else 200
    seed = int(argv[1]) if len(argv) > 1 else 0
    names = argv[2:] or [name for name in CASES if simulator() == ("numba_cuda" in name)]
    fuzz = Fuzz()
    master = np.random.default_rng(seed)
    for name in names:
        for _ in range(n):
            s = int(master.integers(2**31))
            CASES[name](fuzz, np.random.default_rng(s), s)
    fuzz.report()


if __name__ == "__main__":
    main(sys.argv[1:])
