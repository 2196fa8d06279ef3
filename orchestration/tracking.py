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
  tags     mlflow.parentRunId, trial_key (stable across resumes), trial_id, variant, role,
           seed, node, node_ip, git_commit, stopped_early, tm_time_basis, tm_baseline, error
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
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from orchestration.errors import TrackingUnavailable
from orchestration.tm import mean_reference, time_basis, trial_tm

EPOCH_PREFIX = "epoch/"
PARENT_TAG = "mlflow.parentRunId"
# Keys Tune adds to every report; they are bookkeeping, not training figures.
TUNE_KEYS = {"training_iteration", "time_total_s", "episodes_total", "timesteps_total", "node_ip",
             "hostname", "pid", "time_this_iter_s", "timestamp", "date", "time_since_restore",
             "timesteps_since_restore", "iterations_since_restore", "config", "checkpoint_dir_name",
             "done", "trial_id", "should_checkpoint", "__duplicate__", "experiment_tag", "epoch"}
SECONDS = 1000  # MLflow timestamps are in milliseconds


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
    elif uri.startswith("sqlite:///"):
        folder = Path(uri[len("sqlite:///"):]).parent
        if not folder.is_dir():
            raise TrackingUnavailable(f"tracking store {uri}: folder {folder} does not exist")
    from mlflow.tracking import MlflowClient

    try:
        MlflowClient(uri).search_experiments(max_results=1)
    except Exception as exc:  # noqa: BLE001 - any failure here is "store unusable", said in one line
        raise TrackingUnavailable(f"tracking store {uri} unusable: {_reason(exc)}") from None


def git_commit(cwd: Path | None = None) -> str | None:
    """The commit of the code that runs the sweep (this package's checkout), if it is one."""
    cwd = cwd or Path(__file__).resolve().parents[1]
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


def final_figures(history: dict[int, dict[str, float]], metric_names: list[str]) -> dict[str, float]:
    """Best-epoch task scores and measurements, the same figures train() returns, computed
    from the reported epochs so that stopped trials (which never return) get them too."""
    epochs = sorted(history)

    def score(e: int) -> float:
        value = history[e].get("overall", float("nan"))
        return -math.inf if math.isnan(value) else value

    best = max(epochs, key=lambda e: (score(e), -e))  # the first epoch reaching the maximum
    last = history[epochs[-1]]
    final = {k: history[best][k] for k in (*metric_names, "overall", "overall_cs224n") if k in history[best]}
    final.update(best_epoch=best, epochs_run=epochs[-1],
                 peak_memory_mb=max(h.get("peak_memory_mb", 0.0) for h in history.values()))
    for key in ("train_time_s", "model_size_mb", "params_total", "params_trainable"):
        if key in last:
            final[key] = last[key]
    return final


