"""Epochs with and without the frozen-layer cache (mtbert/train/frozen.py), MiniLM on the
CS224N data, for freeze = 3 (half the encoder) and freeze = all (head-only).

    python bench/frozen_cache.py [--examples 800] [--epochs 2] [--threads 1]

Each arm is a real `train` run (the core loop, tuple sampling, batch 16, bf16 where the
CPU has it). "off" sets train.frozen_cache_mb to 0, so the frozen layers run at every step
(in eval mode, without gradients, as they always do); "on" starts from an empty cache folder,
so its one encoding pass is counted and shown apart. Printed per arm: the encoding pass, the
mean epoch time after it, and the epoch ratio off / on measured side by side in one run.
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from _real import MINBERT, MINILM, parse_or_skip
from mtbert.config import build_config
from mtbert.train.loop import train



def run(freeze: int, cache: bool, args, tmp: Path) -> dict:
    raw = {"model": {"name_or_path": str(MINILM), "max_length": 128},
           "data": {"source": "cs224n", "dir": str(MINBERT), "max_train_examples": args.examples,
                    "max_dev_examples": 50, "cache_dir": str(tmp / ("cache-on" if cache else "cache-off"))},
           "sampling": {"strategy": "tuple"}, "freeze": {"layers": freeze},
           "train": {"epochs": args.epochs, "batch_size": 16, "device": "cpu", "seed": 0,
                     "frozen_cache_mb": 4096 if cache else 0}}
    result = train(build_config(raw), log=None)
    epochs = [e["epoch_time_s"] for e in result.epochs]
    return {"build": result.epochs[0].get("frozen_cache_s", 0.0), "epoch": sum(epochs) / len(epochs),
            "overall": result.metrics["overall"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--examples", type=int, default=800, help="training rows per task")
    ap.add_argument("--epochs", type=int, default=2)
    args = parse_or_skip(ap)
    if args is None:
        return
    print(f"MiniLM, CS224N data ({args.examples} training rows per task), tuple sampling, "
          f"batch 16, {args.epochs} epochs, {args.threads} thread(s)")
    with tempfile.TemporaryDirectory() as tmp:
        for freeze, label in ((3, "freeze = 3"), (-1, "freeze = all")):
            off, on = run(freeze, False, args, Path(tmp)), run(freeze, True, args, Path(tmp))
            print(f"  {label:<13} epoch off {off['epoch']:7.2f}s   on {on['epoch']:7.2f}s "
                  f"(+ {on['build']:.1f}s encoding pass once)   epoch ratio {off['epoch'] / on['epoch']:5.1f}x   "
                  f"overall off {off['overall']:.3f} on {on['overall']:.3f}")


if __name__ == "__main__":
    main()
