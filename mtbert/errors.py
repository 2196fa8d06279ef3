"""Errors the command line turns into one line. Here, not in train/loop.py, so that catching
them does not import torch and transformers (seconds on every `mtbert` command)."""
from __future__ import annotations

import difflib
from collections.abc import Iterable


def did_you_mean(word, options: Iterable[str], prefix: str = "", cutoff: float = 0.6) -> str:
    """The hint every unknown-name error ends with: " (did you mean 'X'?)" for the option
    closest to `word` (`prefix` before it), or "" when none is close enough."""
    close = difflib.get_close_matches(str(word), list(options), n=1, cutoff=cutoff)
    return f" (did you mean '{prefix}{close[0]}'?)" if close else ""


def first_line(what: BaseException | str, limit: int | None = None, sentence: bool = False) -> str:
    """The first line of an error's message (or of a text), for the one-line errors this project
    writes: a library's message often goes on for lines. An exception without a message gives
    its type's name; `sentence` keeps only the first sentence; `limit` caps the length."""
    text = str(what).strip()
    if not text:
        return type(what).__name__ if isinstance(what, BaseException) else ""
    line = text.splitlines()[0]
    return (line.split(". ")[0] if sentence else line)[:limit]


class TrainingError(RuntimeError):
    """Training cannot go on (e.g. a non-finite loss); the message is one readable line."""


class Diverged(TrainingError):
    """The loss went non-finite: the run failed to train. A sweep records it as a diverged seed
    of its configuration, a finding that the verdicts count (docs/verdicts.md), not a crash."""


def diverged_why(failure: str | None) -> str | None:
    """Why a run diverged, from a failed trial's one line ("<exception type>: <message>", as a
    sweep trial reports it), or None when that failure was not a Diverged."""
    prefix = f"{Diverged.__name__}: "
    return failure[len(prefix):] if failure and failure.startswith(prefix) else None


class CheckpointUnreadable(RuntimeError):
    """A resumable state that cannot be read (a file cut short by a kill or a full disk):
    the one line says which and why. Not a TrainingError: the run itself is sound, and
    whoever resumes may start from an older state or from the beginning instead."""


class DataError(ValueError):
    """A user error in data or data config: one readable line naming the file, row or key."""


class ConfigError(ValueError):
    """A user error in a config: one readable line, naming the file and key path. Here so that
    the components checking their own settings (mtbert/components.py) need not import the config."""
