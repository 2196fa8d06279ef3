"""The papers' claims, checked against the runs in an MLflow store.

    mtbert findings sweeps/study/*.yaml --tracking-uri sqlite:///$PWD/runs/study/mlflow.db
    mtbert findings --tracking-uri sqlite:///$PWD/runs/study/mlflow.db [--experiment NAME ...]

Each claim compares two configurations, A and B, on one metric: the effect is A − B paired by
seed, and orchestration/report/verdicts.py (the library this module feeds the store's runs to) takes
its interval (the median's by default, over the seeds both ran and neither diverged, widened
over the looks of a sequential design and shared out over the table's family of claims) and
reads it against the smallest difference that matters: holds, contradicted, no difference
that matters, inconclusive (with the seeds that would decide it), or not run (no finished
run of A or B at a shared seed). A run is diverged when a trial tagged it so or when the
library's rule says so; a metric MLflow has no value for is a missing run, not a diverged one.

Claims are data: the `claims:` of the sweep files (orchestration/sweep/claims.py), read from the
files named on the command line, else from the claims.json that the latest sweep of each
experiment logged with its parent run. A selector picks runs by their MLflow params as it
picks configurations at load (claims.matches), within the claim's experiment; when it matches
configurations of several sweeps, the latest sweep's runs are used; several configurations
within one sweep is an error naming them (the selector is too loose).
"""
from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

import pandas as pd

from orchestration.errors import SweepError
from orchestration.paths import fluent_tracking_uri
from orchestration.report import export, reader
from orchestration.report.verdicts import (DIVERGED_METRIC, INCONCLUSIVE, MAX_SEEDS, NOT_RUN, RATE, Verdict,
                                           claim_alphas, decide, rate_caption, row, seed_means)
from orchestration.sweep.claims import CLAIMS_FILE, Claim, from_doc, matches
from orchestration.sweep.labels import parse_param


# --------------------------------------------------------------------------- reading

def read_runs(uri: str, experiments: list[str] | None = None, parent_run_id: str | None = None) -> pd.DataFrame:
    """Finished trial runs (not sweep parents nor configurations) of the named experiments (default: all),
    and failed ones tagged diverged, with an `experiment` column holding the experiment's name;
    only one sweep's with `parent_run_id`."""
    import mlflow

    found = {e.experiment_id: e.name for e in reader.experiments_named(reader.mlflow_client(uri), uri, experiments)}
    if not found:
        return pd.DataFrame()
    # The finished runs, and the failed ones tracking tagged diverged (their loss went
    # non-finite): a run that failed to train is a seed of its configuration, counted.
    parent = f" and tags.`mlflow.parentRunId` = '{parent_run_id}'" if parent_run_id else ""
    with fluent_tracking_uri(uri):
        found_runs = [mlflow.search_runs(experiment_ids=list(found), filter_string=where + parent,
                                         output_format="pandas", max_results=50000)
                      for where in ("attributes.status = 'FINISHED'",
                                    "attributes.status = 'FAILED' and tags.diverged LIKE '%'")]
    runs = pd.concat([r for r in found_runs if not r.empty], ignore_index=True) \
        if any(not r.empty for r in found_runs) else found_runs[0]
    if runs.empty:
        return runs
    from orchestration.track.view import CONFIGURATION

    runs = runs[~reader.col(runs, "tags.role").fillna("").isin(["sweep", CONFIGURATION])]
    return runs.assign(experiment=runs["experiment_id"].map(found))


def _check_claimed_experiments(uri: str, claims: list[Claim]) -> None:
    """Sweep files' claims name their experiments. When the store holds none of them, every
    row would be "not run": the sweeps ran elsewhere (another --tracking-uri) or not yet, and
    that is one line. A store holding some of them is a study under way: the rest are not run."""
    named = sorted({c.experiment for c in claims if c.experiment})
    have = {e.name for e in reader.experiments_named(reader.mlflow_client(uri), uri)}
    if named and not set(named) & have:
        raise SweepError(f"experiment{'s' if len(named) > 1 else ''} {', '.join(named)} of the claims "
                         f"{'are' if len(named) > 1 else 'is'} not in {uri}"
                         + (f" (it holds {', '.join(sorted(have))})" if have else " (it holds no experiment)")
                         + "; run the sweep, or pass the --tracking-uri it ran with")


