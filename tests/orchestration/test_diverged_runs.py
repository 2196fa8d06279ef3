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


def test_findings_count_a_sides_diverged_seeds_of_the_latest_sweep_only(tmp_path):
    from mlflow.tracking import MlflowClient

    from orchestration.report.findings import findings
    from orchestration.sweep.claims import Claim

    from .conftest import new_experiment

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = new_experiment(client, "blowup")

    def sweep(diverged: dict[int, tuple[str, str]]) -> None:
        """8 seeds of the baseline and of lr 1.0; diverged: seed of lr 1.0 -> (status, why)."""
        parent = client.create_run(experiment, tags={"role": "sweep"}).info.run_id
        for variant, role, lr in (("baseline", "baseline", "5e-05"), ("p000", "search", "1.0")):
            for seed in range(8):
                status, why = diverged.get(seed, ("FINISHED", "")) if variant == "p000" else ("FINISHED", "")
                tags = {"mlflow.parentRunId": parent, "variant": variant, "role": role, "seed": str(seed),
                        **({"diverged": why} if why else {})}
                run = client.create_run(experiment, tags=tags).info.run_id
                client.log_param(run, "optim.lr", lr)
                if status == "FINISHED":
                    client.log_metric(run, "overall", 0.6 + 0.01 * seed + (0.05 if variant == "p000" else 0.0))
                client.set_terminated(run, status)
        client.set_terminated(parent, "FINISHED")

    sweep({0: ("FAILED", LOSS)})  # an earlier sweep: its tags are not this sweep's
    sweep({3: ("FAILED", LOSS), 5: ("FAILED", LOSS)})
    claims = [Claim("lr 1 scores higher", "overall", {"optim.lr": 1.0, "experiment": "blowup"},
                    {"role": "baseline", "experiment": "blowup"}, ">"),
              Claim("lr 1 diverges more often", "diverged", {"optim.lr": 1.0, "experiment": "blowup"},
                    {"role": "baseline", "experiment": "blowup"}, ">", min_effect=0.1)]
    md, table = findings(client.tracking_uri, ["blowup"], claims=claims, error_rate="claim")
    score, rate = table.to_dict("records")
    assert (score["n"], score["a_n"], score["a_diverged"], score["b_diverged"]) == (6, 8, 2, 0)
    assert rate["delta"] == pytest.approx(2 / 8) and rate["verdict"] == "inconclusive"
    assert "A 2 of 8 seeds" in md
