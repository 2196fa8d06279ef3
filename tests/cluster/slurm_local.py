"""A real SLURM on this machine, for tests and by hand: munged, slurmctld and one slurmd, all
private to one folder (their own munge key and socket, config, state, logs and free ports),
with the node named as this machine and reached on 127.0.0.1.

    python tests/cluster/slurm_local.py DIR             # starts it, prints `export SLURM_CONF=...`, Ctrl-C stops it
    python tests/cluster/slurm_local.py DIR --nodes 2   # two nodes, each a network namespace (NetnsSlurm)

NetnsSlurm makes the nodes "hosts" of their own: each slurmd runs in a network namespace
(`ip netns add`, entered with `nsenter --net`) and a UTS namespace named after its node, with one address on a bridge that
also holds slurmctld's address in this machine's namespace. The nodes share this machine's
filesystem, as a cluster's nodes share theirs; what they do not share is the network: a Ray
head must be reached at its node's address, not at 127.0.0.1.

Needs root (slurmd runs jobs as their user) and Debian's `slurm-wlm` and `munge` packages;
`unavailable()` says why not, for a test to skip with (NetnsSlurm also needs `ip`, `nsenter`
and `unshare`). Every daemon runs in the foreground in its own process group and is ended by its
PID, never by name; NetnsSlurm's namespaces and bridge are removed with the processes left in
them, which are all its slurmds' jobs.
"""
from __future__ import annotations

import os
import random
import re
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


def unavailable(nodes: int = 1) -> str | None:
    """Why a private SLURM (of `nodes` namespaced nodes when more than one) cannot start here, or None."""
    missing = [d for d in DAEMONS if shutil.which(d) is None]
    if missing:
        return f"SLURM and munge are not installed (no {', '.join(missing)}): apt-get install slurm-wlm munge"
    if os.geteuid() != 0:
        return "a private slurmd needs root"
    if nodes > 1 and not all(shutil.which(c) for c in ("ip", "nsenter", "unshare")):
        return "nodes in network namespaces need `ip` (iproute2), `nsenter` and `unshare` (util-linux)"
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
        self.conf.write_text(self._conf_text())
        self._daemon("munged", ["munged", "--foreground", "--force", f"--socket={d}/munge/munge.sock",
                                f"--key-file={d}/munge/munge.key", f"--pid-file={d}/munge/munged.pid",
                                f"--seed-file={d}/munge/seed", f"--log-file={d}/log/munged.log"])
        self._wait(lambda: (d / "munge" / "munge.sock").exists(), "munged")
        self._daemon("slurmctld", ["slurmctld", "-D", "-i", "-f", str(self.conf)])
        self._wait(lambda: self.scontrol("ping").returncode == 0, "slurmctld")
        self._start_slurmd()
        return self

    def _conf_text(self) -> str:
        host = socket.gethostname().split(".")[0]
        return CONF.format(host=host, ctld_port=free_port(), slurmd_port=free_port(), dir=self.dir,
                           cpus=self.cpus, first_job_id=random.randrange(1000, 60000, 100))

    def _start_slurmd(self) -> None:
        self._daemon("slurmd", ["slurmd", "-D", "-f", str(self.conf)])
        self._wait(lambda: "idle" in self.run(["sinfo", "-h", "-o", "%T"]).stdout, "slurmd")

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


