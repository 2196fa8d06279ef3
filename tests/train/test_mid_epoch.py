"""Mid-epoch checkpoints (train.checkpoint_every_s): a run stopped inside an epoch continues
from the step of its last mid-epoch state and ends with the very figures of an uninterrupted
run, its step-loss points included: equality, not a tolerance (CPU, fixed seed)."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from mtbert import figures as names
from mtbert.config import ConfigError, build_config
from mtbert.train.loop import train
from mtbert.train.state import MID_DIR, CHECKPOINT_STATE

from .test_resume import SMALL, repeatable

# Every step's end is a checkpoint's time: a state after each optimizer step.
EVERY_STEP = {**SMALL, "train.epochs": 2, "train.checkpoint_every_s": 1e-9, "train.log_every_steps": 2}


class Interrupted(Exception):
    pass


class StopAt:
    """A progress that stops the run as a kill would, when `epoch` reaches `step` (the state
    of the step before is the last one written)."""

    def __init__(self, epoch: int, step: int):
        self.at = (epoch, step)

    def start_epoch(self):
        pass

    def end_epoch(self):
        pass

    def step(self, epoch, step, *_):
        if (epoch, step) == self.at:
            raise Interrupted


def reports(cfg, output_dir, **kwargs) -> tuple[list[dict], list[str], Path]:
    """train() as a sweep trial runs it: each report's figures, the log, and a copy of the last
    checkpoint folder the reporter was handed (what Tune keeps)."""
    got, lines, kept = [], [], Path(str(output_dir) + "-ckpt")

    def reporter(metrics, checkpoint_dir):
        got.append({k: v for k, v in metrics.items() if k != "timings"})
        shutil.rmtree(kept, ignore_errors=True)
        shutil.copytree(checkpoint_dir, kept)

    try:
        train(cfg, reporter=reporter, output_dir=output_dir, log=lines.append, **kwargs)
    except Interrupted:
        pass
    return got, lines, kept


def same(a: dict, b: dict) -> bool:
    keep = lambda m: {k: v for k, v in repeatable(m).items() if k not in (names.SUMMARY_KEY, names.WHERE_KEY)}
    return keep(a) == keep(b) and repeatable(a[names.SUMMARY_KEY]) == repeatable(b[names.SUMMARY_KEY])


@pytest.fixture(scope="module")
def cfg(tmp_path_factory):
    return build_config({}, {**EVERY_STEP, "data.cache_dir": str(tmp_path_factory.mktemp("cache"))})


@pytest.fixture(scope="module")
def straight(cfg, tmp_path_factory):
    return reports(cfg, tmp_path_factory.mktemp("straight") / "out")[0]


def test_a_trial_stopped_inside_its_second_epoch_continues_from_its_step(cfg, straight, tmp_path):
    first, _, kept = reports(cfg, tmp_path / "out", progress=StopAt(2, 5))
    assert len(first) == 1 and (tmp_path / "out" / MID_DIR / CHECKPOINT_STATE).is_file()
    second, lines, _ = reports(cfg, tmp_path / "out", resume_from=kept)
    assert any(line.endswith("at epoch 2, step 4") for line in lines), lines
    assert [r["epoch"] for r in second] == [2]
    assert same(second[0], straight[1]), (second[0], straight[1])
    assert second[0][names.STEP_LOSSES] == straight[1][names.STEP_LOSSES]  # the step-loss series too
    assert not (tmp_path / "out" / MID_DIR).exists()  # the epoch's checkpoint superseded it


def test_a_trial_stopped_inside_its_first_epoch_does_not_start_over(cfg, straight, tmp_path):
    reports(cfg, tmp_path / "out", progress=StopAt(1, 3))
    again, lines, _ = reports(cfg, tmp_path / "out")  # no checkpoint of Tune's: the mid-epoch state
    assert any(line.endswith("at epoch 1, step 2") for line in lines), lines
    assert len(again) == 2 and all(same(a, b) for a, b in zip(again, straight))


def test_another_configs_mid_epoch_state_is_not_continued(cfg, tmp_path):
    reports(cfg, tmp_path / "out", progress=StopAt(1, 3))
    other = build_config({}, {**EVERY_STEP, "data.cache_dir": cfg.data.cache_dir, "optim.lr": 1e-4})
    _, lines, _ = reports(other, tmp_path / "out", progress=StopAt(1, 2))
    assert not any("resumed" in line for line in lines), lines


def test_cli_output_run_stopped_mid_epoch_resumes_exactly(cfg, tmp_path):
    out = tmp_path / "out"
    straight = train(cfg, output_dir=tmp_path / "straight", log=None)
    with pytest.raises(Interrupted):
        train(cfg, output_dir=out, log=None, progress=StopAt(2, 3))
    resumed = train(cfg, output_dir=out, resume_from=out / "last", log=None)
    assert [repeatable(e) for e in resumed.epochs] == [repeatable(e) for e in straight.epochs]
    assert repeatable(resumed.metrics) == repeatable(straight.metrics)


def test_the_interval_is_checked_at_load():
    with pytest.raises(ConfigError, match=r"train\.checkpoint_every_s: must be a number of seconds >= 0"):
        build_config({}, {"train.checkpoint_every_s": -5})


def test_the_affinity_series_continue_exactly_from_a_mid_epoch_state(tmp_path):
    # The telemetry's points of the epoch so far ride the mid-epoch state: the resumed epoch
    # reports the very series an uninterrupted one does.
    cfg = build_config({}, {**EVERY_STEP, "data.cache_dir": str(tmp_path / "cache"), "affinity.every_steps": 2})
    whole = reports(cfg, tmp_path / "straight")[0]
    _, _, kept = reports(cfg, tmp_path / "out", progress=StopAt(2, 5))
    second, _, _ = reports(cfg, tmp_path / "out", resume_from=kept)
    series = lambda r: {k: v for k, v in r[names.STEP_LOSSES].items() if k.startswith(("affinity/", "cosine/"))}
    assert series(whole[1]) and series(second[0]) == series(whole[1])
    assert same(second[0], whole[1])
