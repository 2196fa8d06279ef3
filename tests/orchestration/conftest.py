"""Helpers for the orchestration tests: tiny sweep files, the CLI in a subprocess, free ports."""
from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import requests
import yaml

ROOT = Path(__file__).resolve().parents[2]
SWEEPS = ROOT / "sweeps"
SHARED = ROOT / ".." / "shared"

# A sweep small enough to train for real in seconds: tiny encoder, synthetic data.
TINY_BASE = {
    "model": {"name_or_path": "tiny", "tiny": {"layers": 2, "hidden": 32, "heads": 2, "intermediate": 64},
              "max_length": 32},
    "data": {"source": "synthetic", "synthetic": {"train_size": 96, "dev_size": 48}},
    "train": {"epochs": 2, "batch_size": 8, "device": "cpu"},
    "sampling": {"steps_per_epoch": 4},
}


def write_sweep(path: Path, **sections) -> Path:
    """A sweep file: TINY_BASE plus the given top-level sections (base merges key by key)."""
    from mtbert.config import merge

    doc = {"base": merge(TINY_BASE, sections.pop("base", {}))}
    doc.update(sections)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def new_experiment(client, name: str) -> str:
    """An experiment whose artifacts live beside its sqlite store. MLflow's default is ./mlruns
    of the working folder, which under pytest is the repository."""
    store = Path(client.tracking_uri.removeprefix("sqlite:///")).parent
    return client.create_experiment(name, artifact_location=(store / "mlartifacts" / name).as_uri())


def free_port() -> int:
    """A free port below the kernel's ephemeral range (32768 and up here), where Ray's own
    services take theirs as they start: a port drawn from that range can be taken by the head
    before the process it was meant for binds it. Above Ray's worker ports (10002-19999)."""
    for port in random.sample(range(20000, 32768), 200):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 20000-32767")


def cli_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("MLFLOW_TRACKING_URI", None)
    env.pop("RAY_ADDRESS", None)
    env.update(extra)
    return env


def run_cli(args: list[str], cwd: Path, timeout: float = 240, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mtbert.cli", *args], cwd=cwd, env=cli_env(**env),
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def sweep_file(tmp_path):
    def make(name: str = "tiny.yaml", **sections) -> Path:
        return write_sweep(tmp_path / name, **sections)
    return make


def descendants(pid: int) -> list[int]:
    """PIDs of every process below `pid` (Linux /proc), found while they are still below it."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    try:  # a zombie is gone for our purposes
        return stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def stop_pids(pids: list[int], grace_s: float = 10.0) -> None:
    """SIGTERM each of our processes by PID, then SIGKILL those still there after `grace_s`."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_s
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        if not any(_alive(p) for p in pids):
            return


# As docker/compose.yaml runs it: no server-side jobs (GenAI scorers, trace archival), whose
# consumer processes would each load all of MLflow at every start.
SERVER_ENV = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}


@contextmanager
def mlflow_server_at(root: Path, start_timeout_s: float = 120) -> Iterator[str]:
    """A real `mlflow server` on a free 127.0.0.1 port, its store and artifacts under `root`:
    yields its URI once /health answers; stopped by PID (with its workers) on the way out."""
    port = free_port()
    log = open(root / "server.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
         "--backend-store-uri", f"sqlite:///{root / 'server.db'}",
         "--artifacts-destination", str(root / "artifacts"), "--workers", "1"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=cli_env(**SERVER_ENV))
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + start_timeout_s
        while True:
            try:
                if requests.get(uri + "/health", timeout=2).status_code == 200:
                    break
            except requests.RequestException:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, (root / "server.log").read_text()
            time.sleep(0.5)
        yield uri
    finally:
        stop_pids([proc.pid, *descendants(proc.pid)], grace_s=3)
        log.close()


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory) -> Iterator[str]:
    """One `mlflow server` for the tests that only talk to it, each in its own experiment
    (tests/conftest.py runs them on one worker). A test that stops or restarts its server
    starts its own (test_outage)."""
    with mlflow_server_at(tmp_path_factory.mktemp("mlflow-server")) as uri:
        yield uri
