"""What ``rerotate`` can tell about a chained rerotation: memory it moved to new frequencies itself.

A cache does not say which frequencies its keys were rotated with, so ``rerotate`` cannot
tell a chain (step n's frequencies to step n + 1's, rounding once more at every step) from
the exact recipe (the frequencies the keys were first rotated with, to the current ones, in
one step) by looking at the keys. It can tell one thing: that the memory it is asked to
move again to other frequencies holds keys that it moved itself. Every frequency-changing
call notes the memory it wrote (its byte range, held by a weak reference to the array that
owns it, so memory freed and reused elsewhere is never mistaken for it); a frequency-changing
call whose ``x`` meets noted memory is a chain. A chain through a copy (a concatenation, a
``rope(..., out=)`` rewrite of the same memory) is not seen.
"""

from __future__ import annotations

import warnings
import weakref

from .. import _validate as check

_NOTED = []  # (weak reference to the owning array, low byte, high byte), most recent last
_KEEP = 16


def _owner_and_range(a):
    """The array that owns ``a``'s memory and the byte range ``a`` views, or None when unknown."""
    if not check.is_array(a) or not check.is_eager(a):
        return None
    span = check.byte_range(a)
    if span is None:
        return None
    owner = a
    while getattr(owner, "base", None) is not None and type(owner.base) is type(a):  # NumPy views
        owner = owner.base
    if getattr(owner, "_base", None) is not None:  # torch views
        owner = owner._base
    try:
        return weakref.ref(owner), span[0], span[1]
    except TypeError:  # an array type without weak references: nothing noted
        return None


def note(written):
    """``written`` now holds keys that a frequency-changing ``rerotate`` produced."""
    found = _owner_and_range(written)
    if found is None:
        return
    # In place, each step one list operation: another thread's note made meanwhile is never
    # written over by a copy taken before it (its chain would go unwarned).
    _NOTED.append(found)
    for entry in [entry for entry in _NOTED if entry[0]() is None]:
        try:
            _NOTED.remove(entry)
        except ValueError:  # another thread's note removed it first
            pass
    del _NOTED[:-_KEEP]


def warn_if_chained(x):
    """A ``RuntimeWarning`` when ``x`` meets memory that a frequency-changing ``rerotate`` wrote."""
    found = _owner_and_range(x)
    if found is None:
        return
    _, low, high = found
    if any(ref() is not None and low < end and start < high for ref, start, end in _NOTED):
        warnings.warn(
            "rerotate: x holds keys that rerotate already moved to other frequencies; moving them again "
            "chains two roundings (a 16-bit cache drifts step by step). Rerotate from the frequencies the keys "
            "were first rotated with, in one step, into a separate buffer (rerotate(cache, positions, "
            "scaling=..., seq_len=n, out=work) does exactly that), or rotate unrotated keys at attention time",
            RuntimeWarning,
            stacklevel=3,
        )
