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
import hashlib
import os
import uuid
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Iterator
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


# --------------------------------------------------------------------------- in the process

REUSE_ENV = "MTBERT_REUSE"  # "0": nothing is kept between runs of a process (bench/overhead.py)


class ProcessMemo:
    """What a process keeps between the runs it makes. A sweep worker runs trial after trial
    (Ray Tune reuses its actors), and loading the same tokenizer, data and frozen features
    again was most of what a head-only trial cost besides its steps. Each entry is keyed by
    everything that decides it, contents of the files read included, so a reused worker never
    serves stale data; the least recently used entries go beyond `size`. Treat what it hands
    out as read-only: the next run gets the same object."""

    def __init__(self, size: int):
        self.size = size
        self._items: OrderedDict[Hashable, object] = OrderedDict()

    def get(self, key: Hashable):
        """The kept value, or None."""
        if key not in self._items or os.environ.get(REUSE_ENV) == "0":
            return None
        self._items.move_to_end(key)
        return self._items[key]

    def keep(self, key: Hashable, value: T) -> T:
        if os.environ.get(REUSE_ENV) != "0":
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self.size:
                self._items.popitem(last=False)
        return value

    def clear(self) -> None:
        self._items.clear()


def files_digest(paths: Iterable[Path]) -> str:
    """A digest of these files' names and contents (a missing file counts as missing): a few
    milliseconds per MB, read from the page cache on every run that asks."""
    h = hashlib.blake2b(digest_size=16)
    for path in paths:
        h.update(str(path).encode("utf-8", "surrogatepass") + b"\x1f")
        try:
            with open(path, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
        except OSError:
            h.update(b"\x00missing")
        h.update(b"\x1e")
    return h.hexdigest()


def folder_stamp(folder: Path) -> tuple:
    """The files of a folder (not its subfolders) by name, size and modification time: what a
    process checks before it reuses what it loaded from there (a model's weights, too large to
    read again for a digest on every run)."""
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError:
        return ()
    stamp = []
    for e in entries:
        try:
            if e.is_file():
                st = e.stat()
                stamp.append((e.name, st.st_size, st.st_mtime_ns, st.st_ino))
        except OSError:
            continue
    return tuple(stamp)
