"""Relative position encodings: indices, buckets, biases and relative attention logits."""

from . import _toeplitz  # noqa: F401  (registers the Toeplitz references)
from .indices import relative_positions

__all__ = ["relative_positions"]
