"""MLflow: one parent run per sweep, one child run per trial, written by the sweep driver.

Why the driver and not the trial process: Tune ends a trial that ASHA stops by raising
SystemExit inside its report call and then tearing the worker down, and a crashed worker
runs no `finally` at all, so a trial cannot be trusted to close its own run. The driver sees
every report and every end (callbacks.py), is the only writer (sqlite stays unlocked), and
closes what it opened. Ray's own MLflow callback has no parent runs (ray#19978).

Names on a child run:
  params   the trial's full flattened config (optim.lr, sharing.head_regime, ...)
  metrics  epoch/<name> at step=epoch for every per-epoch figure of train();
           the final figures under the DESIGN names (sst_acc, ..., overall, best_epoch,
           train_time_s, model_size_mb, ..., tm_relative_score, tm_time_s, epochs_run)
  tags     mlflow.parentRunId, sweep_run (the parent's name), trial_key (stable across
           resumes), trial_id, variant, role, seed, node, node_ip, git_commit, stopped_early,
           tm_time_basis, tm_baseline, error
  artifacts config.yaml (re-run it with `mtbert train --config`), result.json (final
           figures, per-epoch history, config)

Resume is idempotent: a trial's run is found by (parent run, trial_key) and continued,
never created twice; re-run epochs are logged again at their step and the latest value per
step wins when the history is read back.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import yaml

from orchestration.errors import TrackingUnavailable
from orchestration.paths import sqlite_path
from orchestration.sweep.labels import STANDS_FOR
from orchestration.track import mlflow_extras
from orchestration.track.tm import mean_reference, time_basis, trial_tm

EPOCH_PREFIX = "epoch/"
PARENT_TAG = "mlflow.parentRunId"
# Keys Tune adds to every report; they are bookkeeping, not training figures.
TUNE_KEYS = {"training_iteration", "time_total_s", "episodes_total", "timesteps_total", "node_ip",
             "hostname", "pid", "time_this_iter_s", "timestamp", "date", "time_since_restore",
             "timesteps_since_restore", "iterations_since_restore", "config", "checkpoint_dir_name",
             "done", "trial_id", "should_checkpoint", "__duplicate__", "experiment_tag", "epoch"}
SECONDS = 1000  # MLflow timestamps are in milliseconds
STORAGE_FULL = "storage full"  # the stop reason, and the interrupted tag of the trials it stopped


def _quiet_http_env() -> None:
    # A tracking server that dies mid-sweep should cost seconds, not MLflow's default
    # minutes of retries per call.
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "20")
    # MLflow prints two "View run" lines per closed run on a server: a wall of links.
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")


def _reason(exc: BaseException) -> str:
    text = str(exc)
    for needle, reason in (("Connection refused", "connection refused"), ("timed out", "timed out"),
                           ("Name or service not known", "unknown host"),
                           ("nodename nor servname", "unknown host")):
        if needle in text:
            return reason
    first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    return first[:200]


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
    elif sqlite_path(uri) is not None:
        folder = Path(sqlite_path(uri)).parent
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


def git_commit(cwd: Path | None = None) -> str | None:
    """The commit of the code that runs the sweep (this package's checkout), if it is one."""
    cwd = cwd or Path(__file__).resolve().parents[2]
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True,
                             text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def epoch_metrics(result: dict[str, Any]) -> dict[str, float]:
    """The training figures of one Tune report (Tune's bookkeeping keys dropped)."""
    out = {}
    for key, value in result.items():
        number = _number(value)
        if key not in TUNE_KEYS and number is not None:
            out[key] = number
    return out


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


QUEUE_FILE = "mlflow_queue.jsonl"  # in the sweep folder: MLflow writes not yet acknowledged
STATE_LOG = "mlflow_state.jsonl"  # in the sweep folder: run ids and reported figures, append-only
PARENT = "parent"  # the ref of the sweep's parent run in queued writes
PAGE = 1000  # runs per search page (MLflow's default page size)

# Driver state shared by every SweepTracking of one sweep in this process: Tune unpickles
# its own copy of the callbacks on restore, and the launcher holds another; both must write
# through the same queue.
_LIVE: dict[str, "_Live"] = {}


class _Live:
    """What the driver knows without asking MLflow: run ids, every trial's reported epochs,
    final figures and TM-relative scores. Kept in memory, appended to STATE_LOG, read back
    on resume, so per-trial tracking work never scans the sweep."""

    def __init__(self, state_dir: Path | None, fresh: bool):
        self.state_dir = state_dir
        self.fresh = fresh  # a sweep this process created: no run of a new trial key exists yet
        self.runs: dict[str, str] = {}
        self.trials: dict[str, dict[str, Any]] = {}
        self.started: dict[str, str] = {}  # key -> Tune trial id, in this driver
        self.waiting: dict[str, set[str]] = {}  # seed -> finished trials whose baseline is not
        self.node: dict[str, tuple[str, str]] = {}
        self.stop_reason: str | None = None  # set by a signal, an outage or a full disk: see callbacks.py
        self.journal_error: OSError | None = None
        self.full: tuple[int, int] | None = None  # (bytes free, bytes needed) of a full sweep folder
        self.calls_by_ref: dict[str, int] = {}
        self.outbox = None
        self._file = None
        if state_dir is not None:
            self._load()
            self._file = (state_dir / STATE_LOG).open("a")

    def _load(self) -> None:
        path = self.state_dir / STATE_LOG
        if not path.is_file():
            return
        for line in path.read_text().splitlines():
            try:
                e = json.loads(line)
            except json.JSONDecodeError:
                continue  # cut short by a kill
            if "run" in e:
                self.runs[e["run"]] = e["id"]
            elif "epoch" in e:
                t = self.trial(e["key"], e.get("seed"), e.get("role"))
                t["history"][int(e["epoch"])] = e["m"]
                if e.get("s"):
                    t["summary"] = e["s"]
            elif "final" in e:
                t = self.trial(e["final"], e.get("seed"), e.get("role"))
                t.update(final=e["m"], status=e["status"])

    def trial(self, key: str, seed: Any = None, role: Any = None) -> dict[str, Any]:
        t = self.trials.setdefault(key, {"history": {}, "final": None, "status": None, "seed": None, "role": None})
        if seed is not None:
            t["seed"], t["role"] = str(seed), role
        return t

    def note(self, entry: dict) -> None:
        if self._file is not None:
            try:
                self._file.write(json.dumps(entry, default=str) + "\n")
                self._file.flush()
            except OSError as exc:  # a full disk: see Outbox.journal_error
                self.journal_error = exc


class _NoRun(Exception):
    error_code = "RESOURCE_DOES_NOT_EXIST"  # permanent: the outbox drops the write, saying so


class _Counting:
    """A thin wrapper over MlflowClient counting calls per run ref (issue: per-trial cost
    must not grow with the sweep; tests read `calls_by_ref`)."""

    def __init__(self, client, live: _Live):
        import threading

        self._c, self._live, self._local = client, live, threading.local()

    @property
    def ref(self) -> str:
        return getattr(self._local, "ref", PARENT)  # the writer thread's current op, else the sweep

    @ref.setter
    def ref(self, value: str) -> None:
        self._local.ref = value

    def __getattr__(self, name: str):
        attr = getattr(self._c, name)
        if not callable(attr) or name.startswith("_"):
            return attr

        def call(*args, **kwargs):
            ref = self.ref
            self._live.calls_by_ref[ref] = self._live.calls_by_ref.get(ref, 0) + 1
            return attr(*args, **kwargs)
        return call


class SweepTracking:
    """Parent/child runs of one sweep. Picklable (Tune checkpoints the callbacks holding it);
    the client, the queue and the driver state are found again by the sweep folder.

    Trial runs are named by trial key. Every write goes through the outbox (outbox.py);
    reads happen at start, on resume and in the whole-sweep passes at the end."""

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
        self.sync_s = 0.0  # driver time in reads (the whole-sweep passes)
        self._client = None
        self._live: _Live | None = None

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_client"] = None
        state["_live"] = None
        state["fresh"] = False  # a restored driver looks runs up before creating them
        return state

    @property
    def live(self) -> _Live:
        if self._live is None:
            key = self.state_dir or f"memory-{id(self)}"
            if key not in _LIVE:
                live = _Live(Path(self.state_dir) if self.state_dir else None, self.fresh)
                from orchestration.track.outbox import Outbox

                journal = Path(self.state_dir) / QUEUE_FILE if self.state_dir else None
                live.outbox = Outbox(self._apply, journal, outage_s=self.outage_s)
                _LIVE[key] = live
            self._live = _LIVE[key]
        return self._live

    @property
    def client(self):
        if self._client is None:
            from mlflow.tracking import MlflowClient

            _quiet_http_env()
            self._client = _Counting(MlflowClient(self.uri), self.live)
        return self._client

    @property
    def logging_s(self) -> float:
        """Driver time in MLflow calls: the writer thread's and the reads'."""
        return self.live.outbox.busy_s + self.sync_s

    def release(self) -> None:
        """End of this driver's sweep: the writer stops, the files close."""
        key = self.state_dir or f"memory-{id(self)}"
        live = _LIVE.pop(key, None)
        if live is not None:
            live.outbox.close(timeout=0)
            if live._file is not None:
                try:
                    live._file.close()
                except OSError:  # a full disk: what it kept is what a resume reads
                    pass

    # ------------------------------------------------------------------ the queue

    def flush(self, timeout: float | None = None) -> bool:
        return self.live.outbox.flush(timeout)

    def given_up(self) -> bool:
        return self.live.outbox.given_up()

    def journal_failed(self) -> bool:
        """The sweep folder refused one of the driver's own writes (its journals)."""
        return (self.live.journal_error or self.live.outbox.journal_error) is not None

    def _put(self, op: dict) -> None:
        self.live.outbox.put(op)

    def _run_id(self, ref: str, replay: bool) -> str:
        if ref == PARENT:
            return self.parent_run_id
        live = self.live
        if ref not in live.runs:
            found = self._find_child(ref)
            if found is None:
                raise _NoRun(f"no run for trial {ref}")
            live.runs[ref] = found.info.run_id
        return live.runs[ref]

    def _apply(self, op: dict, replay: bool) -> None:
        """One queued write (runs in the outbox's writer thread)."""
        client = self.client
        ref = op["ref"]
        # A whole-sweep pass's writes (end-of-sweep TM backfill, model tags, closing runs left
        # open) are counted as the sweep's, not the trial's: they happen once, not per trial.
        client.ref = PARENT if op.get("sweep_pass") else ref
        do = op["do"]
        if do == "child":
            self._ensure_child(op, replay)
            return
        run_id = self._run_id(ref, replay)
        if do == "log":
            _log_batch(client, run_id, op.get("metrics", []), op.get("tags", []), op.get("params", []))
        elif do == "text":
            client.log_text(run_id, op["text"], op["name"])
        elif do == "file":
            if Path(op["path"]).is_file():
                client.log_artifact(run_id, op["path"])
        elif do == "describe":  # [mlflow_extras] dataset inputs, data report, bad_rows tag
            mlflow_extras.describe_run(client, run_id, op["config"])
        elif do == "status":
            client.update_run(run_id, status=op["status"])
        elif do == "end":
            client.set_terminated(run_id, status=op["status"])
        else:
            raise ValueError(f"unknown queued write {do}")

    def _ensure_child(self, op: dict, replay: bool) -> None:
        """Find (resume, replay) or create the trial's run; a found run gets whatever of its
        first writes it lacks (a run created just before the store went away has no config.yaml)."""
        from mlflow.entities import Param

        live, client, key = self.live, self.client, op["ref"]
        run_id = live.runs.get(key)
        found = None
        if run_id is None and (replay or not live.fresh):
            found = self._find_child(key)
            run_id = found.info.run_id if found is not None else None
        if run_id is None:
            run = client.create_run(self.experiment_id, run_name=key, tags=dict(op["tags"]))
            run_id = run.info.run_id
            live.runs[key] = run_id
            live.note({"run": key, "id": run_id})
            params = [Param(k, v) for k, v in op["params"]]
            for at in range(0, len(params), 100):  # log_batch takes at most 100 params per call
                client.log_batch(run_id, params=params[at:at + 100])
            client.log_text(run_id, op["config"], "config.yaml")
            return
        if key not in live.runs:
            live.runs[key] = run_id
            live.note({"run": key, "id": run_id})
        if found is None:
            found = client.get_run(run_id)
        if found.info.status != "RUNNING":
            client.update_run(run_id, status="RUNNING")
        if found.data.tags.get("trial_id") != op["tags"]["trial_id"]:
            client.set_tag(run_id, "trial_id", op["tags"]["trial_id"])
        have = set(found.data.params)
        missing = [Param(k, v) for k, v in op["params"] if k not in have]
        for at in range(0, len(missing), 100):
            client.log_batch(run_id, params=missing[at:at + 100])
        if "config.yaml" not in {a.path for a in client.list_artifacts(run_id)}:
            client.log_text(run_id, op["config"], "config.yaml")

    # ------------------------------------------------------------------ parent

    @classmethod
    def start(cls, uri: str, experiment: str, run_name: str, sweep_name: str,
              tags: dict[str, str], commit: str | None, state_dir: str | Path | None = None,
              outage_s: float = 180.0, view: dict | None = None) -> "SweepTracking":
        """`view`: the keyword arguments of mlflow_extras.save_runs_view (the table the link opens)."""
        from mlflow.tracking import MlflowClient

        _quiet_http_env()
        client = MlflowClient(uri)
        found = client.get_experiment_by_name(experiment)
        experiment_id = found.experiment_id if found else client.create_experiment(
            experiment, artifact_location=_artifact_location(uri, experiment))
        mlflow_extras.mark_experiment(client, experiment_id)  # [mlflow_extras] UI opens on model training
        if view:
            mlflow_extras.save_runs_view(client, experiment_id, **view)  # [mlflow_extras] the scores view
        all_tags = {"sweep": sweep_name, mlflow_extras.SWEEP_RUN_TAG: run_name, "role": "sweep",
                    **({"git_commit": commit} if commit else {}), **tags}
        source = mlflow_extras.source_tags(tags.get("sweep_file"), commit)  # [mlflow_extras]
        run = client.create_run(experiment_id, run_name=run_name, tags={**all_tags, **source})
        tracking = cls(uri, experiment_id, run.info.run_id, sweep_name, commit, state_dir, outage_s, fresh=True,
                       run_name=run_name)
        tracking.source_tags = source  # every trial run gets them too (pickled with the tracking)
        return tracking

    def log_parent_artifacts(self, files: dict[str, str]) -> None:
        """artifact name -> text."""
        for name, text in files.items():
            self._put({"do": "text", "ref": PARENT, "text": text, "name": name})

    def tag_parent(self, tags: dict[str, str]) -> None:
        self._put({"do": "log", "ref": PARENT, "tags": sorted(tags.items())})

    def describe_parent(self, base_config: dict[str, Any]) -> None:
        """The sweep's data as dataset inputs of the parent run too (its Dataset column)."""
        self._put({"do": "describe", "ref": PARENT, "config": base_config})

    def tag_trial(self, key: str, tags: dict[str, str]) -> None:
        """Tags a whole-sweep step puts on a trial's run (the model it logged): counted as the
        sweep's calls, not the trial's, as they happen once per sweep."""
        self._put({"do": "log", "ref": key, "tags": sorted(tags.items()), "sweep_pass": True})

    def log_parent(self, metrics: dict[str, float], tags: dict[str, str]) -> None:
        now = int(time.time() * SECONDS)
        self._put({"do": "log", "ref": PARENT, "metrics": [[k, v, now, 0] for k, v in metrics.items()],
                   "tags": sorted(tags.items())})

    def reopen_parent(self) -> None:
        self._put({"do": "status", "ref": PARENT, "status": "RUNNING"})

    def end_parent(self, status: str) -> None:
        self._put({"do": "end", "ref": PARENT, "status": status})

    # ------------------------------------------------------------------ children

    def _find_child(self, key: str):
        t0 = time.perf_counter()
        runs = self.client.search_runs(
            [self.experiment_id],
            filter_string=f"tags.`{PARENT_TAG}` = '{self.parent_run_id}' and tags.trial_key = '{key}'",
            max_results=5)
        self.sync_s += time.perf_counter() - t0
        return runs[0] if runs else None

    def start_trial(self, trial_config: dict[str, Any], trial_id: str) -> dict[str, Any]:
        """The trial's run (found by key on resume, else created) and its state. Idempotent
        within one driver: Tune announces a trial at start and with every result."""
        from mtbert.config import flatten

        live, key = self.live, trial_config["key"]
        t = live.trial(key, trial_config["seed"], trial_config["role"])
        if live.started.get(key) == trial_id:
            return t
        live.started[key] = trial_id
        t["status"] = "RUNNING"
        tags = {PARENT_TAG: self.parent_run_id, "sweep": self.sweep_name, "trial_key": key,
                "trial_id": trial_id, "variant": trial_config["variant"], "role": trial_config["role"],
                "seed": str(trial_config["seed"])}
        if self.run_name:  # [mlflow_extras] which sweep a row is, in the saved view
            tags[mlflow_extras.SWEEP_RUN_TAG] = self.run_name
        if self.commit:
            tags["git_commit"] = self.commit
        if trial_config.get(STANDS_FOR):  # a baseline that is also these searched points
            tags[STANDS_FOR] = ",".join(trial_config[STANDS_FOR])
        params = [[k, str(v)[:6000]] for k, v in sorted(flatten(trial_config["config"]).items())]
        # `mtbert train --config config.yaml` re-runs this trial exactly.
        config = yaml.safe_dump(trial_config["config"], sort_keys=False)
        # [mlflow_extras] the sweep's source on the run, then (a queued write of its own) its data
        tags.update(getattr(self, "source_tags", {}))
        self._put({"do": "child", "ref": key, "tags": tags, "params": params, "config": config})
        self._put({"do": "describe", "ref": key, "config": trial_config["config"]})
        if not t["history"] and not live.fresh and self.state_dir is None:
            t["history"] = self._history_from_mlflow(key)  # a resumed driver with no state log
        return t

    def log_epoch(self, key: str, result: dict[str, Any]) -> dict[str, float]:
        """One report: its figures at step=epoch and the node tags, in one write."""
        from mlflow.entities import Metric  # noqa: F401 - fail here, not in the writer thread

        from mtbert.figures import SUMMARY_KEY

        metrics = epoch_metrics(result)
        step = int(result["epoch"])
        live = self.live
        t = live.trial(key)
        t["history"][step] = metrics
        summary = result.get(SUMMARY_KEY)
        if isinstance(summary, dict):  # train()'s own word on its epochs so far
            t["summary"] = {k: float(v) for k, v in summary.items() if _number(v) is not None}
        live.note({"epoch": step, "key": key, "seed": t["seed"], "role": t["role"], "m": metrics,
                   "s": t.get("summary")})
        now = int(time.time() * SECONDS)
        op: dict[str, Any] = {"do": "log", "ref": key,
                              # [mlflow_extras] system/* keep MLflow's names (the run's System metrics tab)
                              "metrics": [[k if k.startswith(mlflow_extras.SYSTEM_PREFIX) else EPOCH_PREFIX + k,
                                           v, now, step] for k, v in metrics.items()]}
        node = (str(result.get("hostname", "")), str(result.get("node_ip", "")))
        if live.node.get(key) != node:  # tags only when they change: once per trial
            live.node[key] = node
            op["tags"] = [[k, v] for k, v in zip(("node", "node_ip"), node) if v]
        self._put(op)
        return metrics

    def history(self, key: str) -> dict[int, dict[str, float]]:
        return self.live.trial(key)["history"]

    def _history_from_mlflow(self, key: str) -> dict[int, dict[str, float]]:
        """Per-epoch figures as logged (latest value per step wins: re-run epochs replace)."""
        self.flush()
        t0 = time.perf_counter()
        found = self._find_child(key)
        out: dict[int, dict[str, tuple[int, float]]] = {}
        if found is not None:
            for name in found.data.metrics:
                if not name.startswith(EPOCH_PREFIX):
                    continue
                for m in self.client.get_metric_history(found.info.run_id, name):
                    slot = out.setdefault(int(m.step), {})
                    short = name[len(EPOCH_PREFIX):]
                    if short not in slot or m.timestamp >= slot[short][0]:
                        slot[short] = (m.timestamp, m.value)
        self.sync_s += time.perf_counter() - t0
        return {step: {k: v for k, (_, v) in row.items()} for step, row in out.items()}

    def retried(self, key: str, failures: int, error: str) -> None:
        self._put({"do": "log", "ref": key, "tags": [["retries", str(failures)], ["last_error", error[:5000]]]})

    def finish(self, trial_config: dict[str, Any], status: str, error: str | None = None,
               interrupted: str | None = None, train_log: str | None = None) -> dict[str, float]:
        """Final figures, TM-relative score (when its baseline is in), result.json, the tags
        and the run's end state: four queued writes, whatever the sweep's size.
        `interrupted` (why) marks a trial the user, a signal or an outage stopped: KILLED,
        resumable, never FINISHED."""
        live, key = self.live, trial_config["key"]
        t = live.trial(key, trial_config["seed"], trial_config["role"])
        live.started.pop(key, None)
        config = trial_config["config"]
        budget = int(config.get("train", {}).get("epochs", 0)) if "train" in config else 0
        history = t["history"]
        tags: dict[str, str] = {"interrupted": interrupted or "false"}
        final: dict[str, float] = {}
        metrics: list[list] = []
        now = int(time.time() * SECONDS)
        if history:
            final, basis = trial_figures(history, config, t.get("summary"))
            tags["tm_time_basis"] = basis
            tags["stopped_early"] = str(status == "FINISHED" and final["epochs_run"] < budget).lower()
            metrics = [[k, float(v), now, 0] for k, v in final.items()]
        else:
            tags["stopped_early"] = "false"
        if error:
            tags["error"] = error[:5000]
        t.update(final=final or None, status=status)
        live.note({"final": key, "seed": t["seed"], "role": t["role"], "status": status, "m": final})
        if status == "FINISHED" and final:
            for name, value in self._tm_scores(key).items():
                if name == "tags":
                    tags.update(value)
                else:
                    metrics.append([name, value, now, 0])
        self._put({"do": "log", "ref": key, "metrics": metrics, "tags": sorted(tags.items())})
        if final:
            payload = {"metrics": final, "epochs": [{"epoch": e, **history[e]} for e in sorted(history)],
                       "config": config, "trial_key": key, "status": status}
            self._put({"do": "text", "ref": key, "text": json.dumps(payload, indent=2, default=str),
                       "name": "result.json"})
        if train_log:
            self._put({"do": "file", "ref": key, "path": train_log})
        self._put({"do": "end", "ref": key, "status": status})
        if status == "FINISHED" and t["role"] == "baseline":
            for other in sorted(live.waiting.pop(t["seed"], set())):
                scores = self._tm_scores(other)
                tag_items = sorted(scores.pop("tags", {}).items())
                self._put({"do": "log", "ref": other, "tags": tag_items,
                           "metrics": [[k, v, now, 0] for k, v in scores.items()]})
        return final

    def _tm_scores(self, key: str) -> dict[str, Any]:
        """TM-relative scores of a finished trial against its same-seed baseline, from the
        driver's own record (no MLflow read); a trial whose baseline is not in yet waits."""
        live = self.live
        t = live.trials[key]
        base_key = next((k for k, b in live.trials.items() if b["role"] == "baseline"
                         and b["seed"] == t["seed"] and b["status"] == "FINISHED" and b["final"]), None)
        if base_key is None:
            live.waiting.setdefault(t["seed"], set()).add(key)
            return {}
        return tm_scores(t["final"], live.trials[base_key]["final"], live.runs.get(base_key, base_key))

    def close_open(self, reason: str, status: str = "KILLED") -> int:
        """Trials this driver started and never ended: marked (queued, so an outage keeps them)."""
        n = 0
        for key in sorted(self.live.started):
            self.live.started.pop(key)
            self.live.trials[key]["status"] = status
            self._put({"do": "log", "ref": key, "tags": [["interrupted", reason], ["stopped_early", "false"]]})
            self._put({"do": "end", "ref": key, "status": status})
            n += 1
        return n

    # ------------------------------------------------------------------ whole-sweep passes

    def children(self) -> list:
        """Every child run of the sweep: one paged search (run once per pass, never per trial)."""
        t0 = time.perf_counter()
        out, token = [], None
        while True:
            page = self.client.search_runs([self.experiment_id], filter_string=f"tags.`{PARENT_TAG}` = "
                                           f"'{self.parent_run_id}'", max_results=PAGE, page_token=token)
            out.extend(page)
            token = page.token
            if not token:
                break
        self.sync_s += time.perf_counter() - t0
        return out

    def close_open_children(self, status: str = "KILLED", runs: list | None = None) -> int:
        """No run is left RUNNING when a sweep ends, whatever ended it."""
        n = 0
        for run in runs if runs is not None else self.children():
            if run.info.status == "RUNNING":
                key = run.data.tags.get("trial_key", run.info.run_id)
                self.live.runs.setdefault(key, run.info.run_id)
                self._put({"do": "log", "ref": key, "sweep_pass": True, "tags": [
                    ["error", "the sweep ended before this trial did"], ["interrupted", "sweep ended"]]})
                self._put({"do": "end", "ref": key, "status": status, "sweep_pass": True})
                n += 1
        self.flush()
        return n

    def backfill_tm(self, final_pass: bool = False, runs: list | None = None) -> int:
        """Re-derive every TM-relative score from the final figures in MLflow, whatever the
        tags say (a resumed trial's figures change after its score was logged). Same-seed
        baseline first; in the final pass, the mean of finished baselines for trials whose
        own baseline failed. One read of the sweep; writes only what differs."""
        self.flush()
        runs = runs if runs is not None else self.children()
        runs = [r for r in runs if r.info.status == "FINISHED" and "overall" in r.data.metrics]
        baselines = {r.data.tags.get("seed"): r for r in runs
                     if r.data.tags.get("role") == "baseline" and "tm_time_s" in r.data.metrics}
        updated = 0
        now = int(time.time() * SECONDS)
        for run in runs:
            ref_run = baselines.get(run.data.tags.get("seed"))
            if ref_run is not None:
                reference, ref_name = ref_run.data.metrics, ref_run.info.run_id
            elif final_pass and baselines:
                reference = mean_reference([b.data.metrics for b in baselines.values()])
                ref_name = f"mean of {len(baselines)} baseline seeds"
            else:
                continue
            want = tm_scores(run.data.metrics, reference, ref_name)
            tags = want.pop("tags")
            stale = {k: v for k, v in want.items() if not _same(run.data.metrics.get(k), v)}
            stale_tags = {k: v for k, v in tags.items() if run.data.tags.get(k) != v}
            if not stale and not stale_tags:
                continue
            key = run.data.tags.get("trial_key", run.info.run_id)
            self.live.runs.setdefault(key, run.info.run_id)
            self._put({"do": "log", "ref": key, "metrics": [[k, v, now, 0] for k, v in stale.items()],
                       "tags": sorted(stale_tags.items()), "sweep_pass": True})
            updated += 1
        self.flush()
        return updated


def trial_figures(history: dict[int, dict[str, float]], config: dict[str, Any],
                  summary: dict[str, float] | None = None) -> tuple[dict[str, float], str]:
    """A trial's run metrics: train()'s summary of its epochs (else final_figures of the
    reported ones) plus the time and FLOPs its TM-relative scores are charged, and the time
    basis: what finish() logs, and what an adaptive sweep decides its claims on (searcher.py)."""
    budget = int(config.get("train", {}).get("epochs", 0)) if "train" in config else 0
    final = dict(summary) if summary else final_figures(history)
    final["tm_time_s"], basis = time_basis(final.get("train_time_s", math.nan), int(final["epochs_run"]), budget)
    if "train_flops" in final:
        final["tm_flops"] = time_basis(final["train_flops"], int(final["epochs_run"]), budget)[0]
    return final, basis


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


def _same(a: float | None, b: float) -> bool:
    return a is not None and math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


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


def _tag(key: str, value: str):
    from mlflow.entities import RunTag

    return RunTag(key, str(value))

