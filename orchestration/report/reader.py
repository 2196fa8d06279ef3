"""A sweep's runs and artifacts in an MLflow store, as report/ reads them.

    experiment_id, parent = find_sweep(uri, "smoke")          # the latest sweep with a finished trial
    runs = child_runs(uri, experiment_id, parent.info.run_id)  # its trial runs, as mlflow.search_runs' frame

An existing sqlite store is read with plain SQL over MLflow's own tables (read-only, never
created or migrated); any other store, or a sqlite schema the SQL reader does not know (said
in one line on stderr), goes through MLflow's client. Beside the runs: the parent's artifacts
(parent_artifact reads a small one, log_artifact writes one, both in place for a local
artifact folder), what the sweep's tags name (its tasks and task scores), column helpers on
the runs' frame (col, loss_weights), and the one "no such experiment" error.
"""
from __future__ import annotations

import math
import os
import sqlite3
import sys
import tempfile
import urllib.parse
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterator, Sequence

import pandas as pd

from mtbert.errors import first_line
from mtbert.tasks import TASKS
from orchestration.errors import SweepError
from orchestration.paths import fluent_tracking_uri, sqlite_path
from orchestration.sweep.labels import parse_param


def mlflow_client(uri: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(uri)


@contextmanager
def no_download_bar() -> Iterator[None]:
    """MLflow draws a download bar per file on stderr: off within this context, as before after."""
    before = os.environ.get(NO_BAR)
    os.environ[NO_BAR] = "false"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(NO_BAR, None)
        else:
            os.environ[NO_BAR] = before


NO_BAR = "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"


# A sqlite store is read with plain SQL over MLflow's own tables: MLflow has no public reader
# that is fast here. Importing mlflow and opening its SqlAlchemyStore cost about 2 s before the
# first row; mlflow.search_runs read 300 runs of a sweep in 4 s where the SQL takes 0.3 s, and
# builds a Run object per run (10,000 runs took about a minute).
MLFLOW_TABLES = ("experiments", "runs")  # what makes a sqlite file an MLflow store here
# MLflow's private schema as the SQL reader reads it: every column its queries name. Checked
# on each open (mlflow_sqlite), so a schema MLflow moves on from sends the reader to the API
# in one line rather than to wrong rows; a test checks it against the installed MLflow.
MLFLOW_SCHEMA = {
    "experiments": ("experiment_id", "name", "lifecycle_stage", "creation_time"),
    "runs": ("run_uuid", "name", "experiment_id", "status", "start_time", "end_time", "artifact_uri",
             "lifecycle_stage"),
    "tags": ("run_uuid", "key", "value"),
    "params": ("run_uuid", "key", "value"),
    "latest_metrics": ("run_uuid", "key", "value", "is_nan"),
}


def _is_sqlite_file(uri: str) -> bool:
    # A missing file goes to MLflow, which creates the store (a reader must not).
    path = sqlite_path(uri)
    return path is not None and Path(path).is_file()


def _connect(uri: str) -> sqlite3.Connection:
    """Read-only: a report never writes the store, not even a schema."""
    path = sqlite_path(uri) or ""
    if not Path(path).is_file():
        raise FileNotFoundError(path)
    # Quoted: a '?', '#' or '%' in the path would otherwise be read as part of the URI.
    return sqlite3.connect(f"file:{urllib.parse.quote(path)}?mode=ro", uri=True)


def mlflow_sqlite(uri: str) -> sqlite3.Connection:
    """A read-only connection to the store once its tables have every column of MLFLOW_SCHEMA
    (else sqlite3.DatabaseError naming what is missing, which callers answer through the API)."""
    con = _connect(uri)
    try:
        for table, columns in MLFLOW_SCHEMA.items():
            have = {row[1] for row in con.execute(f"PRAGMA table_info({table})")}
            missing = [c for c in columns if c not in have]
            if missing:
                raise sqlite3.DatabaseError(f"MLflow's {table} table has no {', '.join(missing)} column "
                                            "(a schema the SQL reader does not know)")
    except BaseException:
        con.close()
        raise
    return con


def _through_mlflow(uri: str, what: str, exc: BaseException) -> None:
    """One line on stderr when a sqlite store falls back to MLflow's API: slower, not wrong."""
    reason = first_line(exc, 200)
    print(f"leaderboard: the SQL reader failed on {uri} ({reason}); {what} through MLflow's API",
          file=sys.stderr)


def check_sqlite_store(uri: str) -> set[str]:
    """The store check of `mtbert leaderboard` for an existing sqlite file, without MLflow:
    it opens, and it has MLflow's tables (returned). One line when not (TrackingUnavailable)."""
    from orchestration.errors import TrackingUnavailable

    try:
        con = _connect(uri)
        try:
            tables = {row[0] for row in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        finally:
            con.close()
    except (sqlite3.Error, OSError) as exc:
        raise TrackingUnavailable(f"tracking store {uri} unusable: {exc}") from None
    missing = [t for t in MLFLOW_TABLES if t not in tables]
    if missing:
        raise TrackingUnavailable(f"tracking store {uri} unusable: not an MLflow store "
                                  f"(no {' or '.join(missing)} table); it is left as it is")
    return tables


def check_store_for_mlflow(uri: str) -> None:
    """What check_sqlite_store checks, and that MLflow can open the file without writing to it:
    its client creates (migrates) every table of its schema that a file lacks, so a store
    written by another MLflow version, or a file holding only tables of the same names, would
    be changed by a command that only reads. Tested against the installed MLflow
    (tests/test_bad_inputs.py), the one place its table list is read."""
    from orchestration.errors import TrackingUnavailable

    tables = check_sqlite_store(uri)
    from mlflow.store.db.base_sql_model import Base
    from mlflow.store.tracking import sqlalchemy_store  # noqa: F401 - registers the tables in Base

    lacking = sorted(set(Base.metadata.tables) - tables)
    if lacking:
        raise TrackingUnavailable(f"tracking store {uri} unusable: not a store of this MLflow (no "
                                  f"{', '.join(lacking[:3])}{' ...' if len(lacking) > 3 else ''} table); reading "
                                  f"it through MLflow would change it (`mlflow db upgrade` migrates a store "
                                  "of an older MLflow); it is left as it is")


def find_sweep(uri: str, experiment: str, sweep: str | None = None, say=None):
    """(experiment id, parent run) for a sweep: by run id or name, else the latest one with a
    finished trial (the latest of all when none has one), said in one line to `say` when
    given. An existing sqlite store is read with SQL, any other through MLflow."""
    if _is_sqlite_file(uri):
        try:
            return sqlite_find_sweep(uri, experiment, sweep, say)
        except sqlite3.Error as exc:  # a schema this reader does not know: the API
            _through_mlflow(uri, "finding the sweep", exc)
    return search_find_sweep(uri, experiment, sweep, say)


def _is_run_id(text: str) -> bool:
    return len(text) == 32 and all(c in "0123456789abcdef" for c in text)


def no_such_experiment(uri: str, experiment: str, names: Sequence[str] = ()) -> SweepError:
    """The one line for an experiment the store lacks, naming those it has (`names`)."""
    return SweepError(f"--experiment {experiment}: no such experiment in {uri}"
                      + (f" (have: {', '.join(names)})" if names else ""))


def experiments_named(client, uri: str, names: Sequence[str] | None = None) -> list:
    """The store's experiments (up to 1,000), only those `names` names when given; the first of
    `names` the store lacks is no_such_experiment, naming those it has."""
    found = client.search_experiments(max_results=1000)
    if not names:
        return found
    known = {e.name for e in found}
    missing = [name for name in names if name not in known]
    if missing:
        raise no_such_experiment(uri, missing[0], sorted(known))
    return [e for e in found if e.name in names]


def _latest_done(experiment: str, sweeps: list[tuple[Any, str, bool]], say) -> Any:
    """The newest of (run, name, has a finished trial), newest first, that has one (else the
    newest), and the line that says which and what it passed over."""
    pick = next((i for i, (_, _, done) in enumerate(sweeps) if done), 0)
    run, name, done = sweeps[pick]
    if say is not None:
        skipped = [n for _, n, _ in sweeps[:pick]]
        say(f"sweep {name}: the latest in '{experiment}' with finished trials"
            + (f", not the newer {', '.join(skipped)} (none finished)" if skipped else "")
            if done else f"sweep {name}: the latest in '{experiment}' (no sweep there has a finished trial)")
    return run


def search_find_sweep(uri: str, experiment: str, sweep: str | None = None, say=None):
    """find_sweep through MlflowClient: any store."""
    client = mlflow_client(uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        raise no_such_experiment(uri, experiment, [e.name for e in client.search_experiments(max_results=50)])
    flt = "tags.role = 'sweep'"
    if sweep:
        runs = client.search_runs([exp.experiment_id], f"{flt} and attributes.run_id = '{sweep}'", max_results=1) \
            if _is_run_id(sweep) else []
        runs = runs or client.search_runs([exp.experiment_id], f"{flt} and attributes.run_name = '{sweep}'",
                                          max_results=1)
        if not runs:
            raise SweepError(f"--sweep {sweep}: no sweep run with that id or name in experiment '{experiment}'")
        return exp.experiment_id, runs[0]
    runs = client.search_runs([exp.experiment_id], flt, order_by=["attributes.start_time DESC"], max_results=1000)
    if not runs:
        raise SweepError(f"--experiment {experiment}: holds no sweep runs yet")
    sweeps = []
    for run in runs:  # newest first, until one has a finished trial
        done = bool(client.search_runs([exp.experiment_id], f"tags.`mlflow.parentRunId` = '{run.info.run_id}' "
                                       "and attributes.status = 'FINISHED'", max_results=1))
        sweeps.append((run, run.info.run_name, done))
        if done:
            break
    return exp.experiment_id, _latest_done(experiment, sweeps, say)


def sqlite_find_sweep(uri: str, experiment: str, sweep: str | None = None, say=None):
    """search_find_sweep's answer from MLflow's sqlite tables, read-only, with its choices: the
    experiment by name whatever its lifecycle stage (get_experiment_by_name), the names listed
    as search_experiments lists them (active, newest first), active runs tagged role=sweep,
    newest start_time first, run id breaking ties (search_runs' order), a finished trial an
    active child run with status FINISHED."""
    con = mlflow_sqlite(uri)
    try:
        row = con.execute("SELECT experiment_id FROM experiments WHERE name = ?", (experiment,)).fetchone()
        if row is None:
            names = [r[0] for r in con.execute(
                "SELECT name FROM experiments WHERE lifecycle_stage = 'active' "
                "ORDER BY creation_time DESC, experiment_id ASC LIMIT 50")]
            raise no_such_experiment(uri, experiment, names)
        experiment_id = row[0]
        query = ("SELECT r.run_uuid, r.name, EXISTS (SELECT 1 FROM tags c JOIN runs cr ON cr.run_uuid = c.run_uuid "
                 "WHERE c.key = 'mlflow.parentRunId' AND c.value = r.run_uuid AND cr.status = 'FINISHED' "
                 "AND cr.lifecycle_stage = 'active') "
                 "FROM runs r JOIN tags t ON t.run_uuid = r.run_uuid AND t.key = 'role' "
                 "AND t.value = 'sweep' WHERE r.experiment_id = ? AND r.lifecycle_stage = 'active' {} "
                 "ORDER BY r.start_time DESC, r.run_uuid")
        if sweep:
            found = None
            if _is_run_id(sweep):
                found = con.execute(query.format("AND r.run_uuid = ?"), (experiment_id, sweep)).fetchone()
            found = found or con.execute(query.format("AND r.name = ?"), (experiment_id, sweep)).fetchone()
            if found is None:
                raise SweepError(f"--sweep {sweep}: no sweep run with that id or name in experiment '{experiment}'")
            run_id = found[0]
        else:
            sweeps = [(uuid, name, bool(done)) for uuid, name, done in
                      con.execute(query.format(""), (experiment_id,)).fetchall()]
            if not sweeps:
                raise SweepError(f"--experiment {experiment}: holds no sweep runs yet")
            run_id = _latest_done(experiment, sweeps, say)
        return str(experiment_id), _sqlite_run(con, run_id)
    finally:
        con.close()


def _sqlite_run(con: sqlite3.Connection, run_id: str) -> SimpleNamespace:
    """The parts of an mlflow.entities.Run that callers of find_sweep read (info.run_id,
    info.run_name, info.artifact_uri, data.tags, ...)."""
    run_uuid, name, experiment_id, status, start, end, artifact_uri, stage = con.execute(
        "SELECT run_uuid, name, experiment_id, status, start_time, end_time, artifact_uri, "
        "lifecycle_stage FROM runs WHERE run_uuid = ?", (run_id,)).fetchone()
    info = SimpleNamespace(run_id=run_uuid, run_name=name, experiment_id=str(experiment_id), status=status,
                           start_time=start, end_time=end, artifact_uri=artifact_uri, lifecycle_stage=stage)
    metrics = {key: math.nan if is_nan else float(value) for key, value, is_nan in con.execute(
        "SELECT key, value, is_nan FROM latest_metrics WHERE run_uuid = ?", (run_id,))}
    data = SimpleNamespace(tags=dict(con.execute("SELECT key, value FROM tags WHERE run_uuid = ?", (run_id,))),
                           params=dict(con.execute("SELECT key, value FROM params WHERE run_uuid = ?", (run_id,))),
                           metrics=metrics)
    return SimpleNamespace(info=info, data=data)


def child_runs(uri: str, experiment_id: str, parent_run_id: str, params: Sequence[str] | None = None,
               metrics: Sequence[str] | None = None, tags: Sequence[str] | None = None) -> pd.DataFrame:
    """The sweep's child runs as mlflow.search_runs' DataFrame (run_id, status, ...,
    metrics.*, params.*, tags.*). A sqlite store is read with SQL (sqlite_child_runs), keeping
    only the `params`, `metrics` and `tags` keys given; any other store, or a sqlite schema
    this reader does not know (said on stderr), goes through search_runs: every key."""
    if _is_sqlite_file(uri):
        try:
            return sqlite_child_runs(uri, experiment_id, parent_run_id, params, metrics, tags)
        except Exception as exc:  # noqa: BLE001 - an MLflow schema this reader does not know: the API
            _through_mlflow(uri, "reading the runs", exc)
    return search_child_runs(uri, experiment_id, parent_run_id)


def search_child_runs(uri: str, experiment_id: str, parent_run_id: str) -> pd.DataFrame:
    import mlflow

    from orchestration.track.tracking import SEED_RUNS

    with fluent_tracking_uri(uri):
        return mlflow.search_runs(experiment_ids=[experiment_id],
                                  filter_string=f"tags.`mlflow.parentRunId` = '{parent_run_id}' and {SEED_RUNS}",
                                  output_format="pandas", max_results=50000)


def _only(keys: Sequence[str] | None) -> tuple[str, tuple[str, ...]]:
    """SQL condition and arguments keeping the keys named, or starting with a name that ends
    in '.' (a prefix); no condition for None."""
    if keys is None:
        return "", ()
    names = [k for k in keys if not k.endswith(".")]
    prefixes = [k for k in keys if k.endswith(".")]
    terms = ([f"key IN ({', '.join('?' * len(names))})"] if names else []) + \
        ["substr(key, 1, ?) = ?"] * len(prefixes)
    args = (*names, *(x for k in prefixes for x in (len(k), k)))
    return f" AND ({' OR '.join(terms) or '0'})", args


def sqlite_child_runs(uri: str, experiment_id: str, parent_run_id: str, params: Sequence[str] | None = None,
                      metrics: Sequence[str] | None = None, tags: Sequence[str] | None = None) -> pd.DataFrame:
    """search_child_runs' DataFrame from MLflow's sqlite tables, read-only: active runs of the
    experiment whose mlflow.parentRunId tag is the sweep's (its trials', not its configurations'),
    in search_runs' order (start_time
    DESC, run id). `params`, `metrics` and `tags` keep only those keys (names, or prefixes
    ending in '.'): a run's 66 config params and per-epoch series were half the reading time."""
    import numpy as np

    from orchestration.track.view import CONFIGURATION

    con = mlflow_sqlite(uri)
    try:
        chosen = ("SELECT r.run_uuid FROM runs r JOIN tags p ON p.run_uuid = r.run_uuid "
                  "AND p.key = 'mlflow.parentRunId' AND p.value = ? "
                  "WHERE r.experiment_id = ? AND r.lifecycle_stage = 'active' AND NOT EXISTS (SELECT 1 FROM tags k "
                  "WHERE k.run_uuid = r.run_uuid AND k.key = 'role' AND k.value = ?)")
        args = (parent_run_id, int(experiment_id), CONFIGURATION)
        runs = pd.read_sql_query(
            "SELECT run_uuid AS run_id, experiment_id, status, artifact_uri, start_time, end_time FROM runs "
            f"WHERE run_uuid IN ({chosen}) ORDER BY start_time DESC, run_uuid", con, params=args)

        def read(table: str, columns: str, keys: Sequence[str] | None) -> pd.DataFrame:
            where, only = _only(keys)
            return pd.read_sql_query(f"SELECT {columns} FROM {table} WHERE run_uuid IN ({chosen}){where}",
                                     con, params=(*args, *only))

        metrics = read("latest_metrics", "run_uuid, key, value, is_nan", metrics)
        params = read("params", "run_uuid, key, value", params)
        tags = read("tags", "run_uuid, key, value", tags)
    finally:
        con.close()
    runs["experiment_id"] = runs["experiment_id"].astype(str)
    for name in ("start_time", "end_time"):
        runs[name] = pd.to_datetime(runs[name], unit="ms", utc=True)
    metrics["value"] = metrics["value"].astype(float).where(metrics["is_nan"] == 0, np.nan)
    index = pd.Index(runs["run_id"])

    def wide(long: pd.DataFrame, prefix: str, null) -> pd.DataFrame:
        if long.empty:
            return pd.DataFrame(index=index)
        table = long.pivot(index="run_uuid", columns="key", values="value").reindex(index)
        table.columns = [f"{prefix}{c}" for c in table.columns]
        return table if null is np.nan else table.astype(object).where(table.notna(), None)

    parts = [wide(metrics, "metrics.", np.nan), wide(params, "params.", None), wide(tags, "tags.", None)]
    return pd.concat([runs.set_index("run_id", drop=False), *parts], axis=1).reset_index(drop=True)


# --------------------------------------------------------------------------- the runs' frame

def col(df: pd.DataFrame, name: str) -> pd.Series:
    """A column of the runs' frame, all None where no run has it (MLflow leaves it out)."""
    return df[name] if name in df.columns else pd.Series([None] * len(df), index=df.index)


def loss_weights(params: dict[str, Any]) -> Any:
    """flatten() spreads a weight mapping over loss.weights.<task> params."""
    spread = {k[len("loss.weights."):]: v for k, v in params.items() if k.startswith("loss.weights.")}
    return {t: parse_param(v) for t, v in spread.items()} if spread else params.get("loss.weights")


def union_keys(*keys: tuple[list[str], ...]) -> tuple[list[str], ...]:
    """Key lists (params, metrics, tags) of several readers, merged: one child_runs read."""
    return tuple(list(dict.fromkeys(k for part in parts for k in part)) for parts in zip(*keys))


# --------------------------------------------------------------------------- the sweep's tags

def sweep_tasks(parent_tags: dict[str, str]) -> list[str]:
    """The tasks the sweep trained (its `tasks` tag)."""
    return [t for t in parent_tags.get("tasks", "sst,para,sts").split(",") if t]


def task_metrics(parent_tags: dict[str, str]) -> list[str]:
    """The sweep's task scores, its metric columns (`task_metrics` tag)."""
    # The sweep names its metric columns; sweeps from before that tag go by the registry.
    if "task_metrics" in parent_tags:
        return [m for m in parent_tags["task_metrics"].split(",") if m]
    return [TASKS[t].metric_name for t in sweep_tasks(parent_tags) if t in TASKS]


# --------------------------------------------------------------------------- artifacts

def local_artifact_dir(artifact_uri: str | None) -> Path | None:
    """The folder of a run's artifacts when they are local files (a plain path or a file: URI,
    turned into a path as MLflow's LocalArtifactRepository does on POSIX), else None."""
    if not artifact_uri:
        return None
    parsed = urllib.parse.urlparse(artifact_uri)
    if parsed.scheme == "file" and parsed.netloc in ("", "localhost"):
        return Path(urllib.parse.unquote(parsed.path))
    if parsed.scheme == "":
        return Path(urllib.parse.unquote(artifact_uri))
    return None


def parent_artifact(uri: str, parent, name: str) -> str | None:
    """A small text artifact of the parent run: read in place when local (no MLflow), else
    downloaded; None when the run has none."""
    folder = local_artifact_dir(getattr(parent.info, "artifact_uri", None))
    if folder is not None:
        path = folder / name
        return path.read_text() if path.is_file() else None
    try:
        with tempfile.TemporaryDirectory() as tmp, no_download_bar():
            return Path(mlflow_client(uri).download_artifacts(parent.info.run_id, name, tmp)).read_text()
    except Exception:  # noqa: BLE001 - MLflow raises its own kinds for a missing artifact
        return None


def log_artifact(uri: str, run, path: str | Path, name: str | None = None) -> None:
    """MlflowClient(uri).log_artifact(run id, path) as `name` (default: the file's own), without
    MLflow for local artifacts: for a local folder MLflow's artifact repository only copies the
    file in, through a temporary file it then renames, so a reader never sees half a file. Any
    other artifact store (a server's mlflow-artifacts:, S3, ...) goes through the client. An
    artifact of the same name is replaced."""
    import shutil

    name = name or Path(path).name
    folder = local_artifact_dir(getattr(run.info, "artifact_uri", None))
    if folder is None:
        with tempfile.TemporaryDirectory() as tmp:
            named = Path(tmp) / name
            shutil.copyfile(path, named)
            mlflow_client(uri).log_artifact(run.info.run_id, str(named))
        return
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / name
    if target.exists() and os.path.samefile(path, target):
        return
    fd, temp = tempfile.mkstemp(dir=folder, prefix=".artifact.uploading.")
    try:
        with os.fdopen(fd, "wb") as out, open(path, "rb") as src:
            shutil.copyfileobj(src, out)
        shutil.copystat(path, temp)
        os.replace(temp, target)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
