"""A real two-node Ray cluster and a real MLflow server on this machine.

The head (its own IP) and a worker on 127.0.0.2 are two `ray start --block` processes with one
CPU each and Ray token authentication on, as in docker/compose.yaml. The MLflow server runs
the basic-auth app with docker/mlflow/basic_auth.ini and the allowed hosts of compose.yaml,
and the sweep user is created by docker/mlflow/ensure_user.py. Where the machine allows a
private mount namespace, the worker sees an empty tmpfs over one folder the head sees full:
a path visible on one node only, as on a cluster without a shared volume.

Every process is started in its own process group, ended by its PID, and whatever of its
group outlives it is killed by that group's id (never `ray stop`).
"""
from __future__ import annotations

import json
import os
import re
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import pytest
import yaml

from tests.orchestration.conftest import free_port

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
BIN = Path(sys.executable).parent
WORKER_IP = "127.0.0.2"
START_TIMEOUT_S = 240.0  # two Ray nodes and an MLflow server on a busy 2-core runner

pytestmark = [pytest.mark.slow, pytest.mark.solo,
              pytest.mark.skipif(not (BIN / "ray").exists() or not (BIN / "mlflow").exists(),
                                 reason="needs the ray and mlflow executables of this venv")]


def can_hide_a_folder(folder: Path) -> bool:
    """A private mount namespace with a tmpfs: root, or a runner that allows it."""
    if shutil.which("unshare") is None:
        return False
    out = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                          f"mount -t tmpfs tmpfs {shlex.quote(str(folder))}"],
                         capture_output=True, timeout=30)
    return out.returncode == 0


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen
    log: Path

    def tail(self, lines: int = 30) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def terminate(self) -> None:
        """SIGTERM to the leader only: `ray start --block` then shuts its node down in order
        (a signal to the whole group makes every Ray process race and takes ~30 s)."""
        if self.popen.poll() is None:
            self.popen.terminate()

    def reap(self, timeout_s: float) -> None:
        try:
            self.popen.wait(timeout_s)
        except subprocess.TimeoutExpired:
            pass
        try:  # whatever of the group outlived its leader
            os.killpg(self.popen.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.popen.wait(10)


def stop_all(procs: list[Proc], timeout_s: float = 30.0) -> None:
    for proc in procs:
        proc.terminate()
    deadline = time.monotonic() + timeout_s
    for proc in procs:
        proc.reap(max(deadline - time.monotonic(), 0.1))


def start(name: str, cmd: list[str], env: dict[str, str], logs: Path, cwd: Path | None = None) -> Proc:
    log = logs / f"{name}.log"
    with log.open("w") as out:
        popen = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                                 start_new_session=True)
    return Proc(name, popen, log)


def wait_http(url: str, proc: Proc, deadline: float) -> None:
    while time.monotonic() < deadline:
        if proc.popen.poll() is not None:
            pytest.fail(f"{proc.name} exited ({proc.popen.returncode}):\n{proc.tail()}")
        try:
            with urllib.request.urlopen(url, timeout=5) as reply:
                if reply.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    pytest.fail(f"{proc.name}: {url} not up after {START_TIMEOUT_S:.0f}s:\n{proc.tail()}")


@dataclass
class Stack:
    gcs: str
    dashboard: str
    head_agent: str
    worker_agent: str
    mlflow: str
    admin: tuple[str, str]
    sweeper: tuple[str, str]
    ray_env: dict[str, str]  # what every cluster process and client gets: the Ray token
    hidden: Path | None  # present on the head, empty on the worker (None: not possible here)
    tmp: Path
    procs: list[Proc] = field(default_factory=list)


def base_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RAY_", "MLFLOW_")) and k not in ("PYTHONPATH",)}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    return env


