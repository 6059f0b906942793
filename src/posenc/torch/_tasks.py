"""Synthetic length-generalisation tasks, generated on the fly from a seeded NumPy generator.

A task draws ``batch`` sequences of ``n`` items and returns ``(sequences, prompt)``: token ids
``int64 [batch, length]`` and the number of tokens before the answer (the prompt ends with
``SEP``, or for ``count`` with ``SEP`` and the query). The model reads the prompt and writes ``sequences[:, prompt:]``; accuracy and the
training loss count those tokens only. One vocabulary serves every task: ``SYMBOLS`` item
tokens (digits and bits are the first of them), ``SEP``, ``PLUS`` and ``MINUS``.

The algorithmic tasks follow Delétang et al. (ICLR 2023) and Ruoss et al. (ACL 2023): reverse,
duplicate, parity, modular arithmetic, sort and bucket sort; ``copy`` was this harness's first
task, ``count`` is a selective count in the spirit of CoPE's counting task (Golovneva et al. 2024).
"""

from __future__ import annotations

import math

import numpy as np

SYMBOLS = 64
SEP, PLUS, MINUS = SYMBOLS, SYMBOLS + 1, SYMBOLS + 2
VOCAB = SYMBOLS + 3
BUCKETS = 5  # bucket sort's alphabet
MODULUS = 5  # modular arithmetic's
COUNT_ALPHABET, MAX_COUNT = 8, 4  # count: symbols drawn from, most times the query occurs


def _items(rng, batch, n):
    """``[batch, n]`` distinct symbols per row (so "where is this token?" has one answer)."""
    return np.argsort(rng.random((batch, SYMBOLS)), axis=1)[:, :n]


def _join(*parts):
    """Columns and ``[batch, k]`` blocks side by side; an int is a column of that token."""
    batch = next(p.shape[0] for p in parts if not isinstance(p, int))
    blocks = [np.full((batch, 1), p, dtype=np.int64) if isinstance(p, int) else p.astype(np.int64) for p in parts]
    return np.concatenate(blocks, axis=1)


def copy(rng, batch, n):
    """``x_1 .. x_n SEP x_1 .. x_n``, ``n`` distinct symbols."""
    x = _items(rng, batch, n)
    return _join(x, SEP, x), n + 1


def reverse(rng, batch, n):
    """``x_1 .. x_n SEP x_n .. x_1`` (Delétang et al.'s reverse string)."""
    x = _items(rng, batch, n)
    return _join(x, SEP, x[:, ::-1]), n + 1


def duplicate(rng, batch, n):
    """``x_1 .. x_n SEP x_1 .. x_n x_1 .. x_n`` (duplicate string)."""
    x = _items(rng, batch, n)
    return _join(x, SEP, x, x), n + 1


def sort(rng, batch, n):
    """``x_1 .. x_n SEP`` the items in increasing order (distinct symbols)."""
    x = _items(rng, batch, n)
    return _join(x, SEP, np.sort(x, axis=1)), n + 1


def bucket_sort(rng, batch, n):
    """``x_1 .. x_n SEP`` the items in increasing order, from an alphabet of ``BUCKETS``
    symbols with repeats (Delétang et al.'s bucket sort)."""
    x = rng.integers(0, BUCKETS, (batch, n))
    return _join(x, SEP, np.sort(x, axis=1)), n + 1


def parity(rng, batch, n):
    """``b_1 .. b_n SEP p``: bits (symbols 0 and 1), ``p`` the parity of their sum (parity check)."""
    bits = rng.integers(0, 2, (batch, n))
    return _join(bits, SEP, bits.sum(axis=1, keepdims=True) % 2), n + 1


