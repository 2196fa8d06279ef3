"""`mtbert train` draws its progress bar on a terminal (a pseudo-terminal here) and not into
a pipe, and the bar's sequences/s is the epoch line's."""
import os
import pty
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BAR = re.compile(r"epoch (\d+)/2 \[[#-]{24}\] step (\d+)/(\d+) loss (\d+\.\d{4}) (\d+) seq/s ETA (\d\d:\d\d)")
EPOCH = re.compile(r"epoch (\d+)/2: .*\| (\d+) seq/s")


def train_args(tmp_path: Path) -> list[str]:
    return [sys.executable, "-m", "mtbert.cli", "train", "--output", str(tmp_path / "out"),
            "--set", f"data.cache_dir={tmp_path / 'cache'}", "--set", "train.epochs=2",
            "--set", "sampling.strategy=tuple", "--set", "sampling.steps_per_epoch=20",
            "--set", "data.synthetic.train_size=120", "--set", "data.synthetic.dev_size=60",
            "--set", "train.device=cpu"]


def env() -> dict:
    # One torch thread: on a machine with a busy core, a tiny model's two threads wait on
    # each other and a run takes minutes instead of seconds.
    return dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")


def run_in_terminal(args: list[str]) -> tuple[int, str]:
    master, slave = pty.openpty()
    proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave, env=env())
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    return proc.wait(timeout=300), b"".join(chunks).decode(errors="replace")


def test_bar_on_a_terminal_with_the_epoch_lines_rate(tmp_path):
    rc, out = run_in_terminal(train_args(tmp_path))
    assert rc == 0, out[-3000:]
    assert "\r\x1b[2K" in out
    draws = [tuple(map(float, m.groups()[:5])) for m in BAR.finditer(out)]
    assert {d[0] for d in draws} == {1.0, 2.0}, out[-3000:]
    epoch_rate = {int(m.group(1)): int(m.group(2)) for m in EPOCH.finditer(out)}
    for epoch in (1, 2):
        last = [d for d in draws if d[0] == epoch][-1]
        assert last[1] == last[2] == 20  # the epoch's last step is always drawn
        assert last[3] > 0
        # The same sequences over nearly the same interval as the epoch line's figure.
        assert 0.5 <= last[4] / max(epoch_rate[epoch], 1) <= 2, (last, epoch_rate)
    assert "best epoch" in out and "wrote" in out


def test_no_bar_into_a_pipe(tmp_path):
    proc = subprocess.run(train_args(tmp_path), capture_output=True, text=True, timeout=300, env=env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "epoch 2/2:" in proc.stdout
    assert "\x1b" not in proc.stdout and "\r" not in proc.stdout and " ETA " not in proc.stdout
