"""Fast kernels (Numba CPU, numba.cuda), registered against their references.

Importing this package registers every kernel with ``posenc._dispatch`` without importing
numba: each registration names its implementation as ``"module:function"``, loaded on
first use.
"""
