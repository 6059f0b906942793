"""Fast kernels (Numba CPU, numba.cuda, torch autograd), registered against their references.

Importing this package registers the Numba kernels with ``posenc._dispatch`` without
importing numba or a framework: each registration names its implementation
``"module:function"``, loaded on first use. The registry tries an op's kernels in
registration order: the torch custom ops first (a tensor autograd records, or any tensor
while ``torch.compile`` traces), then the Numba CPU and numba.cuda kernels (``rope.py``,
``toeplitz.py``, ``buckets.py``). The Dask block paths (``posenc._dask``) and the JAX CPU paths
(``posenc._jax``) are framework adapters, a layer above this one (none of these files
imports JAX or Dask): ``posenc._dispatch.ADAPTERS`` names them and imports each (which
registers its kernels) the first time a call holds an array of its library.

The files, one line each:

* ``_arrays.py``: what an array is (library, storage, gradient tracking, strides: which
  kernel may take it) and how a kernel sees it (host and device views, strided views,
  spans, allocation, the GPU stream);
* ``_codec.py``: 16-bit floats <-> float64, for kernels computing in float64 (CPU and CUDA);
* ``_codec_f32.py``: 16-bit floats <-> float32 as LLVM instructions (CPU, float32);
* ``_pairs.py``: the rotation of a row's pairs, a vector at a time, as LLVM intrinsics
  (CPU: float64 arithmetic for float32/float64 rows, float32 for 16-bit rows);
* ``_family.py``: one compiled specialisation per key, built on first use and announced when
  slow, for every family below;
* ``_layout.py``: the one axis-merging rule, the rotary ``(G, H, S)`` plan, batch views, the
  CPU thread runner;
* ``rope.py``: registrations, accepts and launcher guard of ``rope_rotate`` / ``rope_apply``
  (the torch custom ops, Numba CPU, numba.cuda); kernels in ``rope_cpu.py`` and
  ``rope_cuda.py``;
* ``toeplitz.py``: the same for ``toeplitz_expand/gather/scatter``; kernels in
  ``toeplitz_cpu.py`` and ``toeplitz_cuda.py`` (which reads back no range of an index
  posenc built in range itself: ``posenc/_built.py``);
* ``buckets.py``: the same for ``t5_buckets`` (T5's buckets of a GPU bias's distances); its
  kernel in ``buckets_cuda.py``;
* ``tupe.py``: the registration of ``tupe_row_terms`` (the torch custom op alone: TUPE's
  rows of one offset per batch row while ``torch.compile`` traces);
* ``tener.py``: the same for ``tener_row_terms`` (TENER's rows of one offset per batch row);
* ``bias_rows_cpu.py``: the T5 and ALiBi plans' one-pass rows (``relative/_decode.py``'s
  kept window of per-distance sources read at each query's keys), not registered: a plan
  launches it, and declines to the reference's operations where it does not serve;
* ``warmup.py``: compiles or loads every specialisation ahead of time (``posenc.warmup``).
"""

from . import buckets, rope, tener, toeplitz, tupe  # noqa: F401