def compose_mlflow_settings() -> dict[str, str]:
    """The mlflow service's plain settings from compose.yaml (not its secrets or S3/PG wiring)."""
    env = yaml.safe_load((DOCKER / "compose.yaml").read_text())["services"]["mlflow"]["environment"]
    return {k: str(env[k]) for k in ("MLFLOW_SERVER_ALLOWED_HOSTS", "MLFLOW_SERVER_ENABLE_JOB_EXECUTION")}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("cluster")
    logs = tmp / "logs"
    logs.mkdir()
    ray_env = {**base_env(), "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(16)}
    admin = ("admin", secrets.token_hex(16))
    sweeper = ("sweeps", secrets.token_hex(16))
    gcs_port, dash_port, head_agent, worker_agent, mlflow_port = (free_port() for _ in range(5))
    hidden = tmp / "head-only"
    hidden.mkdir()
    worker_tmp = None
    (hidden / "train.csv").write_text("id\tsentence\tlabel\n")
    if not can_hide_a_folder(hidden):
        hidden = None
    s = Stack(f"127.0.0.1:{gcs_port}", f"http://127.0.0.1:{dash_port}", f"http://127.0.0.1:{head_agent}",
              f"http://{WORKER_IP}:{worker_agent}", f"http://127.0.0.1:{mlflow_port}", admin, sweeper,
              ray_env, hidden, tmp)
    try:
        # MLflow: the compose configuration, with sqlite and a local folder in place of
        # PostgreSQL and MinIO.
        auth_ini = tmp / "basic_auth.ini"
        auth_ini.write_text((DOCKER / "mlflow" / "basic_auth.ini").read_text()
                            .replace("sqlite:////mlflow/auth/basic_auth.db", f"sqlite:///{tmp}/auth.db"))
        mlflow_env = {**base_env(), "MLFLOW_AUTH_CONFIG_PATH": str(auth_ini),
                      "MLFLOW_AUTH_ADMIN_USERNAME": admin[0], "MLFLOW_AUTH_ADMIN_PASSWORD": admin[1],
                      "MLFLOW_FLASK_SERVER_SECRET_KEY": secrets.token_hex(16),
                      **compose_mlflow_settings()}
        mlflow = start("mlflow", [str(BIN / "mlflow"), "server", "--app-name", "basic-auth",
                                  "--host", "127.0.0.1", "--port", str(mlflow_port), "--workers", "1",
                                  "--backend-store-uri", f"sqlite:///{tmp}/mlflow.db",
                                  "--serve-artifacts", "--artifacts-destination", str(tmp / "artifacts")],
                       mlflow_env, logs, cwd=tmp)
        s.procs.append(mlflow)
        # Head: runs sweep drivers and logs to MLflow as the sweep user (compose: ray-head).
        head_env = {**ray_env, "MLFLOW_TRACKING_USERNAME": sweeper[0], "MLFLOW_TRACKING_PASSWORD": sweeper[1]}
        head = start("ray-head", [str(BIN / "ray"), "start", "--head", "--block", "--port", str(gcs_port),
                                  "--dashboard-host", "127.0.0.1", "--dashboard-port", str(dash_port),
                                  "--dashboard-agent-listen-port", str(head_agent),
                                  "--ray-client-server-port", str(free_port()),
                                  "--num-cpus", "1", "--disable-usage-stats"], head_env, logs)
        s.procs.append(head)
        deadline = time.monotonic() + START_TIMEOUT_S
        wait_http(f"{s.dashboard}/api/gcs_healthz", head, deadline)
        # The worker keeps its own Ray folder, as a second machine would. Sharing the head's, its
        # runtime-env agent re-extracted a job's working directory over the one the head's job
        # driver was importing from (a ModuleNotFoundError inside the job). Short: Ray's socket
        # paths live under it.
        worker_tmp = tempfile.mkdtemp(prefix="mtbert-rw-", dir="/tmp")
        worker_cmd = [str(BIN / "ray"), "start", "--address", s.gcs, "--block", "--node-ip-address", WORKER_IP,
                      "--num-cpus", "1", "--dashboard-agent-listen-port", str(worker_agent),
                      "--temp-dir", worker_tmp, "--disable-usage-stats"]
        if hidden is not None:
            worker_cmd = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                          f'mount -t tmpfs tmpfs {shlex.quote(str(hidden))} && exec "$@"', "sh", *worker_cmd]
        worker = start("ray-worker", worker_cmd, ray_env, logs)
        s.procs.append(worker)
        wait_http(f"{s.worker_agent}/api/local_raylet_healthz", worker, deadline)
        # MLflow keeps starting while the Ray-only tests run; `tracking` waits for it.
        yield s
    finally:
        stop_all(list(reversed(s.procs)))
        if worker_tmp:
            shutil.rmtree(worker_tmp, ignore_errors=True)


