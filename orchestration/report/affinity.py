"""The inter-task affinities a sweep's trials measured (affinity.every_steps, docs/affinity.md):
per configuration, each pair's mean over its seeds with a 95% t-interval (a trial's value is
the mean of its epochs' means), as a section of the leaderboard; and `mtbert affinity`, which
turns them into a suggested grouping of the tasks (mtbert/train/grouping.py) and a sweep
fragment that trains it.

Where the affinities come from: a sweep (its parent run's name or id; the trial runs'
epoch/affinity/... and epoch/cosine/... series), one MLflow run (a trial's, by id) or a
`mtbert train --output` folder (its affinity/affinity.json).
"""
from __future__ import annotations

import json
import math
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from mtbert.train import grouping as gr
from orchestration.errors import SweepError
from orchestration.report import export, reader
from orchestration.stats import mean_ci

EPOCH_PREFIX = "epoch/"  # tracking logs each epoch's figures under it (orchestration/track/tracking.py)
SERIES = tuple(f"{EPOCH_PREFIX}{kind}/" for kind in (gr.AFFINITY, gr.COSINE))
HEADING = "Inter-task affinity"
FOLDER_FILE = Path(gr.FOLDER) / gr.JSON_FILE  # in a `mtbert train --output` folder (train/affinity.py)


@dataclass
class Measured:
    """Affinities of one source: one row per run and series (variant, seed, run, name, value:
    the run's mean over its epochs), the tasks, and the config the runs share (a fragment's base)."""
    rows: pd.DataFrame
    tasks: list[str]
    base: dict = field(default_factory=dict)
    label: str = ""

    def means(self, variant: str | None = None) -> dict[str, float]:
        """Each series' mean over the runs (of one configuration when `variant` is given)."""
        rows = self.rows if variant is None else self.rows[self.rows["variant"] == variant]
        return rows.groupby("name")["value"].mean().to_dict()


# --------------------------------------------------------------------------- reading

def epochs_mean(history) -> float:
    """The mean over epochs of a metric's history, the latest value per step (a re-run epoch's)."""
    latest: dict[int, Any] = {}
    for m in sorted(history, key=lambda m: m.timestamp):
        latest[m.step] = m.value
    return float(sum(latest.values()) / len(latest)) if latest else math.nan


def run_rows(client, run_id: str, names: list[str], variant: str, seed: Any) -> list[dict]:
    return [{"variant": variant, "seed": seed, "run": run_id, "name": name[len(EPOCH_PREFIX):],
             "value": epochs_mean(client.get_metric_history(run_id, name))} for name in names]


def series_keys(metrics: dict[str, float] | pd.Series) -> list[str]:
    return sorted(k for k in metrics.keys() if k.startswith(SERIES))


def from_sweep(uri: str, experiment: str, sweep: str | None = None, say=None) -> tuple[Measured, Any]:
    """The affinities of a sweep's finished trials, and its parent run."""
    experiment_id, parent = reader.find_sweep(uri, experiment, sweep, say)
    return sweep_measured(uri, experiment_id, parent), parent


def sweep_rows(uri: str, experiment_id: str, parent) -> pd.DataFrame:
    """One row per finished trial and series (Measured.rows); empty when none measured any."""
    runs = reader.child_runs(uri, experiment_id, parent.info.run_id, params=[], tags=["variant", "seed"])
    runs = runs[runs["status"] == "FINISHED"]
    names = [c for c in runs.columns if c.startswith("metrics.") and c[len("metrics."):].startswith(SERIES)]
    if not names:  # no trial measured: no history to read
        return _frame([])
    keys = {r["run_id"]: [c[len("metrics."):] for c in names if pd.notna(r[c])] for _, r in runs.iterrows()}
    means = series_means(uri, keys)
    return _frame([{"variant": r.get("tags.variant") or "", "seed": r.get("tags.seed"), "run": r["run_id"],
                    "name": key[len(EPOCH_PREFIX):], "value": means[(r["run_id"], key)]}
                   for _, r in runs.iterrows() for key in keys[r["run_id"]] if (r["run_id"], key) in means])


