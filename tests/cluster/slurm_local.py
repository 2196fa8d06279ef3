"""A real SLURM on this machine, for tests and by hand: munged, slurmctld and one slurmd, all
private to one folder (their own munge key and socket, config, state, logs and free ports),
with the node named as this machine and reached on 127.0.0.1.

    python tests/cluster/slurm_local.py DIR     # starts it, prints `export SLURM_CONF=...`, Ctrl-C stops it

Needs root (slurmd runs jobs as their user) and Debian's `slurm-wlm` and `munge` packages;
`unavailable()` says why not, for a test to skip with. Every daemon runs in the foreground in
its own process group and is ended by its PID, never by name.
"""
from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

DAEMONS = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "scontrol", "scancel", "srun")
START_TIMEOUT_S = 60.0


def unavailable() -> str | None:
    """Why a private SLURM cannot start here, or None."""
    missing = [d for d in DAEMONS if shutil.which(d) is None]
    if missing:
        return f"SLURM and munge are not installed (no {', '.join(missing)}): apt-get install slurm-wlm munge"
    if os.geteuid() != 0:
        return "a private slurmd needs root"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


CONF = """\
ClusterName=mtbert-test
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={dir}/munge/munge.sock
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd.pid
SlurmctldLogFile={dir}/log/slurmctld.log
SlurmdLogFile={dir}/log/slurmd.log
# No cgroups: the test shares this machine with everything else on it.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
JobRequeue=1
# Job ids of its own: the job script takes Ray's ports from the id, and another SLURM of this
# kind may run on the machine at the same time.
FirstJobId={first_job_id}
KillWait=30
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
# The node offers the CPUs the test asks for, whatever this machine has.
SlurmdParameters=config_overrides
NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


@dataclass
class LocalSlurm:
    dir: Path
    cpus: int = 2
    procs: list[subprocess.Popen] = field(default_factory=list)

    @property
    def conf(self) -> Path:
        return self.dir / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        """This environment, pointed at this SLURM (sbatch, scontrol and the jobs read SLURM_CONF)."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def _daemon(self, name: str, cmd: list[str]) -> None:
        log = (self.dir / "log" / f"{name}.out").open("w")
        self.procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                           start_new_session=True))

    def start(self) -> "LocalSlurm":
        d = self.dir
        for sub in ("munge", "state", "spool", "log"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        (d / "munge").chmod(0o700)
        subprocess.run(["mungekey", "--create", "--force", "--keyfile", str(d / "munge" / "munge.key")], check=True)
        host = socket.gethostname().split(".")[0]
        self.conf.write_text(CONF.format(host=host, ctld_port=free_port(), slurmd_port=free_port(), dir=d,
                                         cpus=self.cpus, first_job_id=random.randrange(1000, 60000, 100)))
        self._daemon("munged", ["munged", "--foreground", "--force", f"--socket={d}/munge/munge.sock",
                                f"--key-file={d}/munge/munge.key", f"--pid-file={d}/munge/munged.pid",
                                f"--seed-file={d}/munge/seed", f"--log-file={d}/log/munged.log"])
        self._wait(lambda: (d / "munge" / "munge.sock").exists(), "munged")
        self._daemon("slurmctld", ["slurmctld", "-D", "-i", "-f", str(self.conf)])
        self._wait(lambda: self.scontrol("ping").returncode == 0, "slurmctld")
        self._daemon("slurmd", ["slurmd", "-D", "-f", str(self.conf)])
        self._wait(lambda: "idle" in self.run(["sinfo", "-h", "-o", "%T"]).stdout, "slurmd")
        return self

    def _wait(self, ready, name: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not ready():
            dead = [p for p in self.procs if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                log = (self.dir / "log" / f"{name}.out").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"{name} did not start:\n{log}")
            time.sleep(0.5)

    def run(self, cmd: list[str], **kw) -> subprocess.CompletedProcess:
        return subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=60, **kw)

    def scontrol(self, *args: str) -> subprocess.CompletedProcess:
        return self.run(["scontrol", *args])

    def job(self, job_id: str) -> dict[str, str]:
        """`scontrol show job` as a dict (JobState, Restarts, ...)."""
        out = self.scontrol("show", "job", "-o", job_id).stdout
        return dict(item.split("=", 1) for item in out.split() if "=" in item)

    def stop(self) -> None:
        """slurmd, slurmctld, munged: SIGTERM to each, SIGKILL to what of its group is left."""
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(10)
        self.procs.clear()


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    why = unavailable()
    if why:
        print(f"slurm_local: {why}", file=sys.stderr)
        return 1
    def stopped(sig, frame):
        raise KeyboardInterrupt

    # Both set here: a shell that starts this in the background has it ignore SIGINT.
    signal.signal(signal.SIGINT, stopped)
    signal.signal(signal.SIGTERM, stopped)
    slurm = LocalSlurm(Path(argv[0]).resolve())
    try:
        slurm.start()
        print(f"export SLURM_CONF={slurm.conf}   # SLURM is up; Ctrl-C stops it", flush=True)
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        slurm.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
