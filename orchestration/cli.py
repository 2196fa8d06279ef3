"""`mtbert sweep run|resume`, `mtbert leaderboard`, `mtbert importance`, `mtbert best`, `mtbert
findings` and `mtbert affinity`, registered into mtbert's CLI."""
from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

from orchestration.errors import SweepError
from orchestration.paths import tool


def _exit_code(outcome) -> int:
    """0 only for a sweep that ran every trial to the end; CI should notice a failed trial."""
    return 0 if outcome.status == "FINISHED" and outcome.failed == 0 else 1


def cmd_sweep_run(args: argparse.Namespace) -> int:
    from mtbert.outputs import check_output_folder
    from orchestration.run.launch import run_sweep

    if args.storage:
        check_output_folder(args.storage, "--storage")
    if args.name is not None and (not args.name.strip() or Path(args.name).name != args.name
                                  or args.name in (".", "..")):
        raise SweepError(f"--name {args.name!r}: a folder name under the storage folder (no '/', not . or ..)")
    outcome = run_sweep(args.file, overrides=args.set, smoke=args.smoke, name=args.name,
                        address=args.address, tracking_uri=args.tracking_uri, num_cpus=args.num_cpus,
                        storage=args.storage)
    return _exit_code(outcome)


def cmd_sweep_plan(args: argparse.Namespace) -> int:
    from orchestration.run.dryrun import plan_sweep

    plan_sweep(args.file, overrides=args.set, smoke=args.smoke, measure=not args.no_measure, num_cpus=args.num_cpus)
    return 0


def _dashboard(address: str | None) -> bool:
    """A Ray dashboard (http://HEAD:8265) rather than an address a driver joins."""
    return bool(address) and address.startswith(("http://", "https://"))


def cmd_sweep_resume(args: argparse.Namespace) -> int:
    from orchestration.run.launch import resume_sweep

    if not (args.address or os.environ.get("RAY_ADDRESS") or args.storage or args.seeds_max is not None):
        # A SLURM job id, or the name of a sweep a SLURM job of this folder ran: resumed on SLURM.
        from orchestration.run.slurm import slurm_resume

        if slurm_resume(args.sweep, args.workdir):
            return 0
    if _dashboard(args.address):  # a submitted sweep: its resume is a Ray Job on the head too
        if args.seeds_max is not None:
            raise SweepError("--seeds-max: run it where the sweep's folder is (on the head), not through a dashboard")
        from orchestration.run.jobs import submit_resume

        submit_resume(args.sweep, args.address, follow=not args.no_follow, workdir=args.workdir,
                      python=getattr(args, "python", None))
        return 0

    if args.seeds_max is not None:
        from orchestration.run.launch import extend_sweep

        outcome = extend_sweep(args.sweep, args.seeds_max, address=args.address, num_cpus=args.num_cpus,
                               storage=args.storage)
        return _exit_code(outcome)
    outcome = resume_sweep(args.sweep, address=args.address, num_cpus=args.num_cpus, storage=args.storage)
    return _exit_code(outcome)


def _existing_store(tracking_uri: str | None) -> str:
    """The store a reading command (leaderboard, findings) names, refused in one line when it
    is a sqlite file that does not exist: MLflow would create an empty one there and report
    "no such experiment"."""
    from orchestration.paths import resolve_tracking_uri, sqlite_path

    uri = resolve_tracking_uri(tracking_uri, None)
    path = sqlite_path(uri)
    if path is not None and Path(path).is_dir():
        raise SweepError(f"--tracking-uri {uri}: {path} is a folder, not a sqlite file")
    if path is not None and not Path(path).is_file():
        raise SweepError(f"--tracking-uri {uri}: no such store (file {path} does not exist)")
    return uri


