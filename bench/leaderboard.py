"""`mtbert leaderboard` on a big sweep: a synthetic experiment of N child runs, timed.

    python bench/leaderboard.py [--runs 10000] [--generic]

Builds, in a temporary sqlite store, one sweep (a parent run) with N child runs carrying
what a real trial's run carries and the leaderboard reads: the flattened config as params
(66 of them), the final figures and five per-epoch series over 4 epochs as metrics, and the
tags (trial_key, variant, role, seed, stopped_early, interrupted, error; 1% failed, 1%
interrupted; two seeds per configuration, so N/2 table rows). The parent run and the schema
come through MLflow's client; the children are written straight into MLflow's tables
(runs, params, tags, metrics, latest_metrics) in one transaction, or building them would
take longer than what is measured.

Then it times, each in this process after one warm-up: reading the runs (the sqlite SQL
reader, the params, metrics and tags the table reads, as the leaderboard reads them; with
--generic also mlflow.search_runs, every key, the path every other store takes),
building and sorting the table, rendering it; and `mtbert leaderboard` end to end in a
subprocess (Python start and imports included), the figure the goal (< 10 s) is about.
"""
from __future__ import annotations

import argparse
import random
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TASK_METRICS = ["sst_acc", "para_acc", "sts_corr"]
EPOCH_SERIES = ["overall", "sst_acc", "para_acc", "sts_corr", "train_time_s"]
EPOCHS = 4


def build(uri: str, db: Path, n: int, seed: int = 0) -> str:
    """The synthetic sweep; returns the experiment's name."""
    from mlflow.tracking import MlflowClient

    from mtbert.config import Config, flatten

    client = MlflowClient(uri)
    # Artifacts (the Pareto plot the CLI logs) beside the database, in the temporary folder, not
    # in ./mlruns of whatever folder the bench was started from.
    experiment_id = client.create_experiment("synthetic", artifact_location=(db.parent / "mlartifacts").as_uri())
    parent = client.create_run(experiment_id, run_name="synthetic-sweep", tags={
        "role": "sweep", "sweep": "synthetic", "tasks": "sst,para,sts", "task_metrics": ",".join(TASK_METRICS),
        "space_keys": "optim.lr,sharing.head_regime,sharing.encoder_shared_layers", "tm_score": "wall",
        "num_trials": str(n)})
    parent_id = parent.info.run_id
    client.set_terminated(parent_id, "FINISHED")
    base = {k: str(v) for k, v in flatten(Config()).items()}
    rng = random.Random(seed)
    regimes = ["I-I-I", "S-I-I", "I-S-S", "S-S-I", "S-S-S"]
    runs, params, tags, metrics, latest = [], [], [], [], []
    now = int(time.time() * 1000)
    for i in range(n):
        config, seed_i = i // 2, i % 2
        run_id = uuid.uuid4().hex
        role = "baseline" if config == 0 else "search"
        variant = "baseline" if config == 0 else f"p{config:05d}"
        key = f"{variant}-s{seed_i}"
        status, extra = "FINISHED", {}
        if config and i % 100 == 37:
            status, extra = "FAILED", {"error": "TrainingError: loss of task 'sst' is nan at epoch 1, step 2; "
                                                "try a lower optim.lr or check the data"}
        elif config and i % 100 == 71:
            status, extra = "KILLED", {"interrupted": "SIGINT"}
        start = now - (n - i) * 1000
        runs.append((run_id, key, "LOCAL", "", "", "bench", status, start, start + 900, "", "active",
                     f"mlartifacts/synthetic/{run_id}/artifacts", int(experiment_id)))
        p = dict(base)
        p.update({"optim.lr": f"{10 ** rng.uniform(-4, -2.5):.3g}", "train.seed": str(seed_i),
                  "sharing.head_regime": "I-I-I" if config == 0 else regimes[config % 5],
                  "sharing.encoder_shared_layers": str(config % 3 * 2)})
        params += [(k, v, run_id) for k, v in p.items()]
        t = {"mlflow.parentRunId": parent_id, "mlflow.runName": key, "sweep": "synthetic", "trial_key": key,
             "trial_id": run_id[:8], "variant": variant, "role": role, "seed": str(seed_i),
             "stopped_early": "true" if config % 7 == 3 else "false", "interrupted": "false",
             "tm_time_basis": "measured", "tm_baseline": "baseline-s0", **extra}
        tags += [(k, v, run_id) for k, v in t.items()]
        if status == "FAILED":
            continue
        history = []
        for epoch in range(1, EPOCHS + 1):
            scores = [min(1.0, rng.uniform(0.2, 0.5) + 0.05 * epoch) for _ in TASK_METRICS]
            history.append({"overall": sum(scores) / 3, **dict(zip(TASK_METRICS, scores)),
                            "train_time_s": 10.0 * epoch + rng.uniform(0, 2)})
            for name in EPOCH_SERIES:
                metrics.append((f"epoch/{name}", history[-1][name], start + epoch, run_id, epoch, 0))
        best = max(history, key=lambda h: h["overall"])
        final = {**best, "overall_cs224n": best["overall"], "best_epoch": float(history.index(best) + 1),
                 "epochs_run": float(EPOCHS), "tm_time_s": history[-1]["train_time_s"],
                 "model_size_mb": rng.uniform(1, 40), "peak_memory_mb": rng.uniform(200, 900),
                 "params_total": 1e6, "params_trainable": 1e6, "train_flops": 1e12, "tm_flops": 1e12,
                 "tm_relative_score": rng.uniform(0.5, 2.0), "tm_relative_score_compute": rng.uniform(0.5, 2.0)}
        for name, value in final.items():
            metrics.append((name, value, start + 900, run_id, 0, 0))
        for name, value in {**final, **{f"epoch/{k}": v for k, v in history[-1].items()}}.items():
            latest.append((name, value, start + 900, EPOCHS if name.startswith("epoch/") else 0, 0, run_id))
    con = sqlite3.connect(db)
    with con:
        con.executemany("INSERT INTO runs (run_uuid, name, source_type, source_name, entry_point_name, user_id, "
                        "status, start_time, end_time, source_version, lifecycle_stage, artifact_uri, "
                        "experiment_id) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)", runs)
        con.executemany("INSERT INTO params (key, value, run_uuid) VALUES (?,?,?)", params)
        con.executemany("INSERT INTO tags (key, value, run_uuid) VALUES (?,?,?)", tags)
        con.executemany("INSERT INTO metrics (key, value, timestamp, run_uuid, step, is_nan) "
                        "VALUES (?,?,?,?,?,?)", metrics)
        con.executemany("INSERT INTO latest_metrics (key, value, timestamp, step, is_nan, run_uuid) "
                        "VALUES (?,?,?,?,?,?)", latest)
    con.close()
    return "synthetic"


