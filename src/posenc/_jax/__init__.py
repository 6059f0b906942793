"""The JAX adapter: JAX CPU arrays through the Numba CPU kernels, eagerly and traced.

``posenc._dispatch.ADAPTERS`` names ``register`` and imports it (which registers the
``<op>.jax_cpu`` kernels) the first time a call holds a JAX array. The public face of JAX
support is :mod:`posenc.jax` (the backend and export choices in ``jax.jit``'s cache key).

The files, one line each:

* ``register.py``: registrations and accepts of the JAX CPU paths (every op), no JAX import;
* ``cpu.py``: the ops on JAX CPU arrays, eagerly and as host calls under ``jax.jit``,
  ``jax.grad`` and ``jax.vmap``;
* ``primitive.py``: the one JAX primitive of every traced op (evaluation, JVP, transpose,
  batching, lowering);
* ``ffi.py``: host calls from XLA into Python without copies (an XLA FFI target over ``ctypes``);
* ``native.py``: ``rope_rotate``'s compiled FFI handler for small calls (no Python per call);
* ``sharding.py``: one host call per shard under ``jax.jit`` on several devices.
"""
