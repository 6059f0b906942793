"""Synthetic length-generalisation tasks, generated on the fly from a seeded NumPy generator.

A task draws ``batch`` sequences of ``n`` items and returns ``(inputs, targets, answer)``:
``int64 [batch, seq]`` token ids, the next-token targets, and a boolean mask of the
target positions that are answers (accuracy and the training loss count those only).
One vocabulary serves every task: ``SYMBOLS`` item tokens, ``VALUES`` value tokens, ``SEP``.
"""

from __future__ import annotations

import numpy as np

SYMBOLS = 64
VALUES = 16
SEP = SYMBOLS + VALUES
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


def recall(rng, batch, n):
    """Associative recall ``k_1 v_1 .. k_n v_n SEP q_1 v(q_1) .. q_n v(q_n)``: distinct keys,
    values drawn with replacement; after the separator every key is asked once, in a random
    order, and each query's value is an answer (``n`` answers per sequence)."""
    keys = _items(rng, batch, n)
    values = SYMBOLS + rng.integers(0, VALUES, size=(batch, n))
    order = np.argsort(rng.random((batch, n)), axis=1)
    rows = np.arange(batch)[:, None]
    pairs = np.stack([keys, values], axis=2).reshape(batch, 2 * n)
    asked = np.stack([keys[rows, order], values[rows, order]], axis=2).reshape(batch, 2 * n)
    seq = np.concatenate([pairs, np.full((batch, 1), SEP), asked], axis=1)
    answer = np.zeros(seq.shape[1] - 1, dtype=bool)
    answer[2 * n + 1 :: 2] = True
    return seq[:, :-1], seq[:, 1:], np.broadcast_to(answer, (batch, seq.shape[1] - 1))


TASKS = {"copy": copy, "recall": recall}


def seq_len(task, n):
    """The model's input length for ``n`` items."""
    return 2 * n if task == "copy" else 4 * n
