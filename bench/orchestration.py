"""What the sweep machinery costs on top of training, measured in one run.

    python bench/orchestration.py [--trials 8] [--epochs 2] [--steps 40] [--concurrency 2]

Runs a real sweep (local Ray, sqlite MLflow, tiny model on synthetic data) of N trials in a
temporary folder and prints:
  overhead ratio   sweep wall time / summed trial time. Trial time is each trial function's
                   own wall time as Tune measures it (time_total_s: training, evaluation,
                   checkpoints). With C trials at once the ideal is 1/C, so the ratio is also
                   shown x C ("1.0 = no overhead").
  train share      summed training-step time (train()'s train_time_s) / summed trial time.
  MLflow overhead  time the driver spent in MLflow calls / summed trial time.
Short trials make the fixed costs (Ray start, worker start, data preparation) stand out;
raise --steps to see them amortised.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestration.launch import run_sweep  # noqa: E402


def bench_sweep(trials: int, epochs: int, steps: int, concurrency: int) -> dict:
    lrs = [round(1e-3 * (1.25 ** i), 6) for i in range(max(trials - 1, 1))]
    return {
        "name": "bench",
        "base": {
            "model": {"name_or_path": "tiny", "tiny": {"layers": 2, "hidden": 64, "heads": 2, "intermediate": 128},
                      "max_length": 48},
            "data": {"source": "synthetic", "synthetic": {"train_size": 400, "dev_size": 100}},
            "train": {"epochs": epochs, "batch_size": 16, "device": "cpu"},
            "sampling": {"steps_per_epoch": steps},
        },
        "space": {"optim.lr": {"type": "grid", "values": lrs}},
        "search": {"algorithm": "grid"},
        "max_concurrent": concurrency,
        "resources": {"cpu": 1, "gpu": 0},
        "baseline": {"optim.lr": 1e-3},
        "tracking": {"experiment": "bench"},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=8, help="trials in all, the baseline included")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--steps", type=int, default=40, help="training steps per epoch")
    parser.add_argument("--concurrency", type=int, default=2, help="trials at once (one CPU each)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="mtbert-bench-") as tmp:
        os.chdir(tmp)
        path = Path(tmp) / "bench.yaml"
        path.write_text(yaml.safe_dump(bench_sweep(args.trials, args.epochs, args.steps, args.concurrency)))
        t0 = time.perf_counter()
        outcome = run_sweep(path, name="bench", num_cpus=args.concurrency, log=lambda _line: None,
                            progress=False)
        wall = time.perf_counter() - t0
        os.chdir(ROOT)

    trial = outcome.trial_time_s
    ratio = wall / trial if trial else float("nan")
    print(f"trials                  {outcome.trials} ({outcome.finished} finished, {outcome.failed} failed), "
          f"{args.epochs} epochs x {args.steps} steps, {args.concurrency} at once")
    print(f"sweep wall time         {wall:8.1f} s  (Ray start, data, trials, tracking, plot)")
    print(f"summed trial time       {trial:8.1f} s  (summed training steps {outcome.train_time_s:.1f} s)")
    print(f"overhead ratio          {ratio:8.2f}    wall / summed trial time; x{args.concurrency} = "
          f"{ratio * args.concurrency:.2f} (1.0 = no overhead)")
    print(f"train share             {outcome.train_time_s / trial if trial else float('nan'):8.2f}    "
          "training steps / trial time (the rest: eval, checkpoints, reports)")
    print(f"MLflow logging          {outcome.logging_s:8.2f} s  = {outcome.logging_s / trial if trial else float('nan'):.3f}"
          " of summed trial time (driver-side, per epoch and per trial end)")


if __name__ == "__main__":
    main()
