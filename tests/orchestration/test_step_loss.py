"""Step-level training loss in MLflow: a trial's runs carry step/loss_<task> every
train.log_every_steps steps at the run's global step, sent with each epoch's figures, so a
trial that logs them makes as many MLflow calls as one that does not."""
from __future__ import annotations

import json

import pytest
from mlflow.tracking import MlflowClient

from .conftest import run_cli, write_sweep
from .test_e2e import sweep_runs

pytestmark = pytest.mark.slow


def test_trials_chart_their_loss_every_n_steps_in_the_same_calls(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    # Two epochs of 4 steps; round robin: one task per step, so each task has its own points.
    path = write_sweep(tmp_path / "steps.yaml", base={"train": {"log_every_steps": 0}},
                       space={"train.log_every_steps": {"type": "grid", "values": [2]}},
                       tracking={"experiment": "steps", "log_models": "none"})
    proc = run_cli(["sweep", "run", str(path), "--num-cpus", "2", "--tracking-uri", uri, "--name", "s1"],
                   cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    _, _, children = sweep_runs(uri, "steps")
    runs = {r.data.tags["variant"]: r for r in children}
    client = MlflowClient(uri)
    logged = runs["p000"]
    series = {k: client.get_metric_history(logged.info.run_id, k)
              for k in logged.data.metrics if k.startswith("step/")}
    assert set(series) == {"step/loss_sst", "step/loss_para", "step/loss_sts"}, sorted(logged.data.metrics)
    # Every 2 steps and at each epoch's end, numbered across epochs (4 steps each): 2, 4, 6, 8,
    # where a task trained in the window.
    steps = sorted({m.step for points in series.values() for m in points})
    assert steps == [2, 4, 6, 8], steps
    assert all(m.value > 0 for points in series.values() for m in points)
    baseline = runs["baseline"]  # log_every_steps 0: no series
    assert not [k for k in baseline.data.metrics if k.startswith("step/")]
    # The points ride each epoch's batch: no call more than the trial without them.
    calls = json.loads((tmp_path / "runs" / "s1" / "mlflow_calls.json").read_text())
    assert calls["p000-s0"] == calls["baseline-s0"], calls
