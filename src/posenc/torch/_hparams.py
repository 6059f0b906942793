"""The length-dependent hyperparameters of ``posenc extrapolate``, scaled to the training length.

The papers set them for their own training length; at 16 tokens instead of 2,048 their values
leave the mechanism idle (FIRE's threshold 512 keeps the normaliser constant, xPos's
``scale_base`` 512 barely decays). The rule keeps each at the paper's ratio to the training
sequence length ``T`` (tokens, the task's longest training input), or, for the randomised
range, covers the longest test sequence ``E``:

========================  ===============================  ===========================================
hyperparameter            paper (training length)          rule here
========================  ===============================  ===========================================
``fire.L``                512 (2,048; Li et al. 2024)      ``T / 4``
``xpos.scale_base``       512 (1,024; Sun et al. 2023)     ``T / 2``
``cope.P``                the context (Golovneva 2024)     ``T`` (counts past it share the last row)
``sandwich.base``         10,000 (512; Chi et al. 2023)    ``10000 ** (ln T / ln 512)``
``sandwich.dim``          128                              128
``randomized.M``          ``L`` >= the longest test        ``E``
========================  ===============================  ===========================================

Sandwich's bias is ``sum_k cos(r w_k) - d/2`` with ``w_k = base ** (-2k / d)``: ``d`` sets its
size (how many frequencies add up), the base its reach (which frequencies turn within ``r``
tokens). Scaling ``d`` with ``T`` would only shrink the bias (``d = 4`` at 16 tokens leaves two
frequencies below 0.01: no bias at all); scaling the base keeps the share of frequencies that
turn within the training window, ``ln T / ln base``, at the paper's 0.68. Any value can be set
per encoding (``--hparam fire.L=8``, :func:`parse`); the results record the values used.
"""

from __future__ import annotations

import math

NAMES = {"fire": ("L",), "xpos": ("scale_base",), "cope": ("P",), "sandwich": ("dim", "base"), "randomized": ("M",)}


def scaled(train_seq, eval_seq):
    """``{encoding: {name: value}}`` for a task whose longest training input is ``train_seq``
    tokens and longest test input ``eval_seq``."""
    return {
        "fire": {"L": train_seq / 4},
        "xpos": {"scale_base": train_seq / 2},
        "cope": {"P": train_seq},
        "sandwich": {"dim": 128, "base": 10000.0 ** (math.log(train_seq) / math.log(512))},
        "randomized": {"M": eval_seq},
    }


def parse(texts):
    """``["fire.L=8", ...]`` as ``{"fire": {"L": 8.0}}``; a ValueError naming the bad item.
    ``cope.P``, ``sandwich.dim`` and ``randomized.M`` are positive integers (``sandwich.dim``
    even), the others positive numbers."""
    overrides = {}
    for text in texts or ():
        key, sep, value = text.partition("=")
        encoding, dot, name = key.strip().partition(".")
        if not (sep and dot) or name not in NAMES.get(encoding, ()):
            valid = ", ".join(f"{e}.{n}" for e, names in NAMES.items() for n in names)
            raise ValueError(f"--hparam {text!r}: expected ENCODING.NAME=VALUE with ENCODING.NAME one of {valid}")
        integer = (encoding, name) in {("cope", "P"), ("sandwich", "dim"), ("randomized", "M")}
        try:
            number = int(value) if integer else float(value)
        except ValueError:
            number = None
        if number is None or not 0 < number < math.inf or (name == "dim" and number % 2):
            what = "an even positive integer" if name == "dim" else "a positive integer" if integer else "a positive number"
            raise ValueError(f"--hparam {text!r}: {key} must be {what}")
        overrides.setdefault(encoding, {})[name] = number
    return overrides


def resolve(train_seq, eval_seq, overrides):
    """:func:`scaled`'s values with ``overrides`` (from :func:`parse`) in their place."""
    values = scaled(train_seq, eval_seq)
    for encoding, given in (overrides or {}).items():
        values[encoding].update(given)
    return values
