"""Sweeps on a SLURM cluster: `mtbert sweep slurm FILE` writes one batch script and submits it
with `sbatch`.

The script (TEMPLATE) starts a Ray head on the allocation's first node and a Ray worker on
each other node (`srun`, one task per node), then runs the sweep's driver in the batch step,
on the first node, joined to that Ray. SLURM's own facts are handled there:

- a SIGTERM to the batch shell (`--signal=B:TERM@GRACE` before the time limit, a preemption,
  `scancel --signal=TERM --batch`) stops the sweep as Ctrl-C does (trials stopped, MLflow runs
  closed, Ray Tune's state saved) and requeues the job; `--requeue` lets SLURM run it again;
- a requeued run (SLURM_RESTART_COUNT > 0) runs `sweep resume` of the same sweep, named after
  the job id, instead of `sweep run`, so a stopped sweep is resumed once per requeue;
- a SIGINT to the batch shell (`scancel --signal=INT --batch`) stops the sweep for good.

The script names no path of this machine but the ones the user gave (the sweep file, the
working folder): `mtbert` and `ray` are commands found on the nodes' PATH unless `--mtbert`,
`--ray` or `--setup` (module loads, a virtualenv) say otherwise.

From the login node, `mtbert sweep status JOB` and `mtbert sweep resume JOB` take the job id
(or the sweep's name, `<name>-<job id>`): the job's folder is the one SLURM has for it
(`scontrol show job`, else `sacct`), else --workdir or the current folder; there `sweep slurm`
left slurm-JOB.json (the sweep's name, the script) beside the job's log slurm-JOB.out, which
holds the driver's progress lines. `resume` requeues a job SLURM still holds (its next run
resumes the sweep) and submits the saved script again, as a new job that resumes the sweep,
for one SLURM has forgotten.
"""
from __future__ import annotations

import argparse
import json
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from orchestration.errors import SweepError
from orchestration.paths import tool