def reading_store(tracking_uri: str | None, through_mlflow: bool = True) -> str:
    """The store of a command that reads (leaderboard, importance, best, findings, predict
    --model models:/...), checked in one line; it is never created, migrated or written.
    `through_mlflow`: the command opens it with MLflow's client, which would create the tables
    a file lacks; leaderboard and importance read a sqlite store with SQL alone."""
    from orchestration.report.reader import check_sqlite_store, check_store_for_mlflow

    uri = _existing_store(tracking_uri)
    if uri.startswith("sqlite:///"):
        # Read with SQL, not MLflow (whose import and store take seconds): the check too.
        (check_store_for_mlflow if through_mlflow else check_sqlite_store)(uri)
    else:
        from orchestration.track.tracking import check_tracking

        check_tracking(uri)  # the same reachability check as `sweep run`: a closed port is one line
    return uri


def _check_outputs(*paths: tuple[str | Path | None, str]) -> None:
    """Every file the command will write (path, the option naming it), before any work."""
    from mtbert.outputs import check_output_file

    for path, option in paths:
        if path is not None:
            check_output_file(path, option)


def _beside(output: str | None, experiment: str, suffix: str) -> Path:
    """A file that goes with the table: next to --output, else runs/<experiment>-<suffix>."""
    return Path(output).with_suffix(f".{suffix}") if output else Path("runs") / f"{experiment}-{suffix}"


def _said(lines: list[str]) -> None:
    """Which sweep a reading command chose, on stderr once it succeeded (an error names the
    sweep itself, in its one line)."""
    for line in lines:
        print(line, file=sys.stderr)


def _write(text: str, output: str | None, what: str) -> None:
    if output:
        Path(output).parent.mkdir(parents=True, exist_ok=True)
        Path(output).write_text(text)
        print(f"wrote {output} ({what})", file=sys.stderr)
    else:
        sys.stdout.write(text)


def cmd_leaderboard(args: argparse.Namespace) -> int:
    from orchestration.report import importance
    from orchestration.report.leaderboard import leaderboard

    plot = args.plot or _beside(args.output, args.experiment, "pareto.png")
    importance_plot = _beside(args.output, args.experiment, "importance.png")
    _check_outputs((args.output, "--output"), (plot, "--plot"), (importance_plot, "the importance plot"),
                   (_beside(args.output, args.experiment, "importance.csv") if args.format == "csv" and args.output
                    else None, "the importance table"))
    uri = reading_store(args.tracking_uri, through_mlflow=False)
    columns = [c.strip() for c in args.columns.split(",") if c.strip()] if args.columns else None
    chose: list[str] = []
    text, table, parent = leaderboard(uri, args.experiment, args.sweep, args.format, args.sort, plot, importance_plot,
                                      columns, say=chose.append)
    _said(chose)
    _write(text, args.output, f"{len(table)} rows, sweep {parent.info.run_name}")
    print(f"Pareto plot: {plot} (the parent run {parent.info.run_id} keeps it as pareto.png)", file=sys.stderr)
    found, why = importance.stored(uri, parent, table)
    if found is None:
        if why:
            where = f" --tracking-uri {shlex.quote(args.tracking_uri)}" if args.tracking_uri else ""
            print(f"importance of the swept dimensions: {why}; `{tool('mtbert')} importance --experiment "
                  f"{shlex.quote(args.experiment)}{where}` computes it", file=sys.stderr)
    elif args.format == "csv" and args.output:  # a csv file holds one table: the importance goes beside it
        _write(importance.render(found, "csv"), str(_beside(args.output, args.experiment, "importance.csv")),
               f"importance, {len(found)} rows")
    else:
        print(f"importance plot: {importance_plot}", file=sys.stderr)
    return 0


def cmd_importance(args: argparse.Namespace) -> int:
    from orchestration.report.importance import check_permutations, importance

    if args.permutations is not None:
        check_permutations(args.permutations)
    plot = args.plot or _beside(args.output, args.experiment, "importance.png")
    _check_outputs((args.output, "--output"), (plot, "--plot"))
    uri = reading_store(args.tracking_uri, through_mlflow=False)
    chose: list[str] = []
    text, found, parent = importance(uri, args.experiment, args.sweep, args.format, args.permutations, plot,
                                     say=chose.append)
    _said(chose)
    _write(text, args.output, f"{found['dimension'].nunique()} dimensions x {found['figure'].nunique()} figures, "
           f"sweep {parent.info.run_name}")
    print(f"importance plot: {plot} (importance.csv and importance.png also on parent run {parent.info.run_id})",
          file=sys.stderr)
    return 0


