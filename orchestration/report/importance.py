"""Which swept dimensions matter: for each figure of a sweep (the task scores, overall and the
headline TM-relative score), how much of its spread across configurations each `space:` key
explains, with an interval from resampling seeds.

    mtbert importance --experiment smoke                      # the table; the bar chart beside it

Method. One point per configuration: its figures averaged over its seeds, one trial of an
in-memory Optuna study whose params are the configuration's values of the swept keys (a grid
or choice categorical, a range a number; a key that took one value is left out). A `points`
dimension (tied keys set together) is one categorical factor: a share per key would split one
effect between its keys at random. Optuna's fANOVA gives each key's main-effect share of the
figure's variance (summing to 1 over the keys). Not PED-ANOVA: it compares the configurations
above a quantile (the top 10%) with all of them, one or two at this sweep size, so whichever
pair happened to win would decide; fANOVA's forest uses every configuration.

Interval. RESAMPLES times (a fixed RNG seed): each configuration's seeds drawn with
replacement, the importances recomputed; the 2.5 and 97.5 percentiles are the 95% interval.
One seed per configuration: no interval.

The configurations: the searched ones, and the baseline where it stands for a searched point
(plan.py). Any other baseline, and the frozen reference, differ from the space outside its
keys, which would read as an effect of the keys.

Stored on the parent run (importance.csv, importance.png) by the end of a sweep and by `mtbert
importance`; `mtbert leaderboard` shows the stored table when it was computed from the
finished runs it reads, and otherwise says how to compute it (a leaderboard stays seconds).
"""
from __future__ import annotations

import json
import math
import shutil
import tempfile
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import pandas as pd

from orchestration.errors import SweepError
from orchestration.report import export
from orchestration.report.export import Cell
from orchestration.sweep.labels import STANDS_FOR, parse_param
from orchestration.sweep.space import POINTS_TAG

RESAMPLES = 100
RNG_SEED = 0
# Not Optuna's 64: a forest per figure and resample is the whole cost (16 trees: about 0.05 s at
# a dozen configurations), and the resamples' spread takes in the forest's own noise.
N_TREES = 16
LEVEL = 0.95
MIN_CONFIGURATIONS = 3
AT_END_MAX_CONFIGURATIONS = 200  # above: the end of a sweep leaves it to `mtbert importance`
MAX_NUMERIC_CATEGORIES = 8  # a grid/choice of more numbers than this is read as a range
CSV = "importance.csv"
PNG = "importance.png"
SPACE_DOC = "search_space.json"  # the parent's artifact that describes each dimension (launch.py)
COLUMNS = ["figure", "dimension", "importance", "low", "high", "configurations", "runs", "resamples"]


# --------------------------------------------------------------------------- the points

def figures(parent_tags: dict[str, str], tm: str) -> list[str]:
    """The figures assessed: the sweep's task scores, overall and its headline TM score."""
    from orchestration.report.leaderboard import _task_metrics

    return [*_task_metrics(parent_tags), "overall", tm]


def importance_keys(parent_tags: dict[str, str]) -> tuple[list[str], list[str], list[str]]:
    """(params, metrics, tags) of the child runs the importance reads (leaderboard.child_runs)."""
    keys = _space_keys(parent_tags)
    params = [*keys, *(["loss.weights."] if "loss.weights" in keys else [])]
    metrics = [*figures(parent_tags, "tm_relative_score"), "tm_relative_score_compute"]
    return params, metrics, ["variant", "role", "seed", STANDS_FOR]


def _space_keys(parent_tags: dict[str, str]) -> list[str]:
    return [k for k in parent_tags.get("space_keys", "").split(",") if k]


def _tied(parent_tags: dict[str, str]) -> dict[str, list[str]]:
    """Each points dimension's name -> its config keys (the sweep run's POINTS_TAG)."""
    try:
        tied = json.loads(parent_tags.get(POINTS_TAG) or "{}")
    except ValueError:
        return {}
    return {str(name): [str(k) for k in keys] for name, keys in tied.items() if isinstance(keys, list)}