def series_means(uri: str, keys: dict[str, list[str]]) -> dict[tuple[str, str], float]:
    """(run, key) -> the run's mean over its epochs of each key (the latest value per step, a
    re-run epoch's): from a sqlite store's metrics table in one query, else through MLflow."""
    if uri.startswith("sqlite:///"):
        try:
            con = reader.mlflow_sqlite(uri)
            try:
                runs = list(keys)
                frame = pd.read_sql_query(
                    f"SELECT run_uuid, key, step, value, timestamp FROM metrics WHERE run_uuid IN "
                    f"({', '.join('?' * len(runs))}) AND ({' OR '.join(['substr(key, 1, ?) = ?'] * len(SERIES))})",
                    con, params=(*runs, *(x for prefix in SERIES for x in (len(prefix), prefix))))
            finally:
                con.close()
            latest = frame.sort_values("timestamp", kind="stable").drop_duplicates(["run_uuid", "key", "step"],
                                                                                    keep="last")
            return {k: float(v) for k, v in latest.groupby(["run_uuid", "key"])["value"].mean().items()}
        except (sqlite3.Error, pd.errors.DatabaseError):
            pass  # a schema the SQL reader does not know: the API
    client = reader.mlflow_client(uri)
    return {(run, key): epochs_mean(client.get_metric_history(run, key)) for run, names in keys.items()
            for key in names}
def sweep_measured(uri: str, experiment_id: str, parent) -> Measured:
    base = yaml.safe_load(reader.parent_artifact(uri, parent, "base_config.yaml") or "") or {}
    return Measured(sweep_rows(uri, experiment_id, parent), reader.sweep_tasks(parent.data.tags), base,
                    parent.info.run_name)


def from_run(uri: str, run_id: str) -> Measured:
    """One MLflow run's affinities (a trial's)."""
    client = reader.mlflow_client(uri)
    run = client.get_run(run_id)
    rows = run_rows(client, run_id, series_keys(run.data.metrics), run.data.tags.get("variant", ""),
                    run.data.tags.get("seed"))
    config = yaml.safe_load(reader.parent_artifact(uri, run, "config.yaml") or "") or {}
    return Measured(_frame(rows), config.get("tasks") or _tasks(rows), config, run.info.run_name)


def from_folder(folder: Path) -> Measured:
    """A `mtbert train --output` folder's affinities (affinity/affinity.json, result.json)."""
    path = folder / FOLDER_FILE
    if not path.is_file():
        raise SweepError(f"{folder}: no {FOLDER_FILE} (train with affinity.every_steps > 0 and --output)")
    doc = json.loads(path.read_text())
    means = gr.mean_over_epochs({int(e): m for e, m in doc["epochs"].items()})
    rows = [{"variant": "", "seed": None, "run": str(folder), "name": n, "value": v} for n, v in means.items()]
    result = folder / "result.json"
    config = json.loads(result.read_text()).get("config", {}) if result.is_file() else {}
    return Measured(_frame(rows), doc["tasks"], config, folder.name)


def _frame(rows: list[dict]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["variant", "seed", "run", "name", "value"])


def _tasks(rows: list[dict]) -> list[str]:
    return gr.tasks_of(gr.affinities({r["name"]: r["value"] for r in rows}))


# --------------------------------------------------------------------------- the table

