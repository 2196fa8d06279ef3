"""Verdicts: what the interval of A − B, paired by seed, says about a claim.

A claim says A > B, A < B or A ≈ B on one metric, with δ (`min_effect`) the smallest
difference that matters. With [L, H] the 95% interval of A − B (orchestration/stats.py:
fixed design, or the calibrated sequential boundary when the claim declares its looks):

    holds          > : L > 0        < : H < 0        ≈ : −δ < L and H < δ
    contradicted   > : H < 0        < : L > 0        ≈ : L ≥ δ or H ≤ −δ
    no difference that matters   > and < only: −δ < L and H < δ, taking precedence over
                   holds and contradicted (a difference may be resolved yet below δ)
    inconclusive   anything else: the interval holds a difference that matters and one
                   that does not (or one paired seed: no interval)
    not run        no seed that both A and B ran

Error rates: for normal per-seed differences the interval covers the true difference at
every look at once with probability 95% (stats.sequential_level, calibrated by Monte Carlo
to ± 0.001), and each decided verdict is true of every point of the interval, so a verdict is
wrong only when the truth lies outside the interval: probability at most 5%, 2.5% on each
side of it. "No difference that matters" is the two one-sided tests (TOST) of |A − B| ≥ δ at
2.5% each (stricter than the common 90%-interval TOST at 5%). Both stay true however the
seeds were stopped within the declared looks.

`seeds_needed` says how far an inconclusive claim is from a decision: the fewest paired
seeds at which a fixed design would decide it with 80% power, if the observed mean and
spread were the truth.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Mapping

import numpy as np

from orchestration.stats import LEVEL, Interval, look_level, paired_interval, t_quantile
from orchestration.sweep.claims import Claim

HOLDS, CONTRADICTED, NO_DIFFERENCE, INCONCLUSIVE, NOT_RUN = OUTCOMES = (
    "holds", "contradicted", "no difference that matters", "inconclusive", "not run")
DECIDED = (HOLDS, CONTRADICTED, NO_DIFFERENCE)
POWER = 0.8
MAX_SEEDS = 1000


@dataclass(frozen=True)
class Verdict:
    outcome: str  # one of OUTCOMES
    interval: Interval  # of A − B
    paper_inside: bool | None  # the paper's own effect lies in the interval (None: no effect or no interval)
    seeds_needed: int | None  # inconclusive only: fixed-design paired seeds for 80% power (None beyond MAX_SEEDS)
    detail: str = ""  # where the interval lies, in words: "A > B by less than 0.01"

    @property
    def decided(self) -> bool:
        return self.outcome in DECIDED


def decide(a: Mapping[object, float], b: Mapping[object, float], claim: Claim) -> Verdict:
    """The claim's verdict from per-seed values of A and B (seed -> metric)."""
    return judge(paired_interval(a, b, claim.looks), claim)


def decide_from_summary(mean: float, half: float, n: int, claim: Claim, level: float = LEVEL) -> Verdict:
    """The verdict of a printed fixed-design interval mean ± half (at `level`, over n paired
    seeds), without the runs: the spread is read back from the half-width, and a claim with
    looks gets its sequential interval at that spread."""
    if n >= 2 and claim.looks is not None:
        spread = half * math.sqrt(n) / t_quantile(n - 1, level)
        level = look_level(claim.looks, n, level)
        half = t_quantile(n - 1, level) * spread / math.sqrt(n)
    return judge(Interval(mean, half, n, level), claim)


