"""Search-space dimensions: one small class per `type:` of a `space:` entry (the types, with
examples, are listed in sweeps/README.md under "Dimensions").

A dimension turns its YAML mapping into (a) Ray Tune domains over *raw* parameters, which
both Ray's variant generator (grid/random) and Optuna can sample, and (b) a `decode` from
those raw parameters back to the config value. Categorical dimensions sample an index, not
the value itself, because Optuna only accepts scalars as categories while a value may be a
list or a weight mapping.

Most dimensions set one config key, their own `key`. A `points` dimension sets several at once
(`config_keys`), so code that turns a dimension into config values goes through `overrides` and
`check_overrides` (dotted key -> value), never `key` alone.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ray import tune

from mtbert.config import as_float
from mtbert.errors import did_you_mean
from orchestration.errors import SweepError
from orchestration.sweep.bounds import MAX_CONFIGURATIONS

SIMPLEX_SUM_TOLERANCE = 5e-3  # explicit weightings may be written rounded: 0.333 for 1/3
SIMPLEX_DECIMALS = 4  # sampled weights are rounded so params and tables stay readable
# The sweep run's tag naming each points dimension's keys (JSON: name -> keys), so that a report
# reading the store alone can tell a tied set of keys from keys swept on their own.
POINTS_TAG = "space_points"




def _index_domain(n: int, grid: bool) -> Any:
    """A categorical over the indices of n options (expanded when `grid`)."""
    index = list(range(n))
    return tune.grid_search(index) if grid else tune.choice(index)


@dataclass
class Dimension:
    key: str  # dotted config key, e.g. "optim.lr" (a points dimension: its name)
    where: str  # "sweeps/x.yaml: space.optim.lr", for error messages

    type_name = ""

    def check_values(self) -> list[Any]:
        """Config values that must all validate before any compute (ranges: both ends)."""
        raise NotImplementedError

    def domains(self, expand_grid: bool) -> dict[str, Any]:
        """Raw parameter name -> Ray Tune domain (a grid_search only when `expand_grid`)."""
        raise NotImplementedError

    def decode(self, raw: dict[str, Any]) -> Any:
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        raise NotImplementedError

    def config_keys(self) -> list[str]:
        """The dotted config keys this dimension sets."""
        return [self.key]

    def overrides(self, raw: dict[str, Any]) -> dict[str, Any]:
        """Raw parameters -> the config overrides of this dimension (dotted key -> value)."""
        return {self.key: self.decode(raw)}

    def check_overrides(self) -> list[dict[str, Any]]:
        """check_values as config overrides: each one validated on its own before any compute."""
        return [{self.key: value} for value in self.check_values()]

    def grid_size(self) -> int:
        """Configurations grid search makes of it (a sampled dimension: one per sample)."""
        return 1


def values_of(dims: list[Dimension], key: str) -> list[Any]:
    """Every value the dimensions may give `key` (ranges: their ends), whichever dimension sets it."""
    return [o[key] for dim in dims for o in dim.check_overrides() if key in o]


@dataclass
class Categorical(Dimension):
    """`grid` (expanded by grid search, sampled otherwise) and `choice` (always sampled)."""
    values: list[Any] = field(default_factory=list)
    expands: bool = True

    @property
    def type_name(self) -> str:  # type: ignore[override]
        return "grid" if self.expands else "choice"

    def check_values(self) -> list[Any]:
        return list(self.values)

    def domains(self, expand_grid: bool) -> dict[str, Any]:
        return {self.key: _index_domain(len(self.values), expand_grid and self.expands)}

    def grid_size(self) -> int:
        return len(self.values) if self.expands else 1

    def decode(self, raw: dict[str, Any]) -> Any:
        return self.values[int(raw[self.key])]

    def describe(self) -> dict[str, Any]:
        return {"type": self.type_name, "values": self.values}


@dataclass
class Uniform(Dimension):
    low: float = 0.0
    high: float = 1.0

    type_name = "uniform"

    def check_values(self) -> list[Any]:
        return [self.low, self.high]

    def domains(self, expand_grid: bool) -> dict[str, Any]:
        return {self.key: tune.uniform(self.low, self.high)}

    def decode(self, raw: dict[str, Any]) -> Any:
        return float(raw[self.key])

    def describe(self) -> dict[str, Any]:
        return {"type": self.type_name, "low": self.low, "high": self.high}


@dataclass
class LogUniform(Uniform):
    type_name = "loguniform"

    def domains(self, expand_grid: bool) -> dict[str, Any]:
        return {self.key: tune.loguniform(self.low, self.high)}


@dataclass
class RandInt(Uniform):
    """Integers from low to high, both inclusive (unlike tune.randint)."""
    type_name = "randint"

    def domains(self, expand_grid: bool) -> dict[str, Any]:
        return {self.key: tune.randint(self.low, self.high + 1)}

    def decode(self, raw: dict[str, Any]) -> Any:
        return int(raw[self.key])

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "inclusive": True}


@dataclass
class Simplex(Dimension):
    """Loss weights: non-negative per-task weights summing to 1, as a `loss.weights` mapping.

    With `values` (explicit weightings) or `step` (every lattice point with that spacing) it is
    a finite set, expanded like `grid` under grid search. Without either it is continuous:
    Dirichlet(1, ..., 1), drawn as normalised -log(u) of one uniform per task, so the same raw
    parameters work for Ray's samplers and for Optuna.
    """
    tasks: list[str] = field(default_factory=list)
    points: list[dict[str, float]] | None = None  # None = continuous

    type_name = "simplex"

    def check_values(self) -> list[Any]:
        if self.points is not None:
            return list(self.points)
        n = len(self.tasks)
        corners = [{t: float(i == j) for j, t in enumerate(self.tasks)} for i in range(n)]
        return [{t: 1.0 / n for t in self.tasks}, *corners]

    def grid_size(self) -> int:
        return len(self.points) if self.points is not None else 1

    def _raw_name(self, task: str) -> str:
        return f"{self.key}[{task}]"  # no '/', which Optuna's wrapper would turn into nesting

    def domains(self, expand_grid: bool) -> dict[str, Any]:
        if self.points is not None:
            return {self.key: _index_domain(len(self.points), expand_grid)}
        return {self._raw_name(t): tune.uniform(1e-9, 1.0) for t in self.tasks}

    def decode(self, raw: dict[str, Any]) -> Any:
        if self.points is not None:
            return dict(self.points[int(raw[self.key])])
        draws = [-math.log(max(float(raw[self._raw_name(t)]), 1e-12)) for t in self.tasks]
        return round_simplex(dict(zip(self.tasks, (d / sum(draws) for d in draws))))

    def describe(self) -> dict[str, Any]:
        if self.points is not None:
            return {"type": self.type_name, "tasks": self.tasks, "values": self.points}
        return {"type": self.type_name, "tasks": self.tasks, "distribution": "dirichlet(1)"}


@dataclass
class Points(Dimension):
    """`points`: tied values. Each point is a set of config overrides applied together (one
    configuration of several keys, e.g. a weighting method with the epochs that give it the
    same compute); a key a point leaves out keeps the base config's value. `key` names the
    dimension only: it is not a config key. Categorical over the point indices, so it is
    expanded like `grid` under grid search, drawn under random search and by Optuna."""
    points: list[dict[str, Any]] = field(default_factory=list)  # dotted key -> value, each

    type_name = "points"

    def check_overrides(self) -> list[dict[str, Any]]:
        return [dict(p) for p in self.points]

    def config_keys(self) -> list[str]:
        return list(dict.fromkeys(k for p in self.points for k in p))

    def grid_size(self) -> int:
        return len(self.points)

    def domains(self, expand_grid: bool) -> dict[str, Any]:
        return {self.key: _index_domain(len(self.points), expand_grid)}

    def overrides(self, raw: dict[str, Any]) -> dict[str, Any]:
        return dict(self.points[int(raw[self.key])])

    def describe(self) -> dict[str, Any]:
        return {"type": self.type_name, "keys": self.config_keys(), "values": self.points}


def dotted(mapping: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested or dotted overrides -> dotted; a loss.weights mapping stays one value, and so does
    a component given with its name ({name: cagrad, c: 0.2} replaces the method and all its
    settings; without a name, each setting is set over the method already there)."""
    from mtbert.config import component_keys

    out: dict[str, Any] = {}
    for key, value in mapping.items():
        full = f"{prefix}{key}"
        whole = full in ("loss.weights", "data.files", "heads.task_dropout") or (
            full in component_keys() and isinstance(value, dict) and "name" in value)
        if isinstance(value, dict) and value and not whole:
            out.update(dotted(value, full + "."))
        else:
            out[full] = value
    return out


