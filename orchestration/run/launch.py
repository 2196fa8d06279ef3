"""Run and resume sweeps: sweep file -> validated plan -> Ray Tune -> MLflow.

Order matters and is the point of this module: everything that can fail on user input
(sweep file, every planned config, the tracking store, the data) fails before Ray starts a
single trial.
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import shlex
import signal
import socket
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import yaml

from mtbert.errors import first_line
from orchestration.errors import SweepError, TrackingUnavailable
from orchestration.paths import resolve_tracking_uri, runs_dir, tool
from orchestration.run.stops import GROUP_SIGNALS
from orchestration.sweep.claims import CLAIMS_FILE, from_doc, to_doc
from orchestration.sweep.load import load_sweep
from orchestration.sweep.plan import Planner
from orchestration.sweep.space import POINTS_TAG, values_of
from orchestration.sweep.spec import SMOKE_SUFFIX, Sweep
from orchestration.track.tm import __doc__ as TM_DOC
from orchestration.track.tracking import RECORD_FILE, STORAGE_FULL, SweepTracking, check_tracking, git_commit

SWEEP_STATE = "mtbert_sweep.json"  # in the Ray experiment folder: how to find the MLflow runs again
CALLS_FILE = "mlflow_calls.json"  # MLflow client calls per trial key of the last driver (per-trial cost)
IN_RAY_JOB = "RAY_JOB_CONFIG_JSON_ENV_VAR"  # set by Ray in a job's driver: its runtime_env as JSON
# The modules a sweep folder saved before orchestration/ had rooms may name: it pickled its
# searcher, scheduler and callbacks under the flat names (`orchestration.` + module), and a
# resume must still find them there (_flat_names). Modules added since never had a flat name.
ROOM_MODULES = {"sweep": ("spec", "space", "plan", "claims", "labels"),
                "run": ("launch", "trainable", "callbacks", "jobs", "remote", "searcher", "scheduler"),
                "track": ("tracking", "models", "tm"),
                "report": ("leaderboard", "export", "findings", "verdicts", "importance", "best")}
# Objects a saved sweep's Tune state may name where they were, as (module, name): the module
# they are in now (_moved_names). Tune keeps the run's callbacks pickled.
MOVED = {("orchestration.run.callbacks", "ProgressPrinter"): "orchestration.run.progress"}


@dataclass
class SweepOutcome:
    name: str
    run_dir: str
    tracking_uri: str
    experiment: str
    parent_run_id: str
    status: str
    trials: int = 0
    finished: int = 0
    stopped_early: int = 0
    failed: int = 0
    diverged: int = 0  # runs that failed to train (tracking.diverged_reason): a finding, not a failure
    wall_s: float = 0.0
    trial_time_s: float = 0.0  # summed wall time of the trial functions (Tune's time_total_s)
    train_time_s: float = 0.0  # summed training-step time (train()'s train_time_s)
    logging_s: float = 0.0  # driver time in MLflow calls: the sync thread's and the reads'
    reads_s: float = 0.0  # of which reads (searches: a resumed trial's run, the sweep's end)
    writer_cpu_s: float = 0.0  # the sync thread's own CPU in its calls (tracking._Syncer.busy_cpu_s)
    mlflow_calls: int = 0  # MLflow client calls of this driver (per trial in CALLS_FILE)
    best: dict[str, Any] = field(default_factory=dict)
    experiment_id: str = ""
    verdicts: list[str] = field(default_factory=list)  # a line per claim, judged on this sweep's runs
    setup: dict[str, float] = field(default_factory=dict)  # the shared setup's seconds (_prepare_data)


# --------------------------------------------------------------------------- pieces

def _prepare_data(planner: Planner, log: Callable[[str], None], frozen: bool = True) -> dict[str, float]:
    """The sweep's shared setup, in the driver, before any trial starts, so that no trial pays
    for it: tokenize once per distinct data setup and, with `frozen` (a local sweep: the
    trials' machine and cache folder are the driver's), compute the frozen-layer cache once
    per distinct frozen setup (mtbert/train/frozen.py). Returns its seconds (setup_*_s),
    which the parent run records; a trial's figures never include them. It runs on every CPU
    the driver may use (no trial runs yet), not the few a trial is given."""
    with machine_threads() as threads:
        return _shared_setup(planner, log, frozen, threads)


def driver_cpus() -> int:
    """The CPUs this process may run on: its affinity (which taskset, a container or a SLURM
    allocation narrows), where the platform has one, else the machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        return os.cpu_count() or 1


@contextmanager
def machine_threads():
    """torch's threads set to driver_cpus() inside, put back after: the driver may have been
    given fewer (OMP_NUM_THREADS, or a trial's count), and what it does next keeps those."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(driver_cpus())
    try:
        yield torch.get_num_threads()
    finally:
        torch.set_num_threads(before)


def _shared_setup(planner: Planner, log: Callable[[str], None], frozen: bool, threads: int) -> dict[str, float]:
    from mtbert.config import build_config
    from mtbert.data.tokenize import prepare
    from mtbert.train.frozen import setup_signature
    from mtbert.train.loop import build_frozen_cache
    from orchestration.track.describe import data_signature

    seen, frozen_seen = set(), set()
    t0 = time.perf_counter()
    configs = []
    for trial in planner.fixed_trials():
        signature = data_signature(trial["config"])
        cfg = build_config(trial["config"])
        configs.append(cfg)
        if signature not in seen:
            seen.add(signature)
            prepare(cfg, log=None)
    tokenize_s = time.perf_counter() - t0
    log(f"data: {len(seen)} setup(s) tokenized in {tokenize_s:.1f}s; "
        f"trials read them from the cache {planner.sweep.base['data']['cache_dir']}")
    setup = {"setup_tokenize_s": tokenize_s}
    if not frozen:
        return setup
    _share_peaks(configs, planner.sweep.spec.resources.cpu)
    t1, built, computing = time.perf_counter(), 0, 0.0
    # Shallower frozen setups first: a deeper one of the same encoder and data continues from
    # their stored states (mtbert/train/frozen.py), so the layers they share are computed once.
    for cfg in sorted(configs, key=lambda c: math.inf if c.freeze.layers < 0 else c.freeze.layers):
        signature = setup_signature(cfg)
        if signature not in frozen_seen:
            frozen_seen.add(signature)
            n, seconds = build_frozen_cache(cfg, log)  # its progress lines: minutes on a CPU
            built, computing = built + n, computing + seconds
    frozen_s = time.perf_counter() - t1
    setup["setup_frozen_cache_s"] = frozen_s
    if built:
        log(f"frozen layers: {built} block(s) computed in {computing:.1f}s ({frozen_s:.1f}s with the models "
            f"loaded) for {len(frozen_seen)} setup(s), once for the sweep, on {threads} CPU thread(s)")
    elif frozen_seen:
        log(f"frozen layers: {len(frozen_seen)} setup(s) checked in {frozen_s:.1f}s, nothing to compute")
    return setup


def _share_peaks(configs: list, cpus: float) -> None:
    """The matmul peaks the trials read their MFU against, measured here on the idle device
    before any trial runs (mtbert/train/measure.py: share_peaks); a local Ray's trials inherit
    them. A trial keeps as many threads as CPUs it is given."""
    from mtbert.train.measure import pick_device, share_peaks
    from mtbert.train.precision import label

    runs = []
    for cfg in configs:
        device = pick_device(cfg.train.device)
        runs.append((device, label(cfg.train.precision, device)))
    share_peaks(runs, max(1, int(cpus)))


SETUP_TIME = "setup_time_s"  # on the parent run: the shared setup's wall seconds, Ray's start included


@contextmanager
def _setup_ends_parent(tracking: SweepTracking):
    """The shared setup runs under the sweep's parent run: where it fails (the data, the frozen
    cache, Ray's start), the parent ends FAILED with the one-line error (KILLED on a Ctrl-C),
    never left RUNNING nor FINISHED, and the error goes on to the caller."""
    try:
        yield
    except BaseException as exc:
        failed = not isinstance(exc, KeyboardInterrupt)
        if failed:
            tracking.tag_parent({"error": first_line(exc)})
        tracking.end_parent("FAILED" if failed else "KILLED")
        tracking.flush(timeout=10.0)
        tracking.release()
        raise


def check_ray_address(address: str, timeout: float = 5.0) -> None:
    """A cluster's head that does not answer is one line, before Ray is asked: Ray itself
    retries for a minute or more, printing a warning every few seconds. HOST:PORT (a head's
    GCS) and ray://HOST:PORT (Ray Client) are checked; `auto` and `local` are Ray's own."""
    import socket

    target = address.removeprefix("ray://")
    host, _, port = target.rpartition(":")
    if not host or not port.isdigit():
        return
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            pass
    except OSError as exc:
        raise SweepError(f"--address {address}: no Ray cluster answers there ({exc.strerror or exc}); start its "
                         f"head (`ray start --head`) or give the address it printed") from None


