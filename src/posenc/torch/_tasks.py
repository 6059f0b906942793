"""Synthetic length-generalisation tasks, generated on the fly from a seeded NumPy generator.

A task draws ``batch`` sequences of ``n`` items and returns ``(inputs, targets, answer)``:
``int64 [batch, seq]`` token ids, the next-token targets, and a boolean mask of the
target positions that are answers (accuracy and the training loss count those only).
One vocabulary serves every task: ``SYMBOLS`` item tokens and ``SEP``. The items of a
sequence are distinct, so "where is this token?" has one answer and copying can be learned
by content (an induction head) as well as by position.
"""

from __future__ import annotations

import numpy as np

SYMBOLS = 64
SEP = SYMBOLS
VOCAB = SEP + 1


def _items(rng, batch, n):
    """``[batch, n]`` distinct symbols per row (so "where is this token?" has one answer)."""
    return np.argsort(rng.random((batch, SYMBOLS)), axis=1)[:, :n]


def copy(rng, batch, n):
    """``x_1 .. x_n SEP x_1 .. x_n``: after the separator the model repeats the items."""
    x = _items(rng, batch, n)
    seq = np.concatenate([x, np.full((batch, 1), SEP), x], axis=1)
    answer = np.zeros(seq.shape[1] - 1, dtype=bool)
    answer[n:] = True
    return seq[:, :-1], seq[:, 1:], np.broadcast_to(answer, (batch, seq.shape[1] - 1))


def reverse(rng, batch, n):
    """``x_1 .. x_n SEP x_n .. x_1``: after the separator the model writes the items backwards."""
    x = _items(rng, batch, n)
    seq = np.concatenate([x, np.full((batch, 1), SEP), x[:, ::-1]], axis=1)
    answer = np.zeros(seq.shape[1] - 1, dtype=bool)
    answer[n:] = True
    return seq[:, :-1], seq[:, 1:], np.broadcast_to(answer, (batch, seq.shape[1] - 1))


TASKS = {"copy": copy, "reverse": reverse}


def seq_len(task, n):
    """The model's input length for ``n`` items."""
    return 2 * n
