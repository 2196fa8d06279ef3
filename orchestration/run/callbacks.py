"""Tune callbacks run in the sweep driver: MLflow tracking and the progress lines."""
from __future__ import annotations

import math
import re
import signal
import time
from pathlib import Path
from typing import Any

from ray.tune import Callback
from ray.tune.experiment import Trial

from orchestration.run.trainable import failure, keep_one_model
from orchestration.sweep.labels import fmt_lr, regime_label
from orchestration.track.tracking import STORAGE_FULL, SweepTracking

_ERROR_LINE = re.compile(r"^[\w.]*(Error|Exception|Exit|Interrupt)\b.*")


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


def error_line(trial) -> str:
    """The one line that says why a trial failed (the exception, not Ray's traceback)."""
    reason = failure(trial.last_result)
    if reason:
        return reason
    path = getattr(trial, "error_file", None)
    text = Path(path).read_text(errors="replace") if path and Path(path).is_file() else ""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    fallback = lines[-1] if lines else "the trial failed (no error recorded)"
    return next((line for line in reversed(lines) if _ERROR_LINE.match(line)), fallback)


class TrackingCallback(Callback):
    """Every Tune event of a trial changes its record, which its MLflow child run is synced to (tracking.py).

    Interrupts never lie: on Ctrl-C (or SIGTERM, or a tracking outage past its limit) Tune
    saves its state, then stops every running trial through `stop_trial`, which calls
    `on_trial_complete` as if the trial had finished. Those trials are marked KILLED with an
    `interrupted` tag instead (Tune's saved state has them running, so resume continues
    them), never FINISHED nor ASHA-stopped."""

    def __init__(self, tracking: SweepTracking):
        self.tracking = tracking

    def setup(self, **info) -> None:
        # Runs after Tune installed its own SIGINT handler: wrap it so the stop is known here
        # first, and make SIGTERM (a scheduler's or a `kill`'s) take the same graceful path.
        record = self.tracking.record
        try:
            tune_handler = signal.getsignal(signal.SIGINT)

            def on_signal(sig, frame):
                if sig:  # 0: the outage stop below
                    if record.stop_reason is not None:
                        raise KeyboardInterrupt  # a second signal: stop now
                    record.stop_reason = signal.Signals(sig).name
                if callable(tune_handler):
                    tune_handler(signal.SIGINT, frame)

            signal.signal(signal.SIGINT, on_signal)
            signal.signal(signal.SIGTERM, on_signal)
            self._handler = on_signal
        except ValueError:  # not the main thread: Tune installed nothing either
            self._handler = None

    def __getstate__(self) -> dict:
        return {"tracking": self.tracking}

    def _stop(self, reason: str) -> None:
        """Stop the sweep as a Ctrl-C does (Tune saves it; `sweep resume` continues it)."""
        self.tracking.record.stop_reason = reason
        import logging

        # The sweep's own line says what happened and how to resume; Tune's would not.
        logging.getLogger("ray.tune.tune").setLevel(logging.CRITICAL)
        if getattr(self, "_handler", None) is not None:
            self._handler(0, None)

    def _storage_full(self) -> bool:
        """A full sweep folder stops the sweep: every trial would fail its next report there,
        and retrying them only burns their retries."""
        tracking = self.tracking
        if tracking.record.stop_reason is None and tracking.state_dir:
            short = storage_shortfall(tracking.state_dir)
            if short is not None:
                tracking.record.full = short
                release_reserve(tracking.state_dir)
                self._stop(STORAGE_FULL)
        return tracking.record.stop_reason == STORAGE_FULL

    def on_step_end(self, iteration: int, trials: list, **info) -> None:
        if self.tracking.record.stop_reason is None:
            if self.tracking.given_up():
                self._stop("tracking outage")
            elif self.tracking.journal_failed():
                self._storage_full()

    def on_trial_start(self, iteration: int, trials: list, trial, **info) -> None:
        self.tracking.start_trial(trial.config, trial.trial_id)

    def on_trial_result(self, iteration: int, trials: list, trial, result: dict, **info) -> None:
        if "epoch" not in result:
            return
        self.tracking.start_trial(trial.config, trial.trial_id)
        self.tracking.log_epoch(trial.config["key"], result)

    def on_trial_recover(self, iteration: int, trials: list, trial, **info) -> None:
        self._storage_full()
        self.tracking.start_trial(trial.config, trial.trial_id)
        self.tracking.retried(trial.config["key"], trial.num_failures, error_line(trial))

    def on_trial_complete(self, iteration: int, trials: list, trial, **info) -> None:
        key = trial.config["key"]
        if key not in self.tracking.record.started and not trial.last_result:
            return  # stopped before it ever started (a pending trial at Ctrl-C)
        self.tracking.start_trial(trial.config, trial.trial_id)
        reason, log = self.tracking.record.stop_reason, _train_log(trial)
        if failure(trial.last_result):  # ended itself on a deterministic error (trainable.py)
            self.tracking.finish(trial.config, "FAILED", error=error_line(trial), train_log=log)
        elif reason is not None and not trial.last_result.get("done"):
            self.tracking.finish(trial.config, "KILLED", interrupted=reason, train_log=log)
        else:
            self.tracking.finish(trial.config, "FINISHED", train_log=log)
        keep_one_model(trial)  # [trainable] output/best: a link to the checkpoint's, not a copy

    def on_trial_error(self, iteration: int, trials: list, trial, **info) -> None:
        self._storage_full()
        self.tracking.start_trial(trial.config, trial.trial_id)
        reason = self.tracking.record.stop_reason
        if reason is not None:  # the signal reached the trial's worker too
            self.tracking.finish(trial.config, "KILLED", interrupted=reason, train_log=_train_log(trial))
        else:
            self.tracking.finish(trial.config, "FAILED", error=error_line(trial), train_log=_train_log(trial))
        keep_one_model(trial)  # [trainable]

    def on_experiment_end(self, trials: list, **info) -> None:
        """A trial Tune ended while the driver could not record it (killed between the two,
        or its folder full) is ended in the record from Tune's own, its last report included:
        a resumed Tune does not end it again. Tune calls this on every way out of a run
        (finished, interrupted, raised)."""
        record = self.tracking.record
        for trial in trials:
            key = (trial.config or {}).get("key")
            t = record.trials.get(key)
            if (t is None or t["status"] != "RUNNING" or key in record.started
                    or trial.status not in (Trial.TERMINATED, Trial.ERROR)):
                continue
            if "epoch" in (trial.last_result or {}):
                self.tracking.log_epoch(key, trial.last_result)
            if trial.status == Trial.TERMINATED and not failure(trial.last_result):
                self.tracking.finish(trial.config, "FINISHED")
            else:
                self.tracking.finish(trial.config, "FAILED", error=error_line(trial))