# One template, filled by job_script; <<NAME>> marks a value. The comments in it are for the
# user who reads the script (--dry-run, `scontrol write batch_script JOB`).
TEMPLATE = """\
#!/bin/bash
#SBATCH --job-name=<<JOB_NAME>>
#SBATCH --nodes=<<NODES>>
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=<<CPUS>>
<<RESOURCES>>#SBATCH --chdir=<<WORKDIR>>
#SBATCH --output=slurm-%j.out
#SBATCH --open-mode=append
#SBATCH --requeue
#SBATCH --signal=B:TERM@<<GRACE>>
<<EXTRA>># Written by `mtbert sweep slurm`: a Ray head on this job's first node, a Ray worker on each
# other node, the sweep's driver here. A SIGTERM to this shell (<<GRACE>> s before the time limit,
# a preemption, `scancel --signal=TERM --batch`) stops the sweep cleanly and requeues the job,
# whose next run resumes the sweep; `scancel --signal=INT --batch` stops it for good.
set -uo pipefail
<<SETUP>>
# The same name in every run of this job: a requeue resumes it. MTBERT_RESUME (set by `mtbert
# sweep resume JOB` for a job SLURM no longer holds): an earlier job's sweep, which this job resumes.
sweep=${MTBERT_RESUME:-<<SWEEP_NAME>>-$SLURM_JOB_ID}
cpus=$SLURM_CPUS_PER_TASK
# Ray's ports from the job id: two sweeps sharing a node must not meet on Ray's defaults.
port=$(( 20000 + SLURM_JOB_ID % 4000 * 10 ))
nodes=($(scontrol show hostnames "$SLURM_JOB_NODELIST"))
head_ip=${MTBERT_HEAD_IP:-$(hostname -I | awk '{print $1}')}  # set MTBERT_HEAD_IP in --setup to pick another interface
echo "mtbert: run $((${SLURM_RESTART_COUNT:-0} + 1)) of job $SLURM_JOB_ID on ${nodes[*]}, $(date -u +%FT%TZ)"
export RAY_AUTH_MODE=token RAY_AUTH_TOKEN=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \\n')
export RAY_USAGE_STATS_ENABLED=0

stop=""  # requeue | stop, once a signal came
driver=""
on_signal() {
  [ -n "$stop" ] && return  # one stop per run: a second signal would make the driver quit at once
  stop=$1
  echo "mtbert: SIG$2 at $(date -u +%FT%TZ): stopping sweep $sweep (then: $1)"
  [ -n "$driver" ] && kill -TERM "$driver" 2>/dev/null
}
trap 'on_signal requeue TERM' TERM
trap 'on_signal stop INT' INT

# Each node keeps its own Ray folder (short: Ray's socket paths live under it) and its own log.
steps=()  # per node: its srun step's PID
tries=()  # per node: how many times its Ray was started
started=()  # per node: how many "Ray runtime started" its log held before its latest start
said_started() { local c; c=$(grep -c "Ray runtime started" "slurm-$SLURM_JOB_ID-ray-${nodes[$1]}.out" 2>/dev/null); echo "${c:-0}"; }
up() { local i; for i in "$@"; do [ "$(said_started "$i")" -gt "${started[$i]}" ] || return 1; done; }
start_node() {
  local i=$1 node=${nodes[$1]}
  started[$i]=$(said_started "$i")
  if [ "$i" -eq 0 ]; then
    srun --nodes=1 --ntasks=1 --overlap --cpus-per-task="$cpus" -w "$node" --output="slurm-%j-ray-%N.out" \\
      --open-mode=append <<RAY>> start --head --block --node-ip-address="$head_ip" --port="$port" \\
      --ray-client-server-port=$((port + 1)) --dashboard-agent-listen-port=$((port + 2)) \\
      --include-dashboard=false --num-cpus="$cpus" --num-gpus=<<GPUS>> \\
      --temp-dir=<<RAY_TMP>>/ray-$SLURM_JOB_ID-"$node" --disable-usage-stats &
  else
    srun --nodes=1 --ntasks=1 --overlap --cpus-per-task="$cpus" -w "$node" --output="slurm-%j-ray-%N.out" \\
      --open-mode=append <<RAY>> start --address="$head_ip:$port" --block --dashboard-agent-listen-port=$((port + 2)) \\
      --num-cpus="$cpus" --num-gpus=<<GPUS>> --temp-dir=<<RAY_TMP>>/ray-$SLURM_JOB_ID-"$node" --disable-usage-stats &
  fi
  steps[$i]=$!
  tries[$i]=$(( ${tries[$i]:-0} + 1 ))
}
# A node's Ray that exited while it started is started again, twice at most: on a loaded node (a
# virtualenv on a slow shared filesystem) Ray's helpers can import slower than Ray waits for them.
restart_exited() {
  local i
  for i in "$@"; do
    if ! kill -0 "${steps[$i]}" 2>/dev/null && [ "${tries[$i]}" -lt 3 ]; then
      echo "mtbert: Ray on ${nodes[$i]} exited while starting (try ${tries[$i]} of 3; slurm-$SLURM_JOB_ID-ray-${nodes[$i]}.out); starting it again"
      start_node "$i"
    fi
  done
}
# The nodes in the cluster, by `ray status` (seconds of imports): asked once the workers' logs say
# their Ray started, and every 10 s whatever the logs say (the head's log saying so is enough).
ray_nodes() { <<RAY>> status --address="$head_ip:$port" 2>/dev/null | grep -c '^ *1 node_'; }
workers=$(seq 1 $((${#nodes[@]} - 1)))
joined=0
polls=0
deadline=$((SECONDS + <<JOIN_WAIT>>))
# The workers start once the head's node is up: a worker started beside a slow head gives up
# ("No node info found for head node in GCS").
start_node 0
while [ -z "$stop" ] && [ "$SECONDS" -lt "$deadline" ]; do
  polls=$((polls + 1))
  up 0 && { joined=1; break; }
  if [ $((polls % 10)) -eq 0 ]; then
    joined=$(ray_nodes)
    [ "$joined" -ge 1 ] && break
  fi
  restart_exited 0
  kill -0 "${steps[0]}" 2>/dev/null || break
  sleep 1
done
if [ -z "$stop" ] && [ "$joined" -ge 1 ]; then
  for i in $workers; do start_node "$i"; done
fi
# Every node joined before the first trial, so trials spread over all of them.
while [ -z "$stop" ] && [ "$joined" -ge 1 ] && [ "$joined" -lt "${#nodes[@]}" ] && [ "$SECONDS" -lt "$deadline" ]; do
  sleep 1
  restart_exited $workers
  polls=$((polls + 1))
  if up $workers || [ $((polls % 10)) -eq 0 ]; then joined=$(ray_nodes); fi
done
echo "mtbert: Ray at $head_ip:$port, $joined of ${#nodes[@]} node(s) joined: ${nodes[*]}"

rc=0
if [ -z "$stop" ] && [ "$joined" -lt 1 ]; then
  echo "mtbert: no Ray head came up on ${nodes[0]} (see slurm-$SLURM_JOB_ID-ray-${nodes[0]}.out); sweep $sweep not started"
  rc=1
elif [ -z "$stop" ]; then
  if [ "${SLURM_RESTART_COUNT:-0}" -gt 0 ] || [ -n "${MTBERT_RESUME:-}" ]; then
    echo "mtbert: resuming sweep $sweep (job $SLURM_JOB_ID, restart ${SLURM_RESTART_COUNT:-0})"
    <<MTBERT>> sweep resume "$sweep" --address="$head_ip:$port" &
  else
    <<MTBERT>> sweep run <<FILE>> --name="$sweep" --address="$head_ip:$port"<<ARGS>> &
  fi
  driver=$!
  wait "$driver"; rc=$?
  # A signal ends `wait` early: wait again until the driver has closed the sweep.
  while kill -0 "$driver" 2>/dev/null; do wait "$driver"; rc=$?; done
fi
# Ray's nodes end with the driver: a TERM to each step's srun ends its step ("forcing job
# termination"), rather than leaving every step to SLURM's kill at the end of the job.
for step in ${steps[@]+"${steps[@]}"}; do kill -TERM "$step" 2>/dev/null; done
for _ in $(seq 30); do
  running=0
  for step in ${steps[@]+"${steps[@]}"}; do kill -0 "$step" 2>/dev/null && running=1; done
  [ "$running" -eq 0 ] && break
  sleep 1
done
if [ "$stop" = requeue ]; then
  echo "mtbert: requeueing job $SLURM_JOB_ID; its next run resumes sweep $sweep"
  scontrol requeue "$SLURM_JOB_ID"
fi
exit "$rc"
"""

