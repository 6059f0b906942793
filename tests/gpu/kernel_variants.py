"""An A/B of variants of the CUDA rotation kernel (``rope_cuda``) against the kernel as built.

Usage (``tests/gpu/lease.sh variants``): ``PYTHONPATH=src python tests/gpu/kernel_variants.py``
(torch with CUDA, numba-cuda). A variant is ``rope_cuda``'s source with a few textual edits
(``VARIANTS``), loaded as a module of its own from a temporary folder (``load``), so the
product and its variants run in one process on one machine. Each variant's results are
first compared bit for bit with the product's (``CALLS``: 16-bit rotations with positions
up to 8.2 million, tables, the Hugging Face q+k pair, float32), then every call is timed in
place in interleaved rounds, the best of each kept: device time per call
(``_bench_gpu.device_timings``) as a fraction of ``Tensor.copy_``'s for the same bytes.

The kernel of 1ac9125 was chosen this way from 435cba7's (docs/benchmarks.md, "A/B on an
H200, 2026-11-28"); the variants here are the choices it left open: two or four threads a
pair for 16-bit elements where it takes one, ``rope_apply`` reading its tables before its
first eight heads, and 16-bit elements in words of four channels.
"""

from __future__ import annotations

import importlib.util
import sys
import tempfile
import time
import traceback
from pathlib import Path

from posenc._kernels import rope_cuda

_SPLIT = "    by = 2 if split and heads > 1 and 2 * bx <= _THREADS else 1\n"
VARIANTS = {
    "two threads a pair": [(_SPLIT, "    by = 2 if heads > 1 and 2 * bx <= _THREADS else 1\n")],
    "four threads a pair (16-bit)": [(_SPLIT, "    by = (2 if split else 4) if heads > 1 and 4 * bx <= _THREADS else 1\n")],
    "tables first": [("    early = words and not (floats or rotate)\n", "    early = False\n")],
    # 16-bit elements in uint64 words of four channels, four heads loaded at once (the same
    # bytes in flight as eight in words of two): 12e4bac's words of four, taken out when they
    # lost to words of two (0.79 against 0.84 of copy) with two threads a pair and cos and
    # sin apart; the probe's walk in them reached 0.94 against 0.90.
    "words of four": [
        (
            "    elif isinstance(a, np.uint64):\n        _pair_float32_words(",
            "    elif len(ch) == 4:\n        _pair16_wide(out, oa, ob, a, b, ch, cl, sh, sl, storage)\n"
            "    elif isinstance(a, np.uint64):\n        _pair_float32_words(",
        ),
        (
            "    if a == types.uint64:\n",
            "    if len(ch) == 4 and a == types.uint64:\n"
            "        return lambda out, oa, ob, a, b, ch, cl, sh, sl, storage: _pair16_wide(out, oa, ob, a, b, ch, cl, sh, sl, storage)\n"
            "    if a == types.uint64:\n",
        ),
        (
            "@_family.cached(cuda.jit, device=True)\ndef _finite(v):",
            "@_family.cached(cuda.jit, device=True)\n"
            "def _pair16_wide(out, oa, ob, a, b, ch, cl, sh, sl, storage):\n"
            "    low, high = np.uint64(0xFFFFFFFF), np.uint64(32)\n"
            "    la, lb = _rotated16_words(np.uint32(a & low), np.uint32(b & low), ch[0], ch[1], cl[0], cl[1], sh[0], sh[1], sl[0], sl[1], storage)\n"
            "    ha, hb = _rotated16_words(np.uint32(a >> high), np.uint32(b >> high), ch[2], ch[3], cl[2], cl[3], sh[2], sh[3], sl[2], sl[3], storage)\n"
            "    _put(out, oa, np.uint64(la) | (np.uint64(ha) << high))\n"
            "    _put(out, ob, np.uint64(lb) | (np.uint64(hb) << high))\n\n\n"
            "@_family.cached(cuda.jit, device=True)\ndef _finite(v):",
        ),
        (
            "    words, eight = channels > 1, not floats\n    early = words and not (floats or rotate)\n",
            "    words, wide = channels > 1, channels == 4\n    eight = not floats and not wide\n    early = words and not (floats or rotate or wide)\n",
        ),
        (
            "            skip = 0\n            if words:\n",
            "            skip = 0\n"
            "            if wide:\n"
            "                c0, s0 = _cos_sin(rotate, 4 * j, position, inv_freq, sign, scale, cos, ci, cg, sin, si, sg, storage)\n"
            "                c1, s1 = _cos_sin(rotate, 4 * j + 1, position, inv_freq, sign, scale, cos, ci, cg, sin, si, sg, storage)\n"
            "                c2, s2 = _cos_sin(rotate, 4 * j + 2, position, inv_freq, sign, scale, cos, ci, cg, sin, si, sg, storage)\n"
            "                c3, s3 = _cos_sin(rotate, 4 * j + 3, position, inv_freq, sign, scale, cos, ci, cg, sin, si, sg, storage)\n"
            "                ch0, cl0 = _split(c0, storage)\n                ch1, cl1 = _split(c1, storage)\n"
            "                ch2, cl2 = _split(c2, storage)\n                ch3, cl3 = _split(c3, storage)\n"
            "                sh0, sl0 = _split(s0, storage)\n                sh1, sl1 = _split(s1, storage)\n"
            "                sh2, sl2 = _split(s2, storage)\n                sh3, sl3 = _split(s3, storage)\n"
            "                ch, cl, sh, sl = (ch0, ch1, ch2, ch3), (cl0, cl1, cl2, cl3), (sh0, sh1, sh2, sh3), (sl0, sl1, sl2, sl3)\n"
            "                ia, ib = j, j + half\n"
            "            elif words:\n",
        ),
        (
            '    "float16": [(WORDS_LAYOUT, np.dtype(np.uint32))],\n    "bfloat16": [(WORDS_LAYOUT, np.dtype(np.uint32))],\n',
            '    "float16": [("half, words of four", np.dtype(np.uint64)), (WORDS_LAYOUT, np.dtype(np.uint32))],\n'
            '    "bfloat16": [("half, words of four", np.dtype(np.uint64)), (WORDS_LAYOUT, np.dtype(np.uint32))],\n',
        ),
    ],
}
_FOLDER = tempfile.mkdtemp(prefix="posenc-variants-")