def cmd_best(args: argparse.Namespace) -> int:
    from orchestration.report.best import best_model, render

    uri = reading_store(args.tracking_uri)  # a closed port or a wrong password is one line
    chose: list[str] = []
    found = best_model(uri, args.experiment, args.sweep, say=chose.append, include_reference=args.include_reference)
    _said(chose)
    sys.stdout.write(render(found, args.format))
    return 0


def cmd_findings(args: argparse.Namespace) -> int:
    from orchestration.report.findings import findings
    from orchestration.sweep.claims import read_claims

    # The files' claims first: a bad claim is one line before the store is opened.
    _check_outputs((args.output, "--output"))
    claims = [c for path in args.files for c in read_claims(path)] if args.files else None
    if args.files and not claims:
        raise SweepError(f"{', '.join(args.files)}: no claims to judge (a sweep file's `claims:` holds them)")
    uri = reading_store(args.tracking_uri)
    text, table = findings(uri, args.experiment or None, args.format, claims, args.error_rate)
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(text)
        counts = table["verdict"].value_counts().to_dict()
        print(f"wrote {args.output} ({', '.join(f'{v} {k}' for k, v in counts.items())})", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def cmd_affinity(args: argparse.Namespace) -> int:
    from orchestration.report import affinity as aff

    folder = Path(args.source).is_dir()
    label = Path(args.source).name if folder else args.source
    fragment = Path(args.output or Path("runs") / f"{label}-grouping.yaml")
    plot = Path(args.plot or fragment.with_suffix(".png"))
    _check_outputs((fragment, "--output"), (plot, "--plot"))
    if folder:
        measured = aff.from_folder(Path(args.source))
    else:
        chose: list[str] = []
        measured = aff.from_source(reading_store(args.tracking_uri), args.source, args.experiment, say=chose.append)
        _said(chose)
    suggestion = aff.suggest(measured, args.variant)
    sys.stdout.write(aff.render_suggestion(suggestion, measured))
    if args.against:
        chose = []
        check = aff.check_regimes(measured, args.variant, reading_store(args.tracking_uri), args.against, say=chose.append)
        _said(chose)
        sys.stdout.write(aff.render_check(check, args.against))
    _write(aff.fragment(suggestion, measured, fragment.stem, label), str(fragment), "the suggested grouping's sweep")
    print(f"heatmap: {aff.plot_mean(suggestion, measured, plot)}", file=sys.stderr)
    return 0


def _ray_options(p: argparse.ArgumentParser, dashboard: str = "") -> None:
    p.add_argument("--address", help="join this Ray cluster (default: $RAY_ADDRESS, else a local Ray)" + dashboard)
    p.add_argument("--num-cpus", type=int, default=None, help="CPUs of the local Ray (default: all)")


STORE_HELP = "MLflow store (default: $MLFLOW_TRACKING_URI, else sqlite:///<cwd>/mlflow.db)"


def _reading_options(p: argparse.ArgumentParser, formats, default: str = "md", format_help: str | None = None,
                     output: bool = True, experiments: bool = False) -> None:
    """The options every reading command (leaderboard, importance, best, findings) shares:
    --experiment (one, required; `experiments`: repeatable, default every one), --sweep (one
    experiment's), --format (`formats`), --output (with `output`) and --tracking-uri."""
    if experiments:
        p.add_argument("--experiment", action="append", default=[],
                       help="MLflow experiment to read (repeatable; default: every experiment in the store)")
    else:
        p.add_argument("--experiment", required=True, help="MLflow experiment (the sweep name by default)")
        p.add_argument("--sweep", help="parent run id or name (default: the latest sweep with finished trials)")
    p.add_argument("--format", default=default, choices=list(formats), help=format_help)
    if output:
        p.add_argument("--output", help="write the table here instead of stdout")
    p.add_argument("--tracking-uri", help=STORE_HELP)


def _add_sweep(subparsers: argparse._SubParsersAction) -> None:
    sweep = subparsers.add_parser("sweep", help="run or resume a sweep (Ray Tune + MLflow)")
    sweep_sub = sweep.add_subparsers(dest="sweep_command", required=True)
    _add_sweep_run(sweep_sub)
    _add_sweep_plan(sweep_sub)
    _add_sweep_resume(sweep_sub)
    try:  # submit | status | stop: sweeps as Ray Jobs on a cluster
        from orchestration.run.jobs import add_job_commands
    except ImportError:
        add_job_commands = None
    from orchestration.run.slurm import add_slurm_command, slurm_status  # sweeps as SLURM batch jobs

    if add_job_commands is not None:
        add_job_commands(sweep_sub, batch_status=slurm_status)
    add_slurm_command(sweep_sub)


def _add_sweep_run(sweep_sub: argparse._SubParsersAction) -> None:
    run = sweep_sub.add_parser("run", help="run a sweep file")
    run.add_argument("file", help="sweep YAML, e.g. sweeps/smoke.yaml")
    _ray_options(run)
    run.add_argument("--tracking-uri", help="MLflow store (default: the sweep's tracking.uri, "
                     "$MLFLOW_TRACKING_URI, else sqlite:///<cwd>/mlflow.db)")
    run.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                     help="override a base config key (optim.lr=1e-4) or a sweep key (num_samples=4)")
    run.add_argument("--smoke", action="store_true", help="shrink to seconds: tiny model, synthetic data, "
                     "2 epochs of a few steps, few trials (CI runs every sweep this way)")
    run.add_argument("--name", help="name of this sweep run (default: <sweep>-<date>-<time>)")
    run.add_argument("--storage", help="Ray Tune storage folder (default: <cwd>/runs)")
    run.set_defaults(func=cmd_sweep_run)