def logged_claims(uri: str, experiments: list[str] | None = None) -> list[Claim]:
    """The claims the latest sweep of each experiment logged with its parent run (claims.json);
    refused in one line when no sweep logged any (e.g. sweeps run before claims were logged:
    name their sweep files instead)."""
    import tempfile

    client = reader.mlflow_client(uri)
    found = reader.experiments_named(client, uri, experiments)
    claims: list[Claim] = []
    with reader.no_download_bar():
        for experiment in sorted(found, key=lambda e: e.name):
            parents = client.search_runs([experiment.experiment_id], "tags.role = 'sweep' and tags.claims != '0'",
                                         order_by=["attributes.start_time DESC"], max_results=1)
            if parents:
                with tempfile.TemporaryDirectory() as folder:
                    path = client.download_artifacts(parents[0].info.run_id, CLAIMS_FILE, folder)
                    with open(path, encoding="utf-8") as f:
                        claims += from_doc(f.read())
    if not claims:
        raise SweepError(f"{uri}: no sweep{' of ' + ', '.join(experiments) if experiments else ''} logged "
                         "claims; name the sweep files that declare them: mtbert findings sweeps/study/*.yaml "
                         f"--tracking-uri {uri}")
    return claims


# --------------------------------------------------------------------------- matching

def _match(runs: pd.DataFrame, selector: dict[str, Any]) -> pd.Series:
    """The runs a selector picks: claims.matches on each run's params, role and experiment."""
    # Only the params the selector names are read back: a key, or a mapping flatten() spread
    # over its sub-keys (loss.weights.<task>); MLflow params are text.
    names = [c for c in runs.columns if c.startswith("params.")
             and any(c == f"params.{k}" or c.startswith(f"params.{k}.") for k in selector)]
    keep = []
    for params, role, experiment in zip(runs[names].to_numpy(), reader.col(runs, "tags.role"),
                                        reader.col(runs, "experiment")):
        flat = {name[len("params."):]: parse_param(v) for name, v in zip(names, params) if isinstance(v, str)}
        keep.append(matches({**flat, "role": role, "experiment": experiment}, selector))
    return pd.Series(keep, index=runs.index, dtype=bool)


def side_runs(runs: pd.DataFrame, selector: dict[str, Any], label: str) -> pd.DataFrame:
    """The runs of the one configuration the selector picks (latest sweep wins)."""
    if runs.empty:
        return runs
    hit = runs[_match(runs, selector)]
    if hit.empty:
        return hit
    hit = hit.assign(_parent=reader.col(hit, "tags.mlflow.parentRunId").fillna(""),
                     _variant=reader.col(hit, "tags.variant").fillna(""))
    latest = hit.sort_values("start_time").iloc[-1]["_parent"]
    hit = hit[hit["_parent"] == latest]
    variants = sorted(hit["_variant"].unique())
    if len(variants) > 1:
        raise SweepError(f"claim selector {label} {selector}: matches {len(variants)} configurations of one "
                         f"sweep ({', '.join(variants)}); name more keys")
    return hit


def per_seed(runs: pd.DataFrame, selector: dict[str, Any], metric: str, label: str) -> dict[str, float]:
    """seed -> metric of the one configuration the selector picks (latest sweep wins); for the
    divergence rate (DIVERGED_METRIC) each seed's 1 (diverged) or 0."""
    hit = side_runs(runs, selector, label)
    seeds = reader.col(hit, "tags.seed").astype(str)
    if metric == DIVERGED_METRIC:
        return (reader.col(hit, "tags.diverged").fillna("") != "").astype(float).groupby(seeds).max().to_dict()
    col = f"metrics.{metric}"
    if hit.empty or col not in hit:
        return {}
    return seed_means(pd.to_numeric(hit[col], errors="coerce"), seeds)


# --------------------------------------------------------------------------- verdicts

