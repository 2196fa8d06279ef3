"""Which swept dimensions matter: for each figure of a sweep (the task scores, overall and the
headline TM-relative score), how much of its spread across configurations each `space:` key
explains, and whether that is more than seed noise could make.

    mtbert importance --experiment smoke                      # the table; the bar chart beside it

The statistics are one public function of a plain table, `assess(table, dimensions, figures)`
(a row per run: the configuration's values, its seed, its figures): the CLI reads a sweep's
runs into that shape; a notebook or a simulation calls it directly, without MLflow or Ray.

How much. One point per configuration: its figures averaged over its seeds, one trial of an
in-memory Optuna study whose params are the configuration's values of the swept keys (a grid
or choice categorical, a range a number; a key that took one value is left out). A `points`
dimension (tied keys set together) is one categorical factor: a share per key would split one
effect between its keys at random. Optuna's fANOVA gives each key's main-effect share of the
figure's variance (summing to 1 over the keys). Beside it, with PED_MIN_CONFIGURATIONS or
more configurations, PED-ANOVA's share (Optuna's default evaluator: which keys decide reaching
the top 10%); below that the top holds fewer than 5 configurations and whichever few won
would decide. A share is never 0, and neither is a bootstrap interval of it: a share cannot
say "this key does not matter", so none is given an interval. Each share is an Evaluator (a
name, its column, and a function from the points to {key: share}); EVALUATORS lists the two.

Whether it matters. A permutation test per (figure, dimension): the statistic is the spread of
the figure's mean over the dimension's levels (between-level sum of squares; a range cut into
RANGE_BINS bins of equal count); the null shuffles the levels among the runs of one seed and
one combination of the other keys (a grid crosses them), so the seed's shared noise and the
other keys' effects stay in place; where the sweep did not cross the keys, among the runs of
one seed. p = (1 + shuffles at least as extreme) / (1 + PERMUTATIONS); "matters" when
p <= ALPHA. A key that does nothing is called "matters" in at most 5% of sweeps, whatever the
shape of the seed noise (skewed, heavy-tailed, seeds correlated), since the shuffled runs are
exchangeable then; tests/orchestration/test_importance_simulation.py plants sweeps and
measures both that rate and the power (docs/guide.md quotes them). The rate is per (figure,
dimension): a table of many cells holds some "matters" by chance.

Two configurations. No share to split: their difference per figure, paired by seed, with its
95% t-interval (orchestration/stats.py), "matters" when it excludes 0.

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
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np
import pandas as pd

from orchestration.errors import SweepError
from orchestration.report import export, plots, reader
from orchestration.report.export import Cell
from orchestration.report.table import DELTA_M, figure_label, headline_tm, table_keys
from orchestration.sweep.labels import STANDS_FOR, parse_param
from orchestration.sweep.space import POINTS_TAG

PERMUTATIONS = 999
ALPHA = 0.05  # the permutation test's level: a key that does nothing reads "matters" in at most 5%
RNG_SEED = 0
# Not Optuna's 64: a forest per figure is most of the cost (16 trees: about 0.05 s at a dozen
# configurations), and a share is descriptive here: the permutation test says what is noise.
N_TREES = 16
RANGE_BINS = 4
MIN_CONFIGURATIONS = 3
PED_MIN_CONFIGURATIONS = 50  # PED-ANOVA's top 10% then holds 5 (Optuna's advice)
PED_QUANTILE = 0.1
AT_END_MAX_CONFIGURATIONS = 200  # above: the end of a sweep leaves it to `mtbert importance`
MAX_NUMERIC_CATEGORIES = 8  # a grid/choice of more numbers than this is read as a range
CSV = "importance.csv"
PNG = "importance.png"
SPACE_DOC = "search_space.json"  # the parent's artifact that describes each dimension (launch.py)
# A row of assess(): after figure and dimension, each of EVALUATORS' shares by its name.
COLUMNS = ["figure", "dimension", "importance", "ped_anova", "effect", "p", "matters", "null", "low", "high",
           "configurations", "runs", "permutations"]


# --------------------------------------------------------------------------- the points

def figures(parent_tags: dict[str, str], tm: str) -> list[str]:
    """The figures assessed: the sweep's task scores, overall and its headline TM score."""
    return [*reader.task_metrics(parent_tags), "overall", tm]