# The nodes' network: a bridge in this machine's namespace holding slurmctld's address (.1),
# and per node a namespace whose veth end holds .2, .3, ... with a default route through .1 (Ray
# finds a node's address by the route out; without one it falls back to 127.0.0.1).
NODE_LINES = """\
# The nodes: one slurmd each, in its own network namespace (NetnsSlurm).
SlurmdPidFile={dir}/slurmd-%n.pid
SlurmdSpoolDir={dir}/spool-%n
SlurmdLogFile={dir}/log/slurmd-%n.log
{nodes}
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


@dataclass
class NetnsSlurm(LocalSlurm):
    """`nodes` slurmds, node1..nodeN, each in a network namespace (and a UTS namespace with the
    node's name as hostname) on a private bridge with slurmctld, munged and the user's commands
    in this machine's namespace."""
    nodes: int = 2
    tag: str = field(default_factory=lambda: f"{os.getpid() % 10000:04d}{random.randrange(100):02d}")
    subnet: str = ""  # "10.A.B", chosen free at start
    namespaces: list[str] = field(default_factory=list)
    bridge: str | None = None

    @property
    def node_names(self) -> list[str]:
        return [f"node{i}" for i in range(1, self.nodes + 1)]

    def address(self, node: str) -> str:
        """The node's address (slurmctld's is `.1` of the same subnet: `self.ctld_address`)."""
        return f"{self.subnet}.{self.node_names.index(node) + 2}"

    @property
    def ctld_address(self) -> str:
        return f"{self.subnet}.1"

    def _ip(self, *args: str) -> None:
        out = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
        if out.returncode != 0:
            raise RuntimeError(f"network namespaces unavailable here: `ip {' '.join(args)}`: "
                               f"{(out.stderr.strip() or f'exit status {out.returncode}').splitlines()[0]}")

    def _free_subnet(self) -> str:
        taken = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True).stdout
        taken += subprocess.run(["ip", "-4", "route"], capture_output=True, text=True).stdout
        for _ in range(100):
            subnet = f"10.{random.randrange(100, 250)}.{random.randrange(1, 250)}"
            if f" {subnet}." not in f" {taken}" and f"{subnet}.0/" not in taken:
                return subnet
        raise RuntimeError("no free 10.x.y.0/24 subnet for the nodes' bridge")

    def _network(self) -> None:
        self.subnet = self._free_subnet()
        bridge = f"mtb{self.tag}br"  # interface names: 15 characters at most
        self._ip("link", "add", bridge, "type", "bridge")
        self.bridge = bridge
        self._ip("addr", "add", f"{self.ctld_address}/24", "dev", bridge)
        self._ip("link", "set", bridge, "up")
        for i, node in enumerate(self.node_names, 1):
            ns, veth = f"mtbert-{self.tag}-{node}", f"mtb{self.tag}v{i}"
            self._ip("netns", "add", ns)
            self.namespaces.append(ns)
            self._ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            self._ip("link", "set", veth, "master", bridge, "up")
            self._ip("-n", ns, "addr", "add", f"{self.address(node)}/24", "dev", "eth0")
            self._ip("-n", ns, "link", "set", "eth0", "up")
            self._ip("-n", ns, "link", "set", "lo", "up")
            self._ip("-n", ns, "route", "add", "default", "via", self.ctld_address)

    def start(self) -> "NetnsSlurm":
        try:
            self._network()
        except Exception:
            self.stop()
            raise
        try:
            return super().start()
        except Exception:
            self.stop()
            raise

    def _conf_text(self) -> str:
        host = socket.gethostname().split(".")[0]
        text = CONF.format(host=host, ctld_port=free_port(), slurmd_port=free_port(), dir=self.dir,
                           cpus=self.cpus, first_job_id=random.randrange(1000, 60000, 100))
        text = text.replace(f"SlurmctldHost={host}(127.0.0.1)", f"SlurmctldHost={host}({self.ctld_address})")
        text = re.sub(r"(?m)^Slurmd(PidFile|SpoolDir|LogFile)=.*\n", "", text)
        text = text[:text.index("NodeName=")]
        nodes = "\n".join(f"NodeName={node} NodeAddr={self.address(node)} CPUs={self.cpus} State=UNKNOWN"
                          for node in self.node_names)
        return text + NODE_LINES.format(dir=self.dir, nodes=nodes)

    def _start_slurmd(self) -> None:
        # The nodes' /etc/hosts, as a cluster's: each node and slurmctld's host by their bridge
        # address. And no DNS server: none is reachable from the bridge, and every lookup of a
        # name not in the file (Ray looks up the node's hostname) would wait for its timeouts.
        host = socket.gethostname().split(".")[0]
        hosts = self.dir / "hosts"
        hosts.write_text("127.0.0.1 localhost\n" + f"{self.ctld_address} {host}\n"
                         + "".join(f"{self.address(n)} {n}\n" for n in self.node_names))
        (self.dir / "resolv.conf").write_text("nameserver 127.0.0.1\n")
        for ns, node in zip(self.namespaces, self.node_names):
            (self.dir / f"spool-{node}").mkdir(exist_ok=True)
            # The network namespace entered as `ip netns exec NS` enters it, but without the fresh
            # sysfs it mounts over /sys, which hides the cgroup filesystem slurmd's cgroup plugin
            # insists on; a mount namespace of its own for the two files above, and a UTS namespace
            # for the node's own hostname (`hostname`, Ray's node name, slurmstepd's messages).
            self._daemon(f"slurmd-{node}", [
                "nsenter", f"--net=/run/netns/{ns}", "unshare", "--mount", "--propagation", "private", "--uts",
                "sh", "-c", f'mount --bind "$0/hosts" /etc/hosts && mount --bind "$0/resolv.conf" /etc/resolv.conf '
                f'&& hostname {node} && exec slurmd -D -N {node} -f "$0/slurm.conf"', str(self.dir)])
        self._wait(lambda: self.run(["sinfo", "-h", "-N", "-o", "%T"]).stdout.split().count("idle") == self.nodes,
                   "slurmd-node1")

    def stop(self) -> None:
        super().stop()
        # What the slurmds' jobs left in the namespaces (a Ray that outlived its step): started
        # by this cluster, ended by PID before the namespace goes.
        for ns in self.namespaces:
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
        for ns in self.namespaces:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        self.namespaces.clear()
        if self.bridge:
            subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)
            self.bridge = None


def main(argv: list[str]) -> int:
    nodes = 1
    if len(argv) == 3 and argv[1] == "--nodes" and argv[2].isdigit() and int(argv[2]) >= 1:
        nodes, argv = int(argv[2]), argv[:1]
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    why = unavailable(nodes)
    if why:
        print(f"slurm_local: {why}", file=sys.stderr)
        return 1
    def stopped(sig, frame):
        raise KeyboardInterrupt

    # Both set here: a shell that starts this in the background has it ignore SIGINT.
    signal.signal(signal.SIGINT, stopped)
    signal.signal(signal.SIGTERM, stopped)
    folder = Path(argv[0]).resolve()
    slurm = NetnsSlurm(folder, nodes=nodes) if nodes > 1 else LocalSlurm(folder)
    try:
        slurm.start()
        if nodes > 1:
            print("nodes: " + ", ".join(f"{n} at {slurm.address(n)} (network namespace {ns})"
                                        for n, ns in zip(slurm.node_names, slurm.namespaces)), flush=True)
        print(f"export SLURM_CONF={slurm.conf}   # SLURM is up; Ctrl-C stops it", flush=True)
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        slurm.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