def interval_table(measured: Measured) -> pd.DataFrame:
    """Per configuration and series: the mean over its seeds, the 95% interval's ends and the
    seed count (NaN ends under two seeds). Whole-set series first, then per part."""
    out = []
    for (variant, name), values in measured.rows.groupby(["variant", "name"])["value"]:
        parsed = gr.parse_name(name)
        if parsed is None:
            continue
        mean, half, n = mean_ci(values)
        kind, part, first, second = parsed
        out.append({"variant": variant, "part": part or "shared", "kind": kind, "pair": f"{first} → {second}"
                    if kind == gr.AFFINITY else f"{first} · {second}", "mean": mean, "ci_low": mean - half,
                    "ci_high": mean + half, "seeds": n})
    table = pd.DataFrame(out, columns=["variant", "part", "kind", "pair", "mean", "ci_low", "ci_high", "seeds"])
    order = {"shared": 0, gr.ENCODER: 1, gr.HEADS: 2}
    return table.sort_values(["variant", "part", "kind", "pair"], key=lambda s: s.map(order).fillna(9)
                             if s.name == "part" else s, kind="stable").reset_index(drop=True)


def export_table(table: pd.DataFrame) -> export.Table:
    """The interval table in print: one row per configuration, part and pair."""
    rows = []
    for _, r in table.iterrows():
        aside = f"[{r['ci_low']:+.3g}, {r['ci_high']:+.3g}]" if r["seeds"] > 1 else ""
        rows.append([export.Cell(str(r["variant"]) or "-"), export.Cell(r["part"]), export.Cell(r["kind"]),
                     export.Cell(r["pair"]), export.Cell(f"{r['mean']:+.3g}", aside), export.Cell(str(int(r["seeds"])))])
    caption = (f"{HEADING}: per configuration, each trial's mean over its epochs, then the mean over seeds "
               "with its 95% t-interval. affinity i → j: TAG's lookahead 1 − L_j(θ − η∇L_i)/L_j(θ) (> 0: a step "
               "on i lowers j's loss); cosine: of the two tasks' gradients on the shared parameters. part: the "
               "whole shared set, or its encoder or head layers alone (docs/affinity.md).")
    return export.Table(["Configuration", "Part", "Kind", "Pair", "Mean [95% CI]", "Seeds"], rows, caption, left=4)


def section(uri: str, experiment_id: str, parent) -> pd.DataFrame | None:
    """The leaderboard's affinity table of a sweep, None when no trial measured one."""
    rows = sweep_rows(uri, experiment_id, parent)
    return interval_table(Measured(rows, [])) if not rows.empty else None


# --------------------------------------------------------------------------- the suggestion

@dataclass
class Suggestion:
    tasks: list[str]
    by_size: dict[int, tuple[float, gr.Grouping]]  # groups -> (TAG score, the best grouping)
    best: tuple[float, gr.Grouping]
    runnable: tuple[float, gr.Grouping]  # the best grouping sharing.head_share_tasks can train
    keys: dict  # the sharing keys of `runnable`


def suggest(measured: Measured, variant: str | None = None) -> Suggestion:
    z = gr.affinities(measured.means(variant))
    if not z:
        raise SweepError(f"{measured.label}: no affinity measured (train with affinity.every_steps > 0)")
    tasks = [t for t in measured.tasks if t in gr.tasks_of(z)] or gr.tasks_of(z)
    runnable = gr.expressible(tasks, z)
    depth = len(_regime(measured.base))
    return Suggestion(tasks, gr.best_groupings(tasks, z), gr.best_grouping(tasks, z), runnable,
                      gr.sharing_keys(runnable[1], tasks, depth))


def _regime(config: dict) -> list[str]:
    regime = (config.get("sharing") or {}).get("head_regime", "I-I-I")
    return [] if regime in (None, "none") else str(regime).split("-")


