"""posenc under JAX's transformations: what ``jax.jit`` and ``jax.export`` see of posenc.

``import posenc.jax`` (done for you by ``posenc.use_backend`` / ``set_backend`` once JAX is
loaded, and by posenc's JAX kernels) makes two choices part of every ``jax.jit`` cache key,
so a function jitted before a ``with`` block is traced again inside it instead of silently
keeping the earlier choice:

* the backend (``posenc.use_backend("reference")``: the pure ``jax.numpy`` reference,
  which XLA fuses, instead of the CPU kernel's host call);
* :func:`export_with_kernels`.

**Export.** ``jax.export`` of a function that calls posenc lowers posenc's kernel
primitive to its ``jax.numpy`` reference on every platform (``cpu``, ``cuda``, ``rocm``,
``tpu``): the artifact is portable and serializable, and needs no posenc where it is
deserialized. Under :func:`export_with_kernels` a CPU export keeps the Numba kernel's
host call instead (faster on CPU); such an artifact names posenc's XLA FFI target and a
host function registered in the exporting process, so it can only be called back in that
process (``jax.export.deserialize`` of it elsewhere fails at the call), and it needs
``disabled_checks=[jax.export.DisabledSafetyCheck.custom_call("posenc_host_call")]``.
With symbolic sizes (``jax.export.symbolic_shape``) the export is the reference either way
(a host call needs static shapes); docs/jax.md says which integer ranges then need a
declared bound.
"""

from __future__ import annotations

import contextlib

from jax._src import config as _config

from . import _dispatch

__all__ = ["export_with_kernels"]

# Thread-local JAX configuration states in the jit cache key (JAX's own mechanism, e.g.
# for jax_enable_x64): changing one traces a jitted function again.
backend_state = _config.optional_enum_state(
    "posenc_jit_backend",
    list(_dispatch.BACKENDS),
    _dispatch.process_backend(),  # (not get_backend(): imported inside a use_backend block, that block's)
    "posenc's backend, in the jit cache key (set by posenc.use_backend / set_backend)",
    include_in_jit_key=True,
    include_in_trace_context=True,
)
export_kernels_state = _config.bool_state(
    "posenc_export_kernels",
    False,
    "jax.export keeps posenc's CPU kernel host calls instead of lowering the reference",
    include_in_jit_key=True,
    include_in_trace_context=True,
)


@contextlib.contextmanager
def export_with_kernels():
    """Inside the block, ``jax.export`` for ``platforms=["cpu"]`` keeps posenc's CPU kernel
    (an XLA FFI host call into this process) instead of lowering its reference.

    The exported artifact runs only in this process (the host function is registered
    here), and exporting it needs
    ``disabled_checks=[jax.export.DisabledSafetyCheck.custom_call("posenc_host_call")]``
    (small rotations use ``posenc_rope_rotate_*`` targets: check all with
    ``jax.export.DisabledSafetyCheck.custom_call`` of each name JAX reports). By default
    (outside the block) an export is the portable reference.
    """
    with export_kernels_state(True):
        yield