def importance_keys(parent_tags: dict[str, str]) -> tuple[list[str], list[str], list[str]]:
    """(params, metrics, tags) of the child runs the importance reads (reader.child_runs)."""
    keys = _space_keys(parent_tags)
    params = [*keys, *(["loss.weights."] if "loss.weights" in keys else [])]
    metrics = [*figures(parent_tags, "tm_relative_score"), "tm_relative_score_compute", DELTA_M]
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
class SweptRuns:
    """The configurations (index: variant) with their encoded values of each Dim, and the
    finished runs (variant, seed, one column per figure): assess()'s table, joined."""
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
           space: dict[str, dict] | None = None) -> SweptRuns:
    """The sweep's configurations from its child runs (reader.child_runs' frame)."""
    col = reader.col
    keys = _space_keys(parent_tags)
    keep = (col(runs, "status") == "FINISHED") & eligible(col(runs, "tags.role"), col(runs, f"tags.{STANDS_FOR}"))
    done = runs[keep]
    names = figures(parent_tags, tm)
    if pd.to_numeric(col(runs, f"metrics.{DELTA_M}")[keep], errors="coerce").notna().any():
        names.append(DELTA_M)  # the sweep ran single-task runs: Δm% is one of its figures
    frame = pd.DataFrame({"variant": col(runs, "tags.variant")[keep].values,
                          "seed": col(runs, "tags.seed")[keep].astype(object).fillna("").astype(str).values})
    for name in names:
        frame[name] = pd.to_numeric(col(runs, f"metrics.{name}")[keep], errors="coerce").values
    params_cols = [c for c in done.columns if c.startswith("params.")]
    first = done.assign(_variant=frame["variant"].values).drop_duplicates("_variant")
    raw: dict[str, list[Any]] = {k: [] for k in keys}
    for row in first[params_cols].itertuples(index=False, name=None):
        params = {c[len("params."):]: v for c, v in zip(params_cols, row) if isinstance(v, str)}
        for key in keys:
            raw[key].append(reader.loss_weights(params) if key == "loss.weights" else parse_param(params.get(key)))
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
    return SweptRuns(values, dims, frame, names)


def space_doc(uri: str, parent) -> dict[str, dict] | None:
    """The parent run's description of each dimension (search_space.json), None without one."""
    text = reader.parent_artifact(uri, parent, SPACE_DOC)
    return json.loads(text).get("dimensions") if text else None


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


def _study(values: pd.DataFrame, dims: list[Dim], y: np.ndarray, direction: str = "minimize"):
    """An in-memory study of one trial per configuration (NaN: left out), or None with fewer
    than MIN_CONFIGURATIONS points or no dimension that varies among them."""
    import optuna

    finite = np.isfinite(y)
    if finite.sum() < MIN_CONFIGURATIONS or np.ptp(y[finite]) == 0:  # nothing to explain
        return None
    rows = values[finite]
    used = [d for d in dims if rows[d.name].nunique() > 1]
    if not used:
        return None
    distributions = {d.name: d.distribution() for d in used}
    study = optuna.create_study(direction=direction)
    study.add_trials([optuna.trial.create_trial(params=dict(zip(distributions, row)), distributions=distributions,
                                                value=float(v))
                      for row, v in zip(rows[list(distributions)].itertuples(index=False, name=None), y[finite])])
    return study


@dataclass(frozen=True)
class Evaluator:
    """A share of a figure's variance per swept key, descriptive (never 0): `name` is its
    column of COLUMNS; `shares(values, dims, y, maximize)` maps the configurations' encoded
    values and their figure y (seed means, NaN: left out; larger better when `maximize`) to
    {dimension: share}, {} where it has nothing to say."""
    name: str
    shares: Callable[[pd.DataFrame, list[Dim], np.ndarray, bool], dict[str, float]]