def _init_ray(address: str | None, num_cpus: int | None, plugins: list[str] = ()) -> bool:
    """Local Ray by default; --address or $RAY_ADDRESS joins a cluster. Returns is_local.

    The config's `plugins` modules (already imported here by the config check) travel to the
    workers as py_modules, so a trial process imports the same code the driver validated.
    A driver running as a Ray job ships nothing: the job's runtime_env already carries the
    project and the working folder (jobs.py), and Ray refuses a second py_modules."""
    import ray

    from mtbert.config import import_plugins

    address = address or os.environ.get("RAY_ADDRESS")
    # Trial stdout goes to each trial's train.log; the console keeps the compact progress.
    common = dict(log_to_driver=False, logging_level=logging.WARNING, ignore_reinit_error=True)
    if ray.is_initialized():
        return not address
    modules: list = []
    if IN_RAY_JOB not in os.environ:
        modules = import_plugins(list(plugins))
        if address:  # a cluster's nodes may not have the project installed
            root = Path(__file__).resolve().parents[2]
            modules = [str(root / "mtbert"), str(root / "orchestration"), *modules]
    local = {} if address else {"num_cpus": num_cpus, "include_dashboard": False}
    if not address:
        # Ray says at every start of a local cluster that token authentication is on (the
        # default); this one lives and dies with the sweep, so the notice is noise there.
        logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)
    start = lambda: ray.init(address=address or "local",  # noqa: E731
                             runtime_env={"py_modules": modules} if modules else None, **local, **common)
    with _signals_stay_with_driver(local=not address):
        _start_local_ray(start) if not address else start()
    if not address:
        import atexit

        from orchestration.run.shutdown import stop_local_ray

        atexit.register(stop_local_ray)  # before Ray's own exit handler, which then has nothing to do
    return not address


RAY_START_TRIES = 2  # a local Ray's start that timed out is tried once more


def _start_local_ray(start) -> None:
    """Start a local Ray, once more if its start timed out: Ray gives its raylet a fixed 30 s
    to register, which a machine busy with other work can miss; a second miss is one line."""
    import ray

    for attempt in range(1, RAY_START_TRIES + 1):
        try:
            start()
            return
        except Exception as exc:  # Ray raises a bare Exception for this
            if "timed out during startup" not in str(exc):
                raise
            ray.shutdown()
            load = os.getloadavg()[0]
            if attempt == RAY_START_TRIES:
                raise SweepError(f"the local Ray did not start: its raylet missed Ray's 30 s to register "
                                 f"{RAY_START_TRIES} times (load average {load:.0f} on {os.cpu_count()} CPUs); "
                                 "run again when the machine is less busy") from None
            print(f"the local Ray's start timed out (load average {load:.0f} on {os.cpu_count()} CPUs); "
                  "starting it once more", file=sys.stderr, flush=True)


@contextmanager
def _signals_stay_with_driver(local: bool):
    """A local Ray's processes (its GCS, raylet, trial workers) start with GROUP_SIGNALS
    blocked, as Ray itself starts them with SIGINT blocked: a signal sent to the whole group
    then reaches the driver alone, which stops the sweep as for a Ctrl-C (its trials KILLED,
    its summary, `sweep resume`), while Ray stays up to let it. Unblocked, the GCS died
    first and the driver hung 60 s on it, then exited with its runs left RUNNING.
    A process inherits the mask of the thread that starts it; Ray's head dies with its
    driver all the same (Ray ties their lives), and SIGKILL is never blocked."""
    if not local or threading.current_thread() is not threading.main_thread():
        yield
        return
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, GROUP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def _check_resources(sweep: Sweep, local: bool, log: Callable[[str], None]) -> None:
    import ray

    have = ray.cluster_resources()
    want = sweep.spec.resources
    short = [(name, need, have.get(key, 0.0)) for name, key, need in
             (("cpu", "CPU", want.cpu), ("gpu", "GPU", want.gpu)) if need > have.get(key, 0.0)]
    for name, need, got in short:
        message = (f"resources.{name}: each trial asks for {need:g} but the Ray cluster has {got:g}; "
                   "no trial could ever start")
        if local:
            raise SweepError(f"{sweep.source}: {message}")
        log(f"warning: {message} (unless the cluster autoscales)")


def check_num_cpus(num_cpus: int | None) -> None:
    if num_cpus is not None and num_cpus < 1:
        raise SweepError(f"--num-cpus: must be >= 1, got {num_cpus}")


def _check_local_resources(sweep: Sweep, address: str | None, num_cpus: int | None) -> None:
    """A local Ray has what this machine has: a request it cannot meet fails here, in one
    line, before Ray starts (a cluster is checked once joined, as it may autoscale)."""
    if address or os.environ.get("RAY_ADDRESS"):
        return
    want = sweep.spec.resources
    if num_cpus is not None and want.cpu > num_cpus:
        raise SweepError(f"{sweep.source}: resources.cpu: each trial asks for {want.cpu:g} but "
                         f"--num-cpus is {num_cpus}; no trial could ever start")
    if want.gpu > 0:
        import torch

        if not torch.cuda.is_available():
            raise SweepError(f"{sweep.source}: resources.gpu: each trial asks for {want.gpu:g} GPU but "
                             "this machine has none (set resources.gpu: 0, or --address a cluster with GPUs)")


def _quiet_tune() -> None:
    # Our ProgressPrinter is the console output: Tune's own tables and banners go, and the
    # snapshot warning too (num_to_keep=1 forces a state snapshot per checkpoint, which is
    # what keeps `sweep resume` close to where the driver died).
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
    # A failed trial is one line from ProgressPrinter (and its error tag in MLflow); Tune's
    # traceback of the same failure stays in the trial's error.txt.
    logging.getLogger("ray.tune.execution.tune_controller").setLevel(logging.CRITICAL)
    # A trial that fails for good (a non-finite loss, a bad config) ends itself with a report
    # that holds its reason and no figures (trainable.FAILED): Tune must take a report
    # without the objective.
    os.environ.setdefault("TUNE_DISABLE_STRICT_METRIC_CHECKING", "1")
    # Tune's own loggers: the sweep passes its CSV and JSON ones (each trial folder keeps
    # progress.csv and result.json, which Tune's analysis reads); TensorBoard's goes. MLflow
    # holds every figure, and writing the event files took ~10 ms of the driver's loop per
    # report (a 2-core AVX512-BF16 EPYC), which the reporting trial waits on. Set this to 0 to
    # have them again.
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    # A trial the driver stopped (Ctrl-C, a full disk) leaves its failed task unread by Tune;
    # its error is in the trial's error.txt, not a traceback on the sweep's console.
    os.environ.setdefault("RAY_IGNORE_UNHANDLED_ERRORS", "1")


def _trial_name(trial) -> str:
    return trial.config["key"]


def _trial_dirname(trial) -> str:
    from orchestration.run.trainable import trial_dirname

    return trial_dirname(trial.config["key"], trial.trial_id)


