"""The device-time figures of docs/benchmarks.md ("On a GPU"), on a CUDA GPU.

Usage: ``PYTHONPATH=src python tests/gpu/device_figures.py`` (torch with CUDA, numba-cuda;
Liger-Kernel for its row where installed). Prints, for the issue-30 goal table:

* a decode step ``pe.rope`` on ``[1, 32, 1, 128]`` with its position on the device: whether
  its planned calls stay off the full path (``rope_cuda.rotation``) and equal it bit for bit,
  then the wall time per call over 300 calls back to back, beside the eager torch formula
  (and ``apply_rope`` of given tables, planned likewise); the same for a decode step of
  the Hugging Face drop-in's ``apply_rotary_pos_emb`` (q ``[1, 32, 1, 128]`` and k
  ``[1, 8, 1, 128]`` bfloat16 views), beside transformers' formula on q and k;
* ``rope`` / ``apply_rope`` ``[4, 32, 8192, 128]`` float32 and bfloat16, in place and
  allocating; Hugging Face's q ``[4, 32, 4096, 128]`` + k ``[4, 8, 4096, 128]`` bfloat16
  views rotated in place in one launch, beside Liger-Kernel's; ``t5_bias`` and
  ``alibi_bias`` of 16 x 8192 x 8192 float32 into ``out=`` (and ``expand_bias`` of T5's
  per-distance vector made beforehand, the expansion alone): the device's time per call
  (``_bench_gpu.device_timings``: CUDA events around 10 calls, 5 for the biases, enqueued
  behind a device-side wait so that they run back to back; best of 5), its fraction of
  ``Tensor.copy_`` (``fill_`` for the biases) of the same bytes, and for ``rope`` in place
  and the HF pair the host's time to enqueue a call (which the device time leaves out);
* ``toeplitz_scatter`` of 16 x 4096 x 4096 float32 weights, Shaw's and DeBERTa's classes, beside
  a sum over the keys (``_scatter_rows``);
* ``pe.rope`` of CuPy float32 and float16 arrays beside ``cupy.copyto`` (``_cupy_rows``), an
  A/B of the rotation's block shape (``_block_shapes``), one of the block of short rows
  (``_short_rows``) and one of memory order, a row's heads apart or adjacent (``_layouts``);
* ``pe.rope`` of a JAX GPU array under ``jax.jit``, calls dispatched back to back, beside
  XLA's negation of the same array, torch's ``Tensor.copy_`` and the plain ``jnp`` formula
  under ``jit`` (``_jax_row``).
"""

from __future__ import annotations

import time


