"""Absolute family: ``sinusoidal``, and its time over the plain NumPy formula's (in turns).

Lengths 2048 and a model-sized 32768, widths 128 and 1024."""

import numpy as np

import posenc as pe

from .common import Benchmark, ratio


def plain_sinusoidal(n, dim, base=10000.0):
    position = np.arange(n, dtype=np.float64)[:, None]
    div_term = base ** (-np.arange(0, dim, 2) / dim)
    out = np.empty((n, dim), dtype=np.float32)
    out[:, 0::2] = np.sin(position * div_term)
    out[:, 1::2] = np.cos(position * div_term)
    return out


class Sinusoidal(Benchmark):
    params = ([2048, 32768], [128, 1024])
    param_names = ["length", "dim"]

    def make(self, n, dim):
        self.n, self.dim = n, dim

    def time_sinusoidal_posenc(self, n, dim):
        pe.sinusoidal(n, dim)

    def track_sinusoidal_time_over_plain_numpy(self, n, dim):
        return ratio(lambda: pe.sinusoidal(n, dim), lambda: plain_sinusoidal(n, dim), repeat=3)

    track_sinusoidal_time_over_plain_numpy.unit = "x formula time"

    def track_sinusoidal_max_error_at_2_24(self, n, dim):
        pos = np.arange(2**24 - n, 2**24)
        i = np.arange(dim // 2)
        angle = pos[:, None].astype(np.float64) / 10000.0 ** (2 * i / dim)
        exact = np.empty((n, dim))
        exact[:, 0::2], exact[:, 1::2] = np.sin(angle), np.cos(angle)
        return float(np.abs(pe.sinusoidal(pos, dim) - exact).max())

    track_sinusoidal_max_error_at_2_24.unit = "abs error"
