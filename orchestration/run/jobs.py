"""Sweeps as Ray Jobs: `mtbert sweep submit | status | stop` (and `sweep resume --address
http://HEAD:8265`) against a cluster's dashboard.

A job runs `mtbert sweep run FILE ...` (or `sweep resume RUN_DIR`) as its driver on the head
node, so the sweep survives the laptop that submitted it going to sleep. It runs with the
interpreter `--python` names, else the first found of this one (a dashboard on this machine)
and the head's `python`; one without the project's packages fails in one line that names it
and what it lacks. `status` reads the sweep's trial counts and best so far from the job's log.
What a node that never installed this project needs, the job brings:

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
import re
import shlex
import socket
import sys
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence, TextIO

from mtbert.errors import first_line
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


@contextmanager
def _translated(url: str, job_id: str | None = None) -> Iterator[None]:
    """Ray's client errors -> one line that says what to do."""
    from ray.exceptions import AuthenticationError

    try:
        yield
    except AuthenticationError as exc:
        raise ClusterAuthError(
            f"the Ray cluster at {url} refused the request ({first_line(exc)}); export "
            "RAY_AUTH_MODE=token and RAY_AUTH_TOKEN=<the cluster's token> (docs/cluster.md)") from None
    except ConnectionError:
        raise ClusterUnreachable(f"no Ray dashboard at {url}; is the head up and its dashboard "
                                 "port reachable (8265 by default)?") from None
    except RuntimeError as exc:
        text = str(exc)
        if job_id is not None and ("404" in text or "does not exist" in text):
            raise UnknownJob(f"no job {job_id} on the Ray cluster at {url}") from None
        raise JobError(f"Ray cluster at {url}: {first_line(exc)}") from None


AGENT_WAIT_S = 60.0  # a head just started takes a while before its job agent takes jobs


def _submit(client, url: str, **job) -> None:
    """client.submit_job, waiting for a head whose job agent is not up yet (right after `ray
    start`, Ray answers 500 "No available agent to submit job") instead of failing the user."""
    deadline = time.monotonic() + AGENT_WAIT_S
    while True:
        try:
            with _translated(url):
                client.submit_job(**job)
            return
        except JobError as exc:
            if "No available agent" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(2)


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


def default_python(url: str) -> list[str]:
    """The interpreters a job tries on the head when `--python` is not given, first found first.
    Ray offers no public way to ask which Python runs it on the head (its job runs the
    entrypoint with the head's PATH, which need not hold Ray's own interpreter: a head started
    as `.venv/bin/ray start --head`), so: where the dashboard is on this machine, this very
    interpreter; then `python` on the head's PATH (the image's virtualenv, docker/Dockerfile)."""
    from urllib.parse import urlparse

    host = (urlparse(url).hostname or "").lower()
    local = host in ("localhost", "::1", socket.gethostname().lower()) or host.startswith("127.")
    return ([sys.executable] if local else []) + ["python"]


# Run by the job's interpreter before the sweep: a Python without the project's packages fails
# in one line naming itself and what it lacks, not with a traceback deep in the log.
_CHECK = ('import importlib.util as u, sys; '
          'm = [n for n in ("ray", "mlflow", "torch", "mtbert") if u.find_spec(n) is None]; '
          'm and sys.exit("mtbert: error: the job interpreter %s on the head lacks %s; give `sweep submit --python` '
          'a Python of the head that has them (docs/cluster.md)" % (sys.executable, ", ".join(m)))')


def _python_prefix(python: str | Sequence[str]) -> str:
    """Shell lines that set $PY to the first of the candidate interpreters found on the head
    and check that it has the project's packages; each failure is one `mtbert: error:` line."""
    candidates = [python] if isinstance(python, str) else list(python)
    names = " ".join(shlex.quote(p) for p in candidates)
    shown = ", ".join(candidates)
    missing = shlex.quote(f"mtbert: error: no interpreter {shown} on the head; give `sweep submit --python` "
                          "the path of a Python on the head that has this project's packages (docs/cluster.md)")
    return (f'for PY in {names}; do command -v "$PY" >/dev/null 2>&1 && break; PY=; done && '
            f'{{ [ -n "$PY" ] || {{ echo {missing} >&2; exit 127; }}; }} && '
            f'"$PY" -c {shlex.quote(_CHECK)} && ')


class _Uploaded(str):
    """An argument that is a path inside the upload (the job's starting folder)."""


