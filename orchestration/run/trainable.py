"""The Ray Tune function trainable: one sweep trial = one call of mtbert's `train()`.

It adapts train()'s reporter to Tune (a report plus the epoch's checkpoint directory, every
epoch) and resumes from Tune's last checkpoint when a crashed trial is retried or a sweep is
restored. It does no tracking: the driver logs to MLflow from what Tune reports (see
orchestration/run/callbacks.py), so an ASHA stop or a dead worker cannot leave a run open.
"""
from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

from ray import tune

from mtbert.errors import first_line
from mtbert.outputs import remove_path

LOG_NAME = "train.log"  # in the trial folder: epoch lines, resumes, the worker pid
PROGRESS_EVERY_S = 30.0  # train.log's step/loss/rate/ETA line within an epoch, at most this often
ERROR_NAME = "error.txt"  # in the trial folder: the traceback of a failure, as Tune writes its own
# The key of a trial's last report when it failed for good: its one-line reason.
FAILED = "trial_failed"
# In the trial folder, written by the driver once the trial has ended for good (finished, or
# failed the same way every run would): Tune's saved state may lag behind the driver's (it
# is a snapshot; the driver may die or stop between the two), and a restored trial that
# Tune still holds as running must not train again.
ENDED_NAME = "ended"


def final_error_types() -> tuple[type, ...]:
    """Errors that fail the same way on every run of the same config: a non-finite loss at a
    fixed seed, a bad config. Retrying them (FailureConfig.max_failures, `sweep resume`) only
    burns the budget, so the trial ends itself with its reason as its last report: Tune holds
    it TERMINATED, never retried nor resumed, and tracking reads it as failed. A crash (a
    killed worker, an OOM, a lost node) still raises, and Tune retries it."""
    from mtbert.config import ConfigError
    from mtbert.errors import TrainingError

    from orchestration.errors import SweepError

    return (TrainingError, ConfigError, SweepError)


def failure(result: dict[str, Any] | None) -> str | None:
    """The reason a trial ended itself as failed (its last report), else None."""
    return (result or {}).get(FAILED)


def mark_ended(trial, status: str) -> None:
    """On the driver: the trial ended for good (`status`: FINISHED or FAILED)."""
    path = getattr(trial, "path", None)
    if path and "://" not in str(path):
        try:
            Path(path).mkdir(parents=True, exist_ok=True)
            (Path(path) / ENDED_NAME).write_text(status + "\n")
        except OSError:  # a full disk: a stale resume may then train it again, nothing worse
            pass


def ended(trial) -> str | None:
    """How the trial ended for good, if the driver said so (mark_ended); else None."""
    path = getattr(trial, "path", None)
    if not path or "://" in str(path):
        return None
    try:
        return (Path(path) / ENDED_NAME).read_text().strip() or None
    except OSError:
        return None


def _file_log(path: Path):
    def log(message: str) -> None:
        with path.open("a") as f:
            f.write(f"{time.strftime('%H:%M:%S')} {message}\n")
    return log


def trial_dirname(key: str, trial_id: str) -> str:
    """A trial's folder name in the sweep's storage (Tune's trial_dirname_creator)."""
    return f"{key}_{trial_id}"


def _trial_folder(experiment_dir: str | None, key: str) -> Path:
    """The trial's folder in the sweep's storage (runs/<sweep>/<trial>), where train.log and
    the model belong: the driver names the sweep's folder (`experiment_dir`), the trial's name
    follows from its key and id. Not get_trial_dir(): on a reused actor that is a scratch
    folder in Ray's session directory, which Tune never copies back (most trials lost their
    train.log that way)."""
    context = tune.get_context()
    if experiment_dir is None:  # run outside a sweep's driver
        return Path(context.get_trial_dir())
    return Path(experiment_dir) / trial_dirname(key, context.get_trial_id())


def run_trial(config: dict[str, Any], experiment_dir: str | None = None) -> None:
    """One trial; `experiment_dir`: the sweep's folder in Tune's storage (launch passes it)."""
    try:
        _run_trial(config, experiment_dir)
    except final_error_types() as exc:
        import traceback

        trial_dir = _trial_folder(experiment_dir, config["key"])
        try:
            trial_dir.mkdir(parents=True, exist_ok=True)
            with (trial_dir / ERROR_NAME).open("a") as f:  # Tune's own format: one "Failure #" per failure
                f.write(f"Failure # 1 (occurred at {time.strftime('%Y-%m-%d_%H-%M-%S')})\n{traceback.format_exc()}\n")
        except OSError:  # the traceback only: the reason goes with the report
            pass
        # No figures in this report: a searcher reads the trial as failed, ASHA skips it (no epoch).
        tune.report({FAILED: first_line(f"{type(exc).__name__}: {exc}", 2000)})


