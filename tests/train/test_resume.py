"""Exact resume: a run stopped after an epoch and resumed ends with the very figures of an
uninterrupted run (CPU, fixed seed): equality, not a tolerance."""
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from mtbert.config import build_config
from mtbert.train.loop import train
from mtbert.train.state import CHECKPOINT_STATE

# Dropout everywhere (encoder and heads) and random task draws: the RNG states matter.
SMALL = {"sampling.strategy": "proportional", "sampling.steps_per_epoch": 6, "train.epochs": 3,
         "data.synthetic.train_size": 120, "data.synthetic.dev_size": 40, "train.device": "cpu",
         "heads.dropout": 0.3, "model.max_length": 32, "train.batch_size": 8}
# Per-epoch figures that depend on the training draws (timings and memory do not repeat).
def figures(result) -> list[dict]:
    keep = ("epoch", "sst_acc", "para_acc", "sts_corr", "overall", "loss_sst", "loss_para", "loss_sts",
            "best_epoch", "pad_fraction")
    return [{k: e[k] for k in keep} for e in result.epochs]


# What the machine measures (time, speed, memory) differs between any two runs.
MEASURED = ("time", "memory", "seq_per_s", "tokens_per_s", "mfu")


def repeatable(figures: dict) -> dict:
    return {k: v for k, v in figures.items() if not any(m in k for m in MEASURED)}


class Interrupted(Exception):
    pass


@pytest.fixture(scope="module")
def cfg(tmp_path_factory):
    return build_config({}, {**SMALL, "data.cache_dir": str(tmp_path_factory.mktemp("cache"))})


@pytest.fixture(scope="module")
def straight(cfg):
    return train(cfg, log=None)


def _stopped_after_first_epoch(cfg, output_dir=None) -> Path:
    """Train until epoch 1 is reported, then stop as a killed trial would; returns a copy of
    the checkpoint folder the reporter was handed (what Tune persists for a sweep trial)."""
    kept = Path(str(output_dir or "") + "-ckpt") if output_dir else None

    def reporter(metrics, checkpoint_dir):
        if metrics["epoch"] == 1:
            if kept is not None:
                shutil.copytree(checkpoint_dir, kept)
            raise Interrupted

    with pytest.raises(Interrupted):
        train(cfg, reporter=reporter, output_dir=output_dir, log=None)
    return kept


@pytest.fixture(scope="module")
def checkpoint(cfg, tmp_path_factory):
    return _stopped_after_first_epoch(cfg, tmp_path_factory.mktemp("trial") / "out")


def test_sweep_trial_resumed_from_its_checkpoint_equals_straight_run(cfg, straight, checkpoint, tmp_path):
    ckpt = Path(shutil.copytree(checkpoint, tmp_path / "ckpt"))
    assert torch.load(ckpt / CHECKPOINT_STATE, weights_only=False)["rng"]  # what makes it exact
    resumed = train(cfg, reporter=lambda m, c: None, resume_from=ckpt, log=None)
    assert figures(resumed) == figures(straight)
    assert repeatable(resumed.metrics) == repeatable(straight.metrics)


def test_without_the_rng_states_the_resumed_run_differs(cfg, straight, checkpoint, tmp_path):
    """The guard on the test above: the same resume, RNG states dropped, drifts."""
    ckpt = Path(shutil.copytree(checkpoint, tmp_path / "ckpt"))
    state = torch.load(ckpt / CHECKPOINT_STATE, weights_only=False)
    del state["rng"]
    torch.save(state, ckpt / CHECKPOINT_STATE)
    resumed = train(cfg, resume_from=ckpt, log=None)
    assert figures(resumed)[0] == figures(straight)[0]  # epoch 1 came from the checkpoint
    assert figures(resumed)[1:] != figures(straight)[1:]


def test_a_finished_runs_last_checkpoint_keeps_its_history_not_its_weights(cfg, straight, tmp_path):
    """A sweep keeps every finished trial's last checkpoint: weights and AdamW moments there
    would be ~3x the model per trial, and nothing reads them (no epoch is left to train)."""
    kept: list[Path] = []

    def reporter(metrics, checkpoint_dir):
        kept.append(Path(shutil.copytree(checkpoint_dir, tmp_path / f"epoch{metrics['epoch']}")))

    out = tmp_path / "out"
    train(cfg, reporter=reporter, output_dir=out, log=None)
    states = [torch.load(k / CHECKPOINT_STATE, weights_only=False) for k in kept]
    assert [s.get("final", False) for s in states] == [False, False, True]
    assert {"model", "optimizer"} <= set(states[1]) and not {"model", "optimizer"} & set(states[2])
    assert (kept[2] / CHECKPOINT_STATE).stat().st_size < (kept[1] / CHECKPOINT_STATE).stat().st_size / 10
    assert (kept[2] / "best" / "model.pt").is_file()  # the model the driver logs travels beside it
    assert not (out / "last").exists()  # the reporter's checkpoint is the state; no second copy

    # Tune restarts a trial from it when the driver died before recording the trial as ended.
    calls: list = []
    again = train(cfg, reporter=lambda m, c: calls.append(m), resume_from=kept[2], log=None)
    assert calls == [] and figures(again) == figures(straight)
    assert repeatable(again.metrics) == repeatable(straight.metrics)


