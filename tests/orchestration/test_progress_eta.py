"""The time left on the sweep's status line: finished trials' mean duration, the running
trials' remainder of it, and the pending ones `max_concurrent` at a time."""
from __future__ import annotations

import re

import pytest
from ray.tune.experiment import Trial

from mtbert.train.progress import clock, time_left
from orchestration.run.progress import ProgressPrinter, time_left_by_configuration


def sweep_time_left(durations: list[float], running_for: list[float], pending: int, slots: int) -> float | None:
    """One configuration: every trial takes the mean of all finished ones."""
    return time_left_by_configuration({"": durations}, [("", t) for t in running_for], [""] * pending, slots)


def test_nothing_finished_is_no_estimate():
    assert sweep_time_left([], [10.0], pending=3, slots=2) is None
    assert time_left(0, 100, 5.0) is None


def test_pending_trials_wait_for_a_slot():
    # Mean 100 s. Two slots: the running trial ends in 70 s, the idle slot takes a pending
    # one now (ends at 100), the running trial's slot the next (70 + 100).
    assert sweep_time_left([80.0, 120.0], [30.0], pending=2, slots=2) == pytest.approx(170.0)
    # One slot: everything in a row.
    assert sweep_time_left([100.0], [30.0], pending=2, slots=1) == pytest.approx(270.0)
    # Enough slots for all: one trial's length.
    assert sweep_time_left([100.0], [], pending=4, slots=8) == pytest.approx(100.0)
    # A running trial past the mean is taken to end now; nothing left is no time.
    assert sweep_time_left([100.0], [150.0], pending=0, slots=1) == 0.0


def test_each_trial_is_timed_by_its_own_configuration():
    # A fine-tuned configuration's trials take 100 s, a frozen one's 10 s. One slot runs a
    # fine-tuned trial 40 s in; the other takes the frozen trial to come (10 s), then the
    # fine-tuned one (100 s): 110 s. The mean of all (55 s) would have said 70 s.
    durations = {"tuned": [100.0], "frozen": [10.0]}
    assert time_left_by_configuration(durations, [("tuned", 40.0)], ["frozen", "tuned"], 2) == pytest.approx(110.0)
    assert sweep_time_left([100.0, 10.0], [40.0], pending=2, slots=2) == pytest.approx(70.0)
    # A configuration with nothing finished yet takes the mean of all.
    assert time_left_by_configuration(durations, [], ["new"], 1) == pytest.approx(55.0)


def test_time_left_at_the_rate_so_far():
    assert time_left(250, 1000, 10.0) == pytest.approx(30.0)
    assert time_left(1000, 1000, 10.0) == 0.0
    assert clock(3 * 3600 + 65) == "3:01:05" and clock(65) == "01:05"


def _trial(key: str, status: str, role: str = "search") -> Trial:
    trial = Trial("fn", config={"key": key, "variant": key.rsplit("-s", 1)[0], "role": role,
                                "config": {"train": {"epochs": 1}}}, stub=True)
    trial.set_status(status)
    return trial


def test_the_status_line_says_the_time_left(capsys):
    printer = ProgressPrinter(total=4, metric="best_overall", mode="max", max_concurrent=2)
    printer.setup()
    first, second = _trial("a-s0", Trial.RUNNING), _trial("b-s0", Trial.RUNNING)
    for trial in (first, second):
        printer.on_trial_start(0, [first, second], trial)
    line = printer.status([first, second])
    assert "pending of 4 | best" in line  # nothing finished: no estimate yet
    # The first ran 120 s; the second has run 30 s of it and two are pending: the idle slot
    # runs one (120 s), the second's slot the other after its 90 s (210 s).
    printer._began["a-s0"] -= 120
    printer._began["b-s0"] -= 30
    first.run_metadata.last_result = {"done": True, "epoch": 1, "best_overall": 0.5}
    first.set_status(Trial.TERMINATED)
    printer.on_trial_complete(0, [first, second], first)
    line = printer.status([first, second])
    assert re.search(r"1 running, 1 finished, 0 stopped early, 0 failed, 2 pending of 4, about 03:(29|30) left "
                     r"\| best best_overall 0.5000", line), line
    second.set_status(Trial.TERMINATED)
    assert "left" not in printer.status([first, second] + [_trial(k, Trial.TERMINATED) for k in ("c", "d")])


def test_a_yardstick_is_never_the_best_so_far():
    # A single-task run's overall is one task's score (Quora's 0.83 beats any three-task mean):
    # the status line names the best trained configuration, as the closing summary does.
    printer = ProgressPrinter(total=3, metric="best_overall", mode="max")
    printer.setup()
    trials = [_trial("p000-s0", Trial.TERMINATED), _trial("single-para-s0", Trial.TERMINATED, "single_task"),
              _trial("reference-s0", Trial.TERMINATED, "reference")]
    for trial, value in zip(trials, (0.66, 0.83, 0.70)):
        trial.run_metadata.last_result = {"done": True, "epoch": 1, "best_overall": value}
    line = printer.status(trials)
    assert "| best best_overall 0.6600 (p000-s0: " in line, line
    assert "single-para" not in line and "reference-s0" not in line, line


def test_an_adaptive_sweep_says_what_is_left_of_its_round(tmp_path):
    """Tune asks an adaptive sweep's searcher for a trial only when a slot is free, so Tune's
    PENDING count stays 0 while most of a round waits: the line counts the round's trials from
    the searcher and times them, and says nothing of rounds that are not decided yet."""
    from orchestration.run.searcher import make_searcher
    from orchestration.sweep.load import load_sweep
    from orchestration.sweep.plan import Planner
    from tests.orchestration.conftest import write_sweep

    claim = {"name": "c", "metric": "overall", "a": {"optim.lr": 2e-3}, "b": {"role": "baseline"}, "relation": ">"}
    path = write_sweep(tmp_path / "a.yaml", space={"optim.lr": [2e-3]}, baseline={"optim.lr": 1e-3},
                       seeds={"start": 3, "max": 6}, claims=[claim])
    searcher = make_searcher(Planner(load_sweep(path)))
    printer = ProgressPrinter(total=searcher.total_trials, metric="best_overall", mode="max", upto=True,
                              max_concurrent=2, round_pending=searcher.round_pending)
    printer.setup()
    assert searcher.round_pending() == (1, ["baseline"] * 3 + ["p000"] * 3)  # 2 configurations x 3 seeds
    trials = [_trial(searcher.suggest(f"t{i}")["key"], Trial.RUNNING) for i in range(2)]
    for trial in trials:
        printer.on_trial_start(0, trials, trial)
    line = printer.status(trials)
    assert "2 running, 0 finished, 0 stopped early, 0 failed, 4 pending in round 1 (up to 12 trials in all) | " \
           "best" in line, line  # nothing finished: nothing to time the round by
    printer._began[trials[0].config["key"]] -= 60
    trials[0].run_metadata.last_result = {"done": True, "epoch": 1, "best_overall": 0.5}
    trials[0].set_status(Trial.TERMINATED)
    printer.on_trial_complete(0, trials, trials[0])
    # One slot free and 4 to go at 60 s each beside the running one: 4 more minutes, about.
    line = printer.status(trials)
    assert re.search(r"1 running, 1 finished, 0 stopped early, 0 failed, 4 pending in round 1 \(up to 12 trials "
                     r"in all\), about 0[23]:\d\d left in this round \| best", line), line
    # A printer without the searcher (one pickled by an older sweep) says only what Tune knows.
    assert "0 pending of up to 12 | best" in ProgressPrinter(12, "best_overall", "max", upto=True).status(trials)