def main():
    import torch

    import posenc as pe
    from posenc import _bench_gpu
    from posenc._kernels import rope_cuda

    timer = _bench_gpu.device_timings(torch)

    def gpu_ms(fn, n=10, reps=5):
        return timer(fn, reps, n)[0] * 1e3

    def host_ms(fn, n=10):
        """The host's time to enqueue a call, the device kept busy meanwhile (no wait)."""
        fn()
        torch.cuda.synchronize()
        torch.cuda._sleep(10**9)  # (about half a second: longer than n calls' host work)
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        host = (time.perf_counter() - t0) / n * 1e3
        torch.cuda.synchronize()
        return host

    def wall_ms(fn, n=300):
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) / n * 1e3

    print(torch.cuda.get_device_name(), torch.__version__)
    xs, p1 = torch.randn(1, 32, 1, 128, device="cuda"), torch.tensor([4095], device="cuda")
    eager = _bench_gpu.decode_formula(torch, xs, p1)

    pe.rope.plans.clear()
    want = pe.rope(xs, p1)
    for _ in range(3):
        pe.rope(xs, p1)
    full, rotation = [], rope_cuda.rotation
    rope_cuda.rotation = lambda *a, **k: full.append(1) or rotation(*a, **k)
    got = [pe.rope(xs, p1) for _ in range(5)]
    rope_cuda.rotation = rotation
    print("decode: full-path calls of 5 planned:", len(full), "| planned equals full path bitwise:", all(torch.equal(g, want) for g in got))
    d, e = wall_ms(lambda: pe.rope(xs, p1)), wall_ms(eager)
    c1, s1 = torch.randn(1, 128, device="cuda"), torch.randn(1, 128, device="cuda")
    print(f"decode ms/call: pe.rope positions {d:.4f} | offset {wall_ms(lambda: pe.rope(xs, offset=4095)):.4f} | in place "
          f"{wall_ms(lambda: pe.rope(xs, p1, out=xs)):.4f} | apply_rope {wall_ms(lambda: pe.apply_rope(xs, c1, s1)):.4f} | "
          f"eager formula {e:.4f} | ratio {d / e:.2f}")  # fmt: skip

    from posenc import _oracles
    from posenc.rotary.apply import rotate_pair
    from posenc.torch.hf import apply_rotary_pos_emb

    qs = torch.randn(1, 1, 32, 128, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    ks = torch.randn(1, 1, 8, 128, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    cs, sn = (torch.randn(1, 1, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    pair = lambda: apply_rotary_pos_emb(qs, ks, cs, sn)  # noqa: E731
    hf_eager = lambda: (_oracles.hf_rope(torch, qs, cs[:, None], sn[:, None]), _oracles.hf_rope(torch, ks, cs[:, None], sn[:, None]))  # noqa: E731
    rotate_pair.plans.clear()
    want = pair()
    for _ in range(3):
        pair()
    full, pair_rotation = [], rope_cuda.pair_rotation
    rope_cuda.pair_rotation = lambda *a, **k: full.append(1) or pair_rotation(*a, **k)
    got = [pair() for _ in range(5)]
    rope_cuda.pair_rotation = pair_rotation
    same = all(torch.equal(g[0], want[0]) and torch.equal(g[1], want[1]) for g in got)
    print("HF apply_rotary_pos_emb decode: full-path calls of 5 planned:", len(full), "| planned equals full path bitwise:", same)
    d, e = wall_ms(pair), wall_ms(hf_eager)
    print(f"HF q [1,32,1,128] + k [1,8,1,128] bf16 decode ms/call: posenc {d:.4f} | HF's formula on q and k {e:.4f} | ratio {d / e:.2f}")

    shape, seq = (4, 32, 8192, 128), 8192
    pos = torch.arange(seq, device="cuda")
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(shape, device="cuda").to(dtype)
        y = torch.empty_like(x)
        copy = gpu_ms(lambda: y.copy_(x))
        inplace, alloc = gpu_ms(lambda: pe.rope(x, pos, out=x)), gpu_ms(lambda: pe.rope(x, pos))
        cos, sin = _unit_tables(torch, (seq,), dtype)
        apply = gpu_ms(lambda: pe.apply_rope(x, cos, sin, out=x))
        host = host_ms(lambda: pe.rope(x, pos, out=x))
        print(f"{dtype} {list(shape)} copy_ {copy:.3f} ms | rope in place {inplace:.3f} ({copy / inplace:.2f}) alloc {alloc:.3f} "
              f"({copy / alloc:.2f}) | apply_rope in place {apply:.3f} ({copy / apply:.2f}) | host ms/call of rope in place {host:.3f}")  # fmt: skip
        del x, y
        torch.cuda.empty_cache()

    q = torch.randn(4, 4096, 32, 128, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    k = torch.randn(4, 4096, 8, 128, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    cos, sin = _unit_tables(torch, (4, 4096), torch.bfloat16)
    source = torch.empty(q.numel() + k.numel(), device="cuda", dtype=torch.bfloat16)
    target = torch.empty_like(source)
    copy = gpu_ms(lambda: target.copy_(source))
    pair = lambda: rope_cuda.rotate_cos_sin_pair(q, k, cos[:, None], sin[:, None], out_q=q, out_k=k)  # noqa: E731
    ours, host = gpu_ms(pair), host_ms(pair)
    try:
        from liger_kernel.ops.rope import LigerRopeFunction

        liger = gpu_ms(lambda: LigerRopeFunction.apply(q, k, cos, sin))
    except ImportError:
        liger = float("nan")
    print(f"HF q+k bf16 in place: copy_ {copy:.3f} | posenc {ours:.3f} ({copy / ours:.2f}; host ms/call {host:.3f}) | Liger {liger:.3f} ({copy / liger:.2f})")

    heads, length = 16, 8192
    out = torch.empty(heads, length, length, device="cuda")
    fill = gpu_ms(lambda: out.fill_(1.0), n=5)
    table, slopes = torch.randn(32, heads, device="cuda"), torch.from_numpy(pe.alibi_slopes(heads)).cuda()
    vec = pe.relative_bias_vector("t5", table, length, length)  # (the expansion alone: what the vector's operations cost beside it)
    calls = (
        ("t5_bias", lambda: pe.t5_bias(table, length, length, out=out)),
        ("alibi_bias", lambda: pe.alibi_bias(slopes, length, length, out=out)),
        ("expand_bias of T5's vector", lambda: pe.expand_bias(vec, length, length, out=out)),
    )
    for name, call in calls:
        device = gpu_ms(call, n=5)
        print(f"16x8192^2 f32 {name} out=: {device:.3f} ({fill / device:.2f} of fill_ {fill:.3f})")
    del out, vec
    torch.cuda.empty_cache()
    _scatter_rows(torch, gpu_ms)
    _cupy_rows(torch, gpu_ms)
    _block_shapes(torch, gpu_ms)
    _short_rows(torch, gpu_ms)
    _layouts(torch, gpu_ms)
    _jax_row(torch, gpu_ms)


def _scatter_rows(torch, gpu_ms):
    """``toeplitz_scatter`` (Shaw's value term, the gradient of Shaw's and DeBERTa's scores) of
    16 x 4096 x 4096 float32 weights into Shaw's 257 clipped distances and DeBERTa's 512 log
    buckets, beside a sum over the keys (a read of the same bytes); the bits of two calls
    compared (its sums have a fixed order, no atomics)."""
    import numpy as np

    import posenc as pe
    from posenc._kernels import toeplitz_cuda

    heads, length = 16, 4096
    weights = torch.rand(heads, length, length, device="cuda")
    read = gpu_ms(lambda: weights.sum(dim=-1), n=5)
    distances = np.arange(2 * length - 1) - (length - 1)  # rel = i - j of entry t = i - j + k_len - 1
    for name, index, m in (
        ("Shaw K=128", np.clip(distances, -128, 128) + 128, 257),
        ("DeBERTa 256/512", np.clip(pe.deberta_bucket(distances), -255, 255) + 256, 512),
    ):
        index = torch.from_numpy(np.ascontiguousarray(index)).cuda()
        first = toeplitz_cuda.toeplitz_scatter(weights, index, m)
        same = torch.equal(first, toeplitz_cuda.toeplitz_scatter(weights, index, m))
        device = gpu_ms(lambda: toeplitz_cuda.toeplitz_scatter(weights, index, m), n=5)
        print(f"16x4096^2 f32 toeplitz_scatter {name}: {device:.3f} ({read / device:.2f} of a sum over the keys {read:.3f}); two calls' bits equal: {same}")
    del weights
    torch.cuda.empty_cache()


def _cupy_rows(torch, gpu_ms):
    """``pe.rope`` of CuPy arrays ``[4, 32, 8192, 128]`` float32 and float16 (CuPy has no
    bfloat16), in place and allocating, beside ``cupy.copyto`` of the same bytes (CuPy's
    default stream is torch's, which the device timer waits on)."""
    try:
        import cupy
    except ImportError:
        print("CuPy not installed: no CuPy rows")
        return
    import posenc as pe

    for dtype in ("float32", "float16"):
        x = cupy.asarray(torch.randn(4, 32, 8192, 128, device="cuda").to(getattr(torch, dtype)))
        y = cupy.empty_like(x)
        pos = cupy.arange(8192)
        copy = gpu_ms(lambda: cupy.copyto(y, x))
        inplace, alloc = gpu_ms(lambda: pe.rope(x, pos, out=x)), gpu_ms(lambda: pe.rope(x, pos))
        print(f"CuPy {dtype} rope: copyto {copy:.3f} ms | in place {inplace:.3f} ({copy / inplace:.2f}) | alloc {alloc:.3f} ({copy / alloc:.2f})")
        del x, y


def _block_shapes(torch, gpu_ms):
    """An A/B of the rotation's block (``rope_cuda._block``): as built (two threads a pair
    over a row's heads for float32, each rotating half of them; one thread a pair for 16-bit
    elements) against the other choice for the same dtype (the angle's or tables' work,
    before the first loads, done once a row or twice)."""
    import posenc as pe
    from posenc._kernels import rope_cuda

    usual = rope_cuda._block

    def other(columns, heads, split):
        return usual(columns, heads, not split)

    pos = torch.arange(8192, device="cuda")
    q = torch.randn(4, 4096, 32, 128, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    cos, sin = _unit_tables(torch, (4, 4096), torch.bfloat16)
    calls = {
        "float32 rope in place": (torch.float32, lambda x: pe.rope(x, pos, out=x)),
        "bfloat16 rope in place": (torch.bfloat16, lambda x: pe.rope(x, pos, out=x)),
        "HF q [4, 32, 4096, 128] bfloat16 apply_rope in place": (None, lambda x: pe.apply_rope(q, cos[:, None], sin[:, None], out=q)),
    }
    for name, (dtype, call) in calls.items():
        x = torch.randn(4, 32, 8192, 128, device="cuda").to(dtype) if dtype is not None else None
        times = _per_block(gpu_ms, (usual, other), lambda: call(x))
        built, flipped = ("two threads a pair", "one thread a pair") if dtype == torch.float32 else ("one thread a pair", "two threads a pair")
        print(f"block A/B {name}: {built} (as built) {times[0]:.3f} ms | {flipped} {times[1]:.3f} ms")
        del x


def _per_block(gpu_ms, blocks, call):
    """``gpu_ms`` of ``call`` with each of ``blocks`` as ``rope_cuda._block`` (the first the
    usual one, put back after), plans forgotten between (a plan keeps its launches' blocks)."""
    import posenc as pe
    from posenc._kernels import rope_cuda
    from posenc.rotary.apply import rotate_pair

    def forget_plans():
        for planned in (pe.rope, pe.apply_rope, rotate_pair):
            planned.plans.clear()

    times = []
    for block in blocks:
        rope_cuda._block = block
        forget_plans()
        times.append(gpu_ms(call))
    rope_cuda._block = blocks[0]
    forget_plans()
    return times


def _short_rows(torch, gpu_ms):
    """An A/B of the block for rows of 16 columns or fewer (``rope`` in place, head dim 64 in
    words of two float32 or four bfloat16 channels; head dim 128 with a rotary dim of 32, 8
    or 4 words): ``_block``'s
    ``x`` threads as many as the columns, a warp spanning heads, against whole warps of 32,
    half or three quarters of whose threads have no column (the rule before)."""
    import posenc as pe
    from posenc._kernels import rope_cuda

    usual = rope_cuda._block

    def whole_warps(columns, heads):
        return usual(max(columns, 32), heads)

    pos = torch.arange(8192, device="cuda")
    for dtype in (torch.float32, torch.bfloat16):
        for dim, rotary_dim in ((64, None), (128, 32)):
            x = torch.randn(4, 32, 8192, dim, device="cuda").to(dtype)
            y = torch.empty_like(x)
            copy = gpu_ms(lambda: y.copy_(x))
            times = _per_block(gpu_ms, (usual, whole_warps), lambda: pe.rope(x, pos, rotary_dim=rotary_dim, out=x))
            print(f"short rows A/B {dtype} head dim {dim}, rotary dim {rotary_dim or dim}, in place: threads as the columns "
                  f"{times[0]:.3f} ms ({copy / times[0]:.2f} of copy) | whole warps {times[1]:.3f} ms ({copy / times[1]:.2f})")  # fmt: skip
            del x, y


def _layouts(torch, gpu_ms):
    """An A/B of memory order for the same call, ``pe.rope`` in place on ``[4, 32, 8192, 128]``:
    contiguous ``[b, h, s, d]`` (a row's heads 4 MB apart for float32: the device's loads and
    stores spread over 32 streams, one a head) against the transposed view of contiguous
    ``[b, s, h, d]`` (a row's heads adjacent, as in Hugging Face's q), each beside the copy."""
    import posenc as pe

    pos = torch.arange(8192, device="cuda")
    for dtype in (torch.float32, torch.bfloat16):
        bhsd = torch.randn(4, 32, 8192, 128, device="cuda").to(dtype)
        bshd = torch.randn(4, 8192, 32, 128, device="cuda").to(dtype).transpose(1, 2)
        y = torch.empty_like(bhsd)
        copy = gpu_ms(lambda: y.copy_(bhsd))
        heads_apart, heads_adjacent = gpu_ms(lambda: pe.rope(bhsd, pos, out=bhsd)), gpu_ms(lambda: pe.rope(bshd, pos, out=bshd))
        print(f"layout A/B {dtype} rope in place: [b,h,s,d] {heads_apart:.3f} ms ({copy / heads_apart:.2f} of copy) | "
              f"[b,s,h,d] view {heads_adjacent:.3f} ms ({copy / heads_adjacent:.2f})")  # fmt: skip
        del bhsd, bshd, y


def _unit_tables(torch, lead, dtype):
    """``cos`` and ``sin`` tables ``lead + [128]`` of random angles in "half" layout: rotations,
    so that calls repeated in place keep the values' size (random normal tables would drive
    them to infinities)."""
    angles = torch.rand(*lead, 64, device="cuda", dtype=torch.float64) * 1000
    angles = torch.cat([angles, angles], -1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def _jax_row(torch, gpu_ms):
    """``pe.rope`` of a JAX GPU array under ``jax.jit`` (``_bench_gpu._jax_rows``: 10 calls
    dispatched back to back and a wait, best of 5), beside XLA's negation of the same array
    under ``jit`` (its copy: a copy itself is elided), the plain ``jnp`` formula, and torch's
    ``Tensor.copy_`` of the same bytes (device time)."""
    from posenc import _bench_gpu

    shape = (4, 32, 8192, 128)
    rows = _bench_gpu._jax_rows(shape, 5, lambda line: None)
    if not rows:
        print("JAX sees no GPU: no JAX row")
        return
    x = torch.empty(shape, device="cuda")
    y = torch.empty_like(x)
    copy = gpu_ms(lambda: y.copy_(x))
    plain, rope, negation = (row.seconds * 1e3 for row in rows)
    print(f"JAX {list(shape)} f32 under jax.jit, ms a call back to back: pe.rope {rope:.3f} ({negation / rope:.2f} of XLA's negation "
          f"{negation:.3f}, {copy / rope:.2f} of torch's copy_ {copy:.3f}) | plain jnp formula {plain:.3f} ({negation / plain:.2f})")  # fmt: skip


if __name__ == "__main__":
    main()
