"""How a trial or the sweep fails, without a sweep: a deterministic error ends the trial with
its reason (no Ray internals patched), a full sweep folder is measured, the driver's record
survives a full disk, and the one Ray developer API the trainable reads is still there."""
from __future__ import annotations

import errno
import shutil
from collections import namedtuple
from types import SimpleNamespace

import pytest

from orchestration.run import trainable
from orchestration.run.storage import MIN_FREE, storage_shortfall
from orchestration.run.launch import parent_status
from orchestration.track.tracking import SweepRecord, _Syncer


def test_a_deterministic_error_ends_the_trial_with_its_reason(tmp_path, monkeypatch):
    reports = []
    monkeypatch.setattr(trainable, "_trial_folder", lambda experiment_dir, key: tmp_path)
    monkeypatch.setattr(trainable.tune, "report", lambda metrics, **kw: reports.append(metrics))
    trainable.run_trial({"key": "p000-s0", "config": {"__invalid__": "optim.lr: must be > 0"}})
    assert reports == [{trainable.FAILED: "ConfigError: trial p000-s0: optim.lr: must be > 0"}]
    assert trainable.failure(reports[0]).startswith("ConfigError")
    assert trainable.failure({"epoch": 1, "overall": 0.5}) is None
    text = (tmp_path / trainable.ERROR_NAME).read_text()
    assert text.count("Failure #") == 1 and "ConfigError" in text  # the traceback, as Tune's error.txt


def test_a_crash_still_raises_so_tune_retries_it(tmp_path, monkeypatch):
    monkeypatch.setattr(trainable, "_run_trial", lambda config, experiment_dir: (_ for _ in ()).throw(MemoryError("oom")))
    with pytest.raises(MemoryError):
        trainable.run_trial({"key": "p000-s0", "config": {}})


def test_the_parent_run_says_when_a_trial_failed():
    def run(status: str, **tags: str) -> SimpleNamespace:
        return SimpleNamespace(info=SimpleNamespace(status=status), data=SimpleNamespace(tags=tags))

    assert parent_status("FINISHED", [run("FINISHED"), run("FAILED")]) == "FAILED"
    assert parent_status("FINISHED", [run("FINISHED")]) == "FINISHED"
    assert parent_status("KILLED", [run("FAILED")]) == "KILLED"  # interrupted says interrupted
    # A seed that diverged is its configuration's finding, not the sweep's failure.
    assert parent_status("FINISHED", [run("FINISHED"), run("FAILED", diverged="loss of task 'sst' is nan")]) \
        == "FINISHED"


def test_a_full_sweep_folder_is_measured(tmp_path, monkeypatch):
    checkpoint = tmp_path / "p000-s0_abc" / "checkpoint_000001"
    checkpoint.mkdir(parents=True)
    (checkpoint / "state.pt").write_bytes(b"\0" * (1 << 20))
    assert storage_shortfall(tmp_path) is None or shutil.disk_usage(tmp_path).free < 2 << 20
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda folder: usage(10 << 20, 10 << 20, 4096))
    assert storage_shortfall(tmp_path) == (4096, 2 << 20)  # a report writes its checkpoint twice
    (checkpoint / "state.pt").unlink()
    assert storage_shortfall(tmp_path) == (4096, MIN_FREE)


class _FullDisk:
    def write(self, text):
        raise OSError(errno.ENOSPC, "No space left on device")

    flush = close = lambda self: None


def test_the_journal_on_a_full_disk_costs_the_journal_not_the_sweep(tmp_path):
    sent = []
    record = SweepRecord(tmp_path, fresh=True)
    record._file = _FullDisk()
    syncer = _Syncer(sent.append)
    record.change({"k": "p000-s0", "set": {"status": "FINISHED"}})
    syncer.mark("p000-s0")
    assert syncer.flush(timeout=10) and sent == ["p000-s0"]
    assert record.trials["p000-s0"]["status"] == "FINISHED"  # the record goes on in memory
    assert record.journal_error is not None and record.journal_error.errno == errno.ENOSPC
    syncer.close()


def test_the_ray_developer_api_the_trainable_reads_is_there():
    """trainable._trial_folder reads the trial's storage folder from Ray's train session (no
    public API gives it on a reused actor). Should Ray move it, this fails, not the sweep's logs."""
    import inspect

    from ray.train._internal import session
    from ray.train._internal.storage import StorageContext

    assert callable(session.get_session)
    assert hasattr(StorageContext, "trial_fs_path"), "ray.train StorageContext.trial_fs_path is gone"
    assert "self.storage_filesystem" in inspect.getsource(StorageContext.__init__), \
        "ray.train StorageContext.storage_filesystem is gone"


def test_a_memory_monitor_kill_escaping_tune_is_named():
    """Tune 2.60 lets a trial's OutOfMemoryError escape Tuner.fit() wrapped in a RuntimeError
    (its actor manager's "Caught unexpected exception") when the monitor kills a worker at
    some moments; the kill of test_faults comes the usual way, so this path is checked with
    Ray's own exception, raised and wrapped as Tune does."""
    from ray.exceptions import OutOfMemoryError

    from orchestration.run.launch import _memory_monitor_kill

    report = ("Task was killed due to the node running low on memory.\nMemory on the node was 3GB / 4GB\n"
              "OOM kill reason: Memory usage 3221225472B exceeded threshold of 3006477107B (70.0% of 4GB limit)\n")
    try:
        try:
            raise OutOfMemoryError(report)
        except OutOfMemoryError as oom:
            raise RuntimeError(f"Caught unexpected exception: {oom}") from oom
    except RuntimeError as escaped:
        line = _memory_monitor_kill(escaped)
    assert line == ("killed by Ray's memory monitor: Memory usage 3221225472B exceeded threshold of "
                    "3006477107B (70.0% of 4GB limit)")
    assert _memory_monitor_kill(RuntimeError("CUDA error: out of memory")) is None