def _trainable(cpu: float, gpu: float, experiment_dir: Path):
    """run_trial with its resources and the sweep's folder, where each trial keeps its own."""
    from ray import tune

    from orchestration.run.trainable import run_trial

    return tune.with_resources(tune.with_parameters(run_trial, experiment_dir=str(experiment_dir)),
                               {"cpu": cpu, "gpu": gpu})


def _search_space_doc(sweep: Sweep, planner: Planner) -> str:
    doc = {
        "sweep": sweep.name, "file": sweep.source, "smoke": sweep.smoke,
        "algorithm": sweep.spec.search.algorithm, "search_seed": sweep.spec.search.seed,
        "objectives": [list(o) for o in sweep.objectives], "num_samples": sweep.spec.num_samples,
        "scheduler": asdict(sweep.spec.scheduler), "seeds": sweep.seeds, "baseline": sweep.baseline,
        "seeds_design": _seeds_design(sweep),
        "dimensions": {d.key: d.describe() for d in sweep.dims},
        "trials": [{"key": t["key"], "role": t["role"], "values": t["values"]} for t in planner.fixed_trials()],
        "optuna_trials": planner.optuna_trials(),
        "tm_relative_score": TM_DOC,
        "notes": sweep.notes,
    }
    return json.dumps(doc, indent=2, default=str)


def _seeds_design(sweep: Sweep) -> dict[str, Any]:
    return sweep.adaptive.describe() if sweep.adaptive is not None else {"fixed": sweep.seeds}


def _parent_tags(sweep: Sweep, planner: Planner, run_dir: Path, total: int) -> dict[str, str]:
    from mtbert.tasks import get_task
    from orchestration.report.table import DELTA_TAG, delta_design_tag
    from orchestration.sweep.claims import configurations, design_looks

    points = {d.key: d.config_keys() for d in sweep.dims if d.type_name == "points"}
    return {"sweep_file": sweep.source, "algorithm": sweep.spec.search.algorithm,
            "scheduler": sweep.spec.scheduler.type, "ray_experiment": str(run_dir),
            # Config keys (a points dimension's: the keys of its points), as the trials log them.
            "space_keys": ",".join(k for d in sweep.dims for k in d.config_keys()),
            "smoke": str(sweep.smoke).lower(),
            # The leaderboard labels by these too: a baseline that differs outside the space
            # (round robin vs the space's annealed sampling) must not read like a space point.
            "baseline_keys": ",".join(sweep.baseline),
            "num_trials": str(total), "driver_host": socket.gethostname(),
            "tasks": ",".join(sweep.base["tasks"]), "tm_score": sweep.spec.tracking.tm_score,
            # `mtbert findings` finds the latest sweep with claims by this tag (claims.json: them).
            "claims": str(len(sweep.claims)),
            "seeds": (f"adaptive {sweep.adaptive.start}..{sweep.adaptive.max}" if sweep.adaptive is not None
                      else ",".join(map(str, sweep.seeds))),
            # The leaderboard's Δ column takes the intervals the claims' verdicts take.
            DELTA_TAG: delta_design_tag(sweep.claims, configurations(planner.fixed_trials()),
                                        design_looks(sweep.adaptive), sweep.spec.verdicts.interval),
            # The leaderboard's task columns, so it needs no plugin to read a sweep that had one.
            "task_metrics": ",".join(get_task(t).metric_name for t in sweep.base["tasks"]),
            # A points dimension's name -> its keys: the importance reads them as one factor.
            **({POINTS_TAG: json.dumps(points)} if points else {})}


# --------------------------------------------------------------------------- run / resume

def run_sweep(path: str | Path, overrides: list[str] | None = None, smoke: bool = False,
              name: str | None = None, address: str | None = None, tracking_uri: str | None = None,
              num_cpus: int | None = None, storage: str | Path | None = None,
              log: Callable[[str], None] = print, progress: bool = True) -> SweepOutcome:
    t_start = time.perf_counter()
    check_num_cpus(num_cpus)
    sweep = load_sweep(path, overrides, smoke)
    _check_local_resources(sweep, address, num_cpus)
    if address or os.environ.get("RAY_ADDRESS"):  # before the store is opened (or made)
        check_ray_address(address or os.environ["RAY_ADDRESS"])
    uri = resolve_tracking_uri(tracking_uri, sweep.spec.tracking.uri)
    check_tracking(uri)
    from orchestration.run.searcher import make_searcher

    planner = Planner(sweep)
    # Expands and validates every grid/random point; under adaptive seeds, says each round.
    searcher = make_searcher(planner, announce=progress)
    total = searcher.total_trials
    run_name = name or f"{sweep.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    storage_dir = Path(storage).resolve() if storage else runs_dir()
    run_dir = storage_dir / run_name
    if (run_dir / "tuner.pkl").exists():
        raise SweepError(f"{run_dir} already holds a sweep; continue it with "
                         f"`{tool('mtbert')} sweep resume {run_name}` or pick another --name")
    for note in sweep.notes:
        log(note)
    claims_doc = to_doc(sweep.claims, _seeds_design(sweep))
    files = {"sweep.yaml": sweep.text, "search_space.json": _search_space_doc(sweep, planner),
             "base_config.yaml": yaml.safe_dump(sweep.base, sort_keys=False),
             **({CLAIMS_FILE: claims_doc} if sweep.claims else {})}
    commit = git_commit()
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / RECORD_FILE).unlink(missing_ok=True)  # left by a run of this name that died before Tune saved
    # The parent run before the shared setup: the UI shows the sweep RUNNING from its first
    # second (the setup may take many minutes), and the run's duration covers the whole sweep.
    tracking = SweepTracking.start(uri, sweep.experiment, run_name, sweep.name,
                                   _parent_tags(sweep, planner, run_dir, total), commit, state_dir=run_dir,
                                   outage_s=sweep.spec.tracking.outage_s, view=_runs_view(sweep), log=log)
    setup = _setup_under_parent(tracking, planner, files, storage_dir, address, num_cpus, log, describe=True)
    state = _sweep_state(sweep, tracking, total, commit, claims_doc)
    (run_dir / SWEEP_STATE).write_text(json.dumps(state, indent=2))
    apart = f" (--smoke: apart from '{sweep.experiment.removesuffix(SMOKE_SUFFIX)}')" if sweep.smoke else ""
    log(f"sweep {run_name}: {_trials_line(sweep, planner, total)}, {sweep.spec.search.algorithm} search, "
        f"{sweep.spec.scheduler.type} scheduler | MLflow {uri} experiment '{sweep.experiment}'{apart} "
        f"parent run {tracking.parent_run_id} | Ray storage {run_dir}")
    return _tune(sweep, searcher, total, run_dir, tracking, state, setup, t_start, log, progress)


def _setup_under_parent(tracking: SweepTracking, planner: Planner, files: dict[str, str], storage_dir: Path,
                        address: str | None, num_cpus: int | None, log: Callable[[str], None],
                        describe: bool) -> dict[str, float]:
    """Everything between the parent run's (re)opening and the first trial, under that run
    (_setup_ends_parent): the parent's `files` logged, the shared setup (_prepare_data), Ray's
    start and its checks. Their seconds go on the parent (SETUP_TIME: all of them), paid by no
    trial. `describe`: the sweep's data as the parent's dataset inputs (a new parent's)."""
    sweep = planner.sweep
    with _setup_ends_parent(tracking):
        if files:
            tracking.log_parent_artifacts(files)
        t_setup = time.perf_counter()
        setup = _prepare_data(planner, log, frozen=not (address or os.environ.get("RAY_ADDRESS")))
        if describe:  # [describe] dataset inputs + data report (synced): read from what the setup prepared
            tracking.describe_parent(sweep.base)
        local = _init_ray(address, num_cpus, list(sweep.base.get("plugins") or []))
        _check_resources(sweep, local, log)
        if not local:  # every node must see the data, a local model and one shared Tune storage
            from orchestration.run.remote import check_paths_on_nodes, check_shared_storage, input_paths

            check_paths_on_nodes(input_paths([t["config"] for t in planner.fixed_trials()]))
            check_shared_storage(storage_dir)
        setup[SETUP_TIME] = time.perf_counter() - t_setup  # tokenizing, the frozen cache, Ray's start
        tracking.log_parent(setup, {})  # the shared setup's seconds, paid by no trial
    return setup


