"""Peak memory is this run's own, even in a process that ran a bigger one before (Ray reuses
trial processes)."""
import os

import pytest
import torch

from mtbert.train import measure

CPU = torch.device("cpu")


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="peak reset is Linux-only")
def test_cpu_peak_resets_between_runs():
    measure.reset_peak_memory(CPU)
    big = torch.ones(400 * 2**20 // 4)  # 400 MB, touched
    after_big = measure.peak_memory_mb(CPU)
    del big
    measure.reset_peak_memory(CPU)
    small = torch.ones(20 * 2**20 // 4)
    after_small = measure.peak_memory_mb(CPU)
    del small
    assert after_big - after_small > 300, (after_big, after_small)


def test_cpu_peak_covers_current_use():
    measure.reset_peak_memory(CPU)
    before = measure.peak_memory_mb(CPU)
    block = torch.ones(100 * 2**20 // 4)
    assert measure.peak_memory_mb(CPU) >= before + 90
    del block
