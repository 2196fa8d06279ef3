"""A sweep submitted as a Ray Job, followed, stopped and resumed from "the laptop" (the CLI in
a folder without the project), against a real local Ray head started the way a user starts
one from a virtualenv: `.venv/bin/ray start --head`, its PATH without the virtualenv, so the
head's `python` has no Ray.

The head is started in its own process group and ended by its PID (never `ray stop`).
"""
from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from tests.cluster.test_two_node_cluster import BIN, START_TIMEOUT_S, free_port, start, stop_all, wait_http
from tests.orchestration.conftest import write_sweep

pytestmark = [pytest.mark.slow, pytest.mark.solo,
              pytest.mark.skipif(not (BIN / "ray").exists(), reason="needs the ray executable of this venv")]


def _path_without_venv() -> str:
    return os.pathsep.join(p for p in os.environ.get("PATH", "/usr/bin:/bin").split(os.pathsep)
                           if p and Path(p).resolve() != BIN.resolve())


@pytest.fixture(scope="module")
def head(tmp_path_factory) -> Iterator[tuple[str, dict[str, str], Path]]:
    tmp = tmp_path_factory.mktemp("head")
    logs = tmp / "logs"
    logs.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "MLFLOW_")) and k != "PYTHONPATH"}
    env.update(PATH=_path_without_venv(), RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="token",
               RAY_AUTH_TOKEN=secrets.token_hex(16))
    dash = free_port()
    proc = start("ray-head", [str(BIN / "ray"), "start", "--head", "--block", "--port", str(free_port()),
                              "--dashboard-host", "127.0.0.1", "--dashboard-port", str(dash),
                              "--dashboard-agent-listen-port", str(free_port()),
                              "--ray-client-server-port", str(free_port()), "--num-cpus", "1",
                              "--disable-usage-stats"], env, logs)
    try:
        url = f"http://127.0.0.1:{dash}"
        wait_http(f"{url}/api/gcs_healthz", proc, time.monotonic() + START_TIMEOUT_S)
        # What the laptop holds: the token, the project (this venv), no MLflow credentials.
        laptop = {k: v for k, v in env.items() if k != "PATH"}
        laptop["PATH"] = os.environ.get("PATH", "")
        yield url, laptop, tmp
    finally:
        stop_all([proc])


def mtbert(args: list[str], env: dict[str, str], cwd: Path, timeout: float = 400) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mtbert.cli", *args], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)


