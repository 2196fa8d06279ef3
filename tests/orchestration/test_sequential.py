"""Sequential boundaries: a sweep looks at its interval after every added seed (3 up to 12 paired
seeds here) and stops once it decides, so the interval must hold at every look at once.

The median's boundary (`sign_bounds`, the default interval) is exact and needs no assumption on
the noise; the mean's (`sequential_level`, method "mean") is calibrated by Monte Carlo for
normal differences. Both are checked here on draws independent of their own construction;
tests/orchestration/test_verdict_errors.py simulates whole sweeps. `pytest -s` prints the figures."""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.special import stdtrit

from orchestration.stats import LEVEL
from orchestration.report.verdicts import ALPHA, first_decidable, intervals, sequential_level, sign_bounds

FIRST, LAST = 3, 12


def test_the_median_boundary_is_exact_and_opens_at_six_seeds():
    assert sign_bounds(FIRST, LAST) == (0, 0, 0, 1, 1, 1, 1, 2, 2, 2)
    assert sign_bounds(6, 6) == (1,) and sign_bounds(5, 5) == (0,)  # 1/64 ≤ 2.5% < 1/32
    assert first_decidable((FIRST, LAST)) == 6 and first_decidable(None) == 6
    # A smaller error per claim (a family of 10 shares 5%) opens later.
    assert first_decidable((FIRST, LAST), ALPHA / 10) == 9
    assert sign_bounds(FIRST, LAST, ALPHA / 10) == (0, 0, 0, 0, 0, 0, 1, 1, 1, 1)
    with pytest.raises(ValueError):
        sign_bounds(0, 12)


@pytest.mark.parametrize("family", ["normal", "lognormal"])
def test_the_median_intervals_cover_at_every_look_at_once_whatever_the_noise(family):
    count = 40_000
    rng = np.random.default_rng(11)
    x = rng.standard_normal((count, LAST))
    if family == "lognormal":  # strongly skewed: median 1, mean e^0.5
        x = np.exp(x)
    truth = 0.0 if family == "normal" else 1.0
    below = above = np.zeros(count, dtype=bool)
    for n in range(FIRST, LAST + 1):
        found = intervals(x[:, :n], np.zeros((count, n)), (FIRST, LAST))
        below = below | (found["high"] < truth)
        above = above | (found["low"] > truth)
    se = math.sqrt(0.025 * 0.975 / count)
    print(f"\n{family}: the median's intervals miss it at some look {FIRST}..{LAST}: "
          f"from above {above.mean():.4f}, from below {below.mean():.4f} (exact: 0.0215 each)")
    assert above.mean() <= 0.025 + 3 * se and below.mean() <= 0.025 + 3 * se
    assert abs(above.mean() - 0.021484375) <= 4 * se  # the walk's exact miss, 11/512


def test_the_mean_level_is_the_fixed_one_for_one_look_and_grows_with_the_looks():
    assert sequential_level(3, 3) == LEVEL and sequential_level(5, 5, 0.9) == 0.9
    levels = [sequential_level(FIRST, last) for last in (4, 8, 12)]
    assert LEVEL < levels[0] < levels[1] < levels[2] < 1  # each look's own error 1 − c shrinks
    with pytest.raises(ValueError):
        sequential_level(1, 12)


def test_the_mean_intervals_cover_at_every_look_at_once_for_normal_noise():
    # Independent of the calibration's own draws: another generator, standard normal steps.
    count = 40_000
    x = np.random.default_rng(11).standard_normal((count, LAST))
    n = np.arange(FIRST, LAST + 1)
    mean = np.cumsum(x, axis=1)[:, FIRST - 1:] / n
    sd = np.sqrt((np.cumsum(x * x, axis=1)[:, FIRST - 1:] - n * mean**2) / (n - 1))

    def coverage(level: float) -> float:
        return float((np.abs(mean) <= stdtrit(n - 1, 0.5 + level / 2) * sd / np.sqrt(n)).all(axis=1).mean())

    calibrated, naive = coverage(sequential_level(FIRST, LAST)), coverage(LEVEL)
    print(f"\ncoverage at every look {FIRST}..{LAST}: calibrated {calibrated:.4f}, plain 95% intervals {naive:.4f}")
    se = math.sqrt(LEVEL * (1 - LEVEL) / count)
    assert abs(calibrated - LEVEL) <= 3 * se + 0.001, calibrated  # + the calibration's own Monte Carlo error
    assert naive < 0.85, naive  # why the boundary: ten looks at a 95% interval miss far more than 5%
    # The library's mean intervals are these.
    found = intervals(x[:, :7], np.zeros((count, 7)), (FIRST, LAST), method="mean")
    half = stdtrit(6, 0.5 + sequential_level(FIRST, LAST) / 2) * sd[:, 7 - FIRST] / math.sqrt(7)
    assert np.allclose(found["high"] - found["centre"], half)
