"""The progress bar's figures against a made-up clock: sequences/s is this epoch's sequences
over this epoch's time (the first step's time included, evaluation not), and the ETA prices
later epochs at the last whole epoch's wall time."""
import io
import re

from mtbert.train.progress import ProgressBar, ProgressLog


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def last_line(stream: io.StringIO) -> str:
    return stream.getvalue().split("\r\x1b[2K")[-1]


def test_rate_is_sequences_over_the_epoch_and_eta_counts_evaluation():
    clock, out = Clock(), io.StringIO()
    bar = ProgressBar(3, stream=out, interval_s=0.0, clock=clock)
    bar.start_epoch()
    clock.t = 1.0  # first step: 16 sequences in 1 s
    bar.step(1, 1, 4, 16, 0.5)
    assert "16 seq/s" in last_line(out), last_line(out)
    clock.t = 4.0
    bar.step(1, 4, 4, 64, 0.25)
    line = last_line(out)
    assert re.search(r"epoch 1/3 \[#+\] step 4/4 loss 0\.2500 16 seq/s ETA 00:08$", line), line
    clock.t = 10.0  # 6 s of evaluation and checkpoint: not in the rate, in the ETA
    bar.end_epoch()
    bar.start_epoch()
    clock.t = 12.0
    bar.step(2, 2, 4, 32, 0.1)
    line = last_line(out)
    # 2 steps left at 1 s each, then one epoch at the last one's 10 s.
    assert "step 2/4" in line and "16 seq/s" in line and line.endswith("ETA 00:12"), line


def test_log_lines_clear_the_bar_and_draws_are_throttled():
    clock, out = Clock(), io.StringIO()
    bar = ProgressBar(1, stream=out, interval_s=1.0, clock=clock)
    bar.start_epoch()
    clock.t = 2.0
    bar.step(1, 1, 10, 8, 1.0)
    clock.t = 2.5
    bar.step(1, 2, 10, 16, 1.0)  # within the interval: not drawn
    assert out.getvalue().count("step ") == 1
    bar.log("hello")
    assert out.getvalue().endswith("\r\x1b[2Khello\n")


def test_a_trials_log_gets_a_line_every_interval_within_the_epoch():
    # A sweep trial's train.log: no bar, no terminal codes; the first line after the interval
    # (a rate from one step means little), none for the epoch's last step (its own line follows).
    clock, lines = Clock(), []
    progress = ProgressLog(2, lines.append, interval_s=30.0, clock=clock)
    progress.start_epoch()
    for step in range(1, 101):
        clock.t = step * 1.0  # 1 s a step, 16 sequences each
        progress.step(1, step, 100, 16 * step, 0.5)
    assert lines == ["epoch 1/2 step 30/100 loss 0.5000 16 seq/s ETA 02:50",
                     "epoch 1/2 step 60/100 loss 0.5000 16 seq/s ETA 02:20",
                     "epoch 1/2 step 90/100 loss 0.5000 16 seq/s ETA 01:50"], lines