def _add_sweep_plan(sweep_sub: argparse._SubParsersAction) -> None:
    plan = sweep_sub.add_parser("plan", help="what a sweep would run and its estimated time, without running it "
                                "(no Ray, no MLflow)")
    plan.add_argument("file", help="sweep YAML, e.g. sweeps/smoke.yaml")
    plan.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="as for `sweep run`")
    plan.add_argument("--smoke", action="store_true", help="the plan of the --smoke run")
    plan.add_argument("--num-cpus", type=int, default=None, help="CPUs the local Ray would have (default: all)")
    plan.add_argument("--no-measure", action="store_true",
                      help="no estimate: skip the short run of the first trial that measures its cost")
    plan.set_defaults(func=cmd_sweep_plan)


def _add_sweep_resume(sweep_sub: argparse._SubParsersAction) -> None:
    resume = sweep_sub.add_parser("resume", help="continue a sweep whose driver died (or was stopped)")
    resume.add_argument("sweep", metavar="PATH_OR_NAME", help="runs/<name> or just <name>; with a dashboard "
                        "--address, the id of the job that ran it (or its folder as the head sees it); a SLURM "
                        "job's id (or its sweep's name) resumes it on SLURM")
    resume.add_argument("--storage", help="the Ray Tune storage folder `run` had (default: <cwd>/runs)")
    resume.add_argument("--seeds-max", type=int, metavar="N", default=None,
                        help="more seeds for a finished adaptive sweep: open claims go on up to N paired seeds, "
                        "finished trials stay as they are, the verdicts keep their error rate (docs/verdicts.md)")
    _ray_options(resume, "; a Ray dashboard (http://HEAD:8265) resumes a submitted sweep as a Ray Job")
    # With --address http://HEAD:8265, a sweep submitted as a Ray Job is resumed as one.
    resume.add_argument("--workdir", help="with a dashboard --address: the folder on the head to run in "
                        "(default: the one the sweep's job had); for a SLURM job: its folder, where SLURM no "
                        "longer holds the job (default: the one SLURM has for it, else the current folder)")
    resume.add_argument("--no-follow", action="store_true",
                        help="with a dashboard --address: return once submitted, do not stream logs")
    try:
        from orchestration.run.jobs import python_option
    except ImportError:
        python_option = None
    if python_option is not None:
        python_option(resume)
    resume.set_defaults(func=cmd_sweep_resume)


