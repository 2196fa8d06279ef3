"""`mtbert sweep resume NAME --seeds-max N` on a real tiny sweep (Ray Tune, sqlite MLflow, a
2-layer model on synthetic data): a finished adaptive sweep whose claim is still open gets the
new seeds only, under the same parent run, and its verdict takes the extended looks."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from .conftest import run_cli, write_sweep

# The baseline and the same encoder with head dropout: overall moves by seed noise only at this
# budget, so the claim stays open to `max`.
SWEEP = dict(space={"sharing.encoder_shared_layers": [None]}, baseline={"heads.dropout": 0.3},
             seeds={"start": 1, "max": 2}, max_concurrent=2, tracking={"experiment": "more"},
             claims=[{"name": "head dropout moves overall", "metric": "overall",
                      "a": {"role": "search"}, "b": {"role": "baseline"}, "relation": ">", "min_effect": 1.0e-6}])


def _children(uri: str) -> tuple[object, dict[str, object]]:
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("more")
    [parent] = client.search_runs([experiment.experiment_id], "tags.role = 'sweep'")
    runs = client.search_runs([experiment.experiment_id], f"tags.`mlflow.parentRunId` = '{parent.info.run_id}' and tags.role != 'configuration'")
    return parent, {r.data.tags["trial_key"]: r for r in runs}


@pytest.mark.slow
def test_more_seeds_train_only_the_new_trials(tmp_path):
    path = write_sweep(tmp_path / "more.yaml", **SWEEP)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    storage = str(tmp_path / "runs")
    proc = run_cli(["sweep", "run", str(path), "--name", "more", "--tracking-uri", uri, "--num-cpus", "2",
                    "--storage", storage], cwd=tmp_path, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "no round 3 (1 undecided claim(s) at 2 seeds)" in proc.stdout, proc.stdout
    # The sweep says how to give the open claim the seeds it needs.
    assert re.search(rf"^more seeds for the open claim\(s\): \S*mtbert sweep resume more --storage {storage} "
                     r"--seeds-max \d+ \(about \d+ paired seeds would decide them", proc.stdout, re.M), proc.stdout
    # The shared setup said on its own: no trial's time, nor the seeds' budget.hours.
    assert "shared setup " in proc.stdout and "no trial's time, nor seeds.budget.hours'" in proc.stdout, proc.stdout
    _, before = _children(uri)
    assert sorted(before) == ["baseline-s0", "baseline-s1", "p000-s0", "p000-s1"]

    # Not more than it had: one line, nothing run.
    refused = run_cli(["sweep", "resume", "more", "--storage", storage, "--seeds-max", "2"], cwd=tmp_path)
    assert refused.returncode != 0 and "--seeds-max 2: sweep more already looked up to 2 seeds" in refused.stderr

    proc = run_cli(["sweep", "resume", "more", "--storage", storage, "--num-cpus", "2", "--seeds-max", "3"],
                   cwd=tmp_path, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "seeds up to 3 (was 2)" in proc.stdout, proc.stdout
    parent, after = _children(uri)
    # The two new trials only; every finished run is the same run, untouched.
    assert sorted(after) == ["baseline-s0", "baseline-s1", "baseline-s2", "p000-s0", "p000-s1", "p000-s2"]
    for key, run in before.items():
        assert after[key].info.run_id == run.info.run_id and after[key].info.end_time == run.info.end_time, key
    assert all(r.info.status == "FINISHED" for r in after.values())
    # The verdict over 3 seeds, under the extended looks 1..2..3 (from 2: one seed has no interval).
    assert "claim head dropout moves overall: inconclusive" in proc.stdout and "(sequential 2..2..3)" in proc.stdout
    client = MlflowClient(uri)
    verdict = json.loads(Path(client.download_artifacts(parent.info.run_id, "verdicts.json", str(tmp_path))).read_text())
    assert verdict[0]["n"] == 3 and verdict[0]["looks"] == "2..2..3"
    doc = json.loads(Path(client.download_artifacts(parent.info.run_id, "claims.json", str(tmp_path))).read_text())
    assert doc["claims"][0]["looks"] == [2, 2, 3] and doc["seeds"]["extended_from"] == [2]
    assert parent.data.tags["seeds"] == "adaptive 1..2..3" and parent.info.status == "FINISHED"
    assert (tmp_path / "runs" / "more-seeds3" / "mtbert_sweep.json").is_file()  # resumable like any sweep
    findings = run_cli(["findings", "--tracking-uri", uri], cwd=tmp_path)
    assert findings.returncode == 0 and "(n=3, sequential 2..2..3)" in findings.stdout, findings.stderr
    assert '"f..m..l": given more seeds' in findings.stdout
    # Named by its sweep file (whose claims say 2..2), the extended looks are still the ones judged.
    by_file = run_cli(["findings", str(path), "--tracking-uri", uri], cwd=tmp_path)
    assert by_file.returncode == 0 and "(n=3, sequential 2..2..3)" in by_file.stdout, by_file.stdout + by_file.stderr