def source(name):
    """``rope_cuda``'s source with variant ``name``'s edits, its kernel family renamed."""
    text = Path(rope_cuda.__file__).read_text()
    for old, new in VARIANTS[name] + [('    "rope_cuda",\n    _build,', f'    "rope_cuda {name}",\n    _build,')]:
        if text.count(old) != 1:
            raise ValueError(f"variant {name!r}: {old!r} is not in rope_cuda's source once")
        text = text.replace(old, new)
    return text


def load(name):
    """Variant ``name`` as a module of ``posenc._kernels`` (its relative imports resolve there)."""
    module_name = f"posenc._kernels.rope_cuda_{''.join(c if c.isalnum() else '_' for c in name)}"
    path = Path(_FOLDER) / f"{module_name.rsplit('.', 1)[1]}.py"
    path.write_text(source(name))
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


def main():
    import numpy as np
    import torch

    import posenc as pe
    from posenc import _bench_gpu

    sys.path.insert(0, str(Path(__file__).parent))
    from device_figures import _unit_tables

    timer = _bench_gpu.device_timings(torch)
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    modules = {"as built": rope_cuda}
    for name in VARIANTS:
        try:
            modules[name] = load(name)
        except Exception:  # noqa: BLE001 (reported; the other variants still run)
            traceback.print_exc()

    inv_freq, _ = pe.rope_frequencies(128)
    pos, far = torch.arange(8192, device="cuda"), torch.arange(8192, device="cuda") * 997 + 10**6
    xb = torch.randn(4, 32, 8192, 128, device="cuda").to(torch.bfloat16)
    xf = torch.randn(4, 32, 8192, 128, device="cuda")
    cos, sin = _unit_tables(torch, (8192,), torch.bfloat16)
    q = torch.randn(4, 4096, 32, 128, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    k = torch.randn(4, 4096, 8, 128, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    hc, hs = _unit_tables(torch, (4, 4096), torch.bfloat16)
    calls = {  # name: (copy anchor, call of module m with out (None: a new result))
        "rope bfloat16": ("bfloat16", lambda m, out: m.rotate_positions(xb, pos, inv_freq, out=out)),
        "rope bfloat16, far positions": (None, lambda m, out: m.rotate_positions(xb, far, inv_freq, out=out)),
        "apply_rope bfloat16": ("bfloat16", lambda m, out: m.rotate_cos_sin(xb, cos, sin, out=out)),
        "HF q+k bfloat16": ("pair", lambda m, out: m.rotate_cos_sin_pair(q, k, hc[:, None], hs[:, None], out_q=None if out is None else q, out_k=None if out is None else k)),
        "rope float32": ("float32", lambda m, out: m.rotate_positions(xf, pos, inv_freq, out=out)),
    }
    inputs = {"rope bfloat16": xb, "apply_rope bfloat16": xb, "HF q+k bfloat16": q, "rope float32": xf}

    started, wanted = time.perf_counter(), {}
    for name, module in list(modules.items()):
        for call, (_, fn) in calls.items():
            try:
                got = fn(module, None)
            except Exception:  # noqa: BLE001
                traceback.print_exc()
                modules.pop(name)
                break
            got = [t.view(torch.int16 if t.dtype == torch.bfloat16 else torch.int32) for t in (got if isinstance(got, tuple) else (got,))]
            if module is rope_cuda:
                wanted[call] = got
            else:
                print(f"bits {name} | {call}: {'the same' if all(torch.equal(a, b) for a, b in zip(got, wanted[call])) else 'DIFFERENT'}", flush=True)
    print(f"compiled and compared in {time.perf_counter() - started:.1f} s", flush=True)
    del wanted
    torch.cuda.empty_cache()

    sources = {"bfloat16": xb, "float32": xf, "pair": torch.empty(q.numel() + k.numel(), device="cuda", dtype=torch.bfloat16)}
    copies = {key: (lambda a=a, b=torch.empty_like(a): b.copy_(a)) for key, a in sources.items()}
    best = {}
    for _ in range(4):
        for key, fn in copies.items():
            best[key] = min(best.get(key, np.inf), timer(fn, 3, 10)[0])
        for name, module in modules.items():
            for call, (anchor, fn) in calls.items():
                if anchor is not None:
                    best[name, call] = min(best.get((name, call), np.inf), timer(lambda: fn(module, inputs[call]), 3, 10)[0])
    for call, (anchor, _) in calls.items():
        if anchor is not None:
            row = " | ".join(f"{name} {best[name, call] * 1e3:.4f} ({best[anchor] / best[name, call]:.3f})" for name in modules)
            print(f"{call} in place, ms (of copy): copy_ {best[anchor] * 1e3:.4f} | {row}", flush=True)


if __name__ == "__main__":
    main()
