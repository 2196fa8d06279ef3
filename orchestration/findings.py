"""The papers' claims, checked against the runs in an MLflow store.

    mtbert findings --tracking-uri sqlite:///$PWD/runs/study/mlflow.db [--experiment NAME ...]

Each claim compares two configurations, A and B, on one metric: the effect is A − B paired by
seed (orchestration/stats.py: mean of per-seed differences ± its 95% t-interval, n seeds both
ran), and the verdict reads that interval:

    direction >   holds: the interval is above 0      contradicted: below 0
    direction <   holds: the interval is below 0      contradicted: above 0
    direction ≈   holds: the interval lies within ±margin
                  contradicted: it lies wholly outside ±margin
    otherwise     inconclusive (at this budget: more seeds narrow the interval; one seed has none)

A claim whose A or B has no finished run in the store, or none at a shared seed, is "not
run". Claims are data: one CLAIMS line each. A selector is a mapping of flattened config
keys (as the runs' MLflow params, e.g. sharing.encoder_shared_layers) to values, plus the
special keys `experiment` (MLflow experiment name) and `role` (baseline, reference, search;
a selector without `role` never picks the frozen reference rows);
a mapping value (loss.weights) matches the spread params key by key. Numbers match within
1e-3, so 0.333 selects a logged 0.3333. When a selector matches configurations of several
sweeps, the latest sweep's runs are used; several configurations within one sweep is an
error naming them (the selector is too loose).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from orchestration.errors import SweepError
from orchestration.labels import parse_param
from orchestration.paths import fluent_tracking_uri
from orchestration.stats import paired_delta

VERDICTS = ("holds", "contradicted", "inconclusive", "not run")
TOLERANCE = 1e-3
SPECIAL = {"experiment", "role"}


@dataclass(frozen=True)
class Claim:
    name: str
    paper: str  # file in ../shared/papers and where in it
    metric: str  # MLflow metric of the runs (best-epoch figures): overall, sts_corr, ...
    a: dict[str, Any]
    b: dict[str, Any]
    direction: str  # ">" (A better), "<" (A worse), "≈" (within ±margin)
    margin: float = 0.01  # only for ≈
    note: str = field(default="", compare=False)  # what the paper measured


# The study (sweeps/study/*.yaml) runs every configuration named here; MiniLM has L = 6, so
# hybrid-bert is k = 3 and "all but the last three layers" is freeze 3.
CLAIMS = [
    Claim("hybrid-bert ≈ 3-bert", "hybrid-bert-layer-sharing.txt, Table 1", "overall",
          {"experiment": "study-encoder-sharing", "sharing.encoder_shared_layers": 3},
          {"experiment": "study-encoder-sharing", "sharing.encoder_shared_layers": 0}, "≈",
          note="0.772 vs 0.772 (one run each)"),
    Claim("3-bert > 1-bert", "hybrid-bert-layer-sharing.txt, Table 1", "overall",
          {"experiment": "study-encoder-sharing", "sharing.encoder_shared_layers": 0},
          {"experiment": "study-encoder-sharing", "sharing.encoder_shared_layers": None}, ">",
          note="0.772 vs 0.761"),
    Claim("freezing the bottom half lifts STS", "freeze-your-layers.txt, Sections 4.3-4.4", "sts_corr",
          {"experiment": "study-freezing", "freeze.layers": 3},
          {"experiment": "study-freezing", "freeze.layers": 0}, ">",
          note="STS 0.551 -> 0.690 freezing all but the last 3 of 12 layers"),
    Claim("S-S-I beats I-I-I on a frozen encoder", "mops-tm-relative-score.txt, Table 1", "overall",
          {"experiment": "study-head-regimes-frozen", "sharing.head_regime": "S-S-I"},
          {"experiment": "study-head-regimes-frozen", "sharing.head_regime": "I-I-I"}, ">",
          note="0.377 vs 0.328, the best of the 8 regimes with pretrained weights"),
    Claim("loss weights [sst .2 para .4 sts .4] below equal (frozen I-S-S)", "mops-tm-relative-score.txt, "
          "Table 1 and Section 4.4.3", "overall",
          {"experiment": "study-loss-weights-frozen", "loss.weights": {"sst": 0.2, "para": 0.4, "sts": 0.4}},
          {"experiment": "study-loss-weights-frozen", "role": "baseline"}, "<",
          note="0.313 vs 0.392 with equal weights"),
    Claim("cascade sst>para>sts lifts STS", "progressive-layer-sharing.txt, Section 5.4", "sts_corr",
          {"experiment": "study-cascade", "sharing.cascade": "sst>para>sts"},
          {"experiment": "study-cascade", "role": "baseline"}, ">",
          note="STS 0.508 -> 0.608 dev"),
    Claim("annealed sampling beats round robin", "pals-annealed-sampling.txt, Figure 5 (exp. 5 vs 6)",
          "overall",
          {"experiment": "study-pals", "sampling.strategy": "annealed", "sharing.pal_size": 0},
          {"experiment": "study-pals", "role": "baseline"}, ">",
          note="better on every task"),
    Claim("PALs ≈ no PALs with annealed sampling", "pals-annealed-sampling.txt, Figure 5 (exp. 6 vs 8)",
          "overall",
          {"experiment": "study-pals", "sampling.strategy": "annealed", "sharing.pal_size": 96},
          {"experiment": "study-pals", "sampling.strategy": "annealed", "sharing.pal_size": 0}, "≈",
          note="\"comparable performances\""),
]


# --------------------------------------------------------------------------- reading

def read_runs(uri: str, experiments: list[str] | None = None) -> pd.DataFrame:
    """Finished trial runs (not sweep parents) of the named experiments (default: all), with
    an `experiment` column holding the experiment's name."""
    import mlflow
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    found = {e.experiment_id: e.name for e in client.search_experiments(max_results=1000)}
    if experiments:
        missing = [e for e in experiments if e not in found.values()]
        if missing:
            raise SweepError(f"--experiment {missing[0]}: no such experiment in {uri}"
                             + (f" (have: {', '.join(sorted(found.values()))})" if found else ""))
        found = {i: n for i, n in found.items() if n in experiments}
    if not found:
        return pd.DataFrame()
    with fluent_tracking_uri(uri):
        runs = mlflow.search_runs(experiment_ids=list(found), filter_string="attributes.status = 'FINISHED'",
                                  output_format="pandas", max_results=50000)
    if runs.empty:
        return runs
    runs = runs[runs.get("tags.role", pd.Series("", index=runs.index)).fillna("") != "sweep"]
    return runs.assign(experiment=runs["experiment_id"].map(found))


