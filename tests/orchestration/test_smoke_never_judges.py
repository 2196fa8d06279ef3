"""A --smoke run trains a tiny encoder on synthetic data for seconds: it checks every claim's
shape and never prints a verdict, and it names what it changed to fit the tiny encoder. Here
the real sweep compares a frozen encoder with one whose top layers train (freeze.layers -1 vs
4): the smoke run keeps the two apart (a 5-layer tiny encoder, so freezing 4 leaves one to
train), and a claim it could decide (more trainable parameters, the same at every seed) reads
"smoke: not judged"."""
from __future__ import annotations

import pytest
from mlflow.tracking import MlflowClient

from .conftest import run_cli, write_sweep

pytestmark = pytest.mark.slow

VERDICTS = ("holds", "contradicted", "no difference that matters", "inconclusive")


def test_a_smoke_run_checks_its_claims_and_judges_none(tmp_path):
    path = write_sweep(tmp_path / "frozen.yaml", space={"freeze.layers": [-1, 4]},
                       baseline={"freeze.layers": -1}, seeds={"start": 2, "max": 3}, max_concurrent=2,
                       tracking={"experiment": "frozen"},
                       claims=[{"name": "the top layer trains more parameters", "metric": "params_trainable",
                                "a": {"freeze.layers": 4}, "b": {"role": "baseline"}, "relation": ">",
                                "min_effect": 1000}])
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    proc = run_cli(["sweep", "run", str(path), "--smoke", "--num-cpus", "2", "--tracking-uri", uri,
                    "--storage", str(tmp_path / "runs")], cwd=tmp_path, timeout=400)
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-3000:]
    assert ("--smoke: a 5-layer tiny encoder for freeze.layers up to 4 (freeze.layers 4 leaves a layer to train, "
            "as on the real encoder)") in out, out
    claim = [line for line in out.splitlines() if line.startswith("claim ")]
    assert len(claim) == 1 and claim[0].startswith("claim the top layer trains more parameters: smoke: not judged "
                                                   "(A and B ran on "), out
    assert not any(word in line for line in claim for word in VERDICTS)
    client = MlflowClient(uri)
    [parent] = client.search_runs([client.get_experiment_by_name("frozen-smoke").experiment_id], "tags.role = 'sweep'")
    assert parent.data.tags["verdicts"] == "smoke: not judged"
    assert not {"findings.md", "verdicts.json"} & {a.path for a in client.list_artifacts(parent.info.run_id)}
    # The two configurations stayed apart: freezing 4 of 5 layers trains more than freezing all.
    runs = client.search_runs([parent.info.experiment_id], f"tags.`mlflow.parentRunId` = '{parent.info.run_id}' and tags.role != 'configuration'")
    trainable = {r.data.params["freeze.layers"]: r.data.metrics["params_trainable"] for r in runs}
    assert trainable["4"] > trainable["-1"] > 0
