"""The sweep as the papers print it (mops-tm-relative-score.txt, Tables 1 and 2).

    mtbert leaderboard --experiment smoke --format md

One row per configuration: regime (head regime, encoder sharing k, and any other swept key or
baseline override off its default), learning rate, loss weights, best dev overall and its epoch, the task
scores at that epoch, train time, model size, peak memory and TM-relative score. The baseline is marked
with * and pinned first, as in the paper. A configuration run under several seeds is one
row of mean ± the 95% t-interval half-width (n seeds; orchestration/stats.py), and Δ overall
is its difference to the baseline paired by seed (the mean of per-seed differences ± its own
95% t-interval, n paired seeds). A sweep's frozen reference (`reference: true`, role
`reference`) is labelled as such, and the caption names the rows whose mean falls below it,
task by task. Runs come from MLflow (pandas): the child runs of one sweep's parent run, by
default the experiment's latest sweep.

Differences from the paper's tables, on purpose: epochs are 1-based; model size is in MB;
the TM-relative column is the ratio itself (the baseline scores 1.0), where the paper prints
it multiplied by the baseline's overall score.

Two TM-relative columns, the sweep's headline first (tracking.tm_score, tm.py): compute (counted
training FLOPs: the same configuration and seed score the same on any machine, busy or not) by
default, and wall (measured train time) beside it. The same configuration trained twice got
wall-clock scores of 1.000 and 0.609 on a loaded machine, so a row whose runs' train times
differ by more than WALL_SPREAD is marked: its wall column measured the machine as much as the
configuration. A searched point identical to the baseline was trained once, as the baseline
(plan.py): that row says so. Below the table, the importance of each swept key per figure
(orchestration/importance.py), when it was computed from these runs.

The Pareto plot puts overall against the headline score's cost on the full-epoch-budget basis
(training FLOPs, tm_flops, or train time, tm_time_s; see tm.py), so trials ASHA stopped are not
drawn as cheap; marker size and colour give model size; the non-dominated configurations are
joined by a step line.
"""
from __future__ import annotations

import html
import math
import sqlite3
import sys
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import pandas as pd

from mtbert.tasks import TASKS
from orchestration.errors import SweepError
from orchestration.labels import OWN_COLUMNS, STANDS_FOR, fmt_lr, fmt_weighting, parse_param, regime_label
from orchestration.paths import fluent_tracking_uri, sqlite_path
from orchestration.stats import paired_delta, t_quantile

FORMATS = ("md", "csv", "latex", "html")
# Column key -> header; task columns come from the sweep's task_metrics tag (metric name -> label).
TASK_LABELS = {"sst_acc": "SC acc.", "para_acc": "PD acc.", "sts_corr": "STS corr."}
NUMERIC = ["overall", "best_epoch", "train_time_s", "model_size_mb", "peak_memory_mb", "tm_relative_score"]
# In the csv, not the printed table: the compute-based score and the time bases of both.
EXTRA_NUMERIC = ["tm_relative_score_compute", "tm_time_s", "tm_flops"]
LOWER_IS_BETTER = {"train_time_s", "model_size_mb", "tm_time_s", "tm_flops", "peak_memory_mb", "best_epoch",
                   "wall_time_spread"}
DELTA_METRIC = "overall"  # the Δ-vs-baseline column: paired by seed
REFERENCE_LABEL = "frozen reference"
TM_COLUMNS = {"compute": "tm_relative_score_compute", "wall": "tm_relative_score"}
# (max − min) / min of a configuration's train times (full-budget basis) above which its
# wall-clock TM score is marked as the machine's as much as the configuration's.
WALL_SPREAD = 0.20
WALL_MARK = "§"
ALSO_SEARCHED = "(also searched)"


# --------------------------------------------------------------------------- reading MLflow

