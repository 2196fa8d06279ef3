"""Tune callbacks run in the sweep driver: MLflow tracking and the progress lines."""
from __future__ import annotations

import math
import re
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from ray.tune import Callback

from orchestration.labels import fmt_lr, regime_label
from orchestration.tracking import SweepTracking

_ERROR_LINE = re.compile(r"^[\w.]*(Error|Exception|Exit|Interrupt)\b.*")


def error_line(trial) -> str:
    """The one line that says why a trial failed (the exception, not Ray's traceback)."""
    text = ""
    path = getattr(trial, "error_file", None)
    if path and Path(path).is_file():
        text = Path(path).read_text(errors="replace")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in reversed(lines):
        if _ERROR_LINE.match(line):
            return line
    return lines[-1] if lines else "the trial failed (no error recorded)"


class TrackingCallback(Callback):
    """Every Tune event of a trial lands on its MLflow child run (see tracking.py)."""

    def __init__(self, tracking: SweepTracking):
        self.tracking = tracking
        self._history: dict[str, dict[int, dict[str, float]]] = {}

    def __getstate__(self) -> dict:
        # A restored sweep re-reads histories from MLflow, the durable copy.
        return {"tracking": self.tracking, "_history": {}}

    def _run(self, trial) -> str:
        run_id, created = self.tracking.child(trial.config, trial.trial_id)
        key = trial.config["key"]
        if key not in self._history:
            self._history[key] = {} if created else self.tracking.history(run_id)
        return run_id

    def on_trial_start(self, iteration: int, trials: list, trial, **info) -> None:
        self._run(trial)

    def on_trial_result(self, iteration: int, trials: list, trial, result: dict, **info) -> None:
        if "epoch" not in result:
            return
        run_id = self._run(trial)
        self._history[trial.config["key"]][int(result["epoch"])] = self.tracking.log_epoch(run_id, result)

    def on_trial_recover(self, iteration: int, trials: list, trial, **info) -> None:
        run_id = self._run(trial)
        self.tracking.client.set_tag(run_id, "retries", str(trial.num_failures))

    def on_trial_complete(self, iteration: int, trials: list, trial, **info) -> None:
        run_id = self._run(trial)
        self.tracking.finish(run_id, trial.config, self._history[trial.config["key"]], "FINISHED")
        self.tracking.backfill_tm()

    def on_trial_error(self, iteration: int, trials: list, trial, **info) -> None:
        run_id = self._run(trial)
        self.tracking.finish(run_id, trial.config, self._history[trial.config["key"]], "FAILED",
                             error=error_line(trial))


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes:2d}:{secs:02d}"


def describe(config: dict[str, Any]) -> str:
    """`I-S-S k=2 lr=3.2e-04` for a trial config (its swept values over the base)."""
    from mtbert.config import flatten

    flat = flatten(config.get("config", {}))
    label = regime_label(flat, list(config.get("values", {})), {})
    return f"{label} lr={fmt_lr(flat.get('optim.lr'))}"


class ProgressPrinter(Callback):
    """A line per finished / stopped / failed trial and a status line at most every
    `interval_s`: trials running/finished/stopped/failed/pending, best so far, elapsed."""

    def __init__(self, total: int, metric: str, mode: str, interval_s: float = 20.0,
                 stream: TextIO | None = None):
        self.total = total
        self.metric = metric
        self.mode = mode
        self.interval_s = interval_s
        self._stream = stream
        self._t0 = time.monotonic()
        self._last = 0.0
        self._stopped: set[str] = set()

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_stream"] = None
        return state

    def setup(self, **info) -> None:
        self._t0 = time.monotonic()
        self._last = self._t0

    def _print(self, text: str) -> None:
        stream = self._stream or sys.stdout
        print(f"[{_clock(time.monotonic() - self._t0)}] {text}", file=stream, flush=True)

    def _best(self, trials: list) -> str:
        scored = [(t.last_result.get(self.metric), t) for t in trials
                  if isinstance(t.last_result.get(self.metric), (int, float))
                  and not math.isnan(t.last_result[self.metric])]
        if not scored:
            return "best: none yet"
        pick = max if self.mode == "max" else min
        value, trial = pick(scored, key=lambda s: s[0])
        return f"best {self.metric} {value:.4f} ({trial.config['key']}: {describe(trial.config)})"

    def status(self, trials: list) -> str:
        counts = {"RUNNING": 0, "TERMINATED": 0, "ERROR": 0}
        for t in trials:
            counts[t.status] = counts.get(t.status, 0) + 1
        done = counts["TERMINATED"]
        stopped = len(self._stopped)
        pending = max(self.total - done - counts["ERROR"] - counts["RUNNING"], 0)
        return (f"{counts['RUNNING']} running, {done - stopped} finished, {stopped} stopped early, "
                f"{counts['ERROR']} failed, {pending} pending of {self.total} | {self._best(trials)}")

    def on_step_end(self, iteration: int, trials: list, **info) -> None:
        now = time.monotonic()
        if now - self._last >= self.interval_s:
            self._last = now
            self._print(self.status(trials))

    def on_trial_start(self, iteration: int, trials: list, trial, **info) -> None:
        self._print(f"start   {trial.config['key']:<14} {describe(trial.config)}")

    def on_trial_complete(self, iteration: int, trials: list, trial, **info) -> None:
        result = trial.last_result
        budget = trial.config["config"]["train"]["epochs"]
        epoch = int(result.get("epoch", 0))
        note = ""
        if epoch < budget:
            self._stopped.add(trial.config["key"])
            note = f", stopped early at epoch {epoch}/{budget}"
        value = result.get(self.metric)
        shown = f"{value:.4f}" if isinstance(value, (int, float)) else "n/a"
        self._print(f"done    {trial.config['key']:<14} {self.metric} {shown}, "
                    f"train {result.get('train_time_s', 0):.1f}s{note}")

    def on_trial_error(self, iteration: int, trials: list, trial, **info) -> None:
        self._print(f"FAILED  {trial.config['key']:<14} {error_line(trial)}")

    def on_trial_recover(self, iteration: int, trials: list, trial, **info) -> None:
        self._print(f"retry   {trial.config['key']:<14} from its last checkpoint "
                    f"(failure {trial.num_failures}): {error_line(trial)}")

    def on_experiment_end(self, trials: list, **info) -> None:
        self._print(self.status(trials))
