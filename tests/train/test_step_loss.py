"""train.log_every_steps: the step-level losses a report carries are the epoch's own losses
over smaller windows, and logging them changes no result."""
from __future__ import annotations

import pytest

from mtbert import figures
from mtbert.config import ConfigError, build_config
from mtbert.train.loop import train

QUICK = {"sampling.strategy": "tuple", "sampling.steps_per_epoch": 6, "train.epochs": 2,
         "data.synthetic.train_size": 96, "data.synthetic.dev_size": 32, "train.save_checkpoint": False}


def _run(tmp_path, every: int) -> tuple[list[dict], list[dict], dict]:
    cfg = build_config({}, {**QUICK, "data.cache_dir": str(tmp_path / "cache"), "train.log_every_steps": every})
    reports = []
    result = train(cfg, reporter=lambda m, _dir: reports.append(m), log=None)
    # What the run learned and scored (its timings differ from run to run, as any two runs').
    learned = [{k: v for k, v in e.items() if k.startswith(("loss_", "weight_")) or k in ("overall", "sst_acc",
                "para_acc", "sts_corr", "train_flops", "params_trainable")} for e in result.epochs]
    assert not any(figures.STEP_LOSSES in e for e in result.epochs)  # in the reports, not the run's history
    state = {k: v.clone() for k, v in result.model.state_dict().items()}
    return learned, reports, state


def test_points_average_the_epochs_losses_and_change_nothing(tmp_path):
    history, reports, weights = _run(tmp_path, 3)
    quiet_history, quiet, quiet_weights = _run(tmp_path, 0)
    assert history == quiet_history  # the same run, figure for figure
    assert all(weights[k].equal(quiet_weights[k]) for k in weights)  # and weight for weight
    assert all(figures.STEP_LOSSES not in r or not r[figures.STEP_LOSSES] for r in quiet)
    for epoch, report in enumerate(reports, 1):
        points = report[figures.STEP_LOSSES]
        assert set(points) == {"loss_sst", "loss_para", "loss_sts"}
        for name, series in points.items():
            # Every 3 of the epoch's 6 steps, numbered across epochs.
            assert [at for at, _ in series] == [(epoch - 1) * 6 + 3, epoch * 6]
            # tuple: every task each step, so two equal windows average to the epoch's mean loss.
            assert sum(v for _, v in series) / 2 == pytest.approx(report[name], rel=1e-5)


def test_a_negative_interval_is_one_line():
    with pytest.raises(ConfigError, match=r"train.log_every_steps: must be >= 0"):
        build_config({}, {"train.log_every_steps": -1})
