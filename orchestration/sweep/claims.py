"""Claims: what a sweep sets out to show, declared in its YAML (`claims:`, described with an
example in sweeps/README.md) and decided from its runs.

A selector (a, b) names one configuration of the sweep: flattened config keys (as the trials'
MLflow params) -> values, a mapping value (loss.weights) matching key by key, numbers within
0.1% of each other (0.333 selects a logged 0.3333; 1e-4 never selects 3e-4), plus the special key `role` (baseline, reference,
search). A selector without `role` never picks the frozen reference, which shares its keys
with real rows. The experiment is the sweep's own: it is added to both sides at load, so a
store alone tells `mtbert findings` which runs a claim reads.

Checked at load, one line each naming the file and the claim; for grid and random sweeps,
whose configurations are known before any trial runs, each side must select exactly one.
"""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

from mtbert.config import as_float
from mtbert.errors import did_you_mean
from orchestration.errors import SweepError
from orchestration.sweep.bounds import MAX_CLAIMS, MAX_SEEDS
from orchestration.sweep.labels import YARDSTICKS

RELATIONS = (">", "<", "≈")
SPELLINGS = {"~": "≈"}  # ASCII for ≈
ROLES = ("baseline", "reference", "search")
SPECIAL = ("experiment", "role")
# Relative: learning rates are 1e-5..1e-3, where any absolute tolerance wide enough for a
# rounded 0.333 makes every rate equal.
TOLERANCE = 1e-3


@dataclass(frozen=True)
class Claim:
    name: str
    metric: str  # a best-epoch figure of the trials (overall, sts_corr, ...)
    a: dict[str, Any]  # selector: flattened config keys -> values (plus `experiment`, `role`)
    b: dict[str, Any]
    relation: str  # one of RELATIONS
    min_effect: float = 0.01
    source: str = ""  # where the claim comes from (paper, table)
    paper_effect: float | None = None  # the paper's own A − B on this metric, when it reports one
    paper: str = field(default="", compare=False)  # the paper's numbers, in words
    # The figure's chance level: a run at it while its configuration's other seeds are not
    # diverged (orchestration/report/verdicts.py: diverged); None = only non-finite values diverge.
    chance: float | None = None
    # The sequential design the seeds were gathered under: (first, last) number of paired seeds
    # at which the sweep may look and stop; None = a fixed design (one look, at the end).
    looks: tuple[int, int] | None = None
    # The sweep's `verdicts:` (spec.parse_verdicts): the error rate its table keeps (family: all
    # its claims together; claim: each alone) and the interval (median: free of assumptions on
    # the noise; mean: the t-interval, for near-normal differences).
    error_rate: str = "family"
    interval: str = "median"

    @property
    def experiment(self) -> str | None:
        return self.a.get("experiment")


# A claim's metric that is no logged figure: the chance that a run of the side diverges (its
# seeds tagged or found diverged over all its seeds), compared by rate_interval in
# orchestration/report/verdicts.py. `metric: diverged, relation: ">"` says A diverges more often.
DIVERGED = "diverged"

# looks: the sweep's seeds set it; error_rate and interval: its `verdicts:`.
FIELDS = {f.name for f in dataclasses.fields(Claim)} - {"looks", "error_rate", "interval"}
REQUIRED = ("name", "metric", "a", "b", "relation")


# --------------------------------------------------------------------------- matching

_MISSING = object()


def same(value: Any, want: Any) -> bool:
    """A configuration's value against a selector's: None only matches None, numbers within
    TOLERANCE of each other (relative), anything else by its text."""
    if value is _MISSING:
        return False
    if want is None or value is None:
        return value is None and want is None
    if isinstance(want, bool) or isinstance(value, bool):
        return value == want
    if isinstance(want, (int, float)) and isinstance(value, (int, float)):
        return math.isclose(float(value), float(want), rel_tol=TOLERANCE)
    return str(value) == str(want)


