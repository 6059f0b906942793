"""Relative position encodings: indices, buckets, biases and relative attention logits."""

from .biases import alibi_bias, alibi_slopes, expand_bias, relative_bias, relative_bias_vector, t5_bias
from .buckets import deberta_bucket, t5_bucket
from .indices import clip_relative, relative_positions

__all__ = [
    "alibi_bias",
    "alibi_slopes",
    "clip_relative",
    "deberta_bucket",
    "expand_bias",
    "relative_bias",
    "relative_bias_vector",
    "relative_positions",
    "t5_bias",
    "t5_bucket",
]