def ensure_user(stack: Stack) -> str:
    """docker/mlflow/ensure_user.py's main, as compose's mlflow-init runs it: signed in as the
    admin. Returns what it printed."""
    import importlib.util
    from contextlib import redirect_stdout
    from io import StringIO

    spec = importlib.util.spec_from_file_location("ensure_user", DOCKER / "mlflow" / "ensure_user.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = StringIO()
    with pytest.MonkeyPatch.context() as env, redirect_stdout(out):
        for key, value in (("MLFLOW_TRACKING_USERNAME", stack.admin[0]), ("MLFLOW_TRACKING_PASSWORD", stack.admin[1]),
                           ("MLFLOW_SWEEP_USERNAME", stack.sweeper[0]), ("MLFLOW_SWEEP_PASSWORD", stack.sweeper[1])):
            env.setenv(key, value)
        assert module.main([stack.mlflow]) == 0
    return out.getvalue().strip()


@pytest.fixture(scope="module")
def tracking(stack: Stack) -> Stack:
    """The stack once MLflow is up and the sweep user exists."""
    mlflow = next(p for p in stack.procs if p.name == "mlflow")
    wait_http(f"{stack.mlflow}/health", mlflow, time.monotonic() + START_TIMEOUT_S)
    assert ensure_user(stack) == f"MLflow user {stack.sweeper[0]} created"
    return stack


def run_python(code: str, env: dict[str, str], cwd: Path = ROOT, timeout: float = 300) -> dict:
    """Run `code` in a fresh interpreter (its own Ray connection and token); it prints one
    `RESULT <json>` line."""
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=cwd, capture_output=True,
                         text=True, timeout=timeout)
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    assert out.returncode == 0 and lines, f"rc={out.returncode}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return json.loads(lines[-1][len("RESULT "):])


def mlflow_client(stack: Stack, monkeypatch: pytest.MonkeyPatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", stack.sweeper[0])
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", stack.sweeper[1])
    return MlflowClient(stack.mlflow)


def sweep_runs(client, name: str) -> tuple:
    experiment = client.get_experiment_by_name("smoke-smoke")  # every sweep here runs --smoke
    parents = client.search_runs([experiment.experiment_id],
                                 filter_string=f"tags.role = 'sweep' and attributes.run_name = '{name}'")
    assert len(parents) == 1, f"no single parent run named {name}"
    parent = parents[0]
    children = client.search_runs([experiment.experiment_id],
                                  filter_string=f"tags.`mlflow.parentRunId` = '{parent.info.run_id}' and tags.role != 'configuration'")
    return parent, children


# ------------------------------------------------- Ray only (MLflow may still be starting)

def test_health_endpoints_answer_the_image_health_check(stack: Stack) -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("healthcheck", DOCKER / "healthcheck.py")
    check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check)
    # The URLs compose.yaml and the KubeRay probes use, on this cluster's ports.
    assert check.main([f"{stack.dashboard}/api/gcs_healthz", f"{stack.head_agent}/api/local_raylet_healthz"]) == 0
    assert check.main([f"{stack.worker_agent}/api/local_raylet_healthz"]) == 0
    # Everything else on the dashboard needs the token.
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(f"{stack.dashboard}/api/jobs/", timeout=10)
    assert info.value.code == 401


