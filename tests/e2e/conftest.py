"""What the bundle tests share."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.fixture
def predicts_best_epoch():
    """Checks that `mtbert predict --split dev`, in a fresh process, gives the run's best-epoch
    dev scores for this bundle."""
    def check(bundle: Path, output: Path, result) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        proc = subprocess.run([sys.executable, "-m", "mtbert.cli", "predict", "--model", str(bundle), "--split",
                               "dev", "--output", str(output), "--device", "cpu"],
                              capture_output=True, text=True, timeout=300, env=env)
        assert proc.returncode == 0, proc.stderr[-2000:]
        scores = json.loads((output / "scores-dev.json").read_text())
        best = result.epochs[result.metrics["best_epoch"] - 1]
        assert scores == {"sst": best["sst_acc"], "para": best["para_acc"], "sts": best["sts_corr"]}
    return check
