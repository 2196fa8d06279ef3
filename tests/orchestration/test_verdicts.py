"""Verdicts on planted effects: each outcome, the paper's effect against the interval, the seeds
an undecided claim needs (checked by simulation), and a printed interval read back."""
from __future__ import annotations

import math

import numpy as np
import pytest

from orchestration.stats import Interval, paired_interval, sequential_level, t_quantile
from orchestration.sweep.claims import Claim
from orchestration.report.verdicts import (CONTRADICTED, HOLDS, INCONCLUSIVE, NO_DIFFERENCE, NOT_RUN, decide,
                                    decide_from_summary, judge)

DELTA = 0.01
BASE = {s: 0.70 + 0.05 * math.sin(s) for s in range(5)}  # seeds disagree by far more than δ
JITTER = [0.0010, -0.0008, 0.0004, -0.0006, 0.0000]  # mean 0, sd 0.0007: a tight interval
MEDIUM = [0.008, -0.006, 0.004, -0.003, -0.003]  # mean 0, sd 0.0058: ± 0.0072 at n = 5


def claim(relation: str, **kw) -> Claim:
    return Claim("A vs B", "overall", {"variant": "a"}, {"variant": "b"}, relation, **{"min_effect": DELTA, **kw})


def shifted(effect: float, jitter: list[float] = JITTER) -> dict[int, float]:
    return {s: BASE[s] + effect + j for s, j in zip(BASE, jitter)}


def _decided_rate(mean: float, spread: float, n: int, c: Claim, sweeps: int = 2000) -> float:
    diffs = np.random.default_rng(5).normal(mean, spread, (sweeps, n))
    return float(np.mean([decide(dict(enumerate(row)), dict.fromkeys(range(n), 0.0), c).decided
                          for row in diffs]))


def test_a_real_difference_holds_and_the_other_way_contradicts():
    found = decide(shifted(0.03), BASE, claim(">"))
    assert found.outcome == HOLDS and found.decided and found.interval.n == 5
    assert found.interval.mean == pytest.approx(0.03) and found.seeds_needed is None
    assert found.detail == "A > B by at least 0.01"
    assert decide(shifted(0.03), BASE, claim("<")).outcome == CONTRADICTED
    assert decide(shifted(-0.03), BASE, claim("<")).outcome == HOLDS


def test_the_wrong_direction_is_contradicted():
    found = decide(shifted(-0.03), BASE, claim(">"))
    assert found.outcome == CONTRADICTED and found.decided and found.detail == "A < B by at least 0.01"


def test_no_difference_that_matters_takes_precedence_over_a_resolved_one():
    # +0.003 at every seed: the interval excludes 0, and lies wholly below δ
    found = decide(shifted(0.003), BASE, claim(">"))
    assert 0 < found.interval.low and found.interval.high < DELTA
    assert found.outcome == NO_DIFFERENCE and found.decided and found.detail == "A > B by less than 0.01"
    assert decide(shifted(-0.003), BASE, claim(">")).detail == "A < B by less than 0.01"
    # around 0, both ways
    assert decide(shifted(0.0), BASE, claim("<")).outcome == NO_DIFFERENCE
    assert decide(shifted(0.0), BASE, claim("<")).detail == "|A − B| < 0.01"
    # the same +0.003 with a δ below it: a resolved difference that matters, so the claim holds
    assert decide(shifted(0.003), BASE, claim(">", min_effect=0.001)).outcome == HOLDS


def test_approximately_equal_claims():
    assert decide(shifted(0.001), BASE, claim("≈")).outcome == HOLDS
    assert decide(shifted(0.03), BASE, claim("≈")).outcome == CONTRADICTED
    assert decide(shifted(-0.03), BASE, claim("≈")).outcome == CONTRADICTED
    # mean 0.008: the interval straddles +δ
    found = decide(shifted(0.008, MEDIUM), BASE, claim("≈"))
    assert found.interval.low < DELTA < found.interval.high
    assert found.outcome == INCONCLUSIVE and found.seeds_needed > 5
    # an ≈ claim is decided only inside ±δ or wholly beyond it, not by excluding 0
    rate = _decided_rate(found.interval.mean, found.interval.spread, found.seeds_needed, claim("≈"))
    assert 0.74 <= rate <= 0.86, (found.seeds_needed, rate)


