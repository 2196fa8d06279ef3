"""The sqlite SQL reader of a sweep's child runs gives what mlflow.search_runs gives (the
leaderboard's generic path), on runs written through MLflow's own client."""
from __future__ import annotations

import math
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient

from orchestration.report import reader as board
from orchestration.report.leaderboard import render
from orchestration.report.reader import (child_runs, search_child_runs, search_find_sweep, sqlite_child_runs,
                                         sqlite_find_sweep)
from orchestration.report.table import build_table, sort_table, table_keys

from .conftest import new_experiment

ROOT = Path(__file__).resolve().parents[2]


def _normalise(frame: pd.DataFrame) -> pd.DataFrame:
    frame = frame.reindex(sorted(frame.columns), axis=1).sort_values("run_id").reset_index(drop=True)
    return frame.astype(object).where(frame.notna(), None)


def test_sql_reader_matches_search_runs(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    exp = new_experiment(client, "sweep")
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
    # ... and from only the keys the table reads, as `mtbert leaderboard` reads them.
    only = sqlite_child_runs(uri, exp, pid, *table_keys(tags))
    assert "params.loss.pcgrad" in only and "params.train.seed" not in only and "tags.trial_key" not in only
    pd.testing.assert_frame_equal(sort_table(build_table(only, tags)), sort_table(build_table(generic, tags)))


# --------------------------------------------------------------------------- finding the sweep, the CLI

@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A store written by MLflow's client: experiment `board` with an older sweep, the sweep
    with four finished trials, and a newer deleted sweep; experiment `idle` with no sweep."""
    tmp = tmp_path_factory.mktemp("store")
    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    client = MlflowClient(uri)
    exp = client.create_experiment("board", artifact_location=(tmp / "mlartifacts").as_uri())
    new_experiment(client, "idle")
    sweep_tags = {"role": "sweep", "tasks": "sst,para,sts", "task_metrics": "sst_acc,para_acc,sts_corr",
                  "space_keys": "optim.lr", "tm_score": "wall"}
    older = client.create_run(exp, run_name="board-1", start_time=1_000, tags=sweep_tags)
    parent = client.create_run(exp, run_name="board-2", start_time=2_000, tags=sweep_tags)
    pid = parent.info.run_id
    client.log_batch(pid, metrics=[Metric("wall_s", 12.5, 0, 0)], params=[Param("trials", "4")])
    for i, (variant, seed) in enumerate([("baseline", 0), ("baseline", 1), ("p000", 0), ("p000", 1)]):
        run = client.create_run(exp, run_name=f"{variant}-s{seed}", start_time=2_001 + i, tags={
            "mlflow.parentRunId": pid, "trial_key": f"{variant}-s{seed}", "variant": variant, "seed": str(seed),
            "role": "baseline" if variant == "baseline" else "search", "stopped_early": "false"})
        score = 0.40 + 0.10 * (variant != "baseline") + 0.01 * seed
        params = [Param("optim.lr", "0.001" if variant == "baseline" else "0.0003"),
                  Param("sharing.head_regime", "I-I-I"), Param("train.seed", str(seed))]
        figures = {"overall": score, "sst_acc": score, "para_acc": score, "sts_corr": score, "best_epoch": 1.0,
                   "train_time_s": 10.0 + i, "tm_time_s": 10.0 + i, "model_size_mb": 2.0, "peak_memory_mb": 100.0,
                   "tm_relative_score": 1.0 + i}
        client.log_batch(run.info.run_id, params=params, metrics=[Metric(k, v, 0, 0) for k, v in figures.items()])
        client.set_terminated(run.info.run_id, "FINISHED")
    client.set_terminated(pid, "FINISHED")
    gone = client.create_run(exp, run_name="board-3", start_time=3_000, tags=sweep_tags)
    client.delete_run(gone.info.run_id)
    return uri, tmp, pid, older.info.run_id, gone.info.run_id


def _same_sweep(uri: str, experiment: str, sweep: str | None = None) -> str:
    (exp_a, a), (exp_b, b) = sqlite_find_sweep(uri, experiment, sweep), search_find_sweep(uri, experiment, sweep)
    assert exp_a == exp_b
    for name in ("run_id", "run_name", "experiment_id", "status", "start_time", "end_time", "artifact_uri",
                 "lifecycle_stage"):
        assert getattr(a.info, name) == getattr(b.info, name), name
    assert (a.data.tags, a.data.params, a.data.metrics) == (b.data.tags, b.data.params, b.data.metrics)
    return a.info.run_id


def test_sql_find_sweep_matches_mlflow(store):
    uri, _, pid, older, gone = store
    assert _same_sweep(uri, "board") == pid  # the latest active sweep; the deleted newer one is skipped
    assert _same_sweep(uri, "board", "board-1") == older
    assert _same_sweep(uri, "board", older) == older
    for args in [("nope",), ("idle",), ("board", "board-3"), ("board", gone), ("board", "x' or '1")]:
        with pytest.raises(board.SweepError) as sql:
            sqlite_find_sweep(uri, *args)
        if args[-1] != "x' or '1":  # a quote MLflow's filter parser refuses: SQL parameters take it
            with pytest.raises(board.SweepError) as api:
                search_find_sweep(uri, *args)
            assert str(sql.value) == str(api.value)
    with pytest.raises(board.SweepError, match=r"no such experiment in .* \(have: idle, board, Default\)"):
        sqlite_find_sweep(uri, "nope")


def test_the_sql_reader_knows_the_installed_mlflows_schema(store, tmp_path):
    """Fails when an MLflow release moves a column the SQL reader reads (MLFLOW_SCHEMA): the
    reader would then go through MLflow's API, slowly, on every leaderboard."""
    uri, tmp, _, _, _ = store
    board.mlflow_sqlite(uri).close()
    moved = tmp_path / "moved.db"
    shutil.copy(tmp / "mlflow.db", moved)
    with sqlite3.connect(moved) as con:
        con.execute("ALTER TABLE latest_metrics RENAME COLUMN is_nan TO nan")
    with pytest.raises(sqlite3.DatabaseError, match="MLflow's latest_metrics table has no is_nan column"):
        board.mlflow_sqlite(f"sqlite:///{moved}")


def test_sql_reader_failure_falls_back_to_mlflow_in_one_line(store, monkeypatch, capsys):
    uri, _, pid, _, _ = store

    def unknown_schema(*args, **kwargs):
        raise sqlite3.OperationalError("no such column: r.lifecycle_stage")
    monkeypatch.setattr(board, "sqlite_find_sweep", unknown_schema)
    monkeypatch.setattr(board, "sqlite_child_runs", unknown_schema)
    exp, parent = board.find_sweep(uri, "board")
    assert parent.info.run_id == pid and type(parent).__module__.startswith("mlflow")
    assert len(board.child_runs(uri, exp, pid)) == 4
    err = capsys.readouterr().err.splitlines()
    assert err == [f"leaderboard: the SQL reader failed on {uri} (no such column: r.lifecycle_stage); {what} "
                   "through MLflow's API" for what in ("finding the sweep", "reading the runs")]


def test_reading_through_mlflow_leaves_the_default_store_alone(store, monkeypatch):
    """MLflow's fluent reads take a process-wide URI (and write it to $MLFLOW_TRACKING_URI):
    a leaderboard read in a Python session must not move that session's default store."""
    uri, _, pid, _, _ = store
    import mlflow

    exp, _ = search_find_sweep(uri, "board")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    default = mlflow.get_tracking_uri()
    assert len(search_child_runs(uri, exp, pid)) == 4
    assert "MLFLOW_TRACKING_URI" not in os.environ and mlflow.get_tracking_uri() == default
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///elsewhere.db")
    try:
        assert len(search_child_runs(uri, exp, pid)) == 4
        assert os.environ["MLFLOW_TRACKING_URI"] == mlflow.get_tracking_uri() == "sqlite:///elsewhere.db"
    finally:
        mlflow.set_tracking_uri(None)  # as this test found it; the environment goes back by monkeypatch


def test_cli_on_sqlite_imports_no_mlflow_and_logs_the_plot(store, tmp_path):
    uri, _, pid, _, _ = store
    out = tmp_path / "board.md"
    code = ("import sys; from mtbert.cli import main; rc = main(sys.argv[1:]); "
            "print('mlflow modules:', sorted(m for m in sys.modules if m.split('.')[0] == 'mlflow')); sys.exit(rc)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env.pop("MLFLOW_TRACKING_URI", None)
    proc = subprocess.run([sys.executable, "-c", code, "leaderboard", "--experiment", "board", "--tracking-uri", uri,
                           "--output", str(out)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "mlflow modules: []" in proc.stdout, proc.stdout
    assert "SQL reader failed" not in proc.stderr, proc.stderr
    # The table is the one MLflow's own reads give.
    tags = MlflowClient(uri).get_run(pid).data.tags
    exp, _ = search_find_sweep(uri, "board")
    assert out.read_text() == render(sort_table(build_table(search_child_runs(uri, exp, pid), tags)), "md")
    # The plot is on the parent run, as MLflow lists and downloads it: one, under the sweep's
    # name for it, whatever the export's file was called; a second export replaces it.
    client = MlflowClient(uri)
    pngs = [a.path for a in client.list_artifacts(pid) if a.path.endswith(".png")]
    assert pngs == ["pareto.png"]
    got = Path(client.download_artifacts(pid, "pareto.png", str(tmp_path / "down")))
    assert got.read_bytes() == (tmp_path / "board.pareto.png").read_bytes()
    proc = subprocess.run([sys.executable, "-c", code, "leaderboard", "--experiment", "board", "--tracking-uri", uri,
                           "--output", str(tmp_path / "again.md")], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [a.path for a in client.list_artifacts(pid) if a.path.endswith(".png")] == ["pareto.png"]