_PLACEHOLDER = re.compile(r"<<([A-Z_]+)>>")
# SLURM's time formats: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS.
_TIME = re.compile(r"^(?:(?P<d>\d+)-(?P<dh>\d+)(?::(?P<dm>\d+)(?::(?P<ds>\d+))?)?"
                   r"|(?P<a>\d+)(?::(?P<b>\d+)(?::(?P<c>\d+))?)?)$")
DEFAULT_GRACE_S = 180  # the sweep's own stop takes seconds; the rest is for a slow shared filesystem
JOIN_WAIT_S = 180  # how long the script waits for every Ray node to join before the sweep starts


@dataclass
class SlurmJob:
    """What `mtbert sweep slurm` puts into the batch script."""
    file: str  # the sweep file, as the nodes see it
    workdir: str  # the job's folder on the shared filesystem: runs/, caches, the job's log
    sweep_name: str  # the sweep run's name is this + "-<job id>"
    nodes: int = 1
    cpus_per_node: int = 2
    gpus_per_node: int = 0
    time: str | None = None
    partition: str | None = None
    account: str | None = None
    sbatch: list[str] = field(default_factory=list)  # extra #SBATCH options
    setup: list[str] = field(default_factory=list)  # shell lines before anything starts
    sweep_args: list[str] = field(default_factory=list)  # for `sweep run`: --set, --smoke, --tracking-uri
    mtbert: str = "mtbert"
    ray: str = "ray"
    grace_s: int = DEFAULT_GRACE_S
    job_name: str | None = None
    ray_tmp: str = "/tmp"  # node-local; short, since Ray's socket paths live under it


def time_limit_s(value: str) -> int:
    """A SLURM time limit in seconds, or one line naming --time."""
    m = _TIME.match(value.strip())
    if not m:
        raise SweepError(f"--time {value!r}: not a SLURM time (minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS)")
    if m["d"] is not None:
        return ((int(m["d"]) * 24 + int(m["dh"])) * 60 + int(m["dm"] or 0)) * 60 + int(m["ds"] or 0)
    parts = [int(p) for p in (m["a"], m["b"], m["c"]) if p is not None]
    if len(parts) == 1:
        return parts[0] * 60
    if len(parts) == 2:
        return parts[0] * 60 + parts[1]
    return (parts[0] * 60 + parts[1]) * 60 + parts[2]


def _word(value: str | None, option: str) -> None:
    if value is not None and (not value.strip() or re.search(r"\s", value)):
        raise SweepError(f"{option} {value!r}: one word, no spaces")


