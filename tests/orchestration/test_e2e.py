"""The real thing: `mtbert sweep run` in a subprocess, local Ray, real training of a tiny
model, a real MLflow store (sqlite, then an `mlflow server`), a killed driver resumed."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient

from mtbert.cli import main
from mtbert.train.metrics import tm_relative_score
from orchestration.stats import mean_ci
from orchestration.track.models import best_configuration

from .conftest import SWEEPS, cli_env, descendants, free_port, run_cli, stop_pids, write_sweep

pytestmark = pytest.mark.slow

FINAL = ["sst_acc", "para_acc", "sts_corr", "overall", "overall_cs224n", "tm_relative_score", "tm_time_s",
         "train_time_s", "peak_memory_mb", "model_size_mb", "params_total", "params_trainable", "best_epoch",
         "epochs_run"]


def sweep_runs(uri: str, experiment: str):
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    runs = client.search_runs([exp.experiment_id], max_results=1000)
    parents = [r for r in runs if r.data.tags.get("role") == "sweep"]
    children = [r for r in runs if "trial_key" in r.data.tags]  # the seeds, not their configurations
    return client, parents, children


def check_children(client, parent, children, n: int) -> None:
    """Everything a finished sweep promises about its child runs."""
    assert len(children) == n
    assert {r.data.tags["mlflow.parentRunId"] for r in children} == {parent.info.run_id}
    assert len({r.data.tags["trial_key"] for r in children}) == n  # each trial exactly once
    assert all(r.info.status == "FINISHED" for r in children), [(r.info.run_name, r.info.status) for r in children]
    baselines = {r.data.tags["seed"]: r.data.metrics for r in children if r.data.tags["role"] == "baseline"}
    for run in children:
        m, tags = run.data.metrics, run.data.tags
        missing = [k for k in FINAL if k not in m]
        assert not missing, (run.info.run_name, missing)
        assert {"trial_id", "node", "node_ip", "git_commit", "variant", "seed"} <= set(tags)
        assert run.data.params["optim.lr"] and run.data.params["sharing.head_regime"]
        ref = baselines[tags["seed"]]
        expected = tm_relative_score(
            {"overall": m["overall"], "train_time_s": m["tm_time_s"], "model_size_mb": m["model_size_mb"]},
            {"overall": ref["overall"], "train_time_s": ref["tm_time_s"], "model_size_mb": ref["model_size_mb"]})
        assert m["tm_relative_score"] == pytest.approx(expected, rel=1e-9)
        if tags["role"] == "baseline":
            assert m["tm_relative_score"] == 1.0
        early = tags["stopped_early"] == "true"
        assert tags["tm_time_basis"] == ("projected_full_budget" if early else "measured")
        assert (m["tm_time_s"] > m["train_time_s"]) == early
        # A re-run epoch (after a restart) is logged again at its step: count steps, not entries.
        steps = {h.step for h in client.get_metric_history(run.info.run_id, "epoch/overall")}
        assert steps == set(range(1, int(m["epochs_run"]) + 1))
        assert {"result.json", "config.yaml"} <= {a.path for a in client.list_artifacts(run.info.run_id)}
    assert parent.info.status == "FINISHED"
    assert {"sweep.yaml", "search_space.json", "base_config.yaml", "pareto.png"} <= {
        a.path for a in client.list_artifacts(parent.info.run_id)}
    # Which sweep each row is (the saved view's column), and the sweep's summary on its parent.
    assert {r.data.tags["sweep_run"] for r in children} == {parent.info.run_name} == {parent.data.tags["sweep_run"]}
    summary = parent.data.metrics
    assert (summary["trials"], summary["trials_finished"], summary["trials_failed"],
            summary["trials_interrupted"]) == (n, n, 0, 0)
    assert summary["trials_stopped_early"] == sum(r.data.tags["stopped_early"] == "true" for r in children)
    best = best_configuration(children)
    mean, half, seeds = mean_ci(r.data.metrics["overall"] for r in best)
    assert parent.data.tags["best_config"] == best[0].data.tags["variant"]
    assert summary["best_config_overall"] == pytest.approx(mean) and summary["best_config_n"] == seeds
    assert summary.get("best_config_overall_ci95") == (pytest.approx(half) if seeds > 1 else None)


def test_smoke_sweep_end_to_end(tmp_path, monkeypatch, capsys):
    t0 = time.monotonic()
    proc = run_cli(["sweep", "run", str(SWEEPS / "smoke.yaml"), "--smoke", "--num-cpus", "2"], cwd=tmp_path)
    wall = time.monotonic() - t0
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert "FINISHED" in out and "4 trials, 4 finished" in out
    both = out + proc.stderr
    assert "Traceback" not in both, both[max(both.find("Traceback") - 500, 0):][:4000]
    # The console is the progress lines: no MLflow asking for type hints on the logged model,
    # no Ray explaining the token auth of the sweep's own local cluster.
    assert "UserWarning" not in both and "Token authentication" not in both, both[-3000:]
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    # --smoke keeps to an experiment of its own, out of the real sweep's: `smoke` + `-smoke`.
    assert "experiment 'smoke-smoke' (--smoke: apart from 'smoke')" in out, out[-3000:]
    assert "mtbert leaderboard --experiment smoke-smoke" in out, out[-3000:]
    client, parents, children = sweep_runs(uri, "smoke-smoke")
    assert client.get_experiment_by_name("smoke") is None
    assert len(parents) == 1
    check_children(client, parents[0], children, n=4)
    result = json.loads(Path(client.download_artifacts(children[0].info.run_id, "result.json",
                                                       str(tmp_path))).read_text())
    assert result["metrics"]["overall"] == children[0].data.metrics["overall"] and result["epochs"]
    assert (tmp_path / "runs").is_dir() and (tmp_path / "mlartifacts" / "smoke-smoke").is_dir()
    # Every trial's train.log in its own folder of the sweep's storage, reused actor or not
    # (not in Ray's working_dirs/, which Tune never copies back).
    [run_dir] = [d for d in (tmp_path / "runs").iterdir() if d.is_dir()]
    trials = sorted(d for d in run_dir.iterdir() if (d / "params.json").is_file())
    assert len(trials) == 4, trials
    for folder in trials:
        assert (folder / "train.log").is_file(), f"no train.log in {folder}"
        log = (folder / "train.log").read_text()
        assert f" trial {folder.name.rsplit('_', 1)[0]} pid " in log.splitlines()[0], log  # its own
        assert " epoch 1/" in log and "working folder" not in log, log
        assert not (folder / "output" / "last").exists(), folder
        # One copy of the model: output/best links to the best/ in the trial's last checkpoint.
        [ckpt] = folder.glob("checkpoint_*")
        best = folder / "output" / "best"
        assert best.is_symlink() and best.resolve() == (ckpt / "best").resolve(), folder
        # Tune's CSV and JSON logs stay; no TensorBoard event files (MLflow holds the figures).
        assert (folder / "result.json").is_file() and (folder / "progress.csv").is_file(), folder
        assert not list(folder.glob("events.out.tfevents*")), folder
    # A trial that ran its whole budget (--smoke: 2 epochs; ASHA may stop others after one)
    # keeps its history and best model in its last checkpoint, not its weights.
    whole = [f for f in trials if " epoch 2/2" in (f / "train.log").read_text()]
    assert whole, [(f / "train.log").read_text() for f in trials]
    for folder in whole:
        [ckpt] = folder.glob("checkpoint_*")
        state = torch.load(ckpt / "state.pt", weights_only=False)
        assert state["final"] and "model" not in state and (ckpt / "best" / "model.pt").is_file(), folder

    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    for fmt, marker, baseline in (("md", "| Regime |", "| I-I-I k=all* |"),
                                  ("csv", "variant,role,regime", "baseline,baseline,I-I-I k=all,"),
                                  ("latex", r"\begin{tabular}", "I-I-I k=all* &"),
                                  ("html", "<table", '<td class="label">I-I-I k=all*</td>')):
        assert main(["leaderboard", "--experiment", "smoke-smoke", "--format", fmt]) == 0
        text = capsys.readouterr().out
        assert marker in text and baseline in text, text
        assert text.count("\n") >= 5
        if fmt == "md":  # the counted-compute score first; the importance the sweep's end computed below
            assert "| TM-rel. (compute) | TM-rel. (wall) |" in text, text
            assert "**Importance of the swept dimensions**" in text and "| sharing.head_regime |" in text, text
    assert (tmp_path / "runs" / "smoke-smoke-pareto.png").is_file()
    assert (tmp_path / "runs" / "smoke-smoke-importance.png").is_file()
    assert {"importance.csv", "importance.png"} <= {a.path for a in client.list_artifacts(parents[0].info.run_id)}
    print(f"smoke sweep wall time: {wall:.1f}s")


def _wait_for(predicate, timeout: float, what: str, proc=None, log: Path | None = None):
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"driver exited while waiting for {what}: {log.read_text()[-3000:] if log else ''}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}: {log.read_text()[-3000:] if log else ''}")
        time.sleep(0.1)


def _trial_dir(run_dir: Path, key: str) -> Path | None:
    found = sorted(run_dir.glob(f"{key}_*"))
    return found[0] if found else None


def _checkpointed(run_dir: Path, key: str) -> bool:
    d = _trial_dir(run_dir, key)
    return d is not None and any(d.glob("checkpoint_*"))


def _logged_epoch(uri: str, experiment: str, key: str, epoch: int) -> bool:
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        return False
    runs = client.search_runs([exp.experiment_id], f"tags.trial_key = '{key}'", max_results=1)
    return bool(runs) and runs[0].data.metrics.get("epoch/epoch_time_s") is not None and \
        max(h.step for h in client.get_metric_history(runs[0].info.run_id, "epoch/overall")) >= epoch


def test_optuna_sweep_survives_a_crashed_trial_and_a_killed_driver(tmp_path, mlflow_server, monkeypatch, capsys):
    """Against an `mlflow server` (the session's shared one): Optuna with two seeds, a trial's
    worker SIGKILLed (Tune retries it from its checkpoint), then the driver SIGKILLed mid-sweep
    and `sweep resume`d.
    Every trial must end up exactly once in MLflow, FINISHED, with all its figures."""
    sweep = write_sweep(tmp_path / "resume.yaml",
                        space={"sharing.head_regime": {"type": "choice", "values": ["S-I-I", "I-S-S", "S-S-S"]},
                               "optim.lr": {"type": "loguniform", "low": 1e-4, "high": 3e-3},
                               "loss.weights": {"type": "simplex"}},
                        search={"algorithm": "optuna", "seed": 0}, num_samples=1, seeds=[0, 1],
                        base={"train": {"epochs": 3}, "sampling": {"steps_per_epoch": 60}},
                        # No model logged: nothing here reads one (test_mlflow_ui does).
                        max_concurrent=1, max_failures=1, tracking={"experiment": "resume", "log_models": "none"},
                        # The baseline is the trial whose worker is killed: a 4th epoch leaves
                        # time to do it after its 2nd (when Tune surely holds a checkpoint).
                        baseline={"sharing.head_regime": "I-I-I", "train.epochs": 4})
    run_dir = tmp_path / "runs" / "kr"
    log = tmp_path / "driver.log"
    with open(log, "w") as out:
        driver = subprocess.Popen([sys.executable, "-m", "mtbert.cli", "sweep", "run", str(sweep), "--name", "kr",
                                   "--tracking-uri", mlflow_server, "--num-cpus", "2"],
                                  cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT,
                                  env=cli_env(TUNE_GLOBAL_CHECKPOINT_S="1"), start_new_session=True)
    family: list[int] = []
    try:
        # 1. A trial's worker dies after reporting epoch 2: Tune retries it from its checkpoint.
        _wait_for(lambda: _logged_epoch(mlflow_server, "resume", "baseline-s0", 2), 180, "baseline-s0 epoch 2",
                  driver, log)
        train_log = _trial_dir(run_dir, "baseline-s0") / "train.log"
        pid = int(next(line for line in train_log.read_text().splitlines() if " pid " in line).split()[-1])
        os.kill(pid, signal.SIGKILL)
        # 2. The driver dies half-way through the first seed of an Optuna point.
        _wait_for(lambda: _logged_epoch(mlflow_server, "resume", "o000-s0", 1), 240, "o000-s0 epoch 1", driver, log)
        family = descendants(driver.pid)
        driver.send_signal(signal.SIGKILL)
        driver.wait(30)
    finally:
        # The driver and the local Ray it started: each ended by its PID.
        stop_pids([driver.pid, *family, *descendants(driver.pid)], grace_s=5)

    _, parents, children = sweep_runs(mlflow_server, "resume")
    assert parents[0].info.status == "RUNNING"  # nobody closed it: the driver was killed
    assert "o000-s1" not in {r.data.tags["trial_key"] for r in children}

    proc = run_cli(["sweep", "resume", "kr", "--num-cpus", "2"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    client, parents, children = sweep_runs(mlflow_server, "resume")
    assert len(parents) == 1
    check_children(client, parents[0], children, n=4)  # 2 baselines + 1 Optuna point x 2 seeds
    by_key = {r.data.tags["trial_key"]: r for r in children}
    assert sorted(by_key) == ["baseline-s0", "baseline-s1", "o000-s0", "o000-s1"]
    assert by_key["baseline-s0"].data.tags.get("retries") == "1"
    assert "resumed from" in (_trial_dir(run_dir, "baseline-s0") / "train.log").read_text()
    assert [r.data.metrics["epochs_run"] for r in children if r.data.tags["role"] == "search"] == [3, 3]
    # The restored searcher ran the queued second seed of the same configuration.
    first, second = by_key["o000-s0"].data.params, by_key["o000-s1"].data.params
    assert first["optim.lr"] == second["optim.lr"] and first["sharing.head_regime"] == second["sharing.head_regime"]
    assert (first["train.seed"], second["train.seed"]) == ("0", "1")

    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    assert main(["leaderboard", "--experiment", "resume", "--tracking-uri", mlflow_server,
                 "--format", "csv", "--output", "board.csv"]) == 0
    lines = (tmp_path / "board.csv").read_text().splitlines()
    assert len(lines) == 3 and all(",2," in line for line in lines[1:])  # seeds grouped: n = 2 per row
    assert (tmp_path / "board.pareto.png").is_file()


def test_unreachable_tracking_server_fails_fast(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    uri = f"http://127.0.0.1:{free_port()}"
    t0 = time.monotonic()
    assert main(["sweep", "run", str(SWEEPS / "smoke.yaml"), "--smoke", "--tracking-uri", uri]) == 2
    assert time.monotonic() - t0 < 30
    err = capsys.readouterr().err.strip()
    assert err == f"mtbert: error: tracking server {uri} unreachable (connection refused); " \
                  "start it or pass another --tracking-uri"
    assert not (tmp_path / "runs").exists()  # no trial started, no Ray experiment
    import ray

    assert not ray.is_initialized()