def round_simplex(weights: dict[str, float]) -> dict[str, float]:
    """Round to SIMPLEX_DECIMALS and put the rounding error on the largest weight, so the
    weights still sum to exactly 1 at that precision."""
    out = {t: round(w, SIMPLEX_DECIMALS) for t, w in weights.items()}
    top = max(out, key=out.get)
    out[top] = round(1.0 - sum(w for t, w in out.items() if t != top), SIMPLEX_DECIMALS)
    return out


def lattice_size(tasks: int, step: float) -> int:
    """Points of simplex_lattice, counted without making them: n units over `tasks` parts."""
    n = round(1 / step)
    return math.comb(n + tasks - 1, tasks - 1)


def simplex_lattice(tasks: list[str], step: float) -> list[dict[str, float]]:
    """Every weighting whose weights are multiples of `step` and sum to 1, in lexicographic
    order of the counts (as filtering itertools.product would give, without its (n+1)^k)."""
    n, k = round(1 / step), len(tasks)
    combo = [0] * (k - 1) + [n]
    out = []
    while True:
        out.append({t: round(c / n, SIMPLEX_DECIMALS) for t, c in zip(tasks, combo)})
        # The next in order: raise the rightmost count that has units to its right to take.
        i = next((i for i in range(k - 2, -1, -1) if sum(combo[i + 1:]) > 0), None)
        if i is None:
            return out
        combo[i] += 1
        combo[i + 1:] = [0] * (k - i - 2) + [n - sum(combo[:i + 1])]