def _value(flat: Mapping[str, Any], key: str) -> Any:
    """The value of `key` in a flattened config: a mapping (loss.weights) comes back whole."""
    if key in flat:
        return flat[key]
    prefix = key + "."
    sub = {k[len(prefix):]: v for k, v in flat.items() if k.startswith(prefix)}
    return sub if sub else _MISSING


def matches(flat: Mapping[str, Any], selector: Mapping[str, Any]) -> bool:
    """Does a configuration (its flattened config plus `role` and `experiment`) fit a selector?"""
    if "role" not in selector and flat.get("role") in YARDSTICKS:
        return False
    for key, want in selector.items():
        have = _value(flat, key)
        if isinstance(want, dict):
            if not isinstance(have, dict) or not all(same(have.get(k, _MISSING), w) for k, w in want.items()):
                return False
        elif not same(have, want):
            return False
    return True


@dataclass(frozen=True)
class Configuration:
    """One configuration of a planned sweep (all its seeds share it)."""
    variant: str
    role: str
    flat: dict[str, Any]  # flattened config, plus `role`


def configurations(trials: Iterable[Mapping[str, Any]]) -> list[Configuration]:
    """The planned trials (orchestration/sweep/plan.py) grouped into configurations, in plan order."""
    from mtbert.config import flatten

    seen: dict[str, Configuration] = {}
    for trial in trials:
        if trial["variant"] not in seen:
            flat = {k: v for k, v in flatten(trial["config"]).items() if k != "train.seed"}
            seen[trial["variant"]] = Configuration(trial["variant"], trial["role"], {**flat, "role": trial["role"]})
    return list(seen.values())


def pick(configs: list[Configuration], selector: Mapping[str, Any]) -> list[Configuration]:
    plain = {k: v for k, v in selector.items() if k != "experiment"}
    return [c for c in configs if matches(c.flat, plain)]


def sides(claim: Claim, configs: list[Configuration]) -> tuple[str, str]:
    """The variants a claim compares (the load check made each side select exactly one)."""
    return pick(configs, claim.a)[0].variant, pick(configs, claim.b)[0].variant


# --------------------------------------------------------------------------- parsing

def _where(where: str, i: int, name: Any = None) -> str:
    return f"{where}: claims[{i}]" + (f" ({name})" if isinstance(name, str) and name else "")


def _number(value: Any, at: str) -> float:
    number = as_float(value)
    if number is None or math.isnan(number):
        raise SweepError(f"{at}: expected a number, got {value!r}")
    if math.isinf(number):  # every difference is "within inf", a verdict decided by nothing
        raise SweepError(f"{at}: expected a finite number, got {value!r}")
    return number


def _selector(raw: Any, at: str, experiment: str | None) -> dict[str, Any]:
    if not isinstance(raw, dict) or not raw:
        raise SweepError(f"{at}: expected a mapping of config keys to values (e.g. "
                         f"{{sharing.head_regime: S-I-I}} or {{role: baseline}}), got {raw!r}")
    out: dict[str, Any] = {}
    for key, value in raw.items():
        key = str(key)
        if key == "experiment":
            raise SweepError(f"{at}.experiment: a claim compares configurations of its own sweep; "
                             "the experiment is the sweep's (tracking.experiment)")
        if key == "train.seed":
            raise SweepError(f"{at}.train.seed: seeds pair the two sides; a selector names a configuration")
        if key == "role" and value not in ROLES:
            raise SweepError(f"{at}.role: expected one of {', '.join(ROLES)}; got {value!r}")
        out[key] = value
    if experiment is not None:
        out["experiment"] = experiment
    return out