def fragment(suggestion: Suggestion, measured: Measured, name: str, source: str) -> str:
    """A sweep file that trains the suggested grouping against sharing every head layer by all
    tasks and by none (the baseline), on the source's settings with the telemetry off."""
    keys = suggestion.keys
    base = json.loads(json.dumps(measured.base))  # a copy of plain data
    base.pop("affinity", None)
    for key in ("head_regime", "head_share_tasks"):
        (base.get("sharing") or {}).pop(key, None)
    score, grouping = suggestion.runnable
    share = keys["sharing.head_share_tasks"]
    values = [share, None] if share is not None else [None]
    regime = keys["sharing.head_regime"].replace("I", "S")
    doc = {"name": name, "description": f"the grouping {gr.format_grouping(grouping)} that `mtbert affinity` "
           f"suggested from {source}, against all tasks sharing the head layers and none",
           "base": base,
           "space": {"sharing.head_share_tasks": {"type": "grid", "values": values},
                     "sharing.head_regime": {"type": "grid", "values": [regime]}},
           "search": {"algorithm": "grid", "metric": "best_overall", "mode": "max"},
           "scheduler": {"type": "fifo"},
           "baseline": {"sharing.head_regime": regime.replace("S", "I")},
           "seeds": [0, 1, 2],
           "tracking": {"experiment": name}}
    best_score, best = suggestion.best
    header = [f"# Suggested by `mtbert affinity {source}` from the measured inter-task affinities.",
              f"# Best grouping (TAG score {best_score:+.4g}): {gr.format_grouping(best)}",
              f"# What sharing.head_share_tasks trains (score {score:+.4g}): {gr.format_grouping(grouping)}",
              "# Run it (from where the source's relative paths resolve):",
              f"#   mtbert sweep run {name}.yaml",
              f"#   mtbert sweep run {name}.yaml --smoke   # seconds: tiny model, synthetic data"]
    if best != grouping:
        header.insert(3, "# (two groups of several tasks: no sharing key trains that; docs/affinity.md)")
    return "\n".join(header) + "\n" + yaml.safe_dump(doc, sort_keys=False)


def render_suggestion(suggestion: Suggestion, measured: Measured) -> str:
    """What `mtbert affinity` prints: the mean matrix, the best grouping per number of groups,
    and the suggestion."""
    mats = gr.matrices(measured.means(), suggestion.tasks)
    width = max(len(t) for t in suggestion.tasks) + 2
    lines = [f"affinity Z(row -> column), mean over {measured.rows['run'].nunique()} run(s) of {measured.label}:",
             " " * width + "".join(f"{t:>{width - 1}} " for t in suggestion.tasks)]
    for i, t in enumerate(suggestion.tasks):
        cells = "".join(f"{'-':>{width - 1}} " if math.isnan(v) else f"{v:>+{width - 1}.3g} " for v in mats[gr.AFFINITY][i])
        lines.append(f"{t:<{width}}{cells}")
    lines.append("best grouping per number of groups (TAG score: each task's mean affinity from its group):")
    lines += [f"  {k} group(s): {s:+.4g}  {gr.format_grouping(g)}" for k, (s, g) in suggestion.by_size.items()]
    best_score, best = suggestion.best
    score, runnable = suggestion.runnable
    lines.append(f"suggested: {gr.format_grouping(best)} (score {best_score:+.4g})")
    if runnable != best:
        lines.append(f"trainable with sharing.head_share_tasks: {gr.format_grouping(runnable)} (score {score:+.4g})")
    lines.append("sharing keys: " + ", ".join(f"{k}={v}" for k, v in suggestion.keys.items()))
    return "\n".join(lines) + "\n"


def from_source(uri: str, source: str, experiment: str | None = None, say=None) -> Measured:
    """A run id (a sweep's parent run, or one trial's run), else a sweep by name in `experiment`
    (without one, `source` is the experiment and its latest sweep is read)."""
    if len(source) == 32 and all(c in "0123456789abcdef" for c in source):
        run = reader.mlflow_client(uri).get_run(source)
        if run.data.tags.get("role") != "sweep":
            return from_run(uri, source)
        return sweep_measured(uri, run.info.experiment_id, run)
    return from_sweep(uri, experiment or source, source if experiment else None, say)[0]