def timed(fn, repeat: int = 1):
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10000, help="child runs in the synthetic sweep")
    parser.add_argument("--generic", action="store_true",
                        help="also time mlflow.search_runs (the path of non-sqlite stores; slow)")
    args = parser.parse_args()

    from orchestration.report.leaderboard import render
    from orchestration.report.reader import child_runs, find_sweep, search_child_runs, sqlite_child_runs
    from orchestration.report.table import build_table, sort_table, table_keys

    with tempfile.TemporaryDirectory(prefix="mtbert-bench-board-") as tmp:
        db = Path(tmp) / "mlflow.db"
        uri = f"sqlite:///{db}"
        t_build, experiment = timed(lambda: build(uri, db, args.runs))
        print(f"synthetic sweep: {args.runs} child runs written in {t_build:.1f} s ({db.stat().st_size / 1e6:.0f} MB)")
        experiment_id, parent = find_sweep(uri, experiment)
        pid = parent.info.run_id
        keys = table_keys(parent.data.tags)  # what the leaderboard reads: the keys its table needs
        child_runs(uri, experiment_id, pid, *keys)  # warm-up: page cache, imports
        t_sql, runs = timed(lambda: sqlite_child_runs(uri, experiment_id, pid, *keys))
        print(f"read runs, sqlite SQL reader      {t_sql:8.2f} s  ({len(runs)} runs, {runs.shape[1]} columns: "
              "the keys the table reads)")
        if args.generic:
            t_gen, generic = timed(lambda: search_child_runs(uri, experiment_id, pid))
            print(f"read runs, mlflow.search_runs     {t_gen:8.2f} s  ({len(generic)} runs; "
                  f"{t_gen / t_sql:.1f}x the SQL reader)")
        t_table, table = timed(lambda: sort_table(build_table(runs, parent.data.tags)))
        print(f"build and sort the table          {t_table:8.2f} s  ({len(table)} rows)")
        t_render, text = timed(lambda: render(table, "md"))
        print(f"render markdown                   {t_render:8.2f} s  ({len(text) / 1e6:.1f} MB)")
        out = Path(tmp) / "board.md"
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "mtbert.cli", "leaderboard", "--experiment", experiment,
                               "--tracking-uri", uri, "--output", str(out)], cwd=tmp, capture_output=True,
                              text=True)
        t_cli = time.perf_counter() - t0
        if proc.returncode != 0:
            raise SystemExit(proc.stdout[-2000:] + proc.stderr[-2000:])
        print(f"mtbert leaderboard (end to end)   {t_cli:8.2f} s  (goal < 10 s; Python start and imports included)")


if __name__ == "__main__":
    main()
