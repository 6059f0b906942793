"""Absolute position encodings: sinusoidal, learned (hierarchical), FLOATER, complex, conv."""

from .apply import apply_absolute
from .complex_order import complex_order
from .conv import conv_positions
from .floater import floater
from .learned import hierarchical_extend
from .randomized import randomized_positions
from .sincos2d import sincos_2d
from .sinusoidal import sinusoidal

__all__ = ["apply_absolute", "complex_order", "conv_positions", "floater", "hierarchical_extend", "sinusoidal", "randomized_positions", "sincos_2d"]