WRONG_TOKEN = """
import json
from orchestration.run import jobs
try:
    jobs.status("mtbert-x", {dashboard!r})
except jobs.ClusterAuthError as exc:
    print("RESULT " + json.dumps(str(exc)))
"""


def test_a_wrong_token_is_refused_in_one_line(stack: Stack) -> None:
    env = {**stack.ray_env, "RAY_AUTH_TOKEN": "not-the-cluster-token"}
    message = run_python(WRONG_TOKEN.format(dashboard=stack.dashboard), env)
    assert message.startswith(f"the Ray cluster at {stack.dashboard} refused the request")
    assert "RAY_AUTH_TOKEN" in message and "\n" not in message


NODE_CHECKS = """
import json, ray
from orchestration.run.remote import NodePathError, check_paths_on_nodes, check_shared_storage
ray.init(address={gcs!r}, logging_level="ERROR", log_to_driver=False)
result = {{"nodes": sorted(n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"])}}
def outcome(fn, *args):
    try:
        fn(*args)
        return None
    except NodePathError as exc:
        return str(exc)
result["present"] = outcome(check_paths_on_nodes, {{"data.dir": {shared!r}}})
result["absent"] = outcome(check_paths_on_nodes, {{"data.dir": {absent!r}, "model.name_or_path": {model!r}}})
result["storage"] = outcome(check_shared_storage, {shared!r})
if {hidden!r}:
    result["hidden"] = outcome(check_paths_on_nodes, {{"data.files.sst.train": {hidden!r} + "/train.csv"}})
    result["hidden_storage"] = outcome(check_shared_storage, {hidden!r})
print("RESULT " + json.dumps(result))
"""


def test_node_checks_run_on_every_node(stack: Stack) -> None:
    shared = stack.tmp / "shared"
    shared.mkdir(exist_ok=True)
    code = NODE_CHECKS.format(gcs=stack.gcs, shared=str(shared), absent=str(stack.tmp / "no-data"),
                              model=str(stack.tmp / "no-model"), hidden=str(stack.hidden or ""))
    result = run_python(code, stack.ray_env)
    assert len(result["nodes"]) == 2 and WORKER_IP in result["nodes"]
    assert result["present"] is None and result["storage"] is None
    message = result["absent"]
    # One line; every node named, every missing key with its path.
    assert "\n" not in message and message.count("cannot see data.dir") == 2
    assert f"({WORKER_IP}, " in message and message.count("model.name_or_path") == 2
    if stack.hidden is None:
        pytest.skip("no private mount namespace here: cannot hide a folder from one node")
    hidden = result["hidden"]
    assert hidden.startswith("node ") and f"({WORKER_IP}, " in hidden and hidden.count("cannot see") == 1
    assert f"data.files.sst.train {stack.hidden}/train.csv" in hidden
    assert f"({WORKER_IP}, " in result["hidden_storage"]
    assert "has a different folder there" in result["hidden_storage"]


PROBE = """
import json, ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
ray.init(logging_level="ERROR", log_to_driver=False)
@ray.remote(num_cpus=0)
def where():
    import mtbert, orchestration
    return [mtbert.__file__, orchestration.__file__]
import mtbert
worker = next(n["NodeID"] for n in ray.nodes() if n["Alive"] and n["NodeManagerAddress"] == {worker_ip!r})
task = where.options(scheduling_strategy=NodeAffinitySchedulingStrategy(worker, soft=False)).remote()
print("PROBE " + json.dumps({{"driver": mtbert.__file__, "worker": ray.get(task)}}))
"""