def _factors(keys: list[str], parent_tags: dict[str, str]) -> list[tuple[str, list[str]]]:
    """(factor name, its keys) in the space's order: a swept key alone, or a points dimension
    with all of its keys, at the place of its first key."""
    tied = _tied(parent_tags)
    owner = {k: name for name, group in tied.items() for k in group}
    out: list[tuple[str, list[str]]] = []
    for key in keys:
        if key not in owner:
            out.append((key, [key]))
        elif all(name != owner[key] for name, _ in out):
            out.append((owner[key], [k for k in tied[owner[key]] if k in keys]))
    return out


def eligible(role: pd.Series, stands_for: pd.Series) -> pd.Series:
    """The rows (runs or configurations) that are points of the space."""
    return (role == "search") | ((role == "baseline") & (stands_for.astype(object).fillna("") != ""))


@dataclass
class Dim:
    """A swept key as Optuna sees it: categorical (choices) or a number range."""
    name: str
    kind: str  # categorical | int | float
    choices: list[str] = field(default_factory=list)
    low: float = 0.0
    high: float = 0.0
    log: bool = False

    def distribution(self):
        from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

        if self.kind == "categorical":
            return CategoricalDistribution(self.choices)
        if self.kind == "int":
            return IntDistribution(int(self.low), int(self.high))
        return FloatDistribution(self.low, self.high, log=self.log)


@dataclass
class Points:
    """The configurations (index: variant) with their encoded values of each Dim, and the
    finished runs (variant, one column per figure) whose seed means are the values assessed."""
    values: pd.DataFrame
    dims: list[Dim]
    runs: pd.DataFrame
    figures: list[str]


def _label(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)


def _encode(key: str, values: list[Any], spec: dict[str, Any] | None) -> list[tuple[Dim, list[Any]]]:
    """A swept key's per-configuration values as Dims (several for a continuous simplex), each
    with its encoded values; none when the key took a single value. `spec` is the dimension
    as the sweep described it (search_space.json); without it, numbers are linear ranges."""
    kind = (spec or {}).get("type")
    if all(isinstance(v, dict) for v in values) and kind in ("simplex", None):
        labels = [_label(v) for v in values]
        continuous = (spec.get("distribution") is not None if spec else len(set(labels)) == len(labels))
        if continuous:
            # Dirichlet draws make every weighting unique: a category per configuration would
            # only name the configuration, so each task's weight is a number of its own.
            tasks = list(dict.fromkeys(t for v in values for t in v))
            return [(Dim(f"{key}[{t}]", "float", low=min(w), high=max(w)), w)
                    for t in tasks if len(set(w := [float(v.get(t, 0.0)) for v in values])) > 1]
        values = labels
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
    # A grid or choice of a few numbers stays categorical (freeze -1 is "all", not below 0); a
    # fine lattice of them is a range, and as categories it would cost fANOVA minutes.
    ordered = kind not in ("grid", "choice", "simplex") or len(set(values)) > MAX_NUMERIC_CATEGORIES
    if numbers and ordered:
        if len(set(values)) < 2:
            return []
        if all(isinstance(v, int) for v in values):
            return [(Dim(key, "int", low=min(values), high=max(values)), [int(v) for v in values])]
        log = min(values) > 0 and (kind == "loguniform" or max(values) / min(values) >= 10)
        return [(Dim(key, "float", low=float(min(values)), high=float(max(values)), log=log),
                 [float(v) for v in values])]
    labels = [_label(v) for v in values]
    choices = list(dict.fromkeys(labels))
    return [(Dim(key, "categorical", choices=choices), labels)] if len(choices) > 1 else []


