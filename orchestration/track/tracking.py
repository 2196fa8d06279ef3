"""MLflow: one parent run per sweep, one child run per configuration and one per trial (a
seed), as a projection of the driver's record.

Why the driver and not the trial process: Tune ends a trial that ASHA stops by raising
SystemExit inside its report call and then tearing the worker down, and a crashed worker
runs no `finally` at all, so a trial cannot be trusted to close its own run. The driver sees
every report and every end (callbacks.py), is the only writer (sqlite stays unlocked), and
closes what it opened. Ray's own MLflow callback has no parent runs (ray#19978).

State, then projection. The driver keeps a record per trial (its config, every reported
epoch, its status and why) and of the sweep's parent run, appended to RECORD_FILE in the
sweep folder before anything is sent. One idempotent sync makes a run equal to its record:
the run found (by trial_key) or created, params once, the epochs after its cursor in one
batch, the summary, tags and TM-relative scores that differ from what was sent, the status.
It runs in one background thread after each change, at the end and on resume, so an outage
only delays it (trials keep training) and a killed driver's resume replays the record and
syncs what lags. Past `outage_s` of failed syncs the sweep stops (callbacks.py).

Names on a child run:
  params   the trial's full flattened config (optim.lr, sharing.head_regime, ...)
  metrics  epoch/<name> at step=epoch for every per-epoch figure of train();
           step/loss_<task> at step = the run's global step (train.log_every_steps),
           sent with their epoch;
           the final figures under the DESIGN names (sst_acc, ..., overall, best_epoch,
           train_time_s, model_size_mb, ..., tm_relative_score, tm_time_s, epochs_run)
  tags     mlflow.parentRunId, sweep_run (the parent's name), trial_key (stable across
           resumes), trial_id, variant, role, seed, node, node_ip, device, precision (what the
           trial trained on and in), git_commit, stopped_early,
           interrupted, tm_time_basis, tm_baseline, error, diverged (why, when it failed to
           train: a finished run, or a failed one whose loss went non-finite; diverged_reason)
  artifacts config.yaml (re-run it with `mtbert train --config`), result.json (final
           figures, per-epoch history, config), train.log

A configuration's run (tag role=configuration, a child of the parent beside its seeds' runs,
named by its variant) is what the saved view opens on (view.py): a projection of its seeds'
records, synced when one of them ends (never per epoch), so it holds
  params   its seeds' flattened config but the seed (train.seed)
  metrics  for every final figure of its finished, not diverged seeds: their mean under the
           figure's own name (overall, sst_acc, ...) and, from two seeds, the ends of its 95%
           t-interval (overall_ci_low, overall_ci_high); seeds (those), seeds_diverged (the
           seeds tagged diverged, failed ones included: "2 of 9 seeds diverged" is 2 of 7 + 2)
  tags     variant, configuration_role (its seeds' role), seed_runs, diverged_seeds, and after
           the verdicts its part in each claim (claim/<name>: "A, holds")
Whatever reads a sweep's trials reads its seed runs: SEED_RUNS in a search.

A re-run epoch (a trial restored from its checkpoint) replaces its figures in the record.
MLflow keeps one point per step where it can: a replay (the same scores, as a resume with
the RNG states restored trains them) is not sent again, so a chart shows no second point;
a re-run that trained differently is logged again at its step, and the latest value per
step wins when the history is read back.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from mtbert.errors import first_line
from orchestration.errors import TrackingUnavailable
from orchestration.paths import sqlite_path
from orchestration.sweep.labels import SINGLE_TASK, STANDS_FOR
from orchestration.track.describe import describe_run, source_tags
from orchestration.track.system import SYSTEM_PREFIX
from orchestration.track.tm import mean_reference, single_task_scores, time_basis, trial_delta_m, trial_tm
from orchestration.track.view import (CONFIGURATION, CONFIGURATION_FILTER, SEEDS_FILTER, SWEEP_RUN_TAG,
                                      mark_experiment, save_runs_view)

EPOCH_PREFIX = "epoch/"
STEP_PREFIX = "step/"  # train.log_every_steps: step/loss_<task> at the run's global step
PARENT_TAG = "mlflow.parentRunId"
CONFIG_PREFIX = "configuration/"  # a configuration's key in the record: configuration/<variant>
SEED_RUNS = SEEDS_FILTER  # a search filter: a sweep's trial runs, not its configurations'
SEED_PARAM = "train.seed"  # the one config key a configuration's seeds differ in
# Keys Tune adds to every report; they are bookkeeping, not training figures.
TUNE_KEYS = {"training_iteration", "time_total_s", "episodes_total", "timesteps_total", "node_ip",
             "hostname", "pid", "time_this_iter_s", "timestamp", "date", "time_since_restore",
             "timesteps_since_restore", "iterations_since_restore", "config", "checkpoint_dir_name",
             "done", "trial_id", "should_checkpoint", "__duplicate__", "experiment_tag", "epoch"}
SECONDS = 1000  # MLflow timestamps are in milliseconds
STORAGE_FULL = "storage full"  # the stop reason, and the interrupted tag of the trials it stopped
RECORD_FILE = "tracking.jsonl"  # in the sweep folder: the driver's record, append-only
PARENT = "parent"  # the sweep's parent run in the record and in the call counts
PAGE = 1000  # runs per search page (MLflow's default page size)
# The store saying no to a write, not the store being away: retrying cannot help.
PERMANENT_CODES = {"INVALID_PARAMETER_VALUE", "RESOURCE_ALREADY_EXISTS", "RESOURCE_DOES_NOT_EXIST",
                   "INVALID_STATE", "BAD_REQUEST", "PERMISSION_DENIED", "UNAUTHENTICATED"}
FIRST_BACKOFF_S, MAX_BACKOFF_S = 0.5, 10.0


class _LockedStoreNoise:
    """MLflow's sqlite store logs an ERROR with two tracebacks for every call that found the
    database locked past its busy timeout; the sync retries such calls and says so in one
    line of its own (_Syncer), so these go."""

    def filter(self, record) -> bool:
        return "database is locked" not in record.getMessage()


def _quiet_locked_store() -> None:
    import logging

    logger = logging.getLogger("mlflow.store.db.utils")
    if not any(isinstance(f, _LockedStoreNoise) for f in logger.filters):
        logger.addFilter(_LockedStoreNoise())


def _quiet_http_env() -> None:
    # A tracking server that dies mid-sweep should cost seconds, not MLflow's default
    # minutes of retries per call.
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "20")
    # MLflow prints two "View run" lines per closed run on a server: a wall of links.
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
    _quiet_locked_store()


def _reason(exc: BaseException) -> str:
    text = str(exc)
    for needle, said in (("Connection refused", "connection refused"), ("timed out", "timed out"),
                         ("Name or service not known", "unknown host"), ("nodename nor servname", "unknown host"),
                         ("database is locked", "database is locked"), ("Max retries exceeded", "connection failed"),
                         ("Connection aborted", "connection aborted")):
        if needle in text:
            return said
    return first_line(exc, 200)


def check_tracking(uri: str) -> None:
    """Fail fast, in one line, when the store cannot be used: before Ray starts a trial."""
    _quiet_http_env()
    if uri.startswith(("http://", "https://")):
        import requests

        try:
            reply = requests.get(uri.rstrip("/") + "/health", timeout=5)
        except requests.RequestException as exc:
            raise TrackingUnavailable(f"tracking server {uri} unreachable ({_reason(exc)}); "
                                      "start it or pass another --tracking-uri") from None
        if reply.status_code != 200:
            raise TrackingUnavailable(f"tracking server {uri} answered HTTP {reply.status_code} on /health; "
                                      "is it an MLflow server?")
    elif (db := sqlite_path(uri)) is not None:
        folder = Path(db).parent
        if not folder.is_dir():
            raise TrackingUnavailable(f"tracking store {uri}: folder {folder} does not exist")
    from mlflow.tracking import MlflowClient

    try:
        with _schema_lock(uri):
            MlflowClient(uri).search_experiments(max_results=1)
    except Exception as exc:  # noqa: BLE001 - any failure here is "store unusable", said in one line
        raise TrackingUnavailable(f"tracking store {uri} unusable: {_reason(exc)}") from None


@contextmanager
def _schema_lock(uri: str) -> Iterator[None]:
    """MLflow creates a new sqlite file's schema on first use, and two processes doing it at
    once race (`duplicate column name: step`): two sweeps started together on a new store.
    The first use in each process happens under an exclusive lock on a file beside the db."""
    if not uri.startswith("sqlite:///"):
        yield
        return
    import fcntl

    lock = Path(sqlite_path(uri) + ".lock")
    with lock.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def git_commit() -> str | None:
    """The commit of the code that runs the sweep (this package's checkout), if it is one."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parents[2],
                             capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def report_figures(result: dict[str, Any]) -> dict[str, float]:
    """The training figures of one Tune report (Tune's bookkeeping keys dropped)."""
    return {k: float(v) for k, v in result.items() if k not in TUNE_KEYS and _is_number(v)}


def _log_affinity(client, run_id: str, trial_folder: Path) -> None:
    """affinity.every_steps: the telemetry's affinity.json and heatmap per epoch, which train()
    writes into its output folder (the trial folder's output/, orchestration/run/trainable.py)."""
    from mtbert.train.grouping import FOLDER

    folder = trial_folder / "output" / FOLDER
    if folder.is_dir():
        client.log_artifacts(run_id, str(folder), FOLDER)


def final_figures(history: dict[int, dict[str, float]], metric_names: list[str] | None = None) -> dict[str, float]:
    """A trial's summary of its reported epochs by each figure's own rule (mtbert.figures):
    for a report that carried none (train() sends its own with every report, which wins).
    Every declared figure is summarised, the task scores (`metric_names`) among them."""
    from mtbert import figures

    def declared(name: str) -> bool:
        try:
            return figures.get(name).summary is not None or name == figures.BEST_BY
        except KeyError:  # Tune's or the sampler's own (system/...): no summary
            return False

    rows = [{**{k: v for k, v in history[e].items() if declared(k)}, "epoch": e} for e in sorted(history)]
    return figures.summary(rows)


# ---------------------------------------------------------------------------- the record

def _trial() -> dict[str, Any]:
    # `sent`: what the trial's run holds (run id, params logged, epochs up to `cursor`, the
    # tags, metrics and files last sent, its status): the sync's cursor, journaled with the rest.
    return {"config": {}, "tags": {}, "epochs": {}, "steps": {}, "summary": None, "status": "RUNNING", "reason": None,
            "error": None, "log": None, "sent": {"cursor": 0, "tags": {}, "metrics": {}}}


def _digits(x: float) -> float:
    """`x` to four significant digits (a configuration run's figures, for the UI's table)."""
    return float(f"{x:.4g}") if math.isfinite(x) else x


def _configuration() -> dict[str, Any]:
    # Its figures come from its seeds' records; it keeps only the tags given to it (its part in
    # the claims) and what its run holds.
    return {"tags": {}, "sent": {"tags": {}, "metrics": {}}}


class SweepRecord:
    """The driver's truth about a sweep: every trial's record and the parent run's, kept in
    memory and appended to RECORD_FILE (replayed on resume). Each entry is a change to one
    record ({"k": key, "set": fields} or an epoch) or what a sync sent ({"k": key, "sent": ...})."""

    def __init__(self, folder: Path | None, fresh: bool):
        self.fresh = fresh  # a sweep this process created: no run of a new trial key exists yet
        self.trials: dict[str, dict[str, Any]] = {}
        self.configs: dict[str, dict[str, Any]] = {}  # CONFIG_PREFIX + variant -> _configuration()
        self.parent: dict[str, Any] = {"tags": {}, "metrics": {}, "texts": {}, "describe": None,
                                       "status": "RUNNING", "sent": {"tags": {}, "metrics": {}, "texts": {}}}
        self.lock = threading.RLock()
        self.started: dict[str, str] = {}  # key -> Tune trial id, in this driver
        self.tried: set[str] = set()  # runs this driver asked MLflow to create
        self.stop_reason: str | None = None  # set by a signal, an outage or a full disk: see callbacks.py
        self.full: tuple[int, int] | None = None  # (bytes free, bytes needed) of a full sweep folder
        self.journal_error: OSError | None = None
        self.closing = False  # the sweep's end: TM against the mean baseline, calls counted as the sweep's
        self.calls_by_ref: dict[str, int] = {}
        self.syncer: _Syncer | None = None
        self._file = None
        if folder is not None:
            path = folder / RECORD_FILE
            if path.is_file():
                for line in path.read_text().splitlines():
                    try:
                        self._apply(json.loads(line))
                    except json.JSONDecodeError:
                        continue  # the line a kill cut short
            self._file = path.open("a")

    def of(self, key: str) -> dict[str, Any]:
        if key == PARENT:
            return self.parent
        if key.startswith(CONFIG_PREFIX):
            return self.configs.setdefault(key, _configuration())
        return self.trials.setdefault(key, _trial())

    def _apply(self, e: dict) -> None:
        r = self.of(e["k"])
        if "epoch" in e:
            n = int(e["epoch"])
            before, r["epochs"][n] = r["epochs"].get(n), e["m"]
            # An epoch run again brings its own points (or none); a record from before has no "steps".
            r.setdefault("steps", {})[n] = e.get("steps", {})
            if n <= r["sent"]["cursor"] and _retrained(before, e["m"]):  # the run gets it again
                r["sent"]["cursor"] = n - 1
        for target, fields in ((r, e.get("set", {})), (r["sent"], e.get("sent", {}))):
            for field, value in fields.items():  # a mapping (tags, metrics, texts) takes what it is given
                if isinstance(target.get(field), dict) and isinstance(value, dict):
                    target[field].update(value)
                else:
                    target[field] = value

    def change(self, e: dict) -> None:
        with self.lock:
            self._apply(e)
            if self._file is not None:
                try:
                    self._file.write(json.dumps(e, default=str) + "\n")
                    self._file.flush()  # in the OS: it survives this process being killed
                except OSError as exc:  # a full disk: the sweep stops (callbacks.py), the record goes on in memory
                    self.journal_error = exc

    def close(self) -> None:
        if self._file is not None:
            file, self._file = self._file, None
            try:
                file.close()
            except OSError:  # a full disk: what it kept is what a resume reads
                pass

    # -------------------------------------------------------------- what a run should hold

    def view(self, key: str) -> tuple[dict[str, str], dict[str, float], str | None]:
        """(tags, final metrics, result.json) the trial's run should hold now."""
        t = self.trials[key]
        tags, metrics, result = dict(t["tags"]), {}, None
        if t["status"] == "RUNNING":
            return tags, metrics, result
        tags.update(interrupted=t["reason"] or "false", stopped_early="false")
        if t["error"]:
            tags["error"] = t["error"][:5000]
        config = t["config"].get("config", {})
        if t["epochs"]:
            metrics, tags["tm_time_basis"] = trial_figures(t["epochs"], config, t["summary"])
            budget = int(config.get("train", {}).get("epochs", 0))
            tags["stopped_early"] = str(t["status"] == "FINISHED" and metrics["epochs_run"] < budget).lower()
            if t["status"] == "FINISHED":
                for scores in (self._tm(t, metrics), self._delta_m(t, metrics)):
                    tags.update(scores.pop("tags", {}))
                    metrics.update(scores)
            result = json.dumps({"metrics": metrics, "epochs": [{"epoch": e, **t["epochs"][e]} for e in sorted(t["epochs"])],
                                 "config": config, "trial_key": key, "status": t["status"]}, indent=2, default=str)
        if t["status"] in ("FINISHED", "FAILED"):
            why = diverged_reason(metrics, t["epochs"] if t["status"] == "FINISHED" else {}, t["error"])
            if why:
                tags["diverged"] = why
        return tags, metrics, result

    def _tm(self, t: dict, final: dict[str, float]) -> dict[str, Any]:
        """TM-relative scores against the same-seed baseline once its run and figures are in;
        at the sweep's end, against the mean of the finished baselines where that one failed."""
        bases = {str(b["config"].get("seed")): b for b in self.trials.values() if b["config"].get("role") == "baseline"
                 and b["status"] == "FINISHED" and b["epochs"] and b["sent"].get("run")}
        figures = lambda b: trial_figures(b["epochs"], b["config"].get("config", {}), b["summary"])[0]  # noqa: E731
        base = bases.get(str(t["config"].get("seed")))
        if base is not None:
            return tm_scores(final, figures(base), base["sent"]["run"])
        if self.closing and bases:
            return tm_scores(final, mean_reference([figures(b) for b in bases.values()]),
                             f"mean of {len(bases)} baseline seeds")
        return {}

    def _delta_m(self, t: dict, final: dict[str, float]) -> dict[str, Any]:
        """Delta_m% against the single-task runs of the same seed once every task's is in; at
        the sweep's end, against the mean of a task's finished single-task seeds where that
        seed's failed. Nothing for a single-task run itself, or a sweep without them."""
        if t["config"].get("role") == SINGLE_TASK:
            return {}
        runs = [(b["config"]["config"]["tasks"][0], str(b["config"].get("seed")),
                 trial_figures(b["epochs"], b["config"]["config"], b["summary"])[0])
                for b in self.trials.values() if b["config"].get("role") == SINGLE_TASK
                and b["status"] == "FINISHED" and b["epochs"]]
        tasks = t["config"].get("config", {}).get("tasks", [])
        return trial_delta_m(final, single_task_scores(runs, tasks, str(t["config"].get("seed")), self.closing))

    def configuration(self, key: str) -> tuple[dict[str, str], dict[str, str], dict[str, float], str] | None:
        """(params, tags, metrics, status) a configuration's run should hold now; None while
        none of its seeds has ended (its run is made when the first one does)."""
        from mtbert.config import flatten
        from orchestration.stats import mean_ci

        variant = key[len(CONFIG_PREFIX):]
        seeds = sorted((k, t) for k, t in self.trials.items() if t["config"].get("variant") == variant)
        if not seeds or all(t["status"] == "RUNNING" for _, t in seeds):
            return None
        first = seeds[0][1]["config"]
        params = {k: str(v)[:6000] for k, v in flatten(first.get("config", {})).items() if k != SEED_PARAM}
        finished, diverged = [], []
        for k, t in seeds:
            if t["status"] in ("FINISHED", "FAILED"):  # a failed one counts when its loss diverged
                tags, metrics, _ = self.view(k)
                if tags.get("diverged"):
                    diverged.append((k, metrics))
                elif t["status"] == "FINISHED" and t["epochs"]:
                    finished.append((k, metrics))
        metrics: dict[str, float] = {}
        # overall first: MLflow's compare page charts a run's first metric.
        # Four significant digits: the UI's runs table prints every digit a metric has, which
        # pushed the columns past the screen, and seed means support no more.
        for name in dict.fromkeys(["overall", *(n for _, m in finished for n in m)]):
            mean, half, n = mean_ci(m.get(name) for _, m in finished)
            if n:
                metrics[name] = _digits(mean)
            if n >= 2 and math.isfinite(half):
                metrics[f"{name}_ci_low"], metrics[f"{name}_ci_high"] = _digits(mean - half), _digits(mean + half)
        metrics.update(seeds=float(len(finished)), seeds_diverged=float(len(diverged)))
        tags = {"variant": variant, "role": CONFIGURATION, "configuration_role": str(first.get("role", "")),
                "seed_runs": ",".join(k for k, _ in finished), "diverged_seeds": ",".join(k for k, _ in diverged),
                **self.configs.get(key, _configuration())["tags"]}
        tags = {k: v for k, v in tags.items() if v}  # an empty list is no tag
        states = {t["status"] for _, t in seeds}
        status = ("RUNNING" if "RUNNING" in states else "FINISHED" if finished or diverged
                  else "FAILED" if "FAILED" in states else "KILLED")
        return params, tags, metrics, status

    def unsynced(self) -> list[str]:
        """Records whose run lags behind them (what a sync would still send)."""
        with self.lock:
            p, sent = self.parent, self.parent["sent"]
            parent_lags = (any(_unsent(sent, p["tags"], p["metrics"])) or bool(_unsent_texts(sent, p["texts"]))
                           or (p["describe"] is not None and not sent.get("described"))
                           or sent.get("status") != p["status"])
            out = [PARENT] if parent_lags else []
            for key, t in self.trials.items():
                sent = t["sent"]
                tags, metrics, result = self.view(key)
                if (not sent.get("based") or max(t["epochs"], default=0) > sent["cursor"]
                        or any(_unsent(sent, tags, metrics))
                        or (t["status"] != "RUNNING" and sent.get("files") != _digest(result, t["log"]))
                        or sent.get("status") != t["status"]):
                    out.append(key)
            for key in dict.fromkeys(CONFIG_PREFIX + t["config"]["variant"] for t in self.trials.values()
                                     if t["config"].get("variant")):
                found, sent = self.configuration(key), self.of(key)["sent"]
                if found is not None and (not sent.get("based") or any(_unsent(sent, found[1], found[2]))
                                          or sent.get("status") != found[3]):
                    out.append(key)
            return out


def _retrained(before: dict[str, float] | None, after: dict[str, float] | None) -> bool:
    """Whether an epoch reported again trained differently from its first report (its
    overall differs), rather than replaying it: only its timings then differ."""
    from mtbert.figures import BEST_BY

    if before is None or after is None:
        return True
    if before is after:
        return False
    a, b = before.get(BEST_BY), after.get(BEST_BY)
    return a is None or b is None or not _same(a, b)


def _unsent(sent: dict, tags: dict[str, str], metrics: dict[str, float]) -> tuple[dict, dict]:
    """The tags and metrics that differ from what the run was last sent."""
    return ({k: v for k, v in tags.items() if sent["tags"].get(k) != v},
            {k: v for k, v in metrics.items() if not _same(sent["metrics"].get(k), v)})


def _unsent_texts(sent: dict, texts: dict[str, str]) -> dict[str, str]:
    return {name: text for name, text in texts.items() if sent["texts"].get(name) != _digest(text)}


def _digest(*parts: Any) -> str:
    return hashlib.sha1(json.dumps(parts, default=str).encode()).hexdigest()[:16]


class _Syncer:
    """One background thread that syncs the records marked dirty, in the order first marked,
    retrying with backoff while the store is away (trials keep training meanwhile)."""

    def __init__(self, sync: Callable[[str], None], outage_s: float = 180.0):
        self._sync, self.outage_s = sync, outage_s
        self._dirty: dict[str, None] = {}
        self._busy: str | None = None
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closing = False
        self.outage_since: float | None = None
        self.last_error = ""
        self.busy_s = 0.0  # time in the store's calls
        # Of which the thread's own CPU: the rest is waiting, on the store (a server's round
        # trips, sqlite's fsync) or on the GIL while the driver's other threads run.
        self.busy_cpu_s = 0.0

    def mark(self, *keys: str) -> None:
        with self._cond:
            self._dirty.update(dict.fromkeys(keys))
            self._cond.notify_all()
            if not self._closing and (self._thread is None or not self._thread.is_alive()):
                self._thread = threading.Thread(target=self._run, name="mtbert-mlflow-sync", daemon=True)
                self._thread.start()

    def outage(self) -> float:
        """Seconds the store has been failing (0 when it answers)."""
        since = self.outage_since
        return time.monotonic() - since if since is not None else 0.0

    def given_up(self) -> bool:
        return self.outage() > self.outage_s

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every record is synced; False when the store stayed away past the limit
        (or `timeout`)."""
        deadline = time.monotonic() + timeout if timeout is not None else None
        with self._cond:
            while self._dirty or self._busy is not None:
                if self._closing or self.given_up() or (deadline is not None and time.monotonic() >= deadline):
                    return False
                self._cond.wait(0.2)
        return True

    def close(self) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify_all()

    def _run(self) -> None:
        backoff = FIRST_BACKOFF_S
        while True:
            with self._cond:
                while not self._dirty and not self._closing:
                    self._cond.wait()
                if self._closing:
                    return
                key = self._busy = next(iter(self._dirty))
                del self._dirty[key]  # a change made during its sync marks it again
            t0, c0 = time.perf_counter(), time.thread_time()
            try:
                self._sync(key)
                failed = None
            except Exception as exc:  # noqa: BLE001 - sorted below: store away vs store says no
                failed = exc
            self.busy_s += time.perf_counter() - t0
            self.busy_cpu_s += time.thread_time() - c0
            with self._cond:
                self._busy = None
                if failed is not None and getattr(failed, "error_code", None) not in PERMANENT_CODES:
                    self._dirty = {key: None, **self._dirty}  # first again, once the store is back
                    self.last_error = _reason(failed)
                    if self.outage_since is None:
                        self.outage_since = time.monotonic()
                        what = "locked" if self.last_error == "database is locked" else "away"
                        print(f"tracking store {what} ({self.last_error}); the trials go on and their MLflow "
                              f"writes are retried for up to {self.outage_s:.0f}s (tracking.outage_s)", flush=True)
                    self._cond.notify_all()
                    self._cond.wait(backoff)
                    backoff = min(backoff * 2, MAX_BACKOFF_S)
                    continue
                if failed is not None:
                    print(f"warning: MLflow refused a write for {key}: {_reason(failed)}")
                elif self.outage_since is not None:
                    print("tracking store back; the waiting MLflow writes follow", flush=True)
                self.outage_since, backoff = None, FIRST_BACKOFF_S
                self._cond.notify_all()


class _Counting:
    """A thin wrapper over MlflowClient counting calls per record synced (issue: per-trial
    cost must not grow with the sweep; launch.py writes the counts to mlflow_calls.json)."""

    def __init__(self, client, counts: dict[str, int]):
        self._c, self._counts, self.local = client, counts, threading.local()

    def __getattr__(self, name: str):
        attr = getattr(self._c, name)
        if not callable(attr) or name.startswith("_"):
            return attr

        def call(*args, **kwargs):
            ref = getattr(self.local, "ref", PARENT)  # the sync thread's record, else the sweep's
            self._counts[ref] = self._counts.get(ref, 0) + 1
            return attr(*args, **kwargs)
        return call


# Records by sweep: Tune unpickles its own copy of the callbacks on restore, and the launcher
# holds another; both must change the same record.
_RECORDS: dict[str, SweepRecord] = {}
# parent run id -> the driver's own SweepTracking. Tune unpickles its own copy of the callbacks
# on resume; that copy takes the driver's store and sweep folder, so a sweep folder moved or
# copied since it was saved writes where the driver reads, never to the folder it came from.
_DRIVERS: dict[str, SweepTracking] = {}


class SweepTracking:
    """Parent/child runs of one sweep. Picklable (Tune checkpoints the callbacks holding it);
    the client and the record are found again by the sweep folder (else the parent run)."""

    def __init__(self, uri: str, experiment_id: str, parent_run_id: str, sweep_name: str,
                 commit: str | None = None, state_dir: str | Path | None = None, outage_s: float = 180.0,
                 fresh: bool = False, run_name: str = ""):
        self.uri = uri
        self.experiment_id = experiment_id
        self.parent_run_id = parent_run_id
        self.sweep_name = sweep_name
        self.run_name = run_name  # the parent run's: every trial run's sweep_run tag
        self.commit = commit
        self.state_dir = str(Path(state_dir).resolve()) if state_dir else None
        self.outage_s = outage_s
        self.fresh = fresh
        self.sync_s = 0.0  # driver time in reads (searches)
        # The sweep's source (file, commit), set by start(): every trial run gets it too. An
        # attribute of __init__, so that Tune's restored copy (__setstate__) keeps it.
        self.source_tags: dict[str, str] = {}
        self._client = None
        self._record: SweepRecord | None = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_client": None, "_record": None, "fresh": False}

    def __setstate__(self, state: dict) -> None:
        # A sweep folder saved by an older mtbert pickled other private fields (the write
        # queue's `_live`): keep the fields this class still has and default the rest, so
        # `sweep resume` continues such a sweep instead of failing in Tune's setup.
        self.__init__(state["uri"], state["experiment_id"], state["parent_run_id"], state["sweep_name"])
        self.__dict__.update({k: v for k, v in state.items() if k in self.__dict__})
        self._client, self._record, self.fresh = None, None, False
        driver = _DRIVERS.get(self.parent_run_id)
        if driver is not None:
            self.uri, self.state_dir = driver.uri, driver.state_dir

    @property
    def record(self) -> SweepRecord:
        if self._record is None:
            _DRIVERS.setdefault(self.parent_run_id, self)  # the first to ask is the driver
            key = self.state_dir or self.parent_run_id
            if key not in _RECORDS:
                record = SweepRecord(Path(self.state_dir) if self.state_dir else None, self.fresh)
                record.syncer = _Syncer(self._sync, self.outage_s)
                _RECORDS[key] = record
            self._record = _RECORDS[key]
        return self._record

    @property
    def client(self):
        if self._client is None:
            from mlflow.tracking import MlflowClient

            _quiet_http_env()
            self._client = _Counting(MlflowClient(self.uri), self.record.calls_by_ref)
        return self._client

    @property
    def logging_s(self) -> float:
        """Driver time in MLflow calls: the sync thread's and the reads'."""
        return self.record.syncer.busy_s + self.sync_s

    def release(self) -> None:
        """End of this driver's sweep: the sync thread stops, the record's file closes."""
        _DRIVERS.pop(self.parent_run_id, None)
        record = _RECORDS.pop(self.state_dir or self.parent_run_id, None)
        if record is not None:
            record.syncer.close()
            record.close()

    def flush(self, timeout: float | None = None) -> bool:
        return self.record.syncer.flush(timeout)

    def given_up(self) -> bool:
        return self.record.syncer.given_up()

    def journal_failed(self) -> bool:
        """The sweep folder refused one of the driver's own writes (its record, Tune's state)."""
        return self.record.journal_error is not None

    def resync(self) -> int:
        """Sync every record that lags its run (a resume, the sweep's end); how many did."""
        lagging = self.record.unsynced()
        if lagging:
            self.record.syncer.mark(*lagging)
        return len(lagging)

    def _change(self, key: str, **fields: Any) -> None:
        self.record.change({"k": key, "set": fields})
        self.record.syncer.mark(key)

    def run_id(self, key: str) -> str | None:
        return self.record.trials[key]["sent"].get("run")

    # ------------------------------------------------------------------ parent

    @classmethod
    def start(cls, uri: str, experiment: str, run_name: str, sweep_name: str,
              tags: dict[str, str], commit: str | None, state_dir: str | Path | None = None,
              outage_s: float = 180.0, view: dict | None = None,
              log: Callable[[str], None] = print) -> "SweepTracking":
        """`view`: the keyword arguments of view.save_runs_view (the table the link opens).
        The store going away between the startup check and the parent run is ridden out as
        later outages are (_until_back); a store that says no is one line."""
        from mlflow.tracking import MlflowClient

        _quiet_http_env()
        client = MlflowClient(uri)
        all_tags = {"sweep": sweep_name, SWEEP_RUN_TAG: run_name, "role": "sweep",
                    **({"git_commit": commit} if commit else {}), **tags}
        source = source_tags(tags.get("sweep_file"), commit)  # [describe]
        tried = []

        def open_parent() -> tuple[str, str]:
            found = client.get_experiment_by_name(experiment)
            experiment_id = found.experiment_id if found else client.create_experiment(
                experiment, artifact_location=_artifact_location(uri, experiment))
            mark_experiment(client, experiment_id)  # [view] UI opens on model training
            if view:
                save_runs_view(client, experiment_id, **view)  # [view] the configurations and seeds views
            if tried:  # a create whose answer was lost may have made it
                mine = client.search_runs([experiment_id], max_results=1, filter_string=(
                    f"tags.`{SWEEP_RUN_TAG}` = '{run_name}' and tags.role = 'sweep' and attributes.status = 'RUNNING'"))
                if mine:
                    return experiment_id, mine[0].info.run_id
            tried.append(True)
            return experiment_id, client.create_run(experiment_id, run_name=run_name,
                                                    tags={**all_tags, **source}).info.run_id

        experiment_id, run_id = _until_back(open_parent, uri, outage_s, log)
        tracking = cls(uri, experiment_id, run_id, sweep_name, commit, state_dir, outage_s, fresh=True,
                       run_name=run_name)
        tracking.source_tags = source
        sent = {"tags": {**all_tags, **source}, "status": "RUNNING"}
        tracking.record.change({"k": PARENT, "set": {"tags": sent["tags"]}, "sent": sent})
        return tracking

    def log_parent_artifacts(self, files: dict[str, str]) -> None:
        """artifact name -> text."""
        self._change(PARENT, texts=files)

    def tag_parent(self, tags: dict[str, str]) -> None:
        self._change(PARENT, tags=tags)

    def describe_parent(self, base_config: dict[str, Any]) -> None:
        """The sweep's data as dataset inputs of the parent run too (its Dataset column)."""
        self._change(PARENT, describe=base_config)

    def log_parent(self, metrics: dict[str, float], tags: dict[str, str]) -> None:
        self._change(PARENT, metrics=metrics, tags=tags)

    def reopen_parent(self) -> None:
        self._change(PARENT, status="RUNNING")

    def end_parent(self, status: str) -> None:
        self._change(PARENT, status=status)

    # ------------------------------------------------------------------ trials

    def start_trial(self, trial_config: dict[str, Any], trial_id: str) -> None:
        """The trial runs (again) under this driver. Idempotent within one driver: Tune
        announces a trial at start and with every result."""
        record, key = self.record, trial_config["key"]
        if record.started.get(key) == trial_id:
            return
        record.started[key] = trial_id
        tags = {PARENT_TAG: self.parent_run_id, "sweep": self.sweep_name, "trial_key": key,
                "trial_id": trial_id, "variant": trial_config["variant"], "role": trial_config["role"],
                "seed": str(trial_config["seed"])}
        if self.run_name:  # [view] which sweep a row is, in the saved view
            tags[SWEEP_RUN_TAG] = self.run_name
        if self.commit:
            tags["git_commit"] = self.commit
        if trial_config.get(STANDS_FOR):  # a baseline that is also these searched points
            tags[STANDS_FOR] = ",".join(trial_config[STANDS_FOR])
        tags.update(self.source_tags)  # [describe] the sweep's source on the run
        self._change(key, config=trial_config, tags=tags, status="RUNNING", reason=None, error=None)

    def log_epoch(self, key: str, result: dict[str, Any]) -> dict[str, float]:
        """One report: its figures (at step=epoch) and the node it ran on, into the record."""
        from mtbert.figures import SUMMARY_KEY, WHERE_KEY

        from mtbert.figures import STEP_LOSSES

        metrics = report_figures(result)
        entry: dict[str, Any] = {"k": key, "epoch": int(result["epoch"]), "m": metrics, "set": {}}
        points = result.get(STEP_LOSSES)
        if isinstance(points, dict) and points:  # train.log_every_steps: sent with the epoch's figures
            entry["steps"] = {k: [[int(at), float(v)] for at, v in series] for k, series in points.items()}
        summary = result.get(SUMMARY_KEY)
        if isinstance(summary, dict):  # train()'s own word on its epochs so far
            entry["set"]["summary"] = {k: float(v) for k, v in summary.items() if _is_number(v)}
        where = result.get(WHERE_KEY) if isinstance(result.get(WHERE_KEY), dict) else {}
        node = {**{k: str(result[r]) for k, r in (("node", "hostname"), ("node_ip", "node_ip")) if result.get(r)},
                **{k: str(v) for k, v in where.items() if v}}
        if any(self.record.of(key)["tags"].get(k) != v for k, v in node.items()):
            entry["set"]["tags"] = node
        self.record.change(entry)
        self.record.syncer.mark(key)
        return metrics

    def history(self, key: str) -> dict[int, dict[str, float]]:
        return self.record.of(key)["epochs"]

    def retried(self, key: str, failures: int, error: str) -> None:
        self._change(key, tags={"retries": str(failures), "last_error": error[:5000]})

    def tag_trial(self, key: str, tags: dict[str, str]) -> None:
        """Tags a whole-sweep step puts on a trial's run (the model it logged)."""
        self._change(key, tags=tags)

    def finish(self, trial_config: dict[str, Any], status: str, error: str | None = None,
               interrupted: str | None = None, train_log: str | None = None) -> dict[str, float]:
        """The trial ended: its final figures (returned), TM-relative score once its baseline's
        are in, result.json, train.log, tags and end state follow in its sync.
        `interrupted` (why) marks a trial the user, a signal or an outage stopped: KILLED,
        resumable, never FINISHED."""
        key = trial_config["key"]
        self.record.started.pop(key, None)
        self._change(key, config=trial_config, status=status, reason=interrupted, error=error, log=train_log)
        t = self.record.trials[key]
        return trial_figures(t["epochs"], trial_config["config"], t["summary"])[0] if t["epochs"] else {}

    def close_open(self, reason: str) -> int:
        """Trials still running in the record, at the sweep's end: KILLED, with why."""
        running = [key for key, t in self.record.trials.items() if t["status"] == "RUNNING"]
        for key in running:
            error = None if key in self.record.started else "the sweep ended before this trial did"
            self.record.started.pop(key, None)
            self._change(key, status="KILLED", reason=reason, error=error)
        return len(running)

    # ------------------------------------------------------------------ the sync

    def _sync(self, key: str) -> None:
        """Make the key's run equal to its record (runs in the sync thread)."""
        record = self.record
        self.client.local.ref = PARENT if key == PARENT or record.closing else key
        if key == PARENT:
            return self._sync_parent()
        if key.startswith(CONFIG_PREFIX):
            return self._sync_configuration(key)
        t, found = record.trials[key], {}
        if not t["sent"].get("run"):  # first the run, so that a baseline's TM score names it
            with record.lock:
                tags = dict(t["tags"])
            found = self._find_or_create(key, tags)
            record.change({"k": key, "sent": {k: found[k] for k in ("run", "tags", "status")}})
        with record.lock:
            sent = {**t["sent"], "tags": dict(t["sent"]["tags"]), "metrics": dict(t["sent"]["metrics"])}
            tags, metrics, result = record.view(key)
            epochs = {n: m for n, m in t["epochs"].items() if n > sent["cursor"]}
            steps = {n: t.get("steps", {}).get(n, {}) for n in epochs}
            status, log, config = t["status"], t["log"], t["config"]
        client, run_id = self.client, sent["run"]
        if not sent.get("based"):
            self._send_config(key, run_id, config["config"], found.get("params", []))
        now = int(time.time() * SECONDS)
        batch = _epoch_batch(epochs, steps, now)
        new_tags, new_metrics = _unsent(sent, tags, metrics)
        # Epochs and the end in calls of their own, however the changes fell between syncs:
        # a trial's call count depends on its record only (mlflow_calls.json).
        ending = status != "RUNNING"
        _log_batch(client, run_id, batch, [] if ending else sorted(new_tags.items()), [])
        if ending:
            _log_batch(client, run_id, [[k, v, now, 0] for k, v in new_metrics.items()], sorted(new_tags.items()), [])
        files = _digest(result, log) if ending else sent.get("files")
        if files != sent.get("files"):
            if result:
                client.log_text(run_id, result, "result.json")
            if log and Path(log).is_file():
                client.log_artifact(run_id, log)
                _log_affinity(client, run_id, Path(log).parent)
        if status != sent.get("status"):
            _set_status(client, run_id, status)
        with record.lock:  # an epoch run again during this sync is sent by the next one
            lowered = t["sent"]["cursor"] if t["sent"]["cursor"] < sent["cursor"] else math.inf
            cursor = min(max(epochs, default=sent["cursor"]), lowered,
                         *(n - 1 for n, m in epochs.items() if _retrained(m, t["epochs"].get(n))))
            record.change({"k": key, "sent": {"cursor": cursor, "files": files, "status": status,
                                              "tags": new_tags, "metrics": new_metrics}})
        if ending:
            self._mark_dependents(key, config, status)

    def _send_config(self, key: str, run_id: str, config: dict[str, Any], have: list[str]) -> None:
        """A trial run's params (those it lacks of its flattened config), its config.yaml and
        data description: once per run."""
        import yaml

        from mtbert.config import flatten

        params = [[k, str(v)[:6000]] for k, v in sorted(flatten(config).items()) if k not in have]
        _log_batch(self.client, run_id, [], [], params)
        # `mtbert train --config config.yaml` re-runs this trial exactly.
        self.client.log_text(run_id, yaml.safe_dump(config, sort_keys=False), "config.yaml")
        describe_run(self.client, run_id, config)  # [describe] its data
        self.record.change({"k": key, "sent": {"based": True}})

    def _mark_dependents(self, key: str, config: dict[str, Any], status: str) -> None:
        """The runs an ended trial changes, to be synced: its configuration's (its mean and
        interval take it in) and, for a finished baseline, its seed's finished trials (their TM
        scores are against it)."""
        record = self.record
        if config.get("variant"):
            record.syncer.mark(CONFIG_PREFIX + config["variant"])
        if config.get("role") == "baseline" and status == "FINISHED":
            seed = str(config.get("seed"))
            record.syncer.mark(*[k for k, o in record.trials.items() if k != key and o["status"] == "FINISHED"
                                 and str(o["config"].get("seed")) == seed])

    def _find_or_create(self, key: str, tags: dict[str, str], variant: str | None = None) -> dict[str, Any]:
        """The trial's run (a configuration's, with its `variant`): found by trial_key (variant)
        where one may exist (a resumed sweep, a create whose answer was lost), else created with
        its tags."""
        record = self.record
        if not record.fresh or key in record.tried:
            found = self.children(key) if variant is None else self.configurations(variant)
            if found:  # what it holds is unknown: its tags and status are sent again
                return {"run": found[0].info.run_id, "tags": {}, "status": None, "params": list(found[0].data.params)}
        record.tried.add(key)
        run = self.client.create_run(self.experiment_id, run_name=variant or key, tags=tags)
        return {"run": run.info.run_id, "tags": tags, "status": "RUNNING"}

    def _sync_configuration(self, key: str) -> None:
        """Make a configuration's run equal to what its seeds' records say (runs in the sync thread)."""
        record, client = self.record, self.client
        with record.lock:
            now_is = record.configuration(key)
            c = record.of(key)
            sent = {**c["sent"], "tags": dict(c["sent"]["tags"]), "metrics": dict(c["sent"]["metrics"])}
        if now_is is None:
            return
        params, tags, metrics, status = now_is
        found: dict[str, Any] = {}
        if not sent.get("run"):
            variant = tags["variant"]
            base = {PARENT_TAG: self.parent_run_id, "sweep": self.sweep_name, **self.source_tags,
                    **({SWEEP_RUN_TAG: self.run_name} if self.run_name else {}),
                    **({"git_commit": self.commit} if self.commit else {})}
            found = self._find_or_create(key, {**base, **tags}, variant=variant)
            record.change({"k": key, "sent": {k: found[k] for k in ("run", "tags", "status")}})
            sent.update({k: found[k] for k in ("run", "tags", "status")})
        run_id = sent["run"]
        if not sent.get("based"):
            have = found.get("params", [])
            _log_batch(client, run_id, [], [], [[k, v] for k, v in sorted(params.items()) if k not in have])
            record.change({"k": key, "sent": {"based": True}})
        new_tags, new_metrics = _unsent(sent, tags, metrics)
        now = int(time.time() * SECONDS)
        _log_batch(client, run_id, [[k, v, now, 0] for k, v in new_metrics.items()], sorted(new_tags.items()), [])
        if status != sent.get("status"):
            _set_status(client, run_id, status)
        record.change({"k": key, "sent": {"tags": new_tags, "metrics": new_metrics, "status": status}})

    def tag_configuration(self, variant: str, tags: dict[str, str]) -> None:
        """Tags a whole-sweep step puts on a configuration's run (its part in the claims)."""
        self._change(CONFIG_PREFIX + variant, tags=tags)

    def _sync_parent(self) -> None:
        record, client, run_id = self.record, self.client, self.parent_run_id
        with record.lock:
            p = record.parent
            sent = {k: dict(v) if isinstance(v, dict) else v for k, v in p["sent"].items()}
            tags, metrics = _unsent(sent, p["tags"], p["metrics"])
            texts = _unsent_texts(sent, p["texts"])
            describe, status = p["describe"], p["status"]
        now = int(time.time() * SECONDS)
        _log_batch(client, run_id, [[k, v, now, 0] for k, v in metrics.items()], sorted(tags.items()), [])
        for name, text in texts.items():
            client.log_text(run_id, text, name)
        done = {"tags": tags, "metrics": metrics, "texts": {n: _digest(t) for n, t in texts.items()}}
        if describe is not None and not sent.get("described"):
            describe_run(client, run_id, describe)  # [describe] dataset inputs, data report
            done["described"] = True
        if status != sent.get("status"):
            _set_status(client, run_id, status)
            done["status"] = status
        record.change({"k": PARENT, "sent": done})

    # ------------------------------------------------------------------ reads

    def children(self, key: str | None = None) -> list:
        """Every trial run of the sweep (its seeds', not its configurations'), one paged search
        (the sweep's end, never per trial); with `key`, that trial's run (a resumed trial's)."""
        return self._search(f"{SEED_RUNS}" + (f" and tags.trial_key = '{key}'" if key else ""))

    def configurations(self, variant: str | None = None) -> list:
        """The sweep's configuration runs; with `variant`, that configuration's."""
        return self._search(CONFIGURATION_FILTER + (f" and tags.variant = '{variant}'" if variant else ""))

    def _search(self, condition: str) -> list:
        t0 = time.perf_counter()
        where = f"tags.`{PARENT_TAG}` = '{self.parent_run_id}' and {condition}"
        out, token = [], None
        while True:
            page = self.client.search_runs([self.experiment_id], filter_string=where, max_results=PAGE,
                                           page_token=token)
            out.extend(page)
            token = page.token
            if not token:
                break
        self.sync_s += time.perf_counter() - t0
        return out


def _until_back(call: Callable[[], Any], uri: str, outage_s: float, log: Callable[[str], None]) -> Any:
    """`call` (MLflow calls made before the sweep has a parent run, so before the sync thread
    can hold them) retried while the store is away, with the sync thread's backoff and
    outage limit; one line when it starts failing, one line when it gives up or the store
    says no (PERMANENT_CODES), never a traceback."""
    import requests
    from mlflow.exceptions import MlflowException

    backoff, since = FIRST_BACKOFF_S, None
    while True:
        try:
            return call()
        except (MlflowException, requests.RequestException) as exc:
            if getattr(exc, "error_code", None) in PERMANENT_CODES:
                raise TrackingUnavailable(f"tracking store {uri} refused to open the sweep's parent run: "
                                          f"{_reason(exc)}") from None
            if since is None:
                since = time.monotonic()
                log(f"tracking store {uri} away before the sweep's parent run existed ({_reason(exc)}); "
                    f"retrying for up to {outage_s:.0f}s (tracking.outage_s)")
            elif time.monotonic() - since > outage_s:
                raise TrackingUnavailable(
                    f"tracking store {uri} unreachable for {time.monotonic() - since:.0f}s ({_reason(exc)}) "
                    "before the sweep's parent run existed; no trial ran: run the sweep again once it is back"
                ) from None
            time.sleep(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF_S)


def trial_figures(history: dict[int, dict[str, float]], config: dict[str, Any],
                  summary: dict[str, float] | None = None) -> tuple[dict[str, float], str]:
    """A trial's run metrics: train()'s summary of its epochs (else final_figures of the
    reported ones) plus the time and FLOPs its TM-relative scores are charged, and the time
    basis: what finish() logs, and what an adaptive sweep decides its claims on (searcher.py)."""
    budget = int(config.get("train", {}).get("epochs", 0)) if "train" in config else 0
    final = dict(summary) if summary else final_figures(history)
    final["tm_time_s"], basis = time_basis(final.get("train_time_s", math.nan), int(final["epochs_run"]), budget)
    if "train_flops" in final:
        final["tm_flops"] = time_basis(final["train_flops"], int(final["epochs_run"]), budget,
                                       final.get("setup_flops", 0.0))[0]
    return final, basis


def diverged_reason(final: dict[str, float], history: dict[int, dict[str, float]],
                    error: str | None = None) -> str | None:
    """Why a trial failed to train, or None: training stopped on a non-finite loss (`error`,
    the failed trial's one line, names mtbert.errors.Diverged), or it finished with its
    `overall` or its last epoch's training loss of a task not a finite number. The run's
    `diverged` tag; the verdicts and the leaderboard leave such a run out and count it
    (docs/verdicts.md, "Diverged runs"; the chance-level half of the rule needs a claim's
    `chance`: orchestration/report/verdicts.py: diverged)."""
    from mtbert.errors import diverged_why

    if diverged_why(error):
        return diverged_why(error)
    last = history[max(history)] if history else {}
    figures = {"overall": final.get("overall"), **{k: v for k, v in last.items() if k.startswith("loss_")}}
    for name, value in figures.items():
        if _is_number(value) and not math.isfinite(float(value)):
            return f"{name} is {value}"
    return None


def tm_scores(trial: dict[str, float], reference: dict[str, float], ref_name: str) -> dict[str, Any]:
    """tm_relative_score (wall clock) and tm_relative_score_compute (counted FLOPs) of a
    trial's final figures against a reference's, plus the tags saying against what."""
    out: dict[str, Any] = {"tags": {"tm_baseline": ref_name}}
    score = trial_tm(trial, reference)
    if score is None:
        out["tags"]["tm_note"] = "undefined: baseline overall <= 0 or missing figures"
    else:
        out["tm_relative_score"] = score
    compute = trial_tm(trial, reference, time_key="tm_flops")
    if compute is not None:
        out["tm_relative_score_compute"] = compute
    return out


def _epoch_batch(epochs: dict[int, dict[str, float]], steps: dict[int, dict[str, list]], now: int) -> list:
    """The metrics of a trial's new epochs for a log_batch: each figure as epoch/<name> at its
    epoch, and the epochs' step-level losses (step/<name>) at the run's global step."""
    # [system] system/* keep MLflow's names (the run's System metrics tab)
    batch = [[k if k.startswith(SYSTEM_PREFIX) else EPOCH_PREFIX + k, v, now, n]
             for n, m in sorted(epochs.items()) for k, v in m.items()]
    return batch + [[STEP_PREFIX + k, v, now, at] for n in sorted(steps) for k, series in steps[n].items()
                    for at, v in series]


def _set_status(client, run_id: str, status: str) -> None:
    if status == "RUNNING":
        client.update_run(run_id, status="RUNNING")
    else:
        client.set_terminated(run_id, status=status)


def _same(a: float | None, b: float) -> bool:
    if a is None:
        return False
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12) or (math.isnan(a) and math.isnan(b))


def _log_batch(client, run_id: str, metrics: list, tags: list, params: list) -> None:
    from mlflow.entities import Metric, Param, RunTag

    m = [Metric(k, float(v), int(ts), int(step)) for k, v, ts, step in metrics]
    t = [RunTag(k, str(v)) for k, v in tags]
    p = [Param(k, str(v)) for k, v in params]
    # MLflow takes at most 1000 metrics, 100 tags and 100 params per call.
    while m or t or p:
        client.log_batch(run_id, metrics=m[:900], tags=t[:100], params=p[:100])
        m, t, p = m[900:], t[100:], p[100:]


def _artifact_location(uri: str, experiment: str) -> str | None:
    """Artifacts of a sqlite store live beside the database, not in whatever folder the
    driver happened to start in (MLflow's default is ./mlruns of the current directory)."""
    if not uri.startswith("sqlite:///"):
        return None  # a server decides (its --artifacts-destination)
    folder = Path(uri[len("sqlite:///"):]).parent / "mlartifacts" / experiment
    return folder.as_uri()
