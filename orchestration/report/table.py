"""The leaderboard's table: a sweep's runs as the papers print them (mops-tm-relative-score.txt,
Tables 1 and 2), built from the runs reader.child_runs reads (build_table), sorted (sort_table),
its cells, columns and caption (display_rows, caption_parts, export_table: the printed formats
take it from there, export.py).

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
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from typing import Any, Sequence

import pandas as pd

from mtbert import figures
from orchestration.errors import SweepError
from orchestration.report import export, reader, verdicts
from orchestration.report.export import Cell
from orchestration.stats import t_quantile
from orchestration.sweep.labels import (OWN_COLUMNS, RATE_KEYS, SINGLE_TASK, STANDS_FOR, YARDSTICKS, fmt_rates,
                                        fmt_weighting, regime_label)

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
DIVERGED_STATUS = "diverged"  # a run that failed to train (its tag): counted in its configuration's row
DIVERGED_MARK = "⊘"  # a configuration every seed of which diverged


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
DIVERGED_COLUMN = Column("seeds_diverged", "Diverged")  # "2 of 9": seeds that failed to train, of all


def figure_columns(task_metrics: Sequence[str]) -> dict[str, Column]:
    """The figures the table reads from a sweep's runs (task scores `task_metrics`), in order.
    A count (the epoch) has a direction to sort by but no best to bold."""
    return {f.name: Column(f.name, TASK_LABELS.get(f.name, f.label), f.fmt, "" if f.count else f.better, f.count)
            for f in figures.on_board(task_metrics)}


def figure_label(figure: str) -> str:
    """A figure's name in print: its leaderboard header."""
    column = figure_columns(list(TASK_LABELS)).get(figure)
    return column.header if column else figure


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


# --------------------------------------------------------------------------- the table

def _status(runs: pd.DataFrame) -> pd.Series:
    """finished | diverged (finished or failed, tagged diverged: it failed to train) | failed |
    interrupted (KILLED by a signal, an outage or the sweep's end)."""
    status = reader.col(runs, "status")
    interrupted = reader.col(runs, "tags.interrupted").fillna("false") != "false"
    tagged = reader.col(runs, "tags.diverged").fillna("") != ""
    out = pd.Series("other", index=runs.index)
    out[status == "FINISHED"] = "finished"
    out[status == "FAILED"] = "failed"
    out[status.isin(["FINISHED", "FAILED"]) & tagged] = DIVERGED_STATUS
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
    base_seed = verdicts.seed_means(base[metric], base["seed"])
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
    return list(dict.fromkeys(params)), list(figure_columns(reader.task_metrics(parent_tags))), list(TABLE_TAGS)


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
    if runs.empty:
        return pd.DataFrame()
    runs = runs.assign(_status=_status(runs))
    runs = runs[runs["_status"] != "other"]
    if not (runs["_status"] == "finished").any():
        return pd.DataFrame()
    task_metrics = reader.task_metrics(parent_tags)
    numeric = list(figure_columns(task_metrics))
    frame = _run_rows(runs, parent_tags, numeric)
    done = frame[frame["status"] == "finished"]
    gone = frame[frame["status"] == DIVERGED_STATUS]
    grouped = done.groupby("variant", sort=False)
    table = _aggregate(grouped, numeric)
    table[DIVERGED_COLUMN.key] = gone.groupby("variant").size().reindex(table["variant"]).fillna(0).astype(int).values
    table["wall_time_spread"] = _wall_time_spread(frame, done).reindex(table["variant"]).values
    design = delta_design(parent_tags)
    # The diverged runs go in so that their seeds leave the pairs, as a verdict leaves them.
    deltas = _paired_deltas(pd.concat([done, gone]), DELTA_METRIC, design).reindex(table["variant"])
    delta_columns = [DELTA_COLUMN, *(f"{DELTA_COLUMN}_{part}" for part in DELTA_PARTS[1:])]
    table[delta_columns] = deltas[list(DELTA_PARTS)].values
    # No Δ for the baseline, nor for a single-task row: its overall is one task's score.
    table.loc[table["role"].isin(["baseline", SINGLE_TASK]), delta_columns] = math.nan
    table["status"] = "finished"
    table["reason"] = ""
    table[STANDS_FOR] = grouped[STANDS_FOR].first().values
    # A configuration every seed of which diverged: one row, its count and its first reason.
    lost = gone[~gone["variant"].isin(table["variant"])]
    lost = lost.groupby("variant", sort=False).first().reset_index().assign(
        reason=lambda f: f["variant"].map(lost.groupby("variant")["diverged"].first()),
        **{DIVERGED_COLUMN.key: lambda f: f["variant"].map(lost.groupby("variant").size())},
        **{name: math.nan for name in numeric})
    rest = pd.concat([frame[~frame["status"].isin(["finished", DIVERGED_STATUS])], lost], ignore_index=True)
    if not rest.empty:
        # One run each: no interval, no pairing; a count's median and range are its value.
        rest = rest.assign(n=(rest["status"] != DIVERGED_STATUS).astype(int), stopped_early=0,
                           **{f"{name}_{stat}": rest[name] for name in numeric for stat in ("median", "min", "max")})
        table = pd.concat([table, rest.reindex(columns=table.columns)], ignore_index=True)
    table.loc[table["role"] == "reference", "regime"] = REFERENCE_LABEL
    single = table["role"] == SINGLE_TASK
    table.loc[single, "regime"] = SINGLE_TASK_LABEL + " " + table.loc[single, "variant"].str.removeprefix("single-")
    # Where the finished runs trained (cpu, cuda (<GPU>)): what their peak memory counts.
    table.attrs["devices"] = sorted(set(reader.col(runs, "tags.device")[runs["_status"] == "finished"]
                                        .dropna().astype(str)))
    table.attrs["task_metrics"] = task_metrics
    table.attrs["tasks"] = reader.sweep_tasks(parent_tags)
    table.attrs["tm_score"] = tm_choice(parent_tags, runs)
    table.attrs["delta_design"] = design
    return table