SUBMIT_PROBE = """
import json, time
from ray.job_submission import JobSubmissionClient
from orchestration.run import jobs
client = JobSubmissionClient({dashboard!r})
job = client.submit_job(entrypoint="python probe.py", runtime_env=jobs.runtime_env(__import__("pathlib").Path({folder!r})))
while client.get_job_status(job).value not in ("SUCCEEDED", "FAILED", "STOPPED"):
    time.sleep(0.5)
logs = client.get_job_logs(job)
line = next((l for l in logs.splitlines() if l.startswith("PROBE ")), None)
print("RESULT " + json.dumps({{"status": client.get_job_status(job).value, "probe": line, "logs": logs[-2000:]}}))
"""


def test_job_code_reaches_nodes_without_the_project(stack: Stack) -> None:
    # A folder without the project: mtbert and orchestration must arrive as py_modules, on
    # the driver and on the worker node, not from this machine's install.
    folder = stack.tmp / "elsewhere"
    folder.mkdir()
    (folder / "probe.py").write_text(PROBE.format(worker_ip=WORKER_IP))
    result = run_python(SUBMIT_PROBE.format(dashboard=stack.dashboard, folder=str(folder)), stack.ray_env)
    assert result["status"] == "SUCCEEDED", result["logs"]
    probe = json.loads(result["probe"][len("PROBE "):])
    for path in [probe["driver"], *probe["worker"]]:
        assert "runtime_resources" in path and str(ROOT) not in path, path


# --------------------------------------------------------------------------- MLflow and sweeps
# The sweeps here log no model (tracking.log_models=none): these tests read runs, not models
# (test_mlflow_ui does), and logging one costs seconds.

def test_mlflow_requires_sign_in_and_accepts_the_service_name(tracking: Stack) -> None:
    import requests

    stack = tracking
    assert requests.get(f"{stack.mlflow}/health", timeout=30).status_code == 200  # the image's probe
    url = f"{stack.mlflow}/api/2.0/mlflow/experiments/search?max_results=1"
    assert requests.get(url, timeout=30).status_code == 401
    assert requests.get(url, auth=stack.sweeper, timeout=30).status_code == 200
    # The Ray head reaches MLflow as http://mlflow:5000; a foreign Host is refused.
    assert requests.get(url, auth=stack.sweeper, headers={"Host": "mlflow:5000"}, timeout=30).status_code == 200
    assert requests.get(url, auth=stack.sweeper, headers={"Host": "evil.example"}, timeout=30).status_code == 403
    # ensure_user is idempotent and makes the env file the source of truth for the password.
    assert ensure_user(stack) == f"MLflow user {stack.sweeper[0]} updated"