def _sweep_state(sweep: Sweep, tracking: SweepTracking, total: int, commit: str | None,
                 claims_doc: str) -> dict[str, Any]:
    """SWEEP_STATE of a new sweep: how `sweep resume` finds its MLflow runs and goes on."""
    return {
        "tracking_uri": tracking.uri, "experiment": sweep.experiment, "experiment_id": tracking.experiment_id,
        "parent_run_id": tracking.parent_run_id, "sweep": sweep.name, "sweep_file": sweep.source,
        "git_commit": commit, "total_trials": total, "metric": sweep.objectives[0][0],
        "mode": sweep.objectives[0][1], "resources": asdict(sweep.spec.resources),
        "plugins": list(sweep.base.get("plugins") or []),
        "log_models": sweep.spec.tracking.log_models, "register_model": sweep.spec.tracking.register_model,
        "outage_s": sweep.spec.tracking.outage_s, "adaptive": sweep.adaptive is not None,
        "claims": json.loads(claims_doc), "sweep_text_sha256": hashlib.sha256(sweep.text.encode()).hexdigest(),
    }


def _trials_line(sweep: Sweep, planner: Planner, total: int) -> str:
    """What the sweep will run, for its opening line."""
    if sweep.adaptive is not None:
        return (f"{len(planner.fixed_trials())} trials in the first round, up to {total} (seeds "
                f"{sweep.adaptive.start}..{sweep.adaptive.max} where one of {len(sweep.claims)} claims is open)")
    return (f"{total} trials ({len(sweep.seeds)} baseline"
            f"{f', {len(sweep.seeds)} frozen reference' if sweep.reference is not None else ''}"
            f"{f', {len(sweep.seeds) * len(sweep.single_task)} single-task' if sweep.single_task else ''})")


def _tune(sweep: Sweep, searcher, total: int, run_dir: Path, tracking: SweepTracking, state: dict[str, Any],
          setup: dict[str, float], t_start: float, log: Callable[[str], None], progress: bool) -> SweepOutcome:
    """A new Tune run of the searcher's trials in `run_dir`, to its end (_fit); `state`: the
    sweep's SWEEP_STATE, whose models and claims its close takes."""
    tuner = _tuner(sweep, searcher, total, run_dir.name, run_dir.parent, tracking, progress)
    models = (state.get("log_models", "best"), state.get("register_model"))
    return _fit(tuner, tracking, run_dir.name, run_dir, state["experiment"], total, t_start, log, models,
                claims=sweep.claims, adaptive=sweep.adaptive is not None, smoke=sweep.smoke, setup=setup)


def _tuner(sweep: Sweep, searcher, total: int, run_name: str, storage_dir: Path, tracking: SweepTracking,
           progress: bool):
    """A new Tune run of `searcher`'s trials (at most `total`) in storage_dir/run_name."""
    from orchestration.run.scheduler import make_scheduler, tune_metric

    _quiet_tune()
    from ray import tune

    metric, mode = tune_metric(sweep)
    from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback

    from orchestration.run.callbacks import TrackingCallback
    from orchestration.run.progress import ProgressPrinter

    adaptive = sweep.adaptive is not None
    printer = ProgressPrinter(total, sweep.objectives[0][0], sweep.objectives[0][1], tracking=tracking, upto=adaptive,
                              max_concurrent=sweep.spec.max_concurrent, round_pending=searcher.round_pending)
    return tune.Tuner(
        _trainable(sweep.spec.resources.cpu, sweep.spec.resources.gpu, storage_dir / run_name),
        tune_config=tune.TuneConfig(
            search_alg=searcher, scheduler=make_scheduler(sweep), num_samples=total,
            metric=metric, mode=mode, max_concurrent_trials=sweep.spec.max_concurrent,
            reuse_actors=True, trial_name_creator=_trial_name, trial_dirname_creator=_trial_dirname),
        run_config=tune.RunConfig(
            name=run_name, storage_path=str(storage_dir), verbose=0,
            failure_config=tune.FailureConfig(max_failures=sweep.spec.max_failures),
            checkpoint_config=tune.CheckpointConfig(num_to_keep=1),
            callbacks=[TrackingCallback(tracking), CSVLoggerCallback(), JsonLoggerCallback(),
                       *([printer] if progress else [])]),
    )


def _find_run_dir(path_or_name: str, storage: str | Path | None = None) -> Path:
    """The sweep folder: a path, or a name under --storage (as `run` had it), else under runs/:
    the run's whole name, or the start of one (the sweep's name: `unfreeze-share` finds
    `unfreeze-share-20261127-101500`) when only one run has it."""
    candidate = Path(path_or_name)
    if not (candidate / SWEEP_STATE).is_file():
        root = Path(storage).expanduser().resolve() if storage else runs_dir()
        candidate = root / path_or_name
        if not (candidate / SWEEP_STATE).is_file() and "/" not in path_or_name and root.is_dir():
            matches = sorted(p for p in root.glob(f"{path_or_name}*") if (p / SWEEP_STATE).is_file())
            if len(matches) > 1:
                raise SweepError(f"{path_or_name}: {len(matches)} sweeps start with this name under {root}: "
                                 f"{', '.join(p.name for p in matches)}; give one of them")
            candidate = matches[0] if matches else candidate
    if not (candidate / SWEEP_STATE).is_file():
        where = f"--storage {storage}" if storage else "runs/"
        raise SweepError(f"{path_or_name}: not a sweep folder (no {SWEEP_STATE}), nor the start of a sweep's "
                         f"name under {where}; give the folder or its name")
    if not (candidate / "tuner.pkl").is_file():
        raise SweepError(f"{candidate}: the sweep died before Ray Tune saved its state; run it again")
    return candidate.resolve()


def _read_state(path: Path) -> dict:
    """The sweep's record of how to find its MLflow runs, or one line naming the file."""
    try:
        state = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SweepError(f"{path}: unreadable ({exc}); the sweep cannot be resumed from it (a copy "
                         "from a backup, or a new `sweep run`)") from None
    missing = [k for k in ("tracking_uri", "experiment_id", "parent_run_id", "sweep", "resources")
               if not isinstance(state, dict) or k not in state]
    if missing:
        raise SweepError(f"{path}: not a whole sweep record (no {', '.join(missing)}); the sweep cannot be resumed")
    return state


def _say_if_edited(state: dict, log: Callable[[str], None]) -> None:
    """A resume continues the plan its sweep started with; the file edited since is not read."""
    source, digest = state.get("sweep_file"), state.get("sweep_text_sha256")
    try:
        text = Path(source).read_text() if source and digest else None
    except (OSError, UnicodeDecodeError):
        return
    if text is not None and hashlib.sha256(text.encode()).hexdigest() != digest:
        log(f"{source} changed since this sweep started; resume continues the plan it started with "
            "(the edits take effect in a new `sweep run`)")