def parse_claims(raw: Any, where: str, experiment: str | None) -> list[Claim]:
    """`claims:` of a sweep file -> Claims (shape, types, relation, min_effect checked here;
    metric and selectors against the sweep in `check_claims`)."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise SweepError(f"{where}: claims: expected a list of claims (each a mapping with "
                         f"{', '.join(REQUIRED)}), got {raw!r}")
    if len(raw) > MAX_CLAIMS:
        raise SweepError(f"{where}: claims: {len(raw)} claims, over the bound of {MAX_CLAIMS}")
    claims, names = [], set()
    for i, item in enumerate(raw):
        name = item.get("name") if isinstance(item, dict) else None
        at = _where(where, i, name)
        if not isinstance(item, dict):
            raise SweepError(f"{at}: expected a mapping with {', '.join(REQUIRED)}, got {item!r}")
        for key in item:
            if key not in FIELDS:
                raise SweepError(f"{at}.{key}: unknown key{did_you_mean(key, FIELDS, cutoff=0.5)}")
        for key in REQUIRED:
            if key not in item:
                raise SweepError(f"{at}.{key}: required")
        for key in ("name", "metric", "source", "paper"):
            if key in item and (not isinstance(item[key], str) or (key in REQUIRED and not item[key].strip())):
                raise SweepError(f"{at}.{key}: expected {'a non-empty' if key in REQUIRED else 'a'} string, "
                                 f"got {item[key]!r}")
        if name in names:
            raise SweepError(f"{at}.name: two claims named {name!r}; the findings table is keyed by name")
        names.add(name)
        relation = SPELLINGS.get(item["relation"], item["relation"])
        if relation not in RELATIONS:
            raise SweepError(f"{at}.relation: expected one of {', '.join(RELATIONS)} (or ~ for ≈); "
                             f"got {item['relation']!r}")
        min_effect = _number(item.get("min_effect", 0.01), f"{at}.min_effect")
        if min_effect <= 0:
            raise SweepError(f"{at}.min_effect: must be > 0 (the smallest difference that matters), "
                             f"got {item['min_effect']!r}")
        paper_effect = item.get("paper_effect")
        if paper_effect is not None:
            paper_effect = _number(paper_effect, f"{at}.paper_effect")
        chance = item.get("chance")
        if chance is not None:
            chance = _number(chance, f"{at}.chance")
        claims.append(Claim(name=name, metric=item["metric"],
                            a=_selector(item["a"], f"{at}.a", experiment),
                            b=_selector(item["b"], f"{at}.b", experiment),
                            relation=relation, min_effect=min_effect, source=item.get("source", ""),
                            paper_effect=paper_effect, paper=item.get("paper", ""), chance=chance))
    return claims


# --------------------------------------------------------------------------- checking


def _config_keys(configs: list[Configuration]) -> set[str]:
    """Selectable keys: every flattened key, and each mapping key above them (loss.weights)."""
    keys: set[str] = set()
    for c in configs:
        for key in c.flat:
            parts = key.split(".")
            keys.update(".".join(parts[:n]) for n in range(1, len(parts) + 1))
    return keys - {"role"}


def check_claims(claims: list[Claim], configs: list[Configuration], tasks: list[str], where: str,
                 known_points: bool) -> None:
    """The metric and the selectors of every claim, against the sweep's configurations
    (`known_points`: grid/random, every configuration planned; optuna: only the keys can be
    checked, the searched configurations come later)."""
    from mtbert.figures import run_figures

    metrics = set(run_figures(tasks)) | {DIVERGED}  # what every finished trial logs, and the divergence rate
    keys = _config_keys(configs)
    for i, claim in enumerate(claims):
        at = _where(where, i, claim.name)
        if claim.metric not in metrics:
            raise SweepError(f"{at}.metric: '{claim.metric}' is not a figure the trials log"
                             f"{did_you_mean(claim.metric, metrics)}; logged: {', '.join(sorted(metrics))}")
        picked = []
        for side, selector in (("a", claim.a), ("b", claim.b)):
            for key in selector:
                if key not in SPECIAL and key not in keys:
                    raise SweepError(f"{at}.{side}.{key}: not a config key{did_you_mean(key, keys)}")
            hits = pick(configs, selector)
            if not known_points and not (selector.get("role") in ("baseline", "reference")):
                continue
            shown = {k: v for k, v in selector.items() if k != "experiment"}
            if not hits:
                raise SweepError(f"{at}.{side}: {shown} selects none of the sweep's {len(configs)} "
                                 "configurations (baseline, reference and the planned points)")
            if len(hits) > 1:
                raise SweepError(f"{at}.{side}: {shown} selects {len(hits)} configurations "
                                 f"({', '.join(c.variant for c in hits)}); name more keys")
            picked.append(hits[0].variant)
        if len(picked) == 2 and picked[0] == picked[1]:
            raise SweepError(f"{at}: a and b select the same configuration ({picked[0]})")


# --------------------------------------------------------------------------- the record

CLAIMS_FILE = "claims.json"  # on a sweep's parent run: its claims and its seed design


def to_doc(claims: list[Claim], seeds: dict[str, Any]) -> str:
    """The parent run's claims.json: enough for `mtbert findings` to judge the sweep from the
    store alone. `seeds`: {"fixed": [...]} or {"start", "max", "budget"}."""
    return json.dumps({"seeds": seeds, "claims": [dataclasses.asdict(c) for c in claims]},
                      indent=2, ensure_ascii=False, default=str)


def from_doc(text: str) -> list[Claim]:
    out = []
    for item in json.loads(text).get("claims", []):
        looks = item.get("looks")
        if looks and not looks[-1] <= MAX_SEEDS:  # a store written before the bound: judging it would not end
            raise SweepError(f"{CLAIMS_FILE}: claim {item.get('name')!r}: looks up to {looks[-1]} seeds, over "
                             f"the bound of {MAX_SEEDS}")
        # A sweep logged before `verdicts:` existed is judged by today's defaults.
        out.append(Claim(**{k: v for k, v in item.items() if k in FIELDS}, looks=tuple(looks) if looks else None,
                         **{k: item[k] for k in ("error_rate", "interval") if k in item}))
    return out


def read_claims(path: str | Path) -> list[Claim]:
    """A sweep file's claims as written, for `mtbert findings`: checked for shape, not against
    the sweep's plan (that needs the file's data and encoder; `sweep run` does it)."""
    from mtbert.config import ConfigError, read_yaml

    try:
        raw = read_yaml(path)
    except ConfigError as exc:
        raise SweepError(str(exc)) from None
    tracking = raw.get("tracking") if isinstance(raw.get("tracking"), dict) else {}
    experiment = tracking.get("experiment") or raw.get("name") or Path(path).stem
    claims = parse_claims(raw.get("claims"), str(path), str(experiment))
    # Here, not at the top: the spec imports Ray and the config, seconds the report room need not pay.
    from orchestration.sweep.spec import parse_seeds, parse_verdicts

    _, adaptive = parse_seeds(raw.get("seeds"), str(path), base_seed=0)
    return with_verdicts(with_looks(claims, adaptive), parse_verdicts(raw.get("verdicts"), str(path)))


def with_verdicts(claims: list[Claim], verdicts) -> list[Claim]:
    """Every claim judged as the sweep's `verdicts:` say (error rate, interval)."""
    return [dataclasses.replace(c, error_rate=verdicts.error_rate, interval=verdicts.interval) for c in claims]


def design_looks(adaptive) -> tuple[int, int] | None:
    """The looks of adaptive seeds (start .. max paired seeds; from 2, as one seed has no
    interval to decide on); None under a list of seeds (one look, at the end)."""
    return (max(adaptive.start, 2), adaptive.max) if adaptive is not None else None


def with_looks(claims: list[Claim], adaptive) -> list[Claim]:
    """Under adaptive seeds every claim is judged at its sequential design's looks; under a
    list, once."""
    looks = design_looks(adaptive)
    return [dataclasses.replace(c, looks=looks) for c in claims]
