"""Faults a sweep meets end as the design promises: ridden out with nothing lost, or one line
and a `sweep resume` that finishes every trial once. Each through the CLI in a subprocess,
read back from MLflow: a checkpoint cut short by a kill, the tracking store going away or
locked at the wrong moment, a trial Ray's memory monitor kills."""
from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import cli_env, descendants, run_cli, stop_pids, write_sweep
from .test_e2e import _wait_for, check_children, sweep_runs

pytestmark = pytest.mark.slow

NO_MODEL = {"log_models": "none"}


def _start(args: list[str], cwd: Path, log: Path, **env: str) -> subprocess.Popen:
    with open(log, "w") as out:
        return subprocess.Popen([sys.executable, "-m", "mtbert.cli", *args], cwd=cwd, stdout=out,
                                stderr=subprocess.STDOUT, env=cli_env(**env), start_new_session=True)


def test_a_truncated_checkpoint_is_not_retried_but_trained_past(tmp_path):
    """The driver SIGKILLed, the newest checkpoint of each trial cut in half (every file in
    it), then `sweep resume`: each trial falls back to an older readable checkpoint or its
    start, with a note in its train.log, and every trial ends FINISHED once; no retry of the
    unreadable one, no failed trial."""
    sweep = write_sweep(tmp_path / "cut.yaml", space={"sharing.head_regime": ["S-I-I"]},
                        base={"train": {"epochs": 3}, "sampling": {"steps_per_epoch": 60}},
                        max_concurrent=2, max_failures=3, tracking={"experiment": "cut", **NO_MODEL})
    run_dir = tmp_path / "runs" / "cut"
    log = tmp_path / "driver.log"
    driver = _start(["sweep", "run", str(sweep), "--name", "cut", "--num-cpus", "2"], tmp_path, log)
    family: list[int] = []
    try:
        def both_checkpointed() -> bool:
            """A checkpoint of each trial that Tune's saved state already names (a checkpoint
            written since is registered, and the older one deleted, only once the driver has
            taken in its result): a trial the state names no checkpoint of restarts from its
            start, and the cut file is never read."""
            trials = list(run_dir.glob("*-s0_*"))
            states = sorted(run_dir.glob("experiment_state*.json"), key=lambda f: f.stat().st_mtime)
            if len(trials) != 2 or not states:
                return False
            named = states[-1].read_text()
            return all(any(c.name in named for c in t.glob("checkpoint_*")) for t in trials)

        _wait_for(both_checkpointed, 240, "a checkpoint of each trial", driver, log)
        family = descendants(driver.pid)
        driver.send_signal(signal.SIGKILL)
        driver.wait(30)
    finally:
        stop_pids([driver.pid, *family, *descendants(driver.pid)], grace_s=5)
    cut = 0
    for trial in run_dir.glob("*-s0_*"):  # every checkpoint on disk: the one the state names among them
        for file in trial.glob("checkpoint_*/**/*"):
            if file.is_file() and file.stat().st_size > 1:
                file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])
                cut += 1
    assert cut >= 2

    done = run_cli(["sweep", "resume", "cut", "--num-cpus", "2"], cwd=tmp_path, timeout=300)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    assert "Traceback" not in out and "did not complete" not in out and "retry" not in out, out[-3000:]
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client, parents, children = sweep_runs(uri, "cut")
    check_children(client, parents[0], children, n=2)
    assert all(r.data.metrics["epochs_run"] == 3 and "retries" not in r.data.tags for r in children)
    logs = [t.read_text() for t in run_dir.glob("*-s0_*/train.log")]
    # A trial Tune restores from its cut checkpoint says so once, and goes on from its start
    # (Tune keeps one checkpoint per trial: there is no older one).
    noted = [text for text in logs if "state.pt: unreadable (" in text]
    assert noted, logs
    for text in noted:
        assert text.count("unreadable (") == 1 and "no readable checkpoint; training this trial from its start" in text
    assert not list(run_dir.glob("*/error.txt"))  # no attempt failed