def resume_sweep(path_or_name: str, address: str | None = None, num_cpus: int | None = None,
                 log: Callable[[str], None] = print, storage: str | Path | None = None) -> SweepOutcome:
    """Continue a sweep whose driver died: its record is replayed and every run that lags
    it synced first, Tune restores its trials (unfinished ones from their last checkpoints)
    and every trial continues its own MLflow run."""
    t_start = time.perf_counter()
    check_num_cpus(num_cpus)
    run_dir = _find_run_dir(path_or_name, storage)
    state = _read_state(run_dir / SWEEP_STATE)
    _say_if_edited(state, log)
    check_tracking(state["tracking_uri"])
    if address or os.environ.get("RAY_ADDRESS"):
        check_ray_address(address or os.environ["RAY_ADDRESS"])
    if not _init_ray(address, num_cpus, state.get("plugins", [])):
        from orchestration.run.remote import check_shared_storage

        check_shared_storage(run_dir.parent)
    tracking = SweepTracking(state["tracking_uri"], state["experiment_id"], state["parent_run_id"],
                             state["sweep"], state.get("git_commit"), state_dir=run_dir,
                             outage_s=float(state.get("outage_s", 180.0)), run_name=run_dir.name)
    lagging = tracking.resync()
    tracking.reopen_parent()
    if lagging:
        log(f"syncing {lagging} MLflow run(s) behind the sweep's record (the store was away, or the driver died)")
    if not tracking.flush():
        raise TrackingUnavailable(_outage_line(tracking, run_dir))
    _quiet_tune()
    from ray import tune

    _flat_names()
    _moved_names()
    resources = state["resources"]
    tuner = tune.Tuner.restore(str(run_dir), trainable=_trainable(resources["cpu"], resources["gpu"], run_dir),
                               resume_unfinished=True, resume_errored=True)
    log(f"resuming sweep {run_dir.name} | MLflow {state['tracking_uri']} parent run {state['parent_run_id']}")
    models = (state.get("log_models", "best"), state.get("register_model"))
    claims = from_doc(json.dumps(state["claims"])) if state.get("claims") else []
    return _fit(tuner, tracking, run_dir.name, run_dir, state["experiment"], state["total_trials"],
                t_start, log, models, claims=claims, adaptive=state.get("adaptive", False),
                smoke=bool(state.get("smoke", False)))


EXTENDED = "-seeds"  # an extension's folder: <sweep folder>-seeds<N>


def extend_sweep(path_or_name: str, seeds_max: int, address: str | None = None, num_cpus: int | None = None,
                 log: Callable[[str], None] = print, storage: str | Path | None = None,
                 progress: bool = True) -> SweepOutcome:
    """More seeds for a finished adaptive sweep (`sweep resume NAME --seeds-max N`): its
    searcher, as Tune saved it (every finished trial's figures, the seeds each configuration
    ran), goes on with max N, adding rounds where a claim is still open; no finished trial runs
    again. Each claim's looks become (start, old max, N): the looks already taken keep their
    bounds and the new ones spend only the error those left (verdicts.extended_bounds), so the
    verdicts keep their stated rate however the decision to add seeds was made. The new trials
    run as a Tune run of their own in <folder>-seeds<N> (resumable like any), logging under the
    sweep's parent run, which then holds the verdicts, leaderboard and summary of all its trials."""
    from orchestration.report.table import DELTA_TAG, delta_design_tag
    from orchestration.sweep.claims import configurations

    t_start = time.perf_counter()
    check_num_cpus(num_cpus)
    run_dir = _find_run_dir(path_or_name, storage)
    state = _read_state(run_dir / SWEEP_STATE)
    searcher, new_dir = _restored_for_more_seeds(run_dir, state, seeds_max)
    rounds, sweep = searcher.rounds, searcher.planner.sweep
    was = (f"its budget stopped it at {max(rounds.seeds.values())} of {rounds.design.max}; the looks it planned go on"
           if rounds.budget_stopped() and seeds_max <= rounds.design.max else f"was {rounds.design.max}")
    searcher.extend(seeds_max)
    planner = searcher.planner
    total = max(planner.total_trials() - rounds.handed, 1)  # the most the new rounds may add
    claims_doc = to_doc(sweep.claims, {**_seeds_design(sweep), "extended_from": rounds.extended})
    looks = sweep.claims[0].looks or (sweep.adaptive.start, seeds_max)
    tags = {"seeds": f"adaptive {'..'.join(map(str, (sweep.adaptive.start, *looks[1:])))}",
            DELTA_TAG: delta_design_tag(sweep.claims, configurations(planner.fixed_trials()),
                                        sweep.claims[0].looks, "median")}
    check_tracking(state["tracking_uri"])
    new_dir.mkdir(parents=True, exist_ok=True)
    (new_dir / RECORD_FILE).unlink(missing_ok=True)
    tracking = SweepTracking(state["tracking_uri"], state["experiment_id"], state["parent_run_id"],
                             state["sweep"], state.get("git_commit"), state_dir=new_dir,
                             outage_s=float(state.get("outage_s", 180.0)), run_name=new_dir.name)
    # The parent RUNNING again before the new seeds' setup, as a new sweep's is (run_sweep).
    tracking.reopen_parent()
    if not tracking.flush():
        raise TrackingUnavailable(_outage_line(tracking, new_dir))
    setup = _setup_under_parent(tracking, planner, {}, new_dir.parent, address, num_cpus, log, describe=False)
    # The extended design on the parent once its setup is done: a failed setup extended nothing.
    tracking.tag_parent(tags)
    tracking.log_parent_artifacts({CLAIMS_FILE: claims_doc})
    state = {**state, "total_trials": total, "claims": json.loads(claims_doc), "extends": run_dir.name}
    (new_dir / SWEEP_STATE).write_text(json.dumps(state, indent=2))
    log(f"sweep {run_dir.name}: seeds up to {seeds_max} ({was}) where a claim is open, in {new_dir.name}; "
        f"the {rounds.handed} finished trials stay as they are | MLflow parent run {state['parent_run_id']}")
    return _tune(sweep, searcher, total, new_dir, tracking, state, setup, t_start, log, progress)


def _restored_for_more_seeds(run_dir: Path, state: dict, seeds_max: int):
    """(the sweep's searcher as Tune saved it, the folder of its extension to `seeds_max`
    seeds), or one line saying why the sweep cannot take more seeds (a list of seeds, not
    ended, not more than it had, a mean's t-interval, an extension already there)."""
    from orchestration.run.searcher import SweepSearcher
    from orchestration.sweep.bounds import MAX_SEEDS

    if not state.get("adaptive"):
        raise SweepError(f"--seeds-max: sweep {run_dir.name} runs a list of seeds; more seeds are for adaptive "
                         "seeds ({start, max}), whose claims say where they go")
    searcher = SweepSearcher.restored(run_dir)
    rounds, sweep = searcher.rounds, searcher.planner.sweep
    if rounds.finished is None:
        raise SweepError(f"--seeds-max: sweep {run_dir.name} has not ended; `{_resume_command(run_dir)}` first")
    ran = max(rounds.seeds.values())
    # A sweep its budget stopped short of its maximum may go on to it (or less), as planned.
    if not (rounds.design.max < seeds_max <= MAX_SEEDS
            or (rounds.budget_stopped() and ran < seeds_max <= rounds.design.max)):
        within = (f" (its budget stopped it at {ran} seeds: from {ran + 1} to {rounds.design.max} it goes on "
                  "as planned)" if rounds.budget_stopped() and ran < rounds.design.max else "")
        raise SweepError(f"--seeds-max {seeds_max}: sweep {run_dir.name} already looked up to {rounds.design.max} "
                         f"seeds; give more than that, at most {MAX_SEEDS}{within}")
    if any(c.interval != "median" for c in sweep.claims):
        raise SweepError(f"--seeds-max: sweep {run_dir.name} judges by the mean's t-interval, whose level is "
                         "calibrated for its own looks; more seeds need `verdicts: {interval: median}`")
    new_dir = run_dir.parent / f"{run_dir.name}{EXTENDED}{seeds_max}"
    if (new_dir / "tuner.pkl").exists():
        raise SweepError(f"{new_dir} already holds this extension; continue it with "
                         f"`{tool('mtbert')} sweep resume {new_dir.name} --storage {new_dir.parent}`")
    return searcher, new_dir


def _flat_names() -> None:
    """The flat module names a sweep folder saved before the rooms pickled its objects under,
    as aliases of the modules now in rooms, so that its Tune state unpickles."""
    import importlib
    import sys

    for room, names in ROOM_MODULES.items():
        for name in names:
            sys.modules.setdefault(f"orchestration.{name}", importlib.import_module(f"orchestration.{room}.{name}"))


def _moved_names() -> None:
    """Each moved object also under its old module, so that a sweep saved before it moved
    unpickles (under a flat name too: _flat_names aliases the same module)."""
    import importlib

    for (old, name), new in MOVED.items():
        module = importlib.import_module(old)
        if not hasattr(module, name):
            setattr(module, name, getattr(importlib.import_module(new), name))


