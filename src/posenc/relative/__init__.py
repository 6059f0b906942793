"""Relative position encodings: indices, buckets, biases and relative attention logits."""

from . import _toeplitz  # noqa: F401  (registers the Toeplitz references the biases call)
from .biases import alibi_bias, alibi_slopes, expand_bias, relative_bias, relative_bias_vector, t5_bias
from .buckets import deberta_bucket, t5_bucket
from .cope import cope_logits, cope_positions
from .deberta import deberta_logits
from .fire import fire_bias, fire_distances
from .indices import clip_relative, relative_positions
from .kerple import kerple_bias, sandwich_bias, sandwich_vector
from .shaw import nezha_table, shaw_logits, shaw_output
from .tupe import tupe_logits
from .xl import rel_shift, segment_logits, tener_logits, xl_logits

__all__ = [
    "alibi_bias",
    "alibi_slopes",
    "clip_relative",
    "deberta_bucket",
    "deberta_logits",
    "expand_bias",
    "nezha_table",
    "rel_shift",
    "relative_bias",
    "relative_bias_vector",
    "relative_positions",
    "segment_logits",
    "shaw_logits",
    "shaw_output",
    "t5_bias",
    "t5_bucket",
    "tener_logits",
    "tupe_logits",
    "xl_logits",
    "cope_logits",
    "cope_positions",
    "fire_bias",
    "fire_distances",
    "kerple_bias",
    "sandwich_bias",
    "sandwich_vector",
]
