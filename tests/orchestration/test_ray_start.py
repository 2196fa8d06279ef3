"""A local Ray whose start times out on a busy machine is started once more, and a second miss is
one line naming the cause (Ray gives its raylet a fixed 30 s to register)."""
from __future__ import annotations

import pytest

from orchestration.errors import SweepError
from orchestration.run import launch

TIMED_OUT = Exception("The current node timed out during startup. This could happen because some of the "
                      "raylet failed to startup or the GCS has become overloaded.")


def starter(failures: int):
    calls = []

    def start():
        calls.append(1)
        if len(calls) <= failures:
            raise TIMED_OUT

    return start, calls


def test_a_start_that_timed_out_is_tried_once_more(capsys):
    start, calls = starter(1)
    launch._start_local_ray(start)
    assert len(calls) == 2
    assert "the local Ray's start timed out" in capsys.readouterr().err


def test_a_second_timeout_is_one_line():
    start, calls = starter(2)
    with pytest.raises(SweepError) as found:
        launch._start_local_ray(start)
    assert len(calls) == launch.RAY_START_TRIES
    assert "\n" not in str(found.value) and "the local Ray did not start" in str(found.value)


def test_any_other_failure_is_not_retried():
    def start():
        raise ValueError("bad runtime_env")

    with pytest.raises(ValueError, match="bad runtime_env"):
        launch._start_local_ray(start)
