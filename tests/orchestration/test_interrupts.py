"""Interrupts never lie: Ctrl-C or SIGTERM to a running sweep's process group leaves its
stopped trials KILLED (never FINISHED, never blamed on ASHA), and a resume finishes each one
once with every cross-trial figure re-derived. Also two sweeps started at once on a new
sqlite store. Through the CLI, read back from MLflow."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .conftest import SWEEPS, cli_env, descendants, run_cli, stop_pids, write_sweep
from .test_e2e import _wait_for, check_children, sweep_runs

pytestmark = pytest.mark.slow

# The smoke sweep with epochs long enough to be caught mid-way (ASHA still on): the signal
# goes out within a poll (0.1 s) of a first epoch line, while that trial has two epochs of
# 50 steps left (seconds), so longer epochs prove nothing more and the resume trains them all
# again. No model logged at the end: no test here reads one (test_mlflow_ui does), and it costs seconds.
NO_MODEL = {"log_models": "none"}
SMOKE = ["sweep", "run", str(SWEEPS / "smoke.yaml"), "--smoke", "--num-cpus", "2", "--name", "sig",
         "--set", "sampling.steps_per_epoch=50", "--set", "train.epochs=3", "--set", "tracking.log_models=none"]


def _epoch_lines(run_dir: Path) -> int:
    return sum(log.read_text().count(" epoch ") for log in run_dir.glob("*/train.log"))


# SIGTERM to the whole group: test_sigterm_to_the_process_group_then_resume.
@pytest.mark.parametrize("sig", [signal.SIGINT], ids=["SIGINT"])
def test_signal_then_resume(tmp_path, sig):
    log = tmp_path / "driver.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "mtbert.cli", *SMOKE], cwd=tmp_path, stdout=out,
                                stderr=subprocess.STDOUT, env=cli_env(), start_new_session=True)
    family: list[int] = []
    try:
        _wait_for(lambda: _epoch_lines(tmp_path / "runs" / "sig") >= 1, 240, "a first epoch", proc, log)
        family = descendants(proc.pid)
        os.killpg(proc.pid, sig)
        code = proc.wait(120)
    finally:
        stop_pids([proc.pid, *family, *descendants(proc.pid)], grace_s=5)
    text = log.read_text()
    assert code != 0, text[-3000:]
    assert "Traceback" not in text, text[-4000:]
    assert "mtbert sweep resume sig --storage" in text, text[-3000:]
    assert "Tuner.restore" not in text, text[-3000:]  # one way to resume: mtbert's, not Tune's
    # One count: the last progress line and the closing summary agree on the finished trials.
    line = re.findall(r"\] \d+ running, (\d+) finished, (\d+) stopped early, (\d+) failed", text)[-1]
    summary = re.search(r"trials, (\d+) finished \((\d+) stopped early\), (\d+) failed", text)
    assert summary, text[-3000:]
    assert (int(line[0]) + int(line[1]), line[2]) == (int(summary[1]), summary[3]), text[-3000:]
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client, parents, children = sweep_runs(uri, "smoke-smoke")  # --smoke: its own experiment
    assert parents[0].info.status == "KILLED"
    assert not [r for r in children if r.info.status == "RUNNING"]
    interrupted = [r for r in children if r.data.tags.get("interrupted", "false") != "false"]
    assert interrupted, [(r.info.run_name, r.info.status, r.data.tags) for r in children]
    for run in interrupted:  # stopped by the signal: resumable, not finished, not ASHA's doing
        assert run.info.status == "KILLED" and run.data.tags["stopped_early"] == "false"
        assert run.data.tags["interrupted"] == sig.name
    for run in children:
        if run.info.status == "FINISHED":  # finished before the signal: ran its budget or ASHA cut it
            epochs = run.data.metrics["epochs_run"]
            assert epochs == 3 or run.data.tags["stopped_early"] == "true"

    done = run_cli(["sweep", "resume", "sig", "--num-cpus", "2"], cwd=tmp_path, timeout=480)  # a loaded 2-core runner
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    client, parents, children = sweep_runs(uri, "smoke-smoke")
    check_children(client, parents[0], children, n=4)  # every trial FINISHED once, TM = formula
    assert not [r for r in children if r.data.tags.get("interrupted", "false") != "false"]
    artifacts = {a.path for a in client.list_artifacts(parents[0].info.run_id)}
    assert {"pareto.png", "leaderboard.md", "leaderboard.csv"} <= artifacts
    board = Path(client.download_artifacts(parents[0].info.run_id, "leaderboard.md", str(tmp_path))).read_text()
    assert "I-I-I k=all*" in board and "‡" not in board.split("\n\n")[0]  # no row left interrupted


def _one_point_per_step(client, children) -> None:
    """Each epoch once in MLflow's history of a run, however often it was run."""
    for run in children:
        steps = [h.step for h in client.get_metric_history(run.info.run_id, "epoch/overall")]
        assert sorted(steps) == list(range(1, int(run.data.metrics["epochs_run"]) + 1)), (run.info.run_name, steps)


