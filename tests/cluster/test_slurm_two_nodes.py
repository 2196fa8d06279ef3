"""`mtbert sweep slurm --nodes 2` on a real two-node SLURM (tests/cluster/slurm_local.py
NetnsSlurm: each slurmd in a network namespace of its own, node1 and node2, on a bridge with
slurmctld): the job's Ray head on node1 and its worker on node2 reach each other at their
nodes' addresses, the sweep's two trials run one on each node (each node's Ray offers one
CPU, each trial takes one), and MLflow (sqlite on the filesystem the nodes share) holds every
trial FINISHED once, with the node it ran on. From the "login node" (this machine's own
namespace), `mtbert sweep status` finds the job by its id and by its sweep's name, and `sweep
resume` of the finished job and of the running one, and `status` of an unknown id, are one
line each.

One cluster and one job for every check: Ray's start on two nodes and the sweep take one to
three minutes on a 2-core machine. Skipped, with the reason, where SLURM, munge or network
namespaces are not available. Preemption and requeue are tested on one node (test_slurm.py)."""
from __future__ import annotations

import contextlib
import io
import re
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

from tests.cluster.slurm_local import NetnsSlurm, unavailable

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "sweeps" / "smoke.yaml"
JOB_TIMEOUT_S = 480.0  # two Ray nodes, a sweep and its closing on a busy 2-core runner
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")

pytestmark = [pytest.mark.slow, pytest.mark.solo,
              pytest.mark.skipif(unavailable(nodes=2) is not None, reason=str(unavailable(nodes=2)))]


@dataclass
class Run:
    """What one `mtbert` command said."""
    rc: int
    out: str
    err: str


@dataclass
class Job:
    slurm: NetnsSlurm
    work: Path
    job_id: str
    state: dict[str, str]  # scontrol's, once it ended
    log: str
    while_running: dict[str, Run]  # login-node commands run while its trials ran


def mtbert(slurm: NetnsSlurm, folder: Path, *args: str) -> Run:
    """The CLI as a user on the login node (this machine's namespace) types it, in `folder`,
    with the cluster's SLURM_CONF; run in this process (a CLI's imports are seconds of the
    2-core machine the job runs on). The job's own commands are this Python, with this checkout."""
    from mtbert.cli import main

    out, err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SLURM_CONF", str(slurm.conf))
        for key in ("RAY_ADDRESS", "MLFLOW_TRACKING_URI", "RAY_AUTH_TOKEN", "RAY_API_SERVER_ADDRESS"):
            mp.delenv(key, raising=False)
        mp.chdir(folder)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main(list(args))
    return Run(rc, out.getvalue(), err.getvalue())


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Job]:
    cluster = NetnsSlurm(tmp_path_factory.mktemp("slurm2"), cpus=2, nodes=2)
    ray_tmp = Path(tempfile.mkdtemp(prefix="mtbert-ray-", dir="/tmp"))  # short: Ray's socket paths
    work = tmp_path_factory.mktemp("work")
    try:
        try:
            cluster.start()
        except RuntimeError as exc:
            pytest.skip(f"a two-node SLURM did not start here: {str(exc).splitlines()[0]}")
        # One CPU per node's Ray, one per trial: the two trials cannot share a node.
        submitted = mtbert(cluster, work, "sweep", "slurm", str(SMOKE), "--smoke", "--set", "num_samples=1",
                           "--set", "tracking.log_models=none", "--nodes", "2", "--cpus-per-node", "1",
                           "--workdir", str(work), "--tracking-uri", f"sqlite:///{work}/mlflow.db",
                           "--setup", f"export PYTHONPATH={ROOT}", "--ray-tmp", str(ray_tmp),
                           "--mtbert", f"{sys.executable} -m mtbert.cli", "--ray", str(Path(sys.executable).parent / "ray"))
        assert submitted.rc == 0, submitted.err
        print(submitted.out)
        job_id = re.search(r"submitted SLURM job (\d+)", submitted.out)[1]
        log = work / f"slurm-{job_id}.out"
        deadline = time.monotonic() + JOB_TIMEOUT_S
        while_running: dict[str, Run] = {}
        while time.monotonic() < deadline:
            state = cluster.job(job_id)
            if state.get("JobState") in ENDED:
                break
            if state.get("JobState") == "RUNNING" and not while_running and log.exists() and " start " in log.read_text():
                # From the login node while its trials run: where it is, and no second driver.
                while_running["status"] = mtbert(cluster, ROOT, "sweep", "status", job_id)
                while_running["resume"] = mtbert(cluster, ROOT, "sweep", "resume", job_id)
            time.sleep(1)
        else:
            text = log.read_text(errors="replace") if log.exists() else ""
            pytest.fail(f"job {job_id} did not end in {JOB_TIMEOUT_S:.0f}s: {cluster.job(job_id)}\n{text[-4000:]}")
        yield Job(cluster, work, job_id, state, log.read_text(errors="replace"), while_running)
    finally:
        cluster.stop()
        shutil.rmtree(ray_tmp, ignore_errors=True)


