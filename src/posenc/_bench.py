"""``posenc bench``: each hot operation beside the plain formula, timed on this machine.

Every row is the best of ``repeat`` runs after a warm-up call (Numba compiles on the first
call, which is never timed). GB/s counts the bytes an ideal implementation must move (read
``x`` and write the result for the rotation; write the bias for the biases); "of copy" is
that rate over the rate of ``np.copyto`` (rotation) or ``ndarray.fill`` (biases) on buffers
of the same size, the machine's practical memory bandwidth.
"""

from __future__ import annotations

import importlib.util
import math
import sys
import time
from dataclasses import dataclass

import numpy as np

import posenc as pe


@dataclass
class Row:
    op: str
    impl: str
    seconds: float
    nbytes: int
    baseline: str
    plain: float | None = None
    bandwidth: float | None = None

    def cells(self):
        rate = self.nbytes / self.seconds / 1e9
        frac = f"{rate / (self.bandwidth / 1e9):.2f}" if self.bandwidth else ""
        speed = f"{self.plain / self.seconds:.1f}x" if self.plain else ""
        return [self.op, self.impl, f"{self.seconds * 1e3:.2f}", f"{rate:.1f}", frac, speed]


def best(fn, repeat):
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def rotate_half_formula(x, cos, sin):
    half = x.shape[-1] // 2
    rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rotated * sin


def rope_rows(shape, repeat, progress):
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape, dtype=np.float32)
    buf = np.empty_like(x)
    seq, dim = shape[-2], shape[-1]
    inv_freq, _ = pe.rope_frequencies(dim)
    cos, sin = (a.astype(np.float32) for a in pe.rope_cos_sin(np.arange(seq), inv_freq))
    nbytes = 2 * x.nbytes
    copy = nbytes / best(lambda: np.copyto(buf, x), repeat)
    op = f"rope {list(shape)} f32"
    cases = [
        ("numpy plain formula", lambda: rotate_half_formula(x, cos, sin)),
        ("posenc rope", lambda: pe.rope(x)),
        ("posenc rope out=", lambda: pe.rope(x, out=buf)),
        ("posenc rope in place", lambda: pe.rope(buf, out=buf)),
        ("posenc reference", lambda: _reference(lambda: pe.rope(x))),
        ("np.copyto (bandwidth)", lambda: np.copyto(buf, x)),
    ]
    if importlib.util.find_spec("torch") is not None:
        import torch

        tx, tc, ts = (torch.from_numpy(a) for a in (x, cos, sin))

        def torch_eager():
            half = dim // 2
            return tx * tc + torch.cat([-tx[..., half:], tx[..., :half]], dim=-1) * ts

        cases.insert(1, ("torch eager formula", torch_eager))
        cases.insert(5, ("posenc rope (torch bf16)", lambda b=tx.to(torch.bfloat16): pe.rope(b)))
    return _measure(op, cases, nbytes, copy, "numpy plain formula", repeat, progress)


def t5_rows(heads, length, repeat, progress):
    table = np.random.default_rng(1).standard_normal((32, heads)).astype(np.float32)
    out = np.empty((heads, length, length), dtype=np.float32)
    nbytes = out.nbytes
    fill = nbytes / best(lambda: out.fill(1.0), repeat)
    op = f"t5_bias h={heads} L={length} f32"
    cases = [
        ("numpy plain formula", lambda: np.transpose(table[pe.t5_bucket(pe.relative_positions(length, length))], (2, 0, 1)).copy()),
        ("posenc t5_bias", lambda: pe.t5_bias(table, length, length)),
        ("posenc t5_bias out=", lambda: pe.t5_bias(table, length, length, out=out)),
        ("posenc reference", lambda: _reference(lambda: pe.t5_bias(table, length, length))),
        ("ndarray.fill (bandwidth)", lambda: out.fill(1.0)),
    ]
    if importlib.util.find_spec("torch") is not None:
        cases.insert(1, ("torch T5 original", _torch_t5(table, length)))
    return _measure(op, cases, nbytes, fill, "numpy plain formula", repeat, progress)


def t5_bucket_torch(torch, relative_position, num_buckets=32, max_distance=128):
    """T5's bidirectional bucket of ``relative_position = key - query``, as its code computes it."""
    num_buckets //= 2
    buckets = (relative_position > 0).to(torch.long) * num_buckets
    relative_position = torch.abs(relative_position)
    max_exact = num_buckets // 2
    is_small = relative_position < max_exact
    large = max_exact + (
        torch.log(relative_position.float() / max_exact) / math.log(max_distance / max_exact) * (num_buckets - max_exact)
    ).to(torch.long)
    large = torch.min(large, torch.full_like(large, num_buckets - 1))
    return buckets + torch.where(is_small, relative_position, large)


def t5_original_torch(torch, embedding, q_len, k_len):
    """T5's ``compute_bias``: bucket the ``[q, k]`` matrix, look up, permute to ``[heads, q, k]``."""
    context = torch.arange(q_len, dtype=torch.long)[:, None]
    memory = torch.arange(k_len, dtype=torch.long)[None, :]
    return embedding(t5_bucket_torch(torch, memory - context)).permute(2, 0, 1).contiguous()


def _torch_t5(table, length):
    import torch

    embedding = torch.nn.Embedding.from_pretrained(torch.from_numpy(table))
    return lambda: t5_original_torch(torch, embedding, length, length)


def alibi_rows(heads, length, repeat, progress):
    slopes = pe.alibi_slopes(heads)
    out = np.empty((heads, length, length), dtype=np.float32)
    fill = out.nbytes / best(lambda: out.fill(1.0), repeat)
    rel = pe.relative_positions(length, length)
    cases = [
        ("numpy plain formula", lambda: -slopes[:, None, None] * rel),
        ("posenc alibi_bias", lambda: pe.alibi_bias(slopes, length, length)),
        ("posenc alibi_bias out=", lambda: pe.alibi_bias(slopes, length, length, out=out)),
        ("ndarray.fill (bandwidth)", lambda: out.fill(1.0)),
    ]
    return _measure(f"alibi_bias h={heads} L={length} f32", cases, out.nbytes, fill, "numpy plain formula", repeat, progress)


def _reference(fn):
    with pe.use_backend("reference"):
        return fn()


def _measure(op, cases, nbytes, bandwidth, plain_name, repeat, progress):
    rows = []
    for impl, fn in cases:
        progress(f"  {op}: {impl} ...")
        rows.append(Row(op, impl, best(fn, repeat), nbytes, "", bandwidth=bandwidth))
    plain = next(r.seconds for r in rows if r.impl == plain_name)
    for r in rows:
        r.plain = plain
    return rows


def table(rows) -> str:
    header = ["operation", "implementation", "ms", "GB/s", "of copy", "vs plain"]
    body = [r.cells() for r in rows]
    widths = [max(len(str(c)) for c in col) for col in zip(header, *body)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths)), "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(cells, widths)) for cells in body]
    return "\n".join(lines)


def run(quick: bool = False, progress=lambda s: print(s, file=sys.stderr, flush=True)) -> str:
    repeat = 3 if quick else 7
    rows = []
    rope_shapes = [(1, 32, 1024, 128)] if quick else [(1, 32, 8192, 128), (4, 32, 8192, 128)]
    for shape in rope_shapes:
        rows += rope_rows(shape, repeat, progress)
    for length in [512] if quick else [512, 2048, 4096]:
        rows += t5_rows(16, length, repeat, progress)
    rows += alibi_rows(16, 512 if quick else 2048, repeat, progress)
    return table(rows)
