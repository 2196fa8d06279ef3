"""How the sweep folder keeps room to stop in: a held reserve, and the free space a report needs.

A full disk fails a trial's report with whatever the writer says, and then Tune cannot save
the sweep's state either, so a resume would have nothing to continue from. The driver holds
some space back while the sweep runs (hold_reserve), measures whether a trial's next report
still fits (storage_shortfall), and gives the space back to stop cleanly (release_reserve):
callbacks.TrackingCallback stops the sweep, launch.py says why.
"""
from __future__ import annotations

from pathlib import Path

MIN_FREE = 1 << 20
# Space the sweep folder holds back while the sweep runs, given up when the disk is full so that
# Tune can still save the sweep's state as it stops (a resume restores from it).
RESERVE = ".storage_reserve"
RESERVE_BYTES = 8 << 20


def hold_reserve(folder: str | Path) -> None:
    try:
        with (Path(folder) / RESERVE).open("wb") as f:
            f.truncate(0)
            f.write(b"\0" * RESERVE_BYTES)  # written, not sparse: the space is taken now
    except OSError:  # no room for it: the sweep goes on, and stops when it must
        release_reserve(folder)


def release_reserve(folder: str | Path) -> None:
    (Path(folder) / RESERVE).unlink(missing_ok=True)


def storage_shortfall(folder: str | Path) -> tuple[int, int] | None:
    """(bytes free, bytes needed) when the sweep folder cannot take a trial's next report,
    else None. A report writes its checkpoint twice at peak (train()'s copy, then Tune's), and
    a full disk fails it with whatever the writer says (torch: "unexpected pos"), so the
    space is measured, not the error read."""
    import shutil

    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return None
    largest = max((sum(f.stat().st_size for f in c.rglob("*") if f.is_file() and not f.is_symlink())
                   for c in Path(folder).glob("*/checkpoint_*")), default=0)
    need = max(2 * largest, MIN_FREE)
    return (free, need) if free < need else None
