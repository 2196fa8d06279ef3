"""`mtbert` command line: `train`, `predict` and `bundle` here; `sweep`, `leaderboard`, `importance` and `findings` come from orchestration."""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

# What a run writes into --output. A new run replaces all of them at once, at its end, so the
# folder never holds one run's result.json beside another's best model.
RUN_FILES = ("result.json", "best", "last")


def _partial_folder(out: Path) -> Path:
    """A fresh folder beside --output that the run writes into (checked before any compute)."""
    from mtbert.outputs import check_output_folder

    check_output_folder(out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    except OSError as exc:
        raise ValueError(f"--output {out}: cannot write there ({exc.strerror or exc})") from None


def _resumable(out: Path) -> Path | None:
    """The folder `--resume` continues: the newest stopped run's partial folder beside --output
    (a killed run never reached --output), else --output itself; None when neither holds one."""
    from mtbert.train.state import CHECKPOINT_STATE

    stopped = [p for p in out.parent.glob(f".{out.name}.partial-*") if (p / "last" / CHECKPOINT_STATE).is_file()]
    if stopped:
        return max(stopped, key=lambda p: (p / "last" / CHECKPOINT_STATE).stat().st_mtime)
    return out if (out / "last" / CHECKPOINT_STATE).is_file() else None


def _move_in(partial: Path, out: Path) -> None:
    from mtbert.outputs import remove_path

    out.mkdir(parents=True, exist_ok=True)
    for name in RUN_FILES:
        remove_path(out / name)
    for item in partial.iterdir():
        os.replace(item, out / item.name)


def cmd_train(args: argparse.Namespace) -> int:
    from mtbert.config import load_config, reference_settings
    from mtbert.model.encoder import check_against_encoder
    from mtbert.train.loop import train
    from mtbert.train.progress import ProgressBar
    from mtbert.train.state import CHECKPOINT_STATE

    # --reference: the frozen encoder with linear heads; --set still wins over it.
    reference = [f"{k}={v if v is not None else 'null'}" for k, v in reference_settings().items()]
    cfg = load_config(args.config, (reference if args.reference else []) + list(args.set))
    check_against_encoder(cfg)  # depth-dependent keys fail before data is read
    out = Path(args.output)
    resume_from = None
    if args.resume:
        run_dir = _resumable(out)
        if run_dir is None:
            raise FileNotFoundError(f"--resume: {out / 'last' / CHECKPOINT_STATE} not found; "
                                    f"{out} holds no run to continue (train without --resume)")
        resume_from = run_dir / "last"
        # A stopped run's partial folder goes on filling; a run that already reached --output
        # (its last/ is rewritten atomically each epoch) continues there.
        partial = run_dir if run_dir != out else None
    else:
        partial = _partial_folder(out)
    # The bar redraws one terminal line; in a log file or a pipe it would be noise.
    bar = ProgressBar(cfg.train.epochs) if sys.stdout.isatty() else None
    try:
        result = train(cfg, output_dir=partial or out, resume_from=resume_from, progress=bar,
                       log=bar.log if bar else print)
        if partial is not None:
            _move_in(partial, out)
    except BaseException:
        if partial is not None and (partial / "last" / CHECKPOINT_STATE).is_file():
            print(f"mtbert: the run so far is kept in {partial}; `--resume` continues it", file=sys.stderr)
            partial = None
        if (out / "result.json").exists():
            print(f"mtbert: {out} keeps the earlier run (this run wrote nothing there)", file=sys.stderr)
        raise
    finally:
        if partial is not None:
            shutil.rmtree(partial, ignore_errors=True)
    m = result.metrics
    for line in result.data_report:
        print(f"data: {line}")
    print(f"best epoch {m['best_epoch']}: overall={m['overall']:.4f} "
          f"train_time_s={m['train_time_s']:.1f} model_size_mb={m['model_size_mb']:.1f} "
          f"peak_memory_mb={m['peak_memory_mb']:.0f}")
    print(f"wrote {out / 'result.json'} and the model bundle {out / 'best'} (mtbert.load_model)")
    return 0


def cmd_predict(args: argparse.Namespace) -> int:
    from mtbert.bundle import load_model
    from mtbert.config import build_config, to_dict
    from mtbert.outputs import check_output_folder
    from mtbert.predict import predict_split
    from mtbert.train.metrics import overall

    folder = Path(args.model)
    from_store = not folder.exists()  # a name the sweep printed: a models:/ URI, a run id, a registered model
    # Predictions go beside a bundle folder the user named; a model fetched from the store
    # lives in a cache folder, so its predictions go to the folder the command runs in.
    output = Path(args.output) if args.output else Path("predictions") if from_store else folder / "predictions"
    check_output_folder(output)
    if from_store:
        try:
            from orchestration.cli import reading_store
            from orchestration.track.models import resolve_bundle
        except ImportError:
            raise FileNotFoundError(f"--model {args.model}: no such folder") from None
        # Read only: a name with no store beside it must not leave an empty ./mlflow.db.
        try:
            uri = reading_store(args.tracking_uri)
        except ValueError as exc:
            if args.model.startswith(("models:/", "runs:/")):
                raise
            raise FileNotFoundError(f"--model {args.model}: no such folder; as a run id or a registered "
                                    f"model name: {exc}") from None
        folder = resolve_bundle(args.model, uri)
        print(f"model: {args.model} -> bundle {folder}")
    bundle = load_model(folder, device=args.device, encoder=args.encoder)
    if args.set:
        # Data keys only matter here: the files may live elsewhere than where it trained.
        bundle.config = build_config(to_dict(bundle.config), args.set, source=f"{folder}/config.yaml")
    done = predict_split(bundle, args.split, output, as_trained=args.as_trained)
    scored = [p for p in done if p.score is not None]
    if scored:
        print(f"{args.split}: overall={overall([p.score for p in scored]):.4f} over {len(scored)} task(s)")
    return 0


def cmd_bundle(args: argparse.Namespace) -> int:
    from mtbert.bundle import is_slim, make_self_contained
    from mtbert.outputs import check_output_folder

    if args.output:
        check_output_folder(args.output, new=True)
    elif Path(args.model).is_dir():  # in place
        check_output_folder(args.model, "bundle")
    was_slim = is_slim(args.model)
    out = make_self_contained(args.model, args.output, encoder=args.encoder)
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file()) / 2**20
    print(f"{out}: self-contained ({size:.1f} MB), loads without the pretrained model"
          + ("" if was_slim else "; it already stored every weight"))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mtbert", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("train", help="train one configuration")
    p.add_argument("--config", help="YAML config (omit for the embedded default)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key, e.g. --set optim.lr=1e-4 (repeatable)")
    p.add_argument("--output", default="runs/train",
                   help="folder for result.json and the best model; a new run replaces them when it ends")
    p.add_argument("--reference", action="store_true",
                   help="train the frozen reference instead: every encoder layer frozen, linear heads")
    p.add_argument("--resume", action="store_true",
                   help="continue the run for --output from its last finished epoch (a stopped run's "
                   "partial folder first; RNG states restored: the result equals an uninterrupted run's)")
    p.set_defaults(func=cmd_train)
    p = sub.add_parser("predict", help="predict a split with a trained model bundle")
    p.add_argument("--model", required=True,
                   help="a model bundle folder (a run's best/), or what a sweep prints: a models:/ URI, "
                   "a run id, a registered model name (its latest version)")
    p.add_argument("--tracking-uri", help="the MLflow store a models:/ URI, run id or name is read from "
                   "(default: $MLFLOW_TRACKING_URI, else ./mlflow.db)")
    p.add_argument("--split", default="dev", choices=["dev", "test"])
    p.add_argument("--as-trained", action="store_true",
                   help="score only the dev examples the run scored (its data.max_dev_examples cap); "
                   "default: the whole split")
    p.add_argument("--output", help="folder for the prediction files (default: <model>/predictions for a "
                   "bundle folder, ./predictions for a model read from MLflow)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key of the bundle, e.g. --set data.dir=other/folder")
    encoder_help = ("where a slim bundle's frozen weights are (a folder or hub name holding the model it "
                    "trained from; default: the one it names)")
    p.add_argument("--encoder", metavar="FOLDER", help=encoder_help)
    p.set_defaults(func=cmd_predict)
    p = sub.add_parser("bundle", help="make a slim bundle self-contained: store the frozen weights it names")
    p.add_argument("model", help="a model bundle folder (a run's best/)")
    p.add_argument("--output", help="write a self-contained copy there (default: in place)")
    p.add_argument("--encoder", metavar="FOLDER", help=encoder_help)
    p.set_defaults(func=cmd_bundle)
    try:
        from orchestration.cli import register
    except ImportError:  # the library alone still trains
        pass
    else:
        register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from mtbert.errors import CheckpointUnreadable, TrainingError

    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, TrainingError, CheckpointUnreadable, FileNotFoundError) as exc:
        # User errors (config, data, sweep files, a diverging run) are one line, no traceback.
        print(f"mtbert: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("mtbert: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
