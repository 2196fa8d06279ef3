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


@pytest.mark.parametrize("fresh", [False, True])
def test_the_first_run_collects_all_but_in_a_fresh_worker_then_freezes_once(fresh, monkeypatch):
    """Garbage of what a process did before its first run is collected before the freeze keeps
    it for good; a sweep worker, which only imported, collects just this run's young objects."""
    import gc

    calls = []
    monkeypatch.setattr(measure, "_frozen", False)
    monkeypatch.setattr(measure, "_fresh", False)
    monkeypatch.delenv("MTBERT_REUSE", raising=False)
    monkeypatch.setattr(gc, "collect", lambda generation=2: calls.append(generation) or 0)
    monkeypatch.setattr(gc, "freeze", lambda: calls.append("freeze"))
    if fresh:
        measure.fresh_process()
    measure.reset_peak_memory(CPU)
    measure.reset_peak_memory(CPU)
    assert calls == [1 if fresh else 2, "freeze", 2]


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="peak reset is Linux-only")
def test_blocks_a_worker_keeps_mapped_count_in_its_next_runs_cpu_peak(tmp_path):
    """What the leaderboard's caption says of CPU rows: the peak is the process's resident set,
    so frozen-layer blocks an earlier trial memory-mapped and the worker keeps (its ProcessMemo)
    count in the next trial's figure, and a run in a fresh process reads lower."""
    torch.save({"flat": torch.ones(150 * 2**20 // 4)}, tmp_path / "blocks.pt")
    kept = torch.load(tmp_path / "blocks.pt", weights_only=True, mmap=True)
    assert float(kept["flat"].sum()) > 0  # the earlier trial read every page
    measure.reset_peak_memory(CPU)
    with_blocks = measure.peak_memory_mb(CPU)
    del kept
    measure.reset_peak_memory(CPU)
    without = measure.peak_memory_mb(CPU)
    assert with_blocks - without > 120, (with_blocks, without)


def test_native_bf16_is_read_from_the_cpu_flags_and_elsewhere_from_torchs_public_answer(tmp_path, monkeypatch):
    cpuinfo = tmp_path / "cpuinfo"
    monkeypatch.setattr(measure, "_CPUINFO", str(cpuinfo))
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu avx512f avx512_bf16 avx512_vnni\n")
    assert measure.cpu_has_bf16()
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu avx512f amx_bf16 amx_tile\n")
    assert measure.cpu_has_bf16()
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_vnni\n")
    assert not measure.cpu_has_bf16()
    # No /proc/cpuinfo (macOS, Windows): torch.cpu.get_capabilities where this torch has it.
    cpuinfo.unlink()
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: {"avx2": True, "avx512_bf16": True}, raising=False)
    assert measure.cpu_has_bf16()
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: {"avx2": True}, raising=False)
    assert not measure.cpu_has_bf16()
    monkeypatch.delattr(torch.cpu, "get_capabilities", raising=False)
    assert not measure.cpu_has_bf16()
