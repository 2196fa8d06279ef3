"""Every loss-weighting method trains the tiny model end to end and reports its weights per
epoch; a checkpoint carries a method's state; a new method is one file plus one line."""
import math
import shutil
import sys
import textwrap

import pytest
import torch

from mtbert.config import ConfigError, build_config
from mtbert.train.loop import train
from mtbert.train.weighting import WEIGHTINGS

TASKS = ["sst", "para", "sts"]
QUICK = {"sampling.strategy": "tuple", "sampling.steps_per_epoch": 12, "train.epochs": 3, "optim.lr": 2e-3,
         "data.synthetic.train_size": 300, "data.synthetic.dev_size": 60, "train.save_checkpoint": False}


def _weights(epoch: dict) -> list[float]:
    return [epoch[f"weight_{t}"] for t in TASKS]


@pytest.mark.parametrize("method", list(WEIGHTINGS))
def test_every_method_trains_and_reports_its_weights(method, tmp_path):
    cfg = build_config({}, {**QUICK, "loss.weighting": method, "data.cache_dir": str(tmp_path / "cache")})
    epochs = train(cfg, log=None).epochs
    assert len(epochs) == 3
    # MGDA's minimum-norm point may drop a task, and IMTL-G's and Aligned-MTL's weights come
    # from a (pseudo-)inverse: their weights are finite, not necessarily positive.
    positive = method not in ("mgda", "imtl_g", "aligned_mtl")
    for e in epochs:
        assert all(math.isfinite(w) and (w > 0 or not positive) for w in _weights(e)), e
    first, last = (sum(e[f"loss_{t}"] for t in TASKS) for e in (epochs[0], epochs[-1]))
    assert last < first, (method, first, last)  # it learns
    w1, w3 = _weights(epochs[0]), _weights(epochs[-1])
    if method in ("static", "pcgrad"):
        assert w1 == w3 == pytest.approx([1 / 3] * 3)
    elif method == "dwa":  # no loss ratio before epoch 3; then K x softmax
        assert w1 == _weights(epochs[1]) == [1.0] * 3
        assert sum(w3) == pytest.approx(3.0) and w3 != pytest.approx([1.0] * 3, abs=1e-4)
    elif method == "gradnorm":  # renormalised to sum 3 after every step, and moving
        assert sum(w1) == pytest.approx(3.0) and sum(w3) == pytest.approx(3.0)
        assert w3 != pytest.approx([1.0] * 3, abs=1e-2)
    elif method == "uncertainty":  # exp(-s_i), learned from s_i = 0
        assert w3 != pytest.approx([1.0] * 3, abs=1e-4)
    elif method == "famo":  # c z_i / L_i: they sum to 1 every step, and the logits move
        assert sum(w1) == pytest.approx(1.0) and sum(w3) == pytest.approx(1.0)
        assert w3 != pytest.approx(w1, abs=1e-4)
    elif method == "cagrad":  # (1/T + lambda w_i) / (1 + c^2) for each task
        assert all(w >= 1 / 3 / 1.16 - 1e-5 for w in w3)
    elif method in ("upgrad", "dualproj"):  # the dual cone's projection keeps every weight >= the mean's 1/T
        assert all(w >= 1 / 3 - 1e-4 for w in w3)
    elif method in ("mgda", "imtl_g"):  # a convex combination; IMTL-G's normalised to sum 1
        assert sum(w3) == pytest.approx(1.0, abs=1e-4)


def test_checkpoint_carries_the_methods_state(tmp_path):
    """DWA's epoch-3 weights come from the losses of epochs 1 and 2: resuming from the epoch-2
    checkpoint must reproduce them exactly, which it can only do from the stored history."""
    cfg = build_config({}, {**QUICK, "loss.weighting": "dwa", "train.save_checkpoint": True,
                            "data.cache_dir": str(tmp_path / "cache")})
    saved = {}

    def reporter(metrics, ckpt):
        saved[metrics["epoch"]] = shutil.copytree(ckpt, tmp_path / f"ckpt{metrics['epoch']}")

    full = train(cfg, reporter=reporter, log=None)
    state = torch.load(saved[2] / "state.pt", weights_only=False)
    assert len(state["weighting"]["history"]) == 2
    resumed = train(cfg, resume_from=saved[2], log=None)
    assert _weights(resumed.epochs[-1]) == _weights(full.epochs[-1])


