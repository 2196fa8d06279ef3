"""Bytes on disk per sweep trial: what a fine-tuned and a head-only MiniLM trial leave behind.

    python bench/footprint.py [--examples 64] [--steps 3] [--epochs 2]

Runs one real sweep (local Ray, sqlite MLflow, in a temporary folder, one trial at a time) of
three MiniLM trials on the CS224N data, a few steps each: fine-tuned (nothing frozen, the
baseline), head-only (freeze.layers -1 under the default three hidden head layers) and the
frozen reference (head-only, linear heads). Once the sweep has ended, each trial's folder is
measured as it stays on disk:
  bundle      the best epoch's bundle in Tune's checkpoint (checkpoint_*/best; a head-only
              trial's is slim: it names the frozen encoder instead of storing it)
  checkpoint  Tune's last checkpoint, that bundle included (a finished trial's state keeps
              its history, not its weights)
  total       the whole trial folder: the checkpoint, output/ (result.json; best/ is a link
              into the checkpoint), the log and Tune's own files
  model       the model's size (model_size_mb: its whole state dict, what a full bundle stores)
  total/model the trial's footprint over the model's size
Not counted: the frozen-layer cache under data.cache_dir (one per machine, shared by every
trial with the same encoder and data) and MLflow (tracking.log_models: none here; the best
trial's logged model is self-contained, one model per sweep).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import yaml

from _real import MINBERT, MINILM, ROOT, parse_or_skip

sys.path.insert(0, str(ROOT))

MB = 2**20


def sweep_file(args, folder: Path) -> Path:
    spec = {
        "name": "footprint",
        "base": {
            "model": {"name_or_path": str(MINILM.resolve()), "max_length": 64},
            "data": {"source": "cs224n", "dir": str(MINBERT.resolve()), "max_train_examples": args.examples,
                     "max_dev_examples": 32, "cache_dir": str(folder / "cache")},
            "sampling": {"strategy": "tuple", "steps_per_epoch": args.steps},
            "train": {"epochs": args.epochs, "batch_size": 16, "device": "cpu"},
        },
        "space": {"freeze.layers": {"type": "grid", "values": [-1]}},  # the baseline is the base: fine-tuned
        "reference": True,
        "search": {"algorithm": "grid"},
        "scheduler": {"type": "fifo"},
        "max_concurrent": 1,
        "resources": {"cpu": 1, "gpu": 0},
        "seeds": [0],
        "tracking": {"experiment": "footprint", "log_models": "none"},
    }
    path = folder / "footprint.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def disk_bytes(folder: Path) -> int:
    """Bytes of the files under `folder`, links not followed (a link costs its own few bytes)."""
    total = 0
    for at, _dirs, files in os.walk(folder):
        total += sum(os.lstat(Path(at) / f).st_size for f in files)
    return total


def kind(config: dict) -> str:
    frozen = config.get("freeze", {}).get("layers", 0)
    if frozen == 0:
        return "fine-tuned"
    return "frozen reference" if config.get("sharing", {}).get("head_regime") == "none" else "head-only"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--examples", type=int, default=64, help="training rows per task")
    ap.add_argument("--steps", type=int, default=3, help="steps per epoch")
    ap.add_argument("--epochs", type=int, default=2)
    args = parse_or_skip(ap)
    if args is None:
        return
    from orchestration.run.launch import run_sweep

    with tempfile.TemporaryDirectory(prefix="mtbert-footprint-") as tmp:
        tmp = Path(tmp)
        outcome = run_sweep(sweep_file(args, tmp), name="footprint", storage=tmp / "tune",
                            tracking_uri=f"sqlite:///{tmp / 'mlflow.db'}", num_cpus=1,
                            log=lambda _msg: None, progress=False)
        print(f"MiniLM, CS224N data ({args.examples} training rows per task), {args.epochs} epochs of "
              f"{args.steps} steps, one real sweep: {outcome.finished} of {outcome.trials} trials finished")
        print(f"  {'trial':<17} {'bundle MB':>10} {'checkpoint MB':>14} {'total MB':>9} {'model MB':>9} "
              f"{'total/model':>12}")
        for trial in sorted(p for p in (tmp / "tune" / "footprint").iterdir() if (p / "params.json").is_file()):
            config = json.loads((trial / "params.json").read_text())["config"]
            [ckpt] = sorted(trial.glob("checkpoint_*"))[-1:] or [None]
            result = json.loads((trial / "output" / "result.json").read_text())
            model = result["metrics"]["model_size_mb"] * MB
            bundle = disk_bytes(ckpt / "best") if ckpt else 0
            checkpoint = disk_bytes(ckpt) if ckpt else 0
            total = disk_bytes(trial)
            print(f"  {kind(config):<17} {bundle / MB:10.2f} {checkpoint / MB:14.2f} {total / MB:9.2f} "
                  f"{model / MB:9.1f} {total / model:12.3f}")


if __name__ == "__main__":
    main()