def _train_log(trial) -> str | None:
    """The trial's train.log in its folder of the sweep's storage (trainable.py writes it there)."""
    path = getattr(trial, "path", None)
    if not path or "://" in str(path):
        return None
    log = Path(path) / "train.log"
    return str(log) if log.is_file() else None


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes:2d}:{secs:02d}"


def describe(config: dict[str, Any]) -> str:
    """`I-S-S k=2 lr=3.2e-04` for a trial config (its swept values over the base)."""
    from mtbert.config import flatten

    flat = flatten(config.get("config", {}))
    if config.get("role") == "reference":  # its dozen overrides are mtbert.config.REFERENCE: one name
        return "frozen reference"
    label = regime_label(flat, list(config.get("values", {})), {})
    return f"{label} lr={fmt_lr(flat.get('optim.lr'))}"


class ProgressPrinter(Callback):
    """A line per finished / stopped / failed trial and a status line at most every
    `interval_s`: trials running/finished/stopped/failed/pending, best so far, elapsed."""

    interval_s = 20.0

    def __init__(self, total: int, metric: str, mode: str, tracking: SweepTracking | None = None,
                 upto: bool = False):
        self.tracking = tracking  # to tell an interrupt from a finish
        self.total = total
        self.upto = upto  # adaptive seeds: `total` is the most it may run, not a plan
        self.metric = metric
        self.mode = mode
        self._t0 = time.monotonic()
        self._last = 0.0
        self._stopped: set[str] = set()
        self._interrupted: set[str] = set()
        self._started: set[str] = set()  # trials started, and completed, under this driver
        self._completed: set[str] = set()

    def interrupted(self) -> bool:
        tracking = getattr(self, "tracking", None)
        return tracking is not None and tracking.record.stop_reason is not None

    def setup(self, **info) -> None:
        self._t0 = time.monotonic()
        self._last = self._t0
        self._started, self._completed = set(), set()  # this driver's, also on a resume

    def _print(self, text: str) -> None:
        print(f"[{_clock(time.monotonic() - self._t0)}] {text}", flush=True)

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
        failed = sum(key(t) not in cut and (t.status == "ERROR" or bool(failure(t.last_result))) for t in ended)
        done = len(ended) - interrupted - failed
        stopped = len(self._stopped)
        upto = getattr(self, "upto", False)
        pending = counts.get("PENDING", 0) if upto else max(self.total - done - failed - counts["RUNNING"], 0)
        return (f"{counts['RUNNING']} running, {done - stopped} finished, {stopped} stopped early, "
                f"{failed} failed, {pending} pending of {'up to ' if upto else ''}{self.total}"
                + (f" ({interrupted} interrupted)" if interrupted else "") + f" | {self._best(trials)}")

    def on_step_end(self, iteration: int, trials: list, **info) -> None:
        now = time.monotonic()
        if now - self._last >= self.interval_s:
            self._last = now
            self._print(self.status(trials))

    def on_trial_start(self, iteration: int, trials: list, trial, **info) -> None:
        self._started = getattr(self, "_started", set()) | {trial.config["key"]}
        self._print(f"start   {trial.config['key']:<14} {describe(trial.config)}")

    def on_trial_complete(self, iteration: int, trials: list, trial, **info) -> None:
        self._completed = getattr(self, "_completed", set()) | {trial.config["key"]}
        result = trial.last_result
        if failure(result):
            self._print(f"FAILED  {trial.config['key']:<14} {error_line(trial)} (deterministic: not retried)")
            return
        if not result.get("done") and self.interrupted():
            self._interrupted.add(trial.config["key"])
            if result:
                self._print(f"stopped {trial.config['key']:<14} interrupted at epoch {int(result.get('epoch', 0))}; "
                            "resume continues it")
            return
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
