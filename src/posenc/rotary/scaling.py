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

``from_hf`` reads a Hugging Face ``rope_parameters`` (or legacy ``rope_scaling``) dict.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .. import _validate as check

__all__ = ["DynamicNTK", "HFRope", "LongRoPE", "Linear", "Llama3", "NTK", "YaRN", "from_hf"]


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


@dataclass(frozen=True)
class Linear(Scaling):
    r"""Linear position interpolation: :math:`\theta_i / \text{factor}`; attention scale 1.

    Positions are squeezed by ``factor`` so a model trained on ``L`` tokens sees
    ``factor * L`` tokens inside its trained angle range (Chen et al., "Extending Context
    Window of Large Language Models via Positional Interpolation", 2023; HF
    ``rope_type="linear"``). Needs a little fine-tuning; blurs nearby positions.
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
    Hugging Face has no ``rope_type`` of its own for it (its ``"dynamic"`` is the
    length-dependent form, :class:`DynamicNTK`); ``dim`` must be >= 4.
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
    frequencies are the original ones; ``seq_len=None`` means ``L``. A KV cache built at one
    length and read at another needs :func:`posenc.rerotate`.
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
    ``mscale_all_dim`` is 0.) HF ``rope_type="yarn"``.
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
        if not isinstance(self.truncate, bool):
            raise TypeError(f"truncate must be a bool, got {self.truncate!r}")

    def attention_scale(self) -> float:
        if self.attention_factor is not None:
            return self.attention_factor
        if self.mscale and self.mscale_all_dim:
            return _yarn_mscale(self.factor, self.mscale) / _yarn_mscale(self.factor, self.mscale_all_dim)
        return _yarn_mscale(self.factor)

    def frequencies(self, dim, base, seq_len=None):
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
    out = tuple(check.real(f"{name}[{i}]", v, positive=True) for i, v in enumerate(values))
    if not out:
        raise ValueError(f"{name} must not be empty")
    return out


@dataclass(frozen=True)
class LongRoPE(Scaling):
    r"""LongRoPE: one rescale factor per frequency, :math:`\theta_i / \lambda_i` (Ding et al., 2024).

    :math:`\lambda` is ``long_factor`` when ``seq_len > original_max_position`` and
    ``short_factor`` otherwise (also when ``seq_len`` is None). Both lists have ``dim/2``
    entries (checked against ``dim`` when used). ``attention_scale``: ``attention_factor``
    when given, else :math:`\sqrt{1 + \ln s / \ln L}` for ``s = factor > 1`` and 1
    otherwise (``factor=None`` counts as 1; Hugging Face then uses
    ``max_position_embeddings / original_max_position``, which :func:`from_hf` fills in).
    HF ``rope_type="longrope"`` (Phi-3).
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


@dataclass(frozen=True)
class Llama3(Scaling):
    r"""Llama 3.1 frequency bands; attention scale 1.

    With wavelength :math:`\lambda_i = 2\pi/\theta_i`, ``L = original_max_position``:
    wavelengths shorter than ``L/high_freq_factor`` are kept, longer than
    ``L/low_freq_factor`` are divided by ``factor``, and in between
    :math:`\theta'_i = (1 - g)\,\theta_i/s + g\,\theta_i` with
    :math:`g = (L/\lambda_i - \text{low}) / (\text{high} - \text{low})`
    (HF ``rope_type="llama3"``; Meta's Llama 3.1 uses ``8, 8192, 1, 4``).
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
    """

    scaling: Scaling | None
    base: float
    rotary_dim: int
    partial_rotary_factor: float


_HF_TYPES = ("default", "linear", "dynamic", "yarn", "longrope", "llama3")


