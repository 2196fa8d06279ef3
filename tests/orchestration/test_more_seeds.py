"""More seeds for a finished sweep keep the stated error rate: the earlier looks keep their
boundaries, the added looks spend only the error those left (verdicts.extended_bounds).

Exactly over the sign test's Binomial walk, and simulated through the library's public
functions (`intervals`, `outcomes`, `is_open`) on sweeps that are extended *because* their claim
was still open at the first maximum, the worst case of a data-dependent extension. Print the
figures with:

    .venv/bin/python -m pytest -s tests/orchestration/test_more_seeds.py
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from orchestration.report import verdicts

SWEEPS = 20_000
FIRST, LAST, MORE = 3, 12, 20


def test_the_earlier_looks_keep_their_bounds_and_all_looks_their_rate():
    for alpha in (0.05, 0.05 / 3, 0.05 / 10):
        kept = verdicts.sign_bounds(FIRST, LAST, alpha)
        extended = verdicts.extended_bounds((FIRST, LAST, MORE), alpha)
        assert extended[:len(kept)] == kept  # the verdicts already given stand as they were
        assert verdicts.walk_miss(FIRST, extended) <= alpha / 2
        twice = verdicts.extended_bounds((FIRST, LAST, 16, MORE), alpha)
        assert twice[:len(kept)] == kept and verdicts.walk_miss(FIRST, twice) <= alpha / 2
    extended = verdicts.extended_bounds((FIRST, LAST, MORE))
    assert extended[LAST - FIRST + 1:] == (2, 2, 3, 3, 3, 4, 4, 4)  # looks 13..20
    # A boundary for the new maximum from the start, taken from look 13 on after the first
    # design ran to 12 with its own: together they miss 3.08% a side, over the stated 2.5%.
    naive = verdicts.sign_bounds(FIRST, LAST) + verdicts.sign_bounds(FIRST, MORE)[LAST - FIRST + 1:]
    assert verdicts.walk_miss(FIRST, naive) == pytest.approx(0.030783, abs=1e-6)
    assert verdicts.walk_miss(FIRST, extended) == pytest.approx(0.023861, abs=1e-6)
    # The interval of a claim with an extended design, from seed -> value mappings.
    a = {s: float(s % 7) for s in range(MORE)}
    found = verdicts.interval(a, {s: 0.0 for s in a}, (FIRST, LAST, MORE))
    ordered = sorted(a.values())
    assert (found.low, found.high) == (ordered[3], ordered[MORE - 4])  # k = 4 at look 20
    assert verdicts.first_decidable((FIRST, LAST, MORE)) == 6


def _noise(kind: str, rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    """Per-seed differences whose median is 0."""
    if kind == "normal":
        return rng.normal(size=shape)
    if kind == "t3":
        return rng.standard_t(3, size=shape)
    return rng.lognormal(0.0, 1.0, size=shape) - 1.0  # skewed right, median exp(0) − 1 = 0


def _sweeps(d: np.ndarray, design, delta: float) -> tuple[float, float, float]:
    """(wrong up, wrong down, mean seeds) of adaptive sweeps on the differences `d` (θ = 0):
    a look after every seed from FIRST, stopping once decided; those still open at LAST go on
    to MORE. `design(n)`: the looks the interval at n is taken under."""
    code = np.full(len(d), verdicts.OUTCOMES.index(verdicts.INCONCLUSIVE))
    seeds = np.full(len(d), MORE)
    running = np.ones(len(d), dtype=bool)
    for n in range(FIRST, MORE + 1):
        found = verdicts.intervals(d[running, :n], np.zeros((int(running.sum()), n)), design(n))
        now = verdicts.outcomes(found["low"], found["high"], ">", delta)
        code[running] = now
        done = ~verdicts.is_open(now, np.full(len(now), n), MORE)
        index = np.flatnonzero(running)[done]
        seeds[index] = n
        running[index] = False
    up = np.mean(code == verdicts.OUTCOMES.index(verdicts.HOLDS))  # A > B "holds" with θ = 0
    down = np.mean(code == verdicts.OUTCOMES.index(verdicts.CONTRADICTED))
    return float(up), float(down), float(seeds.mean())


@pytest.mark.parametrize("kind", ["normal", "t3", "lognormal"])
def test_an_extension_decided_by_the_verdicts_keeps_the_rate(kind):
    rng = np.random.default_rng({"normal": 1, "t3": 2, "lognormal": 3}[kind])
    d = _noise(kind, rng, (SWEEPS, MORE))
    # δ tiny: "no difference that matters" almost never stops a sweep, so every sweep runs until
    # its interval leaves 0 or it reaches 20 seeds: the rate is spent in full.
    delta = 1e-3
    se = math.sqrt(0.025 * 0.975 / SWEEPS)
    extended = _sweeps(d, lambda n: (FIRST, LAST, MORE), delta)
    naive = _sweeps(d, lambda n: (FIRST, LAST) if n <= LAST else (FIRST, MORE), delta)
    print(f"\n{kind}: extended 3..12..20 wrong up {extended[0]:.2%}, down {extended[1]:.2%} "
          f"(exact {verdicts.walk_miss(FIRST, verdicts.extended_bounds((FIRST, LAST, MORE))):.2%}), "
          f"mean seeds {extended[2]:.1f}; boundary of 3..20 from look 13: up {naive[0]:.2%}, down {naive[1]:.2%} "
          f"(Monte Carlo standard error {se:.2%}, {SWEEPS} sweeps)")
    assert extended[0] <= 0.025 + 3 * se and extended[1] <= 0.025 + 3 * se
    assert naive[0] + naive[1] > 0.05 + 3 * se  # the shortcut this design avoids breaks the rate
