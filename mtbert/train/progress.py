"""A one-line progress bar for `mtbert train` on a terminal: epoch, step, loss, seq/s, ETA.

train() calls `step()` after every optimizer step and `end_epoch()` after each epoch; the
line is redrawn at most every `interval_s` (reading the loss is a device sync on a GPU, so
it is read only when drawn). The CLI creates the bar only when stdout is a terminal.
"""
from __future__ import annotations

import sys
import time
from typing import TextIO


def _clock(seconds: float) -> str:
    minutes, secs = divmod(max(int(seconds), 0), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes:02d}:{secs:02d}"


class ProgressBar:
    def __init__(self, epochs: int, stream: TextIO | None = None, interval_s: float = 0.2, width: int = 24):
        self.epochs = epochs
        self.stream = stream or sys.stdout
        self.interval_s = interval_s
        self.width = width
        self._drawn = 0.0
        self._epoch_t0: float | None = None
        self._shown = False

    def step(self, epoch: int, step: int, steps: int, seqs: int, losses) -> None:
        now = time.perf_counter()
        if self._epoch_t0 is None:
            self._epoch_t0 = now
        if now - self._drawn < self.interval_s and step != steps:
            return
        self._drawn = now
        elapsed = max(now - self._epoch_t0, 1e-9)
        loss = float(losses.sum()) if hasattr(losses, "sum") else float(losses)
        rate = step / elapsed
        # Remaining steps of this epoch plus the epochs after it at this epoch's pace.
        eta = (steps - step) / rate + (self.epochs - epoch) * steps / rate
        filled = int(self.width * step / max(steps, 1))
        bar = "#" * filled + "-" * (self.width - filled)
        line = (f"epoch {epoch}/{self.epochs} [{bar}] step {step}/{steps} loss {loss:.4f} "
                f"{seqs / elapsed:.0f} seq/s ETA {_clock(eta)}")
        self.stream.write("\r\x1b[2K" + line)
        self.stream.flush()
        self._shown = True

    def end_epoch(self) -> None:
        self._epoch_t0 = None
        self._drawn = 0.0

    def log(self, message: str) -> None:
        """A log line above the bar (the bar is redrawn by the next step)."""
        if self._shown:
            self.stream.write("\r\x1b[2K")
            self._shown = False
        self.stream.write(message + "\n")
        self.stream.flush()
