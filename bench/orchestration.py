"""What the sweep machinery costs on top of training, and how it grows with the sweep.

    python bench/orchestration.py [--trials 16,64,256,1024] [--epochs 1] [--steps 10] [--concurrency 2]
                                  [--tracking-uri http://127.0.0.1:5000]

Runs, for each size N, a real sweep (local Ray, sqlite MLflow unless --tracking-uri, tiny
model on synthetic data) of N trials in a temporary folder. Learning rates are a grid inside
[3e-4, 3e-3], so no trial diverges and the figures are about orchestration, not failures.
Per size it prints:
  wall             sweep wall time (Ray start, data, trials, tracking, final passes)
  trial            summed trial time: each trial function's own wall time as Tune measures
                   it (time_total_s: training, evaluation, checkpoints)
  ratio            wall / summed trial time, x C (C trials at once; 1.0 = no overhead)
  MLflow/trial     driver time in MLflow calls (writer thread + reads) per trial
  calls/trial      MLflow client calls per trial
and, over the sizes, the fitted growth exponent b of total MLflow time ~ N^b (1.0 = flat per
trial). Short trials make the fixed costs (Ray start, worker start, data) stand out.
"""
from __future__ import annotations

import argparse
import math
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
    n = max(trials - 1, 1)
    # Bounded: a log-spaced grid inside [3e-4, 3e-3], however many trials (no divergence).
    lrs = [round(3e-4 * 10 ** (i / max(n - 1, 1)), 8) for i in range(n)]
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


def one_size(trials: int, args) -> dict:
    from orchestration.launch import run_sweep

    with tempfile.TemporaryDirectory(prefix="mtbert-bench-") as tmp:
        os.chdir(tmp)
        path = Path(tmp) / "bench.yaml"
        path.write_text(yaml.safe_dump(bench_sweep(trials, args.epochs, args.steps, args.concurrency)))
        t0 = time.perf_counter()
        outcome = run_sweep(path, name=f"bench-{trials}-{int(time.time())}", num_cpus=args.concurrency,
                            # Explicit: MLflow's set_tracking_uri (the leaderboard pass) leaves the
                            # previous size's store in $MLFLOW_TRACKING_URI.
                            tracking_uri=args.tracking_uri or f"sqlite:///{tmp}/mlflow.db",
                            log=lambda _line: None, progress=False)
        wall = time.perf_counter() - t0
        os.chdir(ROOT)
    return {"n": outcome.trials, "finished": outcome.finished, "failed": outcome.failed, "wall": wall,
            "trial": outcome.trial_time_s, "train": outcome.train_time_s, "mlflow": outcome.logging_s,
            "calls": outcome.mlflow_calls}


def growth_exponent(rows: list[dict], key: str) -> float:
    """Least-squares slope of log(key) on log(n)."""
    pts = [(math.log(r["n"]), math.log(r[key])) for r in rows if r["n"] > 0 and r[key] > 0]
    if len(pts) < 2:
        return float("nan")
    mx = sum(x for x, _ in pts) / len(pts)
    my = sum(y for _, y in pts) / len(pts)
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    return sum((x - mx) * (y - my) for x, y in pts) / sxx if sxx else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", default="8", help="trials in all per sweep, the baseline included; "
                        "a comma list runs one sweep per size (16,64,256,1024)")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--steps", type=int, default=10, help="training steps per epoch")
    parser.add_argument("--concurrency", type=int, default=2, help="trials at once (one CPU each)")
    parser.add_argument("--tracking-uri", default=None, help="an MLflow server to measure against "
                        "(default: a sqlite store in the temporary folder)")
    args = parser.parse_args()
    sizes = [int(t) for t in str(args.trials).split(",") if t.strip()]
    c = args.concurrency
    print(f"{args.epochs} epoch(s) x {args.steps} steps per trial, {c} at once, "
          f"MLflow {args.tracking_uri or 'sqlite (temporary)'}")
    print(f"{'trials':>7} {'failed':>6} {'wall s':>8} {'trial s':>8} {'ratio xC':>8} {'MLflow s':>8} "
          f"{'MLflow/trial s':>14} {'calls/trial':>11}")
    rows = []
    for n in sizes:
        r = one_size(n, args)
        rows.append(r)
        ratio = r["wall"] / r["trial"] * c if r["trial"] else float("nan")
        print(f"{r['n']:>7} {r['failed']:>6} {r['wall']:>8.1f} {r['trial']:>8.1f} {ratio:>8.2f} {r['mlflow']:>8.2f} "
              f"{r['mlflow'] / max(r['n'], 1):>14.4f} {r['calls'] / max(r['n'], 1):>11.1f}", flush=True)
    if len(rows) > 1:
        print(f"growth exponent of MLflow time in trials: {growth_exponent(rows, 'mlflow'):.2f} "
              f"(calls: {growth_exponent(rows, 'calls'):.2f}; 1.0 = flat per trial)")
        first, last = rows[0], rows[-1]
        r0, r1 = first["wall"] / first["trial"], last["wall"] / last["trial"]
        print(f"overhead ratio at {last['n']} trials / at {first['n']}: {r1 / r0:.2f}")
    # The one-size summary lines older readers look for.
    r = rows[-1]
    print(f"overhead ratio          {r['wall'] / r['trial'] if r['trial'] else float('nan'):8.2f}    "
          "wall / summed trial time")
    print(f"MLflow logging          {r['mlflow']:8.2f} s  driver-side, writer thread and reads")


if __name__ == "__main__":
    main()