def check(job: SlurmJob) -> None:
    """Every option checked before anything is written or submitted; each failure is one line."""
    for value, option, least in ((job.nodes, "--nodes", 1), (job.cpus_per_node, "--cpus-per-node", 1),
                                 (job.gpus_per_node, "--gpus-per-node", 0), (job.grace_s, "--grace", 1)):
        if value < least:
            raise SweepError(f"{option}: must be >= {least}, got {value}")
    if job.time is not None:
        limit = time_limit_s(job.time)
        if job.grace_s >= limit:
            raise SweepError(f"--grace {job.grace_s}: the sweep's stop signal must come before the time limit "
                             f"--time {job.time} ({limit} s)")
    if re.search(r"\s", job.workdir):  # #SBATCH --chdir is not shell text: no quoting there
        raise SweepError(f"--workdir {job.workdir!r}: a folder without spaces (sbatch's --chdir cannot quote them)")
    if "/" in job.sweep_name or job.sweep_name in (".", ".."):
        raise SweepError(f"--name {job.sweep_name!r}: a folder name under the job's runs/ (no '/', not . or ..)")
    _word(job.sweep_name, "--name")
    _word(job.partition, "--partition")
    _word(job.account, "--account")
    _word(job.job_name, "--job-name")
    for line in job.sbatch:
        if sbatch_option(line) in ("--", "-") or "\n" in line:
            raise SweepError(f"--sbatch {line!r}: one sbatch option, such as mem=16G or --constraint=a100")
    for option, command in (("--mtbert", job.mtbert), ("--ray", job.ray)):
        if not command.strip():
            raise SweepError(f"{option}: give the command that runs it on the nodes")


def sbatch_option(line: str) -> str:
    """`mem=16G`, `--mem=16G` or `#SBATCH --mem=16G` -> `--mem=16G` (argparse takes a value that
    starts with a dash only as `--sbatch=--mem=16G`, so the dashes may be left out)."""
    option = line.strip().removeprefix("#SBATCH").strip()
    return option if option.startswith("-") else f"--{option}"


def job_script(job: SlurmJob) -> str:
    """The batch script, from TEMPLATE."""
    check(job)
    resources = [f"--gpus-per-node={job.gpus_per_node}" if job.gpus_per_node else None,
                 f"--time={job.time}" if job.time else None,
                 f"--partition={job.partition}" if job.partition else None,
                 f"--account={job.account}" if job.account else None]
    values = {
        "JOB_NAME": job.job_name or f"mtbert-{job.sweep_name}",
        "NODES": str(job.nodes), "CPUS": str(job.cpus_per_node), "GPUS": str(job.gpus_per_node),
        "RESOURCES": "".join(f"#SBATCH {r}\n" for r in resources if r),
        "WORKDIR": job.workdir, "GRACE": str(job.grace_s),
        "EXTRA": "".join(f"#SBATCH {sbatch_option(line)}\n" for line in job.sbatch),
        "SETUP": "\n".join(job.setup),
        "SWEEP_NAME": shlex.quote(job.sweep_name), "FILE": shlex.quote(job.file),
        "ARGS": "".join(f" {shlex.quote(a)}" for a in job.sweep_args),
        "MTBERT": job.mtbert, "RAY": job.ray, "RAY_TMP": shlex.quote(job.ray_tmp), "JOIN_WAIT": str(JOIN_WAIT_S),
    }
    return _PLACEHOLDER.sub(lambda m: values[m[1]], TEMPLATE)


def submit(script: str, sbatch: str = "sbatch") -> str:
    """`sbatch --parsable` with the script on stdin; SLURM keeps it for every requeue. Returns
    the job id."""
    if shutil.which(sbatch) is None:
        raise SweepError(f"{sbatch}: not found; run `{tool('mtbert')} sweep slurm` on a login node of the "
                         "cluster (or --dry-run to see the script)")
    out = subprocess.run([sbatch, "--parsable"], input=script, capture_output=True, text=True)
    if out.returncode != 0:
        lines = [line for line in out.stderr.splitlines() if line.strip()] or [f"exit status {out.returncode}"]
        raise SweepError(f"sbatch refused the job: {lines[-1].strip()}")
    return out.stdout.strip().split(";")[0]


def _sweep_args(args: argparse.Namespace) -> list[str]:
    from orchestration.run.jobs import sweep_run_args

    extra = sweep_run_args(args.set, args.smoke)
    if args.tracking_uri:
        extra += ["--tracking-uri", tracking_uri(args.tracking_uri, Path(args.workdir or ".").resolve())]
    return extra


def tracking_uri(given: str | None, workdir: Path) -> str:
    """The store the job's sweep logs to: a relative sqlite path is taken in the job's folder."""
    from orchestration.paths import resolve_tracking_uri

    return resolve_tracking_uri(given, None, cwd=workdir)


