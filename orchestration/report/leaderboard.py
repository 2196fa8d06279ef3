"""The sweep as the papers print it (mops-tm-relative-score.txt, Tables 1 and 2).

    mtbert leaderboard --experiment smoke --format md

One row per configuration: its labels (regime: head regime, encoder sharing k and any other
swept or baseline key off its default; the learning rates that trained it, the encoder's and
the heads'; loss weights), best dev overall and its
epoch, the task scores at that epoch, train time, model size, peak memory and the TM-relative
scores. The baseline is marked * and pinned first. A configuration run under several seeds is
one row of mean ± 95% t-interval half-width (orchestration/stats.py), a count (the epoch) its
seeds' median and range, and Δ overall its difference to the baseline paired by seed: the
interval the verdicts take (verdicts.interval, the same as `mtbert findings` where a claim
makes the same comparison; delta_design says how, the caption says which). Each
column's best value is bold. The frozen reference (role `reference`) is labelled as such, and
the caption names the rows whose mean falls below it, task by task; a searched point identical
to the baseline, trained once as the baseline (plan.py), says so. The caption is a legend for
what the table shows, no more; below the table, each swept key's importance per figure
(importance.py), when it was computed from these runs. Runs come from MLflow: the child runs
of one sweep's parent run, by default the experiment's latest sweep with a finished trial.

Unlike the paper, on purpose: epochs are 1-based, model size is in MB, and TM-relative is the
ratio itself (the baseline scores 1.0), not multiplied by the baseline's overall score.

Two TM-relative scores, the sweep's headline (tracking.tm_score, tm.py) first: compute (counted
training FLOPs: the same on any machine, busy or not) and wall (measured train time). The same
configuration trained twice scored 1.000 and 0.609 on wall time on a loaded machine, so a row
whose train times differ by more than WALL_SPREAD is marked.

The Pareto plot puts overall against the headline score's cost on the full-epoch-budget basis
(tm.py), so trials ASHA stopped are not drawn as cheap.
"""
from __future__ import annotations

import json
import math
import os
import sqlite3
import sys
import urllib.parse
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterator, Sequence

import pandas as pd

from mtbert import figures
from mtbert.tasks import TASKS
from orchestration.errors import SweepError
from orchestration.paths import fluent_tracking_uri, sqlite_path
from orchestration.report import export
from orchestration.report.export import Cell
from orchestration.report import verdicts
from orchestration.stats import t_quantile
from orchestration.sweep.labels import (OWN_COLUMNS, RATE_KEYS, SINGLE_TASK, STANDS_FOR, YARDSTICKS, fmt_rates,
                                        fmt_weighting, parse_param, regime_label)

FORMATS = ("md", "csv", "latex", "html")
# The papers' names of the task scores; the other figures' headers: mtbert/figures.py.
TASK_LABELS = {"sst_acc": "SC acc.", "para_acc": "PD acc.", "sts_corr": "STS corr."}
DELTA_METRIC = "overall"  # the Δ-vs-baseline column: paired by seed
REFERENCE_LABEL = "frozen reference"
SINGLE_TASK_LABEL = "single-task"  # a single-task row's label: `single-task sst`
DELTA_M = "delta_m"  # Δm% vs the single-task runs: a default column where any row has it
TM_COLUMNS = {"compute": "tm_relative_score_compute", "wall": "tm_relative_score"}
# (max − min) / min of a configuration's train times (full-budget basis) above which its
# wall-clock TM score is marked as the machine's as much as the configuration's.
WALL_SPREAD = 0.20
WALL_MARK = "§"
ALSO_SEARCHED = "(also searched)"
REASON_CHARS = 60  # of a failed trial's reason in its row (the csv keeps 200, MLflow all of it)


@dataclass(frozen=True)
class Column:
    """A column of the printed table; `key` names it in the csv and in --columns."""
    key: str
    header: str
    fmt: str = ".3f"
    better: str = ""  # max | min: the column's best value is bold; "": no best (labels, the epoch, n)
    count: bool = False  # a whole number per run: its seeds' median and range, never mean ± interval


INTERVAL_LEAD = "Mean ± half-width of its 95% confidence interval over"  # the caption's first words, with seeds
LR_HEADER = "LR (enc. / heads)"  # sweep.labels.fmt_rates: the rates that trained the row
LABEL_COLUMNS = ("regime", "lr", "weights")  # a row's name, left-aligned; the regime column carries its marks
DELTA_COLUMN = f"{DELTA_METRIC}_delta"
DELTA = Column(DELTA_COLUMN, f"Δ {DELTA_METRIC} vs *", "+.3f", better="max")
N = Column("n", "n")


def figure_columns(task_metrics: Sequence[str]) -> dict[str, Column]:
    """The figures the table reads from a sweep's runs (task scores `task_metrics`), in order.
    A count (the epoch) has a direction to sort by but no best to bold."""
    return {f.name: Column(f.name, TASK_LABELS.get(f.name, f.label), f.fmt, "" if f.count else f.better, f.count)
            for f in figures.on_board(task_metrics)}


# --------------------------------------------------------------------------- the Δ column's design

# How the Δ column takes its intervals, a parent tag the sweep writes at its start
# (delta_design_tag), so that the table needs no artifact and no sweep file.
DELTA_TAG = "delta_design"


@dataclass(frozen=True)
class DeltaDesign:
    """The Δ column's intervals as the verdicts take them: over the seeds' looks (None: a fixed
    design), by the sweep's interval method, at 95% per comparison, except where a claim of the
    sweep makes the same comparison: there at the claim's level (its share of the table's
    family) with its chance level, so the cell is the claim's interval (A − B or B − A)."""
    looks: tuple[int, int] | None = None
    method: str = "median"
    claims: dict[str, tuple[float, float | None]] = None  # variant -> (alpha, chance)

    def of(self, variant: str) -> tuple[float, float | None]:
        return (self.claims or {}).get(variant, (verdicts.ALPHA, None))


def delta_design_tag(claims: Sequence[Any], configs: Sequence[Any], looks: tuple[int, int] | None,
                     method: str) -> str:
    """DELTA_TAG's value for a sweep: its claims (with their looks and verdicts settings) and
    planned configurations (claims.configurations). A claim whose side is found only as the
    sweep runs (an Optuna point) leaves its comparison at 95%."""
    from orchestration.sweep.claims import pick

    found: dict[str, tuple[float, float | None]] = {}
    for claim, alpha in zip(claims, verdicts.claim_alphas(claims)):
        a, b = pick(list(configs), claim.a), pick(list(configs), claim.b)
        if claim.metric != DELTA_METRIC or len(a) != 1 or len(b) != 1:
            continue
        roles = {a[0].role, b[0].role}
        if "baseline" not in roles or a[0].variant == b[0].variant:
            continue
        other = b[0] if a[0].role == "baseline" else a[0]
        if other.variant not in found or alpha < found[other.variant][0]:  # two claims: the narrower level
            found[other.variant] = (alpha, claim.chance)
    return json.dumps({"looks": list(looks) if looks else None, "method": method,
                       "claims": {v: list(x) for v, x in found.items()}}, separators=(",", ":"))