def claim_row(claim: Claim, verdict: Verdict, a_n: int | None = None, b_n: int | None = None) -> dict[str, Any]:
    """One row of the findings table: the claim, its interval and its verdict (verdicts.row)."""
    found = row(claim, verdict)
    if a_n is not None:
        found.update(a_n=a_n, b_n=b_n)
    return found


def table_of(rows: list[dict[str, Any]]) -> pd.DataFrame:
    return pd.DataFrame(rows).astype({"seeds_needed": "Int64"})


def _diverged_tags(runs: pd.DataFrame, selector: dict[str, Any], label: str) -> dict[str, str]:
    """seed -> why, of the runs of the configuration a selector picks that tracking tagged diverged."""
    hit = side_runs(runs, selector, label)
    if hit.empty or "tags.diverged" not in hit:
        return {}
    hit = hit[reader.col(hit, "tags.diverged").fillna("") != ""]
    return {str(r["tags.seed"]): str(r["tags.diverged"]) for _, r in hit.iterrows()}


def judge_claims(runs: pd.DataFrame, claims: list[Claim], error_rate: str | None = None) -> pd.DataFrame:
    """The claims' verdicts on the runs, the family's error shared out among them
    (verdicts.claim_alphas; error_rate None: each claim's own setting)."""
    if error_rate is not None:
        claims = [dataclasses.replace(c, error_rate=error_rate) for c in claims]
    rows = []
    for claim, alpha in zip(claims, claim_alphas(claims)):
        a = per_seed(runs, claim.a, claim.metric, "A")
        b = per_seed(runs, claim.b, claim.metric, "B")
        verdict = decide(a, b, claim, alpha, diverged_a=_diverged_tags(runs, claim.a, "A"),
                         diverged_b=_diverged_tags(runs, claim.b, "B"))
        rows.append(claim_row(claim, verdict))
    return table_of(rows)


# --------------------------------------------------------------------------- in MLflow

CLAIM_PREFIX = "claim/"  # a claim's metrics and tag on a sweep's parent run, and its tag on a configuration's


def claim_slug(name: str) -> str:
    """A claim's name as MLflow takes it in a metric or tag name (letters, digits, . and -;
    anything else one _): `S-I-I > I-I-I` -> `S-I-I_I-I-I`."""
    return re.sub(r"[^\w.\-]+", "_", name).strip("_") or "claim"


def claim_marks(table: pd.DataFrame) -> tuple[dict[str, float], dict[str, str]]:
    """(metrics, tags) of a findings table for the sweep's parent run, so that its verdicts can
    be searched and charted: per claim claim/<slug> (tag: the verdict) and claim/<slug>/effect,
    /ci_low, /ci_high, /n (metrics; an interval end only where there is one)."""
    metrics, tags = {}, {}
    for _, r in table.iterrows():
        name = CLAIM_PREFIX + claim_slug(r["claim"])
        tags[name] = str(r["verdict"])
        for figure, column in (("effect", "delta"), ("ci_low", "low"), ("ci_high", "high"), ("n", "n")):
            value = r.get(column)
            if value is not None and not pd.isna(value) and math.isfinite(float(value)):
                metrics[f"{name}/{figure}"] = float(value)
    return metrics, tags


def claim_sides(runs: pd.DataFrame, claims: list[Claim], table: pd.DataFrame) -> dict[str, dict[str, str]]:
    """variant -> {claim/<slug>: "A, <verdict>"}: the part each configuration of the runs plays
    in each claim (a tag on its configuration's run)."""
    verdicts = dict(zip(table["claim"], table["verdict"])) if len(table) else {}
    out: dict[str, dict[str, str]] = {}
    if runs.empty:
        return out
    for claim in claims:
        for side, selector in (("A", claim.a), ("B", claim.b)):
            for variant in sorted(set(reader.col(runs[_match(runs, selector)], "tags.variant").dropna())):
                out.setdefault(variant, {})[CLAIM_PREFIX + claim_slug(claim.name)] = \
                    f"{side}, {verdicts.get(claim.name, NOT_RUN)}"
    return out


# --------------------------------------------------------------------------- rendering

