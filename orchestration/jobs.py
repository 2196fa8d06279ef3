"""Sweeps as Ray Jobs: `mtbert sweep submit | status | stop` against a cluster's dashboard.

A job runs `mtbert sweep run FILE ...` as its driver on the head node, so the sweep survives
the laptop that submitted it going to sleep. What a node that never installed this project
needs, the job brings:

- the code: `mtbert` and `orchestration` are on the PYTHONPATH of the job driver and of every
  trial process on every node (in the uploaded working directory, or as py_modules when the
  packages live outside it);
- the sweep file and anything it names relative to it: the working directory (the current
  folder by default), uploaded without virtualenvs, runs, caches and .git;
- nothing else: third-party packages (torch, transformers, Ray, MLflow) come from the node
  image, which must match the driver's Python and Ray versions (docker/Dockerfile).

Secrets stay on the cluster: the MLflow credentials and the Ray token are in the nodes'
environment (compose env file, Kubernetes Secret), never in the job's runtime_env, which the
dashboard shows to anyone who can read it.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import sys
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence, TextIO

from orchestration.errors import SweepError
from orchestration.paths import tool

ADDRESS_ENV = "RAY_API_SERVER_ADDRESS"  # what `ray job submit` reads too
# gitignore-style; Ray also honours the working directory's .gitignore.
EXCLUDES = [".venv/", "venv/", ".git/", "runs/", "mlruns/", "mlflow.db", ".mtbert_cache/",
            "__pycache__/", "*.pyc", "*.egg-info/", ".pytest_cache/"]
PACKAGES = ("mtbert", "orchestration")
TERMINAL = {"SUCCEEDED", "FAILED", "STOPPED"}
STOP_GRACE_S = 60  # a stopped sweep's driver gets this long to stop trials and close its runs


class JobError(SweepError):
    """A Ray Job could not be submitted, found or followed."""


class ClusterUnreachable(JobError):
    """No Ray dashboard answers at the address."""


class ClusterAuthError(JobError):
    """The dashboard refused the request (Ray token authentication)."""


class UnknownJob(JobError):
    """The cluster has no job with that id."""


class JobFailed(JobError):
    """The followed job ended in FAILED or STOPPED."""


@dataclass
class JobState:
    job_id: str
    status: str  # PENDING | RUNNING | STOPPED | SUCCEEDED | FAILED
    message: str
    entrypoint: str


# --------------------------------------------------------------------------- connection

def _dashboard_url(address: str | None) -> str:
    address = (address or os.environ.get(ADDRESS_ENV) or "").strip().rstrip("/")
    if not address:
        raise JobError(f"--address: give the Ray dashboard address, e.g. http://HEAD:8265 "
                       f"(or set {ADDRESS_ENV})")
    if address.startswith("ray://"):
        raise JobError(f"--address {address}: that is a Ray Client address; jobs go to the "
                       "dashboard, e.g. http://HEAD:8265")
    return address if "://" in address else f"http://{address}"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


@contextmanager
def _translated(url: str, job_id: str | None = None) -> Iterator[None]:
    """Ray's client errors -> one line that says what to do."""
    from ray.exceptions import AuthenticationError

    try:
        yield
    except AuthenticationError as exc:
        raise ClusterAuthError(
            f"the Ray cluster at {url} refused the request ({_first_line(exc)}); export "
            "RAY_AUTH_MODE=token and RAY_AUTH_TOKEN=<the cluster's token> (docs/cluster.md)") from None
    except ConnectionError:
        raise ClusterUnreachable(f"no Ray dashboard at {url}; is the head up and its dashboard "
                                 "port reachable (8265 by default)?") from None
    except RuntimeError as exc:
        text = str(exc)
        if job_id is not None and ("404" in text or "does not exist" in text):
            raise UnknownJob(f"no job {job_id} on the Ray cluster at {url}") from None
        raise JobError(f"Ray cluster at {url}: {_first_line(exc)}") from None


def _client(address: str | None):
    from ray.job_submission import JobSubmissionClient

    url = _dashboard_url(address)
    with _translated(url):
        return JobSubmissionClient(url), url


# --------------------------------------------------------------------------- what to upload

def _package_dirs() -> list[Path]:
    import importlib

    return [Path(importlib.import_module(name).__file__).resolve().parent for name in PACKAGES]