def _add_reading(subparsers: argparse._SubParsersAction) -> None:
    """leaderboard, importance, best, findings and affinity: the commands that read a store."""
    from orchestration.report.export import FORMATS, MARKDOWN_FORMATS  # light: no pandas, no MLflow

    board = subparsers.add_parser("leaderboard", help="a sweep as the papers' table")
    _reading_options(board, FORMATS)
    board.add_argument("--sort", default="overall", help="column to sort by (baseline stays first)")
    board.add_argument("--columns", metavar="KEY,KEY,...",
                       help="the printed table's columns, by the csv's names (e.g. overall,sst_acc,model_size_mb,"
                       "tm_relative_score_compute); the row's regime label always comes first "
                       "(default: every column; latex: those that fit a page)")
    board.add_argument("--plot", help="Pareto plot PNG (default: next to --output, else runs/<experiment>-pareto.png)")
    board.set_defaults(func=cmd_leaderboard)

    imp = subparsers.add_parser("importance", help="which swept keys matter, per figure (fANOVA's share of the "
                                "configurations' seed means, a permutation test against seed noise; two "
                                "configurations: their paired difference)")
    _reading_options(imp, FORMATS)
    imp.add_argument("--plot", help="bar chart PNG (default: next to --output, else runs/<experiment>-importance.png)")
    imp.add_argument("--permutations", type=int, default=None,
                     help="shuffles of each key's levels for its p-value (default: importance.PERMUTATIONS, 999)")
    imp.set_defaults(func=cmd_importance)

    best = subparsers.add_parser("best", help="a sweep's best configuration (by its mean over the seeds every "
                                 "configuration ran) and its best seed's model: run id, models:/ URI, registered "
                                 "version, bundle folder")
    _reading_options(best, ("text", "json"), "text", output=False, format_help="text: comment lines, then one "
                     "`mtbert predict --model ...` line per name of the model")
    best.add_argument("--include-reference", action="store_true",
                      help="let the frozen reference compete (by default a yardstick, never the best)")
    best.set_defaults(func=cmd_best)

    found = subparsers.add_parser("findings", help="the papers' claims checked against the runs (paired by seed)")
    found.add_argument("files", nargs="*", metavar="SWEEP_FILE",
                       help="sweep files whose claims to judge (default: the claims the latest sweep of each "
                       "experiment logged with its parent run)")
    _reading_options(found, MARKDOWN_FORMATS, experiments=True)  # findings.FORMATS
    found.add_argument("--error-rate", choices=["family", "claim"], default=None,
                       help="family: the chance that any verdict of the table is wrong stays within 5%% (each of "
                       "its m claims at 5%%/m); claim: each verdict on its own at 5%% (default: the sweep files' "
                       "`verdicts.error_rate`, family unless they say otherwise)")
    found.set_defaults(func=cmd_findings)

    aff = subparsers.add_parser("affinity", help="the inter-task affinities a run or sweep measured "
                                "(affinity.every_steps), a suggested grouping of the tasks and a sweep that trains it")
    aff.add_argument("source", help="a `mtbert train --output` folder, an MLflow run id (a sweep's parent run or "
                     "one trial's), or a sweep's name (with --experiment; alone: an experiment, its latest sweep)")
    aff.add_argument("--experiment", help="the MLflow experiment of a sweep named by its name")
    aff.add_argument("--variant", help="read this configuration's trials only (default: every trial of the sweep)")
    aff.add_argument("--against", metavar="EXPERIMENT", help="check the head regimes' ranking the per-layer "
                     "affinities predict against the latest sweep of this experiment, which trained the regimes")
    aff.add_argument("--output", help="the sweep fragment YAML (default: runs/<source>-grouping.yaml)")
    aff.add_argument("--plot", help="heatmap of the mean affinities (default: next to the fragment, .png)")
    aff.add_argument("--tracking-uri", help=STORE_HELP)
    aff.set_defaults(func=cmd_affinity)


def register(subparsers: argparse._SubParsersAction) -> None:
    _add_sweep(subparsers)
    _add_reading(subparsers)