def _fit(tuner, tracking: SweepTracking, run_name: str, run_dir: Path, experiment: str,
         total: int, t_start: float, log: Callable[[str], None],
         models: tuple[str, str | None] = ("best", None), claims: list | None = None,
         adaptive: bool = False, smoke: bool = False, setup: dict[str, float] | None = None) -> SweepOutcome:
    """`total`: the planned trials; under adaptive seeds the most there may be (the searcher
    ends the sweep when no claim is open, so every trial Tune holds must have ended). `setup`:
    the shared setup's seconds (_prepare_data), said on their own in the summary."""
    from orchestration.run.storage import hold_reserve, release_reserve

    status = "FAILED"
    results = None
    judged: list[str] = []
    handlers = {sig: signal.getsignal(sig) for sig in GROUP_SIGNALS}  # as they were before Tune ran
    hold_reserve(run_dir)
    try:
        with _without_ray_resume_hint(tracking):
            results = tuner.fit()
        status = _fit_status(results, tracking, total, adaptive, run_dir, log)
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    except Exception as exc:
        stopped = _stopped_status(exc, tracking, run_dir, log)
        if stopped is None:
            raise
        status = stopped
    finally:
        with _signals_wait_for_close(handlers, log):
            release_reserve(run_dir)
            _close(tracking, results, status, log, run_dir, models, experiment, claims or [], judged, smoke)
    if tracking.record.full is not None:
        free, need = tracking.record.full
        tracking.release()
        raise SweepError(f"storage {run_dir} is full: {free / 2**20:.1f} MB free, a trial's report needs about "
                         f"{need / 2**20:.1f} MB; the sweep stopped and Ray Tune kept it: free space there, then "
                         f"`{_resume_command(run_dir)}`")
    outcome = _outcome(tracking, results, run_name, run_dir, experiment, status, t_start)
    outcome.verdicts = judged
    outcome.setup = dict(setup or {})
    calls = dict(tracking.record.calls_by_ref)
    outcome.mlflow_calls = sum(calls.values())
    (run_dir / CALLS_FILE).write_text(json.dumps(calls, indent=1, sort_keys=True))
    tracking.release()
    _summary(outcome, log)
    return outcome


def _fit_status(results, tracking: SweepTracking, total: int, adaptive: bool, run_dir: Path,
                log: Callable[[str], None]) -> str:
    """How a Tune run that returned ended: FINISHED when every trial ended and nothing stopped
    the sweep, else KILLED (Tune returns normally after a Ctrl-C too, with trials unfinished)."""
    ended = results.num_terminated + results.num_errors
    reason = tracking.record.stop_reason
    complete = ended >= (len(results) if adaptive else total)
    status = "FINISHED" if complete and reason is None else "KILLED"
    if status == "KILLED" and reason not in ("tracking outage", STORAGE_FULL):
        # No count here: the summary line counts the trials once, from the store.
        log(f"interrupted ({reason or 'stopped'}); continue with `{_resume_command(run_dir)}`")
    return status


def _stopped_status(exc: Exception, tracking: SweepTracking, run_dir: Path, log: Callable[[str], None]) -> str | None:
    """KILLED where the error `exc` that Tune raised stopped a sweep that can go on (a full
    disk, a worker that Ray's memory monitor killed); one line for the store's; else None."""
    killed = _memory_monitor_kill(exc)
    if _storage_full(tracking, run_dir):
        return "KILLED"  # Tune's own results are unreadable on the full disk; _fit's line says it
    if killed is not None:
        # Tune 2.60 lets a trial's OutOfMemoryError escape fit() (wrapped in a RuntimeError)
        # when the monitor kills a worker at some moments: the sweep stops as for a Ctrl-C,
        # its running trials KILLED with this reason, and resume continues them.
        tracking.record.stop_reason = killed
        log(f"{killed}; the sweep stopped and Ray Tune kept it: `{_resume_command(run_dir)}` (with fewer "
            "trials at once, max_concurrent, or more memory)")
        return "KILLED"
    if _is_tracking_error(exc):
        raise TrackingUnavailable(
            f"tracking store {tracking.uri} failed mid-sweep ({first_line(exc, 200)}); Ray Tune saved "
            f"the sweep: `{_resume_command(run_dir)}` once the store is back") from None
    return None


@contextmanager
def _signals_wait_for_close(handlers: dict, log: Callable[[str], None]):
    """The close (runs ended, models, tables, verdicts) takes seconds: a SIGTERM or SIGHUP during
    it (a SLURM job's time limit or preemption, a stop sent as the last trial ended) waits for
    it, instead of leaving the parent run RUNNING. Ctrl-C still interrupts it. `handlers`
    (signal -> handler) are set back after."""
    late: list[int] = []
    try:
        for sig in handlers:
            signal.signal(sig, lambda signum, frame: late.append(signum))
    except ValueError:  # not the main thread: no handlers to set
        pass
    try:
        yield
    finally:
        try:
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
        except ValueError:
            pass
        if late:
            log(f"{signal.Signals(late[0]).name} while the sweep closed: it closed first")


def _storage_full(tracking: SweepTracking, run_dir: Path) -> bool:
    """Whether the sweep stopped, or its folder is now, too full to take a trial's report."""
    from orchestration.run.storage import release_reserve, storage_shortfall

    record = tracking.record
    if record.full is None and record.stop_reason in (None, STORAGE_FULL):
        record.full = storage_shortfall(run_dir)
        release_reserve(run_dir)
        if record.full is not None:
            record.stop_reason = STORAGE_FULL
    return record.full is not None


@contextmanager
def _without_ray_resume_hint(tracking: SweepTracking):
    """An interrupted sweep is continued with `mtbert sweep resume`, which the driver prints;
    Tune's own `Tuner.restore(...)` hint (a warning of its `ray.tune.tune` logger) would send
    the user to an API that knows nothing of the sweep's MLflow runs. Tune failing to save
    the sweep's state (its traceback, on a full disk) is the driver's to say, in one line:
    it counts as a failed write to the sweep folder (callbacks.TrackingCallback stops the sweep)."""
    hint = logging.getLogger("ray.tune.tune")
    # And Tune's "Stop signal received (e.g. via SIGINT/Ctrl+C)", which names the wrong
    # signal on a SIGTERM: the driver's "interrupted (SIGTERM)" line says it once stopped.
    # Its "Trials did not complete: [...]" (and its analysis' "Failed to fetch metrics" of
    # those) repeats what the FAILED lines and the summary already say.
    drop = _DropMessage(("Resume experiment with", "Stop signal received", "Trials did not complete"))
    analysis = logging.getLogger("ray.tune.analysis.experiment_analysis")
    unfetched = _DropMessage("Failed to fetch metrics")
    state = logging.getLogger("ray.tune.execution.experiment_state")
    failed_save = _DropMessage("Saving experiment state", lambda: setattr(
        tracking.record, "journal_error", OSError("Ray Tune could not save the sweep's state")))
    hint.addFilter(drop)
    state.addFilter(failed_save)
    analysis.addFilter(unfetched)
    try:
        yield
    finally:
        hint.removeFilter(drop)
        state.removeFilter(failed_save)
        analysis.removeFilter(unfetched)


class _DropMessage(logging.Filter):
    def __init__(self, texts: str | tuple[str, ...], seen: Callable[[], None] | None = None):
        super().__init__()
        self.texts = (texts,) if isinstance(texts, str) else texts
        self.seen = seen

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if not any(text in message for text in self.texts):
            return True
        if self.seen is not None:
            self.seen()
        return False


def _resume_command(run_dir: Path) -> str:
    return f"{tool('mtbert')} sweep resume {run_dir.name} --storage {run_dir.parent}"