MEDIAN_CAPTION = ("Effect = A − B paired by seed: the median of the per-seed differences and its interval "
                  "[L, H], two order statistics of the differences whose coverage of the true median holds "
                  "whatever the noise's shape (skewed, heavy-tailed, one side noisier), seeds independent")
RATE_CAPTION = ("A claim on `diverged` compares divergence rates: the effect is A's diverged share of its seeds "
                "less B's, its interval [L, H] the two sides' exact (Clopper–Pearson) intervals combined, at "
                "least as sure as the table's level (over sequential looks, the level split evenly over them)")
MEAN_CAPTION = ("Effect = A − B paired by seed: the mean of the per-seed differences ± the half-width of its "
                "t-interval [L, H], right when the differences are near-normal")
RULES_CAPTION = ("n = seeds both ran and neither diverged (\"sequential f..l\": seeds were added one at a time, "
                 "looking after each from f to l, and the interval holds at every look at once; \"f..m..l\": given more seeds "
                 "after it ended at m, the new looks spending only the error the first left). δ: the smallest "
                 "difference that matters. holds: the interval lies wholly on the claimed side of 0 (≈: wholly "
                 "inside ±δ); contradicted: wholly on the other side (≈: wholly beyond +δ or −δ); no "
                 "difference that matters (> and <): wholly inside ±δ, on either side of 0; inconclusive: it holds a "
                 "difference that matters and one that does not, or too few seeds for an interval; not run: no "
                 "seed both ran. Diverged: a side's seeds that failed to train, of all its seeds (training "
                 "stopped on a non-finite loss, a value or loss not finite, or at the claim's chance level while "
                 "the configuration's other seeds are not), left out of the pairs. "
                 "Paper's effect: the paper's A − B, inside or outside the interval. Seeds needed: the paired "
                 "seeds at which a fixed design would decide the claim with 80% power, were the differences "
                 "normal with the observed centre and spread.")


def caption(table: pd.DataFrame) -> str:
    """What the table's intervals are and which error rate it keeps."""
    methods = set(table["method"]) if len(table) else {"median"}
    what = "; ".join(c for m, c in (("median", MEDIAN_CAPTION), ("mean", MEAN_CAPTION), (RATE, RATE_CAPTION))
                     if m in methods)
    rate = rate_caption(list(table["error_rate"]) if len(table) else [])
    if "mean" in methods and rate:
        rate += " A mean's t-interval keeps it only where the per-seed differences are near-normal."
    return f"{what}; {RULES_CAPTION} {rate}".strip()


def _effect(r: pd.Series) -> str:
    if r["n"] == 0:
        return "–"
    median = r.get("method", "median") in ("median", RATE)
    rates = f"rate {r['a_diverged'] / r['a_n']:.2f} − {r['b_diverged'] / r['b_n']:.2f} = " \
        if r.get("method") == RATE else ""
    text = ("median " if r.get("method", "median") == "median" else rates) + f"{r['delta']:+.3f}"
    if not math.isnan(r["low"]):
        text += (f" [{r['low']:+.3f}, {r['high']:+.3f}]" if median
                 else f" ± {r['half']:.3f} [{r['low']:+.3f}, {r['high']:+.3f}]")
    return text + f" (n={int(r['n'])}" + (f", sequential {r['looks']}" if r["looks"] else "") + ")"


def _diverged(r: pd.Series) -> str:
    """"A 2 of 9 seeds": each side's seeds that failed to train, of all its seeds."""
    parts = [f"{side} {int(r[f'{side.lower()}_diverged'])} of {int(r[f'{side.lower()}_n'])} seeds"
             for side in ("A", "B") if r.get(f"{side.lower()}_diverged", 0)]
    return ", ".join(parts) if parts else "–"


def _paper(r: pd.Series) -> str:
    if r["paper_effect"] is None or pd.isna(r["paper_effect"]):
        return r["paper"] or "–"
    effect = f"{r['paper_effect']:+.3f}"
    if r["paper_inside"] is not None and not pd.isna(r["paper_inside"]):
        effect += ", inside" if r["paper_inside"] else ", **outside**"
    return f"{r['paper']}: {effect}" if r["paper"] else effect