def _run_trial(config: dict[str, Any], experiment_dir: str | None) -> None:
    entered = time.perf_counter()
    from mtbert.config import ConfigError, build_config
    from mtbert.errors import CheckpointUnreadable
    from mtbert.train import measure
    from mtbert.train.loop import train
    from mtbert.train.progress import ProgressLog

    measure.fresh_process()  # a Ray worker runs trials and nothing else

    if "__invalid__" in config["config"]:
        raise ConfigError(f"trial {config['key']}: {config['config']['__invalid__']}")
    cfg = build_config(config["config"], source=f"trial {config['key']}")
    trial_dir = _trial_folder(experiment_dir, config["key"])
    trial_dir.mkdir(parents=True, exist_ok=True)
    log = _file_log(trial_dir / LOG_NAME)
    if (trial_dir / ENDED_NAME).is_file():  # restored from a Tune state older than its end
        log(f"trial {config['key']} already ended ({(trial_dir / ENDED_NAME).read_text().strip()}); not run again")
        return
    log(f"trial {config['key']} pid {os.getpid()}")

    from orchestration.track.system import SystemSampler

    system = SystemSampler()  # [system] CPU/memory/GPU of this trial, per epoch

    def reporter(metrics: dict, checkpoint_dir: str | None) -> None:
        # tune.report copies the directory into the sweep's storage before returning, so
        # train() may delete it afterwards. On a scheduler stop this raises SystemExit.
        checkpoint = tune.Checkpoint.from_directory(checkpoint_dir) if checkpoint_dir else None
        timings = {"setup": round(setup_s, 4), **metrics.get("timings", {})}
        tune.report({**metrics, "timings": timings, **system.sample()}, checkpoint=checkpoint)

    output_dir = trial_dir / "output" if cfg.train.save_checkpoint else None
    # A line every PROGRESS_EVERY_S in train.log: a live view of a trial inside its epoch.
    progress = ProgressLog(cfg.train.epochs, log, interval_s=PROGRESS_EVERY_S)
    checkpoint = tune.get_checkpoint()
    # What this trial spent before train(): imports (a fresh worker's), config, folder.
    setup_s = time.perf_counter() - entered
    if checkpoint is not None:
        for candidate in _checkpoints(checkpoint):
            with candidate.as_directory() as state_dir:
                log(f"resuming from {candidate.path}")
                try:
                    return train(cfg, reporter=reporter, output_dir=output_dir, resume_from=state_dir, log=log,
                                 progress=progress)
                except CheckpointUnreadable as exc:
                    log(f"warning: {exc}; trying the trial's next older checkpoint, else its start")
        log("warning: no readable checkpoint; training this trial from its start")
    train(cfg, reporter=reporter, output_dir=output_dir, log=log, progress=progress)


def _checkpoints(latest) -> list:
    """The checkpoint Tune restores, then the trial's other checkpoint folders, newest first:
    where Tune's one (a file in it cut short by a kill or a full disk) cannot be read, the
    trial continues from an older one, else from its start; retrying the unreadable one
    only burned the trial's retries and failed it. Unreadable is CheckpointUnreadable
    (mtbert/train/state.py), raised before the trial trains or reports anything."""
    import pyarrow.fs

    out = [latest]
    if isinstance(latest.filesystem, pyarrow.fs.LocalFileSystem):
        here = Path(latest.path)
        older = sorted((p for p in here.parent.glob("checkpoint_*") if p.is_dir() and p.name < here.name),
                       reverse=True)
        out += [tune.Checkpoint.from_directory(str(p)) for p in older]
    return out


def keep_one_model(trial) -> None:
    """Once a trial has ended (finished, stopped by the scheduler or an interrupt, failed), on
    the driver: the trial's folder keeps its model once. During the run output/best is the
    working copy that every checkpoint copies (train's report); afterwards it would be a second
    copy of the best/ in the last checkpoint (for fine-tuned MiniLM, 90 MB per trial), so it
    becomes a link to that one. The driver does it, not the trial: a trial that the scheduler
    stops at its last report is stopped there, and at the sweep's end its worker process may
    exit before the trial's own code runs again. A storage that is not a local folder keeps
    its copy. A retry or `sweep resume` of the trial trains into a fresh copy of the
    checkpoint's best/ (train's resume), never through the link."""
    path = getattr(trial, "path", None)
    if not path or "://" in str(path):
        return
    output = Path(path) / "output"
    try:
        for stale in output.glob(".checkpoint-*"):  # a report's folder whose trial was stopped in it
            shutil.rmtree(stale, ignore_errors=True)
        _refer_to_checkpoint(output / "best", trial.checkpoint)
    except OSError:  # a second copy costs disk, not the sweep: it stays
        pass


def _refer_to_checkpoint(best: Path, checkpoint) -> None:
    """output/best as a relative link to the checkpoint's best/ (the sweep folder can move)."""
    import pyarrow.fs

    if checkpoint is None or not isinstance(checkpoint.filesystem, pyarrow.fs.LocalFileSystem):
        return
    from mtbert.bundle import compact_bundle

    kept = Path(checkpoint.path) / "best"
    if not (kept / "model.pt").is_file():
        return
    # The bundle that stays: a slim one's weights compacted here, on the driver, once the
    # trial has ended, so that no trial's slot pays for it (mtbert/bundle.py).
    compact_bundle(kept)
    remove_path(best)
    best.parent.mkdir(parents=True, exist_ok=True)
    best.symlink_to(os.path.relpath(kept, best.parent), target_is_directory=True)
