"""Verdicts on planted effects, through the public library (orchestration/report/verdicts.py): each
outcome, the median's interval and the mean's, the exact rule for a figure the seed does not
move, diverged runs, the seeds an undecided claim needs (checked by simulation), the error
rate of a family of claims, the adaptive rule, and a plain table in, a findings table out."""
from __future__ import annotations

import math

import numpy as np
import pytest

from orchestration.stats import paired_delta, sequential_level, t_quantile
from orchestration.sweep.claims import Claim
from orchestration.report.verdicts import (ALPHA, CONTRADICTED, HOLDS, INCONCLUSIVE, NO_DIFFERENCE, NOT_RUN, OUTCOMES,
                                    Interval, claim_alphas, decide, decide_from_summary, diverged, findings,
                                    interval, is_open, judge, next_targets, rate_caption, sign_bounds)
from orchestration.report.verdicts import claim as table_claim

DELTA = 0.01
SEEDS = range(8)
BASE = {s: 0.70 + 0.05 * math.sin(s) for s in SEEDS}  # seeds disagree by far more than δ
JITTER = [0.0010, -0.0008, 0.0004, -0.0006, 0.0000, 0.0007, -0.0003, 0.0002]  # a tight interval
MEDIUM = [0.008, -0.006, 0.004, -0.003, -0.003, 0.006, -0.005, 0.002]  # ± about δ


def claim(relation: str, name: str = "A vs B", **kw) -> Claim:
    return Claim(name, "overall", {"variant": "a"}, {"variant": "b"}, relation, **{"min_effect": DELTA, **kw})


def shifted(effect: float, jitter: list[float] = JITTER) -> dict[int, float]:
    return {s: BASE[s] + effect + j for s, j in zip(BASE, jitter)}


def _decided_rate(centre: float, spread: float, n: int, c: Claim, sweeps: int = 2000) -> float:
    diffs = np.random.default_rng(5).normal(centre, spread, (sweeps, n))
    return float(np.mean([decide(dict(enumerate(row)), dict.fromkeys(range(n), 0.0), c).decided for row in diffs]))


def test_a_real_difference_holds_and_the_other_way_contradicts():
    found = decide(shifted(0.03), BASE, claim(">"))
    assert found.outcome == HOLDS and found.decided and found.interval.n == 8
    assert found.interval.centre == pytest.approx(0.03 + float(np.median(JITTER)))
    assert found.interval.method == "median" and found.seeds_needed is None
    assert found.detail == "A > B by at least 0.01"
    assert decide(shifted(0.03), BASE, claim("<")).outcome == CONTRADICTED
    assert decide(shifted(-0.03), BASE, claim("<")).outcome == HOLDS
    assert decide(shifted(-0.03), BASE, claim(">")).detail == "A < B by at least 0.01"


def test_the_median_interval_is_two_order_statistics_of_the_differences():
    a = shifted(0.0, MEDIUM)
    found = interval(a, BASE)
    d = sorted(a[s] - BASE[s] for s in SEEDS)
    k = sign_bounds(8, 8)[0]
    assert k == 1 and (found.low, found.high) == pytest.approx((d[k - 1], d[8 - k]))
    assert found.centre == pytest.approx(float(np.median(d)))
    # The mean's t-interval, for near-normal differences: the leaderboard's paired Δ.
    mean = interval(a, BASE, method="mean")
    centre, half, n = paired_delta(a, BASE)
    assert (mean.centre, mean.half, mean.n) == pytest.approx((centre, half, n))


def test_no_difference_that_matters_takes_precedence_over_a_resolved_one():
    found = decide(shifted(0.003), BASE, claim(">"))  # +0.003 at every seed, ± a hair
    assert 0 < found.interval.low and found.interval.high < DELTA
    assert found.outcome == NO_DIFFERENCE and found.decided and found.detail == "A > B by less than 0.01"
    assert decide(shifted(-0.003), BASE, claim(">")).detail == "A < B by less than 0.01"
    assert decide(shifted(0.0), BASE, claim("<")).outcome == NO_DIFFERENCE
    assert decide(shifted(0.0), BASE, claim("<")).detail == "|A − B| < 0.01"
    assert decide(shifted(0.003), BASE, claim(">", min_effect=0.001)).outcome == HOLDS