def from_hf(rope_parameters, *, head_dim, max_position_embeddings=None, rope_theta=None, partial_rotary_factor=None):
    """Build the scaling, base and rotary dimension of a Hugging Face RoPE config.

    Parameters
    ----------
    rope_parameters : dict or None
        ``config.rope_parameters`` (transformers v5: ``rope_type``, ``rope_theta``,
        ``partial_rotary_factor``, ``factor``, ...) or a legacy ``rope_scaling`` dict
        (``type`` instead of ``rope_type``). ``None`` or ``{}`` is plain RoPE.
    head_dim : int
        The attention head size (``config.head_dim`` or ``hidden_size // num_heads``).
    max_position_embeddings : int, optional
        ``config.max_position_embeddings``: needed by ``"dynamic"``, by ``"yarn"`` and
        ``"longrope"`` without ``factor``, and as the fallback of
        ``original_max_position_embeddings``, as in transformers.
    rope_theta, partial_rotary_factor : float, optional
        Top-level config values of legacy configs; values inside ``rope_parameters`` win.

    Returns
    -------
    HFRope
        ``(scaling, base, rotary_dim, partial_rotary_factor)``.

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
    """
    if rope_parameters is None:
        rope_parameters = {}
    if not isinstance(rope_parameters, dict):
        raise TypeError(f"rope_parameters must be a dict (or None), got {type(rope_parameters).__name__}")
    head_dim = check.integer("head_dim", head_dim, minimum=1)
    if max_position_embeddings is not None:
        max_position_embeddings = check.integer("max_position_embeddings", max_position_embeddings, minimum=1)
    p = dict(rope_parameters)
    rope_type = p.get("rope_type", p.get("type", "default"))
    if rope_type not in _HF_TYPES:
        raise ValueError(f"rope_parameters['rope_type'] must be one of {', '.join(map(repr, _HF_TYPES))}, got {rope_type!r}")
    theta = p.get("rope_theta", rope_theta if rope_theta is not None else 10000.0)
    base = check.real("rope_theta", theta, positive=True)
    fraction = p.get("partial_rotary_factor", partial_rotary_factor if partial_rotary_factor is not None else 1.0)
    fraction = check.real("partial_rotary_factor", fraction, positive=True)
    if fraction > 1.0:
        raise ValueError(f"partial_rotary_factor must be in (0, 1], got {fraction}")
    rotary_dim = int(head_dim * fraction)
    if rotary_dim < 2 or rotary_dim % 2:
        raise ValueError(
            f"head_dim * partial_rotary_factor must give an even rotary dimension >= 2, got int({head_dim} * {fraction}) = {rotary_dim}"
        )

    def need(key):
        if p.get(key) is None:
            raise ValueError(f"rope_parameters for rope_type={rope_type!r} needs {key!r}")
        return p[key]

    def original_max_position():
        if p.get("original_max_position_embeddings") is not None:
            return p["original_max_position_embeddings"]
        if max_position_embeddings is None:
            raise ValueError(
                f"rope_type={rope_type!r} needs rope_parameters['original_max_position_embeddings'] or max_position_embeddings"
            )
        return max_position_embeddings

    def factor_or_ratio(original):
        if p.get("factor") is not None:
            return p["factor"]
        if max_position_embeddings is None:
            raise ValueError(f"rope_type={rope_type!r} without 'factor' needs max_position_embeddings (factor = max / original)")
        return max_position_embeddings / original

    if rope_type == "default":
        scaling = None
    elif rope_type == "linear":
        scaling = Linear(need("factor"))
    elif rope_type == "dynamic":
        if max_position_embeddings is None:
            raise ValueError("rope_type='dynamic' needs max_position_embeddings (the length the base starts growing at)")
        scaling = DynamicNTK(need("factor"), max_position_embeddings)
    elif rope_type == "yarn":
        original = original_max_position()
        scaling = YaRN(
            factor_or_ratio(original),
            original,
            beta_fast=p.get("beta_fast") or 32.0,
            beta_slow=p.get("beta_slow") or 1.0,
            mscale=p.get("mscale") or 0.0,
            mscale_all_dim=p.get("mscale_all_dim") or 0.0,
            attention_factor=p.get("attention_factor"),
            truncate=p.get("truncate", True),
        )
    elif rope_type == "longrope":
        original = original_max_position()
        scaling = LongRoPE(
            need("short_factor"),
            need("long_factor"),
            original,
            factor=factor_or_ratio(original),
            attention_factor=p.get("attention_factor"),
        )
        scaling.frequencies(rotary_dim, base)  # checks the list lengths now
    else:
        scaling = Llama3(
            need("factor"),
            original_max_position(),
            low_freq_factor=need("low_freq_factor"),
            high_freq_factor=need("high_freq_factor"),
        )
    return HFRope(scaling, base, rotary_dim, fraction)


def check_scaling(scaling):
    """``scaling`` must be None or one of this module's scalings (``TypeError`` otherwise)."""
    if scaling is not None and not isinstance(scaling, Scaling):
        raise TypeError(
            f"scaling must be None or a posenc.scaling object (Linear, NTK, DynamicNTK, YaRN, LongRoPE, Llama3), got {type(scaling).__name__}"
        )
    return scaling


def check_seq_len(seq_len):
    return None if seq_len is None else check.integer("seq_len", seq_len, minimum=0)