def modular_arithmetic(rng, batch, n):
    """``d_1 o_1 d_2 .. o_{n-1} d_n SEP r``: ``n`` digits ``0 .. MODULUS - 1`` joined by ``PLUS``
    or ``MINUS``, ``r`` the value modulo ``MODULUS`` (Delétang et al.'s modular arithmetic,
    without ``×``, so that left to right is the only reading)."""
    digits = rng.integers(0, MODULUS, (batch, n))
    signs = rng.integers(0, 2, (batch, n - 1))
    expression = np.empty((batch, 2 * n - 1), dtype=np.int64)
    expression[:, 0::2], expression[:, 1::2] = digits, np.where(signs == 1, MINUS, PLUS)
    value = digits[:, :1] + (np.where(signs == 1, -1, 1) * digits[:, 1:]).sum(axis=1, keepdims=True)
    return _join(expression, SEP, value % MODULUS), 2 * n


def count(rng, batch, n):
    """``x_1 .. x_n SEP q c``: how often the query symbol ``q`` occurs among the ``n`` items,
    ``c`` drawn uniformly from ``0 .. min(n, MAX_COUNT)`` whatever ``n`` (so the answer's range
    does not grow with the length, only the distractors do); the other items are drawn from
    the rest of ``COUNT_ALPHABET`` symbols. The query comes last, where the answer is read, so
    the count is a question of which earlier tokens to count (CoPE's gates), not of carrying
    the query there from the start."""
    query = rng.integers(0, COUNT_ALPHABET, batch)
    c = rng.integers(0, min(n, MAX_COUNT) + 1, batch)
    others = (query[:, None] + rng.integers(1, COUNT_ALPHABET, (batch, n))) % COUNT_ALPHABET
    at = np.argsort(rng.random((batch, n)), axis=1) < c[:, None]  # c random places per row
    items = np.where(at, query[:, None], others)
    return _join(items, SEP, query[:, None], c[:, None]), n + 2


TASKS = {
    "copy": copy, "reverse": reverse, "duplicate": duplicate, "sort": sort, "bucket_sort": bucket_sort,
    "parity": parity, "modular_arithmetic": modular_arithmetic, "count": count,
}  # fmt: skip
DISTINCT = ("copy", "reverse", "duplicate", "sort")  # at most SYMBOLS items
# (tokens per item, tokens besides) of the model's input, the whole sequence but its last token
INPUT_TOKENS = {
    "copy": (2, 0), "reverse": (2, 0), "duplicate": (3, 0), "sort": (2, 0), "bucket_sort": (2, 0),
    "parity": (1, 1), "modular_arithmetic": (2, 0), "count": (1, 2),
}  # fmt: skip


def max_items(task):
    """The largest item count ``task`` can draw (distinct symbols run out at ``SYMBOLS``)."""
    return SYMBOLS if task in DISTINCT else None


def chance(task, n):
    """The exact match of always writing the likeliest answer of ``n``-item sequences of
    ``task``: what a model that ignores its input reaches at best (parity 0.5, modular
    arithmetic 1 / ``MODULUS``, count ``1 / (min(n, MAX_COUNT) + 1)``, near 0 for the rest)."""
    if task == "parity":
        return 0.5
    if task == "modular_arithmetic":
        return 1 / MODULUS  # (the first digit is uniform: so is the value)
    if task == "count":
        return 1 / (min(n, MAX_COUNT) + 1)
    if task == "bucket_sort":  # the likeliest counts of each symbol: as even as n allows
        each, extra = divmod(n, BUCKETS)
        ways = math.factorial(n) // (math.factorial(each + 1) ** extra * math.factorial(each) ** (BUCKETS - extra))
        return ways / BUCKETS**n  # (integers divided once: no float overflow at hundreds of items)
    if task == "sort":  # the answer is the set of items
        return 1 / math.comb(SYMBOLS, n)
    return 1 / math.perm(SYMBOLS, n)  # copy, reverse, duplicate: the items in order


def seq_len(task, n):
    """The model's input length for ``n`` items (the whole sequence but its last token)."""
    per_item, besides = INPUT_TOKENS[task]
    return per_item * n + besides


def items_within(task, tokens):
    """The most items whose input is at most ``tokens`` tokens long."""
    per_item, besides = INPUT_TOKENS[task]
    return (tokens - besides) // per_item