def _job_command(args: Sequence[str], python: str | Sequence[str], workdir: str | None) -> str:
    """`$PY -m mtbert.cli ARGS` as a job's shell entrypoint. With `workdir` it runs there
    (created), and an _Uploaded argument still names the file in the upload."""
    if not workdir:
        tail = "".join(f" {shlex.quote(a)}" for a in args)
        return f'{_python_prefix(python)}exec "$PY" -m mtbert.cli{tail}'
    tail = "".join(f' "$MTBERT_JOB_DIR"/{shlex.quote(a)}' if isinstance(a, _Uploaded) else f" {shlex.quote(a)}"
                   for a in args)
    return (f'{_python_prefix(python)}MTBERT_JOB_DIR="$PWD" && mkdir -p {shlex.quote(workdir)} && '
            f'cd {shlex.quote(workdir)} && exec "$PY" -m mtbert.cli{tail}')


def entrypoint(sweep_file: str, extra_args: Sequence[str] = (), tracking_uri: str | None = None,
               workdir: str | None = None, python: str | Sequence[str] = "python") -> str:
    """The shell command the job runs on the head. `python -m` because the console script is
    not installed where the project comes only as uploaded code; `python`: the interpreter(s)
    to try, first found first (default_python). With `workdir` (a folder on the cluster's shared
    volume) the sweep runs there, so Ray Tune storage and the token cache are one folder seen by
    every node; the sweep file is still read from the upload."""
    options = list(extra_args) + (["--tracking-uri", tracking_uri] if tracking_uri else [])
    return _job_command(["sweep", "run", _Uploaded(sweep_file), *options], python, workdir)


def resume_entrypoint(run_dir: str, python: str | Sequence[str] = "python", workdir: str | None = None) -> str:
    """The shell command of a resume job: `mtbert sweep resume RUN_DIR` (the sweep's folder as
    the head sees it), in `workdir` as the sweep ran."""
    return _job_command(["sweep", "resume", run_dir], python, workdir)


def _sweep_in(working_dir: Path, file: str | Path) -> str:
    path = Path(file)
    if not path.is_file():
        raise JobError(f"{file}: sweep file not found")
    try:
        return path.resolve().relative_to(working_dir.resolve()).as_posix()
    except ValueError:
        raise JobError(f"{file}: outside {working_dir}, the folder the job uploads; run from a folder "
                       "that holds it") from None


def check_sweep(file: str | Path, extra_args: Sequence[str] = ()) -> None:
    """The sweep validated here as `sweep run` would, before a job is submitted: a misspelled
    key is one line now, not a failed job on the cluster. Data and model paths may exist on
    the cluster's volume alone, so a sweep that fails only on them (it validates in full under
    --smoke, which reads no files and loads no model) goes on to the job, which checks them in
    its first seconds."""
    from orchestration.sweep.load import load_sweep

    overrides = [extra_args[i + 1] for i, a in enumerate(extra_args[:-1]) if a == "--set"]
    smoke = "--smoke" in extra_args
    try:
        load_sweep(file, overrides, smoke=smoke)
    except ValueError as exc:  # SweepError, ConfigError, DataError
        if smoke:
            raise JobError(str(exc)) from None
        try:
            load_sweep(file, overrides, smoke=True)
        except ValueError:
            raise JobError(str(exc)) from None


def _failure_line(state: JobState, logs: str = "") -> str:
    """Ray's message for a failed job quotes the log tail, the CLI's own error line says why;
    `logs`: the job's whole log, where that tail came empty (Ray read it before the driver's
    last lines reached it)."""
    lines = [line.strip() for line in state.message.splitlines() if line.strip()]
    errors = [line for line in (*lines, *(line.strip() for line in logs.splitlines()))
              if line.startswith("mtbert: error:")]
    if errors:
        return errors[-1].removeprefix("mtbert: error:").strip()
    return lines[0] if lines else "no message"


# --------------------------------------------------------------------------- API

def submit(file: str | Path, address: str | None, extra_args: Sequence[str] = (),
           tracking_uri: str | None = None, follow: bool = True, *, workdir: str | None = None,
           working_dir: str | Path | None = None, out: TextIO | None = None,
           python: str | None = None) -> str:
    """Submit `mtbert sweep run FILE EXTRA_ARGS [--tracking-uri URI]` as a Ray Job and return
    its id. With `follow`, stream its logs until it ends and raise JobFailed (one line: the
    sweep's own error when it printed one) unless it SUCCEEDED. `tracking_uri` is read on
    the cluster: give the address the nodes use (http://mlflow:5000), or leave it to the
    nodes' $MLFLOW_TRACKING_URI. `python`: the interpreter on the head (default_python)."""
    root = Path(working_dir) if working_dir else Path.cwd()
    relative = _sweep_in(root, file)
    check_sweep(file, extra_args)
    client, url = _client(address)
    job_id = f"mtbert-{Path(relative).stem}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:4]}"
    _submit(client, url, entrypoint=entrypoint(relative, extra_args, tracking_uri, workdir,
                                              python or default_python(url)),
            submission_id=job_id, runtime_env=runtime_env(root),
            metadata={"mtbert_sweep": relative, "mtbert_workdir": workdir or ""})
    return _submitted(client, url, job_id, follow, out)


