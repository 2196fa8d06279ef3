"""The sweep's console: a line per trial event and a status line every little while.

A Tune callback in the driver, apart from the tracking one: it prints, and decides nothing
that MLflow or a resume sees. Its lines are also what `mtbert sweep status` parses from a Ray
Job's log (jobs.py), so their wording is an interface.
"""
from __future__ import annotations

import math
import time
from pathlib import Path
from collections.abc import Callable
from typing import Any

from ray.tune import Callback

from mtbert.errors import diverged_why
from mtbert.train.progress import clock, makespan
from orchestration.run.stops import error_line
from orchestration.run.trainable import ended, failure
from orchestration.sweep.labels import YARDSTICKS, fmt_rates, regime_label
from orchestration.track.tracking import SweepTracking


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes:2d}:{secs:02d}"


def diverged(result: dict[str, Any] | None) -> bool:
    """A trial that ended itself because its loss went non-finite (mtbert.errors.Diverged):
    what its configuration does, a finding, not a fault of the sweep."""
    return diverged_why(failure(result)) is not None


def describe(config: dict[str, Any]) -> str:
    """`I-S-S k=2 lr=3.2e-04` for a trial config (its swept values over the base)."""
    from mtbert.config import flatten

    flat = flatten(config.get("config", {}))
    if config.get("role") == "reference":  # its dozen overrides (config.reference_settings()): one name
        return "frozen reference"
    if config.get("role") == "single_task":
        return f"single-task {flat['tasks'][0]}"
    label = regime_label(flat, list(config.get("values", {})), {})
    return f"{label} lr={fmt_rates(flat)}"


def time_left_by_configuration(durations: dict[str, list[float]], running: list[tuple[str | None, float]],
                               pending: list[str | None], slots: int) -> float | None:
    """Seconds until the sweep's last trial ends: each trial takes the mean of its own
    configuration's finished trials (`durations` by variant; a fine-tuned trial and a frozen
    one differ 25-fold), else of all of them; a running one what it lacks of that (`running`:
    variant, seconds it has run), and the `pending` variants start as slots free up, `slots`
    trials at a time. None before a trial has finished: nothing tells how long one takes yet."""
    every = [d for ds in durations.values() for d in ds]
    if not every:
        return None
    overall = sum(every) / len(every)

    def expect(variant: str | None) -> float:
        own = durations.get(variant or "")
        return sum(own) / len(own) if own else overall
    # A trial past its mean is taken to end now: that is all the mean can say of it.
    return makespan([expect(v) for v in pending], slots, [max(expect(v) - t, 0.0) for v, t in running])


