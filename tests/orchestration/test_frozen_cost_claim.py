"""The question the compute score exists for, on a real sweep: a head-only baseline (the whole
tiny encoder frozen) against the encoder fine-tuned. Both rows get a finite TM-relative
(compute), the baseline exactly 1, and a claim on it is decided, not "not run"."""
from __future__ import annotations

import math

import pytest
from mlflow.tracking import MlflowClient

from .conftest import run_cli, write_sweep

pytestmark = pytest.mark.slow


def test_a_frozen_vs_unfrozen_cost_claim_is_decided(tmp_path):
    # Whole epochs (the cache's one forward covers every training example; a run that saw a
    # few steps of them would weigh that forward against little training).
    path = write_sweep(tmp_path / "cost.yaml", space={"freeze.layers": [0]}, baseline={"freeze.layers": -1},
                       base={"sampling": {"steps_per_epoch": None}},
                       seeds={"start": 2, "max": 3}, max_concurrent=2, tracking={"experiment": "cost"},
                       # The mean's t-interval decides from 2 seeds (the median's needs 6); the
                       # question here is the score's, not the interval's.
                       verdicts={"interval": "mean"},
                       claims=[{"name": "fine-tuning costs more than it gains", "metric": "tm_relative_score_compute",
                                "a": {"freeze.layers": 0}, "b": {"role": "baseline"}, "relation": "<"}])
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    proc = run_cli(["sweep", "run", str(path), "--num-cpus", "2", "--tracking-uri", uri,
                    "--storage", str(tmp_path / "runs")], cwd=tmp_path, timeout=400)
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-3000:]
    assert "claim fine-tuning costs more than it gains: holds" in out, out
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("cost").experiment_id
    runs = [r for r in client.search_runs([experiment], "tags.role != 'sweep'") if "trial_key" in r.data.tags]
    for run in runs:
        m = run.data.metrics
        assert m["train_flops"] > 0 and math.isfinite(m["tm_relative_score_compute"]), run.info.run_name
        if run.data.tags["role"] == "baseline":
            assert m["tm_relative_score_compute"] == 1.0 and m["setup_flops"] > 0
        else:
            assert m["tm_relative_score_compute"] < 1.0 and m["setup_flops"] == 0  # nothing cached: no setup