def runtime_env(working_dir: Path) -> dict:
    """The job's runtime_env: the working directory, plus the project's packages as py_modules
    when the working directory does not already hold them."""
    working_dir = working_dir.resolve()
    outside = [str(p) for p in _package_dirs() if not p.is_relative_to(working_dir)]
    env: dict = {"working_dir": str(working_dir), "excludes": list(EXCLUDES), "env_vars": {
        # Driver output reaches `tail_job_logs` as it is printed.
        "PYTHONUNBUFFERED": "1",
        # `stop` interrupts the sweep driver (Ctrl-C, which Tune and the sweep handle: trials
        # stopped, MLflow runs closed as KILLED) instead of Ray's default SIGTERM, and gives
        # it time for that before the SIGKILL.
        "RAY_JOB_STOP_SIGNAL": "SIGINT",
        "RAY_JOB_STOP_WAIT_TIME_S": str(STOP_GRACE_S),
    }}
    if outside:
        env["py_modules"] = outside
    return env


def entrypoint(sweep_file: str, extra_args: Sequence[str] = (), tracking_uri: str | None = None,
               workdir: str | None = None) -> str:
    """The shell command the job runs on the head. `python -m` because the console script is
    not installed where the project comes only as uploaded code. With `workdir` (a folder on
    the cluster's shared volume) the sweep runs there, so Ray Tune storage and the token cache
    are one folder seen by every node; the sweep file is still read from the upload."""
    sweep = shlex.quote(sweep_file)
    options = list(extra_args) + (["--tracking-uri", tracking_uri] if tracking_uri else [])
    tail = "".join(f" {shlex.quote(a)}" for a in options)
    if not workdir:
        return f"exec python -m mtbert.cli sweep run {sweep}{tail}"
    folder = shlex.quote(workdir)
    return (f'MTBERT_JOB_DIR="$PWD" && mkdir -p {folder} && cd {folder} && '
            f'exec python -m mtbert.cli sweep run "$MTBERT_JOB_DIR"/{sweep}{tail}')


def _sweep_in(working_dir: Path, file: str | Path) -> str:
    path = Path(file)
    if not path.is_file():
        raise JobError(f"{file}: sweep file not found")
    try:
        return path.resolve().relative_to(working_dir.resolve()).as_posix()
    except ValueError:
        raise JobError(f"{file}: outside {working_dir}, the folder the job uploads; run from a folder "
                       "that holds it") from None


def _check_yaml(file: str | Path) -> None:
    """Only the YAML is checked here. The full validation needs the data and model paths,
    which may exist on the cluster's volume alone; it runs in the job's first seconds."""
    from mtbert.config import ConfigError, read_yaml

    try:
        read_yaml(file)
    except ConfigError as exc:
        raise JobError(str(exc)) from None


def _failure_line(state: JobState) -> str:
    """Ray's message for a failed job quotes the log tail; the CLI's own error line says why."""
    lines = [line.strip() for line in state.message.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("mtbert: error:")]
    if errors:
        return errors[-1].removeprefix("mtbert: error:").strip()
    return lines[0] if lines else "no message"


# --------------------------------------------------------------------------- API

def submit(file: str | Path, address: str | None, extra_args: Sequence[str] = (),
           tracking_uri: str | None = None, follow: bool = True, *, workdir: str | None = None,
           working_dir: str | Path | None = None, out: TextIO | None = None) -> str:
    """Submit `mtbert sweep run FILE EXTRA_ARGS [--tracking-uri URI]` as a Ray Job and return
    its id. With `follow`, stream its logs until it ends and raise JobFailed (one line: the
    sweep's own error when it printed one) unless it SUCCEEDED. `tracking_uri` is read on
    the cluster: give the address the nodes use (http://mlflow:5000), or leave it to the
    nodes' $MLFLOW_TRACKING_URI."""
    root = Path(working_dir) if working_dir else Path.cwd()
    relative = _sweep_in(root, file)
    _check_yaml(file)
    client, url = _client(address)
    job_id = f"mtbert-{Path(relative).stem}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:4]}"
    with _translated(url):
        client.submit_job(entrypoint=entrypoint(relative, extra_args, tracking_uri, workdir),
                          submission_id=job_id, runtime_env=runtime_env(root),
                          metadata={"mtbert_sweep": relative})
    stream = out or sys.stdout
    print(f"submitted job {job_id} to {url}", file=stream, flush=True)
    if not follow:
        return job_id
    try:
        with _translated(url, job_id):
            asyncio.run(_tail(client, job_id, stream))
    except KeyboardInterrupt:
        print(f"\nstopped following; job {job_id} keeps running: `{tool('mtbert')} sweep status {job_id} "
              f"--address {url}`, `{tool('mtbert')} sweep stop {job_id} --address {url}`", file=sys.stderr)
        raise
    state = _wait_terminal(client, url, job_id)
    if state.status != "SUCCEEDED":
        raise JobFailed(f"job {job_id} {state.status}: {_failure_line(state)}")
    return job_id


