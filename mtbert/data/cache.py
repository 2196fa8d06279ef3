"""Files under `data.cache_dir` that the trials of a sweep share: built once per machine.

Everything stored there (a tiny tokenizer, tokenized splits, frozen-layer outputs) is keyed by
what decides it, so a stored file is never stale, and it is written through a temporary file
and a rename, so a reader never sees half of one. Trials that start together and miss the
same entry would each build it; `build_once` makes one of them build it while the others wait
on a lock beside the file and then load what it stored (for MiniLM's frozen layers over the
CS224N training data that is minutes of a core saved per extra trial).
"""
from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

from mtbert.errors import DataError

T = TypeVar("T")


def atomic_write(path: Path, write: Callable[[Path], object]) -> None:
    """Write via a temporary file and rename, so racing processes never read a partial file."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
        try:
            write(tmp)
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
    except OSError as exc:
        raise DataError(f"data.cache_dir: cannot write {path} ({exc.strerror or exc})") from None


def build_once(path: Path, load: Callable[[Path], T | None], build: Callable[[], T],
               save: Callable[[T, Path], object]) -> tuple[T, bool]:
    """(what `path` holds, False), or (what `build` made and stored there, True).

    `load` returns None for a missing or unreadable file (a miss, never an error). On a miss
    the caller takes the lock and looks again: a process that waited finds the winner's file."""
    found = load(path)
    if found is not None:
        return found, False
    with _locked(path):
        found = load(path)
        if found is not None:
            return found, False
        made = build()
        atomic_write(path, lambda tmp: save(made, tmp))
        return made, True


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    try:
        import fcntl
    except ImportError:  # no flock (Windows): racing trials build twice, as before, and agree
        yield
        return
    lock = path.with_name(f".{path.name}.lock")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(lock, "a")
    except OSError as exc:
        raise DataError(f"data.cache_dir: cannot write {lock} ({exc.strerror or exc})") from None
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            # Removed while held: a waiter then locks the old inode and finds the stored file,
            # and a newcomer finds the file before it looks for a lock. No lock files pile up.
            lock.unlink(missing_ok=True)
            fcntl.flock(handle, fcntl.LOCK_UN)