# --------------------------------------------------------------------------- matching

def _same(value: Any, want: Any) -> bool:
    value = parse_param(value)
    if want is None or value is None:
        return value is None and want is None
    if isinstance(want, bool) or isinstance(value, bool):
        return value == want
    if isinstance(want, (int, float)) and isinstance(value, (int, float)):
        return math.isclose(float(value), float(want), abs_tol=TOLERANCE)
    return str(value) == str(want)


def _match(runs: pd.DataFrame, selector: dict[str, Any]) -> pd.Series:
    keep = pd.Series(True, index=runs.index)
    if "role" not in selector:  # the frozen reference shares keys with real rows (k = null): named only
        keep &= runs.get("tags.role", pd.Series(None, index=runs.index)) != "reference"
    for key, want in selector.items():
        if key == "experiment":
            col = runs["experiment"]
        elif key == "role":
            col = runs.get("tags.role", pd.Series(None, index=runs.index))
        elif isinstance(want, dict):
            for sub, sub_want in want.items():
                col = runs.get(f"params.{key}.{sub}", pd.Series(None, index=runs.index))
                keep &= col.map(lambda v, w=sub_want: isinstance(v, str) and _same(v, w))
            continue
        else:
            col = runs.get(f"params.{key}")
            if col is None:
                return pd.Series(False, index=runs.index)
            keep &= col.map(lambda v, w=want: isinstance(v, str) and _same(v, w))
            continue
        keep &= col.map(lambda v, w=want: v == w)
    return keep