def _fanova(values: pd.DataFrame, dims: list[Dim], y: np.ndarray, maximize: bool = False) -> dict[str, float]:
    """Normalised fANOVA importances of `dims` for the configurations' values y; {} where
    there is nothing to explain (_study). A variance's share has no direction: `maximize` is
    not read."""
    from optuna.importance import FanovaImportanceEvaluator, get_param_importances

    study = _study(values, dims, y)
    if study is None:
        return {}
    try:
        found = get_param_importances(study, evaluator=FanovaImportanceEvaluator(n_trees=N_TREES, seed=RNG_SEED))
    except RuntimeError:  # every tree's bootstrap drew equal values: no variance to share out
        return {}
    return {name: float(v) for name, v in found.items()}


def _ped_anova(values: pd.DataFrame, dims: list[Dim], y: np.ndarray, maximize: bool) -> dict[str, float]:
    """Normalised PED-ANOVA importances (Optuna's default evaluator): how much each key decides
    whether a configuration reaches the top PED_QUANTILE of the figure. Only with at least
    PED_MIN_CONFIGURATIONS finite points, so that the top holds 5 of them (Optuna's advice:
    below that, whichever few happened to win would decide)."""
    from optuna.importance import PedAnovaImportanceEvaluator, get_param_importances

    if np.isfinite(y).sum() < PED_MIN_CONFIGURATIONS:
        return {}
    study = _study(values, dims, y, "maximize" if maximize else "minimize")
    if study is None:
        return {}
    found = get_param_importances(study, evaluator=PedAnovaImportanceEvaluator(target_quantile=PED_QUANTILE))
    return {name: float(v) for name, v in found.items()}


# The shares assess() gives, in COLUMNS' order: fANOVA's (a key's main effect on the variance)
# and PED-ANOVA's (what decides reaching the top PED_QUANTILE).
FANOVA = Evaluator("importance", _fanova)
PED_ANOVA = Evaluator("ped_anova", _ped_anova)
EVALUATORS = (FANOVA, PED_ANOVA)


MAX_PERMUTATIONS = 100_000  # each reshuffles every cell: past it, minutes for the fourth digit of p


def check_permutations(permutations: int) -> None:
    if permutations > MAX_PERMUTATIONS:
        raise SweepError(f"--permutations {permutations}: over the bound of {MAX_PERMUTATIONS:,}")
    if permutations < 19:
        raise SweepError(f"--permutations {permutations}: must be >= 19 (the smallest p-value is "
                         f"1 / (permutations + 1), and it must reach {ALPHA})")


