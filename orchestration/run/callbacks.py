"""The Tune callback that tracks a sweep: every trial event of the driver into its record."""
from __future__ import annotations

import logging
import signal
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

from ray.tune import Callback
from ray.tune.experiment import Trial

from orchestration.run.stops import GROUP_SIGNALS, error_line
from orchestration.run.storage import release_reserve, storage_shortfall
from orchestration.run.trainable import ended, failure, keep_one_model, mark_ended
from orchestration.track.tracking import STORAGE_FULL, SweepTracking


class TrackingCallback(Callback):
    """Every Tune event of a trial changes its record, which its MLflow child run is synced to (tracking.py).

    Interrupts never lie: on Ctrl-C (or SIGTERM, or a tracking outage past its limit) Tune
    saves its state, then stops every running trial through `stop_trial`, which calls
    `on_trial_complete` as if the trial had finished. Those trials are marked KILLED with an
    `interrupted` tag instead (Tune's saved state has them running, so resume continues
    them), never FINISHED nor ASHA-stopped."""

    def __init__(self, tracking: SweepTracking):
        self.tracking = tracking

    def _keep_one_model(self, trial) -> None:
        """keep_one_model (trainable.py) in a thread of its own. Tune's loop is one thread: the
        50-100 ms that compacting a slim bundle took there (a 2-core AVX512-BF16 EPYC) held
        every worker's next trial. on_experiment_end waits for what is left, so the sweep ends
        with its trials' folders final."""
        if getattr(self, "_keeper", None) is None:
            self._keeper = ThreadPoolExecutor(1, thread_name_prefix="mtbert-keep")
            self._keeping: list[Future] = []
        ended = SimpleNamespace(path=getattr(trial, "path", None), checkpoint=trial.checkpoint)
        self._keeping.append(self._keeper.submit(keep_one_model, ended))

    def _kept(self) -> None:
        keeper = getattr(self, "_keeper", None)
        if keeper is None:
            return
        keeper.shutdown(wait=True)
        self._keeper = None
        for job in self._keeping:  # a second copy costs disk, not the sweep: a warning, no more
            if job.exception() is not None:
                logging.getLogger(__name__).warning("a trial's model stays as two copies: %s", job.exception())
        self._keeping = []

    def setup(self, **info) -> None:
        # Runs after Tune installed its own SIGINT handler: wrap it so the stop is known here
        # first, and make SIGTERM (a scheduler's or a `kill`'s) and SIGHUP (a closed terminal)
        # take the same graceful path.
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

            for sig in (signal.SIGINT, *GROUP_SIGNALS):
                signal.signal(sig, on_signal)
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
        if ended(trial):  # Tune's restored state lags the record: the trial does not run (trainable.py)
            return
        self.tracking.start_trial(trial.config, trial.trial_id)

    def on_trial_result(self, iteration: int, trials: list, trial, result: dict, **info) -> None:
        if "epoch" not in result or ended(trial):
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
        if ended(trial):  # ended before, in this record; Tune's state had lagged behind it
            return
        self.tracking.start_trial(trial.config, trial.trial_id)
        reason, log = self.tracking.record.stop_reason, _train_log(trial)
        if failure(trial.last_result):  # ended itself on a deterministic error (trainable.py)
            self.tracking.finish(trial.config, "FAILED", error=error_line(trial), train_log=log)
            mark_ended(trial, "FAILED")
        elif reason is not None and not trial.last_result.get("done"):
            self.tracking.finish(trial.config, "KILLED", interrupted=reason, train_log=log)
        else:
            self.tracking.finish(trial.config, "FINISHED", train_log=log)
            mark_ended(trial, "FINISHED")
        self._keep_one_model(trial)  # [trainable] output/best: a link to the checkpoint's, not a copy

    def on_trial_error(self, iteration: int, trials: list, trial, **info) -> None:
        self._storage_full()
        self.tracking.start_trial(trial.config, trial.trial_id)
        reason = self.tracking.record.stop_reason
        if reason is not None:  # the signal reached the trial's worker too
            self.tracking.finish(trial.config, "KILLED", interrupted=reason, train_log=_train_log(trial))
        else:
            self.tracking.finish(trial.config, "FAILED", error=error_line(trial), train_log=_train_log(trial))
        self._keep_one_model(trial)  # [trainable]

    def on_experiment_end(self, trials: list, **info) -> None:
        """A trial Tune ended while the driver could not record it (killed between the two,
        or its folder full) is ended in the record from Tune's own, its last report included:
        a resumed Tune does not end it again. Tune calls this on every way out of a run
        (finished, interrupted, raised)."""
        self._kept()
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