# --------------------------------------------------------------------------- parsing

_FIELDS = {
    "grid": {"type", "values"},
    "choice": {"type", "values"},
    "uniform": {"type", "low", "high"},
    "loguniform": {"type", "low", "high"},
    "randint": {"type", "low", "high"},
    "simplex": {"type", "tasks", "values", "step"},
    "points": {"type", "values"},
}
_RANGES = {"uniform": Uniform, "loguniform": LogUniform, "randint": RandInt}


def _number(raw: Any, name: str, where: str, integer: bool = False) -> float | int:
    number = as_float(raw)
    if number is None or (integer and not number.is_integer()):
        raise SweepError(f"{where}.{name}: expected {'int' if integer else 'number'}, got {raw!r}")
    if not math.isfinite(number):  # a range to infinity samples nothing
        raise SweepError(f"{where}.{name}: expected a finite number, got {raw!r}")
    return int(number) if integer else number


def parse_dimension(key: str, raw: Any, where: str, default_tasks: list[str]) -> Dimension:
    """One `space:` entry -> a Dimension. A bare list is shorthand for `{type: grid, values: [...]}`."""
    if isinstance(raw, list):
        raw = {"type": "grid", "values": raw}
    if not isinstance(raw, dict):
        raise SweepError(f"{where}: expected a mapping with 'type' (or a list of grid values), got {raw!r}")
    kind = raw.get("type")
    if kind not in _FIELDS:
        raise SweepError(f"{where}.type: expected one of {', '.join(_FIELDS)}; got {kind!r}"
                         f"{did_you_mean(kind, _FIELDS)}")
    for name in raw:
        if name not in _FIELDS[kind]:
            raise SweepError(f"{where}.{name}: unknown key for type {kind}"
                             f"{did_you_mean(name, _FIELDS[kind], cutoff=0.5)}")

    if kind in ("grid", "choice"):
        values = raw.get("values")
        if not isinstance(values, list) or not values:
            raise SweepError(f"{where}.values: expected a non-empty list, got {values!r}")
        return Categorical(key, where, values=values, expands=kind == "grid")
    if kind in _RANGES:
        for name in ("low", "high"):
            if name not in raw:
                raise SweepError(f"{where}.{name}: required for type {kind}")
        integer = kind == "randint"
        low = _number(raw["low"], "low", where, integer)
        high = _number(raw["high"], "high", where, integer)
        if integer and not low <= high:
            raise SweepError(f"{where}: low must be <= high (both inclusive), got low={low}, high={high}")
        if not integer and not low < high:
            raise SweepError(f"{where}: low must be < high, got low={low}, high={high}")
        if kind == "loguniform" and low <= 0:
            raise SweepError(f"{where}.low: must be > 0 for loguniform, got {low}")
        return _RANGES[kind](key, where, low=low, high=high)
    if kind == "points":
        return _parse_points(key, raw, where)
    return _parse_simplex(key, raw, where, default_tasks)