def test_sigterm_to_the_process_group_then_resume(tmp_path):
    """SIGTERM to every process of the driver's group, as SLURM's scancel, the end of a job step
    or a closing terminal sends it: Ray's own processes must not die under the driver. It
    closes its runs (parent and running trials KILLED, never FINISHED), prints its summary
    and exits well within a 30 s grace period; `sweep resume` then finishes every trial once."""
    sweep = write_sweep(tmp_path / "term.yaml", space={"sharing.head_regime": ["S-I-I"]},
                        base={"train": {"epochs": 3}, "sampling": {"steps_per_epoch": 80}},
                        max_concurrent=2, tracking={"experiment": "term", **NO_MODEL})
    log = tmp_path / "driver.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "mtbert.cli", "sweep", "run", str(sweep), "--name", "term",
                                 "--num-cpus", "2"], cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT,
                                env=cli_env(), start_new_session=True)
    family: list[int] = []
    try:
        _wait_for(lambda: _epoch_lines(tmp_path / "runs" / "term") >= 1, 240, "a first epoch", proc, log)
        family = descendants(proc.pid)
        os.killpg(proc.pid, signal.SIGTERM)
        t0 = time.monotonic()
        code = proc.wait(60)
        took = time.monotonic() - t0
    finally:
        stop_pids([proc.pid, *family, *descendants(proc.pid)], grace_s=5)
    text = log.read_text()
    assert code != 0 and took < 20, (code, took, text[-3000:])
    for noise in ("Traceback", "Failed to connect to GCS", "marked dead", "Stop signal received", "Tuner.restore"):
        assert noise not in text, (noise, text[-4000:])
    assert "interrupted (SIGTERM); continue with" in text and "mtbert sweep resume term --storage" in text, text
    assert re.search(r"sweep term KILLED in .*: \d+ trials, \d+ finished", text), text[-3000:]
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client, parents, children = sweep_runs(uri, "term")
    assert parents[0].info.status == "KILLED"
    assert children and not [r for r in children if r.info.status == "RUNNING"]
    interrupted = [r for r in children if r.info.status != "FINISHED"]
    assert interrupted, [(r.info.run_name, r.info.status) for r in children]
    for run in interrupted:
        assert run.info.status == "KILLED" and run.data.tags["interrupted"] == "SIGTERM"

    done = run_cli(["sweep", "resume", "term", "--num-cpus", "2"], cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    client, parents, children = sweep_runs(uri, "term")
    check_children(client, parents[0], children, n=2)  # every trial FINISHED once
    assert parents[0].info.status == "FINISHED"
    assert all(r.data.metrics["epochs_run"] == 3 for r in children)
    _one_point_per_step(client, children)  # the interrupted epoch, run again, is not a second point


def test_two_sweeps_at_once_on_a_new_sqlite_store(tmp_path):
    sweep = write_sweep(tmp_path / "pair.yaml", space={"sharing.head_regime": ["S-I-I"]},
                        base={"train": {"epochs": 1}}, max_concurrent=1, tracking={"experiment": "pair", **NO_MODEL})
    uri = f"sqlite:///{tmp_path / 'new.db'}"
    procs = [subprocess.Popen([sys.executable, "-m", "mtbert.cli", "sweep", "run", str(sweep), "--name", name,
                               "--tracking-uri", uri, "--num-cpus", "1"], cwd=tmp_path, env=cli_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              start_new_session=True) for name in ("one", "two")]
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=300)[0])
    finally:
        for p in procs:
            stop_pids([p.pid, *descendants(p.pid)], grace_s=5)
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out[-3000:]
    _, parents, children = sweep_runs(uri, "pair")
    assert len(parents) == 2 and len(children) == 4
    assert all(r.info.status == "FINISHED" for r in parents + children)


def test_a_deterministic_failure_is_not_retried_nor_resumed(tmp_path):
    """A loss that turns non-finite (a huge learning rate, no clipping) fails the same way on
    every run: one attempt despite max_failures, none more on `sweep resume`, and the
    leaderboard lists it as diverged with its one-line reason. A diverged seed is the
    configuration's finding, not the sweep's fault: the sweep exits 0."""
    sweep = write_sweep(tmp_path / "nan.yaml", space={"optim.lr": {"type": "grid", "values": [1e12]}},
                        base={"train": {"epochs": 2}, "optim": {"grad_clip": 0}},
                        baseline={"optim.lr": 1e-3}, max_concurrent=1, max_failures=2,
                        tracking={"experiment": "nan", **NO_MODEL})
    proc = run_cli(["sweep", "run", str(sweep), "--name", "nan", "--num-cpus", "1"], cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]  # 0: it diverged, nothing failed
    out = proc.stdout
    assert "retry" not in out and "deterministic: not retried" in out, out
    assert "2 trials, 1 finished (0 stopped early), 1 diverged, 0 failed" in out, out
    assert "DIVERGED p000-s0" in out and "1 diverged, 0 failed, 0 pending of 2" in out, out
    run_dir = tmp_path / "runs" / "nan"
    [folder] = run_dir.glob("p000-s0_*")

    def attempts() -> int:
        return (folder / "train.log").read_text().count(" pid ")

    assert attempts() == 1 and (folder / "error.txt").read_text().count("Failure #") == 1

    done = run_cli(["sweep", "resume", "nan", "--num-cpus", "1"], cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "start   p000-s0" not in done.stdout, done.stdout
    assert attempts() == 1  # resume_errored=True re-runs crashes, not this
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client, parents, children = sweep_runs(uri, "nan")
    by_key = {r.data.tags["trial_key"]: r for r in children}
    failed = by_key["p000-s0"]
    assert failed.info.status == "FAILED" and "retries" not in failed.data.tags
    assert "Diverged: loss of task" in failed.data.tags["error"], failed.data.tags["error"]
    assert by_key["baseline-s0"].info.status == "FINISHED"
    board = run_cli(["leaderboard", "--experiment", "nan", "--tracking-uri", uri], cwd=tmp_path)
    assert board.returncode == 0, board.stdout + board.stderr
    [row] = [line for line in board.stdout.splitlines() if line.startswith("|") and "⊘" in line]
    assert "loss of task" in row and ("is nan" in row or "is inf" in row), row
