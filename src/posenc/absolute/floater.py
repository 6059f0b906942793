"""FLOATER: positions as the solution of a continuous dynamical system."""

from __future__ import annotations

import math
import numbers

from .. import _validate as check
from .._xp import argument_in, cast, device_of, is_integer, is_real_floating, namespace, result_dtype, widest_float
from .sinusoidal import inverse_frequencies


def _rotation_dynamics(freqs, xp, device, dtype):
    """``dp/dt`` of the pairs ``(sin, cos)``: ``(w cos, -w sin)``, each pair swapped (a flip,
    which keeps a Dask state in its chunk: a stack and reshape of the halves split it
    further at every stage, a state of 64 values in 64 chunks after a few steps) times
    ``(w, -w)``."""
    w = xp.asarray([v for f in freqs for v in (f, -f)], dtype=dtype, device=device)

    def dynamics(p, t):
        return w * xp.reshape(xp.flip(xp.reshape(p, (-1, 2)), axis=-1), (-1,))

    return dynamics


def _checked(dynamics, dim):
    """``dynamics`` whose every result is checked to be a real ``[dim]`` derivative (or one that
    broadcasts to it: a number, ``[1]``): a result of another shape made the state grow
    an axis per RK4 stage, until an ``IndexError`` deep inside or a silently wrong shape."""

    def checked(p, t):
        dp = dynamics(p, t)
        if isinstance(dp, numbers.Real) and not isinstance(dp, bool):
            return dp
        shape = getattr(dp, "shape", None)
        if not check.is_array(dp) or shape is None:
            raise TypeError(f"dynamics(p, t) must return an array of shape ({dim},) (dp/dt), got {type(dp).__name__}")
        if tuple(shape) not in ((dim,), (1,), ()):
            raise ValueError(f"dynamics(p, t) must return an array of shape ({dim},) (dp/dt, like p), got shape {tuple(shape)}")
        xp = namespace(dp)
        if not (is_real_floating(xp, dp.dtype) or is_integer(xp, dp.dtype)):  # (a complex state was returned as its real part)
            raise TypeError(f"dynamics(p, t) must return a real array (dp/dt, like p), got dtype {dp.dtype}")
        return dp

    return checked


def _rk4_step(f, p, t, h):
    k1 = f(p, t)
    k2 = f(p + (h / 2) * k1, t + h / 2)
    k3 = f(p + (h / 2) * k2, t + h / 2)
    k4 = f(p + h * k3, t + h)
    return p + (h / 6) * (k1 + 2 * k2 + 2 * k3 + k4)


MAX_RK4_STEP = 1 / 32
"""The default RK4 step: ``substeps`` defaults to the fewest that keep each step this short."""

MAX_DEFAULT_SUBSTEPS = 2**16
"""The most RK4 steps a position ``substeps`` defaults to (``step`` up to 2048); past it, a call
would run for hours unseen: ``substeps`` must then be given."""

RK4_ROTATION_LIMIT = 2 * math.sqrt(2)
"""RK4 multiplies a rotation's amplitude by more than 1 a step when ``omega * h`` exceeds this."""