def test_approximately_equal_claims():
    assert decide(shifted(0.001), BASE, claim("≈")).outcome == HOLDS
    assert decide(shifted(0.03), BASE, claim("≈")).outcome == CONTRADICTED
    assert decide(shifted(-0.03), BASE, claim("≈")).outcome == CONTRADICTED
    found = decide(shifted(0.008, MEDIUM), BASE, claim("≈"))  # straddles +δ
    assert found.interval.low < DELTA < found.interval.high
    assert found.outcome == INCONCLUSIVE and found.seeds_needed > 8


def test_rules_on_the_interval_and_its_boundaries():
    def outcome(low: float, high: float, relation: str, min_effect: float = DELTA) -> str:
        return judge(Interval((low + high) / 2, low, high, 8), claim(relation, min_effect=min_effect)).outcome
    assert outcome(0.01, 0.03, ">") == HOLDS and outcome(-0.03, -0.01, ">") == CONTRADICTED
    assert outcome(-0.005, 0.015, ">") == INCONCLUSIVE and outcome(-0.03, -0.01, "<") == HOLDS
    assert outcome(-0.003, 0.007, "≈") == HOLDS and outcome(0.025, 0.035, "≈") == CONTRADICTED
    assert outcome(0.003, 0.013, "≈") == INCONCLUSIVE
    # An interval ending exactly at δ holds a difference that matters; one ending exactly at 0 is
    # not wholly on one side of it (exact in binary: 1/4, 1/8, 3/8).
    assert outcome(0.0, 0.25, "≈", 0.25) == INCONCLUSIVE and outcome(0.25, 0.5, "≈", 0.25) == CONTRADICTED
    assert outcome(0.0, 0.25, ">", 0.25) == INCONCLUSIVE and outcome(0.25, 0.5, ">", 0.25) == HOLDS


def test_too_few_seeds_for_the_median_says_how_many_would_do():
    five = {s: BASE[s] + 0.05 for s in range(5)}  # A wins by 5δ at every seed, but 5 seeds
    found = decide(five, BASE, claim(">"))
    assert found.outcome == INCONCLUSIVE and math.isnan(found.interval.low)
    assert found.detail == "too few seeds for an interval of the median: about 6 would do"
    assert found.seeds_needed == 6
    # The mean's t-interval decides on them, for near-normal differences.
    assert decide(five, BASE, claim(">", interval="mean")).outcome == HOLDS