def test_sweep_on_the_cluster_uses_both_nodes(tracking: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    stack = tracking
    driver_dir = stack.tmp / "driver"
    driver_dir.mkdir()
    env = {**stack.ray_env, "MLFLOW_TRACKING_USERNAME": stack.sweeper[0],
           "MLFLOW_TRACKING_PASSWORD": stack.sweeper[1]}
    out = subprocess.run([sys.executable, "-m", "mtbert.cli", "sweep", "run", str(ROOT / "sweeps" / "smoke.yaml"),
                          "--smoke", "--set", "num_samples=1", "--set", "tracking.log_models=none",
                          "--address", stack.gcs,
                          "--tracking-uri", stack.mlflow, "--name", "two-nodes"], env=env, cwd=driver_dir, capture_output=True,
                         text=True, timeout=400)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    parent, children = sweep_runs(mlflow_client(stack, monkeypatch), "two-nodes")
    assert parent.info.status == "FINISHED"
    assert len(children) == int(parent.data.tags["num_trials"]) == 2  # the baseline and one point
    assert all(c.info.status == "FINISHED" for c in children)
    assert all("overall" in c.data.metrics for c in children)
    # One CPU per node and both trials started at once: one ran on each node.
    ips = {c.data.tags.get("node_ip") for c in children}
    assert WORKER_IP in ips and len(ips) == 2, ips


JOB = """
import json, time
from ray.job_submission import JobSubmissionClient
from orchestration.run import jobs
job = jobs.submit("sweeps/smoke.yaml", {dashboard!r}, ["--smoke", "--set", "num_samples=1", "--name", "as-a-job",
                                                     "--set", "tracking.log_models=none"],
                  {mlflow!r}, follow=True, workdir={workdir!r})
state = jobs.status(job, {dashboard!r})
result = {{"job": job, "status": state.status, "stopped": jobs.stop(job, {dashboard!r})}}
try:
    jobs.status("mtbert-no-such-job", {dashboard!r})
except jobs.UnknownJob as exc:
    result["unknown"] = str(exc)
# To be stopped while its trials run (it starts up while the next job fails).
job = jobs.submit("sweeps/smoke.yaml", {dashboard!r}, ["--smoke", "--set", "num_samples=1", "--name", "stopped-job"],
                  {mlflow!r}, follow=False, workdir={workdir!r})
try:  # a misspelled key is one line before anything is submitted
    jobs.submit("sweeps/smoke.yaml", {dashboard!r}, ["--smoke", "--set", "num_sample=2"], {mlflow!r})
except jobs.JobFailed as exc:
    result["refused"] = "submitted: " + str(exc)
except jobs.JobError as exc:
    result["refused"] = str(exc)
try:  # a sweep error met only on the cluster (its data folder, which the submitter cannot check) is one line
    jobs.submit("sweeps/smoke.yaml", {dashboard!r}, ["--set", "data.source=cs224n", "--set", "data.dir=/no/such/data"],
                {mlflow!r})
except jobs.JobFailed as exc:
    result["failed"] = str(exc)
client = JobSubmissionClient({dashboard!r})
deadline = time.monotonic() + 240
while "start   " not in client.get_job_logs(job) and time.monotonic() < deadline:
    time.sleep(0.5)
result["stop_requested"] = jobs.stop(job, {dashboard!r})
while jobs.status(job, {dashboard!r}).status not in jobs.TERMINAL and time.monotonic() < deadline:
    time.sleep(0.5)
result["stopped_status"] = jobs.status(job, {dashboard!r}).status
print("RESULT " + json.dumps(result))
"""


def test_sweep_as_a_ray_job(tracking: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    stack = tracking
    workdir = stack.tmp / "shared-work"
    # The submitter holds the Ray token only: MLflow credentials stay on the head.
    result = run_python(JOB.format(dashboard=stack.dashboard, mlflow=stack.mlflow, workdir=str(workdir)),
                        stack.ray_env, cwd=ROOT, timeout=400)
    assert result["status"] == "SUCCEEDED"
    assert result["stopped"] is False  # already ended
    assert result["unknown"] == f"no job mtbert-no-such-job on the Ray cluster at {stack.dashboard}"
    assert result["refused"] == "sweeps/smoke.yaml: base: num_sample: unknown key (did you mean 'sampling'?)"
    assert re.fullmatch(r"job mtbert-smoke-\S+ FAILED: data.dir: /no/such/data not found", result["failed"]), \
        result["failed"]
    # The sweep ran in --workdir, so its Tune storage is there (a shared folder on a cluster).
    assert (workdir / "runs" / "as-a-job").is_dir()
    parent, children = sweep_runs(mlflow_client(stack, monkeypatch), "as-a-job")
    assert parent.info.status == "FINISHED" and parent.data.tags["ray_experiment"].startswith(str(workdir))
    assert len(children) == 2 and all(c.info.status == "FINISHED" for c in children)
    # `stop` ended the other sweep the way Ctrl-C does: the driver closed every MLflow run.
    # (Ray's default SIGTERM would leave it FAILED, or RUNNING once SIGKILL follows 3 s later.)
    assert result["stop_requested"] is True and result["stopped_status"] == "STOPPED"
    parent, children = sweep_runs(mlflow_client(stack, monkeypatch), "stopped-job")
    assert parent.info.status in ("KILLED", "FINISHED")  # FINISHED: its trials all ended meanwhile
    assert children and not [c for c in children if c.info.status == "RUNNING"]