def _parse_points(key: str, raw: dict, where: str) -> Points:
    values = raw.get("values")
    if not isinstance(values, list) or not values:
        raise SweepError(f"{where}.values: expected a non-empty list of points, each a mapping of "
                         f"config keys to values (e.g. {{loss.weighting: static, train.epochs: 15}}), got {values!r}")
    points: list[dict[str, Any]] = []
    for i, value in enumerate(values):
        at = f"{where}.values[{i}]"
        if not isinstance(value, dict):
            raise SweepError(f"{at}: expected a mapping of config keys to values, got {value!r}")
        point = dotted(value)
        if "train.seed" in point:
            raise SweepError(f"{at}.train.seed: use the top-level `seeds:` list for seeds")
        # A method before its settings (loss.weighting before loss.weighting.c), whatever the
        # order written: each override is set in turn and a method set later would replace them.
        point = dict(sorted(point.items(), key=lambda kv: kv[0].count(".")))
        if point in points:
            raise SweepError(f"{at}: the same overrides as values[{points.index(point)}]; "
                             "each point is one configuration")
        points.append(point)
    return Points(key, where, points=points)


def _parse_simplex(key: str, raw: dict, where: str, default_tasks: list[str]) -> Simplex:
    if key != "loss.weights":
        raise SweepError(f"{where}: type simplex produces loss weights; use it on loss.weights")
    tasks = raw.get("tasks", default_tasks)
    if not isinstance(tasks, list) or not tasks or not all(isinstance(t, str) for t in tasks):
        raise SweepError(f"{where}.tasks: expected a non-empty list of task names, got {tasks!r}")
    if len(set(tasks)) != len(tasks):
        raise SweepError(f"{where}.tasks: duplicate task in {tasks}")
    if "values" in raw and "step" in raw:
        raise SweepError(f"{where}: give either values or step, not both")
    points = None
    if "step" in raw:
        step = _number(raw["step"], "step", where)
        if not 0 < step <= 1 or abs(1 / step - round(1 / step)) > 1e-6:
            raise SweepError(f"{where}.step: must divide 1 evenly (e.g. 0.25, 0.2), got {step}")
        count = lattice_size(len(tasks), step)
        if count > MAX_CONFIGURATIONS:
            raise SweepError(f"{where}.step: {step:g} over {len(tasks)} tasks is {count:,} weightings, over the "
                             f"bound of {MAX_CONFIGURATIONS:,} configurations")
        points = simplex_lattice(tasks, step)
    elif "values" in raw:
        values = raw["values"]
        if not isinstance(values, list) or not values:
            raise SweepError(f"{where}.values: expected a non-empty list of weightings, got {values!r}")
        points = [_weighting(v, tasks, f"{where}.values[{i}]") for i, v in enumerate(values)]
    return Simplex(key, where, tasks=list(tasks), points=points)


def _weighting(value: Any, tasks: list[str], where: str) -> dict[str, float]:
    if isinstance(value, list):
        if len(value) != len(tasks):
            raise SweepError(f"{where}: expected {len(tasks)} weights (one per task in {tasks}), got {value!r}")
        value = dict(zip(tasks, value))
    if not isinstance(value, dict):
        raise SweepError(f"{where}: expected a list of weights or a task -> weight mapping, got {value!r}")
    out = {}
    for task, w in value.items():
        if task not in tasks:
            raise SweepError(f"{where}.{task}: not one of the simplex tasks {tasks}")
        w = _number(w, str(task), where)
        if w < 0:
            raise SweepError(f"{where}.{task}: weights must be >= 0, got {w}")
        out[str(task)] = w
    total = sum(out.values())
    if abs(total - 1) > SIMPLEX_SUM_TOLERANCE:
        raise SweepError(f"{where}: weights must sum to 1, got {total:g}")
    return {t: out.get(t, 0.0) / total for t in tasks}
