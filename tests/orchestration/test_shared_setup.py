"""The sweep's shared setup (tokenizing, the frozen-layer cache) under its MLflow parent run:
the parent exists and is RUNNING before the setup starts, its duration covers it, the setup's
seconds are on it apart (setup_time_s), and a setup that fails ends it FAILED with the error."""
from __future__ import annotations

import logging
import time

import pytest
from mlflow.tracking import MlflowClient

from orchestration.run import launch

from tests.train.test_frozen_prefix import count_layer_rows

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


def test_the_shared_setup_runs_on_every_cpu_the_driver_has(tmp_path, monkeypatch):
    """Tokenizing and the frozen-layer cache run before any trial: on the driver's CPUs (its
    affinity, three here), not the one a trial gets; the driver's own count comes back after."""
    import os

    import torch

    from mtbert.data import tokenize
    from mtbert.train import frozen
    from orchestration.sweep.load import load_sweep
    from orchestration.sweep.plan import Planner

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0, 1, 2})
    used = {"tokenize": set(), "frozen": set()}

    def watch(module, name, what):
        real = getattr(module, name)

        def watched(*args, **kwargs):
            used[what].add(torch.get_num_threads())
            return real(*args, **kwargs)
        monkeypatch.setattr(module, name, watched)

    watch(tokenize, "prepare", "tokenize")
    watch(frozen, "compute_side", "frozen")
    path = write_sweep(tmp_path / "s.yaml", base={"freeze": {"layers": -1}}, space={"optim.head_lr": [1e-3]})
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        lines = []
        launch._prepare_data(Planner(load_sweep(path)), lines.append)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    assert used == {"tokenize": {3}, "frozen": {3}}, used
    assert any(line.startswith("frozen layers: ") and line.endswith("on 3 CPU thread(s)") for line in lines), lines


def test_a_sweeps_setups_compute_their_shared_frozen_layers_once(tmp_path, monkeypatch, local_ray):
    """Two setups of one sweep, the bottom layer of two frozen and the whole encoder frozen:
    the driver runs the bottom layer once for both, and each trial trains what it trains on
    a cache of its own."""
    import torch

    from mtbert.config import build_config
    from mtbert.train.loop import train
    from orchestration.sweep.load import load_sweep
    from orchestration.sweep.plan import Planner

    monkeypatch.chdir(tmp_path)
    rows = count_layer_rows(monkeypatch)  # the driver's: the trials run in Ray's workers
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    path = write_sweep(tmp_path / "s.yaml", base={"train": {"epochs": 1, "frozen_cache_mb": 64, "precision": "fp32"}},  # bit for bit: fp32 on any CPU
                       space={"freeze.layers": [1, -1]}, seeds=[0],
                       tracking={"experiment": "prefix", "log_models": "none"})
    outcome = launch.run_sweep(path, tracking_uri=uri, storage=tmp_path / "runs", log=lambda _m: None,
                               progress=False)
    assert outcome.status == "FINISHED" and outcome.failed == 0
    assert rows[0] == rows[1] > 0  # layer 0 ran once over every sequence: for both setups

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("prefix").experiment_id
    trained = {r.data.params["freeze.layers"]: r.data.metrics["overall"] for r in client.search_runs(
        [experiment], "tags.role != 'sweep' and tags.role != 'configuration'")}
    torch.set_num_threads(1)  # a trial's one CPU
    for trial in Planner(load_sweep(path)).fixed_trials():
        cfg = build_config(trial["config"], {"data.cache_dir": str(tmp_path / f"alone{trial['key']}")})
        assert train(cfg, log=None).metrics["overall"] == trained[str(cfg.freeze.layers)], trial["key"]


def test_more_seeds_reopen_the_parent_before_their_setup(tmp_path, monkeypatch, local_ray):
    """`sweep resume NAME --seeds-max N` (extend_sweep) as `sweep run`: the finished sweep's
    parent is RUNNING again before the new seeds' shared setup starts, a setup that fails ends
    it FAILED with the error (and the extension can be started again), and the setup's seconds
    are logged on it once more (setup_time_s: a point per setup)."""
    from .test_more_seeds_cli import SWEEP

    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    path = write_sweep(tmp_path / "more.yaml", **{**SWEEP, "tracking": {"experiment": "more", "log_models": "none"}})
    quiet = dict(storage=tmp_path / "runs", log=lambda _m: None)
    assert launch.run_sweep(path, tracking_uri=uri, name="more", progress=False, **quiet).status == "FINISHED"
    real, seen = launch._prepare_data, {}

    def broken(planner, log, frozen=True):
        seen["broken"] = [p.info.status for p in _parent(uri, "more")]
        raise OSError("no space left on device: the frozen-layer cache")

    monkeypatch.setattr(launch, "_prepare_data", broken)
    with pytest.raises(OSError, match="no space left"):
        launch.extend_sweep("more", 3, **quiet)
    (parent,) = _parent(uri, "more")
    assert seen["broken"] == ["RUNNING"] and parent.info.status == "FAILED"
    assert parent.data.tags["error"] == "no space left on device: the frozen-layer cache"
    assert parent.data.tags["seeds"] == "adaptive 1..2"  # a failed setup extended nothing

    def watched(planner, log, frozen=True):
        seen["status"] = [p.info.status for p in _parent(uri, "more")]
        time.sleep(1.0)  # a setup long enough to show
        return real(planner, log, frozen)

    monkeypatch.setattr(launch, "_prepare_data", watched)
    outcome = launch.extend_sweep("more", 3, progress=False, **quiet)
    assert outcome.status == "FINISHED" and outcome.setup["setup_time_s"] >= 1.0
    assert seen["status"] == ["RUNNING"]
    (parent,) = _parent(uri, "more")
    assert parent.info.status == "FINISHED" and parent.data.tags["seeds"] == "adaptive 1..2..3"
    history = MlflowClient(uri).get_metric_history(parent.info.run_id, "setup_time_s")
    assert len(history) == 2
    assert max(history, key=lambda m: m.timestamp).value == pytest.approx(outcome.setup["setup_time_s"])