def _submitted(client, url: str, job_id: str, follow: bool, out: TextIO | None) -> str:
    """Say the job was submitted; with `follow`, stream its logs and raise JobFailed unless it
    SUCCEEDED."""
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
        try:
            logs = _logs(client, url, job_id)
        except JobError:  # the failure itself is reported either way
            logs = ""
        raise JobFailed(f"job {job_id} {state.status}: {_failure_line(state, logs)}")
    return job_id



# --------------------------------------------------------------------------- progress, resume
# Read from the job's log through the dashboard, the one thing a laptop surely reaches (the
# MLflow store is named as the head reaches it). The lines are the sweep driver's own
# (launch.py, progress.ProgressPrinter).

_STARTED = re.compile(r"^sweep (?P<name>\S+): .* \| Ray storage (?P<run_dir>.+)$")
_RESUMED = re.compile(r"^resuming sweep (?P<name>\S+) \| ")
_COUNTS = re.compile(r"^\[\s*(?P<clock>\d+:\d\d)\] "
                     r"(?P<counts>\d+ running, \d+ finished, .* pending (?:of|in round) .*)$")  # in round: adaptive
_ENDED = re.compile(r"^sweep (?P<name>\S+) (?P<status>FINISHED|KILLED|FAILED) in \S+: (?P<line>.*)$")


@dataclass
class SweepProgress:
    name: str | None = None  # the sweep run's name
    run_dir: str | None = None  # its folder in Ray Tune's storage, as the head sees it
    clock: str | None = None  # the sweep's elapsed time at `counts`
    counts: str | None = None  # "2 running, 3 finished, ... pending of 8 | best ..."
    ended: str | None = None  # the driver's summary line, once it ended


def sweep_progress(logs: str) -> SweepProgress:
    found = SweepProgress()
    for line in logs.splitlines():
        line = line.rstrip()
        if m := _STARTED.match(line):
            found.name, found.run_dir = m["name"], m["run_dir"]
        elif m := _RESUMED.match(line):
            found.name = m["name"]
        elif m := _COUNTS.match(line):
            found.clock, found.counts = m["clock"], m["counts"]
        elif m := _ENDED.match(line):
            found.ended = f"{m['status']}: {m['line']}"
    return found


def _job(client, url: str, job_id: str):
    with _translated(url, job_id):
        return client.get_job_info(job_id)


def _logs(client, url: str, job_id: str) -> str:
    with _translated(url, job_id):
        return client.get_job_logs(job_id)


def progress(job_id: str, address: str | None) -> tuple[JobState, SweepProgress]:
    """The job's state and how far its sweep got, from its log."""
    client, url = _client(address)
    state = _state(client, url, job_id)
    return state, sweep_progress(_logs(client, url, job_id))


def submit_resume(ref: str, address: str | None, follow: bool = True, *, workdir: str | None = None,
                  python: str | None = None, working_dir: str | Path | None = None,
                  out: TextIO | None = None) -> str:
    """Continue a submitted sweep on the cluster as a new Ray Job running `mtbert sweep resume`
    on the head. `ref`: the id of a job that ran it (its log names the sweep's folder) or that
    folder as the head sees it. The job's working folder (--workdir) is the one the sweep ran
    in unless given; the code is uploaded from the current folder as `submit` does."""
    root = Path(working_dir) if working_dir else Path.cwd()
    client, url = _client(address)
    try:
        info = _job(client, url, ref)
    except UnknownJob:
        if not ref.startswith("/"):
            raise JobError(f"{ref}: no job of that id on the Ray cluster at {url}; give the id `sweep submit` "
                           "printed, or the sweep's folder as the head sees it (/shared/work/runs/NAME)") from None
        info = None
    if info is None:
        run_dir, earlier = ref, {}
    else:
        status = str(getattr(info.status, "value", info.status))
        if status not in TERMINAL:
            raise JobError(f"job {ref} is {status}: a sweep has one driver at a time; "
                           f"`{tool('mtbert')} sweep stop {ref} --address {url}` first")
        earlier = info.metadata or {}
        run_dir = earlier.get("mtbert_run_dir") or sweep_progress(_logs(client, url, ref)).run_dir
        if not run_dir:
            raise JobError(f"job {ref} never started its sweep (its log names no Ray storage); "
                           f"submit the sweep again")
    workdir = workdir if workdir is not None else (earlier.get("mtbert_workdir") or None)
    job_id = f"mtbert-resume-{Path(run_dir).name}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:4]}"
    _submit(client, url, entrypoint=resume_entrypoint(run_dir, python or default_python(url), workdir),
            submission_id=job_id, runtime_env=runtime_env(root),
            metadata={"mtbert_run_dir": run_dir, "mtbert_workdir": workdir or "", "mtbert_resumes": ref})
    return _submitted(client, url, job_id, follow, out)


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