def _client(uri: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(uri)


# A sqlite store is read with plain SQL over MLflow's own tables: importing mlflow and opening
# its SqlAlchemyStore cost about 4 s before the first row, more than reading 10,000 runs.
MLFLOW_TABLES = ("experiments", "runs")  # what makes a sqlite file an MLflow store here


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


def _through_mlflow(uri: str, what: str, exc: BaseException) -> None:
    """One line on stderr when a sqlite store falls back to MLflow's API: slower, not wrong,
    and a sign that MLflow's schema moved on from what the SQL reader knows."""
    reason = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
    print(f"leaderboard: the SQL reader failed on {uri} ({reason}); {what} through MLflow's API",
          file=sys.stderr)


def check_sqlite_store(uri: str) -> None:
    """The store check of `mtbert leaderboard` for an existing sqlite file, without MLflow:
    it opens, and it has MLflow's tables. One line when not (TrackingUnavailable)."""
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
        raise TrackingUnavailable(f"tracking store {uri} unusable: not an MLflow database "
                                  f"(no {' or '.join(missing)} table)")


@dataclass
class RunInfo:
    run_id: str
    run_name: str
    experiment_id: str
    status: str
    start_time: int | None
    end_time: int | None
    artifact_uri: str
    lifecycle_stage: str


@dataclass
class RunData:
    tags: dict[str, str]
    params: dict[str, str]
    metrics: dict[str, float]


@dataclass
class SqliteRun:
    """A run read from sqlite: the parts of mlflow.entities.Run that callers of find_sweep
    and leaderboard use (info.run_id, info.run_name, info.artifact_uri, data.tags, ...)."""
    info: RunInfo
    data: RunData


def find_sweep(uri: str, experiment: str, sweep: str | None = None):
    """(experiment id, parent run) for a sweep: by run id or name, else the latest one. An
    existing sqlite store is read with SQL (an SqliteRun), any other through MLflow (a Run)."""
    if _is_sqlite_file(uri):
        try:
            return sqlite_find_sweep(uri, experiment, sweep)
        except sqlite3.Error as exc:  # a schema this reader does not know: the API
            _through_mlflow(uri, "finding the sweep", exc)
    return search_find_sweep(uri, experiment, sweep)


def _is_run_id(text: str) -> bool:
    return len(text) == 32 and all(c in "0123456789abcdef" for c in text)


def _no_experiment(uri: str, experiment: str, names: list[str]) -> SweepError:
    return SweepError(f"--experiment {experiment}: no such experiment in {uri}"
                      + (f" (have: {', '.join(names)})" if names else ""))


def search_find_sweep(uri: str, experiment: str, sweep: str | None = None):
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
    runs = client.search_runs([exp.experiment_id], flt, order_by=["attributes.start_time DESC"], max_results=1)
    if not runs:
        raise SweepError(f"--experiment {experiment}: holds no sweep runs yet")
    return exp.experiment_id, runs[0]


def sqlite_find_sweep(uri: str, experiment: str, sweep: str | None = None) -> tuple[str, SqliteRun]:
    """search_find_sweep's answer from MLflow's sqlite tables, read-only, with its choices: the
    experiment by name whatever its lifecycle stage (get_experiment_by_name), the names listed
    as search_experiments lists them (active, newest first), active runs tagged role=sweep,
    newest start_time first, run id breaking ties (search_runs' order)."""
    con = _connect(uri)
    try:
        row = con.execute("SELECT experiment_id FROM experiments WHERE name = ?", (experiment,)).fetchone()
        if row is None:
            names = [r[0] for r in con.execute(
                "SELECT name FROM experiments WHERE lifecycle_stage = 'active' "
                "ORDER BY creation_time DESC, experiment_id ASC LIMIT 50")]
            raise _no_experiment(uri, experiment, names)
        experiment_id = row[0]
        query = ("SELECT r.run_uuid FROM runs r JOIN tags t ON t.run_uuid = r.run_uuid AND t.key = 'role' "
                 "AND t.value = 'sweep' WHERE r.experiment_id = ? AND r.lifecycle_stage = 'active' {} "
                 "ORDER BY r.start_time DESC, r.run_uuid LIMIT 1")
        found = None
        if sweep:
            if _is_run_id(sweep):
                found = con.execute(query.format("AND r.run_uuid = ?"), (experiment_id, sweep)).fetchone()
            found = found or con.execute(query.format("AND r.name = ?"), (experiment_id, sweep)).fetchone()
            if found is None:
                raise SweepError(f"--sweep {sweep}: no sweep run with that id or name in experiment '{experiment}'")
        else:
            found = con.execute(query.format(""), (experiment_id,)).fetchone()
            if found is None:
                raise SweepError(f"--experiment {experiment}: holds no sweep runs yet")
        return str(experiment_id), _sqlite_run(con, found[0])
    finally:
        con.close()


def _sqlite_run(con: sqlite3.Connection, run_id: str) -> SqliteRun:
    info = con.execute("SELECT run_uuid, name, experiment_id, status, start_time, end_time, artifact_uri, "
                       "lifecycle_stage FROM runs WHERE run_uuid = ?", (run_id,)).fetchone()
    tags = dict(con.execute("SELECT key, value FROM tags WHERE run_uuid = ?", (run_id,)))
    params = dict(con.execute("SELECT key, value FROM params WHERE run_uuid = ?", (run_id,)))
    metrics = {key: math.nan if is_nan else float(value) for key, value, is_nan in con.execute(
        "SELECT key, value, is_nan FROM latest_metrics WHERE run_uuid = ?", (run_id,))}
    run_uuid, name, experiment_id, status, start, end, artifact_uri, stage = info
    return SqliteRun(RunInfo(run_uuid, name, str(experiment_id), status, start, end, artifact_uri, stage),
                     RunData(tags, params, metrics))


def child_runs(uri: str, experiment_id: str, parent_run_id: str, params: Sequence[str] | None = None,
               metrics: Sequence[str] | None = None, tags: Sequence[str] | None = None) -> pd.DataFrame:
    """The sweep's child runs as mlflow.search_runs' DataFrame (run_id, status, ...,
    metrics.*, params.*, tags.*). A sqlite store is read with a few SQL queries over MLflow's
    own tables (10,000 runs in seconds; search_runs builds a Run object per run, 1,000 a
    page, which took about a minute), keeping only the `params`, `metrics` and `tags` keys
    given (sqlite_child_runs); any other store, or a sqlite schema this reader does not know
    (said in one line on stderr), goes through search_runs, which returns every key."""
    if _is_sqlite_file(uri):
        try:
            return sqlite_child_runs(uri, experiment_id, parent_run_id, params, metrics, tags)
        except Exception as exc:  # noqa: BLE001 - an MLflow schema this reader does not know: the API
            _through_mlflow(uri, "reading the runs", exc)
    return search_child_runs(uri, experiment_id, parent_run_id)


def search_child_runs(uri: str, experiment_id: str, parent_run_id: str) -> pd.DataFrame:
    import mlflow

    with fluent_tracking_uri(uri):
        return mlflow.search_runs(experiment_ids=[experiment_id],
                                  filter_string=f"tags.`mlflow.parentRunId` = '{parent_run_id}'",
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
    """search_child_runs' DataFrame from MLflow's sqlite tables (runs, latest_metrics, params,
    tags), read-only: active runs of the experiment whose mlflow.parentRunId tag is the
    sweep's, ordered as search_runs orders them (start_time DESC, run id). `params`,
    `metrics` and `tags`, when given, keep only those keys (names, or prefixes ending in
    '.'): a run carries every config key as a param, 66 of them, and every per-epoch series,
    most of which the leaderboard does not read (they were half of its reading time)."""
    import numpy as np

    con = _connect(uri)
    try:
        chosen = ("SELECT r.run_uuid FROM runs r JOIN tags p ON p.run_uuid = r.run_uuid "
                  "AND p.key = 'mlflow.parentRunId' AND p.value = ? "
                  "WHERE r.experiment_id = ? AND r.lifecycle_stage = 'active'")
        args = (parent_run_id, int(experiment_id))
        runs = pd.read_sql_query(
            "SELECT run_uuid AS run_id, experiment_id, status, artifact_uri, start_time, end_time FROM runs "
            f"WHERE run_uuid IN ({chosen}) ORDER BY start_time DESC, run_uuid", con, params=args)
        where, only = _only(metrics)
        metrics = pd.read_sql_query(f"SELECT run_uuid, key, value, is_nan FROM latest_metrics "
                                    f"WHERE run_uuid IN ({chosen}){where}", con, params=(*args, *only))
        where, only = _only(params)
        params = pd.read_sql_query(f"SELECT run_uuid, key, value FROM params WHERE run_uuid IN ({chosen}){where}",
                                   con, params=(*args, *only))
        where, only = _only(tags)
        tags = pd.read_sql_query(f"SELECT run_uuid, key, value FROM tags WHERE run_uuid IN ({chosen}){where}",
                                 con, params=(*args, *only))
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


def _paired_deltas(done: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Per variant: (delta, ci95, n) of metric − the baseline's metric at the same seed."""
    out = pd.DataFrame(index=pd.Index(done["variant"].unique(), name="variant"),
                       columns=["delta", "ci95", "n"], dtype=float)
    base = done[done["role"] == "baseline"]
    if base.empty or metric not in done:
        return out
    # A seed run twice (a resume that double-logged) counts once, as its mean.
    per_seed = done.pivot_table(index="variant", columns="seed", values=metric, aggfunc="mean")
    base_seed = base.groupby("seed")[metric].mean().to_dict()
    # Plain rows and one assignment: a Series and a .loc write per variant took seconds at
    # 5,000 configurations. paired_delta skips the NaN seeds row.dropna() used to drop.
    seeds = list(per_seed.columns)
    found = [paired_delta(dict(zip(seeds, row)), base_seed) for row in per_seed.to_numpy().tolist()]
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


def _numeric(task_metrics: list[str]) -> list[str]:
    return [*NUMERIC[:2], *task_metrics, *NUMERIC[2:], *EXTRA_NUMERIC]


def _label_params(swept: list[str]) -> dict[str, list[str]]:
    """The params each label column is made of (a name ending in '.' is a prefix): the
    regime (regime_label reads the head regime, k and the swept keys of no column of their
    own), the learning rate, the weights (fmt_weighting, _weights)."""
    return {"regime": ["sharing.head_regime", "sharing.encoder_shared_layers",
                       *[k for k in swept if k not in OWN_COLUMNS]],
            "lr": ["optim.lr"],
            "weights": ["loss.weighting", "loss.pcgrad", "loss.weights", "loss.weights."]}


# The tags build_table and _status read (tags.<name>).
TABLE_TAGS = ["variant", "role", "seed", "stopped_early", "interrupted", "error", STANDS_FOR]


def table_keys(parent_tags: dict[str, str]) -> tuple[list[str], list[str], list[str]]:
    """(params, metrics, tags) build_table reads of a sweep's runs: child_runs needs no others."""
    params = [k for keys in _label_params(_swept(parent_tags)).values() for k in keys]
    return (list(dict.fromkeys(params)), list(dict.fromkeys(_numeric(_task_metrics(parent_tags)))),
            list(TABLE_TAGS))


def _union(*keys: tuple[list[str], ...]) -> tuple[list[str], ...]:
    """Key lists (params, metrics, tags) of several readers, merged: one child_runs read."""
    return tuple(list(dict.fromkeys(k for part in parts for k in part)) for parts in zip(*keys))


def _labels(runs: pd.DataFrame, keys: list[str], make) -> list[str]:
    """make(params) for each run, params being the run's values of `keys` (MLflow strings; a
    param the run lacks is absent). Computed once per distinct set of values: runs of one
    configuration, and configurations differing only elsewhere, share a label."""
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
    and n; the delta metric carries <metric>_delta, _delta_ci95 and _delta_n, paired by seed
    against the baseline), then one row per failed or interrupted trial with its one-line reason.
    Vectorised over runs, so a 10,000-run sweep builds in seconds."""
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
    lr = _labels(runs, groups["lr"], lambda p: fmt_lr(p.get("optim.lr")))
    weights = _labels(runs, groups["weights"], lambda p: fmt_weighting(p.get("loss.weighting"), _weights(p), tasks,
                                                                          p.get("loss.pcgrad")))
    error = _col(runs, "tags.error").fillna("").astype(str).str.split("\n").str[0].str.slice(0, 200)
    frame = pd.DataFrame({
        "variant": _col(runs, "tags.variant").values, "role": _col(runs, "tags.role").values,
        "seed": _col(runs, "tags.seed").values, "regime": regime, "lr": lr, "weights": weights,
        "stopped_early": (_col(runs, "tags.stopped_early") == "true").values,
        "status": runs["_status"].values, "reason": error.values,
        STANDS_FOR: _col(runs, f"tags.{STANDS_FOR}").astype(object).fillna("").values,
    })
    numeric = _numeric(task_metrics)
    for name in dict.fromkeys(numeric):
        frame[name] = pd.to_numeric(_col(runs, f"metrics.{name}"), errors="coerce").values
    done = frame[frame["status"] == "finished"]
    keys = ["variant", "role", "regime", "lr", "weights"]
    grouped = done.groupby("variant", sort=False)
    table = grouped[keys].first().reset_index(drop=True)
    table["n"] = grouped.size().values
    table["stopped_early"] = grouped["stopped_early"].sum().astype(int).values
    means = grouped[numeric].mean()
    stds = grouped[numeric].std(ddof=1)
    counts = grouped[numeric].count()
    for name in dict.fromkeys(numeric):
        table[name] = means[name].values
        table[f"{name}_std"] = stds[name].where(counts[name] > 1).values
        table[f"{name}_ci95"] = _ci95(stds[name], counts[name]).values
    # The full-budget basis, so a trial ASHA stopped is compared at the time its budget would take.
    time = frame["tm_time_s"].where(frame["tm_time_s"].notna(), frame["train_time_s"]).loc[done.index]
    by = time.groupby(done["variant"], sort=False)
    low, runs_timed = by.min(), by.count()
    spread = (by.max() / low - 1).where((runs_timed > 1) & (low > 0))
    table["wall_time_spread"] = spread.reindex(table["variant"]).values
    deltas = _paired_deltas(done, DELTA_METRIC).reindex(table["variant"])
    table[f"{DELTA_METRIC}_delta"] = deltas["delta"].values
    table[f"{DELTA_METRIC}_delta_ci95"] = deltas["ci95"].values
    table[f"{DELTA_METRIC}_delta_n"] = deltas["n"].values
    table.loc[table["role"] == "baseline", [f"{DELTA_METRIC}_delta", f"{DELTA_METRIC}_delta_ci95",
                                           f"{DELTA_METRIC}_delta_n"]] = math.nan
    table.loc[table["role"] == "reference", "regime"] = REFERENCE_LABEL
    table["status"] = "finished"
    table["reason"] = ""
    table[STANDS_FOR] = grouped[STANDS_FOR].first().values
    rest = frame[frame["status"] != "finished"].copy()
    if not rest.empty:
        rest["n"] = 1
        rest["stopped_early"] = 0
        rest["wall_time_spread"] = math.nan
        for name in dict.fromkeys(numeric):
            rest[f"{name}_std"] = math.nan
            rest[f"{name}_ci95"] = math.nan
        for suffix in ("delta", "delta_ci95", "delta_n"):
            rest[f"{DELTA_METRIC}_{suffix}"] = math.nan
        rest.loc[rest["role"] == "reference", "regime"] = REFERENCE_LABEL
        table = pd.concat([table, rest[table.columns]], ignore_index=True)
    table.attrs["task_metrics"] = task_metrics
    table.attrs["tasks"] = tasks
    table.attrs["tm_score"] = tm_choice(parent_tags, runs)
    return table


def tm_choice(parent_tags: dict[str, str], runs: pd.DataFrame) -> str:
    """compute | wall: the sweep's tracking.tm_score. A sweep logged before that tag: compute
    when its runs carry the compute score, else wall (what such a store can show)."""
    choice = parent_tags.get("tm_score")
    if choice in TM_COLUMNS:
        return choice
    compute = f"metrics.{TM_COLUMNS['compute']}"
    return "compute" if compute in runs.columns and bool(runs[compute].notna().any()) else "wall"


def headline_tm(parent_tags: dict[str, str], runs: pd.DataFrame) -> str:
    """The column of a sweep's headline TM-relative score (tm_choice)."""
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
    ascending = key in LOWER_IS_BETTER or table[key].dtype == object
    finished = table["status"] == "finished"
    base = table[finished & (table["role"] == "baseline")]
    rest = table[finished & (table["role"] != "baseline")].sort_values(key, ascending=ascending, na_position="last")
    out = pd.concat([base, rest, table[~finished]], ignore_index=True)
    out.attrs.update(table.attrs)
    return out


def _nan(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _cell(mean: float, half: float, n: int, digits: int) -> str:
    """mean ± 95% CI half-width; a single seed (or no spread to estimate) shows the mean alone."""
    if _nan(mean):
        return "–"
    text = f"{mean:.{digits}f}"
    if n > 1 and not _nan(half):
        text += f" ± {half:.{digits}f}"
    return text


def _delta_cell(delta: float, half: float, n: float, digits: int = 3) -> str:
    """+0.004 ± 0.002 (n=3): paired by seed; n is the number of seeds both sides ran."""
    if _nan(delta):
        return "–"
    text = f"{delta:+.{digits}f}"
    if not _nan(half):
        text += f" ± {half:.{digits}f}"
    return text + f" (n={int(n)})"


def display_rows(table: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    """Headers and formatted cells shared by md, latex and html."""
    tasks = table.attrs.get("tasks", ["sst", "para", "sts"])
    task_metrics = table.attrs.get("task_metrics", [])
    grouped = bool((table["n"] > 1).any()) if not table.empty else False
    delta_col = f"{DELTA_METRIC}_delta"
    with_delta = delta_col in table.columns and bool(table[delta_col].notna().any())
    tms = tm_columns(table)
    headers = ["Regime", "LR", f"w [{' '.join(tasks)}]", "Overall",
               *(["Δ overall vs *"] if with_delta else []), "Epoch",
               *[TASK_LABELS.get(m, m) for m in task_metrics], "Train time (s)", "Size (MB)",
               "Peak mem. (MB)", *[TM_HEADERS[c] for c in tms]]
    if grouped:
        headers.append("n")
    digits = {"overall": 3, "best_epoch": 1 if grouped else 0, "train_time_s": 1, "model_size_mb": 2,
              "peak_memory_mb": 0, **{m: 3 for m in task_metrics}, **{c: 3 for c in tms}}
    rows = []
    # Dicts, not iterrows: a Series per row cost seconds on a 5,000-row table.
    for r in table.to_dict("records"):
        n = int(r["n"])
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
            label += f" ✗ ({r['reason'] or 'failed'})"
        cells = [label, r["lr"], r["weights"]]
        for name in ["overall", "best_epoch", *task_metrics, "train_time_s", "model_size_mb", "peak_memory_mb", *tms]:
            half = r.get(f"{name}_ci95", math.nan)
            cells.append(_cell(r[name], half, n, digits.get(name, 3)))
            if name == "overall" and with_delta:
                cells.append(_delta_cell(r[delta_col], r[f"{delta_col}_ci95"], r[f"{delta_col}_n"]))
        if grouped:
            cells.append(str(n))
        rows.append(cells)
    return headers, rows


TM_HEADERS = {TM_COLUMNS["compute"]: "TM-rel. (compute)", TM_COLUMNS["wall"]: "TM-rel. (wall)"}
CAPTION = ("* baseline (TM-relative = 1). † stopped early by ASHA (TM time on the full-budget basis). "
           "‡ interrupted (Ctrl-C, a signal or a tracking outage; `mtbert sweep resume` continues it). "
           "✗ failed, with its reason; failed and interrupted trials are listed one per row, after the others. "
           "Epoch is 1-based; seeds grouped as mean ± the half-width of the 95% confidence interval "
           "(t-distribution, n seeds; one seed shows no interval). Δ overall vs *: the difference to the "
           "baseline paired by seed (mean of the per-seed differences ± its 95% t-interval; n = seeds both "
           "ran). Peak mem.: CUDA peak allocated, or on CPU "
           "the trial process's peak resident set. TM-rel.: (overall / base) x (cost_base / cost) x "
           "(size_base / size), the cost on the full-budget basis: (compute) counted training FLOPs "
           "(tm_relative_score_compute), the same on any machine; (wall) measured train time "
           "(tm_relative_score), which the machine's load moves. The first is the sweep's headline "
           "(tracking.tm_score).")


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
    others = finished[finished["role"] != "reference"]
    out = {}
    for metric in ["overall", *table.attrs.get("task_metrics", [])]:
        if metric not in table or _nan(ref[metric]):
            continue
        low = others[others[metric] < ref[metric]]
        out[TASK_LABELS.get(metric, metric.capitalize())] = [
            r["regime"] + ("*" if r["role"] == "baseline" else "") for _, r in low.iterrows()]
    return out


def caption(table: pd.DataFrame) -> str:
    """CAPTION, then a legend entry for each mark only the rows of this table carry."""
    text = CAPTION
    if "wall_time_spread" in table and bool((table["wall_time_spread"] > WALL_SPREAD).any()):
        text += (f" {WALL_MARK} the configuration's runs took train times more than {WALL_SPREAD:.0%} apart "
                 "(max/min − 1): its TM-rel. (wall) measured the machine's load, not only the configuration.")
    if STANDS_FOR in table and bool((table[STANDS_FOR].astype(object).fillna("") != "").any()):
        text += (f" {ALSO_SEARCHED}: a searched configuration identical to the baseline (same config and seed) "
                 "was trained once, as the baseline: this row is both.")
    below = below_reference(table)
    if below is None:
        return text
    parts = [f"{name}: {', '.join(rows) if rows else 'none'}" for name, rows in below.items()]
    return (text + f" {REFERENCE_LABEL}: every encoder layer frozen, linear heads (mtbert.config.REFERENCE); "
            "rows whose mean is below it: " + "; ".join(parts) + ".")


def _markdown(headers: list[str], rows: list[list[str]], text: str = CAPTION, left: int = 3) -> str:
    """`left`: the label columns, aligned left; the numbers after them right."""
    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"
    align = ["---"] * left + ["---:"] * (len(headers) - left)
    return "\n".join([line(headers), "| " + " | ".join(align) + " |", *map(line, rows), "", text]) + "\n"


_LATEX_ESCAPES = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                  "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}


def _latex_escape(text: str) -> str:
    out = "".join(_LATEX_ESCAPES.get(c, c) for c in text)
    return (out.replace("±", r"$\pm$").replace("†", r"$^\dagger$").replace("–", "--")
            .replace("Δ", r"$\Delta$").replace(WALL_MARK, r"\S{}"))


def _latex(headers: list[str], rows: list[list[str]], text: str = CAPTION, left: int = 3) -> str:
    spec = "l" * left + "r" * (len(headers) - left)
    lines = [r"\begin{table}[t]", r"\centering", r"\small", rf"\begin{{tabular}}{{{spec}}}", r"\toprule",
             " & ".join(map(_latex_escape, headers)) + r" \\", r"\midrule"]
    lines += [" & ".join(map(_latex_escape, row)) + r" \\" for row in rows]
    lines += [r"\bottomrule", r"\end{tabular}", rf"\caption{{{_latex_escape(text)}}}", r"\end{table}"]
    return "\n".join(lines) + "\n"


def _html(headers: list[str], rows: list[list[str]], text: str = CAPTION, css: str = "mtbert-leaderboard") -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>\n" for row in rows)
    return (f"<table class=\"{css}\">\n<thead><tr>{head}</tr></thead>\n<tbody>\n{body}</tbody>\n"
            f"<caption>{html.escape(text)}</caption>\n</table>\n")


def _csv(table: pd.DataFrame) -> str:
    # Machines get the numbers, not the formatted cells.
    return table.to_csv(index=False)


def render(table: pd.DataFrame, fmt: str, importance: pd.DataFrame | None = None) -> str:
    """The table in `fmt`; md, latex and html follow it with the importance table when given
    (csv stays one table: the importance is a csv of its own, importance.render)."""
    if fmt not in FORMATS:
        raise SweepError(f"--format {fmt}: expected one of {', '.join(FORMATS)}")
    if fmt == "csv":
        return _csv(table)
    headers, rows = display_rows(table)
    text = {"md": _markdown, "latex": _latex, "html": _html}[fmt](headers, rows, caption(table))
    if importance is None or importance.empty:
        return text
    from orchestration import importance as imp

    heading = "\n**Importance of the swept dimensions**\n\n" if fmt == "md" else "\n"
    return text + heading + imp.render(importance, fmt)


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


def plot_pareto(table: pd.DataFrame, path: str | Path, title: str = "") -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = cost_axis(table)
    # Only finished configurations are points.
    data = table[table["status"] == "finished"] if "status" in table else table
    data = data.dropna(subset=["overall", x]) if not data.empty else data
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    if not data.empty:
        sizes = data["model_size_mb"].fillna(0.0)
        span = (sizes.max() - sizes.min()) or 1.0
        marker = 40 + 260 * (sizes - sizes.min()) / span
        points = ax.scatter(data[x], data["overall"], s=marker, c=sizes, cmap="viridis",
                            alpha=0.8, edgecolors="black", linewidths=0.5)
        fig.colorbar(points, ax=ax, label="model size (MB)")
        base = data[data["role"] == "baseline"]
        ax.scatter(base[x], base["overall"], marker="*", s=260, c="red", label="baseline", zorder=3)
        xy = list(zip(data[x], data["overall"]))
        front = [data.index[i] for i in pareto_front(xy)]
        fx, fy = data.loc[front, x], data.loc[front, "overall"]
        ax.step(fx, fy, where="post", color="tab:red", linewidth=1, label="Pareto front")
        for i in front:
            ax.annotate(str(data.loc[i, "variant"]), (data.loc[i, x], data.loc[i, "overall"]),
                        textcoords="offset points", xytext=(4, 4), fontsize=7)
        ax.legend(loc="best", fontsize=8)
    ax.margins(0.12)
    ax.set_xlabel("training FLOPs on the full epoch budget" if x == "tm_flops"
                  else "train time on the full epoch budget (s)")
    ax.set_ylabel("best dev overall")
    ax.set_title(title or ("overall vs training compute" if x == "tm_flops" else "overall vs train time"))
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


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


def log_artifact(uri: str, run, path: str | Path) -> None:
    """MlflowClient(uri).log_artifact(run id, path), without MLflow for local artifacts: for a
    local folder MLflow's artifact repository only copies the file in, through a temporary
    file it then renames, so a reader never sees half a file. Any other artifact store (a
    server's mlflow-artifacts:, S3, ...) goes through the client."""
    folder = _local_artifact_dir(getattr(run.info, "artifact_uri", None))
    if folder is None:
        _client(uri).log_artifact(run.info.run_id, str(path))
        return
    import os
    import shutil
    import tempfile

    folder.mkdir(parents=True, exist_ok=True)
    target = folder / Path(path).name
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

    from orchestration.importance import stored

    parent = tracking.client.get_run(tracking.parent_run_id)
    runs = child_runs(tracking.uri, tracking.experiment_id, tracking.parent_run_id, *table_keys(parent.data.tags))
    table = sort_table(build_table(runs, parent.data.tags))
    if table.empty:
        return False
    importance, _ = stored(tracking.uri, parent, table)
    with tempfile.TemporaryDirectory() as tmp:
        path = plot_pareto(table, Path(tmp) / "pareto.png", title=parent.info.run_name)
        (Path(tmp) / "leaderboard.md").write_text(render(table, "md", importance))
        (Path(tmp) / "leaderboard.csv").write_text(render(table, "csv"))
        for name in ("pareto.png", "leaderboard.md", "leaderboard.csv"):
            tracking.client.log_artifact(tracking.parent_run_id, str(Path(tmp) / name))
    return True


log_pareto = log_leaderboard  # the name callers knew


def leaderboard(uri: str, experiment: str, sweep: str | None = None, fmt: str = "md",
                sort: str = "overall", plot: str | Path | None = None,
                importance_plot: str | Path | None = None) -> tuple[str, pd.DataFrame, Any]:
    """(rendered table, the table, the parent run); draws and logs the Pareto plot if `plot`.
    The importance the parent holds for these runs follows the table (md, latex, html) and is
    drawn to `importance_plot`; importance.stored says why when there is none."""
    from orchestration.importance import plot_importance, stored

    experiment_id, parent = find_sweep(uri, experiment, sweep)
    runs = child_runs(uri, experiment_id, parent.info.run_id, *table_keys(parent.data.tags))
    table = sort_table(build_table(runs, parent.data.tags), sort)
    if table.empty:
        raise SweepError(f"sweep {parent.info.run_name} ({parent.info.run_id}) has no finished trials yet")
    if plot is not None:
        path = plot_pareto(table, plot, title=parent.info.run_name)
        log_artifact(uri, parent, path)
    importance, _ = stored(uri, parent, table)
    if importance is not None and importance_plot is not None:
        plot_importance(importance, importance_plot, title=parent.info.run_name)
    return render(table, fmt, importance), table, parent
