"""A claim about the divergence rate itself (`metric: diverged`): its error rate, simulated with
planted rates through the public functions (`rate_interval`, `outcomes`, `is_open`, `decide`),
on adaptive sweeps of 3 up to 12 seeds a side that stop a claim once it is decided.

    .venv/bin/python -m pytest -s tests/orchestration/test_divergence_rate.py

prints the figures docs/verdicts.md quotes. θ = p_A − p_B, the difference of the chances that a
run of A and of B diverges. A verdict is wrong upward when it says θ is higher than it is
("A > B holds" with θ ≤ 0, "no difference that matters" with θ ≤ −δ), downward the other way;
each direction is asserted at or below 2.5% plus three Monte Carlo standard errors.
"""
from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
import pytest

from orchestration.report.verdicts import (ALPHA, CONTRADICTED, HOLDS, NO_DIFFERENCE, OUTCOMES, claim, decide,
                                           findings, is_open, outcomes, rate_bounds, rate_interval)

FIRST, LAST = 3, 12
SWEEPS = 4000
DELTA = 0.1  # δ: a difference of divergence rates that matters
CODE = {o: OUTCOMES.index(o) for o in OUTCOMES}


def bound(rate: float, count: int) -> float:
    return rate + 3 * math.sqrt(rate * (1 - rate) / count)


@lru_cache(maxsize=None)
def _bounds(gone_a: int, gone_b: int, n: int) -> tuple[float, float]:
    found = rate_interval(gone_a, n, gone_b, n, (FIRST, LAST))
    return found.low, found.high