def _outage_line(tracking: SweepTracking, run_dir: Path) -> str:
    syncer = tracking.record.syncer
    minutes, seconds = divmod(int(syncer.outage()), 60)
    return (f"tracking server {tracking.uri} unreachable for {minutes}m{seconds:02d}s ({syncer.last_error or 'no answer'}); "
            f"the sweep stopped and keeps {len(tracking.record.unsynced())} unsent MLflow write(s) in "
            f"{run_dir / RECORD_FILE}: "
            f"`{_resume_command(run_dir)}` once it is back")


def _memory_monitor_kill(exc: BaseException) -> str | None:
    """The one line for a trial's worker that Ray's memory monitor killed, where that is what
    `exc` (or an exception it was raised from) is; else None."""
    from ray.exceptions import OutOfMemoryError

    from orchestration.run.stops import MEMORY_MONITOR, memory_monitor_line

    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OutOfMemoryError):
            return memory_monitor_line(str(exc)) or MEMORY_MONITOR
        exc = exc.__cause__ or exc.__context__
    return None


def _is_tracking_error(exc: BaseException) -> bool:
    import requests
    from mlflow.exceptions import MlflowException

    return isinstance(exc, (MlflowException, requests.RequestException))


def _close(tracking: SweepTracking, results, status: str, log: Callable[[str], None], run_dir: Path,
           models: tuple[str, str | None] = ("best", None), experiment: str = "", claims: list | None = None,
           judged: list[str] | None = None, smoke: bool = False) -> None:
    """Whatever ended the sweep: every trial still running in the record closed, every run
    synced to its record (the TM-relative scores final: against the mean baseline where a
    seed's own failed), the cross-trial figures on the parent (leaderboard, Pareto plot,
    verdicts), the sweep's summary, the parent closed. With the store away past the limit,
    the record keeps it all and the sweep stops with one line.
    Each step is attempted on its own, so one failing neither skips the others nor hides
    the error that ended the sweep."""
    from orchestration.report.importance import log_importance
    from orchestration.report.leaderboard import log_leaderboard
    from orchestration.track.models import log_models

    record = tracking.record
    closed = tracking.close_open(record.stop_reason or "sweep ended")
    if closed and record.stop_reason is None:
        log(f"closed {closed} unfinished trial run(s) as KILLED")
    # The last trials' own syncs first, counted as theirs (mlflow_calls.json); bounded, since
    # the store may be away (the flush below rides that out). Then the sweep's closing pass.
    tracking.flush(timeout=10.0)
    record.closing = True
    tracking.resync()
    if not tracking.flush():
        tracking.end_parent("KILLED")
        tracking.flush(timeout=2.0)  # the store may just have come back
        line = _outage_line(tracking, run_dir)
        tracking.release()
        raise TrackingUnavailable(line)
    runs: list = []

    def read() -> None:
        runs[:] = tracking.children()

    def judge() -> None:
        if claims and status == "FINISHED" and judged is not None:
            judged.extend(_judge(tracking, experiment, claims, smoke))

    steps = [("read the sweep's runs", read),
             ("the claims' verdicts", judge),  # once synced: a claim may be on a TM-relative score
             # Before the leaderboard, whose markdown carries it; a finished sweep only (seconds of
             # fitting that an interrupted one, resumed, would redo).
             ("importance of the swept dimensions", lambda: status == "FINISHED" and log_importance(tracking, log)),
             ("leaderboard and Pareto plot", lambda: log_leaderboard(tracking)),
             # [models] the best trial's bundle as an MLflow model (models.log_models):
             # an upload through MLflow's own client; a failure costs the model only.
             ("log models", lambda: status == "FINISHED" and log_models(tracking, results, *models, log=log, runs=runs)),
             ("the sweep's summary on its parent run", lambda: _log_summary(tracking, runs)),
             ("close the parent run",
              lambda: (tracking.end_parent(parent_status(status, runs)), tracking.flush()))]
    for what, step in steps:
        try:
            step()
        except Exception as exc:  # noqa: BLE001 - see the docstring
            log(f"warning: {what} failed: {first_line(exc, 200)}")


def diverged_runs(runs: list) -> list:
    """The runs that failed to train: their loss went non-finite (FAILED, tagged `diverged`).
    A seed that diverges is what its configuration does, a result the leaderboard and the
    verdicts count, not a fault of the sweep."""
    return [r for r in runs if r.info.status == "FAILED" and r.data.tags.get("diverged")]


def failed_runs(runs: list) -> list:
    """The runs that failed for any other reason (an error, a crash): the sweep's faults."""
    return [r for r in runs if r.info.status == "FAILED" and not r.data.tags.get("diverged")]


def parent_status(status: str, runs: list) -> str:
    """The parent run's end state: a sweep that ran to its end with a failed trial says so
    (FAILED), as its exit status does (a diverged one does not: diverged_runs); an
    interrupted one stays KILLED."""
    if status == "FINISHED" and failed_runs(runs):
        return "FAILED"
    return status


SMOKE_NOT_JUDGED = "smoke: not judged"


def _judge(tracking: SweepTracking, experiment: str, claims: list, smoke: bool = False) -> list[str]:
    """The sweep's claims decided on its own runs, as `mtbert findings` decides them: the table
    (findings.md, verdicts.json, and rendered as the parent run's description), a tag counting
    the verdicts and each claim's verdict and interval (findings.claim_marks) on the parent run,
    each configuration's part in the claims on its run; a line per claim for the console. A --smoke run trains a tiny encoder on synthetic data for
    seconds: its claims are checked for shape (each side selects configurations that ran, the
    metric is logged) and never judged, so that no verdict of a smoke run is ever cited."""
    from orchestration.report.findings import claim_marks, claim_sides, judge_claims, read_runs, render, summary_table
    from orchestration.report.verdicts import NOT_RUN

    tracking.flush()  # the trials' last figures are in the store
    runs = read_runs(tracking.uri, [experiment], parent_run_id=tracking.parent_run_id)
    table = judge_claims(runs, claims)
    if smoke:
        tracking.tag_parent({"verdicts": SMOKE_NOT_JUDGED})
        return [f"claim {r['claim']}: {SMOKE_NOT_JUDGED} "
                + ("(not run: no seed that both A and B ran)" if r["verdict"] == NOT_RUN
                   else f"(A and B ran on {int(r['n'])} paired seed(s))") for _, r in table.iterrows()]
    text = render(table)
    tracking.log_parent_artifacts({"findings.md": text,
                                   "verdicts.json": table.to_json(orient="records", indent=2, force_ascii=False)})
    counts = table["verdict"].value_counts()
    # Where people look: the table rendered as the parent run's description, each claim's
    # verdict and interval searchable on the parent, each configuration's part on its run.
    metrics, tags = claim_marks(table)
    tracking.log_parent(metrics, {"verdicts": ", ".join(f"{n} {v}" for v, n in counts.items()),
                                  NOTE_TAG: _note(summary_table(table)), **tags})
    for variant, sides in claim_sides(runs, claims, table).items():
        tracking.tag_configuration(variant, sides)
    lines = []
    for _, r in table.iterrows():
        if r["n"] >= 2 and not math.isnan(r["low"]):
            interval = f"A − B {r['delta']:+.4f} [{r['low']:+.4f}, {r['high']:+.4f}]"
        else:
            interval = "A − B " + (f"{r['delta']:+.4f} (no interval)" if r["n"] else "–")
        diverged = [f"{side} {int(r[f'{side.lower()}_diverged'])} of {int(r[f'{side.lower()}_n'])} diverged"
                    for side in ("A", "B") if r.get(f"{side.lower()}_diverged", 0)]
        lines.append(f"claim {r['claim']}: {r['verdict']}, {interval}, n={int(r['n'])}"
                     + (f" (sequential {r['looks']})" if r.get("looks") else "")
                     + (f"; {', '.join(diverged)}" if diverged else ""))
    return lines + _more_seeds(table, Path(tracking.state_dir) if tracking.state_dir else None)