def _run_rows(runs: pd.DataFrame, parent_tags: dict[str, str], numeric: list[str]) -> pd.DataFrame:
    """One row per run: its configuration's labels, its tags and status, and its figures."""
    from mtbert.config import Config, flatten

    tasks = reader.sweep_tasks(parent_tags)
    swept = _swept(parent_tags)
    defaults = flatten(Config())
    groups = _label_params(swept)
    regime = _labels(runs, groups["regime"], lambda p: regime_label(p, swept, defaults))
    lr = _labels(runs, groups["lr"], fmt_rates)
    weights = _labels(runs, groups["weights"], lambda p: fmt_weighting(p.get("loss.weighting"), reader.loss_weights(p),
                                                                          tasks, p.get("loss.pcgrad")))
    error = reader.col(runs, "tags.error").fillna("").astype(str).str.split("\n").str[0].str.slice(0, 200)
    frame = pd.DataFrame({
        "variant": reader.col(runs, "tags.variant").values, "role": reader.col(runs, "tags.role").values,
        "seed": reader.col(runs, "tags.seed").values, "regime": regime, "lr": lr, "weights": weights,
        "stopped_early": (reader.col(runs, "tags.stopped_early") == "true").values,
        "status": runs["_status"].values, "reason": error.values,
        STANDS_FOR: reader.col(runs, f"tags.{STANDS_FOR}").astype(object).fillna("").values,
        "diverged": reader.col(runs, "tags.diverged").astype(object).fillna("").values,
    })
    for name in numeric:
        frame[name] = pd.to_numeric(reader.col(runs, f"metrics.{name}"), errors="coerce").values
    return frame


def _aggregate(grouped, numeric: list[str]) -> pd.DataFrame:
    """A row per configuration from its finished runs (`grouped` by variant): its labels, n,
    the runs ASHA stopped, each figure's mean, _std and _ci95, and its _median, _min and _max."""
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
    return table


def _wall_time_spread(frame: pd.DataFrame, done: pd.DataFrame) -> pd.Series:
    """Per variant: (max − min) / min of its finished runs' train times, NaN for one run.
    The full-budget basis, so a trial ASHA stopped is compared at the time its budget would take."""
    time = frame["tm_time_s"].where(frame["tm_time_s"].notna(), frame["train_time_s"]).loc[done.index]
    by = time.groupby(done["variant"], sort=False)
    low, runs_timed = by.min(), by.count()
    return (by.max() / low - 1).where((runs_timed > 1) & (low > 0))


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
        return Cell(row_label(r))
    if c.key in LABEL_COLUMNS:
        return Cell(str(r[c.key]))
    value = r.get(c.key, math.nan)
    if c.key == DIVERGED_COLUMN.key:  # "2 of 9": of the seeds the row trained and those that diverged
        return Cell(f"{int(value)} of {int(value) + int(r['n'])}" if not pd.isna(value) and value else "–")
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
    # A half-width has no sign, even in a column of signed figures (Δm%).
    return Cell(f"{value:{c.fmt}}", "" if int(r["n"]) < 2 or pd.isna(half) else f"± {half:{c.fmt.lstrip('+')}}")


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
    return {**labels, **{c.key: c for c in shown}, N.key: N, DIVERGED_COLUMN.key: DIVERGED_COLUMN}


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
    # Every format shows the seeds that failed to train, where any did: a finding, not noise.
    diverged = [DIVERGED_COLUMN.key] if DIVERGED_COLUMN.key in table and bool((table[DIVERGED_COLUMN.key] > 0).any()) \
        else []
    return ["regime", *labels, *figs, *tms, *n, *diverged]


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


def row_label(r: dict) -> str:
    label = r["regime"] + ("*" if r["role"] == "baseline" else "")
    if r.get(STANDS_FOR):
        label += f" {ALSO_SEARCHED}"
    if r["stopped_early"]:
        label += " †"
    if r.get("wall_time_spread", 0) > WALL_SPREAD:  # NaN (one run) compares False
        label += f" {WALL_MARK}"
    if r["status"] == "interrupted":
        label += " ‡"
    elif r["status"] in ("failed", DIVERGED_STATUS):
        reason = r["reason"] or r["status"]
        mark = "✗" if r["status"] == "failed" else DIVERGED_MARK
        label += f" {mark} ({reason if len(reason) <= REASON_CHARS else reason[:REASON_CHARS - 1] + '…'})"
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
              DIVERGED_COLUMN.key,
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
        (DIVERGED_COLUMN.key in keys, "Diverged: the configuration's seeds that failed to train (training stopped on "
         "a non-finite loss, or its overall or last loss is not a number), of all its seeds; left out of its means, "
         "n and Δ, as the verdicts leave them out."
         + (f" {DIVERGED_MARK}: every seed diverged, with the first one's reason."
            if (table["status"] == DIVERGED_STATUS).any() else "")),
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
