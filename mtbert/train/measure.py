"""Where the figures come from: device choice, wall-clock of training steps, peak memory."""
from __future__ import annotations

import ctypes
import gc
import json
import os
import resource
import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import torch


def pick_device(choice: str = "auto") -> torch.device:
    if choice == "cuda" and not torch.cuda.is_available():
        raise ValueError("train.device: cuda requested but no CUDA device is visible")
    if choice == "auto":
        choice = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(choice)


def device_name(device: torch.device) -> str:
    """`cpu`, or `cuda (<the GPU's name>)`: what a run's report says it trained on."""
    return f"cuda ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else device.type


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


class Phases:
    """Wall seconds a run spends in each phase around its training steps (data, model, cache,
    eval, checkpoint, report): what a sweep trial costs besides the work it exists for, so a
    fixed cost that creeps in shows where (bench/overhead.py). A phase entered again adds up."""

    def __init__(self, device: torch.device | None = None):
        self.device, self.seconds = device, {}

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            if self.device is not None:
                sync(self.device)
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t0

    def snapshot(self, train_s: float) -> dict[str, float]:
        """The phases so far, with the training steps' own time as `train`."""
        return {**{k: round(v, 4) for k, v in self.seconds.items()}, "train": round(train_s, 4)}


# On CPU the peak is the process's resident-set high-water mark. Ray runs a sweep's trials one
# after another in the same worker process, so the lifetime peak (getrusage) would carry the
# largest earlier trial into every later one; Linux can reset the mark (proc(5), clear_refs
# "5"), which makes the figure this run's own peak. Elsewhere it stays the lifetime peak.
_CLEAR_REFS, _STATUS = "/proc/self/clear_refs", "/proc/self/status"


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    # The mark resets to the current RSS, which still holds what earlier runs in this process
    # freed but the allocator kept: collect and hand it back to the OS first (glibc only).
    _collect()
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass
    try:
        with open(_CLEAR_REFS, "w") as f:
            f.write("5")
    except OSError:
        pass


_frozen = False
_fresh = False  # fresh_process(): nothing but imports ran before this process's first run


def fresh_process() -> None:
    """Tell reset_peak_memory that this process has done nothing but import so far (a sweep
    worker, at each trial's start: only its first run heeds it)."""
    global _fresh
    _fresh = True


def _collect() -> None:
    """A full collection, and at a process's first run what lives then (the libraries, what
    the process keeps between runs: mtbert/data/cache.py ProcessMemo) moves out of the
    collector's sight, so later collections scan only what later runs make: in a sweep worker
    with torch and transformers loaded a full one took 0.3-0.6 s of every trial. A fresh
    process's first run (fresh_process) has nothing of an earlier one to collect: a full
    collection there scanned some 400,000 objects in 0.2 s and found no garbage (a 2-core
    AVX512-BF16 EPYC), so only the young generations, this run's own, are collected before the
    freeze. Objects of a first run that later become cyclic garbage stay (a run leaves a few
    hundred small ones, once)."""
    global _frozen
    from mtbert.data.cache import REUSE_ENV

    first = not _frozen and os.environ.get(REUSE_ENV) != "0"
    gc.collect(1 if first and _fresh else 2)
    if first:
        gc.freeze()
        _frozen = True


def peak_memory_mb(device: torch.device) -> float:
    """CUDA peak allocated memory, or the process's peak resident set size on CPU (since the
    last reset_peak_memory where the OS allows it)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    try:
        with open(_STATUS) as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 2**10  # kB
    except OSError:
        pass
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 2**20 if sys.platform == "darwin" else rss / 2**10  # bytes on macOS, KiB on Linux


# A sweep's driver measures the peaks once, on an idle device, and hands them to its trials
# here (JSON: peak_key -> FLOP/s): trials sharing a GPU that each measured their own would see
# the others' work. On an H200, eight trials at resources.gpu 0.125 measuring their own read
# MFUs of 2.5% to 14% for one configuration.
PEAKS_ENV = "MTBERT_MATMUL_PEAKS"
_peaks: dict[str, float] = {}


def peak_key(device: torch.device, precision: str, threads: int | None = None) -> str:
    """What a peak is measured for: the device (its model, for a GPU), the precision and, on a
    CPU, the number of threads."""
    key = f"{device_name(device)}|{precision}"
    return key if device.type == "cuda" else f"{key}|{threads or torch.get_num_threads()}"


def matmul_peak(device: torch.device, precision: str = "bf16") -> float:
    """FLOP/s of a large square matmul on this device in `precision` (bf16, tf32 or fp32), on
    the threads this process uses: the ceiling a run's MFU is read against. The sweep's own
    (PEAKS_ENV) where it measured this device, else measured once per process (about 0.1 s on
    one CPU thread, under 10 ms on a GPU)."""
    key = peak_key(device, precision)
    if key not in _peaks:
        shared = json.loads(os.environ.get(PEAKS_ENV) or "{}")
        _peaks[key] = shared[key] if key in shared else _measure_peak(device, precision)
    return _peaks[key]


def share_peaks(runs: Iterable[tuple[torch.device, str]], threads: int) -> None:
    """Measure the peak of every (device, precision) of a sweep's runs now, with the threads a
    trial will have, and hand them to the trials this process starts (PEAKS_ENV)."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        shared = json.loads(os.environ.get(PEAKS_ENV) or "{}")
        for device, precision in set(runs):
            shared[peak_key(device, precision, threads)] = _measure_peak(device, precision)
        os.environ[PEAKS_ENV] = json.dumps(shared)
    finally:
        torch.set_num_threads(before)


def _measure_peak(device: torch.device, precision: str) -> float:
    n, reps = (8192, 10) if device.type == "cuda" else (1024, 3)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    # A generator of its own: drawing from the global one would change a run's dropout masks
    # and samplers after the first measurement of a process, and no run would repeat.
    g = torch.Generator(device=device).manual_seed(0)
    a, b = (torch.randn(n, n, dtype=dtype, device=device, generator=g) for _ in range(2))
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high" if precision == "tf32" else "highest")
    try:
        a @ b  # warm-up: kernel choice, allocation
        best = float("inf")
        for _ in range(reps):  # the fastest repeat: the least disturbed by other work
            sync(device)
            t0 = time.perf_counter()
            a @ b
            sync(device)
            best = min(best, time.perf_counter() - t0)
    finally:
        torch.set_float32_matmul_precision(before)
    return 2 * n ** 3 / best


# The CPU flags Linux lists (proc(5)): a kernel interface that stays put. torch tells only
# through functions that are private (torch._C._cpu, torch.cpu._is_*) and move between
# releases: torch 2.13's torch._C._cpu has none of the checks this module once called, so
# there this file was already what decided.
_CPUINFO = "/proc/cpuinfo"


def cpu_has_bf16() -> bool:
    """Whether this CPU multiplies bf16 natively (AVX512-BF16 or AMX): there autocast to bf16
    runs matmuls several times faster than fp32; elsewhere it is emulated and slower. Without
    a /proc/cpuinfo (macOS, Windows), torch.cpu.get_capabilities() answers where this torch
    has it (public in recent releases; it asks the CPU itself), else the answer is no."""
    try:
        with open(_CPUINFO) as f:
            flags = f.read()
        return "avx512_bf16" in flags or "amx_bf16" in flags
    except OSError:
        pass
    capabilities = getattr(torch.cpu, "get_capabilities", None)
    if capabilities is None:
        return False
    found = capabilities()
    return bool(found.get("avx512_bf16") or found.get("amx_bf16"))
