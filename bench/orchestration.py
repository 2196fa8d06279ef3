"""What the sweep machinery costs on top of training, and how it grows with the sweep.

    python bench/orchestration.py [--trials 16,64,256,1024] [--trainable real|sleep] [--epochs 1]
                                  [--steps 10] [--concurrency 2] [--server | --tracking-uri URI]

Runs, for each size N, a real sweep (local Ray, sqlite MLflow unless --server or
--tracking-uri, tiny model on synthetic data) of N trials in a temporary folder. Learning
rates are a grid inside [3e-4, 3e-3], so no trial diverges and the figures are about
orchestration, not failures.
  --trainable sleep  each trial sleeps for the time one real tiny trial took (measured once,
                     in this process, before the sweeps; or --sleep-s) and reports that
                     trial's own epoch metrics and a checkpoint per epoch: orchestration and
                     MLflow cost without training noise, the same for every size.
  --server           a real `mlflow server` (sqlite backend in a temporary folder, a free
                     127.0.0.1 port), started here and stopped by its PID: every MLflow call is
                     an HTTP round trip, as on a cluster.
Per size it prints:
  wall             sweep wall time (Ray start, data, trials, tracking, final passes)
  trial            summed trial time: each trial function's own wall time as Tune measures
                   it (time_total_s: training, evaluation, checkpoints)
  ratio            wall / summed trial time, x C (C trials at once; 1.0 = no overhead)
  MLflow s         driver time in MLflow calls (writer thread + reads)
  reads s          of which reads: the whole-sweep passes at the end (and lookups on resume)
  MLflow/trial     MLflow s per trial
  CPU/trial        the writer thread's own CPU in its calls, per trial: the rest of its time
                   is waiting on the store (HTTP, fsync) or on the GIL (Tune's loop shares the
                   driver process): MLflow/trial rising with CPU/trial flat means each call
                   waits longer, not that it does more work
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

from orchestration.run.launch import run_sweep  # noqa: E402


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


def measure_real_trial(args) -> tuple[list[dict], float]:
    """One real tiny trial, in this process: its per-epoch reports and its wall time."""
    from mtbert.config import build_config
    from mtbert.data.tokenize import prepare
    from mtbert.train.loop import train

    with tempfile.TemporaryDirectory(prefix="mtbert-bench-") as tmp:
        os.chdir(tmp)
        base = bench_sweep(2, args.epochs, args.steps, args.concurrency)["base"]
        cfg = build_config({**base, "optim": {"lr": 1e-3}})
        prepared = prepare(cfg, log=None)  # tokenized once, as the sweep's driver does
        reports: list[dict] = []
        t0 = time.perf_counter()
        train(cfg, reporter=lambda metrics, _ckpt: reports.append(dict(metrics)), prepared=prepared, log=None)
        wall = time.perf_counter() - t0
        os.chdir(ROOT)
    return reports, wall


def sleep_trainable(reports: list[dict], wall_s: float):
    """A Tune function trainable that sleeps a real trial's time and reports its metrics."""
    per_epoch = wall_s / max(len(reports), 1)

    def sleep_trial(config: dict) -> None:
        import json as _json

        from ray import tune

        for metrics in reports:
            time.sleep(per_epoch)
            with tempfile.TemporaryDirectory() as ckpt:
                Path(ckpt, "state.json").write_text(_json.dumps({"epoch": metrics.get("epoch")}))
                tune.report(dict(metrics), checkpoint=tune.Checkpoint.from_directory(ckpt))

    return sleep_trial


def use_trainable(trainable) -> None:
    """Swap the sweep's trainable (run_sweep builds it through launch._trainable)."""
    from ray import tune

    import orchestration.run.launch as launch

    launch._trainable = lambda cpu, gpu, experiment_dir: tune.with_resources(trainable, {"cpu": cpu, "gpu": gpu})


