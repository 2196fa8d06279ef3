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
"""
from __future__ import annotations

import argparse
import re
import shlex
import shutil
import subprocess
import sys
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
sweep=<<SWEEP_NAME>>-$SLURM_JOB_ID  # the same name in every run of this job: a requeue resumes it
cpus=$SLURM_CPUS_PER_TASK
# Ray's ports from the job id: two sweeps sharing a node must not meet on Ray's defaults.
port=$(( 20000 + SLURM_JOB_ID % 4000 * 10 ))
nodes=($(scontrol show hostnames "$SLURM_JOB_NODELIST"))
head_ip=${MTBERT_HEAD_IP:-$(hostname -I | awk '{print $1}')}  # set MTBERT_HEAD_IP in --setup to pick another interface
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
srun --nodes=1 --ntasks=1 --overlap --cpus-per-task="$cpus" -w "${nodes[0]}" --output="slurm-%j-ray-%N.out" \\
  <<RAY>> start --head --block --node-ip-address="$head_ip" --port="$port" \\
  --ray-client-server-port=$((port + 1)) --dashboard-agent-listen-port=$((port + 2)) \\
  --include-dashboard=false --num-cpus="$cpus" --num-gpus=<<GPUS>> \\
  --temp-dir=<<RAY_TMP>>/ray-$SLURM_JOB_ID-"${nodes[0]}" --disable-usage-stats &
for node in "${nodes[@]:1}"; do
  srun --nodes=1 --ntasks=1 --overlap --cpus-per-task="$cpus" -w "$node" --output="slurm-%j-ray-%N.out" \\
    <<RAY>> start --address="$head_ip:$port" --block --dashboard-agent-listen-port=$((port + 2)) \\
    --num-cpus="$cpus" --num-gpus=<<GPUS>> --temp-dir=<<RAY_TMP>>/ray-$SLURM_JOB_ID-"$node" --disable-usage-stats &
done
# Every node joined before the first trial, so trials spread over all of them.
joined=0
for _ in $(seq <<JOIN_WAIT>>); do
  [ -n "$stop" ] && break
  joined=$(<<RAY>> status --address="$head_ip:$port" 2>/dev/null | grep -c '^ *1 node_')
  [ "$joined" -ge "${#nodes[@]}" ] && break
  sleep 1
done
echo "mtbert: Ray at $head_ip:$port, $joined of ${#nodes[@]} node(s) joined: ${nodes[*]}"

rc=0
if [ -z "$stop" ]; then
  if [ "${SLURM_RESTART_COUNT:-0}" -gt 0 ]; then
    echo "mtbert: run $SLURM_RESTART_COUNT of a requeued job: resuming sweep $sweep"
    <<MTBERT>> sweep resume "$sweep" --address="$head_ip:$port" &
  else
    <<MTBERT>> sweep run <<FILE>> --name="$sweep" --address="$head_ip:$port"<<ARGS>> &
  fi
  driver=$!
  wait "$driver"; rc=$?
  # A signal ends `wait` early: wait again until the driver has closed the sweep.
  while kill -0 "$driver" 2>/dev/null; do wait "$driver"; rc=$?; done
fi
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
JOIN_WAIT_S = 120  # how long the script waits for every Ray node to join before the sweep starts


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
    print(f"submitted SLURM job {job_id}: sweep {sweep} on {job.nodes} node(s), folder {workdir}")
    print(f"  follow: squeue -j {job_id}; tail -f {workdir / f'slurm-{job_id}.out'}")
    print(f"  stop:   scancel --signal=INT --batch {job_id}   (the sweep stops cleanly, not requeued)")
    print(f"  resume: scontrol requeue {job_id}   (a stopped job's next run resumes its sweep)")
    print(f"  table:  {tool('mtbert')} leaderboard --experiment <the sweep's experiment> --tracking-uri "
          f"{shlex.quote(tracking_uri(args.tracking_uri, workdir))}")
    return 0


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


__all__ = ["SlurmJob", "TEMPLATE", "job_script", "check", "submit", "time_limit_s", "add_slurm_command"]
