"""The only import site of array-api-compat.

array-api-compat recognises NumPy, CuPy, PyTorch, JAX, Dask and array-api-strict arrays by
looking in ``sys.modules``; it never imports a framework to test a type, so importing
this module keeps ``import posenc`` light.
"""

from array_api_compat import (
    array_namespace,
    device,
    is_array_api_obj,
    is_array_api_strict_namespace,
    is_cupy_array,
    is_dask_array,
    is_jax_array,
    is_jax_namespace,
    is_numpy_array,
    is_numpy_namespace,
    is_torch_array,
    is_torch_namespace,
    size,
    to_device,
)

__all__ = [
    "array_namespace",
    "device",
    "is_array_api_obj",
    "is_array_api_strict_namespace",
    "is_cupy_array",
    "is_dask_array",
    "is_jax_array",
    "is_jax_namespace",
    "is_numpy_array",
    "is_numpy_namespace",
    "is_torch_array",
    "is_torch_namespace",
    "size",
    "to_device",
]