def per_seed(runs: pd.DataFrame, selector: dict[str, Any], metric: str, label: str) -> dict[str, float]:
    """seed -> metric of the one configuration the selector picks (latest sweep wins)."""
    if runs.empty:
        return {}
    hit = runs[_match(runs, selector)]
    col = f"metrics.{metric}"
    if hit.empty or col not in hit:
        return {}
    hit = hit.assign(_parent=hit.get("tags.mlflow.parentRunId", pd.Series("", index=hit.index)).fillna(""),
                     _variant=hit.get("tags.variant", pd.Series("", index=hit.index)).fillna(""))
    latest = hit.sort_values("start_time").iloc[-1]["_parent"]
    hit = hit[hit["_parent"] == latest]
    variants = sorted(hit["_variant"].unique())
    if len(variants) > 1:
        raise SweepError(f"claim selector {label} {selector}: matches {len(variants)} configurations of one "
                         f"sweep ({', '.join(variants)}); name more keys")
    values = pd.to_numeric(hit[col], errors="coerce")
    # A seed run twice (a resume that double-logged) counts once, as its mean.
    return values.groupby(hit["tags.seed"].astype(str)).mean().dropna().to_dict()


# --------------------------------------------------------------------------- verdicts

def verdict(delta: float, half: float, n: int, direction: str, margin: float = 0.01) -> str:
    if n == 0 or math.isnan(delta):
        return "not run"
    if n < 2 or math.isnan(half):
        return "inconclusive"
    low, high = delta - half, delta + half
    if direction == "≈":
        if -margin <= low and high <= margin:
            return "holds"
        if low > margin or high < -margin:
            return "contradicted"
        return "inconclusive"
    sign = {">": 1, "<": -1}[direction]
    if sign * low > 0 and sign * high > 0:
        return "holds"
    if sign * low < 0 and sign * high < 0:
        return "contradicted"
    return "inconclusive"


def evaluate(runs: pd.DataFrame, claims: list[Claim] = CLAIMS) -> pd.DataFrame:
    rows = []
    for claim in claims:
        a = per_seed(runs, claim.a, claim.metric, "A")
        b = per_seed(runs, claim.b, claim.metric, "B")
        delta, half, n = paired_delta(a, b) if a and b else (math.nan, math.nan, 0)
        rows.append({"claim": claim.name, "paper": claim.paper, "metric": claim.metric,
                     "direction": claim.direction, "margin": claim.margin if claim.direction == "≈" else math.nan,
                     "a_n": len(a), "b_n": len(b), "delta": delta, "ci95": half, "n": n,
                     "low": delta - half, "high": delta + half,
                     "verdict": verdict(delta, half, n, claim.direction, claim.margin), "paper_says": claim.note})
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------- rendering

CAPTION = ("Effect = A − B, paired by seed: the mean of the per-seed differences ± the half-width of its "
           "95% t-interval (n = seeds both ran). holds: the interval excludes 0 in the claimed direction "
           "(for ≈: it lies within ±margin); contradicted: it excludes 0 the other way (for ≈: it lies "
           "wholly outside ±margin); inconclusive: neither, at this budget; not run: the store has no "
           "finished runs of A or B at a shared seed.")


def _effect(r: pd.Series) -> str:
    if r["n"] == 0:
        return "–"
    text = f"{r['delta']:+.3f}"
    if not math.isnan(r["ci95"]):
        text += f" ± {r['ci95']:.3f} [{r['low']:+.3f}, {r['high']:+.3f}]"
    return text + f" (n={int(r['n'])})"


def render(table: pd.DataFrame, fmt: str = "md") -> str:
    if fmt == "csv":
        return table.to_csv(index=False)
    if fmt != "md":
        raise SweepError(f"--format {fmt}: expected md or csv")
    head = ["Claim", "Paper", "Metric", "Claimed", "Effect A − B (95% CI)", "Verdict", "Paper's numbers"]
    lines = ["| " + " | ".join(head) + " |", "| " + " | ".join(["---"] * 3 + [":-:", "---:", "---", "---"]) + " |"]
    for _, r in table.iterrows():
        claimed = f"≈ (±{r['margin']:.2f})" if r["direction"] == "≈" else f"A {r['direction']} B"
        cells = [r["claim"], r["paper"], r["metric"], claimed, _effect(r), f"**{r['verdict']}**", r["paper_says"]]
        lines.append("| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines + ["", CAPTION]) + "\n"


def findings(uri: str, experiments: list[str] | None = None, fmt: str = "md",
             claims: list[Claim] = CLAIMS) -> tuple[str, pd.DataFrame]:
    table = evaluate(read_runs(uri, experiments), claims)
    return render(table, fmt), table