def points(runs: pd.DataFrame, parent_tags: dict[str, str], tm: str,
           space: dict[str, dict] | None = None) -> Points:
    """The sweep's configurations from its child runs (leaderboard.child_runs' frame)."""
    from orchestration.report.leaderboard import _col, _weights

    keys = _space_keys(parent_tags)
    keep = (_col(runs, "status") == "FINISHED") & eligible(_col(runs, "tags.role"), _col(runs, f"tags.{STANDS_FOR}"))
    done = runs[keep]
    names = figures(parent_tags, tm)
    frame = pd.DataFrame({"variant": _col(runs, "tags.variant")[keep].values})
    for name in names:
        frame[name] = pd.to_numeric(_col(runs, f"metrics.{name}")[keep], errors="coerce").values
    params_cols = [c for c in done.columns if c.startswith("params.")]
    first = done.assign(_variant=frame["variant"].values).drop_duplicates("_variant")
    raw: dict[str, list[Any]] = {k: [] for k in keys}
    for row in first[params_cols].itertuples(index=False, name=None):
        params = {c[len("params."):]: v for c, v in zip(params_cols, row) if isinstance(v, str)}
        for key in keys:
            raw[key].append(_weights(params) if key == "loss.weights" else parse_param(params.get(key)))
    values = pd.DataFrame(index=pd.Index(first["_variant"].values, name="variant"))
    dims: list[Dim] = []
    for name, group in _factors(keys, parent_tags):
        if group == [name]:
            encoded = _encode(name, raw[name], (space or {}).get(name))
        else:  # a points dimension: a configuration's point is the values of all its keys
            labels = [" ".join(f"{k}={_label(raw[k][i])}" for k in group) for i in range(len(first))]
            encoded = _encode(name, labels, {"type": "points"})
        for dim, column in encoded:
            dims.append(dim)
            values[dim.name] = column
    return Points(values, dims, frame, names)


def space_doc(uri: str, parent) -> dict[str, dict] | None:
    """The parent run's description of each dimension (search_space.json), None without one."""
    text = _parent_artifact(uri, parent, SPACE_DOC)
    return json.loads(text).get("dimensions") if text else None


def _parent_artifact(uri: str, parent, name: str) -> str | None:
    """A small text artifact of the parent run: read in place when local (no MLflow), else
    downloaded; None when the run has none."""
    from orchestration.report.leaderboard import _client, _local_artifact_dir, no_download_bar

    folder = _local_artifact_dir(getattr(parent.info, "artifact_uri", None))
    if folder is not None:
        path = folder / name
        return path.read_text() if path.is_file() else None
    try:
        with tempfile.TemporaryDirectory() as tmp, no_download_bar():
            return Path(_client(uri).download_artifacts(parent.info.run_id, name, tmp)).read_text()
    except Exception:  # noqa: BLE001 - MLflow raises its own kinds for a missing artifact
        return None


# --------------------------------------------------------------------------- the estimate

@contextmanager
def _quiet_optuna() -> Iterator[None]:
    """Optuna announces every study it creates; a report of many in-memory studies is not news."""
    import optuna

    before = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        yield
    finally:
        optuna.logging.set_verbosity(before)


def _fanova(values: pd.DataFrame, dims: list[Dim], y: np.ndarray) -> dict[str, float]:
    """Normalised fANOVA importances of `dims` for the configurations' values y (NaN: left
    out); {} with fewer than MIN_CONFIGURATIONS points or no dimension that varies among them."""
    import optuna
    from optuna.importance import FanovaImportanceEvaluator, get_param_importances

    finite = np.isfinite(y)
    if finite.sum() < MIN_CONFIGURATIONS or np.ptp(y[finite]) == 0:  # nothing to explain
        return {}
    rows = values[finite]
    used = [d for d in dims if rows[d.name].nunique() > 1]
    if not used:
        return {}
    distributions = {d.name: d.distribution() for d in used}
    study = optuna.create_study()
    study.add_trials([optuna.trial.create_trial(params=dict(zip(distributions, row)), distributions=distributions,
                                                value=float(v))
                      for row, v in zip(rows[list(distributions)].itertuples(index=False, name=None), y[finite])])
    try:
        found = get_param_importances(study, evaluator=FanovaImportanceEvaluator(n_trees=N_TREES, seed=RNG_SEED))
    except RuntimeError:  # every tree's bootstrap drew equal values: no variance to share out
        return {}
    return {name: float(v) for name, v in found.items()}


