"""What stops a trial or the sweep, in the words the driver uses: the one line that says why a
trial failed, and the signals that end a whole process group.

The launcher and both Tune callbacks (callbacks.py, progress.py) read these, so they live
here, below all three: launch.py imports the callbacks, and nothing imports launch.py back.
"""
from __future__ import annotations

import re
import signal
from pathlib import Path

from orchestration.run.trainable import failure

# The signals that end a whole process group or job step at once: SLURM's scancel and the end
# of a job step (SIGTERM to every process of the step), a closing terminal (SIGHUP).
GROUP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)

_ERROR_LINE = re.compile(r"^[\w.]*(Error|Exception|Exit|Interrupt)\b.*")
# A worker killed by Ray's memory monitor (RAY_memory_usage_threshold of the node's memory):
# how a trial's error says so, and the stop reason when the kill escapes Tune (launch.py).
MEMORY_MONITOR = "killed by Ray's memory monitor"
MEMORY_MONITOR_SIGNS = ("ray.exceptions.OutOfMemoryError", "due to the node running low on memory")
_OOM_REASON = re.compile(r"OOM kill reason: (.+)")


def error_line(trial) -> str:
    """The one line that says why a trial failed (the exception, not Ray's traceback)."""
    reason = failure(trial.last_result)
    if reason:
        return reason
    path = getattr(trial, "error_file", None)
    text = Path(path).read_text(errors="replace") if path and Path(path).is_file() else ""
    return memory_monitor_line(text) or _last_error_line(text)


def memory_monitor_line(text: str) -> str | None:
    """The one line for a worker Ray's memory monitor killed, from its 40-line report (which
    ends on advice about Ray's settings): what it measured against what threshold."""
    if not any(sign in text for sign in MEMORY_MONITOR_SIGNS):
        return None
    why = _OOM_REASON.search(text)
    return f"{MEMORY_MONITOR}: {why.group(1).strip() if why else 'the node ran low on memory'}"


def _last_error_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    fallback = lines[-1] if lines else "the trial failed (no error recorded)"
    return next((line for line in reversed(lines) if _ERROR_LINE.match(line)), fallback)