def job_logs(url: str, job: str, env: dict[str, str]) -> tuple[str, str]:
    """(status, log) of a job, read in a fresh interpreter (the Ray token lives in its env)."""
    code = ("import json, sys; from ray.job_submission import JobSubmissionClient as C; c = C(sys.argv[1]); "
            "print(json.dumps([c.get_job_status(sys.argv[2]).value, c.get_job_logs(sys.argv[2])]))")
    out = subprocess.run([sys.executable, "-c", code, url, job], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    status, log = json.loads(out.stdout.strip().splitlines()[-1])
    return status, log


def _job_id(out: str) -> str:
    return re.search(r"submitted job (\S+) to ", out)[1]


def test_submitted_sweep_reports_stops_and_resumes_from_the_laptop(head) -> None:
    url, env, tmp = head
    folder, work = tmp / "laptop", tmp / "shared-work"
    folder.mkdir()
    write_sweep(folder / "tiny.yaml", space={"sharing.head_regime": {"type": "grid", "values": ["S-I-I", "I-S-S"]}},
                base={"train": {"epochs": 3}, "sampling": {"steps_per_epoch": 400}}, max_concurrent=1,
                tracking={"experiment": "jobs", "log_models": "none"})
    store = f"sqlite:///{tmp / 'mlflow.db'}"  # the head is this machine: it reaches the file
    out = mtbert(["sweep", "submit", "tiny.yaml", "--address", url, "--no-follow", "--workdir", str(work),
                  "--tracking-uri", store, "--name", "r1"], env, folder)
    assert out.returncode == 0, out.stderr
    job = _job_id(out.stdout)

    deadline = time.monotonic() + 300
    while True:  # until a trial has finished: then stop the sweep halfway
        state, log = job_logs(url, job, env)
        assert state in ("PENDING", "RUNNING"), log[-3000:]
        # Trials long enough (3 x 400 steps) that the next one is still running when the stop lands.
        if "done    " in log or time.monotonic() > deadline:
            break
        time.sleep(2)
    # Status from the laptop: the sweep, its folder on the head, its trials.
    status = mtbert(["sweep", "status", job, "--address", url], env, folder)
    assert status.returncode == 0 and status.stdout.startswith(f"{job}: RUNNING"), status.stdout + status.stderr
    assert f"  sweep r1 (Ray storage on the head: {work}/runs/r1)" in status.stdout
    # One driver at a time: a resume of a running sweep is refused in one line.
    refused = mtbert(["sweep", "resume", job, "--address", url], env, folder)
    assert refused.returncode == 2
    assert refused.stderr.strip().startswith(f"mtbert: error: job {job} is RUNNING: a sweep has one driver")

    assert mtbert(["sweep", "stop", job, "--address", url], env, folder).stdout.strip() == f"{job}: stop requested"
    while job_logs(url, job, env)[0] not in ("STOPPED", "FAILED", "SUCCEEDED") and time.monotonic() < deadline:
        time.sleep(2)
    status = mtbert(["sweep", "status", job, "--address", url], env, folder)
    assert status.stdout.startswith(f"{job}: STOPPED"), status.stdout

    resumed = mtbert(["sweep", "resume", job, "--address", url], env, folder, timeout=500)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "resuming sweep r1" in resumed.stdout
    again = _job_id(resumed.stdout)
    status = mtbert(["sweep", "status", again, "--address", url], env, folder)
    assert status.stdout.startswith(f"{again}: SUCCEEDED"), status.stdout
    assert "  sweep r1\n" in status.stdout
    assert re.search(r"  trials at \d+:\d\d: 0 running, \d finished, \d stopped early, 0 failed, 0 pending of 3 "
                     r"\| best best_overall ", status.stdout), status.stdout
    assert "  ended FINISHED: 3 trials, 3 finished" in status.stdout

    from mlflow.tracking import MlflowClient

    mlflow = MlflowClient(store)
    experiment = mlflow.get_experiment_by_name("jobs")
    runs = mlflow.search_runs([experiment.experiment_id], max_results=100)
    parents = [r for r in runs if r.data.tags.get("role") == "sweep"]
    assert [p.info.status for p in parents] == ["FINISHED"]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parents[0].info.run_id
                and "trial_key" in r.data.tags]
    assert sorted(r.data.tags["trial_key"] for r in children) == ["baseline-s0", "p000-s0", "p001-s0"]
    assert all(r.info.status == "FINISHED" for r in children)


def test_an_interpreter_without_the_project_fails_in_one_line(head) -> None:
    url, env, tmp = head
    folder = tmp / "laptop-bare"
    folder.mkdir()
    write_sweep(folder / "tiny.yaml", tracking={"experiment": "bare"})
    bare = tmp / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True, timeout=120)
    python = str(bare / "bin" / "python")
    out = mtbert(["sweep", "submit", "tiny.yaml", "--address", url, "--python", python], env, folder)
    assert out.returncode == 2
    line = out.stderr.strip().splitlines()[-1]
    # mtbert itself comes with the job (its upload); the third-party packages must be there.
    assert re.fullmatch(rf"mtbert: error: job (\S+) FAILED: the job interpreter {re.escape(python)} on the head "
                        r"lacks ray, mlflow, torch; give `sweep submit --python` a Python of the head that has "
                        r"them \(docs/cluster\.md\)", line), line
    job = _job_id(out.stdout)
    status = mtbert(["sweep", "status", job, "--address", url], env, folder)
    assert status.stdout.splitlines()[0] == f"{job}: FAILED: " + line.split(" FAILED: ", 1)[1]