MAX_RESAMPLES = 10_000  # each resample fits the forests again: beyond it, hours for the third digit


def check_resamples(resamples: int) -> None:
    if resamples < 0:
        raise SweepError(f"--resamples {resamples}: must be >= 0 (0: the estimate without an interval)")
    if resamples > MAX_RESAMPLES:
        raise SweepError(f"--resamples {resamples}: over the bound of {MAX_RESAMPLES:,}")


def compute(p: Points, resamples: int = RESAMPLES, rng_seed: int = RNG_SEED) -> pd.DataFrame:
    """COLUMNS, one row per (figure, dimension): the importance of the seed means and its
    percentile interval over `resamples` seed resamples (NaN with one seed per configuration)."""
    check_resamples(resamples)
    if p.values.empty:
        return pd.DataFrame(columns=COLUMNS)
    y = p.runs[p.figures].to_numpy(dtype=float)
    rows_of = p.runs.groupby("variant", sort=False).indices  # variant -> its runs' positions
    groups = [rows_of[v] for v in p.values.index]

    def means(picks: list[np.ndarray]) -> np.ndarray:
        with warnings.catch_warnings():  # a configuration whose drawn seeds lack a figure: NaN
            warnings.simplefilter("ignore", RuntimeWarning)
            return np.vstack([np.nanmean(y[g], axis=0) for g in picks])

    resampled = resamples if any(len(g) > 1 for g in groups) else 0
    rng = np.random.default_rng(rng_seed)
    with _quiet_optuna():
        point = means(groups)
        estimate = [_fanova(p.values, p.dims, point[:, j]) for j in range(len(p.figures))]
        draws: list[list[dict[str, float]]] = [[] for _ in p.figures]
        for _ in range(resampled):
            m = means([g[rng.integers(0, len(g), len(g))] for g in groups])
            for j in range(len(p.figures)):
                draws[j].append(_fanova(p.values, p.dims, m[:, j]))
    rows = []
    tail = (1 - LEVEL) / 2 * 100
    for j, figure in enumerate(p.figures):
        n = int(np.isfinite(point[:, j]).sum())
        # A figure that does not vary (or too few configurations have) is listed, not assessed: NaN.
        for name, value in (estimate[j] or {d.name: math.nan for d in p.dims}).items():
            low = high = math.nan
            if resampled and not math.isnan(value):
                sample = np.array([d.get(name, math.nan) for d in draws[j]], dtype=float)
                if np.isfinite(sample).any():
                    low, high = (float(x) for x in np.nanpercentile(sample, [tail, 100 - tail]))
            rows.append([figure, name, value, low, high, n, len(p.runs), resampled])
    return pd.DataFrame(rows, columns=COLUMNS)


# --------------------------------------------------------------------------- stored on the parent

def eligible_runs(table: pd.DataFrame) -> tuple[int, int]:
    """(configurations, finished runs) of a leaderboard table that importance would assess."""
    if table.empty:
        return 0, 0
    rows = table[(table["status"] == "finished")
                 & eligible(table["role"], table.get(STANDS_FOR, pd.Series("", index=table.index)))]
    return len(rows), int(rows["n"].sum())


def stored(uri: str, parent, table: pd.DataFrame) -> tuple[pd.DataFrame | None, str]:
    """(the parent's importance table, "") when it was computed from the finished runs this
    leaderboard table holds; else (None, why not: "" when there is nothing to assess)."""
    configurations, runs = eligible_runs(table)
    if configurations < MIN_CONFIGURATIONS or not _space_keys(parent.data.tags):
        return None, ""
    text = _parent_artifact(uri, parent, CSV)
    if text:
        import io

        found = pd.read_csv(io.StringIO(text))
        if list(found.columns) == COLUMNS and (found.empty or int(found["runs"].iloc[0]) == runs):
            return found, ""
    return None, f"not computed from these {runs} finished runs yet"


