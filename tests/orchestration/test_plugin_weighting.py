"""A weighting method added by a user module (`plugins:`), with a setting of its own, is swept
like any config key: checked at load, logged to MLflow as `loss.weighting.<setting>`, and
named in the leaderboard row it made."""
from __future__ import annotations

import pytest
from mlflow.tracking import MlflowClient

from mtbert.components import WEIGHTINGS
from orchestration.errors import SweepError
from orchestration.sweep.spec import load_sweep

from ..plugins import WEIGHTING_PLUGIN, installed
from .conftest import run_cli, write_sweep

BASE = {"plugins": ["myweighting"], "loss": {"weighting": "scaled"}}


@pytest.fixture
def plugin_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with installed(tmp_path, "myweighting", WEIGHTING_PLUGIN, WEIGHTINGS, "scaled"):
        yield tmp_path


def test_a_plugin_setting_is_a_sweep_dimension(plugin_dir):
    path = write_sweep(plugin_dir / "scaled.yaml", base=BASE, space={"loss.weighting.scale": [0.25, 0.75]})
    sweep = load_sweep(path)
    assert [sweep.config_for({"loss.weighting.scale": v}, 0)["loss"]["weighting"] for v in (0.25, 0.75)] == [
        {"name": "scaled", "scale": 0.25}, {"name": "scaled", "scale": 0.75}]
    bad = write_sweep(plugin_dir / "bad.yaml", base=BASE, space={"loss.weighting.scale": [0.25, 2.0]})
    with pytest.raises(SweepError, match=r"space\.loss\.weighting\.scale: value 2\.0: must be in \(0, 1\]"):
        load_sweep(bad)
    typo = write_sweep(plugin_dir / "typo.yaml", base=BASE, space={"loss.weighting.scal": [0.25]})
    with pytest.raises(SweepError, match=r"not a setting of method scaled \(did you mean 'loss\.weighting\.scale'\?\)"):
        load_sweep(typo)


@pytest.mark.slow
def test_a_swept_plugin_setting_reaches_mlflow_and_the_leaderboard(plugin_dir):
    write_sweep(plugin_dir / "scaled.yaml", name="scaled", base=BASE,
                space={"loss.weighting.scale": [0.25, 0.75]}, max_concurrent=1,  # the base 0.5 is the baseline
                tracking={"log_models": "none"})
    proc = run_cli(["sweep", "run", "scaled.yaml", "--num-cpus", "1"], cwd=plugin_dir, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "3 trials, 3 finished" in proc.stdout, proc.stdout

    client = MlflowClient(f"sqlite:///{plugin_dir / 'mlflow.db'}")
    exp = client.get_experiment_by_name("scaled")
    children = [r for r in client.search_runs([exp.experiment_id]) if "mlflow.parentRunId" in r.data.tags]
    assert {r.data.params["loss.weighting"] for r in children} == {"scaled"}
    assert sorted(float(r.data.params["loss.weighting.scale"]) for r in children) == [0.25, 0.5, 0.75]

    table = run_cli(["leaderboard", "--experiment", "scaled"], cwd=plugin_dir)
    assert table.returncode == 0, table.stderr[-2000:]
    rows = [line for line in table.stdout.splitlines() if line.startswith("|")][2:]
    for scale in ("0.25", "0.5", "0.75"):
        assert sum(f"loss.weighting.scale={scale}" in row for row in rows) == 1, (scale, table.stdout)
