"""Inter-task affinity in a real sweep: the trials' series land in MLflow (per epoch and per
measurement, with the heatmaps as artifacts), the leaderboard carries the sweep's mean
affinities with their intervals over seeds, and `mtbert affinity` names the planted grouping
and writes a sweep that trains it."""
from __future__ import annotations

import pytest
import yaml
from mlflow.tracking import MlflowClient

from tests.train.test_affinity import PLANTED_PLUGIN, planted_base

from .conftest import SWEEPS, run_cli, write_sweep
from .test_e2e import sweep_runs

pytestmark = pytest.mark.slow


def test_a_sweep_measures_affinity_and_suggests_the_planted_grouping(tmp_path):
    (tmp_path / "planted_tasks.py").write_text(PLANTED_PLUGIN)
    base = {**planted_base(tmp_path / "cache"), "plugins": ["planted_tasks"]}
    # A cosine head has no head layers: both regimes train the same model, two configurations
    # of two seeds each, four runs for the mean.
    write_sweep(tmp_path / "planted.yaml", name="planted", base=base, space={"sharing.head_regime": ["S"]},
                seeds=[0, 1], max_concurrent=2, tracking={"log_models": "none"})
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    proc = run_cli(["sweep", "run", "planted.yaml", "--num-cpus", "2", "--tracking-uri", uri], cwd=tmp_path,
                   timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    client, _, children = sweep_runs(uri, "planted")
    assert len(children) == 4
    run = children[0].info.run_id
    epochs = client.get_metric_history(run, "epoch/affinity/near-to-close")
    assert sorted(m.step for m in epochs) == [1, 2]
    points = client.get_metric_history(run, "step/affinity/far-to-near")  # every measurement at its global step
    assert sorted(m.step for m in points) == [5, 10, 15, 20]
    assert "epoch/cosine/near-far" in children[0].data.metrics
    files = {f.path for f in client.list_artifacts(run, "affinity")}
    assert files == {"affinity/affinity.json", "affinity/epoch-1.png", "affinity/epoch-2.png"}, files

    board = run_cli(["leaderboard", "--experiment", "planted", "--tracking-uri", uri], cwd=tmp_path)
    assert board.returncode == 0, board.stderr[-2000:]
    section = board.stdout.split("**Inter-task affinity**", 1)[1]
    rows = [line for line in section.splitlines() if "near → close" in line and "| shared |" in line]
    assert len(rows) == 2 and all("[" in row and "| 2 |" in row for row in rows), section  # each config, 2 seeds

    fragment = tmp_path / "suggested.yaml"
    found = run_cli(["affinity", "planted", "--tracking-uri", uri, "--output", str(fragment)], cwd=tmp_path)
    assert found.returncode == 0, found.stderr[-2000:]
    assert "suggested: {near, close} | {far}" in found.stdout, found.stdout
    spec = yaml.safe_load(fragment.read_text())
    assert spec["space"]["sharing.head_share_tasks"]["values"] == [["near", "close"], None]
    assert spec["base"]["plugins"] == ["planted_tasks"] and "affinity" not in spec["base"]
    plan = run_cli(["sweep", "plan", str(fragment), "--no-measure"], cwd=tmp_path)  # a sweep mtbert runs
    assert plan.returncode == 0, plan.stdout[-2000:] + plan.stderr[-2000:]


def test_the_per_layer_affinities_rank_the_head_regimes_against_a_sweep_of_them(tmp_path):
    # The shipped pair at smoke size in one store: one all-shared run measuring each head layer
    # (sweeps/affinity/minilm.yaml), and the head regimes trained (the study's file).
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    for name in ("affinity/minilm.yaml", "study/head_regimes_frozen.yaml"):
        proc = run_cli(["sweep", "run", str(SWEEPS / name), "--smoke", "--num-cpus", "2", "--tracking-uri", uri],
                       cwd=tmp_path, timeout=1200)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    found = run_cli(["affinity", "affinity-minilm-smoke", "--variant", "p000", "--against",
                     "study-head-regimes-frozen-smoke", "--tracking-uri", uri, "--output", "s.yaml"], cwd=tmp_path)
    assert found.returncode == 0, found.stderr[-2000:]
    printed = found.stdout.split("head regimes, predicted", 1)[1]
    from orchestration.report import affinity as aff
    from mtbert.train import grouping as gr

    measured = aff.from_source(uri, "affinity-minilm-smoke")
    predicted = gr.regime_scores(measured.means("p000"), measured.tasks, 3)
    rows = [line.split() for line in printed.splitlines() if line.startswith("  ") and "-" in line.split()[0]]
    assert len(rows) == 4  # the smoke's regimes: the baseline I-I-I and three searched ones
    assert [r[0] for r in rows] == sorted((r[0] for r in rows), key=lambda r: -predicted[r])
    assert all(float(r[1]) == pytest.approx(predicted[r[0]], rel=1e-2, abs=1e-9) for r in rows)
    assert "Spearman rho of the means:" in printed and "compute: the affinity runs' train_flops are" in printed
