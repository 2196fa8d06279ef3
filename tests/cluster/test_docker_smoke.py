"""docker/smoke.sh for real: the images built, PostgreSQL, MLflow, a Ray head and a Ray worker
in containers, a sweep submitted as a Ray Job, and its trials checked in MLflow and in the
leaderboard (the script's own checks), then nothing of it left running.

Needs a Docker daemon with BuildKit; skips at once without one. Minutes with a warm build
cache, tens of minutes cold. MTBERT_SMOKE_ARGS passes options to the script, e.g.
`--debian-base --local-torch` where no image registry is reachable (docs/docker-smoke.md).
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "docker" / "smoke.sh"
DOCKER = os.environ.get("DOCKER", "docker")
PREFIX = "mtbert-smoke-"


def no_daemon() -> str | None:
    """Why the script cannot run here, or None."""
    if shutil.which(DOCKER) is None:
        return f"no {DOCKER} command"
    try:
        out = subprocess.run([DOCKER, "info"], capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired:
        return f"`{DOCKER} info` did not answer in 20 s"
    if out.returncode != 0:
        lines = (out.stderr or out.stdout).strip().splitlines()
        return "no Docker daemon answers: " + (lines[-1] if lines else f"exit {out.returncode}")
    # The images need BuildKit: built into clients before 23.0, the buildx plugin since.
    client = subprocess.run([DOCKER, "version", "-f", "{{.Client.Version}}"], capture_output=True,
                            text=True, timeout=20).stdout.strip()
    major = int(re.match(r"\d+", client)[0]) if re.match(r"\d+", client) else 0
    if major >= 23 and subprocess.run([DOCKER, "buildx", "version"], capture_output=True,
                                      timeout=20).returncode != 0:
        return f"docker {client} builds with BuildKit only through the buildx plugin, which is missing"
    return None


REASON = no_daemon()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(REASON is not None, reason=str(REASON))]


def leftovers() -> list[str]:
    """Containers and volumes of the script that still exist."""
    found = []
    for what in (["ps", "-a"], ["volume", "ls"]):
        out = subprocess.run([DOCKER, *what, "-q", "--filter", f"name={PREFIX}"],
                             capture_output=True, text=True, timeout=60, check=True)
        found += out.stdout.split()
    return found


def test_smoke_script_runs_a_sweep_in_the_built_images() -> None:
    args = shlex.split(os.environ.get("MTBERT_SMOKE_ARGS", ""))
    env = {**os.environ, "PYTHON": sys.executable, "DOCKER": DOCKER}
    out = subprocess.run(["bash", str(SCRIPT), *args], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=3600)
    log = out.stdout + out.stderr
    assert out.returncode == 0, log[-6000:]
    trials = re.search(r"^docker-smoke: (\d+) trials, each FINISHED once on the worker", out.stdout, re.M)
    assert trials and int(trials[1]) >= 2, log[-3000:]  # the baseline and at least one point
    # The same sweep, its driver started on the head by hand (`mtbert sweep run --address auto`).
    assert re.search(rf"^docker-smoke-on-head: {trials[1]} trials, each FINISHED once", out.stdout, re.M)
    assert re.search(rf"^leaderboard: {trials[1]} rows, one per trial$", out.stdout, re.M)
    summary = (ROOT / "runs" / "docker-smoke" / "summary.txt").read_text()
    for image in ("mtbert:smoke", "mtbert-mlflow:smoke", "mtbert-postgres:smoke"):
        assert re.search(rf"^{re.escape(image)} +built in +\d+ s, +\d+ MB$", summary, re.M), summary
    # The trap stopped every container and removed every volume it made.
    assert leftovers() == []
