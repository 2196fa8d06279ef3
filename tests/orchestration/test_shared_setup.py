"""The sweep's shared setup (tokenizing, the frozen-layer cache) under its MLflow parent run:
the parent exists and is RUNNING before the setup starts, its duration covers it, the setup's
seconds are on it apart (setup_time_s), and a setup that fails ends it FAILED with the error."""
from __future__ import annotations

import logging
import time

import pytest
from mlflow.tracking import MlflowClient

from orchestration.run import launch

from .conftest import write_sweep

pytestmark = pytest.mark.slow


def _parent(uri: str, experiment: str):
    client = MlflowClient(uri)
    found = client.get_experiment_by_name(experiment)
    return client.search_runs([found.experiment_id], "tags.role = 'sweep'") if found else []


@pytest.fixture
def local_ray(monkeypatch):
    import ray

    if ray.is_initialized():
        pytest.skip("another Ray session is live in this process")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             logging_level=logging.WARNING)
    try:
        yield
    finally:
        ray.shutdown()


def test_a_failed_setup_ends_the_parent_failed_with_its_error(tmp_path, monkeypatch):
    import ray

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    seen = []

    def broken(planner, log, frozen=True):
        seen.extend(p.info.status for p in _parent(uri, "broken"))
        raise OSError("no space left on device: the frozen-layer cache")

    monkeypatch.setattr(launch, "_prepare_data", broken)
    path = write_sweep(tmp_path / "s.yaml", space={"optim.lr": [1e-3]}, tracking={"experiment": "broken"})
    with pytest.raises(OSError, match="no space left"):
        launch.run_sweep(path, tracking_uri=uri, storage=tmp_path / "runs", log=lambda _m: None, progress=False)
    assert seen == ["RUNNING"]  # the parent before the setup
    (parent,) = _parent(uri, "broken")
    assert parent.info.status == "FAILED"
    assert parent.data.tags["error"] == "no space left on device: the frozen-layer cache"
    assert not ray.is_initialized()  # nothing past the setup ran


def test_the_parent_runs_from_before_the_setup_and_says_its_seconds(tmp_path, monkeypatch, local_ray):
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    real, seen = launch._prepare_data, {}

    def watched(planner, log, frozen=True):
        seen["status"] = [p.info.status for p in _parent(uri, "first")]
        seen["at_ms"] = time.time() * 1000
        time.sleep(1.0)  # a setup long enough to show in the parent's duration
        return real(planner, log, frozen)

    monkeypatch.setattr(launch, "_prepare_data", watched)
    path = write_sweep(tmp_path / "s.yaml", base={"freeze": {"layers": -1}, "train": {"epochs": 1}},
                       space={"optim.head_lr": [1e-3]}, seeds=[0], tracking={"experiment": "first", "log_models": "none"})
    outcome = launch.run_sweep(path, tracking_uri=uri, storage=tmp_path / "runs", log=lambda _m: None,
                               progress=False)
    assert outcome.status == "FINISHED"
    assert seen["status"] == ["RUNNING"]
    (parent,) = _parent(uri, "first")
    assert parent.info.status == "FINISHED"
    assert parent.info.start_time <= seen["at_ms"]
    setup = parent.data.metrics["setup_time_s"]
    assert setup >= 1.0 and setup >= parent.data.metrics["setup_tokenize_s"] + parent.data.metrics["setup_frozen_cache_s"]
    # The parent's duration is the sweep's: its setup, then every trial.
    assert (parent.info.end_time - parent.info.start_time) / 1000 > setup
