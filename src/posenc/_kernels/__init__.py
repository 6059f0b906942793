"""Fast kernels (Numba CPU, numba.cuda), registered against their references.

Importing this package registers every kernel with ``posenc._dispatch`` without importing
numba: each registration names its implementation as ``"module:function"``, loaded on
first use. ``torch_autograd`` registers first (torch tensors that need gradients go
through custom ops), then ``rope`` the rotary kernels, ``bias`` the Toeplitz kernels and
``dask_blocks`` the per-block paths of chunked Dask arrays.
"""

from . import torch_autograd  # noqa: I001  (first: it must win for tensors needing grad)
from . import bias, dask_blocks, rope  # noqa: F401