def test_famo_resumes_to_the_digit(tmp_path):
    """FAMO's weights at a step come from its logits, their Adam moments and the step before's
    losses: a run resumed from the epoch-2 checkpoint ends exactly where the whole run did."""
    cfg = build_config({}, {**QUICK, "loss.weighting": "famo", "train.save_checkpoint": True,
                            "data.cache_dir": str(tmp_path / "cache")})
    saved = {}

    def reporter(metrics, ckpt):
        saved[metrics["epoch"]] = shutil.copytree(ckpt, tmp_path / f"ckpt{metrics['epoch']}")

    full = train(cfg, reporter=reporter, log=None)
    state = torch.load(saved[2] / "state.pt", weights_only=False)["weighting"]
    assert state["last_log_losses"] is not None and bool(state["logits"].ne(0).any())
    resumed = train(cfg, resume_from=saved[2], log=None)
    for key in ("loss_sst", "loss_para", "loss_sts", "weight_sst", "weight_para", "weight_sts", "overall"):
        assert resumed.epochs[-1][key] == full.epochs[-1][key], key


# The methods from TorchJD, plus mtbert's own per-task gradient methods they sit beside.
GRADIENT_METHODS = ["upgrad", "nash_mtl", "aligned_mtl", "imtl_g", "mgda", "dualproj", "pcgrad", "cagrad"]


@pytest.mark.parametrize("method", GRADIENT_METHODS)
def test_a_gradient_method_resumes_to_the_digit(method, tmp_path):
    """Two epochs, and a run resumed from the first's checkpoint: the second epoch's losses,
    weights, scores and counted FLOPs are the whole run's exactly (any solver state, PCGrad's
    generator or Nash-MTL's last alpha, rides the checkpoint)."""
    cfg = build_config({}, {**QUICK, "loss.weighting": method, "train.save_checkpoint": True, "train.epochs": 2,
                            "sampling.steps_per_epoch": 6, "data.cache_dir": str(tmp_path / "cache")})
    saved = {}

    def reporter(metrics, ckpt):
        saved[metrics["epoch"]] = shutil.copytree(ckpt, tmp_path / f"ckpt{metrics['epoch']}")

    full = train(cfg, reporter=reporter, log=None)
    resumed = train(cfg, resume_from=saved[1], log=None)
    for key in ("loss_sst", "loss_para", "loss_sts", "weight_sst", "weight_para", "weight_sts", "overall",
                "train_flops"):
        assert resumed.epochs[-1][key] == full.epochs[-1][key], key


PLUGIN = '''
    """A made-up weighting method: every task at half weight."""
    import torch

    from mtbert.train.weighting import Weighting, register_weighting


    class Halve(Weighting):
        name = "halve"

        def backward(self, losses, shared):
            (0.5 * torch.stack(list(losses.values()))).sum().backward()
            return {t: torch.tensor(0.5) for t in losses}


    register_weighting(Halve)
'''


@pytest.fixture
def halve_plugin(tmp_path, monkeypatch):
    (tmp_path / "halve_weighting.py").write_text(textwrap.dedent(PLUGIN))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "halve_weighting"
    WEIGHTINGS.pop("halve", None)
    sys.modules.pop("halve_weighting", None)


def test_a_new_method_is_one_file_and_one_registry_line(halve_plugin, tmp_path):
    with pytest.raises(ConfigError, match="loss.weighting: unknown method 'halve'"):
        build_config({}, {"loss.weighting": "halve"})
    cfg = build_config({}, {**QUICK, "plugins": [halve_plugin], "loss.weighting": "halve",
                            "sampling.strategy": "round_robin", "train.epochs": 1,
                            "data.cache_dir": str(tmp_path / "cache")})
    epoch = train(cfg, log=None).epochs[-1]
    assert _weights(epoch) == [0.5] * 3