class SweepTracking:
    """Parent/child runs of one sweep. Picklable (Tune checkpoints the callbacks holding it);
    the MLflow client is rebuilt on demand."""

    def __init__(self, uri: str, experiment_id: str, parent_run_id: str, sweep_name: str,
                 commit: str | None = None):
        self.uri = uri
        self.experiment_id = experiment_id
        self.parent_run_id = parent_run_id
        self.sweep_name = sweep_name
        self.commit = commit
        self.logging_s = 0.0  # time spent in MLflow calls (bench/orchestration.py reports it)
        self._client = None
        self._runs: dict[str, tuple[str, str]] = {}  # trial_key -> (run id, Tune trial id)

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_client"] = None
        state["_runs"] = {}  # a restored driver finds its runs again in MLflow
        return state

    @property
    def client(self):
        if self._client is None:
            from mlflow.tracking import MlflowClient

            _quiet_http_env()
            self._client = MlflowClient(self.uri)
        return self._client

    # ------------------------------------------------------------------ parent

    @classmethod
    def start(cls, uri: str, experiment: str, run_name: str, sweep_name: str,
              tags: dict[str, str], commit: str | None) -> "SweepTracking":
        from mlflow.tracking import MlflowClient

        client = MlflowClient(uri)
        found = client.get_experiment_by_name(experiment)
        experiment_id = found.experiment_id if found else client.create_experiment(
            experiment, artifact_location=_artifact_location(uri, experiment))
        all_tags = {"sweep": sweep_name, "role": "sweep", **({"git_commit": commit} if commit else {}), **tags}
        run = client.create_run(experiment_id, run_name=run_name, tags=all_tags)
        tracking = cls(uri, experiment_id, run.info.run_id, sweep_name, commit)
        tracking._client = client
        return tracking

    def log_parent_artifacts(self, files: dict[str, str]) -> None:
        """artifact name -> text."""
        for name, text in files.items():
            self.client.log_text(self.parent_run_id, text, name)

    def reopen_parent(self) -> None:
        self.client.update_run(self.parent_run_id, status="RUNNING")

    def end_parent(self, status: str) -> None:
        self.client.set_terminated(self.parent_run_id, status=status)

    # ------------------------------------------------------------------ children

    def _find_child(self, key: str):
        runs = self.client.search_runs(
            [self.experiment_id],
            filter_string=f"tags.`{PARENT_TAG}` = '{self.parent_run_id}' and tags.trial_key = '{key}'",
            max_results=5)
        return runs[0] if runs else None

    def child(self, trial_config: dict[str, Any], trial_id: str) -> tuple[str, bool]:
        """The run of a trial: found by its key (a resumed trial continues its run) or created.
        Returns (run id, created)."""
        key = trial_config["key"]
        if self._runs.get(key, (None, None))[1] == trial_id:
            return self._runs[key][0], False
        t0 = time.perf_counter()
        found = self._find_child(key)
        if found is not None:
            run_id = found.info.run_id
            if found.info.status != "RUNNING":
                self.client.update_run(run_id, status="RUNNING")
            if found.data.tags.get("trial_id") != trial_id:
                self.client.set_tag(run_id, "trial_id", trial_id)
            created = False
        else:
            run_id = self._create_child(trial_config, trial_id)
            created = True
        self._runs[key] = (run_id, trial_id)
        self.logging_s += time.perf_counter() - t0
        return run_id, created

    def _create_child(self, trial_config: dict[str, Any], trial_id: str) -> str:
        from mlflow.entities import Param
        from mtbert.config import flatten

        tags = {PARENT_TAG: self.parent_run_id, "sweep": self.sweep_name, "trial_key": trial_config["key"],
                "trial_id": trial_id, "variant": trial_config["variant"], "role": trial_config["role"],
                "seed": str(trial_config["seed"])}
        if self.commit:
            tags["git_commit"] = self.commit
        run = self.client.create_run(self.experiment_id, run_name=trial_config["key"], tags=tags)
        params = [Param(k, str(v)[:6000]) for k, v in sorted(flatten(trial_config["config"]).items())]
        for at in range(0, len(params), 100):  # log_batch takes at most 100 params per call
            self.client.log_batch(run.info.run_id, params=params[at:at + 100])
        # `mtbert train --config config.yaml` re-runs this trial exactly.
        self.client.log_text(run.info.run_id, yaml.safe_dump(trial_config["config"], sort_keys=False),
                             "config.yaml")
        return run.info.run_id

    def log_epoch(self, run_id: str, result: dict[str, Any]) -> dict[str, float]:
        from mlflow.entities import Metric

        metrics = epoch_metrics(result)
        step = int(result["epoch"])
        now = int(time.time() * SECONDS)
        t0 = time.perf_counter()
        batch = [Metric(EPOCH_PREFIX + k, v, now, step) for k, v in metrics.items()]
        self.client.log_batch(run_id, metrics=batch)
        node = {"node": str(result.get("hostname", "")), "node_ip": str(result.get("node_ip", ""))}
        self.client.log_batch(run_id, tags=[_tag(k, v) for k, v in node.items() if v])
        self.logging_s += time.perf_counter() - t0
        return metrics

    def history(self, run_id: str) -> dict[int, dict[str, float]]:
        """Per-epoch figures as logged (latest value per step wins: re-run epochs replace)."""
        t0 = time.perf_counter()
        run = self.client.get_run(run_id)
        out: dict[int, dict[str, tuple[int, float]]] = {}
        for key in run.data.metrics:
            if not key.startswith(EPOCH_PREFIX):
                continue
            for m in self.client.get_metric_history(run_id, key):
                slot = out.setdefault(int(m.step), {})
                name = key[len(EPOCH_PREFIX):]
                if name not in slot or m.timestamp >= slot[name][0]:
                    slot[name] = (m.timestamp, m.value)
        self.logging_s += time.perf_counter() - t0
        return {step: {k: v for k, (_, v) in row.items()} for step, row in out.items()}

    def finish(self, run_id: str, trial_config: dict[str, Any], history: dict[int, dict[str, float]],
               status: str, error: str | None = None) -> dict[str, float]:
        """Final figures, result.json, stopped_early and the run's end state, in one go."""
        from mlflow.entities import Metric
        from mtbert.tasks import get_task

        t0 = time.perf_counter()
        config = trial_config["config"]
        budget = int(config.get("train", {}).get("epochs", 0)) if "train" in config else 0
        tags: dict[str, str] = {}
        final: dict[str, float] = {}
        if history:
            names = [get_task(t).metric_name for t in config.get("tasks", [])]
            final = final_figures(history, names)
            tm_time, basis = time_basis(final.get("train_time_s", math.nan), int(final["epochs_run"]), budget)
            final["tm_time_s"] = tm_time
            tags["tm_time_basis"] = basis
            tags["stopped_early"] = str(status == "FINISHED" and final["epochs_run"] < budget).lower()
            now = int(time.time() * SECONDS)
            self.client.log_batch(run_id, metrics=[Metric(k, float(v), now, 0) for k, v in final.items()])
            self._log_result_json(run_id, trial_config, history, final, status)
        else:
            tags["stopped_early"] = "false"
        if error:
            tags["error"] = error[:5000]
        self.client.log_batch(run_id, tags=[_tag(k, v) for k, v in tags.items()])
        self.client.set_terminated(run_id, status=status)
        self.logging_s += time.perf_counter() - t0
        return final

    def _log_result_json(self, run_id: str, trial_config: dict, history: dict, final: dict, status: str) -> None:
        payload = {"metrics": final, "epochs": [{"epoch": e, **history[e]} for e in sorted(history)],
                   "config": trial_config["config"], "trial_key": trial_config["key"], "status": status}
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "result.json"
            path.write_text(json.dumps(payload, indent=2, default=str))
            self.client.log_artifact(run_id, str(path))

    def children(self) -> list:
        return self.client.search_runs([self.experiment_id],
                                       filter_string=f"tags.`{PARENT_TAG}` = '{self.parent_run_id}'",
                                       max_results=50000)

    def close_open_children(self, status: str = "KILLED") -> int:
        """No run is left RUNNING when a sweep ends, whatever ended it."""
        n = 0
        for run in self.children():
            if run.info.status == "RUNNING":
                self.client.set_tag(run.info.run_id, "error", "the sweep ended before this trial did")
                self.client.set_terminated(run.info.run_id, status=status)
                n += 1
        return n

    # ------------------------------------------------------------------ TM-relative score

    def backfill_tm(self, final_pass: bool = False) -> int:
        """Log tm_relative_score on every finished child that lacks an up-to-date one.
        Same-seed baseline first; in the final pass, the mean of finished baselines for
        trials whose own baseline failed. Returns how many runs were updated."""
        from mlflow.entities import Metric

        t0 = time.perf_counter()
        runs = [r for r in self.children() if r.info.status == "FINISHED" and "overall" in r.data.metrics]
        baselines = {r.data.tags.get("seed"): r for r in runs
                     if r.data.tags.get("role") == "baseline" and "tm_time_s" in r.data.metrics}
        updated = 0
        for run in runs:
            ref_run = baselines.get(run.data.tags.get("seed"))
            if ref_run is not None:
                reference, ref_name = ref_run.data.metrics, ref_run.info.run_id
            elif final_pass and baselines:
                reference = mean_reference([b.data.metrics for b in baselines.values()])
                ref_name = f"mean of {len(baselines)} baseline seeds"
            else:
                continue
            if run.data.tags.get("tm_baseline") == ref_name and "tm_relative_score" in run.data.metrics:
                continue
            score = trial_tm(run.data.metrics, reference)
            tags = [_tag("tm_baseline", ref_name)]
            if score is None:
                tags.append(_tag("tm_note", "undefined: baseline overall <= 0 or missing figures"))
            else:
                now = int(time.time() * SECONDS)
                self.client.log_batch(run.info.run_id, metrics=[Metric("tm_relative_score", score, now, 0)])
            self.client.log_batch(run.info.run_id, tags=tags)
            updated += 1
        self.logging_s += time.perf_counter() - t0
        return updated


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

