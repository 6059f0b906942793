"""Registrations of the rotary kernels (ops ``rope_rotate`` and ``rope_apply``)."""
