"""Fast kernels (Numba CPU, numba.cuda), registered against their references.

Importing this package registers every kernel with ``posenc._dispatch`` without importing
numba: each registration names its implementation as ``"module:function"``, loaded on
first use. ``rope`` registers the rotary kernels, ``bias`` the Toeplitz bias kernels.
"""

from . import bias, rope  # noqa: F401
