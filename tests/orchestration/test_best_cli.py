"""`mtbert best` on a real sweep (tiny model, synthetic data, two seeds per configuration): it
names the configuration with the best mean over seeds, that configuration's best seed, and
every name of that seed's model; the model the sweep logged and registered is that seed's; a
printed line runs as `mtbert predict`."""
from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from .conftest import new_experiment, run_cli, write_sweep
from .test_e2e import sweep_runs

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    root = tmp_path_factory.mktemp("best")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    path = write_sweep(root / "best.yaml",
                       space={"sharing.head_regime": {"type": "grid", "values": ["S-I-I", "I-S-S"]}},
                       seeds=[0, 1], max_concurrent=2,
                       tracking={"experiment": "best", "register_model": "mtbert-best"})
    proc = run_cli(["sweep", "run", str(path), "--num-cpus", "2", "--tracking-uri", uri, "--name", "b1"],
                   cwd=root, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    _, (parent,), children = sweep_runs(uri, "best")  # one sweep in the experiment
    return root, uri, parent, children


def _by_mean(children) -> tuple[str, object]:
    """The configuration with the best mean overall over its seeds and its best seed, computed
    here from the runs' own figures (not by the code under test)."""
    groups: dict[str, list] = {}
    for run in children:
        assert run.info.status == "FINISHED"
        groups.setdefault(run.data.tags["variant"], []).append(run)
    assert len(groups) == 3 and all(len(g) == 2 for g in groups.values())  # baseline + 2 regimes, 2 seeds each
    mean = {v: sum(r.data.metrics["overall"] for r in g) / len(g) for v, g in groups.items()}
    variant = max(mean, key=mean.get)
    return variant, max(groups[variant], key=lambda r: r.data.metrics["overall"])


def test_the_logged_and_registered_model_is_the_best_seed_of_the_best_mean(swept):
    root, uri, parent, children = swept
    variant, seed = _by_mean(children)
    logged = [r for r in children if r.data.tags.get("model_uri")]
    assert [r.info.run_id for r in logged] == [seed.info.run_id]
    versions = MlflowClient(uri).search_model_versions("name = 'mtbert-best'")
    assert [v.run_id for v in versions] == [seed.info.run_id]
    assert parent.data.tags["best_config"] == variant


def test_best_prints_the_configuration_and_each_name_of_its_model(swept, tmp_path):
    root, uri, parent, children = swept
    variant, seed = _by_mean(children)
    proc = run_cli(["best", "--experiment", "best", "--tracking-uri", uri], cwd=root)
    assert proc.returncode == 0, proc.stderr
    assert "sweep b1: the latest in 'best' with finished trials" in proc.stderr
    out = proc.stdout
    assert f"# best configuration {variant}: sharing.head_regime=" in out
    assert "over 2 seed(s) (0, 1); ranked by the mean over seeds 0, 1, those every configuration ran\n" in out
    assert f"# its best seed {seed.data.tags['trial_key']} (seed {seed.data.tags['seed']})" in out
    assert f"MLflow run {seed.info.run_id}" in out
    commands = [line for line in out.splitlines() if not line.startswith("#")]
    models = [shlex.split(line, comments=True) for line in commands]
    assert all(m[1] == "predict" and "--model" in m for m in models)
    refs = [m[m.index("--model") + 1] for m in models]
    bundle = next(r for r in refs if not r.startswith("models:/") and len(r) != 32)
    assert refs[:2] == [seed.data.tags["model_uri"], seed.info.run_id]
    assert refs[2] == "models:/mtbert-best/1"
    assert Path(bundle).is_dir() and Path(bundle).parts[-2:] == ("output", "best")
    assert Path(bundle).parent.parent.name.startswith(seed.data.tags["trial_key"] + "_")

    as_json = json.loads(run_cli(["best", "--experiment", "best", "--tracking-uri", uri, "--sweep", "b1",
                                  "--format", "json"], cwd=root).stdout)
    assert as_json["configuration"] == variant and as_json["n"] == 2
    assert as_json["best_seed"]["run_id"] == seed.info.run_id
    assert as_json["best_seed"]["model_uri"] == refs[0] and as_json["best_seed"]["bundle"] == bundle
    assert as_json["best_seed"]["registered"] == [{"name": "mtbert-best", "version": 1,
                                                   "uri": "models:/mtbert-best/1"}]

    # A printed line, pasted as it is (plus where to write), predicts with that model.
    line = next(line for line in commands if "models:/mtbert-best/1" in line)
    args = shlex.split(line, comments=True)[1:] + ["--device", "cpu", "--output", str(tmp_path / "pred")]
    pred = run_cli(args, cwd=tmp_path)
    assert pred.returncode == 0, pred.stderr
    assert "-> bundle" in pred.stdout and "dev: overall=" in pred.stdout
    assert (tmp_path / "pred" / "scores-dev.json").is_file()


def test_a_sweep_without_finished_trials_is_one_line(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    exp = new_experiment(client, "open")
    parent = client.create_run(exp, tags={"role": "sweep"}, run_name="s0")
    client.create_run(exp, tags={"mlflow.parentRunId": parent.info.run_id, "variant": "p000"})
    proc = run_cli(["best", "--experiment", "open", "--tracking-uri", uri], cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == \
        f"mtbert: error: sweep s0 ({parent.info.run_id}) has no finished trials yet"