def _cmd_slurm(args: argparse.Namespace) -> int:
    from orchestration.run.jobs import check_sweep

    file = Path(args.file)
    if not file.is_file():
        raise SweepError(f"{args.file}: sweep file not found")
    extra = _sweep_args(args)
    check_sweep(file, extra)  # a misspelled key is one line here, not a failed job in the queue
    workdir = Path(args.workdir or ".").resolve()
    job = SlurmJob(file=str(file.resolve()), workdir=str(workdir), sweep_name=args.name or file.stem,
                   nodes=args.nodes, cpus_per_node=args.cpus_per_node, gpus_per_node=args.gpus_per_node,
                   time=args.time, partition=args.partition, account=args.account, sbatch=args.sbatch,
                   setup=args.setup, sweep_args=extra, mtbert=args.mtbert, ray=args.ray, grace_s=args.grace,
                   job_name=args.job_name, ray_tmp=args.ray_tmp)
    script = job_script(job)
    if args.dry_run:
        sys.stdout.write(script)
        return 0
    job_id = submit(script)
    sweep = f"{job.sweep_name}-{job_id}"
    write_record(workdir, job_id, sweep, script)
    print(f"submitted SLURM job {job_id}: sweep {sweep} on {job.nodes} node(s), folder {workdir}")
    print(f"  follow: {tool('mtbert')} sweep status {job_id}; tail -f {workdir / f'slurm-{job_id}.out'}")
    print(f"  stop:   scancel --signal=INT --batch {job_id}   (the sweep stops cleanly, not requeued)")
    print(f"  resume: {tool('mtbert')} sweep resume {job_id}   (a stopped or ended job's sweep goes on)")
    print(f"  table:  {tool('mtbert')} leaderboard --experiment <the sweep's experiment> --tracking-uri "
          f"{shlex.quote(tracking_uri(args.tracking_uri, workdir))}")
    return 0


# --------------------------------------------------------------------------- status, resume
# From the login node, by job id or sweep name. What is known of a job comes from SLURM while
# it holds the job (scontrol; sacct where accounting keeps it), and from the job's folder: the
# record `sweep slurm` wrote (RECORD) and the job's log, whose driver lines say how far the
# sweep got (jobs.sweep_progress reads the same lines from a Ray Job's log).