def test_the_sweep_runs_its_trials_on_both_nodes(job: Job) -> None:
    from mlflow.tracking import MlflowClient

    name = f"smoke-{job.job_id}"
    assert job.state["JobState"] == "COMPLETED" and job.state["ExitCode"] == "0:0", job.log[-4000:]
    assert "2 of 2 node(s) joined: node1 node2" in job.log and f"sweep {name} FINISHED" in job.log
    assert f"Ray at {job.slurm.address('node1')}:" in job.log  # the head at its node's address
    client = MlflowClient(f"sqlite:///{job.work}/mlflow.db")
    experiment = client.get_experiment_by_name("smoke-smoke")
    [parent] = client.search_runs([experiment.experiment_id],
                                  filter_string=f"tags.role = 'sweep' and attributes.run_name = '{name}'")
    trials = client.search_runs([experiment.experiment_id], filter_string=f"tags.`mlflow.parentRunId` = "
                                f"'{parent.info.run_id}' and tags.role != 'configuration'")
    assert parent.info.status == "FINISHED"
    assert len(trials) == int(parent.data.tags["num_trials"]) == 2  # the baseline and one point
    assert all(t.info.status == "FINISHED" and "overall" in t.data.metrics for t in trials)
    assert len({t.info.run_name for t in trials}) == 2  # every trial once
    # One trial on each node: the trial's node (its hostname) and node address, as Ray reported them.
    where = sorted((t.data.tags.get("node"), t.data.tags.get("node_ip")) for t in trials)
    assert where == [(node, job.slurm.address(node)) for node in ("node1", "node2")], where
    assert parent.data.tags.get("driver_host") == "node1"  # the batch step: the first node


def test_status_and_resume_from_the_login_node(job: Job) -> None:
    name = f"smoke-{job.job_id}"
    status = job.while_running.get("status")
    assert status is not None, "the job ended before the test could look at it running"
    assert status.rc == 0, status.err
    assert status.out.startswith(f"SLURM job {job.job_id}: RUNNING, nodes node[1-2]")
    assert f"  sweep {name} (Ray storage {job.work / 'runs' / name})" in status.out
    resume = job.while_running["resume"]
    assert resume.rc == 2 and resume.err.strip() == (
        f"mtbert: error: SLURM job {job.job_id} is RUNNING: a sweep has one driver at a time; "
        f"`scancel --signal=INT --batch {job.job_id}` stops it cleanly first")
    # Ended: by its id from anywhere (SLURM knows its folder), by its sweep's name in that folder.
    by_id = mtbert(job.slurm, ROOT, "sweep", "status", job.job_id)
    by_name = mtbert(job.slurm, job.work, "sweep", "status", name)
    assert by_id.rc == 0 and by_name.rc == 0 and by_name.out == by_id.out, (by_id.err, by_name.err)
    assert by_id.out.startswith(f"SLURM job {job.job_id}: COMPLETED, nodes node[1-2]")
    assert "  ended FINISHED: 2 trials, 2 finished (0 stopped early), 0 failed" in by_id.out
    finished = mtbert(job.slurm, ROOT, "sweep", "resume", job.job_id)
    assert finished.rc == 2 and finished.err.strip() == (
        f"mtbert: error: sweep {name} (SLURM job {job.job_id}) FINISHED: nothing to resume")
    unknown = mtbert(job.slurm, ROOT, "sweep", "status", "4")  # below the cluster's first job id
    assert unknown.rc == 2 and len(unknown.err.strip().splitlines()) == 1
    assert "4: no SLURM job of that id" in unknown.err