def plot_mean(suggestion: Suggestion, measured: Measured, path: str | Path) -> Path:
    """The heatmap of the mean affinities and cosines the suggestion read."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return gr.draw_heatmap(gr.matrices(measured.means(), suggestion.tasks), path,
                           f"inter-task affinity, mean over {measured.rows['run'].nunique()} run(s) of {measured.label}",
                           suggestion.tasks)


# --------------------------------------------------------------------------- the prediction checked

REGIME_PARAM = "params.sharing.head_regime"
DEPTH_PARAM = "params.sharing.encoder_shared_layers"


@dataclass
class RegimeCheck:
    """The ranking of the head regimes, or of the shared encoder depths, that one run's
    per-layer affinities predict, against the scores a sweep of them measured (`mtbert affinity
    ... --against`)."""
    predicted: dict[str, float]  # regime or depth -> predicted score (grouping.regime_scores, depth_scores)
    measured: dict[str, dict[Any, float]]  # regime or depth -> seed -> the measured figure
    rho: float  # Spearman's rank correlation of the predicted scores and the measured means
    rho_per_seed: tuple[float, float, int]  # mean, 95% half-width and n of rho over the seeds all share
    verdict: Any  # the predicted best against the measured best (orchestration/report/verdicts.py)
    compute: float  # the affinity runs' train_flops over the measured sweep's
    metric: str = "overall"
    dimension: str = "head regimes"  # or "encoder depths": what `against` varies


def spearman(x: list[float], y: list[float]) -> float:
    """Spearman's rho with ties at their mean rank (NaN when either side is constant)."""
    rx, ry = pd.Series(x).rank(), pd.Series(y).rank()
    return float(rx.corr(ry)) if rx.nunique() > 1 and ry.nunique() > 1 else math.nan


def predictions(measured: Measured, variant: str | None, runs: pd.DataFrame) -> tuple[str, str, dict[str, float]]:
    """(the param the measured sweep's `runs` vary, what it is called, the predicted score of
    each of its values): the shared encoder depth k (its logged values: "0".."L", "None" = all
    L) where the runs vary it, else the S/I head regime."""
    means = measured.means(variant)
    if reader.col(runs, DEPTH_PARAM).nunique() > 1:
        parts = {gr.parse_name(name)[1] for name in means if gr.parse_name(name)}
        layers = sum(gr.encoder_layer(k) in parts for k in range(1, len(parts) + 1))
        scores = gr.depth_scores(means, measured.tasks, layers) if layers > 1 else None
        if scores is None:
            raise SweepError(f"{measured.label}: no affinity per encoder layer (train a fine-tuned run sharing "
                             "every encoder layer with affinity.per_part)")
        return DEPTH_PARAM, "encoder depths", {**{str(k): v for k, v in scores.items()}, "None": scores[layers]}
    depth = len(_regime(measured.base))
    predicted = gr.regime_scores(means, measured.tasks, depth)
    if predicted is None:
        raise SweepError(f"{measured.label}: no affinity per head layer (train a regime sharing every head "
                         "layer, S-...-S, with affinity.per_part)")
    return REGIME_PARAM, "head regimes", predicted