def test_rules_on_the_interval_and_its_boundaries():
    def outcome(mean: float, half: float, n: int, relation: str, min_effect: float = DELTA) -> str:
        return judge(Interval(mean, half, n), claim(relation, min_effect=min_effect)).outcome
    assert outcome(0.02, 0.01, 3, ">") == HOLDS and outcome(-0.02, 0.01, 3, ">") == CONTRADICTED
    assert outcome(0.005, 0.01, 3, ">") == INCONCLUSIVE and outcome(-0.02, 0.01, 3, "<") == HOLDS
    assert outcome(0.002, 0.005, 3, "≈") == HOLDS and outcome(0.03, 0.005, 3, "≈") == CONTRADICTED
    assert outcome(0.008, 0.005, 3, "≈") == INCONCLUSIVE
    # An interval ending exactly at δ holds a difference that matters; one ending exactly at 0
    # is not wholly on one side of it (δ and the bounds exact in binary: 1/4, 1/8, 3/8).
    assert outcome(0.125, 0.125, 3, "≈", 0.25) == INCONCLUSIVE
    assert outcome(0.375, 0.125, 3, "≈", 0.25) == CONTRADICTED
    assert outcome(0.125, 0.125, 3, ">", 0.25) == INCONCLUSIVE
    assert outcome(0.375, 0.125, 3, ">", 0.25) == HOLDS
    assert outcome(0.05, math.nan, 1, ">") == INCONCLUSIVE  # one seed: no interval


def test_too_few_seeds_is_inconclusive_and_says_how_many_would_do():
    wide = [0.02, -0.015, 0.01, -0.005, -0.01]
    found = decide(shifted(0.004, wide), BASE, claim(">"))
    assert found.outcome == INCONCLUSIVE and not found.decided
    assert found.detail == "A − B could be 0 or +0.01 or −0.01"
    assert found.seeds_needed is not None and found.seeds_needed > found.interval.n
    # Taking the observed mean and spread as the truth, a fixed design with that many seeds
    # decides the claim in about 80% of sweeps, and with fewer seeds in fewer.
    rate = {n: _decided_rate(found.interval.mean, found.interval.spread, n, claim(">"))
            for n in (found.seeds_needed, found.seeds_needed // 2)}
    assert 0.74 <= rate[found.seeds_needed] <= 0.86, rate
    assert rate[found.seeds_needed // 2] < rate[found.seeds_needed] - 0.1, rate


def test_an_undecidable_spread_needs_more_than_the_cap():
    found = judge(Interval(0.0, 0.5, 3), claim(">"))
    assert found.outcome == INCONCLUSIVE and found.seeds_needed is None


def test_paper_effect_inside_or_outside_the_interval():
    assert decide(shifted(0.03), BASE, claim(">", paper_effect=0.03)).paper_inside is True
    assert decide(shifted(0.03), BASE, claim(">", paper_effect=0.08)).paper_inside is False
    assert decide(shifted(0.03), BASE, claim(">")).paper_inside is None
    assert decide({0: 0.7}, {0: 0.6}, claim(">", paper_effect=0.1)).paper_inside is None  # no interval


def test_not_run_and_one_seed():
    found = decide({0: 0.7, 1: 0.8}, {5: 0.6}, claim(">"))
    assert found.outcome == NOT_RUN and found.interval.n == 0 and not found.decided
    one = decide({0: 0.7, 1: math.nan}, {0: 0.6, 1: 0.6}, claim(">"))
    assert one.outcome == INCONCLUSIVE and one.interval.n == 1 and one.seeds_needed is None


def test_looks_widen_the_interval_to_the_sequential_level():
    a, b = shifted(0.008, MEDIUM), BASE
    fixed, sequential = decide(a, b, claim(">")), decide(a, b, claim(">", looks=(3, 12)))
    assert fixed.outcome == HOLDS and sequential.outcome == INCONCLUSIVE
    c = sequential_level(3, 12)
    assert sequential.interval.level == c
    assert sequential.interval.half / fixed.interval.half == pytest.approx(t_quantile(4, c) / t_quantile(4))
    # seeds beyond the declared looks widen them to include the look that happened
    more = {s: s * 0.001 for s in range(15)}
    assert paired_interval(more, dict.fromkeys(more, 0.0), looks=(3, 12)).level == sequential_level(3, 15)


def test_a_printed_interval_gives_the_verdict_of_the_runs():
    a = shifted(0.008, [0.012, -0.01, 0.006, -0.004, 0.0])
    for c in (claim(">"), claim("≈"), claim(">", looks=(3, 12)), claim("≈", paper_effect=0.0)):
        from_runs = decide(a, BASE, c)
        fixed = paired_interval(a, BASE)  # what a fixed-design table prints
        printed = decide_from_summary(fixed.mean, fixed.half, fixed.n, c)
        assert printed.outcome == from_runs.outcome and printed.seeds_needed == from_runs.seeds_needed
        assert printed.paper_inside == from_runs.paper_inside
        assert printed.interval.half == pytest.approx(from_runs.interval.half)
