"""What the real-data benches share: where ../shared keeps MiniLM and the CS224N data, and
the one way they parse arguments, skip without them and pin the thread count."""
from __future__ import annotations

import argparse
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
MINILM = ROOT / ".." / "shared" / "models" / "all-MiniLM-L6-v2"
MINBERT = ROOT / ".." / "shared" / "data" / "minbert"


def parse_or_skip(ap: argparse.ArgumentParser) -> argparse.Namespace | None:
    """The parsed arguments (with --threads applied), or None after one line when ../shared
    has no MiniLM (unless --encoder names a random-init shape) or no CS224N data: the bench
    measures those files or nothing."""
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    if (getattr(args, "encoder", "minilm") == "minilm" and not MINILM.is_dir()) or not MINBERT.is_dir():
        print("../shared model or data not found: skipped")
        return None
    torch.set_num_threads(args.threads)
    return args