def judge(interval: Interval, claim: Claim) -> Verdict:
    """The claim's verdict from the interval of A − B."""
    if interval.n == 0:
        return Verdict(NOT_RUN, interval, None, None, "no seed that both A and B ran")
    if interval.n < 2 or math.isnan(interval.half):
        return Verdict(INCONCLUSIVE, interval, None, None, "one paired seed: no interval")
    low, high, delta = interval.low, interval.high, claim.min_effect
    within = -delta < low and high < delta
    if claim.relation == "≈":
        outcome = HOLDS if within else CONTRADICTED if low >= delta or high <= -delta else INCONCLUSIVE
    else:
        sign = {">": 1, "<": -1}[claim.relation]
        if within:
            outcome = NO_DIFFERENCE
        elif sign * low > 0 and sign * high > 0:
            outcome = HOLDS
        elif sign * low < 0 and sign * high < 0:
            outcome = CONTRADICTED
        else:
            outcome = INCONCLUSIVE
    paper_inside = None if claim.paper_effect is None else bool(low <= claim.paper_effect <= high)
    needed = None
    if outcome == INCONCLUSIVE:
        needed = seeds_needed(interval.mean, interval.spread, delta, claim.relation, at_least=interval.n + 1)
    return Verdict(outcome, interval, paper_inside, needed, describe(low, high, delta))


def describe(low: float, high: float, delta: float) -> str:
    """Where [low, high] of A − B lies against 0 and ±delta, in words."""
    if low >= delta:
        return f"A > B by at least {delta:g}"
    if high <= -delta:
        return f"A < B by at least {delta:g}"
    if -delta < low and high < delta:
        return (f"A > B by less than {delta:g}" if low > 0 else f"A < B by less than {delta:g}" if high < 0
                else f"|A − B| < {delta:g}")
    if low > 0:
        return f"A > B (perhaps by less than {delta:g})"
    if high < 0:
        return f"A < B (perhaps by less than {delta:g})"
    reach = " or ".join(f"{sign}{delta:g}" for sign, hit in (("+", high >= delta), ("−", low <= -delta)) if hit)
    return f"A − B could be 0 or {reach}"


def seeds_needed(mean: float, spread: float, min_effect: float, relation: str, power: float = POWER,
                 at_least: int = 2, most: int = MAX_SEEDS) -> int | None:
    """The fewest paired seeds n in at_least..most at which a fixed-design 95% interval decides
    the claim with probability `power`, taking the observed mean difference d and spread s
    as the truth; None when no n up to `most` does.

    The observed mean is D ~ N(d, s²/n) and the half-width h = t(0.975, n−1)·s/√n (the
    spread's own sampling noise ignored). The interval is within ±δ when |D| < δ − h; it
    decides a > or < claim when it excludes 0 too (|D| > h), an ≈ claim only when it lies
    wholly beyond ±δ (|D| > δ + h).
    """
    from scipy.special import ndtr

    if not (spread > 0 and math.isfinite(spread) and math.isfinite(mean)):
        return None
    all_n, all_t = _t_quantiles(most)
    d = abs(mean)
    # Blocks of n, nearest first: an adaptive sweep asks after every seed, and nearly every
    # answer lies in the first block.
    for start in range(max(at_least, 2) - 2, len(all_n), _BLOCK):
        n, t = all_n[start:start + _BLOCK], all_t[start:start + _BLOCK]
        sd = spread / np.sqrt(n)
        h = t * sd
        apart = h + (min_effect if relation == "≈" else 0.0)
        p = ndtr((d - apart) / sd) + ndtr((-d - apart) / sd)  # P(|D| > apart)
        inside = np.maximum(min_effect - h, 0.0)
        p += np.where(inside > 0, ndtr((inside - d) / sd) - ndtr((-inside - d) / sd), 0.0)  # P(|D| < δ − h)
        hit = np.flatnonzero(p >= power)
        if hit.size:
            return int(n[hit[0]])
    return None


_BLOCK = 64


@lru_cache(maxsize=4)
def _t_quantiles(most: int) -> tuple[np.ndarray, np.ndarray]:
    """n = 2..most and t(0.975, n−1), computed once: the inverse t CDF would be most of
    seeds_needed's cost."""
    from scipy.special import stdtrit

    n = np.arange(2, most + 1)
    return n, stdtrit(n - 1, 0.5 + LEVEL / 2)
