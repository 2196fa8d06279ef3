"""orchestration/run/shutdown.py: a child that holds a blocked SIGTERM is seen as asked to end."""
import os
import signal
import subprocess
import sys
import time

import pytest

from orchestration.run.shutdown import _children, term_pending

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="pending signals are read from /proc")

BLOCKED = ("import signal, sys, time; signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM}); "
           "print('ready', flush=True); time.sleep(60)")


def test_a_blocked_sigterm_is_pending_until_sigkill():
    child = subprocess.Popen([sys.executable, "-c", BLOCKED], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        assert child.pid in _children(os.getpid())
        assert not term_pending(child.pid)
        child.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        while not term_pending(child.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert term_pending(child.pid) and child.poll() is None  # asked, and still alive: it cannot hear it
    finally:
        child.kill()
        child.wait(10)
    assert not term_pending(child.pid)  # gone: nothing to read