def sweep(p_a: float, p_b: float, relation: str, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """SWEEPS adaptive sweeps: (verdict codes, seeds run a side)."""
    rng = np.random.default_rng(seed)
    a = rng.random((SWEEPS, LAST)) < p_a
    b = rng.random((SWEEPS, LAST)) < p_b
    codes = np.full(SWEEPS, CODE["not run"])
    seeds = np.zeros(SWEEPS, dtype=int)
    for n in range(FIRST, LAST + 1):
        going = is_open(codes, seeds, LAST) if n > FIRST else np.ones(SWEEPS, dtype=bool)
        if not going.any():
            break
        ka, kb = a[:, :n].sum(axis=1), b[:, :n].sum(axis=1)
        lows, highs = zip(*(_bounds(int(x), int(y), n) for x, y in zip(ka[going], kb[going])))
        codes[going] = outcomes(np.array(lows), np.array(highs), relation, DELTA)
        seeds[going] = n
    return codes, seeds


def wrong(codes: np.ndarray, theta: float, relation: str) -> tuple[float, float]:
    """(upward, downward) wrong-verdict rates of a claim A `relation` B at the truth θ."""
    says_higher = says_lower = np.zeros(codes.shape, dtype=bool)
    if relation == ">":
        if theta <= 0:
            says_higher = codes == CODE[HOLDS]
        if theta >= 0:
            says_lower = codes == CODE[CONTRADICTED]
        if theta <= -DELTA:
            says_higher = says_higher | (codes == CODE[NO_DIFFERENCE])
        if theta >= DELTA:
            says_lower = says_lower | (codes == CODE[NO_DIFFERENCE])
    else:  # ≈ holds: |θ| < δ said; wrong when |θ| ≥ δ (upward if θ ≤ −δ, downward if θ ≥ δ)
        if theta <= -DELTA:
            says_higher = codes == CODE[HOLDS]
        if theta >= DELTA:
            says_lower = codes == CODE[HOLDS]
    return float(says_higher.mean()), float(says_lower.mean())


# (p_A, p_B, relation): equal rates from rare to common, one side diverging more, and ≈ at ±δ
CELLS = [(0.0, 0.0, ">"), (0.05, 0.05, ">"), (0.125, 0.125, ">"), (0.3, 0.3, ">"), (0.5, 0.5, ">"),
         (0.125, 0.0, ">"), (0.0, 0.125, ">"), (0.3, 0.1, ">"), (0.2, 0.3, "≈"), (0.4, 0.3, "≈")]


@pytest.mark.parametrize("p_a,p_b,relation", CELLS)
def test_a_divergence_rate_claim_keeps_its_rate(p_a, p_b, relation):
    codes, seeds = sweep(p_a, p_b, relation, seed=int(p_a * 1000 + p_b * 10) + len(relation))
    up, down = wrong(codes, p_a - p_b, relation)
    decided = np.isin(codes, [CODE[o] for o in (HOLDS, CONTRADICTED, NO_DIFFERENCE)]).mean()
    print(f"\np_A {p_a:.3f} p_B {p_b:.3f} {relation}: wrong up {up:.2%} down {down:.2%}, decided {decided:.1%}, "
          f"mean seeds {seeds.mean():.1f}")
    assert up <= bound(ALPHA / 2, SWEEPS) and down <= bound(ALPHA / 2, SWEEPS)


def test_each_sides_bound_misses_its_rate_at_most_a_quarter_of_alpha_over_every_look():
    # Every path of 12 runs enumerated (no walk, no Monte Carlo): over a fine grid of rates, the
    # chance that the lower bound lies above the rate at some look 3..12. The level is the
    # largest that keeps it within alpha/4, so the worst rate comes close to it.
    paths = (np.arange(2 ** LAST)[:, None] >> np.arange(LAST)) & 1
    counts = paths.cumsum(axis=1)  # k after n = 1..12 runs
    lows = np.stack([np.array([rate_bounds(int(k), n, (FIRST, LAST))[0] for k in range(n + 1)])[counts[:, n - 1]]
                     for n in range(FIRST, LAST + 1)], axis=1)
    k = counts[:, -1]
    worst = 0.0
    for p in np.linspace(0.0005, 0.9995, 1999):
        weight = p ** k * (1 - p) ** (LAST - k)
        worst = max(worst, float(weight[(lows > p).any(axis=1)].sum()))
    print(f"\nworst miss of one side's lower bound over looks {FIRST}..{LAST}: {worst:.4%} (alpha/4 = {ALPHA / 4:.4%})")
    assert 0.8 * ALPHA / 4 < worst <= ALPHA / 4 * (1 + 1e-6)


def test_a_configuration_that_always_diverges_is_found_to():
    # Every run of A diverges, none of B's: the claim holds within the looks, as soon as the
    # exact intervals allow (8 seeds a side at 5% over looks 3..12; a fixed design: 7).
    codes, seeds = sweep(1.0, 0.0, ">", seed=7)
    assert (codes == CODE[HOLDS]).all() and set(seeds) == {8}
    assert rate_interval(7, 7, 0, 7).low > 0 >= rate_interval(6, 6, 0, 6).low
    # Nine runs in ten of A: the claim holds in most sweeps by 12 seeds, wrongly never.
    codes, _ = sweep(0.9, 0.0, ">", seed=8)
    assert (codes == CODE[HOLDS]).mean() > 0.8 and not (codes == CODE[CONTRADICTED]).any()
    for p_a, p_b in ((1.0, 0.0), (0.9, 0.0), (0.75, 0.0), (0.5, 0.0), (0.9, 0.1)):
        codes, seeds = sweep(p_a, p_b, ">", seed=9)
        print(f"\np_A {p_a} p_B {p_b}: holds {(codes == CODE[HOLDS]).mean():.1%}, mean seeds {seeds.mean():.1f}")


def test_the_interval_is_the_two_exact_intervals_combined():
    from scipy.stats import beta

    found = rate_interval(3, 8, 1, 9, alpha=0.05)
    share = 0.05 / 4
    assert found.centre == pytest.approx(3 / 8 - 1 / 9) and found.method == "rate"
    assert found.low == pytest.approx(beta.ppf(share, 3, 6) - beta.ppf(1 - share, 2, 8))
    assert found.high == pytest.approx(beta.ppf(1 - share, 4, 5) - beta.ppf(share, 1, 9))
    # No run diverged on either side: [−H, H], H the exact bound of 0 of n.
    none = rate_interval(0, 10, 0, 10)
    assert none.low == pytest.approx(-none.high) and none.high == pytest.approx(1 - share ** (1 / 10))
    # Over 10 looks each look spends a tenth of the error: wider than the fixed design.
    assert rate_interval(3, 8, 1, 9, (3, 12)).low < found.low


def test_decide_counts_the_diverged_seeds_of_each_side():
    rate = claim("A diverges more", "a", "b", ">", min_effect=DELTA, metric="diverged")
    a = {s: 0.0 for s in range(10)}
    verdict = decide(a, {s: 0.0 for s in range(10)}, rate,
                     diverged_a={s: "loss_sst is nan" for s in range(8)})
    assert verdict.outcome == HOLDS and verdict.seeds_a == 10 and len(verdict.diverged_a) == 8
    assert verdict.interval.centre == pytest.approx(0.8)
    # From a plain table: a `diverged` column of 0 and 1 per run.
    rows = [{"configuration": c, "seed": s, "diverged": float(c == "a" and s < 8)} for c in "ab" for s in range(10)]
    got = findings(rows, [rate], error_rate="claim").iloc[0]
    assert got["verdict"] == HOLDS and got["a_diverged"] == 8 and got["a_n"] == 10 and got["method"] == "rate"
