r"""Context-extension scalings of RoPE frequencies (``posenc.scaling``).

Each scaling is a small frozen dataclass, validated when built, whose
``frequencies(dim, base, seq_len)`` returns the float64 NumPy ``inv_freq`` of a rotary
dimension ``dim`` and the ``attention_scale`` that multiplies ``cos`` and ``sin`` (so every
logit is multiplied by its square). The numbers are those of the Hugging Face
``transformers`` initialisers of the same ``rope_type`` (``modeling_rope_utils``),
computed in float64 instead of float32. With :math:`\theta_i = b^{-2i/d}`,
:math:`i < d/2`:

========================  ===========================================================
``Linear(s)``             :math:`\theta_i / s` (position interpolation, Chen et al. 2023)
``NTK(alpha)``            base :math:`b\,\alpha^{d/(d-2)}` ("NTK-aware", bloc97 2023)
``DynamicNTK(s, L)``      base :math:`b\,(s\,n/L - (s - 1))^{d/(d-2)}`, ``n = max(seq_len, L)``
``YaRN(s, L, ...)``       ramp between :math:`\theta_i` and :math:`\theta_i/s` (Peng et al. 2023)
``LongRoPE(...)``         :math:`\theta_i / \lambda_i`, short or long factors (Ding et al. 2024)
``Llama3(s, L, ...)``     wavelength bands: keep, divide by ``s``, or blend (Llama 3.1)
========================  ===========================================================

``Proportional(fraction, factor)`` is Hugging Face's ``"proportional"`` type (rotate a fraction
of the pairs, keep the others still); ``Axial(axes)`` the ``"axial"`` type of vision encoders
(Qwen3-VL's, GLM-4V's: RoPE's frequencies over ``d / axes`` channels, once per axis). ``from_hf`` reads a transformers config or its
``rope_parameters`` (or legacy ``rope_scaling``) dict.

``DynamicNTK`` and ``LongRoPE`` depend on the sequence length. Where it is a traced value
(``jax.jit``, ``torch.compile``, lazy Dask), ``traced_frequencies`` computes the frequencies
from it inside the computation, so the choice is still made per call.
"""

from __future__ import annotations

import ast
import math
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, fields, is_dataclass
from functools import lru_cache
from typing import Callable

import numpy as np

from .. import _doublefloat
from .. import _validate as check
from .._xp import constant_on, dimension_value, has_float64, jax_symbolic_dim, torch_compiling, trace_constant, widest_float

__all__ = ["Axial", "DynamicNTK", "HFRope", "LongRoPE", "Linear", "Llama3", "NTK", "Proportional", "YaRN", "from_hf"]


def default_inv_freq(dim: int, base: float) -> np.ndarray:
    """Float64 ``1 / base**(2i/dim)`` for ``i < dim/2``: RoPE's frequencies."""
    return 1.0 / base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)


def _optional_positive(name, value):
    return None if value is None else check.real(name, value, positive=True)


def _base_exponent_dim(dim):
    # d/(d-2) in the NTK base change needs d >= 4.
    if dim < 4:
        raise ValueError(f"dim must be >= 4 for NTK-style scalings (the base grows as alpha**(dim/(dim-2))), got {dim}")
    return dim / (dim - 2)


class Scaling:
    """Base of every scaling: ``frequencies(dim, base, seq_len) -> (inv_freq, attention_scale)``."""

    #: Whether ``seq_len`` changes the result (dynamic NTK, LongRoPE).
    uses_seq_len = False

    def frequencies(self, dim: int, base: float, seq_len: int | None = None) -> tuple[np.ndarray, float]:
        raise NotImplementedError

    def traced_frequencies(self, xp, dim, base, seq_len, device=None):
        """``(inv_freq, attention_scale)`` for a ``seq_len`` given as a 0-d array that cannot be
        read now: ``inv_freq`` an array of ``xp`` in its widest float, computed from it.
        Scalings that ignore the length return their constant frequencies."""
        inv_freq, scale = frequency_table(self, dim, base, None)
        return xp.asarray(inv_freq, dtype=widest_float(xp, device), device=device), scale

    def traced_turns(self, xp, dim, base, seq_len, device=None):
        """``(turns, attention_scale)`` for a traced ``seq_len`` where ``xp`` has no float64:
        ``turns = inv_freq / (2 pi)`` as a double-float ``(hi, lo)`` of float32 arrays, for
        the exact split reduction (:func:`posenc._xp.cos_sin_of_turns`)."""
        inv_freq, scale = frequency_table(self, dim, base, None)
        return _doublefloat.constant(xp, np.asarray(inv_freq) / (2 * math.pi), device), scale


def frequency_table(scaling, dim, base, seq_len):
    """``inv_freq`` as a tuple of float64 Python numbers and the attention scale, ``scaling``
    None for plain RoPE (host values: a constant for ``torch.compile``)."""
    if scaling is None:
        return _table(None, (), dim, base, seq_len)
    # The class and its field values, not the object: torch.compile may have built the
    # object while tracing, and passes only plain values to a constant function.
    parameters = tuple(getattr(scaling, f.name) for f in fields(scaling))
    return _table(type(scaling), check.static(parameters) if torch_compiling() else parameters, dim, base, seq_len)


@trace_constant
def _table(kind, parameters, dim, base, seq_len):
    if kind is None:
        if type(dim) is int and type(base) is float:  # (not a symbolic size of torch.compile)
            return _default_table(dim, base), 1.0
        return tuple(default_inv_freq(dim, base).tolist()), 1.0
    inv_freq, scale = _built(kind, parameters).frequencies(dim, base, seq_len)
    return tuple(np.asarray(inv_freq, dtype=np.float64).tolist()), float(scale)


@lru_cache(maxsize=64)
def _built(kind, parameters):
    """The scaling of these field values, validated once (LongRoPE's are two lists of factors)."""
    return kind(*parameters)


def nameable(scaling) -> bool:
    """Whether :func:`scaling_name` can name ``scaling``: one of this module's classes (not a
    subclass of one, which :func:`named_scaling` would read back as the class it names)."""
    return _CLASSES.get(type(scaling).__name__) is type(scaling)


def scaling_name(scaling) -> str:
    """``scaling`` (:func:`nameable`) as one string, every float in hexadecimal (exact): how
    the ops that compute frequencies when they run take it (``rope_rotate_at_length``), read
    back by :func:`named_scaling`."""
    return _name(type(scaling), tuple(check.static(getattr(scaling, f.name)) for f in fields(scaling)))


@trace_constant
def _name(kind, parameters):
    def exact(value):
        return tuple(exact(v) for v in value) if isinstance(value, tuple) else value.hex() if type(value) is float else value

    return repr((kind.__name__, exact(parameters)))


@lru_cache(maxsize=64)  # a compiled graph's calls at one length, or the last lengths of a decode loop
def named_frequency_table(name, dim, base, seq_len):
    """:func:`frequency_table` of the scaling named ``name`` (:func:`scaling_name`): what the
    ops that read a length when they run rotate with."""
    return frequency_table(named_scaling(name), dim, base, seq_len)


@lru_cache(maxsize=64)
def named_scaling(name: str) -> Scaling:
    """The scaling of a :func:`scaling_name`."""
    def number(value):
        return tuple(number(v) for v in value) if isinstance(value, tuple) else float.fromhex(value) if isinstance(value, str) else value

    kind, parameters = ast.literal_eval(name)
    return _CLASSES[kind](*number(parameters))