class MlflowServer:
    """`mlflow server` on a free 127.0.0.1 port with a sqlite store in a temporary folder."""

    def __enter__(self) -> str:
        import socket
        import subprocess

        import requests

        self.tmp = tempfile.TemporaryDirectory(prefix="mtbert-bench-server-")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
        self.log = open(Path(self.tmp.name) / "server.log", "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
             "--backend-store-uri", f"sqlite:///{self.tmp.name}/server.db",
             "--artifacts-destination", f"{self.tmp.name}/artifacts", "--workers", "1"],
            stdout=self.log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.uri = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            try:
                if requests.get(self.uri + "/health", timeout=2).status_code == 200:
                    return self.uri
            except requests.RequestException:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.__exit__()
                raise SystemExit(f"mlflow server did not start: {(Path(self.tmp.name) / 'server.log').read_text()[-2000:]}")
            time.sleep(0.5)

    def __exit__(self, *exc) -> None:
        import signal

        # The server's process group is its own (start_new_session): its workers go with it.
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(10)
                break
            except Exception:  # noqa: BLE001 - still there: SIGKILL
                continue
        self.log.close()
        self.tmp.cleanup()


def one_size(trials: int, args) -> dict:
    from orchestration.run.launch import run_sweep

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
            "reads": outcome.reads_s, "cpu": outcome.writer_cpu_s, "calls": outcome.mlflow_calls}


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
    parser.add_argument("--trainable", choices=("real", "sleep"), default="real",
                        help="real: train the tiny model; sleep: sleep a real trial's time, same reports")
    parser.add_argument("--sleep-s", type=float, default=None,
                        help="with --trainable sleep: seconds per trial instead of the measured ones (a "
                        "loaded machine stretches the measurement; ~1 s is a tiny trial on a quiet core)")
    parser.add_argument("--tracking-uri", default=None, help="an MLflow server to measure against "
                        "(default: a sqlite store in the temporary folder)")
    parser.add_argument("--server", action="store_true", help="start a local `mlflow server` (sqlite "
                        "backend, temporary folder) and measure against it")
    args = parser.parse_args()
    if args.server and args.tracking_uri:
        parser.error("--server starts its own server: leave out --tracking-uri")
    if args.trainable == "sleep":
        reports, wall = measure_real_trial(args)
        how = "one real tiny trial, measured here"
        if args.sleep_s is not None:
            how = f"--sleep-s; the real trial took {wall:.2f} s here"
            wall = args.sleep_s
        use_trainable(sleep_trainable(reports, wall))
        print(f"sleep trainable: {wall:.2f} s per trial ({how}), {len(reports)} epoch report(s)")
    if args.server:
        with MlflowServer() as uri:
            args.tracking_uri = uri
            run_sizes(args, server=True)
    else:
        run_sizes(args)


def run_sizes(args, server: bool = False) -> None:
    sizes = [int(t) for t in str(args.trials).split(",") if t.strip()]
    c = args.concurrency
    print(f"{args.epochs} epoch(s) x {args.steps} steps per trial, {args.trainable} trainable, {c} at once, "
          f"MLflow {('server ' if server else '') + (args.tracking_uri or 'sqlite (temporary)')}")
    print(f"{'trials':>7} {'failed':>6} {'wall s':>8} {'trial s':>8} {'ratio xC':>8} {'MLflow s':>8} "
          f"{'reads s':>7} {'MLflow/trial s':>14} {'CPU/trial s':>11} {'calls/trial':>11}")
    # Ray once for every size, started here: its workers keep the driver's working folder,
    # and each size's temporary folder is gone when the next size starts.
    from orchestration.run.launch import _init_ray

    _init_ray(None, c)
    rows = []
    for n in sizes:
        r = one_size(n, args)
        rows.append(r)
        ratio = r["wall"] / r["trial"] * c if r["trial"] else float("nan")
        n = max(r["n"], 1)
        print(f"{r['n']:>7} {r['failed']:>6} {r['wall']:>8.1f} {r['trial']:>8.1f} {ratio:>8.2f} {r['mlflow']:>8.2f} "
              f"{r['reads']:>7.2f} {r['mlflow'] / n:>14.4f} {r['cpu'] / n:>11.4f} {r['calls'] / n:>11.1f}", flush=True)
    if len(rows) > 1:
        print(f"growth exponent of MLflow time in trials: {growth_exponent(rows, 'mlflow'):.2f} "
              f"(writer CPU: {growth_exponent(rows, 'cpu'):.2f}, calls: {growth_exponent(rows, 'calls'):.2f}; "
              "1.0 = flat per trial)")
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
