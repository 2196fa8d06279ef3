"""Adaptive seeds, simulated: a sweep starts with 3 paired seeds, adds one while its claim
(A > B, δ = 0.01) is undecided and stops when it is decided or has 12. Per-seed differences
are normal with spread σ = δ. With no true effect a wrong "holds" stays under 5%; with an
effect of 2δ the claim holds by 12 seeds in at least 80% of sweeps, and on fewer seeds on
average than the fixed design of the same power. `pytest -s` prints the figures."""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.special import nctdtr, stdtrit

from orchestration.report.verdicts import HOLDS, decide
from orchestration.stats import LEVEL, sequential_level
from orchestration.sweep.claims import Claim

DELTA = SIGMA = 0.01
FIRST, LAST = 3, 12
SWEEPS = 4000
ZERO = dict.fromkeys(range(LAST), 0.0)  # B: the per-seed difference is A's value


def claim(looks: tuple[int, int] | None = (FIRST, LAST)) -> Claim:
    return Claim("A > B", "overall", {"variant": "a"}, {"variant": "b"}, ">", DELTA, looks=looks)


def sweep(diffs: np.ndarray, c: Claim) -> tuple[str, int]:
    """(final verdict, paired seeds used) of one adaptive sweep over these per-seed differences."""
    n = FIRST
    while True:
        verdict = decide(dict(enumerate(diffs[:n].tolist())), ZERO, c)
        if verdict.decided or n == len(diffs):
            return verdict.outcome, n
        n += 1


def sweeps(effect: float, c: Claim, seed: int, count: int = SWEEPS, seeds: int = LAST) -> tuple[float, float]:
    """(share of sweeps ending in holds, mean seeds used)."""
    found = [sweep(row, c) for row in np.random.default_rng(seed).normal(effect, SIGMA, (count, seeds))]
    return float(np.mean([o == HOLDS for o, _ in found])), float(np.mean([n for _, n in found]))


def test_the_calibrated_level_is_the_fixed_one_for_one_look_and_grows_with_the_looks():
    assert sequential_level(3, 3) == LEVEL and sequential_level(5, 5, 0.9) == 0.9
    levels = [sequential_level(FIRST, last) for last in (4, 8, 12)]
    assert LEVEL < levels[0] < levels[1] < levels[2] < 1  # each look's own error 1 − c shrinks
    with pytest.raises(ValueError):
        sequential_level(1, 12)


def test_the_calibrated_intervals_cover_at_every_look_at_once():
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


def test_no_true_effect_rarely_holds_and_a_real_one_holds_on_fewer_seeds_than_a_fixed_design():
    wrong, _ = sweeps(0.0, claim(), seed=1)
    wrong_plain, _ = sweeps(0.0, claim(looks=None), seed=1)  # the same sweeps, plain 95% at every look
    power, mean_seeds = sweeps(2 * DELTA, claim(), seed=2)
    # The fixed design: n seeds, one plain 95% interval, its power P(low > 0) exact by the
    # noncentral t. It counts the rare intervals inside (0, δ) as holds, which only flatters it.
    fixed_n, fixed_power = next((n, p) for n in range(FIRST, 100)
                                if (p := 1 - nctdtr(n - 1, 2 * DELTA / SIGMA * math.sqrt(n), stdtrit(n - 1, 0.975)))
                                >= power)
    report = (f"no effect: wrong holds in {wrong:.2%} of {SWEEPS} sweeps (plain 95% intervals at every look: "
              f"{wrong_plain:.2%}); effect 2δ: holds in {power:.2%} by {LAST} seeds, {mean_seeds:.2f} paired "
              f"seeds on average; a fixed design needs {fixed_n} seeds for {fixed_power:.2%}")
    print("\n" + report)
    assert wrong <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / SWEEPS), report
    assert wrong < wrong_plain, report
    assert power >= 0.8, report
    assert mean_seeds < fixed_n, report