def _more_seeds(table, run_dir: Path | None) -> list[str]:
    """The command that gives an adaptive sweep's open claims the seeds they need (findings'
    seeds_needed), when the sweep ended with one inconclusive for want of them."""
    import pandas as pd

    open_ = table[(table["verdict"] == "inconclusive") & table["looks"].fillna("").astype(bool)] \
        if "looks" in table else table.iloc[0:0]
    # Up to the sweep's last look where its sides ran fewer seeds (its budget stopped it short:
    # resume goes on as planned), past it otherwise (resume takes only a larger maximum). The
    # seeds run count diverged ones, which `n`, the pairs, leaves out.
    needed = [int(n) if max(ran_a, ran_b) < (last := int(str(looks).split("..")[-1])) else max(int(n), last + 1)
              for n, have, ran_a, ran_b, looks in zip(open_["seeds_needed"], open_["n"], open_["a_n"],
                                                      open_["b_n"], open_["looks"])
              if not pd.isna(n) and n > have]
    if not needed or run_dir is None:
        return []
    return [f"more seeds for the open claim(s): {_resume_command(run_dir)} --seeds-max {max(needed)} "
            f"(about {max(needed)} paired seeds would decide them; no finished trial runs again)"]


NOTE_TAG = "mlflow.note.content"  # a run's description, which the MLflow UI renders as markdown
NOTE_MAX = 8000  # MLflow's longest tag value


def _note(findings_md: str) -> str:
    """The parent run's description: the findings in brief (findings.summary_table), cut short
    (pointing at findings.md) where it passes MLflow's longest tag value."""
    text = "### Verdicts\n\n" + findings_md
    if len(text) <= NOTE_MAX:
        return text
    cut = "\n\n… the whole table and its caption: artifact findings.md\n"
    return text[:NOTE_MAX - len(cut)].rsplit("\n", 1)[0] + cut


def sweep_summary(runs: list) -> tuple[dict[str, float], dict[str, str]]:
    """(metrics, tags) of the sweep for its parent run: its best configuration
    (models.best_configuration) by its mean overall, the half-width of that mean's 95%
    interval (two seeds or more) and its seeds; and how its trials ended."""
    from orchestration.report.best import best_summary

    finished = [r for r in runs if r.info.status == "FINISHED"]
    failed, diverged = len(failed_runs(runs)), len(diverged_runs(runs))
    metrics = {"trials": float(len(runs)), "trials_finished": float(len(finished)),
               "trials_stopped_early": float(sum(r.data.tags.get("stopped_early") == "true" for r in finished)),
               "trials_failed": float(failed), "trials_diverged": float(diverged),
               "trials_interrupted": float(len(runs) - len(finished) - failed - diverged)}
    tags = {}
    best = best_summary(runs)
    if best:
        metrics.update(best_config_overall=best["overall"], best_config_n=float(best["n"]))
        if best["n"] > 1:
            metrics["best_config_overall_ci95"] = best["half"]
        tags.update(best_config=best["variant"], best_config_ranked_by=best["ranked_by"])
    return metrics, tags


def _log_summary(tracking: SweepTracking, runs: list) -> None:
    """sweep_summary on the parent run, as the runs stand once every trial is closed."""
    tracking.log_parent(*sweep_summary(runs))


def _runs_view(sweep) -> dict:
    """The columns of the MLflow view the sweep's link opens: its objective first, then each
    task's score and the swept keys' params as they are logged, each loss weight of a swept
    loss.weights its own (view.save_runs_view)."""
    from mtbert.tasks import get_task

    metric, mode = sweep.objectives[0]
    # Tune's best_overall (the best epoch so far) is the run's final `overall` in MLflow.
    metric = metric.removeprefix("best_")
    tasks = []
    for t in sweep.base.get("tasks") or []:
        try:
            tasks.append(get_task(t).metric_name)
        except (KeyError, ValueError):  # a plug-in task the driver has not imported
            pass
    from orchestration.track.view import swept_params

    # values_of: every value a dimension may give a key, or its ends (a simplex: its corners).
    keys = [k for d in sweep.dims for k in d.config_keys()]
    swept = list(dict.fromkeys(name for k in keys for name in swept_params(k, values_of(sweep.dims, k))))
    return {"objective": metric, "task_metrics": tasks, "swept": swept, "ascending": mode == "min"}


def _outcome(tracking: SweepTracking, results, run_name: str, run_dir: Path, experiment: str,
             status: str, t_start: float) -> SweepOutcome:
    from orchestration.report.best import best_summary

    # Timed before the closing read of the runs below.
    timing = {"wall_s": time.perf_counter() - t_start, "logging_s": tracking.logging_s,
              "reads_s": tracking.sync_s, "writer_cpu_s": tracking.record.syncer.busy_cpu_s}
    runs = tracking.children()
    finished = [r for r in runs if r.info.status == "FINISHED"]
    return SweepOutcome(
        run_name, str(run_dir), tracking.uri, experiment, tracking.parent_run_id, status,
        trials=len(runs), finished=len(finished), failed=len(failed_runs(runs)), diverged=len(diverged_runs(runs)),
        stopped_early=sum(r.data.tags.get("stopped_early") == "true" for r in finished),
        trial_time_s=0.0 if results is None else sum(float((r.metrics or {}).get("time_total_s", 0.0))
                                                     for r in results),
        train_time_s=sum(r.data.metrics.get("train_time_s", 0.0) for r in runs),
        best=best_summary(runs), experiment_id=tracking.experiment_id, **timing)


def _summary(o: SweepOutcome, log: Callable[[str], None]) -> None:
    best = ""
    if o.best:
        # The counted-compute score where the runs have it: a loaded machine cannot move it.
        tm = next(iter(o.best.get("tm", {}).items()), None)
        tm = f", TM-relative {tm[1]:.3f}" + (" (compute)" if tm[0].endswith("_compute") else "") if tm else ""
        if o.best["n"] > 1:  # judged by its mean over seeds; the model is its best seed
            best = (f"; best configuration {o.best['variant']}: overall {o.best['overall']:.4f} "
                    f"± {o.best['half']:.4f} over {o.best['n']} seeds{tm} (model: its best seed "
                    f"{o.best['trial_key']}, {o.best['seed_overall']:.4f})")
            if len(o.best.get("ranked_on", range(o.best["n"]))) != o.best["n"]:  # fewer seeds, or none shared
                best += f", ranked by {o.best['ranked_by']}: {o.best['ranked_overall']:.4f}"
        else:
            best = f"; best overall {o.best['overall']:.4f} ({o.best['trial_key']}{tm})"
    minutes, seconds = divmod(int(o.wall_s), 60)
    log(f"sweep {o.name} {o.status} in {minutes}m{seconds:02d}s: {o.trials} trials, {o.finished} finished "
        f"({o.stopped_early} stopped early), " + (f"{o.diverged} diverged, " if o.diverged else "")
        + f"{o.failed} failed{best}")
    if o.setup:  # the parent run's setup_*_s: before the first trial, in no trial's time nor budget.hours
        parts = ", ".join(f"{k.removeprefix('setup_').removesuffix('_s').replace('_', ' ')} {v:.1f}s"
                          for k, v in o.setup.items() if k != SETUP_TIME)
        whole = o.setup.get(SETUP_TIME, sum(o.setup.values()))
        log(f"shared setup {whole:.1f}s before the first trial ({parts}): "
            "no trial's time, nor seeds.budget.hours'")
    for line in o.verdicts:
        log(line)
    # Quoted: a store under a folder with spaces must paste back as one argument.
    log(f"table: {tool('mtbert')} leaderboard --experiment {shlex.quote(o.experiment)} "
        f"--tracking-uri {shlex.quote(o.tracking_uri)}")
    from orchestration.track.view import ui_link

    if o.tracking_uri.startswith("sqlite:"):
        log(f"browse: {tool('mlflow')} ui --backend-store-uri {shlex.quote(o.tracking_uri)}   (then open "
            f"{ui_link('http://127.0.0.1:5000', o.experiment_id)})")
    else:
        log(f"browse: open {ui_link(o.tracking_uri, o.experiment_id)} in a browser")


__all__ = ["run_sweep", "resume_sweep", "extend_sweep", "SweepOutcome", "SWEEP_STATE"]