def floater(length, dim, *, dynamics=None, p0=None, step=1.0, substeps=None, base=10000.0, xp=None, device=None, dtype=None):
    r"""FLOATER position encodings (Liu et al., "Learning to Encode Position for
    Transformer with Continuous Dynamical Model", ICML 2020).

    Integrates :math:`dp/dt = h(p, t)` with the classical fourth-order Runge-Kutta method,
    ``substeps`` RK4 steps per ``step``, and returns :math:`p` at ``t = 0, step, 2*step,
    ...``. The default dynamics is the rotation :math:`\dot p_{2i} = \omega_i p_{2i+1},
    \dot p_{2i+1} = -\omega_i p_{2i}` with :math:`\omega_i = \text{base}^{-2i/d}`, whose
    solution from :math:`p_0 = (0, 1, 0, 1, \dots)` is the interleaved sinusoid: FLOATER
    then reproduces ``sinusoidal(length, dim)``.

    RK4's error grows with its step :math:`h` (as :math:`h^4`) and with time, and for
    :math:`\omega h > 2\sqrt{2}` the rotation's solution grows without bound (refused for
    the default dynamics, whose fastest :math:`\omega` is 1). The default
    ``substeps`` keeps :math:`h \le 1/32` whatever ``step`` is (32 substeps at ``step=1``):
    the default dynamics then stays within 1e-4 of the sinusoid up to :math:`t = 4096`
    (measured in float64: 2.0e-6 at 256 positions, 8.1e-6 at 1024, 3.3e-5 at 4096). A
    state that stops being finite (in the result's dtype) raises ``ValueError`` where its
    values can be read (not under tracing).

    Parameters
    ----------
    length : int
        Number of positions.
    dim : int
        Feature size (even for the default dynamics).
    dynamics : callable ``(p, t) -> dp/dt``, optional
        Takes and returns ``[dim]`` arrays of the result's namespace (a neural ODE's
        right-hand side in the paper).
    p0 : array ``[dim]``, optional
        The initial state (default: the sinusoid at ``t=0``).
    step : float
        Time between two positions.
    substeps : int, optional
        RK4 steps per position (default ``max(32, ceil(32 * step))``: steps of at most
        ``MAX_RK4_STEP``; a ``step`` that would need more than ``MAX_DEFAULT_SUBSTEPS`` is
        refused without it).

    Examples
    --------
    >>> import numpy as np, posenc as pe
    >>> f = pe.floater(16, 8)
    >>> bool(np.abs(f - pe.sinusoidal(16, 8)).max() < 1e-4)
    True
    """
    length = check.integer("length", length, minimum=0)
    dim = check.integer("dim", dim, minimum=1)
    check.allocatable("floater's state", (8, dim), 8)  # (the ODE's vectors, each of dim values)
    check.allocatable("floater", (length, dim), 8)
    step = check.real("step", step, positive=True)
    if substeps is None:
        if step > MAX_DEFAULT_SUBSTEPS * MAX_RK4_STEP:
            raise ValueError(
                f"step={step:g} needs {step / MAX_RK4_STEP:.3g} RK4 steps a position at the default step of {MAX_RK4_STEP:g} "
                f"(more than {MAX_DEFAULT_SUBSTEPS}): give substeps, the RK4 steps a position, explicitly"
            )
        substeps = max(32, math.ceil(step / MAX_RK4_STEP))
    else:
        substeps = check.integer("substeps", substeps, minimum=1)
    base = check.real("base", base, positive=True)
    if dynamics is not None and not callable(dynamics):
        raise TypeError(f"dynamics must be callable (p, t) -> dp/dt, got {type(dynamics).__name__}")
    if p0 is not None:
        xp, p0 = argument_in("p0", p0, xp, device)
        check.float_array("p0", p0, xp)
        if tuple(p0.shape) != (dim,):
            raise ValueError(f"p0 must have shape ({dim},), got {tuple(p0.shape)}")
        device = device_of(p0)
    else:
        xp = namespace(xp=xp)
    out_dtype = result_dtype(xp, dtype if dtype is not None or p0 is None else p0.dtype, device)
    work = widest_float(xp, device)
    if (dynamics is None or p0 is None) and dim % 2:
        raise ValueError(f"dim must be a positive even integer unless both dynamics and p0 are given, got {dim}")
    if dynamics is not None:
        dynamics = _checked(dynamics, dim)
    else:
        if step / substeps > RK4_ROTATION_LIMIT:  # the fastest rotation has frequency 1
            raise ValueError(
                f"step / substeps = {step / substeps:g} is beyond RK4's stability limit 2*sqrt(2) for the default dynamics "
                f"(its rotation of frequency 1 would grow without bound): give more substeps or a smaller step"
            )
        dynamics = _rotation_dynamics(inverse_frequencies(dim, base), xp, device, work)
    if p0 is None:
        p = xp.reshape(xp.stack([xp.zeros(dim // 2, dtype=work, device=device), xp.ones(dim // 2, dtype=work, device=device)], axis=-1), (dim,))
    else:
        p = cast(xp, p0, work)
    h = step / substeps
    rows = []
    t = 0.0
    for i in range(length):
        rows.append(p)
        for _ in range(substeps if i + 1 < length else 0):
            p = _rk4_step(dynamics, p, t, h)
            t += h
    if not rows:
        return xp.zeros((0, dim), dtype=out_dtype, device=device)
    table = cast(xp, xp.stack(rows, axis=0), out_dtype)
    if check.is_eager(table):
        finite = xp.all(xp.isfinite(table), axis=1)
        if not bool(xp.all(finite)):
            first = int(xp.argmin(xp.astype(finite, xp.int8)))
            raise ValueError(
                f"floater's integration diverged: the state at position {first} (t = {first * step}) is not finite in {table.dtype}; "
                f"a smaller RK4 step (more substeps than {substeps}, or a smaller step), other dynamics or a wider dtype may keep it finite"
            )
    return table
