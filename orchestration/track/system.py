"""System metrics of a trial: CPU, memory and GPU, sampled in the trial's worker each epoch.

Named as MLflow's own system metrics (`system/...`), so that the run's System metrics tab
charts them; tracking.py logs names under SYSTEM_PREFIX as they are, every other epoch figure
under `epoch/`. Here in track/ rather than run/ because the names are MLflow's and tracking.py
must know the prefix; the trainable only calls sample().
"""
from __future__ import annotations

import os
import time
from pathlib import Path

SYSTEM_PREFIX = "system/"  # MLflow's prefix for system metrics (its System metrics tab)


class SystemSampler:
    """CPU, memory and GPU figures of the trial process and its machine, read from /proc and
    torch (no psutil needed), named as MLflow's own system metrics."""

    def __init__(self):
        self._last = self._clocks()

    @staticmethod
    def _clocks() -> tuple[float, float, tuple[int, int] | None]:
        """(wall clock, this process's CPU seconds, the machine's (all, idle) CPU ticks)."""
        t = os.times()
        try:
            fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
            ticks = (sum(fields), fields[3] + (fields[4] if len(fields) > 4 else 0))
        except (OSError, ValueError, IndexError):
            ticks = None
        return time.monotonic(), t.user + t.system, ticks

    def sample(self) -> dict[str, float]:
        out: dict[str, float] = {}
        (wall0, cpu0, ticks0), (wall, cpu, ticks) = self._last, self._clocks()
        if wall > wall0:
            out["process_cpu_utilization_percentage"] = 100.0 * (cpu - cpu0) / (wall - wall0)
        if ticks and ticks0 and ticks[0] > ticks0[0]:
            busy = (ticks[0] - ticks0[0]) - (ticks[1] - ticks0[1])
            out["cpu_utilization_percentage"] = 100.0 * busy / (ticks[0] - ticks0[0])
        self._last = (wall, cpu, ticks)
        try:
            info = {line.split(":")[0]: int(line.split()[1]) for line in
                    Path("/proc/meminfo").read_text().splitlines() if line.split()[1:2]}
            used = info["MemTotal"] - info["MemAvailable"]
            out["system_memory_usage_megabytes"] = used / 1024
            out["system_memory_usage_percentage"] = 100.0 * used / info["MemTotal"]
        except (OSError, KeyError, ValueError, IndexError):
            pass
        try:
            pages = int(Path("/proc/self/statm").read_text().split()[1])
            out["process_memory_rss_megabytes"] = pages * os.sysconf("SC_PAGE_SIZE") / 2**20
        except (OSError, ValueError, IndexError):
            pass
        out.update(self._gpu())
        return {SYSTEM_PREFIX + k: float(v) for k, v in out.items()}

    @staticmethod
    def _gpu() -> dict[str, float]:
        import torch

        if not torch.cuda.is_available() or not torch.cuda.is_initialized():
            return {}
        out = {}
        for i in range(torch.cuda.device_count()):
            free, total = torch.cuda.mem_get_info(i)
            out[f"gpu_{i}_memory_usage_megabytes"] = (total - free) / 2**20
            out[f"gpu_{i}_memory_usage_percentage"] = 100.0 * (total - free) / total
            try:
                out[f"gpu_{i}_utilization_percentage"] = float(torch.cuda.utilization(i))
            except Exception:  # noqa: BLE001 - needs NVML; memory alone is still worth logging
                pass
        return out