RECORD = "slurm-{job}.json"  # in the job's folder: the sweep's name and the script, for status and resume
LOG = "slurm-{job}.out"
JOB_ID = re.compile(r"^\d+$")
# A job in one of these states has a driver, or will: it is not resumed beside it.
ACTIVE = {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "REQUEUED", "REQUEUE_HOLD",
          "REQUEUE_FED", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED", "SPECIAL_EXIT", "RESV_DEL_HOLD"}


@dataclass
class SlurmSweep:
    """A SLURM job of `sweep slurm`, as the login node finds it."""
    job_id: str
    folder: Path  # the job's folder (--workdir)
    state: str | None  # SLURM's JobState; None where SLURM no longer holds the job
    info: dict[str, str]  # what scontrol (or sacct) says of it
    sweep: str | None  # the sweep's name; None while unknown (no record, no driver line yet)
    record: dict

    @property
    def log(self) -> Path:
        return Path(self.info.get("StdOut") or self.folder / LOG.format(job=self.job_id))


def write_record(workdir: Path, job_id: str, sweep: str, script: str, resumes: str | None = None) -> None:
    """slurm-JOB.json in the job's folder; a folder the login node cannot write costs only the
    record (status and resume then read the job's log and SLURM)."""
    record = {"job_id": job_id, "sweep": sweep, "script": script, "submitted": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    if resumes:
        record["resumes"] = resumes
    path = workdir / RECORD.format(job=job_id)
    try:
        path.write_text(json.dumps(record, indent=2) + "\n")
    except OSError as exc:
        print(f"note: {path}: not written ({exc.strerror or exc}); `sweep status {job_id}` reads the job's log",
              file=sys.stderr)


def _read_record(path: Path) -> dict:
    try:
        record = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return {}
    return record if isinstance(record, dict) else {}


def _slurm_command(*cmd: str) -> subprocess.CompletedProcess | None:
    """A SLURM client command, or None where this machine has none."""
    if shutil.which(cmd[0]) is None:
        return None
    try:
        return subprocess.run(list(cmd), capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        raise SweepError(f"{cmd[0]}: no answer from SLURM in 60 s (is slurmctld up?)") from None


def _first_error(out: subprocess.CompletedProcess) -> str:
    lines = [line.strip() for line in (out.stderr or out.stdout).splitlines() if line.strip()]
    return lines[-1] if lines else f"exit status {out.returncode}"


def slurm_job(job_id: str) -> dict[str, str] | None:
    """What SLURM says of the job (JobState, WorkDir, StdOut, NodeList, Restarts, ...), or None
    where it holds no such job: slurmctld forgets an ended job after MinJobAge (300 s by
    default); sacct remembers it where the cluster keeps accounting."""
    out = _slurm_command("scontrol", "show", "job", "-o", job_id)
    if out is not None and out.returncode == 0 and "JobId=" in out.stdout:
        return dict(item.split("=", 1) for item in out.stdout.split() if "=" in item)
    if out is not None and out.returncode != 0 and "invalid job id" not in out.stderr.lower():
        raise SweepError(f"scontrol show job {job_id}: {_first_error(out)}")
    acct = _slurm_command("sacct", "-j", job_id, "-X", "-n", "-P", "-o", "JobID,JobName,State,WorkDir,NodeList,Elapsed")
    if acct is None or acct.returncode != 0:  # no sacct, or no accounting on this cluster
        return None
    for line in acct.stdout.splitlines():
        fields = line.split("|")
        if len(fields) == 6 and fields[0] == job_id:
            state = fields[2].split()[0] if fields[2].strip() else "UNKNOWN"  # "CANCELLED by 0"
            return {"JobId": job_id, "JobName": fields[1], "JobState": state, "WorkDir": fields[3],
                    "NodeList": fields[4], "RunTime": fields[5], "from": "sacct"}
    return None


RUN_START = "mtbert: run "  # the script's first line in each run of the job (a requeue appends to the log)


def log_progress(log: Path):
    """How far the job's sweep got, from its log (None where there is none): the sweep's name
    and folder from any run of the job, the counts and the end from its latest run."""
    from orchestration.run.jobs import sweep_progress

    try:
        text = log.read_text(errors="replace")
    except OSError:
        return None
    found = sweep_progress(text)
    start = text.rfind("\n" + RUN_START)
    if start >= 0:
        latest = sweep_progress(text[start:])
        found.clock, found.counts, found.ended = latest.clock, latest.counts, latest.ended
    return found


def _sweep_of_log(log: Path) -> str | None:
    found = log_progress(log)
    return found.name if found else None


def find_slurm_sweep(ref: str, workdir: str | None = None) -> SlurmSweep | None:
    """The SLURM job `ref` names: a job id, or a sweep's name (its latest job). None: `ref` is
    not a job id and no job of the folder ran a sweep of that name (not a SLURM sweep). An id
    that neither SLURM nor the folder knows is one line."""
    folder = Path(workdir).expanduser().resolve() if workdir else Path.cwd()
    if JOB_ID.match(ref):
        info = slurm_job(ref)
        if info is not None and info.get("WorkDir") and not workdir:
            folder = Path(info["WorkDir"])
        record = _read_record(folder / RECORD.format(job=ref))
        found = SlurmSweep(ref, folder, info.get("JobState") if info else None, info or {}, record.get("sweep"), record)
        if info is None and not record and not found.log.is_file():
            raise SweepError(f"{ref}: no SLURM job of that id (SLURM holds none now) and no {found.log.name} in "
                             f"{folder}; give the id `sweep slurm` printed, and --workdir the job's folder "
                             "once SLURM has forgotten the job")
        found.sweep = found.sweep or _sweep_of_log(found.log)
        return found
    jobs = []
    for path in folder.glob(RECORD.format(job="*")):
        job_id = path.name[len("slurm-"):-len(".json")]
        if JOB_ID.match(job_id) and _read_record(path).get("sweep") == ref:
            jobs.append(job_id)
    m = re.match(r"^.+-(\d+)$", ref)  # <name>-<job id>: its first job, where no record says so
    if not jobs and m and _sweep_of_log(folder / LOG.format(job=m[1])) == ref:
        jobs.append(m[1])
    if not jobs:
        return None
    found = find_slurm_sweep(max(jobs, key=int), str(folder))
    found.sweep = ref
    return found


def _resumed_by(found: SlurmSweep) -> list[str]:
    """The later jobs that resumed this job's sweep (`sweep resume` of a forgotten job)."""
    later = []
    for path in found.folder.glob(RECORD.format(job="*")):
        record = _read_record(path)
        if record.get("resumes") == found.job_id and record.get("job_id"):
            later.append(str(record["job_id"]))
    return sorted(later, key=int)


def print_status(found: SlurmSweep) -> None:
    info = found.info
    if found.state is None:
        head = "not held by SLURM any more (ended)"
    else:
        head = found.state + (f" ({info['Reason']})" if info.get("Reason", "None") not in ("None", "") else "")
        details = [f"nodes {info['NodeList']}" if info.get("NodeList") not in (None, "", "(null)", "None assigned")
                   else None, f"run time {info['RunTime']}" if info.get("RunTime") else None,
                   f"restarts {info['Restarts']}" if info.get("Restarts") not in (None, "0") else None]
        head += "".join(f", {d}" for d in details if d)
    print(f"SLURM job {found.job_id}: {head}")
    progress = log_progress(found.log)
    if found.sweep:
        run_dir = progress.run_dir if progress and progress.run_dir else None
        print(f"  sweep {found.sweep}" + (f" (Ray storage {run_dir})" if run_dir else ""))
    else:
        print("  sweep: not started yet (the job's log names none)")
    if progress and progress.counts:
        print(f"  trials at {progress.clock}: {progress.counts}")
    elif found.state in ("PENDING", "RUNNING", "CONFIGURING"):
        print("  trials: no count yet (the sweep prints one at most every 20 s once its trials run)")
    if progress and progress.ended:
        print(f"  ended {progress.ended}")
    print(f"  log: {found.log}" + ("" if found.log.is_file() else " (not there yet)"))
    for later in _resumed_by(found):
        print(f"  resumed by SLURM job {later}: `{tool('mtbert')} sweep status {later}`")


def slurm_status(ref: str, workdir: str | None = None) -> bool:
    """`mtbert sweep status REF` for a SLURM sweep; False where REF is none (a Ray Job's id)."""
    found = find_slurm_sweep(ref, workdir)
    if found is None:
        return False
    print_status(found)
    return True


def resume_slurm(found: SlurmSweep, sbatch: str = "sbatch") -> str:
    """Resume the job's sweep on SLURM, from the login node: a job SLURM still holds is requeued
    (its next run resumes the sweep); one it has forgotten is submitted again from its saved
    script as a new job told to resume the sweep (MTBERT_RESUME). Returns the job id that runs it."""
    if found.state in ACTIVE:
        raise SweepError(f"SLURM job {found.job_id} is {found.state}: a sweep has one driver at a time; "
                         f"`scancel --signal=INT --batch {found.job_id}` stops it cleanly first")
    if not found.sweep:
        raise SweepError(f"SLURM job {found.job_id} never started its sweep (its log {found.log} names none); "
                         f"submit the sweep again with `{tool('mtbert')} sweep slurm`")
    later = _resumed_by(found)
    if later:
        raise SweepError(f"SLURM job {found.job_id}'s sweep {found.sweep} was resumed by job {later[-1]}; "
                         f"`{tool('mtbert')} sweep resume {later[-1]}` (or the sweep's name)")
    progress = log_progress(found.log)
    if progress and progress.ended and progress.ended.startswith("FINISHED"):
        raise SweepError(f"sweep {found.sweep} (SLURM job {found.job_id}) FINISHED: nothing to resume")
    run_dir = Path(progress.run_dir) if progress and progress.run_dir else None
    if run_dir is not None and run_dir.is_dir() and not (run_dir / "tuner.pkl").is_file():
        raise SweepError(f"{run_dir}: the sweep died before Ray Tune saved its state; submit it again with "
                         f"`{tool('mtbert')} sweep slurm`")
    if found.state is not None:
        out = _slurm_command("scontrol", "requeue", found.job_id)
        if out is None or out.returncode != 0:
            raise SweepError(f"scontrol requeue {found.job_id}: " + (_first_error(out) if out else "scontrol not found"))
        eligible = (slurm_job(found.job_id) or {}).get("EligibleTime", "")
        when = f" (from {eligible}: SLURM holds a requeued job back a while)" if eligible[:1].isdigit() else ""
        print(f"requeued SLURM job {found.job_id}: its next run{when} resumes sweep {found.sweep}")
        job_id = found.job_id
    else:
        script = found.record.get("script")
        if not script:
            raise SweepError(f"SLURM job {found.job_id} has ended and SLURM no longer holds it, and "
                             f"{found.folder / RECORD.format(job=found.job_id)} (its script) is missing; "
                             f"submit the sweep again with `{tool('mtbert')} sweep slurm`")
        if shutil.which(sbatch) is None:
            raise SweepError(f"{sbatch}: not found; run `{tool('mtbert')} sweep resume` on a login node of the cluster")
        out = subprocess.run([sbatch, "--parsable", f"--export=ALL,MTBERT_RESUME={found.sweep}"], input=script,
                             capture_output=True, text=True)
        if out.returncode != 0:
            raise SweepError(f"sbatch refused the job: {_first_error(out)}")
        job_id = out.stdout.strip().split(";")[0]
        write_record(found.folder, job_id, found.sweep, script, resumes=found.job_id)
        print(f"submitted SLURM job {job_id}: it resumes sweep {found.sweep} of job {found.job_id} "
              "(SLURM no longer holds that job)")
    print(f"  follow: {tool('mtbert')} sweep status {job_id}; tail -f {found.folder / LOG.format(job=job_id)}")
    return job_id


def slurm_resume(ref: str, workdir: str | None = None) -> bool:
    """`mtbert sweep resume REF` for a SLURM sweep; False where REF is none (a sweep folder here)."""
    found = find_slurm_sweep(ref, workdir)
    if found is None:
        return False
    resume_slurm(found)
    return True


def add_slurm_command(sweep_subparsers: argparse._SubParsersAction) -> None:
    """`mtbert sweep slurm FILE`, added to the `mtbert sweep` group."""
    p = sweep_subparsers.add_parser("slurm", help="run a sweep file as a SLURM batch job (Ray head and workers "
                                    "started in the allocation)")
    p.add_argument("file", help="sweep YAML, on the cluster's shared filesystem")
    p.add_argument("--nodes", type=int, default=1, help="nodes of the allocation (default 1)")
    p.add_argument("--cpus-per-node", type=int, default=2, help="CPUs Ray gets on each node (default 2)")
    p.add_argument("--gpus-per-node", type=int, default=0, help="GPUs Ray gets on each node (default 0)")
    p.add_argument("--time", help="the job's time limit (SLURM formats: 90, 1:30:00, 2-00:00:00)")
    p.add_argument("--partition", help="SLURM partition")
    p.add_argument("--account", help="SLURM account to charge")
    p.add_argument("--sbatch", action="append", default=[], metavar="OPTION",
                   help="one more #SBATCH option, e.g. mem=32G or --sbatch=--mem=32G (repeatable)")
    p.add_argument("--setup", action="append", default=[], metavar="LINE",
                   help="a shell line run first on the first node, e.g. 'module load python/3.11' or "
                   "'source ~/venvs/mtbert/bin/activate' (repeatable); srun passes its environment to every node")
    p.add_argument("--grace", type=int, default=DEFAULT_GRACE_S,
                   help=f"seconds before the time limit that the sweep is stopped and the job requeued "
                   f"(default {DEFAULT_GRACE_S})")
    p.add_argument("--workdir", help="the job's folder on the shared filesystem: runs/, caches, the default "
                   "MLflow store and the job's log (default: the current folder)")
    p.add_argument("--tracking-uri", help="MLflow store as the nodes reach it: a server, or a sqlite file on "
                   "the shared filesystem (default: <workdir>/mlflow.db)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="as for `sweep run`")
    p.add_argument("--smoke", action="store_true", help="the sweep's seconds-long CI shrink")
    p.add_argument("--name", help="the sweep run's name before its job id (default: the file's name)")
    p.add_argument("--job-name", help="SLURM job name (default: mtbert-<name>)")
    p.add_argument("--mtbert", default="mtbert", metavar="COMMAND",
                   help="the command that runs mtbert on the nodes (default: mtbert on PATH)")
    p.add_argument("--ray", default="ray", metavar="COMMAND",
                   help="the command that runs ray on the nodes (default: ray on PATH)")
    p.add_argument("--ray-tmp", default="/tmp", metavar="DIR",
                   help="node-local folder for each node's Ray folder, ray-<job>-<node> (default /tmp; short: "
                   "Ray's socket paths live under it)")
    p.add_argument("--dry-run", action="store_true", help="print the batch script, submit nothing")
    p.set_defaults(func=_cmd_slurm)


__all__ = ["SlurmJob", "TEMPLATE", "job_script", "check", "submit", "time_limit_s", "add_slurm_command",
           "SlurmSweep", "find_slurm_sweep", "slurm_job", "slurm_status", "slurm_resume", "resume_slurm"]
