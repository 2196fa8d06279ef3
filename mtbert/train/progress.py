"""A one-line progress bar for `mtbert train` on a terminal: epoch, step, loss, seq/s, ETA.

train() calls `start_epoch()` before an epoch's first step, `step()` after every step and
`end_epoch()` after the epoch's evaluation; the line is redrawn at most every `interval_s`
(reading the loss is a device sync on a GPU, so it is read only when drawn, and the clock is
read after it). The CLI creates the bar only when stdout is a terminal.

The rates: sequences/s is this epoch's sequences over the time since the epoch began, the
quantity the epoch line's `seq/s` reports (evaluation is not in it); the ETA is the epoch's
remaining steps at this epoch's step rate, plus each later epoch at the wall time of the last
whole one (its evaluation and checkpoint included), or at the step rate until one has ended.
"""
from __future__ import annotations

import heapq
import sys
import time
from typing import TextIO


def clock(seconds: float) -> str:
    """`07:05`, `1:02:03`: a duration as the progress lines show it."""
    minutes, secs = divmod(max(int(seconds), 0), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes:02d}:{secs:02d}"


def time_left(done: float, total: float, elapsed_s: float) -> float | None:
    """Seconds until `total` at the rate so far (`done` in `elapsed_s`); None while nothing is
    done, as no rate is known yet."""
    if done <= 0 or elapsed_s <= 0:
        return None
    return max(total - done, 0) * elapsed_s / done


def makespan(durations: list[float], slots: int, busy: list[float] | None = None) -> float:
    """Seconds until the last of `durations` ends when they start in order, `slots` at a time,
    each as soon as a slot frees up; `busy`: what the slots' present work still needs."""
    free = sorted(busy or [])[:max(slots, 1)]
    free += [0.0] * (max(slots, 1) - len(free))
    heapq.heapify(free)
    for seconds in durations:
        heapq.heappush(free, heapq.heappop(free) + seconds)
    return max(free)


class ProgressBar:
    def __init__(self, epochs: int, stream: TextIO | None = None, interval_s: float = 0.2, width: int = 24,
                 clock=time.perf_counter):
        self.epochs = epochs
        self.stream = stream or sys.stdout
        self.interval_s = interval_s
        self.width = width
        self.clock = clock
        self._drawn = 0.0
        self._epoch_t0: float | None = None
        self._epoch_wall: float | None = None  # the last whole epoch, evaluation included
        self._shown = False

    def start_epoch(self) -> None:
        now = self.clock()
        if self._epoch_t0 is not None:
            self._epoch_wall = now - self._epoch_t0
        self._epoch_t0 = now
        self._drawn = 0.0

    def step(self, epoch: int, step: int, steps: int, seqs: int, losses) -> None:
        """`seqs`: sequences trained so far in this epoch (all tasks of the steps so far)."""
        if self._epoch_t0 is None:  # a caller that never said when the epoch began
            self._epoch_t0 = self.clock()
        if self.clock() - self._drawn < self.interval_s and step != steps:
            return
        loss = float(losses.sum()) if hasattr(losses, "sum") else float(losses)  # syncs a GPU
        now = self._drawn = self.clock()
        elapsed = max(now - self._epoch_t0, 1e-9)
        step_s = elapsed / max(step, 1)
        later = self._epoch_wall if self._epoch_wall is not None else steps * step_s
        eta = (steps - step) * step_s + (self.epochs - epoch) * later
        filled = int(self.width * step / max(steps, 1))
        bar = f"[{'#' * filled + '-' * (self.width - filled)}] " if self.width else ""
        self._draw(f"epoch {epoch}/{self.epochs} {bar}step {step}/{steps} loss {loss:.4f} "
                   f"{seqs / elapsed:.0f} seq/s ETA {clock(eta)}")

    def _draw(self, line: str) -> None:
        self.stream.write("\r\x1b[2K" + line)
        self.stream.flush()
        self._shown = True

    def end_epoch(self) -> None:
        self._drawn = 0.0

    def log(self, message: str) -> None:
        """A log line above the bar (the bar is redrawn by the next step)."""
        if self._shown:
            self.stream.write("\r\x1b[2K")
            self._shown = False
        self.stream.write(message + "\n")
        self.stream.flush()


class ProgressLog(ProgressBar):
    """The bar's figures as a log line every `interval_s` (a sweep trial's train.log, which
    otherwise says nothing until its epoch ends): `epoch 1/2 step 120/300 loss 3.1 412 seq/s
    ETA 02:10`. The first line of an epoch comes after `interval_s`, when its rate means something."""

    def __init__(self, epochs: int, log, interval_s: float = 30.0, clock=time.perf_counter):
        super().__init__(epochs, interval_s=interval_s, width=0, clock=clock)
        self._log = log

    def start_epoch(self) -> None:
        super().start_epoch()
        self._drawn = self._epoch_t0

    def step(self, epoch: int, step: int, steps: int, seqs: int, losses) -> None:
        if step != steps:  # the epoch's own line says how it ended
            super().step(epoch, step, steps, seqs, losses)

    def end_epoch(self) -> None:
        pass

    def _draw(self, line: str) -> None:
        self._log(line)

    def log(self, message: str) -> None:
        self._log(message)