def sweep_run_args(sets: list[str], smoke: bool) -> list[str]:
    """The `sweep run` options a submitted job passes on: each --set, and --smoke."""
    return [a for item in sets for a in ("--set", item)] + (["--smoke"] if smoke else [])


def _cmd_submit(args: argparse.Namespace) -> int:
    extra = sweep_run_args(args.set, args.smoke)
    if args.name:
        extra += ["--name", args.name]
    submit(args.file, args.address, extra, args.tracking_uri, follow=not args.no_follow,
           workdir=args.workdir, python=args.python)
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    if not (args.address or os.environ.get(ADDRESS_ENV)):  # no Ray dashboard named: a SLURM job id or sweep?
        if args.batch_status is not None and args.batch_status(args.job_id, args.workdir):
            return 0
        raise JobError(f"{args.job_id}: not a SLURM job's id, nor the name of a sweep a SLURM job ran in "
                       f"{args.workdir or 'this folder'}; for a Ray Job give --address http://HEAD:8265 "
                       f"(or set {ADDRESS_ENV})")
    state, found = progress(args.job_id, args.address)
    if state.status in ("FAILED", "STOPPED"):
        print(f"{state.job_id}: {state.status}: {_failure_line(state)}")
    else:
        print(f"{state.job_id}: {state.status}" + (f" ({state.message})" if state.message.strip()
                                                   and "\n" not in state.message.strip() else ""))
    if found.name:
        print(f"  sweep {found.name}" + (f" (Ray storage on the head: {found.run_dir})" if found.run_dir else ""))
    if found.counts:
        print(f"  trials at {found.clock}: {found.counts}")
    elif state.status in ("PENDING", "RUNNING"):
        print("  trials: no count yet (the sweep prints one at most every 20 s once its trials run)")
    if found.ended:
        print(f"  ended {found.ended}")
    return 0


def _cmd_stop(args: argparse.Namespace) -> int:
    requested = stop(args.job_id, args.address)
    print(f"{args.job_id}: " + ("stop requested" if requested else "already ended"))
    return 0


def python_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--python", metavar="PATH", help="the Python on the head that runs the sweep (default: this "
                   "interpreter where the dashboard is on this machine, else `python` on the head's PATH)")


def _address_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--address", default=None,
                   help=f"Ray dashboard, e.g. http://HEAD:8265 (default: ${ADDRESS_ENV})")


def add_job_commands(sweep_subparsers: argparse._SubParsersAction,
                     batch_status: Callable[[str, str | None], bool] | None = None) -> None:
    """`sweep submit | status | stop`, added to the `mtbert sweep` group. `batch_status(job,
    workdir)`: where no Ray dashboard is named, says a batch system's job's status (SLURM's,
    slurm.py) and returns True, or returns False for a job it does not know."""
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
    python_option(p)
    p.set_defaults(func=_cmd_submit)

    p = sweep_subparsers.add_parser("status", help="state of a submitted sweep job (a Ray Job, or a SLURM job of "
                                    "`sweep slurm`): its trials and best so far")
    p.add_argument("job_id", metavar="JOB", help="the job's id; for a SLURM job, its id or its sweep's name")
    _address_option(p)
    p.add_argument("--workdir", help="a SLURM job's folder, where SLURM no longer holds the job (default: the one "
                   "SLURM has for it, else the current folder)")
    p.set_defaults(func=_cmd_status, batch_status=batch_status)

    p = sweep_subparsers.add_parser("stop", help="stop a submitted sweep job")
    p.add_argument("job_id")
    _address_option(p)
    p.set_defaults(func=_cmd_stop)


__all__ = ["submit", "submit_resume", "status", "progress", "sweep_progress", "stop", "add_job_commands",
           "runtime_env", "entrypoint", "resume_entrypoint", "default_python", "JobState",
           "JobError", "ClusterUnreachable", "ClusterAuthError", "UnknownJob", "JobFailed"]
