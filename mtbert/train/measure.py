"""Where the figures come from: device choice, wall-clock of training steps, peak memory."""
from __future__ import annotations

import resource
import sys
import time

import torch


def pick_device(choice: str = "auto") -> torch.device:
    if choice == "cuda" and not torch.cuda.is_available():
        raise ValueError("train.device: cuda requested but no CUDA device is visible")
    if choice == "auto":
        choice = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(choice)


def sync(device: torch.device) -> None:
    # CUDA kernels run asynchronously: a clock read without a sync times the launch only.
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class StepTimer:
    """Accumulates the time of training steps only (evaluation and checkpointing excluded)."""

    def __init__(self, device: torch.device, elapsed: float = 0.0):
        self.device, self.elapsed, self._t0 = device, elapsed, None

    def __enter__(self):
        sync(self.device)
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        sync(self.device)
        self.elapsed += time.perf_counter() - self._t0


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_mb(device: torch.device) -> float:
    """CUDA peak allocated memory, or the process's peak resident set size on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 2**20 if sys.platform == "darwin" else rss / 2**10  # bytes on macOS, KiB on Linux
