"""A sweep whose storage fills up mid-way stops in one line that names the folder and the
space it needed, leaves no MLflow run RUNNING, and `sweep resume` completes it once space is
freed. The storage is a small tmpfs volume (mounting needs root: skipped where not allowed)."""
from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .conftest import cli_env, descendants, run_cli, stop_pids, write_sweep
from .test_e2e import _wait_for, check_children, sweep_runs

pytestmark = pytest.mark.slow


@pytest.fixture
def volume(tmp_path):
    folder = tmp_path / "volume"
    folder.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=32m", "tmpfs", str(folder)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {mounted.stderr.strip() or mounted.stdout.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True)


def _fill(folder: Path) -> Path:
    """Take every free byte of the volume."""
    filler = folder / "filler.bin"
    with filler.open("wb", buffering=0) as f:  # unbuffered: nothing left to fail at close
        for size in (1 << 16, 4096, 1):
            try:
                while True:
                    f.write(b"\0" * size)
            except OSError:
                pass
    return filler


def _checkpoints(run_dir: Path) -> int:
    return len(list(run_dir.glob("*/checkpoint_*")))


def test_full_disk_stops_in_one_line_and_resume_completes(tmp_path, volume):
    sweep = write_sweep(tmp_path / "disk.yaml",
                        space={"sharing.head_regime": ["S-I-I", "I-S-S", "S-S-S"]}, max_concurrent=2,
                        base={"train": {"epochs": 3}, "sampling": {"steps_per_epoch": 60}},
                        baseline={"sharing.head_regime": "I-I-I"},
                        tracking={"experiment": "disk", "log_models": "none"})
    log = tmp_path / "driver.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "mtbert.cli", "sweep", "run", str(sweep), "--name", "full",
                                 "--num-cpus", "2", "--storage", str(volume)], cwd=tmp_path, stdout=out,
                                stderr=subprocess.STDOUT, env=cli_env(), start_new_session=True)
    family: list[int] = []
    try:
        _wait_for(lambda: _checkpoints(volume / "full") >= 1, 240, "a first checkpoint", proc, log)
        family = descendants(proc.pid)
        filler = _fill(volume)
        code = proc.wait(240)
    finally:
        stop_pids([proc.pid, *family, *descendants(proc.pid)], grace_s=5)
    text = log.read_text()
    assert code == 2, text[-4000:]
    assert "Traceback" not in text and "ERROR" not in text, text[-4000:]
    errors = [line for line in text.splitlines() if line.startswith("mtbert: error:")]
    assert len(errors) == 1 and errors[0] == text.strip().splitlines()[-1], text[-3000:]
    assert re.fullmatch(rf"mtbert: error: storage {re.escape(str(volume / 'full'))} is full: [\d.]+ MB free, "
                        r"a trial's report needs about [\d.]+ MB; .*`\S*mtbert sweep resume full --storage "
                        rf"{re.escape(str(volume))}`", errors[0]), errors[0]
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    _, parents, children = sweep_runs(uri, "disk")
    assert parents[0].info.status == "KILLED"
    assert children and not [r for r in parents + children if r.info.status == "RUNNING"]
    stopped = [r for r in children if r.info.status != "FINISHED"]
    assert stopped and all(r.data.tags.get("interrupted") == "storage full" for r in stopped), \
        [(r.info.run_name, r.info.status, r.data.tags.get("interrupted")) for r in stopped]

    filler.unlink()
    time.sleep(0.5)
    done = run_cli(["sweep", "resume", "full", "--storage", str(volume), "--num-cpus", "2"], cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Traceback" not in done.stdout + done.stderr
    client, parents, children = sweep_runs(uri, "disk")
    check_children(client, parents[0], children, n=4)  # every trial FINISHED once, with every figure
    assert parents[0].info.status == "FINISHED"