def _seeds(r: pd.Series) -> str:
    if not pd.isna(r["seeds_needed"]):
        return str(int(r["seeds_needed"]))
    planned = r["verdict"] == INCONCLUSIVE and r["n"] >= 2 and r.get("method") != RATE
    return f">{MAX_SEEDS}" if planned else "–"


FORMATS = export.MARKDOWN_FORMATS  # its cells carry Markdown's bold


def export_table(table: pd.DataFrame) -> export.Table:
    """The findings as a Markdown table (export.markdown): a row per claim, its caption below."""
    head = ["Claim", "Source", "Metric", "Claimed", "Effect A − B (interval)", "Verdict", "Diverged",
            "Paper's effect", "Seeds needed"]
    rows = []
    for _, r in table.iterrows():
        verdict = f"**{r['verdict']}**" + (f": {r['detail']}" if r["verdict"] != NOT_RUN and r["n"] >= 2 else "")
        cells = [r["claim"], r["source"], r["metric"], f"A {r['relation']} B (δ {r['min_effect']:g})", _effect(r),
                 verdict, _diverged(r), _paper(r), _seeds(r)]
        rows.append([export.Cell(str(c)) for c in cells])
    return export.Table(head, rows, caption(table), left=3, css="mtbert-findings",
                        align=("l", "l", "l", "c", "r", "l", "l", "l", "r"))


def summary_table(table: pd.DataFrame) -> str:
    """The findings in four columns (claim, verdict, effect, seeds needed) and the error rate
    they keep: the sweep run's description in the MLflow UI, whose half-page column the whole
    table's nine columns overflowed. The whole table and its caption are findings.md."""
    rows = [[export.Cell(str(c)) for c in (r["claim"], f"**{r['verdict']}**", _effect(r), _seeds(r))]
            for _, r in table.iterrows()]
    note = (rate_caption(list(table["error_rate"])) + " " if len(table) else "") + \
        "Every column and what it means: the artifact findings.md, or `mtbert findings`."
    return export.markdown(export.Table(["Claim", "Verdict", "Effect A − B (interval)", "Seeds needed"], rows,
                                        note.strip(), left=1, align=("l", "l", "r", "r")))


def render(table: pd.DataFrame, fmt: str = "md") -> str:
    if fmt not in FORMATS:
        raise SweepError(f"--format {fmt}: expected {' or '.join(FORMATS)}")
    return export.render(fmt, export.Document("mtbert findings", table, lambda: [export_table(table)]))


def _with_logged_looks(uri: str, claims: list[Claim]) -> list[Claim]:
    """A sweep file's claims with the looks their sweep logged, where it extended them: a sweep
    given more seeds (`sweep resume NAME --seeds-max N`) is judged on looks 3..12..N, which only
    its parent run's claims.json records; the file still says 3..12."""
    try:
        logged = {(c.experiment, c.name): c.looks for c in logged_claims(uri, sorted({c.experiment for c in claims
                                                                                       if c.experiment}) or None)}
    except SweepError:  # no sweep logged claims: the file's looks are all there is
        return claims
    extended = lambda mine, theirs: bool(mine and theirs and len(theirs) > len(mine)  # noqa: E731
                                         and theirs[0] == mine[0] and theirs[-2] == mine[-1])
    return [dataclasses.replace(c, looks=logged[(c.experiment, c.name)])
            if extended(c.looks, logged.get((c.experiment, c.name))) else c for c in claims]


def findings(uri: str, experiments: list[str] | None = None, fmt: str = "md",
             claims: list[Claim] | None = None, error_rate: str | None = None) -> tuple[str, pd.DataFrame]:
    """The table of `claims` (None: those the store's sweeps logged) over the store's runs;
    error_rate (family, claim) overrides the claims' own."""
    if claims is None:
        claims = logged_claims(uri, experiments)
    else:
        _check_claimed_experiments(uri, claims)
        claims = _with_logged_looks(uri, claims)
    table = judge_claims(read_runs(uri, experiments), claims, error_rate)
    return render(table, fmt), table
