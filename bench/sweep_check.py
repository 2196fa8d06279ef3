"""What a finished sweep left in MLflow, checked and summed up: every trial FINISHED exactly
once, the figures every trial must carry, and the sweep's wall time against its trials' summed
time (how much the trials overlapped on the hardware they shared).

    python bench/sweep_check.py --tracking-uri sqlite:///…/mlflow.db --experiment gpu-share \
        [--sweep-run NAME] [--trials 4] [--device cuda] [--util gpu-util.csv]

`--util` reads an `nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv`
log taken during the sweep and prints the GPU's mean and peak utilisation over it. Exits 1
when a check fails, naming it. bench/gpu.sh runs it after each GPU sweep.
"""
from __future__ import annotations

import argparse
import csv
import math
import sys
from collections import Counter
from pathlib import Path

from mlflow import MlflowClient

# The figures a trial's run must carry, finite, whatever its device.
NEEDED = ("overall", "train_time_s", "peak_memory_mb", "tokens_per_s", "mfu", "tm_relative_score",
          "tm_relative_score_compute", "train_flops")


def gpu_utilisation(path: Path) -> tuple[float, float, float]:
    """(mean %, peak %, peak memory MiB) over the samples of an nvidia-smi CSV log."""
    util, mem = [], []
    with path.open() as f:
        for row in csv.DictReader(f, skipinitialspace=True):
            try:
                util.append(float(row["utilization.gpu [%]"].split()[0]))
                mem.append(float(row["memory.used [MiB]"].split()[0]))
            except (KeyError, ValueError, IndexError):
                continue  # a header repeated or a line cut by the stop
    if not util:
        return math.nan, math.nan, math.nan
    return sum(util) / len(util), max(util), max(mem)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tracking-uri", required=True)
    ap.add_argument("--experiment", required=True)
    ap.add_argument("--sweep-run", help="the sweep's run name (default: the experiment's newest sweep)")
    ap.add_argument("--trials", type=int, help="how many trials the sweep must have finished")
    ap.add_argument("--device", choices=["cpu", "cuda"], help="the device every trial must have trained on")
    ap.add_argument("--util", type=Path, help="an nvidia-smi CSV log taken during the sweep")
    args = ap.parse_args()

    client = MlflowClient(args.tracking_uri)
    exp = client.get_experiment_by_name(args.experiment)
    if exp is None:
        print(f"sweep_check: no experiment {args.experiment!r} in {args.tracking_uri}")
        return 1
    runs = client.search_runs([exp.experiment_id], max_results=5000)
    parents = [r for r in runs if r.data.tags.get("role") == "sweep"
               and (args.sweep_run is None or r.info.run_name == args.sweep_run)]
    if not parents:
        print(f"sweep_check: no sweep run in {args.experiment!r}")
        return 1
    parent = max(parents, key=lambda r: r.info.start_time)
    trials = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id
              and "trial_key" in r.data.tags]
    failures = []
    keys = Counter(r.data.tags["trial_key"] for r in trials)
    failures += [f"trial {k} has {n} runs" for k, n in keys.items() if n > 1]
    failures += [f"trial {r.data.tags['trial_key']} is {r.info.status}" for r in trials if r.info.status != "FINISHED"]
    if args.trials is not None and len(keys) != args.trials:
        failures.append(f"{len(keys)} trials, {args.trials} expected")
    for r in trials:
        missing = [k for k in NEEDED if not math.isfinite(r.data.metrics.get(k, math.nan))]
        if missing:
            failures.append(f"trial {r.data.tags['trial_key']}: no finite {', '.join(missing)}")
        device = r.data.tags.get("device", "")
        if args.device and not device.startswith(args.device):
            failures.append(f"trial {r.data.tags['trial_key']} trained on {device}, not {args.device}")

    wall = ((parent.info.end_time or parent.info.start_time) - parent.info.start_time) / 1000
    spans = [((r.info.end_time or r.info.start_time) - r.info.start_time) / 1000 for r in trials]
    train = [r.data.metrics.get("train_time_s", math.nan) for r in trials]
    print(f"sweep {parent.info.run_name}: {parent.info.status}, {len(keys)} trials, "
          f"{sum(r.info.status == 'FINISHED' for r in trials)} FINISHED")
    print(f"  wall {wall:.1f} s; trials' summed run time {sum(spans):.1f} s ({sum(spans) / max(wall, 1e-9):.2f}x the "
          f"wall: trials overlapping), summed training steps {sum(train):.1f} s")
    for r in sorted(trials, key=lambda r: r.data.tags["trial_key"]):
        m = r.data.metrics
        print(f"  {r.data.tags['trial_key']:<12} {r.data.params.get('sharing.head_regime', ''):<6} "
              f"overall {m.get('overall', math.nan):.3f}  train {m.get('train_time_s', math.nan):6.1f} s  "
              f"peak {m.get('peak_memory_mb', math.nan):7.0f} MB  {m.get('tokens_per_s', math.nan):9.0f} tok/s  "
              f"MFU {m.get('mfu', math.nan):6.2%}  TM-rel {m.get('tm_relative_score', math.nan):.3f} "
              f"(compute {m.get('tm_relative_score_compute', math.nan):.3f})  "
              f"{r.data.tags.get('device', '?')}, {r.data.tags.get('precision', '?')}")
    if args.util is not None:
        mean, peak, mem = gpu_utilisation(args.util)
        print(f"  GPU utilisation over the sweep: mean {mean:.0f}%, peak {peak:.0f}%; memory used at most {mem:.0f} MiB")
    for f in failures:
        print(f"  FAILED: {f}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