def _points(uri: str, experiment_id: str, parent) -> Points:
    """The points of a sweep's finished runs, read with the leaderboard's keys in one read."""
    from orchestration.report.leaderboard import _union, child_runs, headline_tm, table_keys

    tags = parent.data.tags
    runs = child_runs(uri, experiment_id, parent.info.run_id, *_union(table_keys(tags), importance_keys(tags)))
    return points(runs, tags, headline_tm(tags, runs), space_doc(uri, parent))


def _store(found: pd.DataFrame, title: str, log_file: Callable[[Path], None], plot: str | Path | None = None):
    """importance.csv and importance.png, each given to `log_file`; the PNG copied to `plot`."""
    with tempfile.TemporaryDirectory() as tmp:
        csv = Path(tmp) / CSV
        csv.write_text(found.to_csv(index=False))
        png = plot_importance(found, Path(tmp) / PNG, title=title)
        for file in (csv, png):
            log_file(file)
        if plot is not None:
            Path(plot).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(png, plot)


def log_importance(tracking, log: Callable[[str], None] = print) -> bool:
    """importance.csv and importance.png on the sweep's parent run, from the final figures: at the
    end of a sweep, so its leaderboard (leaderboard.md, `mtbert leaderboard`) shows them."""
    parent = tracking.client.get_run(tracking.parent_run_id)
    p = _points(tracking.uri, tracking.experiment_id, parent)
    if len(p.values) < MIN_CONFIGURATIONS or len(p.dims) < 2:
        return False  # with one swept dimension all of the variation is its own: nothing to rank
    if len(p.values) > AT_END_MAX_CONFIGURATIONS:
        log(f"importance of the swept dimensions: {len(p.values)} configurations, more than the end of a "
            f"sweep fits ({AT_END_MAX_CONFIGURATIONS}); `mtbert importance` computes it")
        return False
    _store(compute(p), parent.info.run_name,
           lambda file: tracking.client.log_artifact(tracking.parent_run_id, str(file)))
    return True


# --------------------------------------------------------------------------- rendering

def figure_label(figure: str) -> str:
    """A figure's name in print: its leaderboard header."""
    from orchestration.report.leaderboard import TASK_LABELS, figure_columns

    column = figure_columns(list(TASK_LABELS)).get(figure)
    return column.header if column else figure


def _cell(value: float, low: float, high: float) -> Cell:
    if value is None or math.isnan(value):
        return Cell("–")
    if math.isnan(low) or math.isnan(high):
        return Cell(f"{value:.2f}")
    return Cell(f"{value:.2f}", f"[{low:.2f}, {high:.2f}]")


def display_rows(found: pd.DataFrame) -> tuple[list[str], list[list[Cell]]]:
    """Dimension x figure, the dimensions by their mean importance over the figures; in each
    figure's column the dimension that explains most of it is bold (ties at the shown digits
    all, none where every dimension shows the same)."""
    order = list(dict.fromkeys(found["figure"]))
    dims = list(found.groupby("dimension", sort=False)["importance"].mean().sort_values(ascending=False).index)
    cells = {(r.figure, r.dimension): _cell(r.importance, r.low, r.high) for r in found.itertuples()}
    headers = ["Dimension", *map(figure_label, order)]
    rows = [[Cell(d), *(cells.get((f, d), Cell("–")) for f in order)] for d in dims]
    for j in range(1, len(headers)):
        shown = {i: row[j].text for i, row in enumerate(rows) if row[j].text != "–"}
        if len(shown) < 2 or len(set(shown.values())) < 2:
            continue
        best = max(shown.values(), key=float)
        for i, text in shown.items():
            if text == best:
                rows[i][j] = replace(rows[i][j], bold=True)
    return headers, rows


