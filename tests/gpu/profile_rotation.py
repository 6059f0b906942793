"""The rotation kernels under Nsight Compute: ``pe.rope`` in place on ``[4, 32, 8192, 128]``
float32 and bfloat16 and ``apply_rope`` of Hugging Face's q and k bfloat16 views, and, for
comparison, ``torch.compile`` of the plain formula on the same bfloat16 ``x`` (its Triton
kernel reached 0.99 of the device's copy where posenc's reached 0.84 on an H200), one call
each between ``cudaProfilerStart`` and ``cudaProfilerStop`` (warm-up calls, which compile,
run before it).

Usage (``tests/gpu/lease.sh`` runs it): ``ncu --clock-control none --profile-from-start off
--section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section
WarpStateStats --section SchedulerStats --section LaunchStats python3
tests/gpu/profile_rotation.py`` with ``src`` on ``PYTHONPATH``.
"""

from __future__ import annotations


def main():
    import torch

    import posenc as pe
    from posenc import _bench_gpu, _oracles
    from posenc.torch.hf import apply_rotary_pos_emb

    pos = torch.arange(8192, device="cuda")
    xs = [torch.randn(4, 32, 8192, 128, device="cuda").to(dtype) for dtype in (torch.float32, torch.bfloat16)]
    q = torch.randn(4, 4096, 32, 128, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    k = torch.randn(4, 4096, 8, 128, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    angles = torch.rand(4, 4096, 64, device="cuda", dtype=torch.float64) * 1000
    angles = torch.cat([angles, angles], -1)
    cos, sin = angles.cos().to(torch.bfloat16), angles.sin().to(torch.bfloat16)

    tables = tuple(_bench_gpu._tables(torch, 8192, 128, torch.bfloat16))
    formula = torch.compile(lambda x, c, s: _oracles.hf_rope(torch, x, c, s), dynamic=False)

    def calls():
        for x in xs:
            pe.rope(x, pos, out=x)
        apply_rotary_pos_emb(q, k, cos, sin)
        formula(xs[1], *tables)

    for _ in range(3):
        calls()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    calls()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


if __name__ == "__main__":
    main()