def _codes(*columns: np.ndarray) -> np.ndarray:
    """One code 0..k-1 per row for each distinct combination of the columns' values."""
    if not columns:
        return np.zeros(0, dtype=np.int64)
    per = [np.unique(np.asarray(c).astype(str), return_inverse=True)[1].ravel() for c in columns]
    _, first, codes = np.unique(np.stack(per, axis=1), axis=0, return_index=True, return_inverse=True)
    # Numbered in order of first appearance: "the first configuration" is the table's first.
    rank = np.empty(len(first), dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(len(first))
    return rank[codes.ravel()]


def _levels(dim: Dim, column: np.ndarray) -> np.ndarray:
    """Each run's level of a dimension, as codes 0..k-1: its categories, or for a range the
    configurations' values cut into at most RANGE_BINS bins of equal count (a range sweep has a
    value per configuration: a level each would leave nothing to compare within)."""
    if dim.kind == "categorical":
        return _codes(column)
    numbers = column.astype(float)
    distinct = np.unique(numbers)
    bins = min(RANGE_BINS, len(distinct))
    return (np.searchsorted(distinct, numbers) * bins // len(distinct)).astype(np.int64)


def _strata(seeds: np.ndarray, others: list[np.ndarray], levels: np.ndarray) -> tuple[np.ndarray, str]:
    """The groups of runs whose levels the null shuffles, and its name: within each seed and
    each combination of the other keys where the sweep crossed them (then the other keys'
    effects and the seed's stay where they are); else within each seed (a key that matters
    elsewhere then widens the null: the test errs towards "no"); else all runs."""
    for null, columns in (("seed and other keys", [seeds, *others]), ("seed", [seeds])):
        codes = _codes(*columns)
        pairs = np.unique(np.stack([codes, levels], axis=1), axis=0)
        if len(pairs) > len(np.unique(codes)):  # some stratum holds two levels: a shuffle moves something
            return codes, null
    return np.zeros(len(levels), dtype=np.int64), "runs"


def _statistic(sums: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The between-level sum of squares, less its constant: sum over levels of total^2 / count."""
    return (sums * sums / np.maximum(counts, 1)).sum(axis=-1)


def permutation_p(y: np.ndarray, levels: np.ndarray, strata: np.ndarray, permutations: int,
                  rng: np.random.Generator) -> float:
    """The p-value of "the levels' means differ" against the null that shuffles the levels
    among the runs of each stratum: (1 + shuffles at least as extreme) / (1 + shuffles)."""
    order = np.argsort(strata, kind="stable")
    y, levels, strata = y[order], levels[order], strata[order]
    k, n = int(levels.max()) + 1, len(y)
    counts = np.bincount(levels, minlength=k)  # a shuffle within strata keeps every level's count
    observed = _statistic(np.bincount(levels, weights=y, minlength=k), counts)
    # Sorting (stratum + uniform) keeps each stratum's block and shuffles within it.
    shuffled = levels[np.argsort(strata[None, :] + rng.random((permutations, n)), axis=1)]
    flat = (shuffled + k * np.arange(permutations)[:, None]).ravel()
    sums = np.bincount(flat, weights=np.tile(y, permutations), minlength=k * permutations).reshape(permutations, k)
    extreme = _statistic(sums, counts) >= observed - 1e-9 * abs(observed)  # ties count against
    return float((1 + extreme.sum()) / (1 + permutations))


def _infer_dims(table: pd.DataFrame, dimensions: Sequence[str]) -> tuple[list[Dim], pd.DataFrame]:
    """A plain table's dimensions as Dims (a grid of up to MAX_NUMERIC_CATEGORIES numbers a
    category each, more a range) and its values encoded as they describe."""
    dims, encoded = [], pd.DataFrame(index=table.index)
    for name in dimensions:
        for dim, column in _encode(name, list(table[name]), {"type": "grid"}):
            dims.append(dim)
            encoded[dim.name] = column
    return dims, encoded


def assess(table: pd.DataFrame, dimensions: Sequence[str], figures: Sequence[str], *, seed: str = "seed",
           permutations: int = PERMUTATIONS, rng_seed: int = RNG_SEED, shares: bool = True,
           dims: Sequence[Dim] | None = None, maximize: Mapping[str, bool] | None = None) -> pd.DataFrame:
    """Which swept dimensions matter, from a plain table: one row per run, a column per
    dimension (the run's configuration's value), its `seed` and a column per figure. No
    MLflow, no Ray: `mtbert importance` calls it on a sweep's runs, and a notebook or a
    simulation on anything of that shape.

    Returns COLUMNS, a row per (figure, dimension):
    - importance: the dimension's share of the variance of the configurations' seed means
      (Optuna's fANOVA, main effects, summing to 1); ped_anova: PED-ANOVA's share, with
      PED_MIN_CONFIGURATIONS or more configurations. Descriptive: neither is ever 0, so
      neither says "no". `shares=False` leaves both NaN (a simulation's speed).
    - effect: the spread (max - min) of the figure's mean over the dimension's levels.
    - p, matters: the permutation test of "the dimension's levels differ by more than seed
      noise" (_strata names the null), matters when p <= ALPHA. Its rate of a wrong "matters"
      is at most ALPHA for each (figure, dimension) whatever the noise's shape, as long as the
      runs a shuffle exchanges are exchangeable when the dimension does nothing
      (tests/orchestration/test_importance_simulation.py measures it).
    Two configurations: one row per figure, their difference paired by seed (stats), the
    dimensions that differ named in `dimension`, matters when its 95% interval excludes 0.
    `dims` (the dimensions as Optuna distributions) come with the table's values already
    encoded; without them they are read from the values. `maximize`: figure -> which way is
    better (PED-ANOVA's top), by default mtbert's declaration of the figure, else larger."""
    if dims is None:
        dims, values = _infer_dims(table, dimensions)
    else:
        dims, values = list(dims), table[[d.name for d in dims]]
    seeds = table[seed].astype(str).to_numpy() if seed in table else np.zeros(len(table), dtype=str)
    names = [d.name for d in dims]
    columns = {name: values[name].to_numpy() for name in names}
    configuration = _codes(*columns.values()) if names else np.zeros(len(table), dtype=np.int64)
    n_configurations = int(configuration.max()) + 1 if len(table) else 0
    if n_configurations == 2:
        return _paired(table, columns, seeds, configuration, figures)
    firsts = np.array([np.flatnonzero(configuration == c)[0] for c in range(n_configurations)], dtype=np.int64)
    config_values = values.iloc[firsts].reset_index(drop=True)
    rng = np.random.default_rng(rng_seed)
    rows = []
    with _quiet_optuna() if shares else nullcontext():
        for figure in figures:
            y = pd.to_numeric(table[figure], errors="coerce").to_numpy(dtype=float)
            finite = np.isfinite(y)
            totals = np.bincount(configuration[finite], weights=y[finite], minlength=n_configurations)
            counts = np.bincount(configuration[finite], minlength=n_configurations)
            means = np.where(counts > 0, totals / np.maximum(counts, 1), math.nan)
            n = int((counts > 0).sum())
            better = (maximize or {}).get(figure, _maximize(figure))
            found = {e.name: e.shares(config_values, dims, means, better) for e in EVALUATORS} if shares else {}
            for dim in dims:
                effect, p, null = _dimension_test(dim, y, columns, seeds, n, permutations, rng)
                rows.append([figure, dim.name, *(found.get(e.name, {}).get(dim.name, math.nan) for e in EVALUATORS),
                             effect, p, bool(p <= ALPHA), null, math.nan, math.nan, n, int(finite.sum()),
                             permutations if not math.isnan(p) else 0])
    return pd.DataFrame(rows, columns=COLUMNS)


def _dimension_test(dim: Dim, y: np.ndarray, columns: dict[str, np.ndarray], seeds: np.ndarray, n: int,
                    permutations: int, rng: np.random.Generator) -> tuple[float, float, str]:
    """(effect, p, null) of one dimension for a figure's runs y (NaN: left out) over n
    configurations: the spread of its levels' means and the permutation test's p (NaN, NaN,
    "" with fewer than MIN_CONFIGURATIONS or a single level)."""
    finite = np.isfinite(y)
    levels = _levels(dim, columns[dim.name][finite])
    if n < MIN_CONFIGURATIONS or levels.max(initial=0) <= 0:
        return math.nan, math.nan, ""
    level_means = np.bincount(levels, weights=y[finite]) / np.bincount(levels)
    effect = float(level_means.max() - level_means.min())
    strata, null = _strata(seeds[finite], [column[finite] for o, column in columns.items() if o != dim.name], levels)
    return effect, permutation_p(y[finite], levels, strata, permutations, rng), null


def _maximize(figure: str) -> bool:
    from mtbert.figures import better

    return better(figure) != "min"


def _paired(table: pd.DataFrame, columns: dict[str, np.ndarray], seeds: np.ndarray, configuration: np.ndarray,
            figures: Sequence[str]) -> pd.DataFrame:
    """Two configurations: the second's difference from the first, paired by seed (the mean of
    a seed's runs where it ran more than one)."""
    from orchestration.report.verdicts import ALPHA, interval, seed_means

    first, second = (np.flatnonzero(configuration == c)[0] for c in (0, 1))
    label = "; ".join(f"{name}: {_label(col[second])} - {_label(col[first])}"
                      for name, col in columns.items() if col[first] != col[second])
    rows = []
    for figure in figures:
        y = pd.to_numeric(table[figure], errors="coerce").to_numpy(dtype=float)
        per_seed = [seed_means(y[configuration == c], seeds[configuration == c]) for c in (0, 1)]
        # A fixed design (importance reads a finished sweep once): the mean's t-interval.
        found = interval(per_seed[1], per_seed[0], method="mean")
        decided = found.n >= 2 and (found.low > 0 or found.high < 0)
        rows.append([figure, label, math.nan, math.nan, found.mean, math.nan, bool(decided),
                     f"paired by seed, {1 - ALPHA:.0%}", found.low, found.high, 2,
                     int(np.isfinite(y).sum()), 0])
    return pd.DataFrame(rows, columns=COLUMNS)


def compute(p: SweptRuns, permutations: int = PERMUTATIONS, rng_seed: int = RNG_SEED) -> pd.DataFrame:
    """assess() on a sweep's points (their encoded values, each run's seed and figures)."""
    check_permutations(permutations)
    if p.values.empty:
        return pd.DataFrame(columns=COLUMNS)
    # By variant: the first configuration of a pair is the sweep's first (p000 before p003).
    table = p.runs.join(p.values, on="variant").sort_values(["variant", "seed"], kind="stable")
    return assess(table, [d.name for d in p.dims], p.figures, permutations=permutations, rng_seed=rng_seed,
                  dims=p.dims)


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
    if configurations < 2 or not _space_keys(parent.data.tags):
        return None, ""
    text = reader.parent_artifact(uri, parent, CSV)
    if text:
        import io

        found = pd.read_csv(io.StringIO(text))
        if list(found.columns) == COLUMNS and (found.empty or int(found["runs"].iloc[0]) == runs):
            return found, ""
    return None, f"not computed from these {runs} finished runs yet"


def _points(uri: str, experiment_id: str, parent) -> SweptRuns:
    """The points of a sweep's finished runs, read with the leaderboard's keys in one read."""
    tags = parent.data.tags
    runs = reader.child_runs(uri, experiment_id, parent.info.run_id,
                             *reader.union_keys(table_keys(tags), importance_keys(tags)))
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
        return False  # one swept dimension: its share is 1; `mtbert importance` tests it on request
    if len(p.values) > AT_END_MAX_CONFIGURATIONS:
        log(f"importance of the swept dimensions: {len(p.values)} configurations, more than the end of a "
            f"sweep fits ({AT_END_MAX_CONFIGURATIONS}); `mtbert importance` computes it")
        return False
    _store(compute(p), parent.info.run_name,
           lambda file: tracking.client.log_artifact(tracking.parent_run_id, str(file)))
    return True


# --------------------------------------------------------------------------- rendering

def paired(found: pd.DataFrame) -> bool:
    """Whether the table is two configurations' paired difference rather than shares."""
    return not found.empty and bool(found["null"].astype(str).str.startswith("paired").all())


def _cell(r) -> Cell:
    """A share (else the effect) with its p-value aside, bold when the key matters; a paired
    difference with its interval aside, bold when it excludes 0."""
    if str(r.null).startswith("paired"):
        if math.isnan(r.effect):
            return Cell("–")
        aside = "" if math.isnan(r.low) else f"[{r.low:+.4f}, {r.high:+.4f}]"
        return Cell(f"{r.effect:+.4f}", aside, bold=bool(r.matters))
    if math.isnan(r.p):
        return Cell("–")
    text = f"{r.importance:.2f}" if not math.isnan(r.importance) else f"{r.effect:.3g}"
    return Cell(text, f"(p {r.p:.3f})", bold=bool(r.matters))


def display_rows(found: pd.DataFrame) -> tuple[list[str], list[list[Cell]]]:
    """Dimension x figure, the dimensions by their mean importance over the figures; bold: a
    key that matters for that figure (p <= ALPHA), or a paired difference that excludes 0."""
    order = list(dict.fromkeys(found["figure"]))
    dims = list(found.groupby("dimension", sort=False)["importance"].mean().sort_values(ascending=False).index)
    cells = {(r.figure, r.dimension): _cell(r) for r in found.itertuples()}
    headers = ["Configurations" if paired(found) else "Dimension", *map(figure_label, order)]
    return headers, [[Cell(d), *(cells.get((f, d), Cell("–")) for f in order)] for d in dims]


def caption(found: pd.DataFrame) -> str:
    first = found.iloc[0]
    runs = int(first["runs"])
    if paired(found):
        return (f"Two configurations ({runs} runs): the second's difference from the first in each figure (the keys "
                "that differ, second - first, in the first column), paired by seed, in brackets its 95% t-interval "
                "(orchestration/stats.py). Bold: the interval excludes 0."
                + (" – : not assessed." if found["effect"].isna().any() else ""))
    shuffles = int(found["permutations"].max())
    nulls = set(found["null"].dropna().astype(str)) - {""}
    within = ("each seed and each combination of the other keys" if nulls == {"seed and other keys"} else
              "each seed (and each combination of the other keys where the sweep crossed them)")
    ped = " PED-ANOVA's share (the top 10%) is in the CSV." if found["ped_anova"].notna().any() else ""
    return (f"Importance: the share of a figure's variance across {int(first['configurations'])} configurations "
            f"(seed means of {runs} runs) that a swept key explains on its own (Optuna's fANOVA, {N_TREES} trees; "
            f"main effects, summing to 1 over the keys); a share is never 0, so it cannot say that a key does not "
            f"matter. Beside it, p: how often {shuffles} shuffles of the key's levels within {within} spread the "
            f"figure's means as far (a permutation test). Bold: p <= {ALPHA}, the key matters beyond seed noise; a key "
            f"that does nothing is bold in at most {ALPHA:.0%} of sweeps, per cell." + ped
            + (" – : not assessed." if found["p"].isna().any() else ""))


def export_table(found: pd.DataFrame) -> export.Table:
    """The table as the printed formats take it (orchestration/report/export.py)."""
    headers, rows = display_rows(found)
    return export.Table(headers, rows, caption(found), left=1, css="mtbert-importance")


IMPORTANCE_HEADING = "Importance of the swept dimensions"


def render(found: pd.DataFrame, fmt: str, title: str = "") -> str:
    """The table in `fmt` (export.FORMATS): the numbers in csv; printed, "" when it is empty."""
    export.check_format(fmt)
    if fmt != "csv" and found.empty:
        return ""
    return export.render(fmt, export.Document(f"{IMPORTANCE_HEADING}: {title}" if title else IMPORTANCE_HEADING,
                                              found, lambda: [export_table(found)]))


def plot_importance(found: pd.DataFrame, path: str | Path, title: str = "") -> Path:
    """A bar per dimension, one panel per figure (plots.importance_figure): its share, dark where
    the key matters (p <= ALPHA), pale where it is not told apart from seed noise; two
    configurations: their paired difference with its interval."""
    return plots.save(plots.importance_figure(found, title, paired=paired(found), alpha=ALPHA), path)


def importance(uri: str, experiment: str, sweep: str | None = None, fmt: str = "md",
               permutations: int | None = None, plot: str | Path | None = None,
               say=None) -> tuple[str, pd.DataFrame, Any]:
    """(rendered table, the table, the parent run) of `mtbert importance`: computed from the
    sweep's finished runs, stored on its parent run (CSV, PNG) and drawn to `plot`."""
    experiment_id, parent = reader.find_sweep(uri, experiment, sweep, say)
    p = _points(uri, experiment_id, parent)
    name = f"sweep {parent.info.run_name} ({parent.info.run_id})"
    if len(p.values) < 2:
        raise SweepError(f"{name}: importance needs at least 2 finished searched configurations; it has "
                         f"{len(p.values)}")
    if not p.dims:
        tags = parent.data.tags
        raise SweepError(f"{name}: no swept key ({', '.join(_space_keys(tags)) or 'none'}) took more than one value")
    found = compute(p, PERMUTATIONS if permutations is None else permutations)
    _store(found, parent.info.run_name, lambda file: reader.log_artifact(uri, parent, file), plot)
    return render(found, fmt, parent.info.run_name), found, parent