@lru_cache(maxsize=64)
def _default_table(dim, base):
    """RoPE's frequencies as float64 Python numbers, kept for the dims and bases last used."""
    return tuple(default_inv_freq(dim, base).tolist())


def _exponents(xp, dim, device):
    """``2i / dim`` for ``i < dim/2``, an array of ``xp``'s widest float."""
    return constant_on(xp, tuple(2 * i / dim for i in range(dim // 2)), widest_float(xp, device), device, "dynamic frequencies' exponents")


@dataclass(frozen=True)
class Linear(Scaling):
    r"""Linear position interpolation: :math:`\theta_i / \text{factor}`; attention scale 1.

    Positions are squeezed by ``factor`` so a model trained on ``L`` tokens sees
    ``factor * L`` tokens inside its trained angle range (Chen et al., "Extending Context
    Window of Large Language Models via Positional Interpolation", 2023; HF
    ``rope_type="linear"``). Needs a little fine-tuning; blurs nearby positions.

    Examples
    --------
    >>> import posenc as pe
    >>> pe.rope_frequencies(4, scaling=pe.scaling.Linear(4.0))      # 10000**(-2i/4) / 4
    (array([0.25  , 0.0025]), 1.0)
    """

    factor: float

    def __post_init__(self):
        object.__setattr__(self, "factor", check.real("factor", self.factor, positive=True))

    def frequencies(self, dim, base, seq_len=None):
        return default_inv_freq(dim, base) / self.factor, 1.0


@dataclass(frozen=True)
class NTK(Scaling):
    r"""NTK-aware scaling: a larger base :math:`b' = b\,\alpha^{d/(d-2)}`; attention scale 1.

    Keeps the highest frequency (:math:`i = 0`) and stretches the lowest one by
    exactly ``alpha`` (bloc97, 2023). Works without fine-tuning for moderate ``alpha``.
    Hugging Face's ``rope_type="dynamic"`` is the length-dependent form
    (:class:`DynamicNTK`), except with an ``alpha`` key (HunYuan's checkpoints), which
    transformers' HunYuan models read as this fixed base change, and so does :func:`from_hf`;
    ``dim`` must be >= 4.

    Examples
    --------
    >>> import numpy as np, posenc as pe
    >>> inv_freq, _ = pe.rope_frequencies(8, base=100.0, scaling=pe.scaling.NTK(4.0))
    >>> bool(inv_freq[0] == 1.0), bool(np.isclose(inv_freq[-1], pe.rope_frequencies(8, base=100.0)[0][-1] / 4))
    (True, True)
    """

    alpha: float

    def __post_init__(self):
        object.__setattr__(self, "alpha", check.real("alpha", self.alpha, positive=True))

    def frequencies(self, dim, base, seq_len=None):
        return default_inv_freq(dim, base * self.alpha ** _base_exponent_dim(dim)), 1.0


@dataclass(frozen=True)
class DynamicNTK(Scaling):
    r"""Dynamic NTK: the NTK base change grown with the sequence length; attention scale 1.

    .. math:: b' = b\left(\frac{s\,n}{L} - (s - 1)\right)^{d/(d-2)}, \quad n = \max(\text{seq\_len}, L)

    with ``s = factor`` and ``L = original_max_position`` (HF ``rope_type="dynamic"``,
    where ``L`` is the config's ``max_position_embeddings``). Up to ``L`` tokens the
    frequencies are the original ones; ``seq_len=None`` means ``L``. (emozilla, "Dynamically
    Scaled RoPE further increases performance of long context LLaMA with zero fine-tuning",
    2023; the NTK-aware base change of bloc97 applied at the current length.)

    Past ``L`` every frequency changes at every step, so keys cached at one length are
    stale at the next. Do not chain :func:`posenc.rerotate` from one step's frequencies to
    the next: each rerotation rounds again (bfloat16 keys drift by 21% in 1000 steps).
    Either keep the keys as first rotated (original frequencies) and rerotate that cache
    once per step into a buffer, or keep them unrotated and rotate them at attention
    time (docs: "Context extension in a growing cache").

    Examples
    --------
    >>> import numpy as np, posenc as pe
    >>> dyn = pe.scaling.DynamicNTK(2.0, original_max_position=8)
    >>> raw = np.random.default_rng(0).standard_normal((20, 8))      # unrotated keys
    >>> keys = pe.rope(raw, scaling=dyn, seq_len=20)               # rotated at attention time
    >>> first, _ = pe.rope_frequencies(8)                           # or: cached as first rotated
    >>> now, _ = pe.rope_frequencies(8, scaling=dyn, seq_len=20)
    >>> moved = pe.rerotate(pe.rope(raw), np.arange(20), first, new_inv_freq=now)
    >>> bool(np.allclose(moved, keys))
    True
    """

    factor: float
    original_max_position: int
    uses_seq_len = True

    def __post_init__(self):
        object.__setattr__(self, "factor", check.real("factor", self.factor, positive=True))
        object.__setattr__(
            self, "original_max_position", check.integer("original_max_position", self.original_max_position, minimum=1)
        )

    def frequencies(self, dim, base, seq_len=None):
        length = self.original_max_position if seq_len is None else max(seq_len, self.original_max_position)
        grow = self.factor * length / self.original_max_position - (self.factor - 1)
        return default_inv_freq(dim, base * grow ** _base_exponent_dim(dim)), 1.0

    def traced_frequencies(self, xp, dim, base, seq_len, device=None):
        if not has_float64(xp, device):
            return self._inv_freq_doublefloat(xp, dim, base, seq_len, device)[0], 1.0
        # The same arithmetic as ``frequencies``, on the array.
        work = widest_float(xp, device)
        length = xp.maximum(xp.astype(seq_len, work), xp.asarray(float(self.original_max_position), dtype=work, device=device))
        grow = self.factor * length / self.original_max_position - (self.factor - 1)
        new_base = base * grow ** _base_exponent_dim(dim)
        return 1.0 / new_base ** _exponents(xp, dim, device), 1.0

    def traced_turns(self, xp, dim, base, seq_len, device=None):
        turns = _doublefloat.constant(xp, 1 / (2 * math.pi), device)
        return _doublefloat.mul(self._inv_freq_doublefloat(xp, dim, base, seq_len, device), turns), 1.0

    def _inv_freq_doublefloat(self, xp, dim, base, seq_len, device):
        r"""``frequencies`` in double-float arithmetic on float32:
        :math:`\theta_i = b^{-2i/d}\,q^i` with :math:`q = g^{-1/k}`, :math:`k = d/2 - 1`,
        :math:`g = s\,n/L - (s - 1)` (the grown base's :math:`g^{d/(d-2)}` to the power
        :math:`-2i/d`)."""
        df = _doublefloat
        _base_exponent_dim(dim)
        length = df.from_integer(xp, xp.maximum(seq_len, self.original_max_position))
        grow = df.add(
            df.mul(length, df.constant(xp, self.factor / self.original_max_position, device)),
            df.constant(xp, -(self.factor - 1), device),
        )
        powers = df.integer_power(xp, df.root_reciprocal(xp, grow, dim // 2 - 1), np.arange(dim // 2))
        return df.mul(powers, df.constant(xp, default_inv_freq(dim, base), device))


def _yarn_mscale(scale, mscale=1.0):
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


@dataclass(frozen=True)
class YaRN(Scaling):
    r"""YaRN: NTK-by-parts interpolation plus an attention temperature (Peng et al., 2023).

    For pair ``i``, the ramp :math:`\gamma_i = \mathrm{clip}((i - l)/(h - l), 0, 1)`
    blends :math:`\theta_i` (high frequencies, extrapolated) into :math:`\theta_i/s`
    (low frequencies, interpolated):
    :math:`\theta'_i = \theta_i/s\cdot\gamma_i + \theta_i (1 - \gamma_i)`, where ``l`` and
    ``h`` are the pair indices at which a wavelength fits ``beta_fast`` and ``beta_slow``
    times into ``original_max_position`` tokens,
    :math:`c(\beta) = d \ln(L / (2\pi\beta)) / (2 \ln b)`, rounded outwards (floor/ceil)
    when ``truncate`` and clipped to ``[0, d - 1]``.

    ``attention_scale``: ``attention_factor`` when given; else, when both ``mscale`` and
    ``mscale_all_dim`` are non-zero, :math:`m(s, \text{mscale}) / m(s, \text{mscale\_all\_dim})`
    (DeepSeek), otherwise :math:`m(s, 1)`, with :math:`m(s, a) = 0.1\,a\ln s + 1` for
    ``s > 1`` and 1 otherwise. (As in Hugging Face, ``mscale`` alone is ignored when
    ``mscale_all_dim`` is 0; either making its :math:`m` 0 is a ``ValueError``: a scale of 0,
    or one dividing by 0.) HF ``rope_type="yarn"``.

    Examples
    --------
    >>> import numpy as np, posenc as pe
    >>> inv_freq, scale = pe.rope_frequencies(128, scaling=pe.scaling.YaRN(4.0, 4096))
    >>> round(scale, 6), bool(inv_freq[0] == 1.0), bool(np.isclose(inv_freq[-1], pe.rope_frequencies(128)[0][-1] / 4))
    (1.138629, True, True)
    """

    factor: float
    original_max_position: int
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float = 1.0
    mscale_all_dim: float = 0.0
    attention_factor: float | None = None
    truncate: bool = True

    def __post_init__(self):
        set_ = object.__setattr__
        set_(self, "factor", check.real("factor", self.factor, positive=True))
        set_(self, "original_max_position", check.integer("original_max_position", self.original_max_position, minimum=1))
        set_(self, "beta_fast", check.real("beta_fast", self.beta_fast, positive=True))
        set_(self, "beta_slow", check.real("beta_slow", self.beta_slow, positive=True))
        set_(self, "mscale", check.real("mscale", self.mscale))
        set_(self, "mscale_all_dim", check.real("mscale_all_dim", self.mscale_all_dim))
        set_(self, "attention_factor", _optional_positive("attention_factor", self.attention_factor))
        check.flag("truncate", self.truncate)
        if self.attention_factor is None and self.mscale and self.mscale_all_dim:
            for name in ("mscale_all_dim", "mscale"):  # the denominator, then the scale itself (an inverse rotation divides by it)
                if _yarn_mscale(self.factor, getattr(self, name)) == 0:
                    raise ValueError(
                        f"{name}={getattr(self, name)} makes 0.1 * {name} * ln(factor) + 1 = 0 for factor={self.factor}: "
                        "the attention scale m(factor, mscale) / m(factor, mscale_all_dim) would "
                        + ("divide by 0" if name == "mscale_all_dim" else "be 0")
                    )

    def attention_scale(self) -> float:
        if self.attention_factor is not None:
            return self.attention_factor
        if self.mscale and self.mscale_all_dim:
            return _yarn_mscale(self.factor, self.mscale) / _yarn_mscale(self.factor, self.mscale_all_dim)
        return _yarn_mscale(self.factor)

    def frequencies(self, dim, base, seq_len=None):
        if base == 1.0:
            raise ValueError("YaRN needs base != 1: its correction range divides by ln(base)")

        def correction_dim(rotations):
            return dim * math.log(self.original_max_position / (rotations * 2 * math.pi)) / (2 * math.log(base))

        low, high = correction_dim(self.beta_fast), correction_dim(self.beta_slow)
        if self.truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:
            high += 0.001  # as in the reference: a step instead of a 0/0 ramp
        ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0.0, 1.0)
        theta = default_inv_freq(dim, base)
        return theta / self.factor * ramp + theta * (1.0 - ramp), self.attention_scale()


def _factor_list(name, values):
    if isinstance(values, (str, bytes)) or not hasattr(values, "__len__"):
        raise TypeError(f"{name} must be a sequence of positive numbers, got {type(values).__name__}")
    out = tuple(check.real(f"{name}[{i}]", v, positive=True, static=False) for i, v in enumerate(values))
    if not out:
        raise ValueError(f"{name} must not be empty")
    return out


@dataclass(frozen=True)
class LongRoPE(Scaling):
    r"""LongRoPE: one rescale factor per frequency, :math:`\theta_i / \lambda_i` (Ding et al., 2024).

    :math:`\lambda` is ``long_factor`` when ``seq_len > original_max_position`` and
    ``short_factor`` otherwise (also when ``seq_len`` is None). Both lists have ``dim/2``
    entries (checked against ``dim`` when used; :func:`from_hf` repeats a list of one factor,
    which transformers broadcasts). ``attention_scale``: ``attention_factor``
    when given, else :math:`\sqrt{1 + \ln s / \ln L}` for ``s = factor > 1`` and 1
    otherwise (``factor=None`` counts as 1; Hugging Face then uses
    ``max_position_embeddings / original_max_position``, which :func:`from_hf` fills in).
    HF ``rope_type="longrope"`` (Phi-3).

    Examples
    --------
    >>> import posenc as pe
    >>> longrope = pe.scaling.LongRoPE((1.0, 2.0), (1.0, 8.0), 16, factor=4.0)
    >>> pe.rope_frequencies(4, base=100.0, scaling=longrope, seq_len=8)       # short factors
    (array([1.  , 0.05]), 1.224744871391589)
    >>> pe.rope_frequencies(4, base=100.0, scaling=longrope, seq_len=32)[0]   # long factors
    array([1.    , 0.0125])
    """

    short_factor: tuple
    long_factor: tuple
    original_max_position: int
    factor: float | None = None
    attention_factor: float | None = None
    uses_seq_len = True

    def __post_init__(self):
        set_ = object.__setattr__
        set_(self, "short_factor", _factor_list("short_factor", self.short_factor))
        set_(self, "long_factor", _factor_list("long_factor", self.long_factor))
        if len(self.short_factor) != len(self.long_factor):
            raise ValueError(
                f"short_factor and long_factor must have the same length, got {len(self.short_factor)} and {len(self.long_factor)}"
            )
        set_(self, "original_max_position", check.integer("original_max_position", self.original_max_position, minimum=1))
        set_(self, "factor", _optional_positive("factor", self.factor))
        set_(self, "attention_factor", _optional_positive("attention_factor", self.attention_factor))
        if self.original_max_position == 1 and self.attention_factor is None and self.factor is not None and self.factor > 1.0:
            raise ValueError(
                "LongRoPE's attention scale sqrt(1 + ln(factor) / ln(original_max_position)) needs original_max_position > 1, "
                "got 1 with factor > 1: give attention_factor"
            )

    def attention_scale(self) -> float:
        if self.attention_factor is not None:
            return self.attention_factor
        if self.factor is None or self.factor <= 1.0:
            return 1.0
        return math.sqrt(1 + math.log(self.factor) / math.log(self.original_max_position))

    def frequencies(self, dim, base, seq_len=None):
        if len(self.short_factor) != dim // 2:
            raise ValueError(
                f"short_factor and long_factor must have dim/2 = {dim // 2} entries for dim={dim}, got {len(self.short_factor)}"
            )
        long = seq_len is not None and seq_len > self.original_max_position
        rescale = np.asarray(self.long_factor if long else self.short_factor, dtype=np.float64)
        return default_inv_freq(dim, base) / rescale, self.attention_scale()

    def traced_frequencies(self, xp, dim, base, seq_len, device=None):
        work = widest_float(xp, device)
        short, scale = frequency_table(self, dim, base, None)
        long, _ = frequency_table(self, dim, base, self.original_max_position + 1)
        choose_long = seq_len > self.original_max_position
        short, long = (xp.asarray(f, dtype=work, device=device) for f in (short, long))
        return xp.where(choose_long, long, short), scale

    def traced_turns(self, xp, dim, base, seq_len, device=None):
        choose_long = seq_len > self.original_max_position
        (short, scale), (long, _) = (frequency_table(self, dim, base, n) for n in (None, self.original_max_position + 1))
        short, long = (_doublefloat.constant(xp, np.asarray(f) / (2 * math.pi), device) for f in (short, long))
        return (xp.where(choose_long, long[0], short[0]), xp.where(choose_long, long[1], short[1])), scale


@dataclass(frozen=True)
class Llama3(Scaling):
    r"""Llama 3.1 frequency bands; attention scale 1.

    With wavelength :math:`\lambda_i = 2\pi/\theta_i`, ``L = original_max_position``:
    wavelengths shorter than ``L/high_freq_factor`` are kept, longer than
    ``L/low_freq_factor`` are divided by ``factor``, and in between
    :math:`\theta'_i = (1 - g)\,\theta_i/s + g\,\theta_i` with
    :math:`g = (L/\lambda_i - \text{low}) / (\text{high} - \text{low})`
    (HF ``rope_type="llama3"``; Meta's Llama 3.1 uses ``8, 8192, 1, 4``; Dubey et al.,
    "The Llama 3 Herd of Models", 2024).

    Examples
    --------
    >>> import posenc as pe
    >>> inv_freq, _ = pe.rope_frequencies(8, scaling=pe.scaling.Llama3(8.0, 64))
    >>> inv_freq.round(6).tolist()       # kept, blended, divided by 8 (wavelengths 6.3, 63, 628, 6283)
    [1.0, 0.013042, 0.00125, 0.000125]
    """

    factor: float
    original_max_position: int
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0

    def __post_init__(self):
        set_ = object.__setattr__
        set_(self, "factor", check.real("factor", self.factor, positive=True))
        set_(self, "original_max_position", check.integer("original_max_position", self.original_max_position, minimum=1))
        set_(self, "low_freq_factor", check.real("low_freq_factor", self.low_freq_factor, positive=True))
        set_(self, "high_freq_factor", check.real("high_freq_factor", self.high_freq_factor, positive=True))
        if self.high_freq_factor <= self.low_freq_factor:
            raise ValueError(
                f"high_freq_factor must be > low_freq_factor ({self.low_freq_factor}), got {self.high_freq_factor}"
            )

    def frequencies(self, dim, base, seq_len=None):
        theta = default_inv_freq(dim, base)
        length = self.original_max_position
        wavelen = 2 * math.pi / theta
        blend = (length / wavelen - self.low_freq_factor) / (self.high_freq_factor - self.low_freq_factor)
        blended = (1 - blend) * theta / self.factor + blend * theta
        out = np.where(wavelen > length / self.low_freq_factor, theta / self.factor, theta)
        medium = (wavelen >= length / self.high_freq_factor) & (wavelen <= length / self.low_freq_factor)
        return np.where(medium, blended, out), 1.0


@dataclass(frozen=True)
class Proportional(Scaling):
    r"""Rotate only the first pairs, at full-width frequencies; the others stay put.

    :math:`\theta_i = b^{-2i/d} / s` for the first ``n = int(fraction * d // 2)`` pairs and
    :math:`\theta_i = 0` (no rotation) for the rest, ``s = factor``; attention scale 1.
    Unlike a partial rotary dimension, the exponent keeps the full ``d`` and the result
    covers every pair (HF ``rope_type="proportional"``, ``fraction`` its
    ``partial_rotary_factor``: the full-attention layers of Gemma 4, 0.25 of the pairs at
    base :math:`10^6`, and of LFM3).

    Examples
    --------
    >>> import posenc as pe
    >>> inv_freq, scale = pe.rope_frequencies(8, base=100.0, scaling=pe.scaling.Proportional(0.5))
    >>> inv_freq.tolist(), scale                     # 100**(-2i/8) for the first 2 of 4 pairs
    ([1.0, 0.31622776601683794, 0.0, 0.0], 1.0)
    """

    fraction: float
    factor: float = 1.0

    def __post_init__(self):
        object.__setattr__(self, "fraction", check.real("fraction", self.fraction, minimum=0.0))
        if self.fraction > 1.0:
            raise ValueError(f"fraction must be in [0, 1], got {self.fraction}")
        object.__setattr__(self, "factor", check.real("factor", self.factor, positive=True))

    def frequencies(self, dim, base, seq_len=None):
        rotated = int(self.fraction * dim // 2)
        theta = default_inv_freq(dim, base)
        return np.where(np.arange(dim // 2) < rotated, theta, 0.0) / self.factor, 1.0


@dataclass(frozen=True)
class Axial(Scaling):
    r"""Axial RoPE of a vision encoder: RoPE's frequencies over ``d / axes`` channels, once per axis.

    .. math:: \theta = [\phi, \phi, \dots], \qquad \phi_j = b^{-2j/(d/A)}, \; j < d/(2A)

    (``A = axes`` copies, ``d/2`` frequencies in all; attention scale 1). Pair ``i`` of block
    ``a`` turns with axis ``a`` of the patch's position (height, width): pass the frequencies
    to :func:`posenc.mrope_cos_sin` with ``sections = [d/(2A)] * A`` (what :func:`from_hf`
    returns as ``.sections``). Hugging Face's ``rope_type="axial"``, the 2-D RoPE of Qwen3-VL's
    and GLM-4V's vision encoders (their ``VisionRotaryEmbedding``); Heo et al., "Rotary
    Position Embedding for Vision Transformer", 2024, for the axial form.

    Examples
    --------
    >>> import posenc as pe
    >>> pe.rope_frequencies(8, base=100.0, scaling=pe.scaling.Axial(2))[0].tolist()   # 100**(-2j/4), twice
    [1.0, 0.1, 1.0, 0.1]
    """

    axes: int = 2

    def __post_init__(self):
        object.__setattr__(self, "axes", check.integer("axes", self.axes, minimum=1))

    def frequencies(self, dim, base, seq_len=None):
        block = dim // self.axes
        if block < 2 or block % 2:
            raise ValueError(f"Axial({self.axes}) needs dim // axes even and >= 2, got dim = {dim}")
        return np.tile(default_inv_freq(block, base), self.axes), 1.0

    def sections(self, dim):
        """The pairs of each axis: ``[dim / (2 axes)] * axes``."""
        return (dim // self.axes // 2,) * self.axes


# The scalings by name (scaling_name, named_scaling, nameable).
_CLASSES = {kind.__name__: kind for kind in (Linear, NTK, DynamicNTK, YaRN, LongRoPE, Llama3, Proportional, Axial)}


@dataclass(frozen=True)
class HFRope:
    """What :func:`from_hf` read from a Hugging Face config.

    Attributes
    ----------
    scaling : Scaling or None
        ``None`` for ``rope_type="default"``.
    base : float
        ``rope_theta`` (10000 when absent).
    rotary_dim : int
        ``int(head_dim * partial_rotary_factor)``: the ``dim`` to pass to
        :func:`posenc.rope_frequencies` and the ``rotary_dim`` of :func:`posenc.rope`.
    partial_rotary_factor : float
        The fraction of the head the model rotates: 1 where its code does not read the
        config's factor (:func:`from_hf`'s notes).
    sections : tuple of int or None
        Multimodal RoPE: the frequency pairs of each position axis (``mrope_section``,
        ``xdrope_section``, or the vision encoders' two axes of ``"axial"``); None for text
        RoPE.
    multimodal : {"mrope", "mrope_interleaved", "xdrope"} or None
        How ``sections`` deal out the pairs: :func:`posenc.mrope_cos_sin` (consecutive;
        ``interleaved=True`` for ``"mrope_interleaved"``, Qwen3-VL; the pairs' layout, half or
        interleaved, is the model's apply function's, as for text RoPE) or
        :func:`posenc.xdrope_cos_sin` (HunyuanVL).
    """

    scaling: Scaling | None
    base: float
    rotary_dim: int
    partial_rotary_factor: float
    sections: tuple | None = None
    multimodal: str | None = None


class _Reader:
    """One flat ``rope_parameters`` dict of a config, with the config-level values it falls back on."""

    def __init__(self, params, rope_type, max_position_embeddings, original_max_position_embeddings, truncate):
        self.params, self.rope_type = params, rope_type
        self.max_position_embeddings = max_position_embeddings
        self.original_max_position_embeddings = original_max_position_embeddings
        self.truncate = truncate

    def need(self, key, *, none_ok=False):
        if key not in self.params:
            raise ValueError(f"rope_parameters for rope_type={self.rope_type!r} needs {key!r} (transformers requires it)")
        if self.params[key] is None and not none_ok:
            raise ValueError(f"rope_parameters[{key!r}] must be set for rope_type={self.rope_type!r}, got None")
        return self.params[key]

    def get(self, key, default=None):
        value = self.params.get(key)
        return default if value is None else value

    def original(self):
        """``original_max_position_embeddings``: the config's own field first (Phi-3), then the
        parameters', then ``max_position_embeddings`` (transformers' order)."""
        for value in (self.original_max_position_embeddings, self.params.get("original_max_position_embeddings"), self.max_position_embeddings):
            if value is not None:
                return value
        raise ValueError(
            f"rope_type={self.rope_type!r} needs rope_parameters['original_max_position_embeddings'] or max_position_embeddings"
        )

    def factor_or_ratio(self, original):
        """``factor``, or ``max_position_embeddings / original`` where it is None (DeepSeek-V3, Phi-3)."""
        if self.params.get("factor") is not None:
            return self.params["factor"]
        if self.max_position_embeddings is None:
            raise ValueError(f"rope_type={self.rope_type!r} with factor None needs max_position_embeddings (factor = max / original)")
        return self.max_position_embeddings / original


def _linear(r, rotary_dim, base):
    return Linear(r.need("factor"))


def _dynamic(r, rotary_dim, base):
    if r.get("alpha"):  # HunYuan: "dynamic" with a fixed alpha is the static NTK base change (its test is for truth: 0 is none)
        return NTK(r.params["alpha"])
    factor = r.need("factor")
    if r.max_position_embeddings is None:
        raise ValueError("rope_type='dynamic' needs max_position_embeddings (the length the base starts growing at)")
    return DynamicNTK(factor, r.max_position_embeddings)


def _yarn(r, rotary_dim, base):
    r.need("factor", none_ok=True)  # None: max_position_embeddings / original (DeepSeek-V3)
    original = r.original()
    factor = r.factor_or_ratio(original)
    implicit = None if r.max_position_embeddings is None else r.max_position_embeddings / original
    if implicit is not None and implicit not in (factor, 1):
        warnings.warn(
            f"rope_parameters['factor'] = {factor} disagrees with the implicit factor max_position_embeddings / "
            f"original_max_position_embeddings = {r.max_position_embeddings} / {original} = {implicit}; YaRN uses "
            "the explicit factor, as transformers does (which warns the same): check original_max_position_embeddings",
            UserWarning,
            stacklevel=5,
        )
    truncate = r.truncate  # (transformers tests it for truth: a null is False)
    return YaRN(
        factor,
        original,
        beta_fast=r.get("beta_fast", 32.0) or 32.0,
        beta_slow=r.get("beta_slow", 1.0) or 1.0,
        mscale=r.get("mscale", 0.0),
        mscale_all_dim=r.get("mscale_all_dim", 0.0),
        attention_factor=r.params.get("attention_factor"),
        truncate=False if truncate is None else truncate,
    )


def _longrope(r, rotary_dim, base):
    original = r.original()

    def factors(key):  # one factor for every pair, as transformers' tensor of one broadcasts
        values = r.need(key)
        return list(values) * (rotary_dim // 2) if isinstance(values, (list, tuple)) and len(values) == 1 else values

    scaling = LongRoPE(
        factors("short_factor"),
        factors("long_factor"),
        original,
        factor=r.factor_or_ratio(original),
        attention_factor=r.params.get("attention_factor"),
    )
    scaling.frequencies(rotary_dim, base)  # checks the list lengths now
    return scaling


def _llama3(r, rotary_dim, base):
    return Llama3(r.need("factor"), r.original(), low_freq_factor=r.need("low_freq_factor"), high_freq_factor=r.need("high_freq_factor"))


def _proportional(r, rotary_dim, base):
    return Proportional(r.get("partial_rotary_factor", 1.0), r.get("factor", 1.0))


def _axial(r, rotary_dim, base):
    return Axial(2)


@dataclass(frozen=True)
class _HFType:
    """How to read one ``rope_type``: the builder and the keys it reads besides the common ones."""

    build: Callable | None
    keys: tuple = ()
    #: The rotary dimension is the whole head (the scaling zeroes the frequencies it leaves out).
    whole_head: bool = False


# transformers' ``rope_type``s (``ROPE_INIT_FUNCTIONS`` and the default) -> builder.
HF_ROPE_TYPES = {
    "default": _HFType(None),
    "linear": _HFType(_linear, ("factor",)),
    "dynamic": _HFType(_dynamic, ("factor", "alpha")),
    "yarn": _HFType(
        _yarn,
        ("factor", "original_max_position_embeddings", "attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "truncate"),
    ),
    "longrope": _HFType(_longrope, ("short_factor", "long_factor", "original_max_position_embeddings", "attention_factor", "factor")),
    "llama3": _HFType(_llama3, ("factor", "original_max_position_embeddings", "low_freq_factor", "high_freq_factor")),
    "proportional": _HFType(_proportional, ("factor",), whole_head=True),
    # model-specific types of transformers' model files: HunyuanVL's (its config turns it into
    # "dynamic", an alpha into the fixed NTK base), and the vision encoders' 2-D RoPE
    "xdrope": _HFType(_dynamic, ("factor", "alpha")),
    "axial": _HFType(_axial),
}
# Keys every type may carry; the multimodal sections are returned as ``HFRope.sections``.
_COMMON_KEYS = ("rope_type", "type", "rope_theta", "partial_rotary_factor", "mrope_section", "mrope_interleaved", "xdrope_section")


def _text_config(config):
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def config_head_dim(config):
    """The head size of a transformers config object: ``head_dim``, else ``hidden_size //
    num_attention_heads`` (of its text config)."""
    config = _text_config(config)
    head_dim = getattr(config, "head_dim", None)
    if head_dim is None:
        hidden = getattr(config, "hidden_size", None)
        heads = getattr(config, "num_attention_heads", None) or getattr(config, "num_heads", None)  # vision configs: num_heads
        if hidden is None or heads is None:
            raise ValueError(f"config {type(config).__name__} has neither head_dim nor hidden_size and num_attention_heads")
        head_dim = hidden // heads
    return head_dim


def nested_layer_types(config):
    """The layer types a config object's rope parameters are nested under (Gemma 3), in the
    config's order; ``[]`` when they are flat."""
    config = _text_config(config)
    params = _rope_parameters(config)
    return [t for t in dict.fromkeys(_layer_types(config)) if isinstance((params or {}).get(t), Mapping)]


def layer_config(config, layer_type=None):
    """The text config of a transformers config object, for ``layer_type``'s layers where its
    attributes differ per layer (Gemma 4's ``head_dim``: ``config.per_layer_config``)."""
    config = _text_config(config)
    if layer_type is not None and getattr(config, "is_heterogeneous", False) and layer_type in _layer_types(config):
        return config.per_layer_config[layer_type]
    return config


def _rope_parameters(config):
    params = getattr(config, "rope_parameters", None)
    if params is None:
        params = getattr(config, "rope_scaling", None)  # transformers 4 configs
    return params


def _layer_types(config):
    return tuple(getattr(config, "_rope_type_labels", None) or getattr(config, "layer_types", None) or ())


def _config_fields(config, layer_type=None):
    """``(rope_parameters, fields)`` of a transformers config object (its text config, for
    ``layer_type``'s layers); no ``head_dim`` where it differs per layer and no layer type says which."""
    config = layer_config(config, layer_type)
    per_layer = getattr(getattr(config, "_heterogeneity_spec", None), "per_layer_attributes", ())
    fields = {
        "head_dim": None if "head_dim" in per_layer else config_head_dim(config),
        "max_position_embeddings": getattr(config, "max_position_embeddings", None),
        "rope_theta": getattr(config, "rope_theta", None),
        "partial_rotary_factor": getattr(config, "partial_rotary_factor", None),
        "original_max_position_embeddings": getattr(config, "original_max_position_embeddings", None),
        "layer_types": _layer_types(config),
        "model_type": getattr(config, "model_type", None),
    }
    return _rope_parameters(config), fields


def _is_nested(params, layer_types):
    """Per-layer-type parameters: keys that name layer types, each with a dict (or None, a NoPE layer)."""
    if not params:
        return False
    if layer_types:
        return any(key in layer_types for key in params)
    return all(isinstance(v, Mapping) or v is None for v in params.values())


def from_hf(config, *, head_dim=None, max_position_embeddings=None, layer_type=None, rope_theta=None, partial_rotary_factor=None):
    """Build the scaling, base and rotary dimension of a Hugging Face RoPE config.

    Parameters
    ----------
    config : transformers ``PretrainedConfig``, dict or None
        A config object (its text config for multimodal models; head dim, max positions,
        ``rope_theta`` and ``partial_rotary_factor`` are read from it), or its
        ``rope_parameters`` dict (transformers v5: ``rope_type``, ``rope_theta``,
        ``partial_rotary_factor``, ``factor``, ...) or a legacy ``rope_scaling`` dict
        (``type`` instead of ``rope_type``). ``None`` or ``{}`` is plain RoPE. Parameters
        nested per layer type (``{"full_attention": {...}, "sliding_attention": {...}}``,
        Gemma 3 style) need ``layer_type``; as in transformers, YaRN's ``truncate`` is then read
        from the top level (True when absent there: one inside a layer type's dict is not read)
        and ``original_max_position_embeddings`` from the layer type's dict alone. Every ``rope_type`` transformers ships is read
        (``default``, ``linear``, ``dynamic``, ``yarn``, ``longrope``, ``llama3``,
        ``proportional``), and the model-specific ``xdrope`` (HunyuanVL: ``dynamic``, with
        ``alpha`` the fixed NTK base, as HunYuan's ``dynamic``; a config object of another
        model type has its ``alpha`` not read, as there) and ``axial`` (the 2-D RoPE of Qwen3-VL's and GLM-4V's
        vision encoders: :class:`Axial`), each by its entry of ``HF_ROPE_TYPES``. Multimodal
        sections (``mrope_section``, ``xdrope_section``, the two axes of ``axial``) come back
        as ``.sections`` and ``.multimodal``; for the model types of transformers' multimodal
        text rotary modules (Qwen2-VL, Qwen3-VL, Qwen3.5, GLM-4V, ...) as their module reads
        them: its own sections where the config has none, and its dealing of the pairs (the
        module's code decides it; ``mrope_interleaved`` is read only where no model type does).
    head_dim : int, optional
        The attention head size; read from a config object (``head_dim`` or
        ``hidden_size // num_attention_heads``), required with a dict.
    max_position_embeddings : int, optional
        ``config.max_position_embeddings``: needed by ``"dynamic"``, by ``"yarn"`` and
        ``"longrope"`` without ``factor``, and as the fallback of
        ``original_max_position_embeddings``, as in transformers.
    layer_type : str, optional
        Which entry of per-layer-type parameters to read.
    rope_theta, partial_rotary_factor : float, optional
        Top-level config values of legacy dicts; values inside the parameters win. A
        ``partial_rotary_factor`` given here is read as given (see below).

    Notes
    -----
    ``partial_rotary_factor`` is read as the model's code reads it: every ``rope_type`` of
    ``ROPE_INIT_FUNCTIONS`` reads it, but under ``"default"`` each model type's own
    initialiser decides, and most (LLaMA, Mistral, Qwen2/3, Gemma, ...: the model types of
    ``_WHOLE_HEAD_MODELS``, transformers 5.24) rotate the whole head whatever it says, as
    HunYuan's ``"dynamic"`` with an ``alpha`` does; MiMo-V2-Flash's reads 0.334 where its
    parameters have none. The config object's ``model_type`` tells which; a dict, which has
    none, or an explicit ``partial_rotary_factor=`` has the factor read as given
    (``int(head_dim * partial_rotary_factor)`` channels). A config object's own
    ``partial_rotary_factor``, beside parameters that have none (replaced after the config
    was built), is read where transformers copies it into them: by the initialisers of
    ``ROPE_INIT_FUNCTIONS``, not by a model type's own.

    Returns
    -------
    HFRope
        ``(scaling, base, rotary_dim, partial_rotary_factor)``.

    Raises
    ------
    ValueError
        A field transformers requires is missing (e.g. ``factor`` for ``"yarn"``), an
        unknown ``rope_type`` or ``layer_type``, nested parameters without ``layer_type``.
        Keys the type does not read give a ``UserWarning``.

    Examples
    --------
    >>> import posenc as pe
    >>> cfg = pe.scaling.from_hf({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
    ...     "high_freq_factor": 4.0, "original_max_position_embeddings": 8192, "rope_theta": 500000.0},
    ...     head_dim=128)
    >>> cfg.scaling
    Llama3(factor=8.0, original_max_position=8192, low_freq_factor=1.0, high_freq_factor=4.0)
    >>> cfg.base, cfg.rotary_dim
    (500000.0, 128)
    >>> nested = {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
    ...           "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}
    >>> pe.scaling.from_hf(nested, head_dim=64, layer_type="full_attention").scaling
    Linear(factor=8.0)
    """
    fields = {"layer_types": (), "original_max_position_embeddings": None}
    if config is None or isinstance(config, Mapping):
        params = config
    elif hasattr(config, "rope_parameters") or hasattr(config, "rope_scaling") or hasattr(config, "get_text_config"):
        params, fields = _config_fields(config, layer_type)
    else:
        raise TypeError(f"config must be a transformers PretrainedConfig, a rope_parameters dict or None, got {type(config).__name__}")
    for name, given in (("max_position_embeddings", max_position_embeddings), ("rope_theta", rope_theta), ("partial_rotary_factor", partial_rotary_factor)):
        if given is None:
            given = fields.get(name)
        fields[name] = given
    fields["rotary_model"] = fields.get("model_type") if partial_rotary_factor is None else None
    if fields["max_position_embeddings"] is not None:
        fields["max_position_embeddings"] = check.integer("max_position_embeddings", fields["max_position_embeddings"], minimum=1)
    params = dict(params or {})
    if _is_nested(params, fields["layer_types"]):
        labels = sorted(k for k in params if not fields["layer_types"] or k in fields["layer_types"])
        if layer_type is None:
            raise ValueError(f"the rope parameters are per layer type ({', '.join(labels)}); pass layer_type= one of them")
        if layer_type not in labels:
            raise ValueError(f"layer_type must be one of {', '.join(map(repr, labels))}, got {layer_type!r}")
        if params[layer_type] is None:
            raise ValueError(f"layer_type={layer_type!r} has no rotary parameters (a layer without RoPE)")
        # as transformers reads nested parameters: YaRN's truncate from the top level (its yarn
        # initialiser reads config.rope_parameters), original_max_position_embeddings only from the
        # layer type's own parameters (the config's field is not copied into them)
        fields.update(truncate=params.get("truncate", True), original_max_position_embeddings=None)
        params = dict(params[layer_type])
    elif layer_type is not None and layer_type not in fields["layer_types"]:
        raise ValueError(
            f"layer_type={layer_type!r} given, but the rope parameters are not per layer type"
            + (f" (layer types: {', '.join(fields['layer_types'])})" if fields["layer_types"] else "")
        )
    head_dim = head_dim if head_dim is not None else fields.get("head_dim")
    if head_dim is None:
        raise ValueError("head_dim is required with a rope_parameters dict (a config object gives it, or its layer_type's layers where it differs per layer)")
    head_dim = check.integer("head_dim", head_dim, minimum=1)
    return _read_flat(params, head_dim, fields)


def _read_flat(p, head_dim, fields):
    """:func:`from_hf` on one flat parameter dict."""
    rope_type = p.get("rope_type", p.get("type", "default"))
    if rope_type not in HF_ROPE_TYPES:
        raise ValueError(
            f"rope_parameters['rope_type'] must be one of {', '.join(map(repr, HF_ROPE_TYPES))}, got {rope_type!r}"
        )
    kind = HF_ROPE_TYPES[rope_type]
    keys = kind.keys
    if fields.get("model_type") is not None and fields["model_type"] not in _NTK_ALPHA_MODELS:
        keys = tuple(k for k in keys if k != "alpha")  # (transformers' "dynamic" reads factor)
    unknown = sorted(set(p) - set(_COMMON_KEYS) - set(keys))
    if unknown:
        warnings.warn(f"rope_parameters keys {unknown} are not read for rope_type={rope_type!r}", UserWarning, stacklevel=3)
    if "alpha" not in keys:
        p = {k: v for k, v in p.items() if k != "alpha"}
    theta = p.get("rope_theta")
    if theta is None:
        theta = fields["rope_theta"] if fields["rope_theta"] is not None else 10000.0
    base = check.real("rope_theta", theta, positive=True)
    fraction = p.get("partial_rotary_factor")
    model = fields.get("rotary_model")  # whose own initialiser decides the factor (None: read as given)
    own = rope_type == "default" or (p.get("alpha") and model in _NTK_ALPHA_MODELS)
    if fraction is None and not (own and model is not None):
        # (transformers copies the config's own factor into the parameters in the
        # ROPE_INIT_FUNCTIONS alone, by standardize_rope_params: a model's own initialiser
        # reads the parameters as they are)
        fraction = fields["partial_rotary_factor"]
    if own and model in _WHOLE_HEAD_MODELS:
        fraction = 1.0
    elif fraction is None:
        fraction = _DEFAULT_PARTIAL_ROTARY_FACTOR.get(model, 1.0) if own else 1.0
    fraction = check.real("partial_rotary_factor", fraction, positive=True)
    if fraction > 1.0:
        raise ValueError(f"partial_rotary_factor must be in (0, 1], got {fraction}")
    rotary_dim = head_dim if kind.whole_head else int(head_dim * fraction)
    if rotary_dim < 2 or rotary_dim % 2:
        raise ValueError(
            f"head_dim * partial_rotary_factor must give an even rotary dimension >= 2, got int({head_dim} * {fraction}) = {rotary_dim}"
        )
    truncate = fields["truncate"] if "truncate" in fields else p.get("truncate", True)
    reader = _Reader(
        {**p, "partial_rotary_factor": fraction}, rope_type, fields["max_position_embeddings"], fields["original_max_position_embeddings"], truncate
    )
    scaling = kind.build(reader, rotary_dim, base) if kind.build is not None else None
    return HFRope(scaling, base, rotary_dim, fraction, *_multimodal(p, rope_type, scaling, rotary_dim, fields.get("model_type")))


def _multimodal(p, rope_type, scaling, rotary_dim, model_type):
    """``(sections, multimodal)`` of flat parameters: M-RoPE's, XD-RoPE's or the vision encoders' axes."""
    if isinstance(scaling, Axial):
        return scaling.sections(rotary_dim), "mrope"
    model = _MROPE_MODELS.get(str(model_type or ""))
    sections = p.get("xdrope_section", p.get("mrope_section", None if model is None else model[0]))
    if sections is None:
        return None, None
    sections = tuple(int(n) for n in sections)  # checked against the frequencies where they are used
    # HunyuanVL's config renames xdrope_section to mrope_section and xdrope to dynamic: its model type tells
    if rope_type == "xdrope" or "xdrope_section" in p or str(model_type or "").startswith("hunyuan_vl"):
        return sections, "xdrope"
    interleaved = model[1] if model is not None else p.get("mrope_interleaved")
    return sections, "mrope_interleaved" if interleaved else "mrope"


# The multimodal text rotary modules of transformers 5.24, by their config's model type: the
# sections each uses where its config has no mrope_section, and whether it deals the pairs out
# in turn (Qwen3-VL's order) or in consecutive sections. None of them reads mrope_interleaved.
# (Ernie-4.5-VL's, which alternates height and width pairs, is neither: not listed.)
_MROPE_MODELS = {
    **dict.fromkeys(("qwen2_vl_text", "qwen2_5_vl_text", "qwen2_5_omni_text", "paddleocr_vl_text"), ((16, 24, 24), False)),
    **dict.fromkeys(("glm4v_text", "glm4v_moe_text", "glm_image_text", "glm_ocr_text"), ((8, 12, 12), False)),
    **dict.fromkeys(
        ("qwen3_vl_text", "qwen3_vl_moe_text", "qwen3_omni_moe_text", "qwen3_omni_moe_talker_text", "cosmos3_edge_text", "hy_v4_vl_text", "cohere_compass_text"),
        ((24, 20, 20), True),
    ),
    **dict.fromkeys(("qwen3_5_text", "qwen3_5_moe_text", "qwen4_exp_text"), ((11, 11, 10), True)),
}


# The model types of transformers 5.24 whose rotary module's own initialiser (``rope_type``
# "default", and HunYuan's "dynamic" with an ``alpha``) rotates the whole head whatever
# ``partial_rotary_factor`` says; the other model types' read it, as every initialiser of
# ``ROPE_INIT_FUNCTIONS`` does (tests/test_hf_zoo.py checks both against every rotary module).
_WHOLE_HEAD_MODELS = frozenset((
    "afmoe", "apertus", "apertus1p5_text", "arcee", "aria_text", "axk1", "axk2", "bailing_hybrid", "beam",
    "bitnet", "blt_global_transformer", "blt_local_decoder", "blt_local_encoder", "blt_patcher", "chameleon",
    "cohere", "cohere2", "cohere2_moe", "cohere_compass_text", "cosmos3_edge_text", "csm",
    "csm_depth_decoder_model", "cwm", "dbrx", "deepseek_ocr2_encoder", "deepseek_ocr2_text", "deepseek_v2",
    "deepseek_v3", "deepseek_v32", "dia_decoder", "dia_encoder", "diffllama", "doge", "dory", "dots1",
    "embedding_gemma2_text", "emu3_text_model", "ernie4_5", "ernie4_5_moe", "ernie4_5_vl_moe_text", "esmc",
    "eurobert", "evolla", "exaone4", "exaone_moe", "falcon", "falcon_h1", "flex_olmo", "flint", "gemma",
    "gemma2", "gemma3_text", "gemma3n_text", "gemma4_text", "gemma4_unified_text", "glm_moe_dsa", "gpt_oss",
    "gradium_phonon_tts", "granite", "granite4_vision_text", "granite_docling_text", "granite_swa",
    "granitemoe", "granitemoe_swa", "granitemoehybrid", "granitemoeshared", "gte", "helium", "higgs_audio_v2",
    "hrm_text", "hunyuan_v1_dense", "hunyuan_v1_moe", "hunyuan_vl_text", "hy_v3", "hy_v4", "hy_v4_vl_text",
    "hyperclovax", "idefics", "jais2", "jetmoe", "jina_embeddings_v3", "kolibri1", "kyutai_speech_to_text",
    "lara_mini", "lasr_encoder", "lfm2", "lfm2_moe", "lfm3", "llama", "llama4_text", "longcat_flash", "mimi",
    "minicpm3", "minimax", "ministral", "ministral3", "mistral", "mistral4", "mistral_large4_text", "mixtral",
    "mllama_text_model", "modernbert", "modernbert-decoder", "molmo2_text", "moshi", "muse_glimmer_assistant",
    "muse_glimmer_text", "muse_spark_text", "nanochat", "neucodec", "nomic_bert", "olmo", "olmo2", "olmo3",
    "olmo_hybrid", "olmoe", "openai_privacy_filter", "paddleocr_vl_text", "pe_audio_encoder",
    "pe_audio_video_encoder", "pe_video_encoder", "phimoe", "pocket_tts", "pocket_tts_audio_tokenizer", "qwen2",
    "qwen2_5_omni_dit", "qwen2_5_omni_talker", "qwen2_5_omni_text", "qwen2_5_vl_text", "qwen2_moe",
    "qwen2_vl_text", "qwen3", "qwen3_moe", "qwen3_omni_moe_talker_code_predictor", "qwen3_omni_moe_talker_text",
    "qwen3_omni_moe_text", "qwen3_vl_moe_text", "qwen3_vl_text", "seed_oss", "smollm3", "starcoder2",
    "t5_gemma_module", "t5gemma2_decoder", "t5gemma2_text", "timesfm2_5", "ultrabert", "unlimited_ocr_text",
    "vaultgemma", "voxtral_realtime_encoder", "voxtral_realtime_text", "xcodec2", "youtu", "zamba2"
))
# The model types whose rotary modules read a "dynamic" ``alpha`` (HunYuan's fixed NTK base
# change, their own initialiser); other model types' read its ``factor`` alone.
_NTK_ALPHA_MODELS = frozenset(("hunyuan_v1_dense", "hunyuan_v1_moe", "hunyuan_vl_text"))
# The factor a model type's default initialiser reads where its parameters have none (1 for the others).
_DEFAULT_PARTIAL_ROTARY_FACTOR = {"mimo_v2_flash": 0.334}


def check_scaling(scaling):
    """``scaling`` must be None or one of this module's scalings (``TypeError`` otherwise),
    with the conversion to use for a Hugging Face dict or a ``from_hf`` result."""
    if scaling is not None and not isinstance(scaling, Scaling):
        names = ", ".join(sorted(c.__name__ for c in Scaling.__subclasses__()))
        hint = ""
        if isinstance(scaling, Mapping):
            hint = (
                "; a Hugging Face rope_parameters / rope_scaling dict converts with "
                "pe.scaling.from_hf(config_or_dict, head_dim=...), whose .scaling, .base and .rotary_dim "
                "are rope's scaling, base and rotary_dim"
            )
        elif isinstance(scaling, HFRope):
            hint = "; pass its .scaling (and base=its .base, rotary_dim=its .rotary_dim)"
        raise TypeError(f"scaling must be None or a posenc.scaling object ({names}), got {type(scaling).__name__}{hint}")
    if scaling is not None and not is_dataclass(scaling):
        # (frequency_table rebuilds a scaling from its class and its fields' values: see there)
        raise TypeError(
            f"scaling of the Scaling subclass {type(scaling).__name__} must be a dataclass, whose fields are the values its "
            f"frequencies() reads (in the order its __init__ takes them): decorate the class with @dataclasses.dataclass"
        )
    return scaling


def __dir__():
    return sorted(__all__)


def check_seq_len(seq_len):
    """None, a non-negative int, or a 0-d integer array that cannot be read now (traced; a
    symbolic dimension of ``jax.export`` becomes the JAX value it is inside the computation)."""
    if seq_len is None:
        return None
    seq_len = check.integer_or_traced("seq_len", seq_len, minimum=0)
    return dimension_value(seq_len) if jax_symbolic_dim(seq_len) else seq_len
