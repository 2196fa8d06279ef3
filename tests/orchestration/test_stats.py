"""Seed statistics in the leaderboard: 95% t-intervals and the Δ paired by seed, against scipy."""
from __future__ import annotations

import math

import pandas as pd
import pytest
from scipy import stats

from orchestration.report import verdicts
from orchestration.report.leaderboard import render
from orchestration.report.table import build_table, sort_table
from orchestration.stats import mean_ci, paired_delta

SCORES = [0.652, 0.640, 0.664]


def test_mean_ci_matches_scipy_on_known_numbers():
    mean, half, n = mean_ci(SCORES)
    low, high = stats.t.interval(0.95, len(SCORES) - 1, loc=sum(SCORES) / 3, scale=stats.sem(SCORES))
    assert n == 3 and mean == pytest.approx(0.652)
    assert (mean - half, mean + half) == (pytest.approx(low), pytest.approx(high))
    # by hand: s = 0.012, t(0.975, 2) = 4.3027, half = 4.3027 * 0.012 / sqrt(3)
    assert half == pytest.approx(4.302653 * 0.012 / math.sqrt(3), rel=1e-6)


def test_one_seed_has_no_interval_and_nan_is_skipped():
    assert mean_ci([0.5])[0] == 0.5 and math.isnan(mean_ci([0.5])[1])
    assert mean_ci([0.5, math.nan, 0.7])[2] == 2
    assert mean_ci([])[2] == 0


# Seeds disagree by 0.2 while the config beats the baseline by 0.005 at every seed.
BASE = {0: 0.60, 1: 0.70, 2: 0.80, 3: 0.65, 4: 0.75}
BUMP = {0: 0.0050, 1: 0.0060, 2: 0.0040, 3: 0.0050, 4: 0.0055}
CONFIG = {s: BASE[s] + BUMP[s] for s in BASE}


def test_paired_delta_matches_scipy_and_resolves_what_unpaired_cannot():
    delta, half, n = paired_delta(CONFIG, BASE)
    seeds = sorted(BASE)
    res = stats.ttest_rel([CONFIG[s] for s in seeds], [BASE[s] for s in seeds])
    ci = res.confidence_interval(0.95)
    assert n == 5 and delta == pytest.approx(0.0051)
    assert (delta - half, delta + half) == (pytest.approx(ci.low), pytest.approx(ci.high))
    assert delta - half > 0  # paired: the gain is resolved
    unpaired = stats.ttest_ind(list(CONFIG.values()), list(BASE.values())).confidence_interval(0.95)
    assert unpaired.low < 0 < unpaired.high  # two independent samples: lost in the seed spread


def test_paired_delta_uses_only_seeds_both_ran():
    delta, half, n = paired_delta({0: 0.7, 1: 0.8, 2: 0.9}, {0: 0.6, 1: 0.7, 5: 0.1})
    assert n == 2 and delta == pytest.approx(0.1) and half == pytest.approx(0.0, abs=1e-12)
    assert paired_delta({0: 0.7}, {0: 0.6})[2] == 1 and math.isnan(paired_delta({0: 0.7}, {0: 0.6})[1])


def _runs(rows: list[tuple[str, str, int, str, float]]) -> pd.DataFrame:
    """mlflow.search_runs-shaped frame: (variant, role, seed, head regime, overall)."""
    out = []
    for variant, role, seed, regime, overall in rows:
        out.append({"status": "FINISHED", "tags.variant": variant, "tags.role": role, "tags.seed": str(seed),
                    "params.sharing.head_regime": regime, "params.optim.lr": "0.001",
                    "metrics.overall": overall, "metrics.sst_acc": overall - 0.2, "metrics.para_acc": overall,
                    "metrics.sts_corr": overall + 0.2, "metrics.best_epoch": 2.0, "metrics.train_time_s": 10.0,
                    "metrics.model_size_mb": 1.0, "metrics.peak_memory_mb": 5.0,
                    "metrics.tm_relative_score": 1.0})
    return pd.DataFrame(out)


TAGS = {"tasks": "sst,para,sts", "space_keys": "sharing.head_regime"}
# Six seeds: the fewest whose median has a 95% interval (docs/verdicts.md).
BASE6 = {**BASE, 5: 0.72}
CONFIG6 = {**CONFIG, 5: 0.72 + 0.0045}


@pytest.fixture
def table() -> pd.DataFrame:
    rows = [("baseline", "baseline", s, "I-I-I", BASE6[s]) for s in BASE6]
    rows += [("p000", "search", s, "S-S-S", CONFIG6[s]) for s in BASE6]
    rows += [("p001", "search", 0, "I-S-S", 0.9)]  # one seed: no interval
    rows += [("reference", "reference", s, "none", BASE6[s] + 0.003) for s in BASE6]
    runs = _runs(rows)
    runs.loc[runs["tags.variant"] == "reference", "metrics.sst_acc"] = 0.95  # every row below it on SST
    return sort_table(build_table(runs, TAGS))