def check_regimes(measured: Measured, variant: str | None, uri: str, against: str, metric: str = "overall",
                  say=None) -> RegimeCheck:
    """Rank what `against`'s latest sweep varies (the S/I head regimes, or the shared encoder
    depth) by the affinities of each shared layer (measured.rows of a run sharing them all,
    `variant`'s trials; predictions) and compare with what the sweep trained: Spearman's rho of
    the means, rho per common seed with its t-interval, and a claim that the predicted best is
    within δ = 0.01 of the measured best, paired by seed (which, picked as the best of the
    measured, is favoured: the claim is the generous reading)."""
    from orchestration.report import verdicts
    from orchestration.report.findings import read_runs

    _, parent = reader.find_sweep(uri, against, None, say)
    runs = read_runs(uri, [against], parent.info.run_id)
    runs = runs[(reader.col(runs, "tags.variant") != "reference") & (reader.col(runs, "status") == "FINISHED")]
    if metric not in {c[len("metrics."):] for c in runs.columns if c.startswith("metrics.")}:
        raise SweepError(f"{against}: its runs logged no {metric!r}")
    param, dimension, predicted = predictions(measured, variant, runs)
    scores = {value: verdicts.seed_means(group[f"metrics.{metric}"], group["tags.seed"])
              for value, group in runs.groupby(param) if value in predicted}
    if len(scores) < 3:
        raise SweepError(f"{against}: {len(scores)} of the {dimension} the affinities rank trained; a ranking needs 3")
    names = sorted(scores)
    means = [float(pd.Series(scores[r]).mean()) for r in names]
    shared = set.intersection(*(set(scores[r]) for r in names))
    per_seed = [spearman([predicted[r] for r in names], [scores[r][s] for r in names]) for s in sorted(shared)]
    best_predicted = max(names, key=lambda r: (predicted[r], r))
    best_measured = names[max(range(len(names)), key=means.__getitem__)]
    claim = verdicts.claim(f"predicted best {best_predicted} within 0.01 of the measured best {best_measured}",
                           best_predicted, best_measured, "≈", metric=metric, error_rate="claim")
    verdict = verdicts.decide(scores[best_predicted], scores[best_measured], claim) \
        if best_predicted != best_measured else None
    spent = spent_flops(uri, measured, variant)
    return RegimeCheck(predicted, scores, spearman([predicted[r] for r in names], means),
                       mean_ci([r for r in per_seed if not math.isnan(r)]), verdict,
                       float(spent / runs["metrics.train_flops"].sum()) if spent else math.nan, metric, dimension)


def spent_flops(uri: str, measured: Measured, variant: str | None) -> float:
    """The train_flops of the runs whose affinities were read (the prediction's cost), each run
    read by its id; 0 for a `mtbert train --output` folder, which is no MLflow run."""
    rows = measured.rows if variant is None else measured.rows[measured.rows["variant"] == variant]
    ids = [r for r in set(rows["run"]) if len(r) == 32 and all(c in "0123456789abcdef" for c in r)]
    client = reader.mlflow_client(uri) if ids else None
    return float(sum(client.get_run(r).data.metrics.get("train_flops", 0.0) for r in ids))


def render_check(check: RegimeCheck, against: str) -> str:
    """What `mtbert affinity --against` prints: each regime's predicted score beside its measured
    mean, the rank correlation, the best's verdict and the compute the prediction took."""
    order = sorted(check.measured, key=lambda r: -check.predicted[r])
    lines = [f"{check.dimension}, predicted from the affinities vs measured by {against} ({check.metric}):",
             f"  {'regime' if check.dimension == 'head regimes' else 'k shared':<8} {'predicted':>10} "
             f"{'measured':>9}  seeds"]
    for r in order:
        mean, half, n = mean_ci(check.measured[r].values())
        lines.append(f"  {r:<8} {check.predicted[r]:>+10.3g} {mean:>9.4f}  {n}"
                     + (f"  ± {half:.4f}" if not math.isnan(half) else ""))
    mean, half, n = check.rho_per_seed
    lines.append(f"Spearman rho of the means: {check.rho:+.2f}; per seed: {mean:+.2f}"
                 + (f" ± {half:.2f} (95% t-interval over {n} seeds)" if not math.isnan(half) else f" ({n} seed(s))"))
    if check.verdict is None:
        lines.append("the predicted best is the measured best")
    else:
        v, found = check.verdict, check.verdict.interval
        needs = f"; about {v.seeds_needed} seeds would decide it" if v.seeds_needed else ""
        ends = (f"[{found.low:+.4f}, {found.high:+.4f}]" if math.isfinite(found.low) and math.isfinite(found.high)
                else "(no interval: too few seeds)")
        lines.append(f"the predicted best against the measured best: {v.outcome}, {found.method} "
                     f"{found.centre:+.4f} {ends} (n={found.n}, δ 0.01{needs})")
    if not math.isnan(check.compute):
        lines.append(f"compute: the affinity runs' train_flops are {check.compute:.1%} of the measured sweep's")
    return "\n".join(lines) + "\n"
