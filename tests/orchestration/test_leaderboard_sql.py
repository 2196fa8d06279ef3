"""The sqlite SQL reader of a sweep's child runs gives what mlflow.search_runs gives (the
leaderboard's generic path), on runs written through MLflow's own client."""
from __future__ import annotations

import math

import pandas as pd
from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient

from orchestration.leaderboard import (build_table, child_runs, search_child_runs, sort_table,
                                       sqlite_child_runs)


def _normalise(frame: pd.DataFrame) -> pd.DataFrame:
    frame = frame.reindex(sorted(frame.columns), axis=1).sort_values("run_id").reset_index(drop=True)
    return frame.astype(object).where(frame.notna(), None)


def test_sql_reader_matches_search_runs(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    exp = client.create_experiment("sweep")
    parent = client.create_run(exp, tags={"role": "sweep", "tasks": "sst,para,sts",
                                          "task_metrics": "sst_acc,para_acc,sts_corr", "space_keys": "optim.lr"})
    other = client.create_run(exp, tags={"role": "sweep"})
    pid = parent.info.run_id
    for i in range(6):
        run = client.create_run(exp, run_name=f"t{i}", tags={"mlflow.parentRunId": pid})
        rid = run.info.run_id
        params = [Param("optim.lr", str(1e-3 * (i + 1))), Param("sharing.head_regime", "S-I-I")]
        if i != 2:  # a param only some runs have: None in the others
            params.append(Param("loss.pcgrad", "false"))
        metrics = [Metric("overall", 0.5 + i / 100, 0, 1), Metric("overall", 0.4 + i / 100, 0, 2),
                   Metric("sst_acc", 0.3, 0, 0), Metric("para_acc", 0.6, 0, 0), Metric("sts_corr", 0.1 * i, 0, 0),
                   Metric("train_time_s", 2.0 + i, 0, 0), Metric("model_size_mb", 1.5, 0, 0),
                   Metric("tm_relative_score", float("nan") if i == 4 else 1.0 + i, 0, 0)]
        tags = [RunTag("trial_key", f"p{i:03d}-s0"), RunTag("variant", f"p{i:03d}"),
                RunTag("role", "baseline" if i == 0 else "search"), RunTag("seed", "0"),
                RunTag("stopped_early", "false"), RunTag("interrupted", "SIGINT" if i == 5 else "false")]
        if i == 3:
            tags.append(RunTag("error", "TrainingError: loss of task 'sst' is nan at epoch 1, step 2"))
        client.log_batch(rid, metrics=metrics, params=params, tags=tags)
        client.set_terminated(rid, {3: "FAILED", 5: "KILLED"}.get(i, "FINISHED"))
    stray = client.create_run(exp, tags={"mlflow.parentRunId": other.info.run_id})  # another sweep's
    client.log_metric(stray.info.run_id, "overall", 0.9)
    gone = client.create_run(exp, tags={"mlflow.parentRunId": pid})  # deleted: search_runs skips it
    client.delete_run(gone.info.run_id)

    generic = search_child_runs(uri, exp, pid)
    fast = sqlite_child_runs(uri, exp, pid)
    assert len(fast) == 6
    assert list(fast["run_id"]) == list(generic["run_id"])  # the same order (start_time DESC)
    a, b = _normalise(fast), _normalise(generic)
    assert list(a.columns) == list(b.columns)
    for column in a.columns:
        for x, y in zip(a[column], b[column]):
            same = x == y or (isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y))
            assert same, (column, x, y)
    # The leaderboard reads sqlite through the SQL reader, and builds the same table from both.
    assert list(child_runs(uri, exp, pid)["run_id"]) == list(fast["run_id"])
    tags = client.get_run(pid).data.tags
    pd.testing.assert_frame_equal(sort_table(build_table(fast, tags)), sort_table(build_table(generic, tags)))
