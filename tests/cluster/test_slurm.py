"""`mtbert sweep slurm` on a real SLURM (tests/cluster/slurm_local.py: munged, slurmctld and a
slurmd on this machine): a sweep runs to the end in a batch job, and a second one, stopped by
SIGTERM as a preemption stops it, closes every MLflow run, requeues itself and resumes to the end.

Skipped, with the reason, where SLURM and munge are not installed or cannot start. The job's
sweep runs on a real Ray started by the job and logs to a real MLflow sqlite store."""
from __future__ import annotations

import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Iterator

import pytest

from tests.cluster.slurm_local import LocalSlurm, unavailable

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "sweeps" / "smoke.yaml"
JOB_TIMEOUT_S = 600.0  # a Ray start, a sweep and its closing on a busy 2-core runner

pytestmark = [pytest.mark.slow, pytest.mark.solo,
              pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))]


@pytest.fixture(scope="module")
def ray_tmp() -> Iterator[Path]:
    """The jobs' Ray folders: short (Ray's socket paths live under them) and removed after."""
    folder = Path(tempfile.mkdtemp(prefix="mtbert-ray-", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSlurm]:
    cluster = LocalSlurm(tmp_path_factory.mktemp("slurm"), cpus=2)
    try:
        try:
            cluster.start()
        except RuntimeError as exc:
            pytest.skip(f"SLURM did not start here: {str(exc).splitlines()[0]}")
        yield cluster
    finally:
        cluster.stop()


def submit(slurm: LocalSlurm, work: Path, ray_tmp: Path, monkeypatch: pytest.MonkeyPatch,
           capsys: pytest.CaptureFixture, extra: tuple[str, ...] = ()) -> str:
    """`mtbert sweep slurm` as a user types it; the job's Python is this one, with this checkout.
    `extra`: more `sweep slurm` options (e.g. --set)."""
    import sys

    from mtbert.cli import main

    for key in ("RAY_ADDRESS", "MLFLOW_TRACKING_URI", "RAY_AUTH_TOKEN"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("SLURM_CONF", str(slurm.conf))
    assert main(["sweep", "slurm", str(SMOKE), "--smoke", "--set", "num_samples=1",
                 "--set", "tracking.log_models=none", "--workdir", str(work), "--cpus-per-node", "2",
                 "--tracking-uri", f"sqlite:///{work}/mlflow.db", "--setup", f"export PYTHONPATH={ROOT}",
                 "--ray-tmp", str(ray_tmp), "--mtbert", f"{sys.executable} -m mtbert.cli", "--ray", str(Path(sys.executable).parent / "ray"),
                 *extra]) == 0
    out = capsys.readouterr().out
    print(out)
    return re.search(r"submitted SLURM job (\d+)", out)[1]


def wait_for(what: str, ready, slurm: LocalSlurm, job_id: str, log: Path, timeout_s: float = JOB_TIMEOUT_S):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = ready()
        if found:
            return found
        time.sleep(1)
    text = log.read_text(errors="replace") if log.exists() else ""
    pytest.fail(f"{what}: not after {timeout_s:.0f}s; job {slurm.job(job_id)}\n{text[-4000:]}")


def runs(work: Path, name: str) -> tuple:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{work}/mlflow.db")
    experiment = client.get_experiment_by_name("smoke-smoke")
    [parent] = client.search_runs([experiment.experiment_id],
                                  filter_string=f"tags.role = 'sweep' and attributes.run_name = '{name}'")
    children = client.search_runs([experiment.experiment_id],
                                  filter_string=f"tags.`mlflow.parentRunId` = '{parent.info.run_id}' and tags.role != 'configuration'")
    return parent, children


def test_a_sweep_runs_in_a_batch_job(slurm: LocalSlurm, tmp_path: Path, ray_tmp: Path, monkeypatch, capsys) -> None:
    job_id = submit(slurm, tmp_path, ray_tmp, monkeypatch, capsys)
    log = tmp_path / f"slurm-{job_id}.out"
    state = wait_for("the job to end", lambda: (j := slurm.job(job_id)).get("JobState") in
                     ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL") and j, slurm, job_id, log)
    text = log.read_text()
    assert state["JobState"] == "COMPLETED" and state["ExitCode"] == "0:0", text[-4000:]
    assert f"sweep smoke-{job_id} FINISHED" in text and "1 of 1 node(s) joined" in text
    parent, children = runs(tmp_path, f"smoke-{job_id}")
    assert parent.info.status == "FINISHED"
    assert len(children) == int(parent.data.tags["num_trials"]) == 2  # the baseline and one point
    assert all(c.info.status == "FINISHED" and "overall" in c.data.metrics for c in children)
    assert len({c.info.run_name for c in children}) == 2  # every trial once


def test_a_preempted_sweep_stops_cleanly_and_its_requeued_job_resumes_it(
        slurm: LocalSlurm, tmp_path: Path, ray_tmp: Path, monkeypatch, capsys) -> None:
    # Trials of seconds (a --smoke trial is under a second on a quiet machine, and would end
    # before the preemption): the preemption goes out once a trial's start line is in the log,
    # a poll (1 s) and a signal's way from the batch shell before the trial could end. Waiting
    # for the status line instead (every 20 s) took trials of 3 x 600 steps, run again on resume.
    job_id = submit(slurm, tmp_path, ray_tmp, monkeypatch, capsys,
                    extra=("--set", "sampling.steps_per_epoch=150", "--set", "train.epochs=3"))
    log = tmp_path / f"slurm-{job_id}.out"
    name = f"smoke-{job_id}"
    # Preempted while its trials run: SIGTERM to the batch shell, as `--signal=B:TERM@GRACE` or a
    # preemption sends it.
    wait_for("a trial to run", lambda: log.exists() and re.search(r"\] start ", log.read_text()),
             slurm, job_id, log)
    signalled = slurm.run(["scancel", "--signal=TERM", "--batch", job_id])
    assert signalled.returncode == 0, signalled.stderr
    wait_for("the job to requeue itself", lambda: "requeueing job" in log.read_text(), slurm, job_id, log)
    # The stopped driver closed every run before the job requeued (the next run needs its Ray
    # first, tens of seconds): nothing is RUNNING.
    parent, children = runs(tmp_path, name)
    assert parent.info.status == "KILLED" and children
    assert not [c.info.run_name for c in children if c.info.status == "RUNNING"]
    text = log.read_text()
    assert f"sweep {name} KILLED" in text
    # Requeued: the job's second run resumes the same sweep, to the end.
    state = wait_for("the requeued job to end", lambda: (j := slurm.job(job_id)).get("Restarts") == "1"
                     and j.get("JobState") in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT") and j,
                     slurm, job_id, log)
    text = log.read_text()
    assert state["JobState"] == "COMPLETED" and state["ExitCode"] == "0:0", text[-4000:]
    assert text.count(f"\nresuming sweep {name} | ") == 1 and f"sweep {name} FINISHED" in text
    parent, children = runs(tmp_path, name)
    assert parent.info.status == "FINISHED"
    assert len(children) == int(parent.data.tags["num_trials"]) == 2
    assert all(c.info.status == "FINISHED" for c in children), [(c.info.run_name, c.info.status) for c in children]
    assert len({c.info.run_name for c in children}) == 2  # every trial once, resumed in its own run
