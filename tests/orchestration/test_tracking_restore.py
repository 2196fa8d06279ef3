"""Tune unpickles its own copy of the sweep's callbacks on `sweep resume`. That copy must change
the driver's record: also when it was pickled by an older mtbert (other private fields) and
when the sweep folder was moved or copied since it was saved."""
from __future__ import annotations

import pickle

from orchestration.track.tracking import SweepTracking


def test_a_restored_copy_writes_where_the_driver_reads(tmp_path):
    (tmp_path / "here").mkdir()
    driver = SweepTracking(f"sqlite:///{tmp_path / 'here' / 'mlflow.db'}", "1", "parent", "sweep",
                           state_dir=tmp_path / "here")
    try:
        record = driver.record  # the driver asks first
        saved = SweepTracking(f"sqlite:///{tmp_path / 'there' / 'mlflow.db'}", "1", "parent", "sweep",
                              state_dir=tmp_path / "there")
        state = {**saved.__getstate__(), "_live": None}  # as an older mtbert pickled it
        del state["_record"]
        older = SweepTracking.__new__(SweepTracking)
        older.__setstate__(state)
        for copy in (older, pickle.loads(pickle.dumps(saved))):
            assert not hasattr(copy, "_live")
            assert (copy.uri, copy.state_dir) == (driver.uri, driver.state_dir)
            assert copy.record is record
        assert not (tmp_path / "there").exists()
    finally:
        driver.release()


def test_a_restored_copy_keeps_the_sweeps_source_tags(tmp_path):
    saved = SweepTracking(f"sqlite:///{tmp_path / 'mlflow.db'}", "1", "parent", "sweep", state_dir=tmp_path)
    saved.source_tags = {"mlflow.source.name": "sweeps/smoke.yaml"}  # as start() sets them
    copy = pickle.loads(pickle.dumps(saved))
    # Trial runs created after `sweep resume` carry them as the first ones did.
    assert copy.source_tags == {"mlflow.source.name": "sweeps/smoke.yaml"}
