"""Registrations of the Toeplitz bias kernels (ops ``toeplitz_expand/gather/scatter``)."""
