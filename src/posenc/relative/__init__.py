"""Relative position encodings: indices, buckets, biases and relative attention logits."""

from .indices import relative_positions

__all__ = ["relative_positions"]
