"""Rotary position embeddings (RoPE), scalings and relatives."""

from . import _rotate  # noqa: F401  (registers the rotation references)

__all__: list[str] = []
