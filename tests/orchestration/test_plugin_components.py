"""A component added by a user module (`plugins:`), with a setting of its own, is swept like any
config key: checked at load, logged to MLflow as `<slot>.<setting>`, and named in the leaderboard
row it made. Both component slots: a weighting method and a sampling strategy."""
from __future__ import annotations

import pytest
from mlflow.tracking import MlflowClient

from mtbert.components import SAMPLERS, WEIGHTINGS
from orchestration.errors import SweepError
from orchestration.sweep.load import load_sweep

from ..plugins import SAMPLING_PLUGIN, WEIGHTING_PLUGIN, installed
from .conftest import run_cli, write_sweep

BASE = {"plugins": ["myweighting"], "loss": {"weighting": "scaled"}}
# slot: (module, source, registry, name, base, setting key, two good values, a bad one and its
# error, the setting misspelt and its error)
SLOTS = {
    "weighting": ("myweighting", WEIGHTING_PLUGIN, WEIGHTINGS, "scaled", BASE, "loss.weighting.scale", [0.25, 0.75],
                  2.0, r"space\.loss\.weighting\.scale: value 2\.0: must be in \(0, 1\]",
                  r"not a setting of method scaled \(did you mean 'loss\.weighting\.scale'\?\)"),
    "sampling": ("mysampling", SAMPLING_PLUGIN, SAMPLERS, "only", {"plugins": ["mysampling"], "sampling": {"strategy": "only"}},
                 "sampling.strategy.task", ["sst", "sts"], "nli",
                 r"space\.sampling\.strategy\.task: value 'nli': .*'nli' is not one of tasks",
                 r"not a setting of strategy only \(did you mean 'sampling\.strategy\.task'\?\)"),
}


@pytest.fixture
def plugin_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with installed(tmp_path, "myweighting", WEIGHTING_PLUGIN, WEIGHTINGS, "scaled"):
        yield tmp_path


@pytest.mark.parametrize("slot", SLOTS)
def test_a_plugin_setting_is_a_sweep_dimension(slot, tmp_path, monkeypatch):
    module, source, registry, name, base, key, good, bad, bad_error, typo_error = SLOTS[slot]
    monkeypatch.chdir(tmp_path)
    with installed(tmp_path, module, source, registry, name):
        sweep = load_sweep(write_sweep(tmp_path / "ok.yaml", base=base, space={key: good}), smoke=True)
        section, field = key.split(".")[:2]
        assert [sweep.config_for({key: v}, 0)[section][field] for v in good] == [
            {"name": name, key.rsplit(".", 1)[1]: v} for v in good]
        with pytest.raises(SweepError, match=bad_error):
            load_sweep(write_sweep(tmp_path / "bad.yaml", base=base, space={key: [good[0], bad]}), smoke=True)
        typo = key[:-1]
        with pytest.raises(SweepError, match=typo_error):
            load_sweep(write_sweep(tmp_path / "typo.yaml", base=base, space={typo: [good[0]]}), smoke=True)


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
    children = [r for r in client.search_runs([exp.experiment_id]) if "trial_key" in r.data.tags]
    assert {r.data.params["loss.weighting"] for r in children} == {"scaled"}
    assert sorted(float(r.data.params["loss.weighting.scale"]) for r in children) == [0.25, 0.5, 0.75]

    table = run_cli(["leaderboard", "--experiment", "scaled"], cwd=plugin_dir)
    assert table.returncode == 0, table.stderr[-2000:]
    rows = [line for line in table.stdout.splitlines() if line.startswith("|")][2:]
    for scale in ("0.25", "0.5", "0.75"):
        assert sum(f"loss.weighting.scale={scale}" in row for row in rows) == 1, (scale, table.stdout)
