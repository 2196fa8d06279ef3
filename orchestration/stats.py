"""Seed statistics: a mean with its 95% t-interval, and a difference paired by seed.

Every interval here is the half-width h of mean ± h, h = t(0.975, n-1) · s / √n with s the
sample standard deviation (ddof 1), so the table reads `0.652 ± 0.012` and the interval is
[0.640, 0.664]. With n = 1 there is no spread to estimate: the half-width is NaN, not 0.

A paired difference is the interval of the per-seed differences a_s − b_s over the seeds
both sides ran. Seeds move every configuration the same way (same data order, same head
initialisation), so the pairing removes that shared noise: a small, consistent gain between
seeds that disagree by much more than the gain is still resolved, where two independent
intervals would overlap.
"""
from __future__ import annotations

import math
from functools import lru_cache
from typing import Iterable, Mapping

LEVEL = 0.95


@lru_cache(maxsize=None)
def t_quantile(df: int, level: float = LEVEL) -> float:
    """The two-sided t critical value (12.706 for df 1 at 95%). Cached: a leaderboard asks
    once per configuration, and nearly all share a handful of n. scipy.special's inverse t
    CDF, not scipy.stats (a second of import for the same function)."""
    from scipy.special import stdtrit

    return float(stdtrit(df, 0.5 + level / 2))


def mean_ci(values: Iterable[float], level: float = LEVEL) -> tuple[float, float, int]:
    """(mean, CI half-width, n) of the finite values; half-width NaN when n < 2."""
    xs = [float(v) for v in values if v is not None and not math.isnan(float(v))]
    n = len(xs)
    if n == 0:
        return math.nan, math.nan, 0
    mean = sum(xs) / n
    if n < 2:
        return mean, math.nan, n
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
    return mean, t_quantile(n - 1, level) * sd / math.sqrt(n), n


def paired_delta(a: Mapping[object, float], b: Mapping[object, float],
                 level: float = LEVEL) -> tuple[float, float, int]:
    """(mean of a[s] − b[s], CI half-width, n paired seeds) over the seeds present, finite, in both."""
    diffs = []
    for seed, va in a.items():
        vb = b.get(seed)
        if va is None or vb is None or math.isnan(float(va)) or math.isnan(float(vb)):
            continue
        diffs.append(float(va) - float(vb))
    return mean_ci(diffs, level)
