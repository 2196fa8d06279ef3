"""Diverged runs are a finding: a run that failed to train (training stopped on a non-finite loss,
or it finished with a non-finite overall or loss) is tagged `diverged` with its reason, counted
per configuration ("2 of 3") in every export of the leaderboard, left out of the row's means and
of Δ, and counted per side in findings."""
from __future__ import annotations

import math

import pandas as pd
import pytest

from orchestration.report.leaderboard import render
from orchestration.report.table import build_table, sort_table
from orchestration.track.tracking import diverged_reason

LOSS = "loss of task 'sst' is nan at epoch 1, step 2; try a lower optim.lr or check the data"


def _run(variant: str, role: str, seed: int, overall: float, status: str = "FINISHED", diverged: str | None = None,
         error: str | None = None) -> dict:
    return {"status": status, "tags.variant": variant, "tags.role": role, "tags.seed": str(seed),
            "tags.diverged": diverged, "tags.error": error, "params.optim.lr": {"baseline": "5e-05"}.get(variant, "1.0"),
            "params.sharing.head_regime": f"R-{variant}", "metrics.overall": overall, "metrics.sst_acc": overall,
            "metrics.para_acc": overall, "metrics.sts_corr": overall, "metrics.train_time_s": 10.0,
            "metrics.model_size_mb": 1.0}


def _table() -> pd.DataFrame:
    runs = [_run("baseline", "baseline", s, 0.60 + 0.01 * s) for s in range(3)]
    # p000: one seed trained, one failed on a non-finite loss, one finished with a NaN overall.
    runs += [_run("p000", "search", 0, 0.70), _run("p000", "search", 1, math.nan, "FAILED", LOSS, "Diverged: " + LOSS),
             _run("p000", "search", 2, math.nan, diverged="overall is nan")]
    # p001: every seed diverged; p002: a seed failed for another reason (not a divergence).
    runs += [_run("p001", "search", s, math.nan, "FAILED", LOSS, "Diverged: " + LOSS) for s in range(3)]
    runs += [_run("p002", "search", 0, 0.65), _run("p002", "search", 1, 0.66),
             _run("p002", "search", 2, math.nan, "FAILED", error="ConfigError: train.batch_size: must be > 0")]
    tags = {"tasks": "sst,para,sts", "space_keys": "sharing.head_regime"}
    return sort_table(build_table(pd.DataFrame(runs), tags))


def test_the_leaderboard_counts_each_configurations_diverged_seeds():
    table = _table()
    rows = table[table["status"] == "finished"].set_index("variant")
    p000 = rows.loc["p000"]
    assert p000["n"] == 1 and p000["seeds_diverged"] == 2 and p000["overall"] == pytest.approx(0.70)
    assert p000["overall_delta_n"] == 1  # the diverged seeds leave the pairs, as they leave a verdict's
    assert rows.loc["p002"]["seeds_diverged"] == 0
    # Every seed of p001 diverged: one row, its count and its reason, not three failed rows.
    lost = table[table["variant"] == "p001"]
    assert len(lost) == 1 and lost.iloc[0]["status"] == "diverged" and lost.iloc[0]["seeds_diverged"] == 3
    assert (table["status"] == "failed").sum() == 1  # p002's seed 2: a failure, not a finding
    md = render(table, "md")
    assert "| 2 of 3 |" in md and "| 3 of 3 |" in md
    assert f"R-p001 k=all ⊘ ({LOSS[:59]}…)" in md and "✗ (ConfigError" in md
    assert "Diverged: the configuration's seeds that failed to train" in md and "⊘: every seed diverged" in md
    for fmt in ("latex", "html"):
        text = render(table, fmt)
        assert "2 of 3" in text and "Diverged" in text, fmt
    csv = render(table, "csv")
    assert "seeds_diverged" in csv.splitlines()[0]


def test_no_diverged_seed_no_column():
    runs = [_run(v, "baseline" if v == "baseline" else "search", s, 0.6 + 0.01 * s) for v in ("baseline", "p000")
            for s in range(3)]
    table = sort_table(build_table(pd.DataFrame(runs), {"tasks": "sst,para,sts", "space_keys": "sharing.head_regime"}))
    assert "Diverged" not in render(table, "md")


def test_the_rule_tracking_tags_a_run_with():
    # Training stopped on a non-finite loss (mtbert.errors.Diverged, as the trial reports it).
    assert diverged_reason({}, {}, "Diverged: " + LOSS) == LOSS
    assert diverged_reason({}, {}, "ConfigError: train.batch_size: must be > 0") is None
    # A finished run whose overall or last loss is not a number.
    assert diverged_reason({"overall": math.nan}, {1: {"loss_sst": 0.3}}) == "overall is nan"
    assert diverged_reason({"overall": 0.6}, {1: {"loss_sst": 0.3}}) is None