def test_the_tracking_server_gone_during_the_shared_setup_is_ridden_out(tmp_path):
    """The server answers the startup check and the parent run is made, then goes away while
    the shared setup runs (under load it takes minutes: the data, the frozen-layer cache, Ray's
    start): the driver says so in one line, the setup's and the trials' writes wait for it, and
    once the server is back the sweep runs to its end, one parent run, every trial FINISHED once."""
    from .test_outage import Server

    server = Server(tmp_path)
    server.start()
    sweep = write_sweep(tmp_path / "gone.yaml", space={"sharing.head_regime": ["S-I-I"]},
                        base={"train": {"epochs": 1}}, max_concurrent=2, tracking={"experiment": "gone", **NO_MODEL})
    log = tmp_path / "driver.log"
    driver = _start(["sweep", "run", str(sweep), "--name", "gone", "--tracking-uri", server.uri, "--num-cpus", "2"],
                    tmp_path, log)
    family: list[int] = []
    try:
        # Printed once the data is tokenized: the parent run exists, Ray has not started.
        _wait_for(lambda: "data: " in log.read_text(), 180, "the shared setup", driver, log)
        server.stop()
        _wait_for(lambda: "tracking store away" in log.read_text(), 120, "the outage line", driver, log)
        family = descendants(driver.pid)
        server.start()
        assert driver.wait(240) == 0, log.read_text()[-4000:]
        text = log.read_text()
        assert "Traceback" not in text and "MlflowException" not in text, text[-4000:]
        assert text.count("tracking store away") == 1, text
        assert "2 trials, 2 finished" in text, text[-3000:]
        client, parents, children = sweep_runs(server.uri, "gone")
        assert len(parents) == 1 and parents[0].info.status == "FINISHED"
        check_children(client, parents[0], children, n=2)
    finally:
        stop_pids([driver.pid, *family, *descendants(driver.pid)], grace_s=5)
        server.stop()