def test_seeds_needed_is_a_fixed_design_with_80_percent_power():
    wide = [0.02, -0.015, 0.01, -0.005, -0.01, 0.015, -0.02, 0.012]
    found = decide(shifted(0.004, wide), BASE, claim(">"))
    assert found.outcome == INCONCLUSIVE and found.detail == "A − B could be 0 or +0.01 or −0.01"
    assert found.seeds_needed is not None and found.seeds_needed > found.interval.n
    # Taking the observed centre and spread as the truth (normal differences), a fixed design
    # with that many seeds decides the claim in about 80% of sweeps, and with half as many in fewer.
    rate = {n: _decided_rate(found.interval.centre, found.interval.spread, n, claim(">"))
            for n in (found.seeds_needed, found.seeds_needed // 2)}
    assert 0.72 <= rate[found.seeds_needed] <= 0.88, rate
    assert rate[found.seeds_needed // 2] < rate[found.seeds_needed] - 0.1, rate
    assert judge(Interval(0.0, -1.0, 1.0, 8, 2.0), claim(">")).seeds_needed is None  # beyond the cap


def test_paper_effect_inside_or_outside_the_interval():
    assert decide(shifted(0.03), BASE, claim(">", paper_effect=0.03)).paper_inside is True
    assert decide(shifted(0.03), BASE, claim(">", paper_effect=0.08)).paper_inside is False
    assert decide(shifted(0.03), BASE, claim(">")).paper_inside is None
    assert decide({0: 0.7}, {0: 0.6}, claim(">", paper_effect=0.1)).paper_inside is None  # no interval


def test_not_run_and_one_seed():
    found = decide({0: 0.7, 1: 0.8}, {5: 0.6}, claim(">"))
    assert found.outcome == NOT_RUN and found.interval.n == 0 and not found.decided
    one = decide({0: 0.7, 1: 0.8}, {0: 0.6, 7: 0.6}, claim(">"))
    assert one.outcome == INCONCLUSIVE and one.interval.n == 1 and one.detail == "one paired seed: no interval"


def test_a_figure_the_seed_does_not_move_is_exact():
    # A parameter count: the same at every seed on each side, so two seeds tell the difference.
    found = decide({0: 1000.0, 1: 1000.0}, {0: 400.0, 1: 400.0}, claim(">", min_effect=10))
    assert found.outcome == HOLDS and found.interval.exact and (found.interval.low, found.interval.high) == (600, 600)
    # A difference equal at two seeds whose sides move with the seed is noise, not a constant.
    moving = decide({0: 0.81, 1: 0.82}, {0: 0.51, 1: 0.52}, claim(">"))
    assert moving.outcome == INCONCLUSIVE and not moving.interval.exact


def test_diverged_runs_are_counted_and_left_out():
    a = shifted(0.03)
    a[2], a[5] = 0.05, math.nan  # seed 2 at chance (0.0 for a correlation), seed 5 not a number
    assert diverged(a, chance=0.0).keys() == {2, 5}
    assert diverged(a).keys() == {5}  # without a chance level only the non-finite one
    assert "at chance" in diverged(a, chance=0.0)[2]
    found = decide(a, BASE, claim(">", chance=0.0))
    assert found.interval.n == 6 and set(found.diverged_a) == {2, 5} and not found.diverged_b
    assert found.seeds_a == 8 and found.outcome == HOLDS
    # A configuration whose seeds all sit at chance did not diverge: it does not learn.
    assert not diverged({s: 0.01 * (s % 2) for s in SEEDS}, chance=0.0).keys() - {0, 2, 4, 6}
    assert diverged({0: 0.8, 1: 0.8, 2: 0.02}, loss={0: 0.5, 1: math.inf, 2: 0.4}, chance=0.0).keys() == {1, 2}


def test_sequential_looks_widen_the_interval():
    a = shifted(0.004, MEDIUM)
    fixed, sequential = interval(a, BASE), interval(a, BASE, looks=(3, 12))
    assert fixed.low < sequential.low or fixed.high > sequential.high or sign_bounds(8, 8) == sign_bounds(3, 12)[5:6]
    assert sign_bounds(3, 12)[8 - 3] <= sign_bounds(8, 8)[0]
    mean = interval(a, BASE, looks=(3, 12), method="mean")
    assert mean.half / interval(a, BASE, method="mean").half == pytest.approx(
        t_quantile(7, sequential_level(3, 12)) / t_quantile(7))
    # seeds beyond the declared looks widen them to include the look that happened
    more = {s: s * 0.001 for s in range(15)}
    assert interval(more, dict.fromkeys(more, 0.0), looks=(3, 12)).low == sorted(more.values())[
        sign_bounds(3, 15)[-1] - 1]


def test_a_printed_t_interval_gives_the_verdict_of_the_runs():
    a = shifted(0.008, [0.012, -0.01, 0.006, -0.004, 0.0, 0.003, -0.002, 0.001])
    for c in (claim(">", interval="mean"), claim("≈", interval="mean"), claim(">", looks=(3, 12), interval="mean")):
        from_runs = decide(a, BASE, c)
        mean, half, n = paired_delta(a, BASE)  # what a fixed-design table prints
        printed = decide_from_summary(mean, half, n, c)
        assert printed.outcome == from_runs.outcome
        assert printed.interval.half == pytest.approx(from_runs.interval.half)


def test_a_family_shares_the_error_rate():
    claims = [claim(">", name=f"c{i}") for i in range(4)]
    assert claim_alphas(claims) == [ALPHA / 4] * 4
    assert claim_alphas(claims, "claim") == [ALPHA] * 4
    mixed = claims[:2] + [claim(">", error_rate="claim")]
    assert claim_alphas(mixed) == [ALPHA / 2, ALPHA / 2, ALPHA]
    assert rate_caption(["family"] * 3).startswith("Family-wise: the chance that any of these 3 verdicts")
    assert rate_caption(["claim"]).startswith("Per claim:")
    with pytest.raises(ValueError, match="error rate 'fam'"):
        claim_alphas(claims, "fam")
    # A claim's share of a family is a narrower interval: here no longer decided.
    a = {s: BASE[s] + 0.03 for s in range(7)}
    assert decide(a, BASE, claim(">")).outcome == HOLDS
    assert decide(a, BASE, claim(">"), alpha=ALPHA / 10).outcome == INCONCLUSIVE


def test_the_adaptive_rule_spends_seeds_on_open_claims_only():
    codes = [OUTCOMES.index(o) for o in (HOLDS, INCONCLUSIVE, INCONCLUSIVE, NOT_RUN)]
    assert is_open(codes, [3, 3, 12, 3], 12).tolist() == [False, True, False, True]
    seeds = {"A": 3, "B": 3, "C": 5, "base": 3}
    # C is ahead of B: the claim (C, B) raises B, and C keeps what it has.
    assert next_targets([["A", "B"], ["C", "B"]], seeds) == ({"A": 4, "B": 4, "C": 5}, False)
    assert next_targets([["A", "B"], ["C", "B", "base"]], seeds, room=2) == ({"A": 4, "B": 4}, True)


def test_a_plain_table_in_a_findings_table_out():
    rng = np.random.default_rng(3)
    rows = []
    for seed in range(9):
        shared = rng.normal(0, 0.05)  # the seed moves every configuration alike
        for name, effect in (("frozen", 0.0), ("unfrozen", 0.04), ("probe", 0.001)):
            rows.append({"configuration": name, "seed": seed, "overall": 0.7 + shared + effect + rng.normal(0, 0.002)})
    rows.append({"configuration": "unfrozen", "seed": 9, "overall": 0.02})  # diverged: at chance
    rows.append({"configuration": "frozen", "seed": 9, "overall": 0.71})
    claims = [table_claim("unfrozen beats frozen", "unfrozen", "frozen", ">", 0.01, metric="overall", chance=0.0),
              table_claim("the probe is no better", "probe", "frozen", ">", 0.01, metric="overall")]
    table = findings(rows, claims)
    got = table.set_index("claim")
    assert got.loc["unfrozen beats frozen", "verdict"] == HOLDS
    assert got.loc["unfrozen beats frozen", "a_diverged"] == 1 and got.loc["unfrozen beats frozen", "n"] == 9
    assert got.loc["the probe is no better", "verdict"] == NO_DIFFERENCE
    assert set(table["alpha"]) == {ALPHA / 2} and set(table["error_rate"]) == {"family"}
    # The same table in long form, and a pandas DataFrame, give the same findings.
    import pandas as pd

    long = pd.DataFrame(rows).melt(id_vars=["configuration", "seed"], var_name="metric", value_name="value")
    assert findings(long, claims)["verdict"].tolist() == table["verdict"].tolist()
    assert findings(rows, claims, error_rate="claim")["alpha"].tolist() == [ALPHA, ALPHA]


def test_seed_means_one_value_per_seed():
    from orchestration.report.verdicts import seed_means

    # A seed logged twice (a resumed run) counts once, as its mean; a NaN is no value.
    found = seed_means([0.5, 0.7, 0.6, math.nan, math.nan], ["1", "1", "2", "2", "3"])
    assert found == {"1": pytest.approx(0.6), "2": 0.6}
