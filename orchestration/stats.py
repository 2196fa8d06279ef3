"""Seed statistics: a mean with its 95% t-interval, and a difference paired by seed.

Every interval here is the half-width h of mean ± h, h = t(0.975, n-1) · s / √n with s the
sample standard deviation (ddof 1), so the table reads `0.652 ± 0.012` and the interval is
[0.640, 0.664]. With n = 1 there is no spread to estimate: the half-width is NaN, not 0.

A paired difference is the interval of the per-seed differences a_s − b_s over the seeds
both sides ran. Seeds move every configuration the same way (same data order, same head
initialisation), so the pairing removes that shared noise: a small, consistent gain between
seeds that disagree by much more than the gain is still resolved, where two independent
intervals would overlap.

A sweep that adds seeds until a claim is decided looks at its interval after every seed, and
a 95% interval looked at ten times misses the truth at some look far more often than 5%
(18% over 3..12 seeds). Such a design declares its looks, (first, last) paired seeds,
and a t-interval uses the wider per-look level of `sequential_level`, which keeps 95% at
every look at once for normal differences. The verdicts (orchestration/report/verdicts.py) use it
for their `mean` method; their default interval, the median's, has an exact boundary of its own.
"""
from __future__ import annotations

import math
from functools import lru_cache
from typing import Iterable, Mapping

import numpy as np

LEVEL = 0.95
SIMULATED_SEQUENCES = 200_000
_CHUNK = 20_000
_SEED = 20_240_817  # fixed: the boundary is a constant of (first, last, level), not a draw per call


@lru_cache(maxsize=None)
def t_quantile(df: int, level: float = LEVEL) -> float:
    """The two-sided t critical value (12.706 for df 1 at 95%). scipy.special's inverse t CDF,
    not scipy.stats (a second of import for the same function)."""
    from scipy.special import stdtrit

    return float(stdtrit(df, 0.5 + level / 2))


@lru_cache(maxsize=None)
def sequential_level(first: int, last: int, level: float = LEVEL) -> float:
    """The per-look two-sided level c at which t-intervals mean ± t(½ + c/2, n−1)·s/√n, looked
    at after every paired seed n = first, first+1, ..., last, all cover the true mean with
    probability `level` (a calibrated group-sequential boundary, the same c at every look).

    (3, 3) is a fixed design and gives `level` itself; (3, 12) gives about 0.9894 for 0.95.
    The t-statistic does not change when the differences are shifted or scaled, so the joint
    law of (T_first, ..., T_last) is the same for every true mean and spread of normal
    per-seed differences: c is computed once, by Monte Carlo over SIMULATED_SEQUENCES
    standard normal sequences from a fixed seed, as the c whose intervals cover 0 at every
    look in exactly `level` of them (± 0.001, two standard errors). Misses at two looks on
    opposite sides are rarer than 1 in 100,000, so each side misses 2.5%. About 0.3 s and
    16 MB per 10 looks.
    """
    if not 2 <= first <= last:
        raise ValueError(f"looks ({first}, {last}): need 2 <= first <= last (an interval needs 2 seeds)")
    if first == last:
        return level
    from scipy.special import stdtrit

    n = np.arange(first, last + 1)[:, None]
    abs_t = []
    for chunk in range(SIMULATED_SEQUENCES // _CHUNK):
        # One generator per chunk, seeds drawn look after look: the first k looks see the
        # same numbers whatever `last` is, so c grows with `last` exactly, not only on average.
        x = np.random.default_rng([_SEED, chunk]).standard_normal((last, _CHUNK))
        total = np.cumsum(x, axis=0)[first - 1:]
        squares = np.cumsum(x * x, axis=0)[first - 1:]
        mean = total / n
        var = (squares - n * mean * mean) / (n - 1)
        abs_t.append(np.abs(mean) * np.sqrt(n / var))
    abs_t = np.concatenate(abs_t, axis=1)

    def coverage(c: float) -> float:
        return float((abs_t <= stdtrit(n - 1, 0.5 + c / 2)).all(axis=0).mean())

    low, high = level, 1.0  # coverage grows with c: bisect to well below one sequence's weight
    for _ in range(30):
        mid = (low + high) / 2
        low, high = (mid, high) if coverage(mid) < level else (low, mid)
    return high


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
    """(mean of a[s] − b[s], CI half-width, n paired seeds): the fixed-design t-interval of the
    differences over the seeds present, finite, in both. The verdicts' own intervals (the
    median's, free of assumptions; sequential and family-wise) are orchestration/report/verdicts.py's."""
    diffs = []
    for seed, va in a.items():
        vb = b.get(seed)
        if va is None or vb is None or math.isnan(float(va)) or math.isnan(float(vb)):
            continue
        diffs.append(float(va) - float(vb))
    return mean_ci(diffs, level)
