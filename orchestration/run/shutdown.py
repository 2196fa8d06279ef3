"""Ending the local Ray a sweep started, without waiting on signals its processes cannot hear.

A local Ray's processes start with SIGTERM and SIGHUP blocked (launch.py: a signal sent to the
whole process group must reach the driver alone). Ray's own shutdown asks each of them to end
with SIGTERM and gives each a second before SIGKILL, so with SIGTERM blocked every sweep's exit
waited about four seconds for nothing. `stop_local_ray` runs Ray's shutdown with a watcher
beside it: a child of the driver that holds a pending SIGTERM (Ray has asked it to end) gets
the SIGKILL Ray would send a second later. Linux shows pending signals in /proc; elsewhere the
watcher finds nothing and Ray's shutdown runs as it always did, as it does for a process that
held a SIGTERM before the shutdown began (sent to the whole group).
"""
from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

_PROC = Path("/proc")
_SIGTERM_BIT = 1 << (signal.SIGTERM - 1)  # the bit of SIGTERM in /proc/<pid>/status's masks


def _children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (their stat's fourth field)."""
    found = []
    for entry in _PROC.glob("[0-9]*"):
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # ended meanwhile
            continue
        # The command name (second field) may hold spaces and parentheses: split after its last ')'.
        fields = stat[stat.rfind(")") + 2:].split()
        if len(fields) > 1 and int(fields[1]) == pid:
            found.append(int(entry.name))
    return found


def term_pending(pid: int) -> bool:
    """Whether `pid` holds a SIGTERM it has blocked (sent to it, not yet delivered)."""
    try:
        status = (_PROC / str(pid) / "status").read_text()
    except OSError:
        return False
    for line in status.splitlines():
        if line.startswith(("ShdPnd:", "SigPnd:")) and int(line.split()[1], 16) & _SIGTERM_BIT:
            return True
    return False


def _kill_asked(stop: threading.Event, before: set[int], every_s: float = 0.02) -> None:
    parent = os.getpid()
    while not stop.wait(every_s):
        for pid in _children(parent):
            if pid not in before and term_pending(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass


def stop_local_ray() -> None:
    """ray.shutdown(), each process Ray asks to end ended at once (see the module's doc)."""
    import ray

    if not ray.is_initialized():
        return
    # A SIGTERM pending before the shutdown begins came from a signal to the whole group (the
    # sweep stopped for it), not from Ray: such a process waits Ray's second, as it always did
    # (ending Ray's GCS before the driver has let go of it hangs the driver).
    before = {pid for pid in _children(os.getpid()) if term_pending(pid)}
    stop = threading.Event()
    watcher = threading.Thread(target=_kill_asked, args=(stop, before), name="mtbert-ray-stop", daemon=True)
    watcher.start()
    try:
        ray.shutdown()
    finally:
        stop.set()
        watcher.join()
