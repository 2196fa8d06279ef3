"""One rule for every path a command writes to (`--output`, `--plot`, the files beside them),
checked before any work: a folder where a file is meant, a file where a folder is meant, or
a place that cannot be written is one line naming the option and the path, and nothing is
written anywhere (no folder made, no stray file beside it). Nothing is created here: the
command makes its folders when it writes, after its work has succeeded."""
from __future__ import annotations

import os
import shutil
from pathlib import Path


class OutputError(ValueError):
    """An output path a command cannot write: one line naming the option and the path."""


def remove_path(path: Path) -> None:
    """Clear `path` for what replaces it: a link goes (never what it points to), a folder goes
    with all it holds, a file goes; nothing there is fine."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def _existing_ancestor(path: Path) -> Path:
    here = path.absolute().parent
    while not here.exists() and here != here.parent:
        here = here.parent
    return here


def _check_can_create(path: Path, option: str) -> None:
    """`path` does not exist yet: the folders above it can be made and written."""
    above = _existing_ancestor(path)
    if not above.is_dir():
        raise OutputError(f"{option} {path}: {above} is a file, not a folder")
    if not os.access(above, os.W_OK | os.X_OK):
        raise OutputError(f"{option} {path}: cannot write in {above} (permission denied)")


def check_output_file(path: str | Path, option: str = "--output") -> Path:
    """A file the command will write (replacing it if it exists)."""
    path = Path(path)
    if path.is_dir():
        raise OutputError(f"{option} {path}: is a folder; name a file")
    if path.exists():
        if not os.access(path, os.W_OK) or not os.access(path.absolute().parent, os.W_OK | os.X_OK):
            raise OutputError(f"{option} {path}: cannot write it (permission denied)")
    else:
        _check_can_create(path, option)
    return path


def check_output_folder(path: str | Path, option: str = "--output", new: bool = False) -> Path:
    """A folder the command will write files into; `new`: it must not exist yet."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise OutputError(f"{option} {path}: exists and is not a folder")
    if path.is_dir():
        if new:
            raise OutputError(f"{option} {path}: exists; give a new folder")
        if not os.access(path, os.W_OK | os.X_OK):
            raise OutputError(f"{option} {path}: cannot write in it (permission denied)")
    else:
        _check_can_create(path, option)
    return path