def delta_design(parent_tags: dict[str, str]) -> DeltaDesign:
    """The sweep's DELTA_TAG; a sweep logged before it: median intervals over the looks its
    `seeds` tag names ("adaptive 3..12"), no claim."""
    raw = parent_tags.get(DELTA_TAG)
    if raw:
        doc = json.loads(raw)
        return DeltaDesign(tuple(doc["looks"]) if doc.get("looks") else None, doc.get("method", "median"),
                           {v: (float(a), c) for v, (a, c) in doc.get("claims", {}).items()})
    seeds = parent_tags.get("seeds", "")
    if seeds.startswith("adaptive ") and ".." in seeds:  # "adaptive 3..12", or extended "adaptive 3..12..20"
        start, *maxima = (int(x) for x in seeds.removeprefix("adaptive ").split(".."))
        return DeltaDesign((max(start, 2), *maxima))
    return DeltaDesign()


# --------------------------------------------------------------------------- reading MLflow

def _client(uri: str):
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
    """Read-only: the leaderboard never writes the store, not even a schema."""
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
    reason = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
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


def _no_experiment(uri: str, experiment: str, names: list[str]) -> SweepError:
    return SweepError(f"--experiment {experiment}: no such experiment in {uri}"
                      + (f" (have: {', '.join(names)})" if names else ""))


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
    client = _client(uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        raise _no_experiment(uri, experiment, [e.name for e in client.search_experiments(max_results=50)])
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
            raise _no_experiment(uri, experiment, names)
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


# --------------------------------------------------------------------------- the table

def _col(df: pd.DataFrame, name: str) -> pd.Series:
    return df[name] if name in df.columns else pd.Series([None] * len(df), index=df.index)


def _weights(params: dict[str, Any]) -> Any:
    """flatten() spreads a weight mapping over loss.weights.<task> params."""
    spread = {k[len("loss.weights."):]: v for k, v in params.items() if k.startswith("loss.weights.")}
    return {t: parse_param(v) for t, v in spread.items()} if spread else params.get("loss.weights")


def _status(runs: pd.DataFrame) -> pd.Series:
    """finished | failed | interrupted (KILLED by a signal, an outage or the sweep's end)."""
    status = _col(runs, "status")
    interrupted = _col(runs, "tags.interrupted").fillna("false") != "false"
    out = pd.Series("other", index=runs.index)
    out[status == "FINISHED"] = "finished"
    out[status == "FAILED"] = "failed"
    out[(status == "KILLED") | ((status != "FINISHED") & (status != "FAILED") & interrupted)] = "interrupted"
    return out


def _ci95(std: pd.Series, count: pd.Series) -> pd.Series:
    """95% t-interval half-widths from a column's seed std and count (NaN where n < 2): the
    quantile of stats.t_quantile, looked up once per distinct n, not once per row."""
    n = count.astype(float)
    quantile = {k: t_quantile(int(k) - 1) for k in n.unique() if k > 1}
    return n.map(quantile) * std / n.pow(0.5)


DELTA_PARTS = ("delta", "low", "high", "n", "alpha")  # the Δ column's csv columns: <metric>_delta[_part]


def _paired_deltas(done: pd.DataFrame, metric: str, design: DeltaDesign) -> pd.DataFrame:
    """Per variant: the interval of metric − the baseline's metric paired by seed, as the
    verdicts take it (verdicts.interval, the runs tagged diverged and those the claim's chance
    level calls diverged left out): its centre, low, high, n and alpha."""
    out = pd.DataFrame(index=pd.Index(done["variant"].unique(), name="variant"), columns=list(DELTA_PARTS),
                       dtype=float)
    base = done[done["role"] == "baseline"]
    if base.empty or metric not in done:
        return out
    # A seed run twice (a resume that double-logged) counts once, as its mean; a NaN is no pair.
    per_seed = done.pivot_table(index="variant", columns="seed", values=metric, aggfunc="mean")
    base_seed = base.groupby("seed")[metric].mean().dropna().to_dict()
    tagged = done[done["diverged"] != ""].groupby("variant")["seed"].agg(set).to_dict()
    base_gone = set().union(*(tagged.get(v, set()) for v in base["variant"].unique()))
    # Plain rows and one assignment: a Series and a .loc write per variant took seconds at
    # 5,000 configurations.
    seeds = list(per_seed.columns)
    found = []
    for variant, row in zip(per_seed.index, per_seed.to_numpy().tolist()):
        alpha, chance = design.of(variant)
        a = {s: v for s, v in zip(seeds, row) if not math.isnan(v)}
        gone = tagged.get(variant, set()) | base_gone | set(verdicts.diverged(a, chance)) \
            | set(verdicts.diverged(base_seed, chance))
        iv = verdicts.interval(a, base_seed, design.looks, alpha, design.method, skip=gone)
        found.append((iv.centre, iv.low, iv.high, iv.n, alpha))
    if found:
        out.loc[per_seed.index] = pd.DataFrame(found, index=per_seed.index, columns=out.columns, dtype=float)
    return out


def _tasks(parent_tags: dict[str, str]) -> list[str]:
    return [t for t in parent_tags.get("tasks", "sst,para,sts").split(",") if t]


def _task_metrics(parent_tags: dict[str, str]) -> list[str]:
    # The sweep names its metric columns; sweeps from before that tag go by the registry.
    if "task_metrics" in parent_tags:
        return [m for m in parent_tags["task_metrics"].split(",") if m]
    return [TASKS[t].metric_name for t in _tasks(parent_tags) if t in TASKS]


def _swept(parent_tags: dict[str, str]) -> list[str]:
    """The keys a row's label may name: the space's, then the baseline's own overrides."""
    keys = parent_tags.get("space_keys", "").split(",") + parent_tags.get("baseline_keys", "").split(",")
    return list(dict.fromkeys(k for k in keys if k))


def _label_params(swept: list[str]) -> dict[str, list[str]]:
    """The params each label column is made of (a name ending in '.' is a prefix); the regime
    names the swept keys that have no column of their own."""
    return {"regime": ["sharing.head_regime", "sharing.encoder_shared_layers",
                       *[k for k in swept if k not in OWN_COLUMNS]],
            "lr": list(RATE_KEYS),
            "weights": ["loss.weighting", "loss.pcgrad", "loss.weights", "loss.weights."]}


# The tags build_table and _status read (tags.<name>).
TABLE_TAGS = ["variant", "role", "seed", "stopped_early", "interrupted", "error", "diverged", "device", STANDS_FOR]


def table_keys(parent_tags: dict[str, str]) -> tuple[list[str], list[str], list[str]]:
    """(params, metrics, tags) build_table reads of a sweep's runs: child_runs needs no others."""
    params = [k for keys in _label_params(_swept(parent_tags)).values() for k in keys]
    return list(dict.fromkeys(params)), list(figure_columns(_task_metrics(parent_tags))), list(TABLE_TAGS)


def _union(*keys: tuple[list[str], ...]) -> tuple[list[str], ...]:
    """Key lists (params, metrics, tags) of several readers, merged: one child_runs read."""
    return tuple(list(dict.fromkeys(k for part in parts for k in part)) for parts in zip(*keys))


def _labels(runs: pd.DataFrame, keys: list[str], make) -> list[str]:
    """make(params) for each run, params being the run's values of `keys` (MLflow strings; a
    param the run lacks is absent). Computed once per distinct set of values."""
    cols = [c for c in runs.columns if c.startswith("params.")
            and any(c[len("params."):] == k or (k.endswith(".") and c[len("params."):].startswith(k)) for k in keys)]
    cache: dict[tuple, str] = {}
    out = []
    rows = runs[cols].itertuples(index=False, name=None) if cols else [()] * len(runs)
    for values in rows:
        if values not in cache:
            # Columns are the union over runs: a param this run lacks reads as NaN or None.
            cache[values] = make({c[len("params."):]: v for c, v in zip(cols, values) if isinstance(v, str)})
        out.append(cache[values])
    return out


def build_table(runs: pd.DataFrame, parent_tags: dict[str, str]) -> pd.DataFrame:
    """One row per configuration (finished seeds grouped; numeric columns carry _std, _ci95
    and n, a count its _median, _min and _max; the delta metric carries <metric>_delta and
    its _delta_low, _delta_high, _delta_n and _delta_alpha, paired by seed against the
    baseline as the verdicts pair it), then one row per failed
    or interrupted trial with its one-line reason. Vectorised: 10,000 runs build in seconds."""
    from mtbert.config import Config, flatten

    if runs.empty:
        return pd.DataFrame()
    runs = runs.assign(_status=_status(runs))
    runs = runs[runs["_status"] != "other"]
    if not (runs["_status"] == "finished").any():
        return pd.DataFrame()
    tasks = _tasks(parent_tags)
    task_metrics = _task_metrics(parent_tags)
    swept = _swept(parent_tags)
    defaults = flatten(Config())
    groups = _label_params(swept)
    regime = _labels(runs, groups["regime"], lambda p: regime_label(p, swept, defaults))
    lr = _labels(runs, groups["lr"], fmt_rates)
    weights = _labels(runs, groups["weights"], lambda p: fmt_weighting(p.get("loss.weighting"), _weights(p), tasks,
                                                                          p.get("loss.pcgrad")))
    error = _col(runs, "tags.error").fillna("").astype(str).str.split("\n").str[0].str.slice(0, 200)
    frame = pd.DataFrame({
        "variant": _col(runs, "tags.variant").values, "role": _col(runs, "tags.role").values,
        "seed": _col(runs, "tags.seed").values, "regime": regime, "lr": lr, "weights": weights,
        "stopped_early": (_col(runs, "tags.stopped_early") == "true").values,
        "status": runs["_status"].values, "reason": error.values,
        STANDS_FOR: _col(runs, f"tags.{STANDS_FOR}").astype(object).fillna("").values,
        "diverged": _col(runs, "tags.diverged").astype(object).fillna("").values,
    })
    numeric = list(figure_columns(task_metrics))
    for name in numeric:
        frame[name] = pd.to_numeric(_col(runs, f"metrics.{name}"), errors="coerce").values
    done = frame[frame["status"] == "finished"]
    grouped = done.groupby("variant", sort=False)
    table = grouped[["variant", "role", "regime", "lr", "weights"]].first().reset_index(drop=True)
    table["n"] = grouped.size().values
    table["stopped_early"] = grouped["stopped_early"].sum().astype(int).values
    means = grouped[numeric].mean()
    stds = grouped[numeric].std(ddof=1)
    seeds = grouped[numeric].count()
    for name in numeric:
        table[name] = means[name].values
        table[f"{name}_std"] = stds[name].where(seeds[name] > 1).values
        table[f"{name}_ci95"] = _ci95(stds[name], seeds[name]).values
    for name in numeric:
        # For a count (a whole number per run) the table shows these, not 1.5 ± 6.4 epochs; the
        # lower median is a value some seed took (epoch 2 of seeds at 2 and 3, not 2.5).
        table[f"{name}_median"] = grouped[name].quantile(0.5, interpolation="lower").values
        table[f"{name}_min"] = grouped[name].min().values
        table[f"{name}_max"] = grouped[name].max().values
    # The full-budget basis, so a trial ASHA stopped is compared at the time its budget would take.
    time = frame["tm_time_s"].where(frame["tm_time_s"].notna(), frame["train_time_s"]).loc[done.index]
    by = time.groupby(done["variant"], sort=False)
    low, runs_timed = by.min(), by.count()
    spread = (by.max() / low - 1).where((runs_timed > 1) & (low > 0))
    table["wall_time_spread"] = spread.reindex(table["variant"]).values
    design = delta_design(parent_tags)
    deltas = _paired_deltas(done, DELTA_METRIC, design).reindex(table["variant"])
    delta_columns = [DELTA_COLUMN, *(f"{DELTA_COLUMN}_{part}" for part in DELTA_PARTS[1:])]
    table[delta_columns] = deltas[list(DELTA_PARTS)].values
    table.loc[table["role"] == "baseline", delta_columns] = math.nan
    table["status"] = "finished"
    table["reason"] = ""
    table[STANDS_FOR] = grouped[STANDS_FOR].first().values
    rest = frame[frame["status"] != "finished"]
    if not rest.empty:
        # One run each: no interval, no pairing; a count's median and range are its value.
        rest = rest.assign(n=1, stopped_early=0, **{f"{name}_{stat}": rest[name] for name in numeric
                                                     for stat in ("median", "min", "max")})
        table = pd.concat([table, rest.reindex(columns=table.columns)], ignore_index=True)
    table.loc[table["role"] == "reference", "regime"] = REFERENCE_LABEL
    single = table["role"] == SINGLE_TASK
    table.loc[single, "regime"] = SINGLE_TASK_LABEL + " " + table.loc[single, "variant"].str.removeprefix("single-")
    # Where the finished runs trained (cpu, cuda (<GPU>)): what their peak memory counts.
    table.attrs["devices"] = sorted(set(_col(runs, "tags.device")[runs["_status"] == "finished"].dropna().astype(str)))
    table.attrs["task_metrics"] = task_metrics
    table.attrs["tasks"] = tasks
    table.attrs["tm_score"] = tm_choice(parent_tags, runs)
    table.attrs["delta_design"] = design
    return table


def tm_choice(parent_tags: dict[str, str], runs: pd.DataFrame) -> str:
    """compute | wall: the sweep's tracking.tm_score. A sweep logged before that tag: compute
    when its runs carry the compute score, else wall."""
    choice = parent_tags.get("tm_score")
    if choice in TM_COLUMNS:
        return choice
    compute = f"metrics.{TM_COLUMNS['compute']}"
    return "compute" if compute in runs.columns and bool(runs[compute].notna().any()) else "wall"


def headline_tm(parent_tags: dict[str, str], runs: pd.DataFrame) -> str:
    return TM_COLUMNS[tm_choice(parent_tags, runs)]


def tm_column(table: pd.DataFrame) -> str:
    """The column of the headline TM-relative score of the sweep a table was built from."""
    return TM_COLUMNS[table.attrs.get("tm_score", "compute")]


def tm_columns(table: pd.DataFrame) -> list[str]:
    """The headline TM column, then the other where any row has it (a store may lack compute)."""
    head = tm_column(table)
    other = next(c for c in TM_COLUMNS.values() if c != head)
    return [head, *([other] if other in table.columns and bool(table[other].notna().any()) else [])]


def sort_table(table: pd.DataFrame, key: str = "overall") -> pd.DataFrame:
    """Baseline first, finished configurations by `key` (`tm` = the sweep's chosen TM score),
    failed and interrupted trials last."""
    if table.empty:
        return table
    if key == "tm":
        key = tm_column(table)
    if key not in table.columns:
        known = [c for c in table.columns if not c.endswith(("_std", "_ci95"))]
        raise SweepError(f"--sort {key}: not a column; choose from tm, {', '.join(known)}")
    # wall_time_spread: the table's own measure of how far a configuration's train times differ.
    lower = key == "wall_time_spread" or figures.better(key) == "min"
    finished = table["status"] == "finished"
    base = table[finished & (table["role"] == "baseline")]
    rest = table[finished & (table["role"] != "baseline")]
    rest = rest.sort_values(key, ascending=lower or table[key].dtype == object, na_position="last")
    out = pd.concat([base, rest, table[~finished]], ignore_index=True)
    out.attrs.update(table.attrs)
    return out


def _cell(r: dict, c: Column) -> Cell:
    """A label; else mean ± 95% CI half-width (a single seed, or no spread to estimate: the
    mean alone); the Δ column the median (or mean) of the paired differences, its interval
    (delta_cell) and the seeds paired; a count its median and range."""
    if c.key == "regime":
        return Cell(_row_label(r))
    if c.key in LABEL_COLUMNS:
        return Cell(str(r[c.key]))
    value = r.get(c.key, math.nan)
    if pd.isna(value):
        return Cell("–")
    if c.key == DELTA_COLUMN:
        return delta_cell(value, *(r.get(f"{DELTA_COLUMN}_{part}", math.nan) for part in DELTA_PARTS[1:]), c.fmt)
    if c.key == "n":
        return Cell(str(int(value)))
    if c.count:
        median = r.get(f"{c.key}_median", value)
        low, high = r.get(f"{c.key}_min", median), r.get(f"{c.key}_max", median)
        return Cell(f"{median:g}", "" if pd.isna(low) or low == high else f"({low:g}–{high:g})")
    half = r.get(f"{c.key}_ci95", math.nan)
    return Cell(f"{value:{c.fmt}}", "" if int(r["n"]) < 2 or pd.isna(half) else f"± {half:{c.fmt}}")


def delta_cell(centre: float, low: float, high: float, n: float, alpha: float, fmt: str = DELTA.fmt) -> Cell:
    """`+0.006 [−0.007, +0.019] (n=9)`: the interval as `mtbert findings` prints it, its level
    named where it is not 95% (a claim's share of the family), n alone where there is none."""
    level = "" if pd.isna(alpha) or math.isclose(alpha, verdicts.ALPHA) else f" {1 - alpha:.2%}"
    bounds = "" if pd.isna(low) else f"[{low:{fmt}}, {high:{fmt}}]{level} "
    return Cell(f"{centre:{fmt}}", f"{bounds}(n={int(n)})")


def all_columns(table: pd.DataFrame) -> dict[str, Column]:
    """Every column the printed table can show, by key, in the order it shows them."""
    tasks = table.attrs.get("tasks", ["sst", "para", "sts"])
    labels = {"regime": Column("regime", "Regime"), "lr": Column("lr", LR_HEADER),
              "weights": Column("weights", f"w [{' '.join(tasks)}]")}
    columns = figure_columns(table.attrs.get("task_metrics", []))
    tms = [k for k in dict.fromkeys([*tm_columns(table), *TM_COLUMNS.values()]) if k in columns]
    shown: list[Column] = []
    for key, column in columns.items():  # as declared, but:
        if key in tms:  # the TM scores together where the first is, the sweep's headline first
            shown += [] if any(c.key in tms for c in shown) else [columns[k] for k in tms]
        else:
            shown += [column, DELTA] if key == DELTA_METRIC else [column]
    return {**labels, **{c.key: c for c in shown}, N.key: N}


def _varies(table: pd.DataFrame, key: str) -> bool:
    return key in table.columns and table[key].astype(str).nunique() > 1


def default_columns(table: pd.DataFrame, fmt: str = "md") -> list[str]:
    """The paper's columns (the sweep's headline TM score first; n when seeds are grouped).
    LaTeX, a page wide at most, keeps the headline TM score only, and a label column or n only
    where rows differ in it (the caption states the value they share)."""
    grouped = bool((table["n"] > 1).any()) if not table.empty else False
    with_delta = DELTA_COLUMN in table.columns and bool(table[DELTA_COLUMN].notna().any())
    narrow = fmt == "latex"
    labels = [k for k in ("lr", "weights") if not narrow or _varies(table, k)]
    tms = tm_columns(table)[:1] if narrow else tm_columns(table)
    n = ["n"] if grouped and (not narrow or _varies(table, "n")) else []
    figs = [f.name for f in figures.on_board(table.attrs.get("task_metrics", []))
            if f.board == "shown" and f.name not in TM_COLUMNS.values()]
    figs = [k for key in figs for k in ([key, DELTA_COLUMN] if key == DELTA_METRIC and with_delta else [key])]
    if DELTA_M in table.columns and bool(table[DELTA_M].notna().any()):  # the sweep ran single-task rows
        figs.insert(figs.index(DELTA_COLUMN if DELTA_COLUMN in figs else DELTA_METRIC) + 1, DELTA_M)
    return ["regime", *labels, *figs, *tms, *n]


def chosen_columns(table: pd.DataFrame, columns: Sequence[str] | None = None, fmt: str = "md") -> list[Column]:
    """`columns` (keys, as --columns names them; default_columns when None): the row's name
    (regime) always first, the other label columns next, the figures in the order given."""
    known = all_columns(table)
    keys = default_columns(table, fmt) if columns is None else list(columns)
    unknown = [k for k in keys if k not in known]
    if unknown:
        raise SweepError(f"--columns {unknown[0]}: not a column of this table; choose from {', '.join(known)}")
    labels = [k for k in keys if k in LABEL_COLUMNS and k != "regime"]
    return [known[k] for k in dict.fromkeys(["regime", *labels, *(k for k in keys if k not in LABEL_COLUMNS)])]


def _row_label(r: dict) -> str:
    label = r["regime"] + ("*" if r["role"] == "baseline" else "")
    if r.get(STANDS_FOR):
        label += f" {ALSO_SEARCHED}"
    if r["stopped_early"]:
        label += " †"
    if r.get("wall_time_spread", 0) > WALL_SPREAD:  # NaN (one run) compares False
        label += f" {WALL_MARK}"
    if r["status"] == "interrupted":
        label += " ‡"
    elif r["status"] == "failed":
        reason = r["reason"] or "failed"
        label += f" ✗ ({reason if len(reason) <= REASON_CHARS else reason[:REASON_CHARS - 1] + '…'})"
    return label


def _bold(table: pd.DataFrame, rows: list[list[Cell]], columns: list[Column]) -> bool:
    """Bold the best value of each column with a direction (its shown digits: ties are all
    bold) among the finished configurations, the frozen reference aside (a yardstick, not a
    contender); not where fewer than two compete or all show the same. True if any is bold."""
    candidates = ((table["status"] == "finished") & ~table["role"].isin(YARDSTICKS)).to_numpy()
    any_bold = False
    for j, c in enumerate(columns):
        if not c.better or c.key not in table.columns:
            continue
        column = pd.to_numeric(table[c.key], errors="coerce").to_numpy(dtype=float)
        values = {i: float(column[i]) for i in candidates.nonzero()[0] if not math.isnan(column[i])}
        shown = {i: rows[i][j].text for i in values}
        if len(values) < 2 or len(set(shown.values())) < 2:
            continue
        pick = max if c.better == "max" else min
        best = shown[pick(values, key=values.get)]
        for i, text in shown.items():
            if text == best:
                rows[i][j] = replace(rows[i][j], bold=True)
                any_bold = True
    return any_bold


def display_rows(table: pd.DataFrame, columns: Sequence[str] | None = None, fmt: str = "md"
                 ) -> tuple[list[Column], list[list[Cell]], bool]:
    """The columns shown, each row's cells (shared by md, latex and html), and whether any
    cell is bold."""
    shown = chosen_columns(table, columns, fmt)
    # Dicts, not iterrows: a Series per row cost seconds on a 5,000-row table; and only of the
    # columns these cells read (a table has some 80).
    needed = ["regime", "role", "status", "reason", "stopped_early", "wall_time_spread", STANDS_FOR, "n",
              *(f"{c.key}{part}" for c in shown for part in ("", "_ci95", "_n", "_median", "_min", "_max")),
              *(f"{DELTA_COLUMN}_{part}" for part in DELTA_PARTS[1:])]
    records = table[[k for k in dict.fromkeys(needed) if k in table.columns]].to_dict("records")
    rows = [[_cell(r, c) for c in shown] for r in records]
    return shown, rows, _bold(table, rows, shown)


def below_reference(table: pd.DataFrame) -> dict[str, list[str]] | None:
    """Score column label -> labels of the finished rows whose mean is below the frozen
    reference's (None when the sweep ran no reference)."""
    if table.empty or "role" not in table:
        return None
    finished = table[table["status"] == "finished"]
    ref = finished[finished["role"] == "reference"]
    if ref.empty:
        return None
    ref = ref.iloc[0]
    others = finished[~finished["role"].isin(YARDSTICKS)]
    out = {}
    for metric in ["overall", *table.attrs.get("task_metrics", [])]:
        if metric not in table or pd.isna(ref[metric]):
            continue
        low = others[others[metric] < ref[metric]]
        out[TASK_LABELS.get(metric, metric.capitalize())] = [
            r["regime"] + ("*" if r["role"] == "baseline" else "") for _, r in low.iterrows()]
    return out


def caption(table: pd.DataFrame, columns: Sequence[str] | None = None, bold: bool = False, fmt: str = "md") -> str:
    return " ".join(caption_parts(table, columns, bold, fmt))


def caption_parts(table: pd.DataFrame, columns: Sequence[str] | None = None, bold: bool = False,
                  fmt: str = "md") -> list[str]:
    """A legend for what this table shows, as sentences: the interval when seeds are grouped,
    the values every row shares of a label column left out, then an entry for each column that
    needs one and each mark its rows carry, and no others."""
    shown = chosen_columns(table, columns, fmt)
    keys = [c.key for c in shown]
    finished = table[table["status"] == "finished"]
    grouped = bool((finished["n"] > 1).any())
    has_reference = bool((finished["role"] == "reference").any())
    tms = [k for k in TM_COLUMNS.values() if k in keys]
    known = all_columns(table)
    parts = []
    if grouped:
        seeds = "n seeds" if "n" in keys or _varies(finished, "n") else f"n = {int(finished['n'].iloc[0])} seeds"
        parts.append(f"{INTERVAL_LEAD} {seeds}.")
    shared = [f"{known[k].header} {table[k].iloc[0]}" for k in ("lr", "weights") if k not in keys and not _varies(table, k)]
    if shared:
        parts.append("Every row: " + ", ".join(shared) + ".")
    costs = {TM_COLUMNS["compute"]: "counted training FLOPs (compute)", TM_COLUMNS["wall"]: "train time (wall)"}
    legend = [  # (whether the table needs it, the entry), in the caption's order
        ("lr" in keys, "LR: encoder / heads (– : encoder frozen, only the heads train); one rate: both train at it."),
        (bold, "Bold: best per column" + (" (reference aside)." if has_reference else ".")),
        ((finished["role"] == "baseline").any(), "* baseline" + (" (TM-rel. = 1)." if tms else ".")),
        (DELTA_COLUMN in keys, delta_caption(table.attrs.get("delta_design", DeltaDesign()))),
        (DELTA_M in keys, "Δm%: mean over tasks of the relative change of each task score against the same "
         "task trained alone (the single-task rows), same seed; positive = better than alone."),
        ("best_epoch" in keys, "Epoch: best dev epoch" + (", median (range)." if grouped else ".")),
        (tms, "TM-rel.: (overall / base) × (cost_base / cost) × (size_base / size), cost: "
         + " or ".join(costs[k] for k in tms) + "."),
        ("peak_memory_mb" in keys, peak_memory_entry(table.attrs.get("devices", []))),
        ((table["stopped_early"] > 0).any(), "† stopped early by ASHA (its cost on the full-budget basis)."),
        ("wall_time_spread" in table and (table["wall_time_spread"] > WALL_SPREAD).any(),
         f"{WALL_MARK} the configuration's runs took train times more than {WALL_SPREAD:.0%} apart: "
         "its TM-rel. (wall) measured the machine's load too."),
        (STANDS_FOR in table and (table[STANDS_FOR].astype(object).fillna("") != "").any(),
         f"{ALSO_SEARCHED}: a searched point identical to the baseline, trained once, as the baseline."),
        ((table["status"] == "interrupted").any(), "‡ interrupted (mtbert sweep resume continues it)."),
        ((table["status"] == "failed").any(), "✗ failed, with its reason."),
    ]
    parts += [entry for needed, entry in legend if needed]
    below = below_reference(table)
    if below is not None:
        rows = [f"{name}: {', '.join(labels) if labels else 'none'}" for name, labels in below.items()]
        parts.append(f"{REFERENCE_LABEL}: encoder frozen, linear heads; rows whose mean is below it: "
                     + "; ".join(rows) + ".")
        trained = int((~finished["role"].isin(YARDSTICKS)).sum())
        beaten = [name for name, labels in below.items() if trained and len(labels) == trained]
        if beaten:
            parts.append(f"The {REFERENCE_LABEL} beats every trained configuration on {', '.join(beaten)}: "
                         "fine-tuning lost what the encoder knew (`mtbert best` still names the best trained one).")
    return parts


def peak_memory_entry(devices: Sequence[str]) -> str:
    """What the peak memory column counts on the devices the rows trained on (either, for
    runs logged before their device was tagged). On CPU it is the process's resident set, so
    a trial in a Ray worker that ran others first also counts what that worker keeps between
    trials (measure.reset_peak_memory; docs/guide.md says how far apart that puts rows)."""
    cuda = "CUDA peak allocated (weights, optimizer state, activations)"
    cpu = ("on CPU the peak resident set of the trial's process, which also counts the libraries (~0.4 GB) "
           "and the data and frozen-layer blocks its worker kept from earlier trials")
    on_cpu = not devices or any(not d.startswith("cuda") for d in devices)
    on_cuda = not devices or any(d.startswith("cuda") for d in devices)
    return "Peak mem.: " + "; ".join([cuda] * on_cuda + [cpu] * on_cpu) + "."


def delta_caption(design: DeltaDesign) -> str:
    """What the Δ column's intervals are: the verdicts' (docs/verdicts.md)."""
    what = ("the median of the per-seed differences from * and its 95% interval [L, H], valid whatever the "
            "noise's shape" if design.method == "median" else
            "the mean of the per-seed differences from * and its 95% t-interval [L, H], right for near-normal "
            "differences")
    parts = [f"Δ {DELTA_METRIC} vs *: {what}"]
    if design.looks:
        parts.append(f"sequential over looks {'..'.join(map(str, design.looks))}")
    if design.claims:
        parts.append("where a claim of the sweep makes the comparison, at the claim's level (named in the cell), "
                     "as mtbert findings gives it")
    parts.append("n: seeds paired, none diverged")
    if design.method == "median":
        parts.append(f"n alone: too few for an interval (6 at least{', more over looks' if design.looks else ''})")
    return "; ".join(parts) + "."


def export_table(table: pd.DataFrame, columns: Sequence[str] | None = None, fmt: str = "md") -> export.Table:
    """The table as the printed formats take it (`fmt` picks the default columns)."""
    shown, rows, bold = display_rows(table, columns, fmt)
    left = sum(c.key in LABEL_COLUMNS for c in shown)
    # What a row's numbers are (the interval, when seeds are grouped) is the caption LaTeX sets
    # above the table; the legend's other entries are its notes.
    parts = caption_parts(table, columns, bold, fmt)
    lead = parts.pop(0) if parts and parts[0].startswith(INTERVAL_LEAD) else ""
    return export.Table([c.header for c in shown], rows, lead, left, "mtbert-leaderboard", tuple(parts))


IMPORTANCE_HEADING = "Importance of the swept dimensions"


def check_format(fmt: str) -> None:
    if fmt not in FORMATS:
        raise SweepError(f"--format {fmt}: expected one of {', '.join(FORMATS)}")


def render(table: pd.DataFrame, fmt: str, importance: pd.DataFrame | None = None,
           columns: Sequence[str] | None = None, title: str = "") -> str:
    """The table in `fmt` (its `columns`, default_columns when None); md, latex and html follow
    it with the importance table when given (csv stays one table: the importance is a csv of
    its own, importance.render). `title` names the sweep in a LaTeX comment and the HTML page."""
    check_format(fmt)
    if fmt == "csv":
        return table.to_csv(index=False)  # machines get the numbers, not the formatted cells
    tables = [export_table(table, columns, fmt)]
    if importance is not None and not importance.empty:
        from orchestration.report import importance as imp

        tables.append(imp.export_table(importance))
    title = f"mtbert leaderboard: {title}" if title else "mtbert leaderboard"
    return export.document(fmt, title, tables, f"\n**{IMPORTANCE_HEADING}**\n\n")


# --------------------------------------------------------------------------- Pareto plot

def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """Indices of the non-dominated points for (time: lower better, score: higher better)."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], -points[i][1]))
    front, best = [], -math.inf
    for i in order:
        if points[i][1] > best:
            front.append(i)
            best = points[i][1]
    return front


def cost_axis(table: pd.DataFrame) -> str:
    """The Pareto plot's cost: the headline TM score's, counted FLOPs or measured seconds, both
    on the full-epoch-budget basis."""
    return "tm_flops" if tm_column(table) == TM_COLUMNS["compute"] and "tm_flops" in table else "tm_time_s"


# Model sizes closer than this (max/min − 1) are one marker size: 90.6 and 91.8 MB drawn as
# the smallest and largest marker would make a 1% difference look like the plot's widest.
SIZE_SPREAD = 0.05
# The overall axis spans at least this much: a 0.005 gap between configurations whose
# intervals are 0.02 wide must not fill the plot's height.
MIN_SCORE_SPAN = 0.05
MIN_COST_SPAN = 0.3  # the cost axis spans at least this share of the largest cost
MARKER_AREA = 60.0  # points², the largest model's marker (areas are proportional to size)
# Points labelled at most: past it a plot is a cloud, labels would hide it and placing them
# costs seconds; the Pareto front and the baseline keep theirs (said below the plot).
MAX_LABELS = 40


def point_labels(data: pd.DataFrame) -> list[str]:
    """The plot's name for each row: its label in the table (regime and marks), with the
    learning rate and weights added where rows would otherwise share a label."""
    records = data.to_dict("records")
    labels = [_row_label(r) for r in records]
    for label in {x for x in labels if labels.count(x) > 1}:
        same = [i for i, x in enumerate(labels) if x == label]
        extra = [k for k in ("lr", "weights") if len({str(records[i][k]) for i in same}) > 1]
        for i in same:
            labels[i] = " ".join([label, *(f"lr={records[i][k]}" if k == "lr" else f"w={records[i][k]}"
                                           for k in extra)])
    return labels


def _halves(data: pd.DataFrame, key: str) -> pd.Series:
    """A column's 95% CI half-widths, 0 where there is none (one seed)."""
    col = f"{key}_ci95"
    return data[col].fillna(0.0) if col in data else pd.Series(0.0, index=data.index)


def _score_limits(y: pd.Series, half: pd.Series) -> tuple[float, float]:
    """Every interval inside, a margin in proportion to the widest, and MIN_SCORE_SPAN at
    least: the axis never magnifies differences the intervals say are noise."""
    low, high = float((y - half).min()), float((y + half).max())
    margin = max(0.5 * float(half.max()), 0.1 * (high - low))
    span = max(high - low + 2 * margin, MIN_SCORE_SPAN)
    middle = (low + high) / 2
    return middle - span / 2, middle + span / 2


def _cost_limits(x: pd.Series, half: pd.Series) -> tuple[float, float]:
    """Every interval inside with a margin, and at least MIN_COST_SPAN of the largest cost
    wide (from zero when that reaches it): a 2% cost gap never spans the plot's width."""
    low, high = float((x - half).min()), float((x + half).max())
    margin = 0.08 * (high - low)
    # `or 1.0`: every cost zero (head-only trials counted by encoder FLOPs) still gets an axis
    span = max(high - low + 2 * margin, MIN_COST_SPAN * high) or 1.0
    middle = (low + high) / 2
    start = max(middle - span / 2, 0.0)
    return start, start + span


def _place_labels(ax, xs: list[float], ys: list[float], labels: list[str], areas: list[float],
                  xerr: list[float], yerr: list[float]) -> None:
    """Each point's label ("": none) at the first spot, nearest first on rings around the
    point, that covers no marker, other label or error bar and stays inside the axes; where
    none is clear, the spot that covers least (a bar's thin line counting for less than a
    marker or a word). A label set away from its point gets a leader line."""
    renderer = ax.figure.canvas.get_renderer()
    frame = ax.get_window_extent(renderer)
    scale = ax.figure.dpi / 72  # points to pixels
    centres = ax.transData.transform(list(zip(xs, ys)))
    taken = []  # (x0, y0, x1, y1, weight)
    for (px, py), area in zip(centres, areas):
        r = math.sqrt(area) / 2 * scale + 1
        taken.append((px - r, py - r, px + r, py + r, 1.0))
    for x, y, dx, dy in zip(xs, ys, xerr, yerr):
        (left, low), (right, high) = ax.transData.transform([(x - dx, y - dy), (x + dx, y + dy)])
        px, py = ax.transData.transform((x, y))
        cap = 3 * scale
        if dy > 0:
            taken.append((px - cap, low, px + cap, high, 0.3))
        if dx > 0:
            taken.append((left, py - cap, right, py + cap, 0.3))
    angles = [math.radians(a) for a in (45, -45, 135, -135, 0, 180, 90, -90, 20, -20, 160, -160, 70, -70, 110, -110)]
    spots = [(r * math.cos(a), r * math.sin(a)) for r in (5, 12, 20, 30, 42, 56, 72, 90) for a in angles]

    def overlap(box) -> float:
        outside = (max(frame.x0 - box.x0, 0) + max(box.x1 - frame.x1, 0)) * box.height + \
                  (max(frame.y0 - box.y0, 0) + max(box.y1 - frame.y1, 0)) * box.width
        return outside + sum(w * max(0.0, min(box.x1, x1) - max(box.x0, x0)) * max(0.0, min(box.y1, y1) - max(box.y0, y0))
                             for x0, y0, x1, y1, w in taken)

    def annotate(i: int, dx: float, dy: float):
        far = math.hypot(dx, dy) > 6
        text = ax.annotate(labels[i], (xs[i], ys[i]), xytext=(dx, dy), textcoords="offset points", fontsize=7,
                           ha="left" if dx > 1 else "right" if dx < -1 else "center",
                           va="bottom" if dy > 1 else "top" if dy < -1 else "center",
                           arrowprops=dict(arrowstyle="-", lw=0.5, color="0.5", shrinkA=0, shrinkB=3) if far else None)
        return text, _text_box(text, renderer)

    for i in sorted((i for i, label in enumerate(labels) if label), key=lambda i: -ys[i]):  # "": no label
        best = None
        for dx, dy in spots:
            text, box = annotate(i, dx, dy)
            cost = overlap(box)
            if best is None or cost < best[0]:
                if best is not None:
                    best[1].remove()
                best = (cost, text, box)
            else:
                text.remove()
            if cost == 0:
                break
        box = best[2]
        taken.append((box.x0, box.y0, box.x1, box.y1, 1.0))


def _text_box(text, renderer):
    """An annotation's text alone: its window extent also spans its leader line, which may
    cross other labels' lines."""
    from matplotlib.text import Text

    text.update_positions(renderer)
    return Text.get_window_extent(text, renderer)


def plot_pareto(table: pd.DataFrame, path: str | Path, title: str = "") -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig = pareto_figure(table, title)  # first: it picks matplotlib's file-only backend
    import matplotlib.pyplot as plt

    fig.savefig(path)
    plt.close(fig)
    return path


def pareto_figure(table: pd.DataFrame, title: str = ""):
    """Overall against cost, one point per finished configuration, labelled as its table row,
    with its seeds' 95% intervals as bars; the axes never zoom so far that noise looks like a
    difference; marker area gives model size where sizes differ by more than SIZE_SPREAD; the
    non-dominated configurations are joined by a step line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = cost_axis(table)
    data = table[table["status"] == "finished"] if "status" in table else table
    data = data.dropna(subset=["overall", x]) if not data.empty else data
    fig, ax = plt.subplots(figsize=(8, 5), dpi=130)
    ax.set_xlabel("training FLOPs on the full epoch budget" if x == "tm_flops"
                  else "train time on the full epoch budget (s)")
    ax.set_ylabel("best dev overall")
    ax.set_title(title or ("overall vs training compute" if x == "tm_flops" else "overall vs train time"), fontsize=10)
    ax.grid(alpha=0.3)
    notes = []
    if not data.empty:
        data = data.reset_index(drop=True)
        xerr, yerr = _halves(data, x), _halves(data, "overall")
        if bool((yerr > 0).any()) or bool((xerr > 0).any()):
            ax.errorbar(data[x], data["overall"], xerr=xerr if bool((xerr > 0).any()) else None,
                        yerr=yerr if bool((yerr > 0).any()) else None, fmt="none", ecolor="0.45",
                        elinewidth=0.8, capsize=2.5, zorder=1)
            notes.append(f"bars: 95% confidence interval over seeds (n = {data['n'].min():g}"
                         + (f"–{data['n'].max():g})" if data["n"].max() != data["n"].min() else ")"))
        elif bool((data["n"] == 1).all()):
            notes.append("one seed per configuration: no intervals")
        sizes = data["model_size_mb"]
        low, high = float(sizes.min()), float(sizes.max())
        by_size = low > 0 and high / low - 1 > SIZE_SPREAD
        area = MARKER_AREA * sizes / high if by_size else pd.Series(MARKER_AREA * 0.6, index=data.index)
        if not by_size and high > 0:
            notes.append(f"model size {low:.1f}–{high:.1f} MB: within {SIZE_SPREAD:.0%}, one marker size"
                         if high > low else f"model size {low:.1f} MB")
        front = pareto_front(list(zip(data[x], data["overall"])))
        on_front = data.index.isin(front)
        base = (data["role"] == "baseline").to_numpy()
        marks = area.where(~base, area * 3)  # the baseline's star is larger
        for pick, style in [(~base & ~on_front, dict(c="#9fb7d4", edgecolors="#3b5b85", linewidths=0.6, zorder=2,
                                                     label="configuration")),
                            (~base & on_front, dict(c="tab:blue", edgecolors="black", linewidths=0.6, zorder=3,
                                                    label="on the Pareto front")),
                            (base, dict(marker="*", c="tab:red", edgecolors="black", linewidths=0.5, zorder=4,
                                        label="baseline *"))]:
            ax.scatter(data[x][pick], data["overall"][pick], s=marks[pick], **style)
        fx, fy = data.loc[front, x], data.loc[front, "overall"]
        ax.step(fx, fy, where="post", color="tab:blue", linewidth=1, alpha=0.7, zorder=1, label="Pareto front")
        ax.set_xlim(*_cost_limits(data[x], xerr))
        ax.set_ylim(*_score_limits(data["overall"], yerr))
        handles, names = ax.get_legend_handles_labels()
        if by_size:  # one legend (a second one is left out of the layout): a heading, then two sizes
            handles += [ax.scatter([], [], s=0, c="none"),
                        *(ax.scatter([], [], s=MARKER_AREA * mb / high, c="white", edgecolors="0.3")
                          for mb in (low, high))]
            names += ["marker area ∝ model size:", f"{low:.1f} MB", f"{high:.1f} MB"]
        ax.legend(handles, names, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, frameon=False)
        labels = point_labels(data)
        if len(data) > MAX_LABELS:
            labels = [label if on_front[i] or base[i] else "" for i, label in enumerate(labels)]
            notes.append(f"{len(data)} configurations: labels on the Pareto front and the baseline")
        fig.tight_layout(rect=(0, 0.05 if notes else 0, 1, 1))
        _place_labels(ax, list(data[x]), list(data["overall"]), labels, list(marks), list(xerr), list(yerr))
    if notes:
        fig.text(0.01, 0.01, "; ".join(notes), fontsize=7, color="0.35", ha="left", va="bottom")
    if data.empty:
        fig.tight_layout()
    return fig


def _local_artifact_dir(artifact_uri: str | None) -> Path | None:
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


PARETO_ARTIFACT = "pareto.png"  # the parent run's one Pareto plot


def log_artifact(uri: str, run, path: str | Path, name: str | None = None) -> None:
    """MlflowClient(uri).log_artifact(run id, path) as `name` (default: the file's own), without
    MLflow for local artifacts: for a local folder MLflow's artifact repository only copies the
    file in, through a temporary file it then renames, so a reader never sees half a file. Any
    other artifact store (a server's mlflow-artifacts:, S3, ...) goes through the client. An
    artifact of the same name is replaced."""
    import shutil
    import tempfile

    name = name or Path(path).name
    folder = _local_artifact_dir(getattr(run.info, "artifact_uri", None))
    if folder is None:
        with tempfile.TemporaryDirectory() as tmp:
            named = Path(tmp) / name
            shutil.copyfile(path, named)
            _client(uri).log_artifact(run.info.run_id, str(named))
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


def log_leaderboard(tracking) -> bool:
    """The sweep's table (leaderboard.md, leaderboard.csv) and Pareto plot (pareto.png) on its
    parent run, drawn from the final figures: at the end of every run and resume, so the
    parent never keeps a stale one. The markdown carries the importance the parent holds for
    these runs (importance.log_importance, the step before)."""
    import tempfile

    from orchestration.report.importance import stored

    parent = tracking.client.get_run(tracking.parent_run_id)
    runs = child_runs(tracking.uri, tracking.experiment_id, tracking.parent_run_id, *table_keys(parent.data.tags))
    table = sort_table(build_table(runs, parent.data.tags))
    if table.empty:
        return False
    importance, _ = stored(tracking.uri, parent, table)
    with tempfile.TemporaryDirectory() as tmp:
        plot_pareto(table, Path(tmp) / PARETO_ARTIFACT, title=parent.info.run_name)
        (Path(tmp) / "leaderboard.md").write_text(render(table, "md", importance))
        (Path(tmp) / "leaderboard.csv").write_text(render(table, "csv"))
        for name in (PARETO_ARTIFACT, "leaderboard.md", "leaderboard.csv"):
            tracking.client.log_artifact(tracking.parent_run_id, str(Path(tmp) / name))
    return True


def leaderboard(uri: str, experiment: str, sweep: str | None = None, fmt: str = "md",
                sort: str = "overall", plot: str | Path | None = None,
                importance_plot: str | Path | None = None, columns: Sequence[str] | None = None,
                say=None) -> tuple[str, pd.DataFrame, Any]:
    """(rendered table, the table, the parent run); draws and logs the Pareto plot if `plot`.
    The importance the parent holds for these runs follows the table (md, latex, html) and is
    drawn to `importance_plot`; importance.stored says why when there is none. `columns`:
    the printed table's (render); `say`: where find_sweep says which sweep it chose."""
    from orchestration.report.importance import plot_importance, stored

    experiment_id, parent = find_sweep(uri, experiment, sweep, say)
    runs = child_runs(uri, experiment_id, parent.info.run_id, *table_keys(parent.data.tags))
    table = sort_table(build_table(runs, parent.data.tags), sort)
    if table.empty:
        raise SweepError(f"sweep {parent.info.run_name} ({parent.info.run_id}) has no finished trials yet")
    importance, _ = stored(uri, parent, table)
    # Rendered first: a --columns typo is one line before any file is written.
    text = render(table, fmt, importance, columns, title=parent.info.run_name)
    if plot is not None:
        path = plot_pareto(table, plot, title=parent.info.run_name)
        # Under the sweep's own name for it: each export replaces the one plot the parent holds.
        log_artifact(uri, parent, path, PARETO_ARTIFACT)
    if importance is not None and importance_plot is not None:
        plot_importance(importance, importance_plot, title=parent.info.run_name)
    return text, table, parent
