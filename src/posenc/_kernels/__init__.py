"""Fast kernels (Numba CPU, numba.cuda), registered against their references.

Importing this package registers every kernel with ``posenc._dispatch`` without importing
numba: each registration names its implementation as ``"module:function"``, loaded on
first use. ``torch_autograd`` registers first (torch tensors that need gradients go
through custom ops), then ``rope`` the rotary kernels and ``bias`` the Toeplitz kernels.
"""

from . import torch_autograd  # noqa: I001  (first: it must win for tensors needing grad)
from . import bias, rope  # noqa: F401
