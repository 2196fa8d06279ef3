"""`mtbert affinity RUN --against SWEEP` where the sweep varies the shared encoder depth: one
fine-tuned run that shares every encoder layer measures each alone (encoder-layer-k), and the
depths' predicted ranking (grouping.depth_scores) is held against the depths the sweep trained."""
from __future__ import annotations

import pytest
from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient

from mtbert.config import build_config
from mtbert.train import grouping as gr
from mtbert.train.loop import train
from orchestration.errors import SweepError
from orchestration.report import affinity as aff
from tests.train.test_affinity import NOISY

from .conftest import new_experiment

DEPTHS = ("0", "1", "None")  # the tiny encoder's 2 layers: none, the bottom one, all (null)


def _sweep(client: MlflowClient, name: str, overall: dict[str, float], key: str) -> None:
    """A finished sweep of three depths x three seeds, `overall` each (plus a seed's jitter)."""
    exp = new_experiment(client, name)
    parent = client.create_run(exp, run_name=f"{name}-1", tags={"role": "sweep"}).info.run_id
    for i, (value, score) in enumerate(overall.items()):
        for seed in range(3):
            run = client.create_run(exp, run_name=f"p{i:03d}-s{seed}", tags={
                "mlflow.parentRunId": parent, "variant": f"p{i:03d}", "seed": str(seed), "role": "search",
                "trial_key": f"p{i:03d}-s{seed}"}).info.run_id
            client.log_batch(run, params=[Param(key, value), Param("train.seed", str(seed))],
                             metrics=[Metric("overall", score + 0.001 * seed, 0, 0), Metric("train_flops", 1e9, 0, 0)])
            client.set_terminated(run, "FINISHED")
    client.set_terminated(parent, "FINISHED")


def test_a_fine_tuned_run_ranks_the_encoder_depths_a_sweep_trained(tmp_path):
    cfg = build_config({}, {**NOISY, "data.cache_dir": str(tmp_path / "cache"), "affinity.every_steps": 6})
    train(cfg, output_dir=tmp_path / "out", log=None)
    measured = aff.from_folder(tmp_path / "out")
    predicted = gr.depth_scores(measured.means(), cfg.tasks, 2)
    # The sweep measured the depths in the order the affinities predict: rho +1.
    order = sorted(range(3), key=lambda k: predicted[k])
    overall = {DEPTHS[k]: 0.5 + 0.01 * order.index(k) for k in range(3)}
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    _sweep(client, "depths", overall, "sharing.encoder_shared_layers")
    check = aff.check_regimes(measured, None, uri, "depths")
    assert check.dimension == "encoder depths" and set(check.measured) == set(DEPTHS)
    assert check.predicted["None"] == check.predicted["2"] == pytest.approx(predicted[2])
    assert check.rho == pytest.approx(1.0) and check.verdict is None  # the predicted best is the measured best
    printed = aff.render_check(check, "depths")
    assert printed.startswith("encoder depths, predicted from the affinities vs measured by depths (overall):")
    assert "k shared" in printed and "the predicted best is the measured best" in printed
    # Measured the other way round: rho -1, and the predicted best against the measured best at
    # three seeds, too few for the median's interval, says so instead of printing nan ends.
    _sweep(client, "reversed", {k: 1.0 - v for k, v in overall.items()}, "sharing.encoder_shared_layers")
    backwards = aff.check_regimes(measured, None, uri, "reversed")
    assert backwards.rho == pytest.approx(-1.0) and backwards.verdict.outcome == "inconclusive"
    shown = aff.render_check(backwards, "reversed")
    assert "(no interval: too few seeds)" in shown and "nan" not in shown, shown
    # A run with no per-layer encoder affinities (a frozen encoder) cannot rank depths: one line.
    frozen = build_config({}, {**NOISY, "data.cache_dir": str(tmp_path / "cache"), "affinity.every_steps": 6,
                               "freeze.layers": -1, "sharing.head_regime": "S-S-S"})
    train(frozen, output_dir=tmp_path / "frozen", log=None)
    with pytest.raises(SweepError, match="no affinity per encoder layer"):
        aff.check_regimes(aff.from_folder(tmp_path / "frozen"), None, uri, "depths")
