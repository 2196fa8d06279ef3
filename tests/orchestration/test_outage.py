"""A sweep rides out its tracking server going away: a real `mlflow server` process on
127.0.0.1, stopped by PID mid-sweep and started again on the same port and store."""
from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from orchestration.track.tracking import RECORD_FILE, SweepRecord

from .conftest import SERVER_ENV, cli_env, descendants, free_port, run_cli, stop_pids, write_sweep
from .test_e2e import _wait_for, check_children, sweep_runs

pytestmark = pytest.mark.slow


class Server:
    """`mlflow server` on a fixed port and sqlite store, stoppable and restartable."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.port = free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.proc = None
        self.starts = 0

    def start(self) -> None:
        self.starts += 1
        log = open(self.folder / f"server{self.starts}.log", "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(self.port),
             "--backend-store-uri", f"sqlite:///{self.folder / 'server.db'}",
             "--artifacts-destination", str(self.folder / "artifacts"), "--workers", "1"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=cli_env(**SERVER_ENV))
        deadline = time.monotonic() + 90
        while True:
            try:
                if requests.get(self.uri + "/health", timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                pass
            assert self.proc.poll() is None and time.monotonic() < deadline, \
                (self.folder / f"server{self.starts}.log").read_text()[-3000:]
            time.sleep(0.3)

    def stop(self) -> None:
        if self.proc is not None:
            stop_pids([self.proc.pid, *descendants(self.proc.pid)], grace_s=3)
            self.proc = None


@pytest.fixture
def server(tmp_path):
    s = Server(tmp_path)
    s.start()
    try:
        yield s
    finally:
        s.stop()


def _sweep(tmp_path: Path, **extra) -> Path:
    # Four trials of a few seconds each, two at once: long enough to outlast the outage. No
    # model logged at the end: nothing here reads one (test_mlflow_ui does).
    return write_sweep(tmp_path / "outage.yaml",
                       space={"sharing.head_regime": {"type": "choice", "values": ["S-I-I", "I-S-S", "S-S-S"]}},
                       search={"algorithm": "random", "seed": 0}, num_samples=3, max_concurrent=2,
                       base={"train": {"epochs": 3}, "sampling": {"steps_per_epoch": 120}},
                       baseline={"sharing.head_regime": "I-I-I"}, tracking={"experiment": "outage", "log_models": "none", **extra})


def _child_runs(uri: str) -> int:
    try:
        runs = requests.post(uri + "/api/2.0/mlflow/runs/search", json={"experiment_ids": ["1"],
                             "max_results": 100}, timeout=5).json().get("runs", [])
    except requests.RequestException:
        return 0
    return sum(1 for r in runs for t in r.get("data", {}).get("tags", []) if t["key"] == "trial_key")


def _epoch_lines_between(run_dir: Path, t0: float, t1: float) -> int:
    """train.log epoch lines stamped while the server was down (HH:MM:SS, local time)."""
    def stamp(t: float) -> str:
        return time.strftime("%H:%M:%S", time.localtime(t))
    lo, hi = stamp(t0), stamp(t1)
    n = 0
    for log in run_dir.glob("*/train.log"):
        for line in log.read_text().splitlines():
            if " epoch " in line and lo <= line[:8] <= hi:
                n += 1
    return n


def _start_driver(tmp_path: Path, sweep: Path, uri: str, name: str):
    log = tmp_path / f"{name}.log"
    out = open(log, "w")
    proc = subprocess.Popen([sys.executable, "-m", "mtbert.cli", "sweep", "run", str(sweep), "--name", name,
                             "--tracking-uri", uri, "--num-cpus", "2", "--storage", str(tmp_path / "store")],
                            cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT, env=cli_env(),
                            start_new_session=True)
    return proc, log


def test_short_outage_is_ridden_out(tmp_path, server):
    proc, log = _start_driver(tmp_path, _sweep(tmp_path), server.uri, "short")
    family: list[int] = []
    try:
        _wait_for(lambda: _child_runs(server.uri) >= 1, 180, "a first trial run in MLflow", proc, log)
        family = descendants(proc.pid)
        server.stop()
        down = time.time()
        time.sleep(6)
        # At least 6 s (a write fails and is retried after 0.5, 1 and 2 s: a real outage), and until a
        # trial has trained an epoch while the server is away (on a loaded runner a trial may
        # still be starting); well inside the 180 s the writes wait (tracking.outage_s).
        run_dir = tmp_path / "store" / "short"
        _wait_for(lambda: _epoch_lines_between(run_dir, down, time.time()) >= 1, 90,
                  "an epoch trained during the outage", proc, log)
        server.start()
        up = time.time()
        assert proc.wait(240) == 0, log.read_text()[-4000:]
    finally:
        stop_pids([proc.pid, *family, *descendants(proc.pid)], grace_s=5)
    text = log.read_text()
    assert "Traceback" not in text, text[-4000:]
    assert "4 trials, 4 finished" in text, text[-3000:]
    assert _epoch_lines_between(run_dir, down, up) >= 1  # trials trained while the server was away
    client, parents, children = sweep_runs(server.uri, "outage")
    assert len(parents) == 1
    check_children(client, parents[0], children, n=4)  # every trial once, none RUNNING, all figures
    assert {"leaderboard.md", "leaderboard.csv"} <= {a.path for a in client.list_artifacts(parents[0].info.run_id)}
    assert not SweepRecord(run_dir, fresh=False).unsynced()  # every run equal to the driver's record


def test_long_outage_stops_cleanly_and_resume_completes(tmp_path, server):
    sweep = _sweep(tmp_path, outage_s=6)
    proc, log = _start_driver(tmp_path, sweep, server.uri, "long")
    family: list[int] = []
    try:
        _wait_for(lambda: _child_runs(server.uri) >= 1, 180, "a first trial run in MLflow", proc, log)
        family = descendants(proc.pid)
        server.stop()
        code = proc.wait(180)
    finally:
        stop_pids([proc.pid, *family, *descendants(proc.pid)], grace_s=5)
    text = log.read_text()
    assert code == 2, text[-4000:]
    assert "Traceback" not in text, text[-4000:]
    errors = [line for line in text.splitlines() if line.startswith("mtbert: error:")]
    assert len(errors) == 1, text[-3000:]
    storage = tmp_path / "store"
    assert re.fullmatch(
        rf"mtbert: error: tracking server {re.escape(server.uri)} unreachable for \dm\d\ds \(.+\); the sweep "
        rf"stopped and keeps \d+ unsent MLflow write\(s\) in {re.escape(str(storage / 'long' / RECORD_FILE))}: "
        rf"`\S*mtbert sweep resume long --storage {re.escape(str(storage))}` once it is back", errors[0]), errors[0]
    assert SweepRecord(storage / "long", fresh=False).unsynced()  # what MLflow lacks waits in the record on disk

    server.start()
    command = re.search(r"`\S*mtbert (sweep resume [^`]+)`", errors[0]).group(1).split()
    elsewhere = tmp_path / "elsewhere"  # --storage finds the sweep from any folder
    elsewhere.mkdir()
    done = run_cli([*command, "--num-cpus", "2"], cwd=elsewhere, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Traceback" not in done.stdout + done.stderr
    client, parents, children = sweep_runs(server.uri, "outage")
    assert len(parents) == 1
    check_children(client, parents[0], children, n=4)
    assert not any(r.data.tags.get("interrupted", "false") != "false" for r in children)
