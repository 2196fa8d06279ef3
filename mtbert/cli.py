"""`mtbert` command line: `train` here; `sweep` and `leaderboard` come from orchestration."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


def cmd_train(args: argparse.Namespace) -> int:
    from mtbert.config import load_config
    from mtbert.model.encoder import check_against_encoder
    from mtbert.train.loop import train

    cfg = load_config(args.config, args.set)
    check_against_encoder(cfg)  # depth-dependent keys fail before data is read
    out = Path(args.output)
    result = train(cfg, output_dir=out)
    m = result.metrics
    for line in result.data_report:
        print(f"data: {line}")
    print(f"best epoch {m['best_epoch']}: overall={m['overall']:.4f} "
          f"train_time_s={m['train_time_s']:.1f} model_size_mb={m['model_size_mb']:.1f} "
          f"peak_memory_mb={m['peak_memory_mb']:.0f}")
    print(f"wrote {out / 'result.json'}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mtbert", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("train", help="train one configuration")
    p.add_argument("--config", help="YAML config (omit for the embedded default)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key, e.g. --set optim.lr=1e-4 (repeatable)")
    p.add_argument("--output", default="runs/train", help="folder for result.json and the best model")
    p.set_defaults(func=cmd_train)
    try:
        from orchestration.cli import register
    except ImportError:  # the library alone still trains
        register = None
    if register is not None:
        register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from mtbert.train.loop import TrainingError

    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, TrainingError, FileNotFoundError) as exc:
        # User errors (config, data, sweep files, a diverging run) are one line, no traceback.
        print(f"mtbert: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("mtbert: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