def caption(found: pd.DataFrame, bold: bool = False) -> str:
    first = found.iloc[0]
    resampled = int(first["resamples"])
    interval = (f"in brackets its {LEVEL:.0%} interval: the 2.5-97.5 percentiles over {resampled} resamples of each "
                "configuration's seeds (with replacement)" if resampled else
                "one seed per configuration: no seeds to resample, so no interval")
    return (f"Importance: the share of a figure's variance across {int(first['configurations'])} configurations "
            f"(seed means of {int(first['runs'])} runs) that a swept key explains on its own (Optuna's fANOVA, "
            f"{N_TREES} trees; main effects, summing to 1 over the keys); {interval}."
            + (" Bold: the key that explains most of each figure." if bold else "")
            + (" – : not assessed." if found["importance"].isna().any() else ""))


def export_table(found: pd.DataFrame) -> export.Table:
    """The table as the printed formats take it (orchestration/report/export.py)."""
    headers, rows = display_rows(found)
    bold = any(c.bold for row in rows for c in row)
    return export.Table(headers, rows, caption(found, bold), left=1, css="mtbert-importance")


def render(found: pd.DataFrame, fmt: str, title: str = "") -> str:
    from orchestration.report.leaderboard import IMPORTANCE_HEADING, check_format

    check_format(fmt)
    if fmt == "csv":
        return found.to_csv(index=False)
    if found.empty:
        return ""
    return export.document(fmt, f"{IMPORTANCE_HEADING}: {title}" if title else IMPORTANCE_HEADING,
                           [export_table(found)])


def plot_importance(found: pd.DataFrame, path: str | Path, title: str = "") -> Path:
    """A bar per dimension, one panel per figure, the interval as error bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    order = list(dict.fromkeys(found["figure"])) or [""]
    dims = list(found.groupby("dimension", sort=False)["importance"].mean().sort_values().index)
    fig, axes = plt.subplots(1, len(order), figsize=(2.6 * len(order) + 1.6, 0.45 * len(dims) + 1.6),
                             dpi=120, sharey=True, squeeze=False)
    for ax, figure in zip(axes[0], order):
        part = found[found["figure"] == figure].set_index("dimension").reindex(dims)
        ax.barh(range(len(dims)), part["importance"].fillna(0.0), color="tab:blue", alpha=0.8)
        # The interval where it lies: a percentile interval need not straddle the estimate.
        low, high = part["low"].to_numpy(), part["high"].to_numpy()
        ax.errorbar((low + high) / 2, range(len(dims)), xerr=(high - low) / 2, fmt="none", ecolor="black",
                    capsize=3)
        ax.set_yticks(range(len(dims)), dims, fontsize=8)
        ax.set_xlim(0, 1)
        ax.set_title(figure_label(figure), fontsize=9)
        ax.grid(axis="x", alpha=0.3)
    axes[0][0].set_ylabel("swept key")
    fig.supxlabel("share of the figure's variance (fANOVA)", fontsize=9)
    fig.suptitle(title or "importance of the swept dimensions", fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def importance(uri: str, experiment: str, sweep: str | None = None, fmt: str = "md",
               resamples: int | None = None, plot: str | Path | None = None,
               say=None) -> tuple[str, pd.DataFrame, Any]:
    """(rendered table, the table, the parent run) of `mtbert importance`: computed from the
    sweep's finished runs, stored on its parent run (CSV, PNG) and drawn to `plot`."""
    from orchestration.report.leaderboard import find_sweep, log_artifact

    experiment_id, parent = find_sweep(uri, experiment, sweep, say)
    p = _points(uri, experiment_id, parent)
    name = f"sweep {parent.info.run_name} ({parent.info.run_id})"
    if len(p.values) < MIN_CONFIGURATIONS:
        raise SweepError(f"{name}: importance needs at least {MIN_CONFIGURATIONS} finished searched "
                         f"configurations; it has {len(p.values)}")
    if not p.dims:
        tags = parent.data.tags
        raise SweepError(f"{name}: no swept key ({', '.join(_space_keys(tags)) or 'none'}) took more than one value")
    found = compute(p, RESAMPLES if resamples is None else resamples)
    _store(found, parent.info.run_name, lambda file: log_artifact(uri, parent, file), plot)
    return render(found, fmt, parent.info.run_name), found, parent