async def _tail(client, job_id: str, stream: TextIO) -> None:
    async for chunk in client.tail_job_logs(job_id):
        stream.write(chunk)
        stream.flush()


def _wait_terminal(client, url: str, job_id: str, timeout_s: float = 60.0) -> JobState:
    # The log stream closes as the driver exits; the status can trail it by a moment.
    deadline = time.monotonic() + timeout_s
    while True:
        state = _state(client, url, job_id)
        if state.status in TERMINAL or time.monotonic() > deadline:
            return state
        time.sleep(0.5)


def _state(client, url: str, job_id: str) -> JobState:
    with _translated(url, job_id):
        info = client.get_job_info(job_id)
    return JobState(job_id, str(getattr(info.status, "value", info.status)), info.message or "",
                    info.entrypoint or "")


def status(job_id: str, address: str | None) -> JobState:
    client, url = _client(address)
    return _state(client, url, job_id)


def stop(job_id: str, address: str | None) -> bool:
    """Ask the cluster to stop the job; False when it had already ended. The sweep driver is
    interrupted (see runtime_env), so its trials stop and its MLflow runs end KILLED."""
    client, url = _client(address)
    with _translated(url, job_id):
        return bool(client.stop_job(job_id))


# --------------------------------------------------------------------------- CLI

def _cmd_submit(args: argparse.Namespace) -> int:
    extra: list[str] = []
    for item in args.set:
        extra += ["--set", item]
    if args.smoke:
        extra.append("--smoke")
    if args.name:
        extra += ["--name", args.name]
    submit(args.file, args.address, extra, args.tracking_uri, follow=not args.no_follow,
           workdir=args.workdir)
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    state = status(args.job_id, args.address)
    print(f"{state.job_id}: {state.status}" + (f" ({state.message})" if state.message else ""))
    return 0


def _cmd_stop(args: argparse.Namespace) -> int:
    requested = stop(args.job_id, args.address)
    print(f"{args.job_id}: " + ("stop requested" if requested else "already ended"))
    return 0


def _address_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--address", default=None,
                   help=f"Ray dashboard, e.g. http://HEAD:8265 (default: ${ADDRESS_ENV})")


def add_job_commands(sweep_subparsers: argparse._SubParsersAction) -> None:
    """`sweep submit | status | stop`, added to the `mtbert sweep` group."""
    p = sweep_subparsers.add_parser("submit", help="run a sweep file as a Ray Job on a cluster")
    p.add_argument("file", help="sweep YAML under the current folder (the folder is uploaded)")
    _address_option(p)
    p.add_argument("--no-follow", action="store_true", help="return once submitted, do not stream logs")
    p.add_argument("--tracking-uri", help="MLflow server as the cluster nodes reach it "
                   "(default: the nodes' $MLFLOW_TRACKING_URI)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a base config key or a sweep key (repeatable)")
    p.add_argument("--smoke", action="store_true", help="the sweep's seconds-long CI shrink")
    p.add_argument("--name", help="name of this sweep run")
    p.add_argument("--workdir", help="folder on the cluster's shared volume to run in, so runs/ "
                   "and caches are seen by every node (e.g. /shared/work)")
    p.set_defaults(func=_cmd_submit)

    p = sweep_subparsers.add_parser("status", help="state of a submitted sweep job")
    p.add_argument("job_id")
    _address_option(p)
    p.set_defaults(func=_cmd_status)

    p = sweep_subparsers.add_parser("stop", help="stop a submitted sweep job")
    p.add_argument("job_id")
    _address_option(p)
    p.set_defaults(func=_cmd_stop)


__all__ = ["submit", "status", "stop", "add_job_commands", "runtime_env", "entrypoint", "JobState",
           "JobError", "ClusterUnreachable", "ClusterAuthError", "UnknownJob", "JobFailed"]
