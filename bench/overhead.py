"""What a cheap trial costs besides its work: a real head-only sweep, each trial's slot split.

    python bench/overhead.py [--regimes 4] [--seeds 4] [--epochs 2] [--steps 20]
                             [--examples 2000] [--dev-examples 400] [--concurrency 2] [--compare]

Runs one real sweep (local Ray, sqlite MLflow, in a temporary folder) of regimes x seeds
head-only trials: MiniLM frozen (freeze.layers -1), head regimes I-I-I, S-S-S, S-I-S, I-S-I, ...
on the CS224N data capped to --examples training and --dev-examples dev rows per task, a few
short epochs each. The frozen-layer and tokenization caches live in the project's own cache
folder (.mtbert_cache), so a second run finds them warm; the sweep builds what is missing
before its first trial (its shared setup, printed apart, never charged to a trial).
Per trial it prints the split of its slot (the driver's trial start to its end):
  slot        seconds the trial held its worker, as the driver saw it
  setup       the trial function before train(): imports on a fresh worker, config, folder
  data        tokenizer and tokenized data (prepare)
  model       the model, optimizer and scheduler built
  cache       the frozen-layer cache opened (or built)
  train       the training steps (train_time_s)
  eval        dev evaluation
  ckpt        checkpoint and bundle writes (train's own)
  report      inside Tune's report: the checkpoint copied into storage, the driver's turn
  ray         the rest: Ray starting the trial on its worker, the last report, the end
  fixed       slot - train - eval: what the trial costs besides its work (goal: median <= 1 s)
  disk MB     the trial's folder on disk once the sweep has ended
A worker's first trial also pays the imports (torch and mtbert; transformers only where the
data must be tokenized or the encoder is not a BERT) and the first model build (setup,
model). Ray Tune starts each trial actor in a fresh worker process: not one of the workers
Ray prestarts, nor one that a runtime_env worker_process_setup_hook warmed by running tasks,
so nothing pays that ahead of the trial; it is paid once per worker and amortises over the
worker's trials (--seeds 8: twice the trials per worker).
And for the sweep: the trials' wall (first start to last end) over their summed train + eval
time / concurrency (goal <= 1.3), the same for the whole sweep, and the driver's time in
MLflow per trial (tracking, overlapping the trials). Then that ratio split: the warm trials'
alone (what a trial costs besides its work), and what each worker pays once: its first
trial's extra, and Ray starting it, from Tune's start to the first trial (before any slot,
so outside the trials' wall; the whole sweep's includes it).
  --compare  runs the sweep twice, in a fresh process (and Ray) each, side by side: the
             worker-level reuse off (MTBERT_REUSE=0: every trial loads its tokenizer, data
             and encoder again, as before) and on, and prints the ratios.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from _real import MINBERT, MINILM, ROOT, parse_or_skip
from footprint import disk_bytes

sys.path.insert(0, str(ROOT))

MB = 2**20
REGIMES = ["I-I-I", "S-S-S", "S-I-S", "I-S-I", "S-S-I", "I-I-S", "S-I-I", "I-S-S"]
PHASES = ("setup", "data", "model", "cache", "train", "eval", "checkpoint", "report")


def sweep_spec(args) -> dict:
    regimes = REGIMES[:args.regimes]
    return {
        "name": "overhead",
        "base": {
            "model": {"name_or_path": str(MINILM.resolve()), "max_length": 128},
            "data": {"source": "cs224n", "dir": str(MINBERT.resolve()), "max_train_examples": args.examples,
                     "max_dev_examples": args.dev_examples, "cache_dir": str(ROOT / ".mtbert_cache")},
            "freeze": {"layers": -1},
            "sts": {"head": "cosine_mlp"},
            "sampling": {"strategy": "tuple", "steps_per_epoch": args.steps},
            "train": {"epochs": args.epochs, "batch_size": 16, "device": "cpu"},
        },
        "space": {"sharing.head_regime": {"type": "grid", "values": regimes}},
        "baseline": {"sharing.head_regime": regimes[0]},
        "search": {"algorithm": "grid"},
        "scheduler": {"type": "fifo"},
        "max_concurrent": args.concurrency,
        "resources": {"cpu": 1, "gpu": 0},
        "seeds": list(range(args.seeds)),
        "tracking": {"experiment": "overhead", "log_models": "none"},
    }


def trial_clock():
    """A Tune callback pair: the driver's clock at each trial's start (before any other
    callback) and end (after every other: the tracking's close is part of the slot)."""
    from ray import tune

    starts, ends = {}, {}

    class First(tune.Callback):
        def setup(self, **info):  # Tune's start: from here to a worker's first trial, Ray starts it
            starts["(tune)"] = time.perf_counter()

        def on_trial_start(self, iteration, trials, trial, **info):
            starts[trial.config["key"]] = time.perf_counter()

    class Last(tune.Callback):
        def on_trial_complete(self, iteration, trials, trial, **info):
            ends[trial.config["key"]] = time.perf_counter()

        on_trial_error = on_trial_complete

    return First(), Last(), starts, ends


def with_callbacks(first, last) -> None:
    """Every Tuner the sweep builds gets the clock around its own callbacks."""
    from ray import tune

    made = tune.Tuner

    def tuner(*a, run_config=None, **kw):
        run_config.callbacks = [first, *(run_config.callbacks or []), last]
        return made(*a, run_config=run_config, **kw)

    tune.Tuner = tuner


def one_sweep(args) -> dict:
    from orchestration.run.launch import run_sweep

    first, last, starts, ends = trial_clock()
    with_callbacks(first, last)
    with tempfile.TemporaryDirectory(prefix="mtbert-overhead-") as tmp:
        tmp = Path(args.keep or tmp)
        tmp.mkdir(parents=True, exist_ok=True)
        path = tmp / "overhead.yaml"
        path.write_text(yaml.safe_dump(sweep_spec(args), sort_keys=False))
        lines: list[str] = []
        t0 = time.perf_counter()
        outcome = run_sweep(path, name="overhead", storage=tmp / "tune", num_cpus=args.concurrency,
                            tracking_uri=f"sqlite:///{tmp / 'mlflow.db'}", log=lines.append, progress=False)
        wall = time.perf_counter() - t0
        trials = []
        for folder in sorted(p for p in (tmp / "tune" / "overhead").iterdir() if (p / "params.json").is_file()):
            key = json.loads((folder / "params.json").read_text())["key"]
            reports = [json.loads(line) for line in (folder / "result.json").read_text().splitlines() if line]
            timings = reports[-1].get("timings", {}) if reports else {}
            slot = ends.get(key, float("nan")) - starts.get(key, float("nan"))
            trials.append({"key": key, "slot": slot, "start": starts.get(key), "end": ends.get(key),
                           **{p: timings.get(p, 0.0) for p in PHASES}, "disk": disk_bytes(folder),
                           "pid": reports[-1].get("pid") if reports else None})
    shared = [line for line in lines if line.startswith(("data:", "frozen layers:"))]
    return {"wall": wall, "trials": trials, "shared": shared, "logging_s": outcome.logging_s,
            "finished": outcome.finished, "n": outcome.trials, "setup": getattr(outcome, "setup", {}),
            "tune_start": starts.get("(tune)")}


def summary(r: dict, c: int) -> dict:
    ts = [t for t in r["trials"] if t["start"] is not None and t["end"] is not None]
    for t in ts:
        t["ray"] = t["slot"] - sum(t[p] for p in PHASES)
        t["fixed"] = t["slot"] - t["train"] - t["eval"]
    work = sum(t["train"] + t["eval"] for t in ts)
    span = max(t["end"] for t in ts) - min(t["start"] for t in ts) if ts else float("nan")
    # Each worker's first trial pays what the worker pays once; the others are warm.
    firsts = [min((t for t in ts if t["pid"] == pid), key=lambda t: t["start"]) for pid in {t["pid"] for t in ts}]
    warm = [t for t in ts if t not in firsts] or ts
    warm_slot = statistics.median(t["slot"] for t in warm) if ts else float("nan")
    return {"fixed": statistics.median(t["fixed"] for t in ts) if ts else float("nan"),
            "span_ratio": span / (work / c) if work else float("nan"),
            "wall_ratio": r["wall"] / (work / c) if work else float("nan"),
            "warm_ratio": sum(t["slot"] for t in warm) / sum(t["train"] + t["eval"] for t in warm) if ts else float("nan"),
            "first_extra": statistics.mean(t["slot"] - warm_slot for t in firsts) if ts else float("nan"),
            "worker_start": (min(t["start"] for t in ts) - r["tune_start"]) if ts and r.get("tune_start") else float("nan"),
            "span": span, "work": work, "disk": statistics.median(t["disk"] for t in ts) if ts else 0,
            "workers": len({t["pid"] for t in ts})}


def show(r: dict, args, label: str = "") -> dict:
    c = args.concurrency
    s = summary(r, c)
    print(f"{label}{r['finished']} of {r['n']} trials finished; shared setup: " + ("; ".join(r["shared"]) or "none"))
    print(f"  {'trial':<10} {'slot':>6} {'setup':>6} {'data':>6} {'model':>6} {'cache':>6} {'train':>6} "
          f"{'eval':>6} {'ckpt':>6} {'report':>6} {'ray':>6} {'fixed':>6} {'disk MB':>8}")
    for t in sorted(r["trials"], key=lambda t: t["start"] or 0):
        if "fixed" not in t:
            continue
        print(f"  {t['key']:<10} {t['slot']:6.2f} {t['setup']:6.2f} {t['data']:6.2f} {t['model']:6.2f} "
              f"{t['cache']:6.2f} {t['train']:6.2f} {t['eval']:6.2f} {t['checkpoint']:6.2f} {t['report']:6.2f} "
              f"{t['ray']:6.2f} {t['fixed']:6.2f} {t['disk'] / MB:8.2f}")
    n = max(r["n"], 1)
    print(f"  median fixed cost per trial {s['fixed']:.2f} s (goal <= 1 s) | trials' wall {s['span']:.1f} s over "
          f"summed train+eval {s['work']:.1f} s / {c} = {s['span_ratio']:.2f} (goal <= 1.3); whole sweep "
          f"{r['wall']:.1f} s: {s['wall_ratio']:.2f} | tracking {r['logging_s'] / n:.3f} s/trial (driver) | "
          f"{s['disk'] / MB:.2f} MB per trial on disk (median) | {s['workers']} worker process(es)")
    print(f"  split: warm trials alone {s['warm_ratio']:.2f} (slots over their train+eval); each worker once: "
          f"its first trial {s['first_extra']:.1f} s over a warm one's slot (imports, first loads), and "
          f"{s['worker_start']:.1f} s from Tune's start to the first trial (Ray starting the workers; outside "
          f"the trials' wall)")
    return s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--regimes", type=int, default=4, help=f"head regimes, the first N of {REGIMES}")
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20, help="steps per epoch (tuple sampling, batch 16)")
    ap.add_argument("--examples", type=int, default=2000, help="training rows per task")
    ap.add_argument("--dev-examples", type=int, default=400, help="dev rows per task")
    ap.add_argument("--concurrency", type=int, default=2, help="trials at once (one CPU each)")
    ap.add_argument("--compare", action="store_true", help="reuse off, then on, each in a fresh process")
    ap.add_argument("--keep", default=None, help="run the sweep in this folder and keep it")
    ap.add_argument("--json", default=None, help=argparse.SUPPRESS)  # a --compare arm writes its figures here
    args = parse_or_skip(ap)
    if args is None:
        return
    print(f"MiniLM head-only, CS224N data ({args.examples} training / {args.dev_examples} dev rows per task), "
          f"{args.regimes} regimes x {args.seeds} seeds, {args.epochs} epochs x {args.steps} steps, "
          f"{args.concurrency} at once" + ("" if args.compare else
                                           f", reuse {'off' if os.environ.get('MTBERT_REUSE') == '0' else 'on'}"),
          flush=True)
    if not args.compare:
        r = one_sweep(args)
        s = show(r, args)
        if args.json:
            Path(args.json).write_text(json.dumps(s))
        return
    arms = {}
    for label, reuse in (("reuse off", "0"), ("reuse on", "1")):
        with tempfile.NamedTemporaryFile(suffix=".json") as out:
            argv = [a for a in sys.argv[1:] if a != "--compare"] + ["--json", out.name]
            subprocess.run([sys.executable, __file__, *argv], check=True, env={**os.environ, "MTBERT_REUSE": reuse})
            arms[label] = json.loads(Path(out.name).read_text())
    off, on = arms["reuse off"], arms["reuse on"]
    print(f"side by side: median fixed cost {off['fixed']:.2f} s -> {on['fixed']:.2f} s "
          f"({off['fixed'] / on['fixed']:.1f}x less); trials' wall / (train+eval / C) {off['span_ratio']:.2f} -> "
          f"{on['span_ratio']:.2f}")


if __name__ == "__main__":
    main()