@pytest.mark.slow
def test_cli_train_killed_and_resumed_equals_straight_run(tmp_path):
    """`mtbert train --output DIR` killed (SIGKILL) after its first epoch, then `--resume`.
    The killed run wrote into its partial folder beside DIR (DIR itself stays untouched
    until a run ends); --resume continues that one and moves it in at the end."""
    base = [sys.executable, "-m", "mtbert.cli", "train", "--set", f"data.cache_dir={tmp_path / 'cache'}"]
    for k, v in {**SMALL, "train.epochs": 3, "sampling.steps_per_epoch": 20}.items():
        base += ["--set", f"{k}={v}"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    straight = subprocess.run(base + ["--output", str(tmp_path / "straight")], capture_output=True,
                              text=True, timeout=600, env=env)
    assert straight.returncode == 0, straight.stderr[-2000:]

    out = tmp_path / "killed"
    proc = subprocess.Popen(base + ["--output", str(out)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=env, start_new_session=True)
    deadline = time.monotonic() + 300

    def saved_states():
        return list(tmp_path.glob(f".{out.name}.partial-*/last/{CHECKPOINT_STATE}"))

    while not saved_states() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    [state_file] = saved_states()
    saved = torch.load(state_file, weights_only=False)["epoch"]
    assert saved < 3, "the run ended before it could be killed"
    assert not (out / "result.json").exists()

    resumed = subprocess.run(base + ["--output", str(out), "--resume"], capture_output=True, text=True,
                             timeout=600, env=env)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"resumed from {state_file.parent} at epoch {saved + 1}" in resumed.stdout
    assert not saved_states() and (out / "last" / CHECKPOINT_STATE).is_file()  # moved in, partial gone
    import json

    a = json.loads((tmp_path / "straight" / "result.json").read_text())
    b = json.loads((out / "result.json").read_text())
    assert [repeatable(e) for e in a["epochs"]] == [repeatable(e) for e in b["epochs"]]
    # Every weight of the best model is the same too.
    wa = torch.load(tmp_path / "straight" / "best" / "model.pt", weights_only=True)
    wb = torch.load(out / "best" / "model.pt", weights_only=True)
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def test_resume_without_a_previous_run_is_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "mtbert.cli", "train", "--output", str(tmp_path / "none"),
                           "--resume"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("mtbert: error: --resume:") and "Traceback" not in proc.stderr


def test_resume_from_a_state_cut_short_is_one_line_naming_it(tmp_path):
    """`mtbert train --resume` on a last/state.pt that a kill cut in half: one line naming the
    file (a sweep trial goes on from an older checkpoint or its start instead: test_faults)."""
    state = tmp_path / "run" / "last" / CHECKPOINT_STATE
    state.parent.mkdir(parents=True)
    torch.save({"epoch": 1, "weights": torch.zeros(4096)}, state)
    state.write_bytes(state.read_bytes()[: state.stat().st_size // 2])
    proc = subprocess.run([sys.executable, "-m", "mtbert.cli", "train", "--output", str(tmp_path / "run"),
                           "--resume", "--set", "data.synthetic.train_size=40", "--set", "model.max_length=32"],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith(f"mtbert: error: {state}: unreadable ("), line


# A run that learns steadily (seeds 0-7 each saved a later best epoch, in fp32 and in bf16): a
# later best epoch must be there to save, whatever the draws; SMALL's six steps an epoch are
# mostly noise.
LEARNING = {**SMALL, "sampling.strategy": "tuple", "optim.lr": 2e-3, "sampling.steps_per_epoch": 30,
            "data.synthetic.train_size": 400}


def test_every_checkpoint_carries_the_best_epochs_bundle_as_it_stood(tmp_path):
    """After its first save a run rewrites only best/model.pt (the rest of the bundle is the
    same at every epoch), and a checkpoint links rather than copies the bundle's files: each
    persisted checkpoint must still hold a whole bundle, with the weights of the epoch that was
    best when it was reported."""
    from mtbert.bundle import load_model, read_weights

    cfg = build_config({}, {**LEARNING, "data.cache_dir": str(tmp_path / "cache")})
    straight = train(cfg, log=None)
    kept: list[tuple[dict, Path]] = []

    def reporter(metrics, checkpoint_dir):
        kept.append((metrics, Path(shutil.copytree(checkpoint_dir, tmp_path / f"epoch{metrics['epoch']}"))))

    out = tmp_path / "out"
    train(cfg, reporter=reporter, output_dir=out, log=None)
    best_epochs = [m["best_epoch"] for m, _ in kept]
    assert best_epochs == [e["best_epoch"] for e in straight.epochs]
    assert any(m["best_epoch"] == m["epoch"] > 1 for m, _ in kept[:-1]), best_epochs  # a weights-only save
    for metrics, folder in kept:
        assert {p.name for p in (folder / "best").iterdir()} >= {"model.pt", "config.yaml", "bundle.json"}
        if metrics["best_epoch"] == metrics["epoch"] and metrics["epoch"] < len(kept):
            # That epoch's model is also the checkpoint's resumable state (not the final one's).
            state = torch.load(folder / CHECKPOINT_STATE, weights_only=False)["model"]
            weights = read_weights(folder / "best")
            assert weights.keys() == state.keys()
            assert all(torch.equal(weights[k], state[k]) for k in state)
    last_best = kept[-1][1] / "best"
    assert (out / "best" / "model.pt").read_bytes() == (last_best / "model.pt").read_bytes()
    assert load_model(out / "best", device="cpu").tasks == list(cfg.tasks)
