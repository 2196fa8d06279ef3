"""One interval per comparison: the leaderboard's Δ column and the findings table show the same
interval for the same comparison, the verdicts' (sequential over adaptive seeds, at a claim's
share of the family where a claim makes it), and the caption says which."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from orchestration.report import verdicts
from orchestration.report.leaderboard import render
from orchestration.report.table import DELTA_TAG, build_table, delta_design, delta_design_tag, sort_table
from orchestration.sweep.claims import Configuration

SEEDS = range(12)
VARIANTS = {"baseline": ("baseline", 0.0), "p000": ("search", 0.01), "p001": ("search", -0.004),
            "p002": ("search", 0.002)}


def _values() -> dict[str, dict[str, float]]:
    """overall by variant and seed: a shared seed effect, each variant's shift, skewed noise."""
    rng = np.random.default_rng(7)
    seed_effect = rng.normal(0, 0.02, len(SEEDS))
    return {v: {str(s): 0.6 + shift + seed_effect[s] + rng.lognormal(0, 1) * 0.003 for s in SEEDS}
            for v, (_, shift) in VARIANTS.items()}


def _runs(values: dict[str, dict[str, float]], diverged: dict[tuple[str, str], str] | None = None) -> pd.DataFrame:
    diverged = diverged or {}
    rows = []
    for variant, seeds in values.items():
        for seed, overall in seeds.items():
            rows.append({"status": "FINISHED", "tags.variant": variant, "tags.role": VARIANTS[variant][0],
                         "tags.seed": seed, "tags.diverged": diverged.get((variant, seed)),
                         "params.sharing.head_regime": f"R-{variant}", "metrics.overall": overall,
                         "metrics.sst_acc": overall, "metrics.para_acc": overall, "metrics.sts_corr": overall,
                         "metrics.train_time_s": 10.0, "metrics.model_size_mb": 1.0})
    return pd.DataFrame(rows)


# Two claims against the baseline (one with the baseline as A) and one between two searched points:
# a family of three, each at 5%/3.
CLAIMS = [verdicts.claim("p000 > *", "p000", "baseline", ">", 0.005, "overall", looks=(3, 12)),
          verdicts.claim("* > p001", "baseline", "p001", ">", 0.005, "overall", looks=(3, 12)),
          verdicts.claim("p000 ≈ p002", "p000", "p002", "≈", 0.005, "overall", looks=(3, 12))]
CONFIGS = [Configuration(v, role, {"configuration": v, "role": role}) for v, (role, _) in VARIANTS.items()]


def _table(values, diverged=None) -> pd.DataFrame:
    tags = {"tasks": "sst,para,sts", "space_keys": "sharing.head_regime",
            DELTA_TAG: delta_design_tag(CLAIMS, CONFIGS, (3, 12), "median")}
    return sort_table(build_table(_runs(values, diverged), tags))


def _plain(values) -> list[dict]:
    return [{"configuration": v, "seed": s, "overall": x} for v, seeds in values.items() for s, x in seeds.items()]


def test_the_delta_column_is_the_claims_interval():
    values = _values()
    table = _table(values).set_index("variant")
    found = verdicts.findings(_plain(values), CLAIMS).set_index("claim")
    a = found.loc["p000 > *"]
    row = table.loc["p000"]
    assert a["alpha"] == pytest.approx(0.05 / 3) and row["overall_delta_alpha"] == pytest.approx(a["alpha"])
    assert (row["overall_delta"], row["overall_delta_low"], row["overall_delta_high"], row["overall_delta_n"]) == (
        pytest.approx(a["delta"]), pytest.approx(a["low"]), pytest.approx(a["high"]), a["n"])
    # The baseline as the claim's A: the same interval, turned round (the column is always row − *).
    b = found.loc["* > p001"]
    row = table.loc["p001"]
    assert (row["overall_delta_low"], row["overall_delta_high"]) == (pytest.approx(-b["high"]), pytest.approx(-b["low"]))
    assert not math.isnan(row["overall_delta_low"])
    # No claim against the baseline: 95% for this comparison, still over the seeds' looks.
    own = verdicts.interval(values["p002"], values["baseline"], (3, 12), 0.05)
    row = table.loc["p002"]
    assert row["overall_delta_alpha"] == 0.05
    assert (row["overall_delta_low"], row["overall_delta_high"]) == (pytest.approx(own.low), pytest.approx(own.high))
    # A wider family widens it: the claim's level is not 95%.
    assert verdicts.interval(values["p000"], values["baseline"], (3, 12), 0.05).high <= table.loc["p000", "overall_delta_high"]


def test_the_cell_and_caption_say_which_interval():
    values = _values()
    table = _table(values)
    md = render(table, "md")
    row = table.set_index("variant").loc["p000"]
    cell = f"**{row['overall_delta']:+.3f}** [{row['overall_delta_low']:+.3f}, {row['overall_delta_high']:+.3f}] 98.33% (n=12)"
    assert cell in md  # the claim's level named; the best Δ bold
    p002 = table.set_index("variant").loc["p002"]
    assert f"[{p002['overall_delta_low']:+.3f}, {p002['overall_delta_high']:+.3f}] (n=12)" in md  # 95%: not named
    assert "its 95% interval [L, H], valid whatever the noise's shape; sequential over looks 3..12;" in md
    assert "at the claim's level (named in the cell), as mtbert findings gives it" in md


def test_a_diverged_run_leaves_the_delta_as_it_leaves_the_verdict():
    values = _values()
    values["p000"]["4"] = float("nan")
    gone = {("baseline", "7"): "its loss is nan"}
    table = _table(values, gone).set_index("variant")
    found = verdicts.findings(_plain(values), CLAIMS)
    a = verdicts.decide(values["p000"], values["baseline"], CLAIMS[0], 0.05 / 3, diverged_b={"7": "loss"})
    assert table.loc["p000", "overall_delta_n"] == a.interval.n == 10
    assert table.loc["p000", "overall_delta_low"] == pytest.approx(a.interval.low)
    assert found.set_index("claim").loc["p000 > *", "n"] == 11  # the plain table knows no tag: one seed more


def test_a_sweep_logged_before_the_tag_reads_its_looks_from_the_seeds_tag():
    assert delta_design({"seeds": "adaptive 3..10"}).looks == (3, 10)
    assert delta_design({"seeds": "adaptive 1..5"}).looks == (2, 5)
    assert delta_design({"seeds": "0,1,2"}).looks is None
    design = delta_design({DELTA_TAG: delta_design_tag(CLAIMS, CONFIGS, None, "mean")})
    assert design.method == "mean" and set(design.claims) == {"p000", "p001"}
