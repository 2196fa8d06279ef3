"""Verdicts on claims from per-seed results: the statistics of `mtbert findings` and of adaptive
seeds as a small library, on plain data (no MLflow, no Ray). docs/verdicts.md says what a
verdict means and when its error rate is guaranteed; this docstring says how to call it.

A claim compares two configurations A and B on one figure: A > B, A < B or A ≈ B, with δ
(`min_effect`) the smallest difference that matters. Its verdict reads an interval of the
per-seed differences A − B (paired by seed) against 0 and ±δ:

    holds          > : L > 0        < : H < 0        ≈ : −δ < L and H < δ
    contradicted   > : H < 0        < : L > 0        ≈ : L ≥ δ or H ≤ −δ
    no difference that matters   > and < only: −δ < L and H < δ, before holds and contradicted
    inconclusive   anything else (or too few seeds for an interval)
    not run        no seed that both A and B ran

**What a verdict is about.** θ, the median of the per-seed difference A − B over the seeds
where neither run diverged (`diverged`). With `method="median"` (the default) [L, H] are order
statistics of the differences, [d₍ₖ₎, d₍ₙ₊₁₋ₖ₎], with k from the sign test's exact law
(`sign_bounds`): it holds for *any* continuous distribution of the differences, skewed,
heavy-tailed, one side noisier, A and B correlated, as long as the seeds are independent. Its
cost: no interval below 6 paired seeds at 5% (the sign test cannot reject with fewer), later
with a sequential design or a family. `method="mean"` is the older t-interval of the mean:
narrower, decides from 3 seeds, but right only when the differences are near-normal
(symmetric); a skewed difference (one configuration noisier and skewed) breaks it.

**Error rates.** `alpha` is the two-sided error of one claim's interval, α/2 per direction,
and holds at every look of a sequential design at once (`looks=(first, last)`: seeds added
one at a time and looked at after each; the boundary is exact for the median, calibrated by
Monte Carlo for the mean). A decided verdict is true of every point of its interval, so it is
wrong only when the interval misses θ. A table of m claims keeps its family-wise error (any
verdict wrong) at α by giving each claim α/m (`claim_alphas`, error_rate="family", the
default); error_rate="claim" gives each α.

Entry points, from the whole table to the parts:

    findings(table, claims)             one row per claim: verdict, interval, diverged runs
    decide(a, b, claim, alpha=...)      one claim from seed -> value mappings of A and B
    interval(a, b, looks, alpha, ...)   the Interval of A − B from those mappings (alias paired_interval)
    intervals(a, b, looks, alpha, ...)  the same on arrays, vectorised over leading axes
    outcomes(low, high, relation, δ)    verdict codes for arrays of intervals (OUTCOMES index)
    sign_bounds(first, last, alpha)     the order statistic k of each look
    extended_bounds(looks, alpha)       the same for a design extended after it ended: (3, 12, 20)
    walk_miss(first, ks)                the exact miss of a design's k, for any continuous noise
    diverged(values, chance, loss)      the runs that failed to train, with the reason
    rate_interval(k_a, n_a, k_b, n_b)   p_A − p_B of two divergence rates (a claim on `diverged`)
    claim_alphas(claims, error_rate)    each claim's α under a family-wise or per-claim rate
    is_open(codes, n, max_seeds)        the adaptive rule: which claims get another seed
    next_targets(...)                   which configurations get which seed next round
    seeds_needed(interval, δ, relation) the fixed-design seeds for an 80%-power decision

A table is rows of (configuration, seed, figure values): a pandas DataFrame or a list of
dicts, with a `configuration` and a `seed` column and one column per figure (or `metric` and
`value` columns). A claim is a `Claim`; `claim(name, a, b, relation, ...)` makes one whose
sides name configurations of the table.
"""
from __future__ import annotations

import dataclasses
import math
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from orchestration.stats import sequential_level, t_quantile
from orchestration.sweep.claims import DIVERGED, Claim, same

__all__ = [
    "ALPHA", "METHODS", "ERROR_RATES", "OUTCOMES", "DECIDED", "HOLDS", "CONTRADICTED", "NO_DIFFERENCE",
    "INCONCLUSIVE", "NOT_RUN", "CHANCE_SHARE", "Claim", "Interval", "Verdict", "claim", "findings", "decide",
    "judge", "interval", "paired_interval", "intervals", "outcomes", "sign_bounds", "extended_bounds", "walk_miss",
    "first_decidable",
    "sequential_level",
    "diverged", "diverged_mask", "DIVERGED_METRIC", "rate_interval", "rate_bounds", "rate_levels", "claim_alphas", "rate_caption", "is_open", "next_targets", "seeds_needed",
    "decide_from_summary", "per_seed", "describe",
]

ALPHA = 0.05
METHODS = ("median", "mean")
ERROR_RATES = ("family", "claim")
HOLDS, CONTRADICTED, NO_DIFFERENCE, INCONCLUSIVE, NOT_RUN = OUTCOMES = (
    "holds", "contradicted", "no difference that matters", "inconclusive", "not run")
DECIDED = (HOLDS, CONTRADICTED, NO_DIFFERENCE)
POWER = 0.8
MAX_SEEDS = 200
CHANCE_SHARE = 0.1  # a run within this share of the way from chance to its configuration's median is at chance
_EXACT = 1e-9  # relative: values this close are one value (a float sum's last bits)


