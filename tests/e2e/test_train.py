"""End to end: the real `mtbert train` CLI on synthetic data learns; plug-in tasks; NaN stops."""
import dataclasses
import json
import math
import subprocess
import sys

import pytest
import torch

from mtbert.config import build_config
from mtbert.tasks import TASKS, TaskSpec, register_task
from mtbert.errors import Diverged
from mtbert.train.loop import train

FAST = {"sampling.strategy": "tuple", "sampling.steps_per_epoch": 100, "train.epochs": 3,
        "optim.lr": 1e-3}


def test_train_cli_learns_every_task(tmp_path):
    args = [sys.executable, "-m", "mtbert.cli", "train", "--output", str(tmp_path / "out"),
            "--set", f"data.cache_dir={tmp_path / 'cache'}"]
    for k, v in FAST.items():
        args += ["--set", f"{k}={v}"]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads((tmp_path / "out" / "result.json").read_text())
    m = result["metrics"]
    # Chance: 0.2 for 5-class SST (classes are balanced), 0.5 for paraphrase, r = 0 for STS.
    assert m["sst_acc"] > 0.35 and m["para_acc"] > 0.7 and m["sts_corr"] > 0.5, m
    for key in ("overall", "overall_cs224n", "train_time_s", "peak_memory_mb", "model_size_mb",
                "params_total", "params_trainable", "best_epoch"):
        assert key in m
    assert len(result["epochs"]) == 3 and m["best_epoch"] in (1, 2, 3)
    assert all(e["seq_per_s"] > 0 and 0 <= e["pad_fraction"] < 1 for e in result["epochs"])
    assert (tmp_path / "out" / "best" / "model.pt").is_file()
    assert "epoch 3/3" in proc.stdout


@pytest.fixture
def made_up_task():
    spec = register_task(TaskSpec(name="polarity", kind="binary", metric_name="polarity_acc", pair=False,
                                  description="binary sentiment, a fourth task added by one entry"))
    yield spec
    TASKS.pop(spec.name)


def test_a_fourth_task_is_one_registry_entry(made_up_task, tmp_path):
    cfg = build_config({}, {**FAST, "tasks": ["sst", "para", "sts", "polarity"], "train.epochs": 2,
                            "data.cache_dir": str(tmp_path / "cache"), "sharing.head_regime": "S-I"})
    result = train(cfg, log=None)
    assert result.metrics["polarity_acc"] > 0.6
    assert set(result.epochs[-1]) >= {"sst_acc", "para_acc", "sts_corr", "polarity_acc", "loss_polarity"}


@dataclasses.dataclass(frozen=True)
class ExplodingTask(TaskSpec):
    def loss(self, logits, labels):
        return super().loss(logits, labels) * float("inf")


def test_non_finite_loss_names_task_and_step(tmp_path):
    register_task(ExplodingTask(name="boom", kind="binary", metric_name="boom_acc", pair=False))
    try:
        cfg = build_config({}, {"tasks": ["sst", "boom"], "sampling.strategy": "round_robin",
                                "data.cache_dir": str(tmp_path / "cache"), "train.epochs": 1})
        with pytest.raises(Diverged, match=r"loss of task 'boom' is (inf|nan) at epoch 1, step 2"):
            train(cfg, log=None)
    finally:
        TASKS.pop("boom")


def test_resume_continues_from_checkpoint(tmp_path):
    """A reporter receives per-epoch checkpoints; resuming one continues at the next epoch."""
    cfg = build_config({}, {**FAST, "sampling.steps_per_epoch": 5, "train.epochs": 3,
                            "data.cache_dir": str(tmp_path / "cache")})
    saved = []

    def reporter(metrics, ckpt):
        import shutil
        dst = tmp_path / f"ckpt{metrics['epoch']}"
        shutil.copytree(ckpt, dst)
        saved.append((metrics, dst))

    full = train(cfg, reporter=reporter, log=None)
    assert [m["epoch"] for m, _ in saved] == [1, 2, 3]
    resumed = train(cfg, resume_from=saved[0][1], log=None)
    assert [e["epoch"] for e in resumed.epochs] == [1, 2, 3]
    assert resumed.epochs[0] == full.epochs[0]  # epoch 1 comes from the checkpoint's history
    torch.testing.assert_close(resumed.metrics["overall"], full.metrics["overall"], atol=0.05, rtol=0)


def test_a_step_with_nothing_to_learn_is_skipped(tmp_path):
    """A cosine STS head on a wholly frozen encoder has no parameters: with round robin, a step
    drawing only STS reaches nothing trainable, and the run goes on instead of failing in
    backward."""
    cfg = build_config({}, {"freeze.layers": -1, "sts.head": "cosine", "sampling.strategy": "round_robin",
                            "data.cache_dir": str(tmp_path / "cache"), "train.epochs": 1})
    result = train(cfg, log=None)
    assert result.metrics["best_epoch"] == 1
    assert all(math.isfinite(result.metrics[m]) for m in ("sst_acc", "para_acc", "sts_corr"))