class ProgressPrinter(Callback):
    """A line per finished / stopped / failed trial and a status line at most every
    `interval_s`: trials running/finished/stopped/failed/pending, the time left (see
    time_left_by_configuration), best so far, elapsed.
    `max_concurrent`: the trials Tune runs at once; None takes the most seen running."""

    interval_s = 20.0

    def __init__(self, total: int, metric: str, mode: str, tracking: SweepTracking | None = None,
                 upto: bool = False, max_concurrent: int | None = None,
                 round_pending: Callable[[], tuple[int, list[str]] | None] | None = None):
        self.tracking = tracking  # to tell an interrupt from a finish
        self.total = total
        self.upto = upto  # adaptive seeds: `total` is the most it may run, not a plan
        # Adaptive seeds: (round, its trials' variants not started yet) (SweepSearcher.round_pending), so
        # the line can say what is left of the round, which is planned, and how long it takes.
        self.round_pending = round_pending
        self.metric = metric
        self.mode = mode
        self._t0 = time.monotonic()
        self._last = 0.0
        self._stopped: set[str] = set()
        self._interrupted: set[str] = set()
        self._started: set[str] = set()  # trials started, and completed, under this driver
        self._completed: set[str] = set()
        self.max_concurrent = max_concurrent
        self._began: dict[str, float] = {}  # trial key -> when it started under this driver
        # The trials finished under this driver, start to end, by configuration (variant).
        self._durations: dict[str, list[float]] = {}
        self._most_running = 0

    def interrupted(self) -> bool:
        tracking = getattr(self, "tracking", None)
        return tracking is not None and tracking.record.stop_reason is not None

    def setup(self, **info) -> None:
        self._t0 = time.monotonic()
        self._last = self._t0
        self._started, self._completed = set(), set()  # this driver's, also on a resume
        self._began, self._durations, self._most_running = {}, {}, 0

    def _print(self, text: str) -> None:
        print(f"[{_clock(time.monotonic() - self._t0)}] {text}", flush=True)

    def _best(self, trials: list) -> str:
        # The reference and the single-task runs are yardsticks, never the best (a single-task
        # run's overall is one task's score, not comparable with the others').
        scored = [(t.last_result.get(self.metric), t) for t in trials
                  if t.config.get("role") not in YARDSTICKS
                  and isinstance(t.last_result.get(self.metric), (int, float))
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
        key = lambda t: t.config["key"]  # noqa: E731
        # Tune marks a trial stopped by Ctrl-C TERMINATED, and one that ended itself failed. A
        # trial the stop caught before its first report is never completed in a callback, so
        # while stopping, one that started under this driver and did not complete is counted
        # interrupted: the count then agrees with the sweep's closing summary.
        stopping = self.interrupted()
        running = getattr(self, "_started", set()) - getattr(self, "_completed", set())
        cut = set(getattr(self, "_interrupted", ())) | {
            key(t) for t in trials if stopping and t.status == "TERMINATED" and key(t) in running}
        ended = [t for t in trials if t.status in ("TERMINATED", "ERROR")]
        interrupted = sum(key(t) in cut for t in ended)
        gone = sum(key(t) not in cut and diverged(t.last_result) for t in ended)
        failed = sum(key(t) not in cut and (t.status == "ERROR" or bool(failure(t.last_result))) for t in ended) - gone
        done = len(ended) - interrupted - failed - gone
        stopped = len(self._stopped)
        upto = getattr(self, "upto", False)
        pending = counts.get("PENDING", 0) if upto else max(self.total - done - failed - gone - counts["RUNNING"], 0)
        of = f"of {'up to ' if upto else ''}{self.total}"
        in_round = self._round(pending) if upto else None
        coming: int | list[str | None] = pending
        if in_round is not None:  # adaptive: the round is planned, what follows it is not
            coming, of = in_round[1], f"in round {in_round[0]} (up to {self.total} trials in all)"
            pending = len(coming)
        left = self._time_left(trials, coming) if not stopping and (not upto or in_round) else ""
        return (f"{counts['RUNNING']} running, {done - stopped} finished, {stopped} stopped early, "
                + (f"{gone} diverged, " if gone else "") + f"{failed} failed, {pending} pending {of}"
                + (f" ({interrupted} interrupted)" if interrupted else "")
                + left + (" in this round" if left and upto else "") + f" | {self._best(trials)}")

    def _round(self, tune_pending: int) -> tuple[int, list[str | None]] | None:
        """(round, the variants of its trials not started) under adaptive seeds: those the
        searcher has not handed out yet, and Tune's PENDING ones; None where the searcher
        cannot say (a printer restored from an older sweep)."""
        ask = getattr(self, "round_pending", None)
        try:
            got = ask() if ask is not None else None
        except Exception:  # the progress line must never stop a sweep
            return None
        return None if got is None else (got[0], [*got[1], *[None] * tune_pending])

    def _time_left(self, trials: list, pending: int | list[str | None]) -> str:
        """`, about 12:40 left` (empty with nothing left, or nothing finished to time it by).
        `pending`: how many trials are to come, or (adaptive seeds, the round's) their variants."""
        now = time.monotonic()
        began = getattr(self, "_began", {})
        # A running trial this driver did not start (restored on a resume) has no start: it is
        # counted as just started.
        running = [(t.config.get("variant"), now - began.get(t.config["key"], now))
                   for t in trials if t.status == "RUNNING"]
        self._most_running = max(getattr(self, "_most_running", 0), len(running))
        slots = getattr(self, "max_concurrent", None) or self._most_running
        durations = getattr(self, "_durations", {})
        durations = {"": durations} if isinstance(durations, list) else durations
        coming = pending if isinstance(pending, list) else [None] * pending
        left = time_left_by_configuration(durations, running, coming, slots)
        # Nothing left by the means while a trial still runs: it is past them (a configuration
        # no trial of this driver has finished yet, say), and they no longer tell.
        return f", about {clock(left)} left" if left and (running or coming) else ""

    def on_step_end(self, iteration: int, trials: list, **info) -> None:
        now = time.monotonic()
        if now - self._last >= self.interval_s:
            self._last = now
            self._print(self.status(trials))

    def on_trial_start(self, iteration: int, trials: list, trial, **info) -> None:
        if ended(trial):  # restored from a lagging Tune state: it does not run (trainable.py)
            return
        self._started = getattr(self, "_started", set()) | {trial.config["key"]}
        if not hasattr(self, "_began"):  # a printer pickled before these existed
            self._began, self._durations = {}, {}
        self._began.setdefault(trial.config["key"], time.monotonic())  # a retry keeps its first start
        self._print(f"start   {trial.config['key']:<14} {describe(trial.config)}")

    def on_trial_complete(self, iteration: int, trials: list, trial, **info) -> None:
        if trial.config["key"] not in getattr(self, "_started", set()) and ended(trial):
            return  # ended before this driver: restored from a lagging Tune state, not run (trainable.py)
        self._completed = getattr(self, "_completed", set()) | {trial.config["key"]}
        result = trial.last_result
        if failure(result):
            what = "DIVERGED" if diverged(result) else "FAILED  "
            self._print(f"{what} {trial.config['key']:<14} {error_line(trial)} (deterministic: not retried)")
            return
        if not result.get("done") and self.interrupted():
            self._interrupted.add(trial.config["key"])
            if result:
                self._print(f"stopped {trial.config['key']:<14} interrupted at epoch {int(result.get('epoch', 0))}; "
                            "resume continues it")
            return
        began = getattr(self, "_began", {}).get(trial.config["key"])
        if began is not None:
            if isinstance(self._durations, list):  # a printer pickled when they were one list
                self._durations = {"": self._durations}
            self._durations.setdefault(trial.config.get("variant", ""), []).append(time.monotonic() - began)
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
        if self.interrupted():  # the stop (a full disk, a signal) failed it: resume runs it again
            self._interrupted.add(trial.config["key"])
            self._print(f"stopped {trial.config['key']:<14} {self.tracking.record.stop_reason}; resume continues it")
            return
        self._print(f"FAILED  {trial.config['key']:<14} {error_line(trial)}")

    def on_trial_recover(self, iteration: int, trials: list, trial, **info) -> None:
        if self.interrupted():
            return  # no retry: the sweep is stopping, and resume continues the trial
        # Say what it resumes from: a trial that failed before its first epoch has no checkpoint.
        checkpoint = getattr(trial, "checkpoint", None)
        start = f"from its checkpoint {Path(checkpoint.path).name}" if checkpoint is not None \
            else "from the start (no checkpoint yet)"
        self._print(f"retry   {trial.config['key']:<14} {start} "
                    f"(failure {trial.num_failures}): {error_line(trial)}")

    def on_experiment_end(self, trials: list, **info) -> None:
        self._print(self.status(trials))