# --------------------------------------------------------------------------- intervals

@dataclass(frozen=True)
class Interval:
    """[low, high] of θ for A − B over n paired seeds; `centre` is the differences' median
    (method median) or mean (method mean), `spread` their standard deviation. low and high
    are NaN when n is too small for an interval at `alpha` (and everything is NaN at n = 0).
    `exact`: every paired seed gave A one value and B another, so the difference is known."""
    centre: float
    low: float
    high: float
    n: int
    spread: float = math.nan
    method: str = "median"
    alpha: float = ALPHA
    looks: tuple[int, int] | None = None
    exact: bool = False

    @property
    def half(self) -> float:
        """Half the interval's width (a median's interval need not be symmetric about its centre)."""
        return (self.high - self.low) / 2

    @property
    def mean(self) -> float:  # the name the tables and older callers read
        return self.centre


@lru_cache(maxsize=None)
def sign_bounds(first: int, last: int, alpha: float = ALPHA) -> tuple[int, ...]:
    """k for each look n = first..last: the interval after n paired seeds is [d₍ₖ₎, d₍ₙ₊₁₋ₖ₎]
    (k = 0: no interval yet), such that the intervals of all looks contain the median together
    with probability ≥ 1 − alpha, each side missing it with probability ≤ alpha/2.

    Exact and free of assumptions on the distribution: the interval at look n lies above the
    median only when fewer than k of the first n differences are at or below it, and that
    count is a Binomial(n, ≥ ½) random walk whatever the distribution (½ when it is
    continuous). The k are those of one per-look one-sided level c, the largest whose joint
    miss, computed exactly over the walk, stays within alpha/2; (n, n) is the fixed design."""
    if not 1 <= first <= last:
        raise ValueError(f"looks ({first}, {last}): need 1 <= first <= last")
    if first == last:  # a fixed design: the largest k whose one tail fits alpha/2
        from scipy.special import bdtr

        return (int(np.sum(bdtr(np.arange((last + 1) // 2), last, 0.5) <= alpha / 2 * (1 + 1e-12))),)
    return _spend(first, (), range(first, last + 1), alpha)


@lru_cache(maxsize=None)
def extended_bounds(looks: tuple[int, ...], alpha: float = ALPHA) -> tuple[int, ...]:
    """k for each look n = looks[0]..looks[-1] of a sequential design extended after it ended
    (more seeds for a finished sweep): (first, last) is `sign_bounds(first, last)`; (first,
    last, more, ...) keeps the k of every look up to `last` as they were, and gives the added
    looks last+1..more the largest per-look level whose joint miss, over the same exact
    Binomial walk as the earlier looks, stays within alpha/2: the error the earlier looks left
    unspent (a spending of what remains). The intervals already reported stay what they were,
    and all looks together miss the median with probability ≤ alpha/2 a side, so an extension
    decided after seeing the verdicts keeps the rate. Each further extension appends a maximum."""
    if len(looks) < 2 or any(b <= a for a, b in zip(looks[1:], looks[2:])):
        raise ValueError(f"looks {looks}: need (first, last, more, ...) with each maximum above the one before")
    if len(looks) == 2:
        return sign_bounds(looks[0], looks[1], alpha)
    kept = extended_bounds(looks[:-1], alpha)
    return _spend(looks[0], kept, range(looks[-2] + 1, looks[-1] + 1), alpha)


def _spend(first: int, kept: tuple[int, ...], looks: range, alpha: float) -> tuple[int, ...]:
    """`kept` (the k of looks first.., fixed) and, for `looks` after them, the k of one per-look
    one-sided level c: the largest whose joint miss with the kept looks stays within alpha/2."""
    from scipy.special import bdtr

    # P(Bin(n, ½) <= k − 1) for k = 1..⌈n/2⌉ at every look: the candidate per-look levels.
    tails = [bdtr(np.arange((n + 1) // 2), n, 0.5) for n in looks]

    def ks(level: float) -> list[int]:
        return [int(np.sum(t <= level * (1 + 1e-12))) for t in tails]

    levels = np.unique(np.concatenate(tails))
    best = [0] * len(tails)
    low, high = 0, len(levels) - 1  # the miss grows with the level: bisect for the largest that fits
    while low <= high:
        mid = (low + high) // 2
        candidate = ks(float(levels[mid]))
        if _walk_miss(first, [*kept, *candidate]) <= alpha / 2 * (1 + 1e-9):
            best, low = candidate, mid + 1
        else:
            high = mid - 1
    return (*kept, *best)


def walk_miss(first: int, ks: Sequence[int]) -> float:
    """The exact chance, for any continuous noise, that the intervals of k = `ks` at looks
    first, first + 1, ... miss the median above at some look (the same below): the figure
    `sign_bounds` and `extended_bounds` keep within alpha/2."""
    return _walk_miss(first, list(ks))


def _walk_miss(first: int, ks: list[int]) -> float:
    """P(some look n has fewer than k_n of n fair coin flips landing below)."""
    last = first + len(ks) - 1
    p = np.zeros(last + 1)
    p[0] = 1.0
    missed = 0.0
    for n in range(1, last + 1):
        p[1:] = 0.5 * (p[1:] + p[:-1])
        p[0] *= 0.5
        k = ks[n - first] if n >= first else 0
        if k:
            missed += p[:k].sum()
            p[:k] = 0.0
    return missed


def _design(looks: tuple[int, ...] | None, n: int) -> tuple[int, ...]:
    """The looks an interval over n seeds is taken under: (n, n) for a fixed design; a
    sequential one (extended: more maxima) widened to include n when the seeds stopped outside it."""
    if looks is None:
        return n, n
    first, *middle, last = looks
    return (max(1, min(first, n)), *middle, max(last, n))


def first_decidable(looks: tuple[int, int] | None, alpha: float = ALPHA, method: str = "median") -> int | None:
    """The fewest paired seeds with an interval under `looks` (None: a fixed design), up to MAX_SEEDS."""
    if method == "mean":
        return 2
    if looks is not None:
        design = (max(1, looks[0]), *looks[1:])
        for n, k in zip(range(design[0], design[-1] + 1), extended_bounds(design, alpha)):
            if k:
                return n
        start = looks[-1] + 1
    else:
        start = 1
    return next((n for n in range(start, MAX_SEEDS + 1) if extended_bounds(_design(looks, n), alpha)[-1]), None)


def _k(looks: tuple[int, ...] | None, n: int, alpha: float) -> int:
    design = _design(looks, n)
    return extended_bounds(design, alpha)[n - design[0]]


def _t_half(looks: tuple[int, int] | None, n: int, alpha: float) -> float:
    """t quantile of the mean's interval at look n (the calibrated sequential level)."""
    if looks is None:
        return t_quantile(n - 1, 1 - alpha)
    if len(looks) > 2:  # the level is calibrated by Monte Carlo for one design, not an extension of it
        raise ValueError(f"looks {looks}: an extended design takes the median's interval (method median)")
    first, last = _design(looks, n)
    return t_quantile(n - 1, sequential_level(max(2, first), max(last, 2), 1 - alpha))


def intervals(a: Any, b: Any, looks: tuple[int, int] | None = None, alpha: float = ALPHA,
              method: str = "median") -> dict[str, np.ndarray]:
    """The intervals of A − B for arrays `a` and `b` of one shape (..., seeds), pairs along the
    last axis; a NaN on either side (a diverged run, a missing seed) drops the pair. Returns
    arrays over the leading axes: centre, low, high, n (paired seeds used), spread.

    The vectorised form of `interval`, for simulations: with `looks`, each row is taken as a
    look after its n pairs of the design. It does not apply the exact rule of `interval`
    (a figure the seed does not move), which needs the two sides' own values."""
    if method not in METHODS:
        raise ValueError(f"method {method!r}: expected one of {', '.join(METHODS)}")
    d = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    d = np.where(np.isfinite(d), d, np.nan)
    ns = np.sum(~np.isnan(d), axis=-1)
    with _quiet():
        centre = np.nanmedian(d, axis=-1) if method == "median" else np.nanmean(d, axis=-1)
        spread = np.nanstd(d, axis=-1, ddof=1)
    low = np.full(ns.shape, np.nan)
    high = np.full(ns.shape, np.nan)
    if method == "median":
        ordered = np.sort(np.where(np.isnan(d), np.inf, d), axis=-1)
        for n in np.unique(ns):
            k = _k(looks, int(n), alpha) if n >= 1 else 0
            if k:
                hit = ns == n
                low[hit] = ordered[hit][..., k - 1]
                high[hit] = ordered[hit][..., n - k]
    else:
        for n in np.unique(ns):
            if n >= 2:
                hit = ns == n
                half = _t_half(looks, int(n), alpha) * spread[hit] / math.sqrt(n)
                low[hit], high[hit] = centre[hit] - half, centre[hit] + half
    return {"centre": centre, "low": low, "high": high, "n": ns, "spread": spread}


@contextmanager
def _quiet():
    """numpy's warnings for all-NaN rows (no pair yet) silenced: those rows are NaN by design."""
    with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


def seed_means(values: Iterable[float], seeds: Iterable[Any]) -> dict[Any, float]:
    """seed -> the mean of its runs' values: one side of a pairing by seed, as read from runs.
    A seed run twice (a resume that double-logged) counts once, as its mean; a NaN is left
    out, and a seed with no value is no pair."""
    runs: dict[Any, list[float]] = {}
    for seed, value in zip(seeds, values):
        if not math.isnan(float(value)):
            runs.setdefault(seed, []).append(float(value))
    return {seed: sum(found) / len(found) for seed, found in runs.items()}


def _pairs(a: Mapping[Any, float], b: Mapping[Any, float], skip: Iterable[Any] = ()) -> list[tuple[Any, float, float]]:
    """(seed, a, b) for the seeds both sides ran with a finite value, less `skip`, in seed order."""
    skip = set(skip)
    out = []
    for seed, va in a.items():
        vb = b.get(seed)
        if seed in skip or va is None or vb is None:
            continue
        va, vb = float(va), float(vb)
        if math.isfinite(va) and math.isfinite(vb):
            out.append((seed, va, vb))
    return sorted(out, key=lambda p: str(p[0]))


def _constant(values: list[float]) -> bool:
    top = max(abs(v) for v in values)
    return max(values) - min(values) <= _EXACT * max(top, 1.0)


def interval(a: Mapping[Any, float], b: Mapping[Any, float], looks: tuple[int, int] | None = None,
             alpha: float = ALPHA, method: str = "median", skip: Iterable[Any] = ()) -> Interval:
    """The interval of A − B over the seeds both ran (a, b: seed -> value; a seed in `skip`,
    e.g. a diverged run's, left out; non-finite values left out). Exact rule: when every
    paired seed gives A the same value and B the same value (a parameter count, FLOPs), the
    figure does not move with the seed and the interval is that one difference."""
    pairs = _pairs(a, b, skip)
    n = len(pairs)
    if n == 0:
        return Interval(math.nan, math.nan, math.nan, 0, math.nan, method, alpha, looks)
    if n >= 2 and _constant([p[1] for p in pairs]) and _constant([p[2] for p in pairs]):
        d = pairs[0][1] - pairs[0][2]
        return Interval(d, d, d, n, 0.0, method, alpha, looks, exact=True)
    # One row: `intervals`' rule without its NaN handling (the pairs are finite), a decide per
    # look of a simulated sweep being the common call.
    d = np.sort(np.array([p[1] - p[2] for p in pairs]))
    spread = float(np.std(d, ddof=1)) if n >= 2 else math.nan
    low = high = math.nan
    if method == "median":
        centre = float(np.median(d))
        k = _k(looks, n, alpha)
        if k:
            low, high = float(d[k - 1]), float(d[n - k])
    elif method == "mean":
        centre = float(np.mean(d))
        if n >= 2:
            half = _t_half(looks, n, alpha) * spread / math.sqrt(n)
            low, high = centre - half, centre + half
    else:
        raise ValueError(f"method {method!r}: expected one of {', '.join(METHODS)}")
    return Interval(centre, low, high, n, spread, method, alpha, looks)


paired_interval = interval  # the name the verdicts' interval had before it was the median's


# --------------------------------------------------------------------------- verdicts

@dataclass(frozen=True)
class Verdict:
    outcome: str  # one of OUTCOMES
    interval: Interval  # of A − B
    paper_inside: bool | None  # the paper's own effect lies in the interval (None: no effect or no interval)
    seeds_needed: int | None  # inconclusive only: fixed-design paired seeds for 80% power (None beyond MAX_SEEDS)
    detail: str = ""  # where the interval lies, in words: "A > B by less than 0.01"
    diverged_a: dict = dataclasses.field(default_factory=dict)  # seed -> why, A's runs that did not train
    diverged_b: dict = dataclasses.field(default_factory=dict)
    seeds_a: int = 0  # A's seeds with a value (diverged included)
    seeds_b: int = 0

    @property
    def decided(self) -> bool:
        return self.outcome in DECIDED


def outcomes(low: Any, high: Any, relation: str, min_effect: float) -> np.ndarray:
    """Verdict codes (indices into OUTCOMES) for arrays of interval bounds; a NaN bound
    (no interval) is inconclusive. NOT_RUN is the caller's (n = 0)."""
    low, high = np.asarray(low, dtype=float), np.asarray(high, dtype=float)
    delta = min_effect
    code = np.full(np.broadcast(low, high).shape, OUTCOMES.index(INCONCLUSIVE))
    with np.errstate(invalid="ignore"):
        within = (-delta < low) & (high < delta)
        if relation == "≈":
            code[(low >= delta) | (high <= -delta)] = OUTCOMES.index(CONTRADICTED)
            code[within] = OUTCOMES.index(HOLDS)
        else:
            sign = {">": 1, "<": -1}[relation]
            code[(sign * low > 0) & (sign * high > 0)] = OUTCOMES.index(HOLDS)
            code[(sign * low < 0) & (sign * high < 0)] = OUTCOMES.index(CONTRADICTED)
            code[within] = OUTCOMES.index(NO_DIFFERENCE)
    return code


def judge(found: Interval, claim: Claim) -> Verdict:
    """The claim's verdict from the interval of A − B."""
    if found.n == 0:
        return Verdict(NOT_RUN, found, None, None, "no seed that both A and B ran")
    if math.isnan(found.low):
        if found.n < 2:
            return Verdict(INCONCLUSIVE, found, None, None, "one paired seed: no interval")
        enough = first_decidable(found.looks, found.alpha, found.method)
        needed = seeds_needed(found, claim.min_effect, claim.relation)
        if enough is not None and needed is not None:
            needed = max(needed, enough)
        return Verdict(INCONCLUSIVE, found, None, needed,
                       f"too few seeds for an interval of the median: about {enough or f'>{MAX_SEEDS}'} would do")
    outcome = OUTCOMES[int(outcomes(found.low, found.high, claim.relation, claim.min_effect))]
    paper_inside = None if claim.paper_effect is None else bool(found.low <= claim.paper_effect <= found.high)
    needed = seeds_needed(found, claim.min_effect, claim.relation) if outcome == INCONCLUSIVE else None
    return Verdict(outcome, found, paper_inside, needed, describe(found.low, found.high, claim.min_effect))


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


def decide(a: Mapping[Any, float], b: Mapping[Any, float], claim: Claim, alpha: float = ALPHA,
           method: str | None = None, loss_a: Mapping[Any, float] | None = None,
           loss_b: Mapping[Any, float] | None = None, diverged_a: Mapping[Any, str] | None = None,
           diverged_b: Mapping[Any, str] | None = None) -> Verdict:
    """The claim's verdict from every seed's value of A and of B (seed -> value; the seeds of
    one side need not be the other's). Runs that diverged (`diverged`, with the claim's
    `chance` and the optional losses, plus any given as diverged_a/_b: seed -> why) are left
    out of the pairs and counted on the verdict. `alpha`: this claim's share of the error
    (`claim_alphas`); `method`: None takes the claim's."""
    method = method or claim.interval
    if claim.metric == DIVERGED_METRIC:  # a claim on the divergence rate: every seed counts
        gone_a = {**{s: "diverged" for s, v in a.items() if v is not None and v != 0}, **(diverged_a or {})}
        gone_b = {**{s: "diverged" for s, v in b.items() if v is not None and v != 0}, **(diverged_b or {})}
        found = rate_interval(len(gone_a), len(set(a) | set(gone_a)), len(gone_b), len(set(b) | set(gone_b)),
                              claim.looks, alpha)
        verdict = judge(found, claim)
        return dataclasses.replace(verdict, diverged_a=gone_a, diverged_b=gone_b,
                                   seeds_a=len(set(a) | set(gone_a)), seeds_b=len(set(b) | set(gone_b)))
    gone_a = {**diverged(a, claim.chance, loss_a), **(diverged_a or {})}
    gone_b = {**diverged(b, claim.chance, loss_b), **(diverged_b or {})}
    found = interval(a, b, claim.looks, alpha, method, skip=set(gone_a) | set(gone_b))
    verdict = judge(found, claim)
    return dataclasses.replace(verdict, diverged_a=gone_a, diverged_b=gone_b, seeds_a=len(set(a) | set(gone_a)),
                               seeds_b=len(set(b) | set(gone_b)))


def decide_from_summary(mean: float, half: float, n: int, claim: Claim, alpha: float = ALPHA) -> Verdict:
    """The verdict of a printed fixed-design t-interval mean ± half (95%, n paired seeds),
    without the runs (method mean): the spread is read back from the half-width, and a claim
    with looks gets its sequential interval at that spread."""
    spread = half * math.sqrt(n) / t_quantile(n - 1, 1 - alpha) if n >= 2 else math.nan
    if n >= 2 and claim.looks is not None:
        half = _t_half(claim.looks, n, alpha) * spread / math.sqrt(n)
    return judge(Interval(mean, mean - half, mean + half, n, spread, "mean", alpha, claim.looks), claim)


# --------------------------------------------------------------------------- diverged runs

DIVERGED_METRIC = DIVERGED  # a claim on this figure compares the two sides' divergence rates
RATE = "rate"  # the Interval.method of a divergence rate's interval


def rate_interval(gone_a: int, seeds_a: int, gone_b: int, seeds_b: int,
                  looks: tuple[int, ...] | None = None, alpha: float = ALPHA) -> Interval:
    """The interval of p_A − p_B, the chance that a run of A (of B) diverges, from `gone_a` of
    `seeds_a` runs of A diverged and `gone_b` of `seeds_b` of B: [L_A − H_B, H_A − L_B] of the
    two sides' exact (Clopper–Pearson) intervals, each end at a one-sided level whose miss,
    over all the design's looks at once and at the worst rate, is at most alpha/4
    (`rate_levels`). The difference then misses each way with probability ≤ alpha/2 for any
    two rates, however the seeds stopped within the looks; the sides' seeds need not be the
    same ones, and one seed a side gives an interval. Conservative, as exact binomial
    intervals are: a decided verdict is wrong less often than alpha/2 a side."""
    n = min(seeds_a, seeds_b)
    if n == 0:
        return Interval(math.nan, math.nan, math.nan, 0, math.nan, RATE, alpha, looks)
    (la, ha), (lb, hb) = rate_bounds(gone_a, seeds_a, looks, alpha), rate_bounds(gone_b, seeds_b, looks, alpha)
    return Interval(gone_a / seeds_a - gone_b / seeds_b, la - hb, ha - lb, n, math.nan, RATE, alpha, looks)


def rate_bounds(k: int, n: int, looks: tuple[int, ...] | None = None, alpha: float = ALPHA) -> tuple[float, float]:
    """One side's exact interval of its rate after k of n runs diverged, at look n of `looks`:
    each end misses the rate with probability ≤ alpha/4 over all the looks at once."""
    design = _design(looks, n)
    level = rate_levels(design, alpha)[n - design[0]]
    return float(_lower(k, n, level)), 1.0 - float(_lower(n - k, n, level))


def _lower(k: Any, n: int, level: float) -> Any:
    """Clopper–Pearson's lower bound of a rate after k of n at one-sided `level` (0 at k = 0)."""
    from scipy.special import betaincinv

    k = np.asarray(k, dtype=float)
    with np.errstate(invalid="ignore"):
        return np.where(k > 0, betaincinv(np.maximum(k, 1), n - k + 1, level), 0.0)


@lru_cache(maxsize=None)
def rate_levels(looks: tuple[int, ...], alpha: float = ALPHA) -> tuple[float, ...]:
    """The one-sided level of each look n = looks[0]..looks[-1] of a rate's exact interval: the
    largest single level whose chance of putting the lower bound above the true rate at some
    look, computed exactly over the Binomial walk at the worst rate, is at most alpha/4 (the
    upper bound's by symmetry). (n, n): alpha/4, Clopper–Pearson's own. An extended design
    (first, last, more, ...) keeps the earlier looks' levels and gives the added ones what the
    earlier left unspent, as `extended_bounds` does for the median: at the worst rate the first
    design spends all of it, so the added looks get level 0, the interval [−1, 1]: more seeds
    never decide a rate claim the first design left open (its rate would not hold)."""
    first, last = looks[0], looks[-1]
    if first == last:
        return (alpha / 4,)
    kept = rate_levels(looks[:-1], alpha) if len(looks) > 2 else ()
    added = range(looks[-2] + 1 if kept else first, last + 1)
    low, high = 0.0, alpha / 4  # level 0 (no bound) never misses
    for _ in range(40):  # the miss grows with the level: bisect
        mid = (low + high) / 2
        if _rate_miss(first, [*kept, *[mid] * len(added)]) <= alpha / 4 * (1 + 1e-9):
            low = mid
        else:
            high = mid
    return (*kept, *[low] * len(added))


def _rate_miss(first: int, levels: list[float]) -> float:
    """The largest, over rates p, chance that a lower bound at looks first.. is above p. Between
    two bounds' values the event is fixed and grows with p, so the supremum is at a bound's
    value, with the runs whose bound reaches it: the candidates are every look's bounds."""
    last = first + len(levels) - 1
    bounds = {n: _lower(np.arange(n + 1), n, c) for n, c in zip(range(first, last + 1), levels)}
    candidates = np.unique(np.concatenate([b[b > 0] for b in bounds.values()]))
    if not candidates.size:
        return 0.0
    p = candidates[:, None]
    dist = np.zeros((len(candidates), last + 1))  # P(k runs diverged so far, no look missed yet)
    dist[:, 0] = 1.0
    missed = np.zeros(len(candidates))
    for n in range(1, last + 1):
        dist[:, 1:n + 1] = dist[:, 1:n + 1] * (1 - p) + dist[:, 0:n] * p
        dist[:, 0] *= 1 - p[:, 0]
        if n in bounds:
            over = bounds[n][None, :] >= p * (1 - 1e-12)  # the bound reaches p: a miss
            missed += (dist[:, :n + 1] * over).sum(axis=1)
            dist[:, :n + 1] *= ~over
    return float(missed.max())


def diverged(values: Mapping[Any, float], chance: float | None = None,
             loss: Mapping[Any, float] | None = None) -> dict[Any, str]:
    """The runs of one configuration that failed to train: seed -> why.

    A run diverged when (1) its value or its loss (when given) is not a finite number (NaN,
    ±inf), or (2) a chance level is given and the run is at it while its configuration's other
    seeds are not: it went at most CHANCE_SHARE (a tenth) of the way from chance to the median
    of the other seeds, or beyond chance the other way. A configuration whose seeds all sit at
    chance did not diverge: it does not learn, which a verdict should see."""
    seeds = list(values)
    out: dict[Any, str] = {}
    for seed in seeds:
        v = values[seed]
        if v is None or not math.isfinite(float(v)):
            out[seed] = f"its value is {v}"
        elif loss is not None and seed in loss and loss[seed] is not None and not math.isfinite(float(loss[seed])):
            out[seed] = f"its loss is {loss[seed]}"
    if chance is not None:
        array = np.array([[float(values[s]) if values[s] is not None else np.nan for s in seeds]])
        flags = diverged_mask(array, chance)[0]
        for seed, flag in zip(seeds, flags):
            if flag and seed not in out:
                out[seed] = f"at chance ({float(values[seed]):.4g}, chance {chance:g}) where its other seeds are not"
    return out


def diverged_mask(values: Any, chance: float) -> np.ndarray:
    """Rule (2) of `diverged` on an array (..., seeds) of one configuration's values per row:
    True where a run sits at `chance` while the median of the row's other finite values does
    not. Non-finite values are rule (1): mark them with np.isfinite."""
    x = np.asarray(values, dtype=float)
    flags = np.zeros(x.shape, dtype=bool)
    for i in range(x.shape[-1]):
        others = np.delete(x, i, axis=-1)
        with _quiet():
            middle = np.nanmedian(others, axis=-1) if others.shape[-1] else np.full(x.shape[:-1], np.nan)
        gap = middle - chance
        with np.errstate(invalid="ignore", divide="ignore"):
            share = (x[..., i] - chance) / gap
            flags[..., i] = np.isfinite(x[..., i]) & np.isfinite(gap) & (gap != 0) & (share <= CHANCE_SHARE)
    return flags


# --------------------------------------------------------------------------- families and seeds

def claim_alphas(claims: Sequence[Claim], error_rate: str | None = None, alpha: float = ALPHA) -> list[float]:
    """Each claim's two-sided α. Family-wise (a claim's error_rate "family", or error_rate
    given as "family"): the m family claims share α, α/m each (Bonferroni), so that the
    chance any of their verdicts is wrong stays within α whatever their dependence (claims
    sharing a baseline included). Per claim ("claim"): α each."""
    rates = [error_rate or c.error_rate for c in claims]
    for rate in rates:
        if rate not in ERROR_RATES:
            raise ValueError(f"error rate {rate!r}: expected one of {', '.join(ERROR_RATES)}")
    family = sum(r == "family" for r in rates)
    return [alpha / family if r == "family" else alpha for r in rates]


def rate_caption(rates: Sequence[str], alpha: float = ALPHA) -> str:
    """What error rate a table keeps, in one sentence, from each claim's error rate."""
    family = sum(r == "family" for r in rates)
    if not rates:
        return ""
    if family == len(rates):
        return (f"Family-wise: the chance that any of these {family} verdicts is wrong is at most {alpha:.0%} "
                f"(each claim's interval at {alpha / family:.2%}, {alpha / family / 2:.2%} a side).")
    if not family:
        return f"Per claim: each verdict is wrong with probability at most {alpha:.0%}, {alpha / 2:.1%} each way."
    return (f"Family-wise over the {family} claims marked family (each at {alpha / family:.2%}): the chance that "
            f"any of them is wrong is at most {alpha:.0%}; the others at {alpha:.0%} each.")


def is_open(codes: Any, n: Any, max_seeds: int) -> np.ndarray:
    """The adaptive rule: a claim gets another paired seed while it is undecided (inconclusive,
    or not run yet) and `n`, the fewest seeds its configurations have run (diverged ones
    included: a side that always diverges stays not run, and stops at max), is below
    `max_seeds`. codes: OUTCOMES indices."""
    codes = np.asarray(codes)
    undecided = ~np.isin(codes, [OUTCOMES.index(o) for o in DECIDED])
    return undecided & (np.asarray(n) < max_seeds)


def next_targets(open_sides: Sequence[Sequence[str]], seeds: Mapping[str, int],
                 room: int | None = None) -> tuple[dict[str, int], bool]:
    """The next round: each open claim (its configurations; the first two are the sides it
    pairs, any more share its seeds, e.g. a TM-relative claim's baseline) raises its
    configurations to one more than its sides' fewest seeds. Claims are taken in order while
    the added trials fit `room` (None: no limit). Returns ({configuration: seeds wanted}, cut)."""
    targets: dict[str, int] = {}
    for sides in open_sides:
        want = min(seeds[v] for v in sides[:2]) + 1
        wanted = dict(targets)
        for v in sides:
            wanted[v] = max(wanted.get(v, seeds[v]), want)
        added = sum(k - seeds[v] for v, k in wanted.items())
        if room is not None and added > room:
            return targets, True
        targets = wanted
    return targets, False


# --------------------------------------------------------------------------- planning

def seeds_needed(found: Interval, min_effect: float, relation: str, power: float = POWER,
                 most: int = MAX_SEEDS) -> int | None:
    """The fewest paired seeds n (more than found.n) at which a fixed design at the interval's
    alpha and method decides the claim with probability `power`, were the differences normal
    with the observed centre and spread; None when no n up to `most` does."""
    # Blocks of n, nearest first: an adaptive sweep asks after every seed, and nearly every
    # answer lies in the first block.
    if found.method == RATE:  # no planning figure for a rate's interval
        return None
    start = max(found.n + 1, 2)
    for begin in range(start, most + 1, _BLOCK):
        hit = _needed_in(found, min_effect, relation, power, np.arange(begin, min(begin + _BLOCK, most + 1)), most)
        if hit != 0:
            return hit
    return None


_BLOCK = 24


def _needed_in(found: Interval, min_effect: float, relation: str, power: float, ns: np.ndarray,
               most: int) -> int | None:
    """seeds_needed over the block `ns`: the first n that decides, None when none ever will
    (no spread to go on), 0 when none in this block does."""
    from scipy.special import bdtr, ndtr

    mean, spread = found.centre, found.spread
    alpha = found.alpha
    if spread == 0 and math.isfinite(mean):  # no spread seen: the first n with an interval decides
        if found.method == "mean":
            return int(ns[0])
        hit = np.flatnonzero(_fixed_ks(alpha, most)[ns - 1] > 0)
        return int(ns[hit[0]]) if hit.size else 0
    if not (spread > 0 and math.isfinite(spread) and math.isfinite(mean)):
        return None
    delta = min_effect
    if found.method == "mean":
        t = np.array([t_quantile(int(n) - 1, 1 - alpha) for n in ns])
        sd = spread / np.sqrt(ns)
        h = t * sd
        d = abs(mean)
        apart = h + (delta if relation == "≈" else 0.0)
        p = ndtr((d - apart) / sd) + ndtr((-d - apart) / sd)
        inside = np.maximum(delta - h, 0.0)
        p += np.where(inside > 0, ndtr((inside - d) / sd) - ndtr((-inside - d) / sd), 0.0)
    else:
        z = lambda x: float(ndtr((x - mean) / spread))  # noqa: E731 - P(d < x)
        p_lo, p_neg, p_pos = z(-delta), z(0.0), z(delta)  # cumulative at −δ, 0, δ
        k = _fixed_ks(alpha, most)[ns - 1] - 1.0  # fewer than k: at most k − 1
        with np.errstate(invalid="ignore"):
            below0 = bdtr(k, ns, p_neg)  # L > 0: fewer than k at or below 0
            above0 = bdtr(k, ns, 1 - p_neg)  # H < 0
            low_in = bdtr(k, ns, p_lo)  # L > −δ
            high_in = bdtr(k, ns, 1 - p_pos)  # H < δ
            # The two ends' counts taken as independent: a planning figure.
            if relation == "≈":
                p = low_in * high_in + bdtr(k, ns, p_pos) + bdtr(k, ns, 1 - p_lo)  # inside, L ≥ δ, H ≤ −δ
            else:  # L > 0, H < 0 or inside ±δ; inside and L > 0 is L > 0 and H < δ
                p = below0 + above0 + low_in * high_in - below0 * high_in - above0 * low_in
        p = np.where(k >= 0, np.minimum(p, 1.0), 0.0)
    hit = np.flatnonzero(p >= power)
    return int(ns[hit[0]]) if hit.size else 0


@lru_cache(maxsize=16)
def _fixed_ks(alpha: float, most: int) -> np.ndarray:
    """k of the fixed design at n = 1..most (0: no interval)."""
    from scipy.special import bdtr

    out = np.zeros(most, dtype=int)
    for n in range(1, most + 1):
        out[n - 1] = int(np.sum(bdtr(np.arange((n + 1) // 2), n, 0.5) <= alpha / 2 * (1 + 1e-12)))
    return out


# --------------------------------------------------------------------------- tables

def claim(name: str, a: str, b: str, relation: str, min_effect: float = 0.01, metric: str = "value",
          looks: tuple[int, int] | None = None, chance: float | None = None, error_rate: str = "family",
          method: str = "median", **extra: Any) -> Claim:
    """A claim whose sides name configurations of a table (its `configuration` column)."""
    from orchestration.sweep.claims import SPELLINGS

    return Claim(name=name, metric=metric, a={"configuration": a}, b={"configuration": b},
                 relation=SPELLINGS.get(relation, relation), min_effect=min_effect, looks=looks,
                 chance=chance, error_rate=error_rate, interval=method, **extra)


def _frame(table: Any):
    import pandas as pd

    frame = table if isinstance(table, pd.DataFrame) else pd.DataFrame(list(table))
    if "configuration" not in frame or "seed" not in frame:
        raise ValueError("a table needs a `configuration` and a `seed` column")
    if "metric" in frame and "value" in frame:  # long: one row per (configuration, seed, metric)
        frame = frame.pivot_table(index=["configuration", "seed"], columns="metric", values="value",
                                  aggfunc="mean", dropna=False).reset_index()
    return frame


def per_seed(table: Any, selector: Mapping[str, Any], metric: str) -> dict[Any, float]:
    """seed -> value of `metric` over the rows the selector picks (its keys are the table's
    columns; a seed on several rows counts once, as their mean; a NaN value stays: it is a
    run that did not train)."""
    frame = _frame(table)
    if metric not in frame:
        return {}
    keep = np.ones(len(frame), dtype=bool)
    for key, want in selector.items():
        if key == "experiment" and key not in frame:
            continue
        if key not in frame:
            return {}
        keep &= frame[key].map(lambda v, w=want: same(v, w)).to_numpy(dtype=bool)
    rows = frame[keep]
    values = rows[metric].astype(float)
    out = {}
    for seed, group in values.groupby(rows["seed"], sort=True):
        finite = group[np.isfinite(group)]
        out[seed] = float(finite.mean()) if len(finite) else float(group.iloc[0])
    return out


def row(claim_: Claim, verdict: Verdict) -> dict[str, Any]:
    """One row of a findings table: the claim, its interval and its verdict."""
    iv = verdict.interval
    return {"claim": claim_.name, "source": claim_.source, "metric": claim_.metric, "relation": claim_.relation,
            "min_effect": claim_.min_effect, "a_n": verdict.seeds_a, "b_n": verdict.seeds_b, "n": iv.n,
            "delta": iv.centre, "half": iv.half, "low": iv.low, "high": iv.high, "method": iv.method,
            "alpha": iv.alpha, "verdict": verdict.outcome, "detail": verdict.detail,
            "a_diverged": len(verdict.diverged_a), "b_diverged": len(verdict.diverged_b),
            "paper_effect": claim_.paper_effect, "paper_inside": verdict.paper_inside,
            "seeds_needed": verdict.seeds_needed, "error_rate": claim_.error_rate,
            "looks": "..".join(map(str, claim_.looks)) if claim_.looks else None, "paper": claim_.paper}


def findings(table: Any, claims: Sequence[Claim], error_rate: str | None = None, method: str | None = None,
             alpha: float = ALPHA):
    """The findings of `claims` on a plain table (see the module's docstring): a DataFrame,
    one row per claim. error_rate None keeps each claim's (default "family"); method None
    each claim's (default "median")."""
    import pandas as pd

    claims = [dataclasses.replace(c, **{k: v for k, v in (("error_rate", error_rate), ("interval", method)) if v})
              for c in claims]
    rows = []
    for c, share in zip(claims, claim_alphas(claims, None, alpha)):
        rows.append(row(c, decide(per_seed(table, c.a, c.metric), per_seed(table, c.b, c.metric), c, share)))
    return pd.DataFrame(rows).astype({"seeds_needed": "Int64"}) if rows else pd.DataFrame()