def test_table_carries_intervals_and_the_verdicts_paired_delta(table):
    rows = table.set_index("variant")
    mean, half, n = mean_ci(CONFIG6.values())
    assert rows.loc["p000", "overall"] == pytest.approx(mean)
    assert rows.loc["p000", "overall_ci95"] == pytest.approx(half)
    # The Δ is the verdicts' interval of the median: [smallest, largest] difference at six seeds.
    found = verdicts.interval(CONFIG6, BASE6)
    assert (found.centre, found.low, found.high) == (pytest.approx(0.005), pytest.approx(0.004), pytest.approx(0.006))
    assert rows.loc["p000", "overall_delta"] == pytest.approx(found.centre)
    assert rows.loc["p000", ["overall_delta_low", "overall_delta_high"]].tolist() == [
        pytest.approx(found.low), pytest.approx(found.high)]
    assert rows.loc["p000", "overall_delta_n"] == found.n == 6 and rows.loc["p000", "overall_delta_alpha"] == 0.05
    assert math.isnan(rows.loc["baseline", "overall_delta"])
    assert math.isnan(rows.loc["p001", "overall_ci95"]) and rows.loc["p001", "overall_delta_n"] == 1
    assert math.isnan(rows.loc["p001", "overall_delta_low"])


def test_every_format_shows_the_interval_and_delta(table):
    md = render(table, "md")
    lines = md.splitlines()
    assert lines[0].startswith("| Regime | LR (enc. / heads) | w [sst para sts] | Overall | Δ overall vs * | Epoch |")
    p000 = next(line for line in lines if line.startswith("| S-S-S"))
    mean, half, _ = mean_ci(CONFIG6.values())
    assert f"| {mean:.3f} ± {half:.3f} | +0.005 [+0.004, +0.006] (n=6) |" in p000
    p001 = next(line for line in lines if line.startswith("| I-S-S"))
    assert "| **0.900** | **+0.300** (n=1) |" in p001  # one seed: no interval; the best overall: bold
    assert "95% confidence interval" in md and "the median of the per-seed differences from *" in md
    # the reference row is named, and the caption lists who falls below it, task by task
    assert any(line.startswith("| frozen reference |") for line in lines)
    assert ("rows whose mean is below it: Overall: I-I-I k=all*; SC acc.: I-I-I k=all*, I-S-S k=all, "
            "S-S-S k=all; PD acc.: I-I-I k=all*;") in md
    latex = render(table, "latex")
    assert r"$\Delta$ overall vs *" in latex and r"$\pm$" in latex and "{[}+0.004, +0.006{]} (n=6)" in latex
    html = render(table, "html")
    assert "Δ overall<br>vs *" in html and '+0.005 <span class="aside">[+0.004, +0.006] (n=6)</span>' in html
    assert "the median of the per-seed differences" in html
    csv = pd.read_csv(__import__("io").StringIO(render(table, "csv")))
    for col in ("overall", "overall_ci95", "n", "overall_delta", "overall_delta_low", "overall_delta_high",
                "overall_delta_n", "overall_delta_alpha"):
        assert col in csv.columns
    row = csv.set_index("variant").loc["p000"]
    assert (row["overall_delta_low"], row["overall_delta_high"], row["overall_delta_n"]) == (
        pytest.approx(0.004), pytest.approx(0.006), 6)


def test_a_baseline_that_differs_outside_the_space_says_how():
    # pals.yaml: the space sweeps PALs under annealed sampling; the baseline samples round robin.
    rows = [("baseline", "baseline", 0, "I-I-I", 0.6), ("p000", "search", 0, "I-I-I", 0.61),
            ("p001", "search", 0, "I-I-I", 0.62)]
    runs = _runs(rows).assign(**{"params.sampling.strategy": ["round_robin", "annealed", "annealed"],
                                 "params.sharing.pal_size": ["0", "0", "96"]})
    tags = {"tasks": "sst,para,sts", "space_keys": "sharing.pal_size"}
    labels = lambda t: dict(zip(t["variant"], t["regime"]))  # noqa: E731
    assert labels(build_table(runs, tags)) == {"baseline": "I-I-I k=all", "p000": "I-I-I k=all",
                                               "p001": "I-I-I k=all pal=96"}  # a sweep logged before the tag
    assert labels(build_table(runs, {**tags, "baseline_keys": "sampling.strategy,sharing.pal_size"})) == {
        "baseline": "I-I-I k=all", "p000": "I-I-I k=all sampling=annealed", "p001": "I-I-I k=all pal=96 sampling=annealed"}
