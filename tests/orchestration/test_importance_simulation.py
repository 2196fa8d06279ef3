"""Importance that can say "no", measured: planted sweeps of a 3 x 3 grid (keys a and b) with 3
seeds, fed to the public `importance.assess` exactly as a notebook would (a plain table: the
configuration's values, the seed, the figure). A key with no effect must read "matters" in at
most 5% of sweeps, whatever the other key does and whatever the seed noise's shape; a key whose
levels span 3 seed standard deviations, in at least 90%. Seeded; prints each rate with its
Monte Carlo standard error:

    pytest -q -s tests/orchestration/test_importance_simulation.py
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from orchestration.report.importance import ALPHA, assess

SWEEPS = 400  # per condition without an effect (Monte Carlo SE about 0.011 at 5%)
POWER_SWEEPS = 200  # per condition with one: power far above 90% needs fewer to show it
# Fewer shuffles than the CLI's 999 keep the suite fast: the test is exact for any number (p =
# (1 + as extreme) / (1 + shuffles)); 199 still reaches p = 0.005.
SHUFFLES = 199
LEVELS = np.array([-1.5, 0.0, 1.5])  # a key "with an effect of 3 seed SDs": its levels span 3 sigma
GRID = [(a, b) for a in range(3) for b in range(3)]
SEEDS = 3


def noise(rng: np.random.Generator, kind: str, size: int) -> np.ndarray:
    """Seed noise with mean 0 and SD 1 (the units of the planted effects)."""
    if kind == "normal":
        return rng.standard_normal(size)
    if kind == "t3":  # heavy tails: Student-t with 3 degrees of freedom, scaled to SD 1
        return rng.standard_t(3, size) / math.sqrt(3)
    if kind == "lognormal":  # skewed: a long right tail
        return (rng.lognormal(0.0, 1.0, size) - math.exp(0.5)) / math.sqrt((math.e - 1) * math.e)
    if kind == "diverging":  # 1 run in 8 falls far below (a run that failed to train)
        x = rng.standard_normal(size)
        return np.where(rng.random(size) < 1 / 8, x - 8.0, x)
    raise ValueError(kind)


def planted(rng: np.random.Generator, effect_a: float, effect_b: float, kind: str, rho: float) -> pd.DataFrame:
    """One sweep: a run per (configuration, seed); a seed moves every configuration alike by a
    shared term of correlation rho (same data order, same head initialisation)."""
    rows = [(a, b, s) for a, b in GRID for s in range(SEEDS)]
    frame = pd.DataFrame(rows, columns=["a", "b", "seed"])
    shared = rng.standard_normal(SEEDS)[frame["seed"]]
    own = noise(rng, kind, len(frame))
    frame["overall"] = (effect_a * LEVELS[frame["a"]] + effect_b * LEVELS[frame["b"]]
                        + math.sqrt(rho) * shared + math.sqrt(1 - rho) * own)
    frame["a"] = frame["a"].map({0: "x", 1: "y", 2: "z"})  # a category, as a grid of regimes
    frame["b"] = frame["b"].map({0: 1e-4, 1: 3e-4, 2: 1e-3})  # numbers, as a grid of learning rates
    return frame


def rate(effect_a: float, effect_b: float, kind: str, rho: float, seed: int, sweeps: int) -> tuple[float, float]:
    """Share of sweeps in which key a is called "matters", and its Monte Carlo standard error."""
    rng = np.random.default_rng(seed)
    hits = 0
    for i in range(sweeps):
        found = assess(planted(rng, effect_a, effect_b, kind, rho), ["a", "b"], ["overall"], shares=False,
                       permutations=SHUFFLES, rng_seed=seed * 100_000 + i)
        hits += bool(found.set_index("dimension").loc["a", "matters"])
    share = hits / sweeps
    return share, math.sqrt(max(share * (1 - share), 1 / sweeps) / sweeps)


# (planted effect of a, of b, noise, seed correlation)
NULL = [(0.0, 0.0, "normal", 0.0), (0.0, 1.0, "normal", 0.0), (0.0, 1.0, "t3", 0.5),
        (0.0, 1.0, "lognormal", 0.9), (0.0, 0.0, "diverging", 0.3)]
EFFECT = [(1.0, 0.0, "normal", 0.0), (1.0, 1.0, "normal", 0.5), (1.0, 1.0, "lognormal", 0.0),
          (1.0, 0.0, "t3", 0.9)]


@pytest.mark.parametrize("effect_a, effect_b, kind, rho", NULL)
def test_a_key_without_effect_reads_matters_in_at_most_5_percent(effect_a, effect_b, kind, rho):
    share, se = rate(effect_a, effect_b, kind, rho, seed=len(kind) + int(10 * rho), sweeps=SWEEPS)
    print(f"\nno effect, b {effect_b:g}, {kind}, rho {rho}: 'matters' in {share:.3f} +- {se:.3f} of {SWEEPS} sweeps")
    # At most 5% within Monte Carlo error: three standard errors, since at two one of five
    # correct conditions would fail about one run in nine (the permutation test is exact: its
    # rate is 5% for exchangeable runs, whatever their distribution).
    assert share <= ALPHA + 3 * se


@pytest.mark.parametrize("effect_a, effect_b, kind, rho", EFFECT)
def test_a_key_of_3_seed_sds_reads_matters_in_at_least_90_percent(effect_a, effect_b, kind, rho):
    share, se = rate(effect_a, effect_b, kind, rho, seed=100 + len(kind) + int(10 * rho), sweeps=POWER_SWEEPS)
    print(f"\n3 SD effect, b {effect_b:g}, {kind}, rho {rho}: 'matters' in {share:.3f} +- {se:.3f} of "
          f"{POWER_SWEEPS} sweeps")
    assert share >= 0.90


def test_the_same_function_gives_shares_and_a_paired_comparison():
    rng = np.random.default_rng(5)
    frame = planted(rng, 1.0, 0.0, "normal", 0.0)
    found = assess(frame, ["a", "b"], ["overall"]).set_index("dimension")
    assert found.loc["a", "matters"] and found.loc["a", "importance"] > found.loc["b", "importance"]
    assert found.loc["a", "importance"] + found.loc["b", "importance"] == pytest.approx(1.0)
    assert found.loc["a", "null"] == "seed and other keys"  # a grid crosses the keys
    # Two configurations: no share to split, their difference paired by seed.
    two = frame[(frame["b"] == 1e-4) & frame["a"].isin(["x", "z"])]
    pair = assess(two, ["a", "b"], ["overall"]).iloc[0]
    assert pair["dimension"] == "a: z - x" and pair["null"] == "paired by seed, 95%"
    assert pair["low"] < pair["effect"] < pair["high"] and pair["effect"] == pytest.approx(
        two[two["a"] == "z"]["overall"].mean() - two[two["a"] == "x"]["overall"].mean())


def test_a_random_search_of_60_configurations_gets_ped_anova_beside_fanova():
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"lr": 10 ** rng.uniform(-5, -3, 60), "regime": rng.choice(["x", "y", "z"], 60), "seed": 0})
    frame["overall"] = np.log10(frame["lr"]) + rng.normal(0, 0.1, 60)  # the rate decides, the regime not
    found = assess(frame, ["lr", "regime"], ["overall"]).set_index("dimension")
    assert found.loc["lr", "ped_anova"] > 0.9 and found.loc["lr", "importance"] > 0.9
    assert found.loc["lr", "matters"] and not found.loc["regime", "matters"]
    # A rate per configuration: shuffled among the runs of one regime; the regimes, never crossed
    # with a rate, among all runs of the seed.
    assert (found.loc["lr", "null"], found.loc["regime", "null"]) == ("seed and other keys", "seed")
    few = assess(frame.head(20), ["lr", "regime"], ["overall"])
    assert few["ped_anova"].isna().all()  # its top 10% would hold 2 configurations