def test_a_trial_killed_by_the_memory_monitor_is_one_line_and_resumes(tmp_path):
    """Ray's memory monitor, set (RAY_memory_usage_threshold, Ray's documented setting) to
    find the node over its threshold at once, kills each trial's worker: every kill is one
    line naming the monitor and what it measured, the runs end FAILED with that reason,
    no Tune traceback or "Trials did not complete" reaches the console, and once memory
    allows, `sweep resume` completes the sweep."""
    sweep = write_sweep(tmp_path / "oom.yaml", space={"sharing.head_regime": ["S-I-I"]},
                        base={"train": {"epochs": 1}}, max_concurrent=2, max_failures=1,
                        tracking={"experiment": "oom", **NO_MODEL})
    run = run_cli(["sweep", "run", str(sweep), "--name", "oom", "--num-cpus", "2"], cwd=tmp_path, timeout=300,
                  RAY_memory_usage_threshold="0.01", RAY_memory_monitor_refresh_ms="100")
    out = run.stdout + run.stderr
    assert run.returncode == 1, out[-3000:]
    for noise in ("Traceback", "Trials did not complete", "Failed to fetch metrics", "Refer to the documentation"):
        assert noise not in out, (noise, out[-3000:])
    failed = [line for line in out.splitlines() if "FAILED " in line]
    assert len(failed) == 2 and all("killed by Ray's memory monitor: Memory usage" in line for line in failed), out
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client, parents, children = sweep_runs(uri, "oom")
    assert parents[0].info.status == "FAILED" and len(children) == 2
    for child in children:
        assert child.info.status == "FAILED", child.info
        assert child.data.tags["error"].startswith("killed by Ray's memory monitor: Memory usage"), child.data.tags

    done = run_cli(["sweep", "resume", "oom", "--num-cpus", "2"], cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    client, parents, children = sweep_runs(uri, "oom")
    check_children(client, parents[0], children, n=2)
    assert parents[0].info.status == "FINISHED"


def test_a_sqlite_store_locked_past_mlflows_busy_timeout_is_one_line(tmp_path):
    """Another process holds the sweep's sqlite store locked for 25 s, past MLflow's own 20 s
    busy timeout: the trials go on, the driver says so in one line (and one when it is back),
    no MLflow ERROR or traceback reaches the console, and nothing is lost."""
    import sqlite3
    import time

    from orchestration.track.tracking import SweepRecord

    sweep = write_sweep(tmp_path / "lock.yaml", space={"sharing.head_regime": ["S-I-I"]},
                        base={"train": {"epochs": 3}, "sampling": {"steps_per_epoch": 60}},
                        max_concurrent=2, tracking={"experiment": "lock", **NO_MODEL})
    log = tmp_path / "driver.log"
    driver = _start(["sweep", "run", str(sweep), "--name", "lock", "--num-cpus", "2"], tmp_path, log)
    family: list[int] = []
    try:
        _wait_for(lambda: sum(t.read_text().count(" epoch ") for t in (tmp_path / "runs" / "lock").glob("*/train.log"))
                  >= 1, 240, "a first epoch", driver, log)
        family = descendants(driver.pid)
        holder = sqlite3.connect(tmp_path / "mlflow.db", isolation_level=None)
        holder.execute("BEGIN EXCLUSIVE")
        time.sleep(25)
        holder.execute("COMMIT")
        holder.close()
        assert driver.wait(240) == 0, log.read_text()[-4000:]
    finally:
        stop_pids([driver.pid, *family, *descendants(driver.pid)], grace_s=5)
    text = log.read_text()
    assert "Traceback" not in text and "ERROR" not in text, text[-4000:]
    assert text.count("tracking store locked (database is locked)") == 1, text[-4000:]
    assert "tracking store back; the waiting MLflow writes follow" in text, text[-3000:]
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client, parents, children = sweep_runs(uri, "lock")
    check_children(client, parents[0], children, n=2)
    assert not SweepRecord(tmp_path / "runs" / "lock", fresh=False).unsynced()  # every run equal to the record


def test_resume_from_a_lagging_tune_state_runs_no_ended_trial_again(tmp_path):
    """Ray Tune's saved state is a snapshot: a driver that dies or stops between a trial's end
    and the next snapshot leaves the trial running there (the memory monitor's kill escaping
    Tune left it so). Here the sweep runs to its end, then its state is put back as it stood
    mid-way: `sweep resume` must not train an ended trial again, and MLflow keeps each run
    as it was, FINISHED once, one point per epoch."""
    from .test_interrupts import _one_point_per_step

    sweep = write_sweep(tmp_path / "lag.yaml", space={"sharing.head_regime": ["S-I-I"]},
                        base={"train": {"epochs": 2}, "sampling": {"steps_per_epoch": 40}},
                        max_concurrent=2, tracking={"experiment": "lag", **NO_MODEL})
    run_dir = tmp_path / "runs" / "lag"
    log = tmp_path / "driver.log"
    driver = _start(["sweep", "run", str(sweep), "--name", "lag", "--num-cpus", "2"], tmp_path, log)
    family: list[int] = []
    try:
        _wait_for(lambda: sum(t.read_text().count(" epoch ") for t in run_dir.glob("*/train.log")) >= 1
                  and list(run_dir.glob("experiment_state-*.json")), 240, "a first epoch", driver, log)
        family = descendants(driver.pid)
        [state] = run_dir.glob("experiment_state-*.json")
        stale = state.read_bytes()  # both trials running
        # Tune's storage as it stood with that snapshot: the checkpoints it may name, which the
        # trials' later checkpoints replace (num_to_keep=1). A driver that died then leaves both.
        kept = tmp_path / "kept"
        for folder in run_dir.glob("*/checkpoint_*"):
            shutil.copytree(folder, kept / folder.relative_to(run_dir))
        assert driver.wait(240) == 0, log.read_text()[-4000:]
    finally:
        stop_pids([driver.pid, *family, *descendants(driver.pid)], grace_s=5)
    state.write_bytes(stale)
    for folder in kept.glob("*/checkpoint_*"):
        if not (run_dir / folder.relative_to(kept)).exists():
            shutil.copytree(folder, run_dir / folder.relative_to(kept))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client, _, before = sweep_runs(uri, "lag")
    ended_at = {r.data.tags["trial_key"]: r.info.end_time for r in before}

    done = run_cli(["sweep", "resume", "lag", "--num-cpus", "2"], cwd=tmp_path, timeout=300)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    assert "start " not in out and "Traceback" not in out, out[-3000:]
    logs = [t.read_text() for t in run_dir.glob("*-s0_*/train.log")]
    assert len(logs) == 2
    for text in logs:
        assert text.count(" pid ") == 1 and "already ended (FINISHED); not run again" in text, text
    client, parents, children = sweep_runs(uri, "lag")
    check_children(client, parents[0], children, n=2)
    _one_point_per_step(client, children)
    assert {r.data.tags["trial_key"]: r.info.end_time for r in children} == ended_at  # untouched
