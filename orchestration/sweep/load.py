"""Loading a sweep file: YAML -> a validated `Sweep` (spec.py), checked end to end before any
compute is spent.

Like configs, a sweep fails at load with one line naming the file and key path: an unknown
key gets the closest valid one, a wrong type gets path / expected / value, and *every value
the search space can produce for a config key* is run through the config validation (and
the encoder-depth checks), so a bad head regime in a choice fails now, not in trial 7. Its
claims are checked against the plan (plan.py, claims.py), and its sizes against the bounds
(bounds.py).

The top of the sweep room: it imports spec, space, plan and claims, and none of them imports it.
"""
from __future__ import annotations

import copy
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from mtbert import figures
from mtbert.config import SEED_LIMIT, Config, ConfigError, build_config, coerce, read_yaml, set_dotted, to_dict
from mtbert.errors import did_you_mean
from orchestration.errors import SweepError
from orchestration.paths import absolute_config_paths
from orchestration.sweep.bounds import MAX_CONFIGURATIONS, MAX_DIMENSIONS, MAX_OUTAGE_S, MAX_TRIALS
from orchestration.sweep.claims import check_claims, configurations, parse_claims, pick, with_looks, with_verdicts
from orchestration.sweep.plan import Planner
from orchestration.sweep.space import Dimension, Points, dotted, parse_dimension, values_of
from orchestration.sweep.spec import (DEPTH_KEYS, SMOKE_CONFIG, SMOKE_MAX_TINY_LAYERS, SMOKE_SEEDS, Sweep, SweepFile,
                                      epoch_budget, parse_seeds, reference_overrides, single_task_overrides,
                                      split_overrides, validated_config, with_overrides)


def load_sweep(path: str | Path, overrides: list[str] | None = None, smoke: bool = False) -> Sweep:
    """The sweep file at `path`, with `--set` overrides and --smoke's shrinking applied, checked
    in full: the first thing wrong fails it in one line."""
    path = Path(path)
    try:
        raw = read_yaml(path)
    except ConfigError as exc:
        raise SweepError(str(exc)) from None
    text = path.read_text()
    where = str(path)
    _check_shape(raw, where)
    sweep_set, config_set = split_overrides(overrides, "--set")
    full_budget = _full_epoch_budget(raw, path, where, config_set) if smoke else None
    smoke_config: dict[str, Any] = {}
    if smoke:
        if raw.get("smoke") is not None and not isinstance(raw["smoke"], dict):
            raise SweepError(f"{where}: smoke: expected a mapping of overrides, got {raw['smoke']!r}")
        smoke_sweep, smoke_config = split_overrides(raw.get("smoke") or {}, f"{where}: smoke:")
        smoke_config = {**SMOKE_CONFIG, **smoke_config}
        _shrink_sweep(raw, smoke_sweep, where)
    for key, value in sweep_set.items():  # --set wins over --smoke: it is the later word
        set_dotted(raw, key, value)

    try:
        spec = coerce(SweepFile, raw, "")
    except ConfigError as exc:
        raise SweepError(f"{where}: {exc}") from None
    name = spec.name or path.stem
    base = _load_base(spec, path, where, config_set, smoke_config)
    dims, notes = _load_dims(spec, base, where, pinned=smoke_config)
    _check_sizes(spec, dims, where)
    if smoke:
        _fit_tiny_depth(base, dims, spec.baseline or {}, notes)
    try:
        base_cfg = validated_config(absolute_config_paths(copy.deepcopy(base)))
    except ConfigError as exc:
        raise _config_error(exc, f"{where}: base") from None
    base = to_dict(base_cfg)
    seeds, adaptive = parse_seeds(spec.seeds, where, base_cfg.train.seed)
    reference = None
    if spec.reference is not False:
        reference = reference_overrides(spec.reference if isinstance(spec.reference, dict) else None)
    sweep = Sweep(source=where, text=text, name=name, spec=spec, base=base, dims=dims,
                  baseline=dotted(spec.baseline or {}), seeds=list(seeds), smoke=smoke, notes=notes,
                  reference=reference, adaptive=adaptive,
                  single_task={t: single_task_overrides(t, base) for t in base_cfg.tasks} if spec.single_task else {})
    _check_configs(sweep, where)
    _check_search(sweep, where, base_cfg.tasks)
    _check_scheduler(sweep, where, full_budget)
    _check_counts(sweep, where)
    if raw.get("space") == {} and not spec.baseline:  # written out empty: not a default
        raise SweepError(f"{where}: space: empty and no baseline overrides, so the sweep would train "
                         "the base config twice; add a dimension, or train it once with `mtbert train`")
    _check_claims(sweep, where, base_cfg.tasks, pinned=smoke_config)
    return sweep


def configurations_of(spec: SweepFile, dims: list[Dimension]) -> int:
    """The searched configurations the plan will hold (before seeds), counted without
    expanding them: grid search crosses the finite dimensions, each of num_samples times;
    random search and Optuna draw num_samples points."""
    if spec.search.algorithm != "grid":
        return spec.num_samples
    points = spec.num_samples
    for dim in dims:
        points *= dim.grid_size()
    return points


def _check_sizes(spec: SweepFile, dims: list[Dimension], where: str) -> None:
    """The bounds (bounds.py), each in one line naming its key, before anything is expanded."""
    if not 0 <= spec.search.seed < SEED_LIMIT:
        raise SweepError(f"{where}: search.seed: must be in 0..{SEED_LIMIT - 1}, got {spec.search.seed}")
    if len(dims) > MAX_DIMENSIONS:
        raise SweepError(f"{where}: space: {len(dims)} dimensions, over the bound of {MAX_DIMENSIONS}")
    for dim in dims:  # each value is validated as a config at load: a choice's too
        values = len(dim.check_overrides())
        if values > MAX_CONFIGURATIONS:
            raise SweepError(f"{dim.where}: {values:,} values, over the bound of {MAX_CONFIGURATIONS:,}")
    if spec.num_samples > MAX_CONFIGURATIONS:
        raise SweepError(f"{where}: num_samples: {spec.num_samples}, over the bound of {MAX_CONFIGURATIONS:,} "
                         "configurations")
    count = configurations_of(spec, dims)
    if count > MAX_CONFIGURATIONS:
        sizes = " x ".join(f"{d.key} {d.grid_size()}" for d in dims if d.grid_size() > 1)
        samples = f" x num_samples {spec.num_samples}" if spec.num_samples > 1 else ""
        raise SweepError(f"{where}: space: {count:,} configurations ({sizes}{samples}), over the bound of "
                         f"{MAX_CONFIGURATIONS:,}; search fewer values, or use search.algorithm: random "
                         "with num_samples")
    seeds, adaptive = parse_seeds(spec.seeds, where, 0)
    if adaptive is not None and adaptive.budget.trials is not None:
        return  # the budget bounds the trials itself (parse_seeds checked it)
    most = adaptive.max if adaptive is not None else len(seeds)
    if count * most > MAX_TRIALS:
        key = "seeds.max" if adaptive is not None else "seeds"
        raise SweepError(f"{where}: {key}: {count:,} configurations x {most} seeds is {count * most:,} trials, "
                         f"over the bound of {MAX_TRIALS:,}")


def _check_shape(raw: dict, where: str) -> None:
    """Mistakes of shape that the key-by-key check would word badly."""
    stray = sorted(k for k in raw if k in {f.name for f in fields(Config)})
    if stray and not any(k in raw for k in ("space", "base", "base_config")):
        raise SweepError(f"{where}: a training config (it has {', '.join(k + ':' for k in stray)}), not a "
                         f"sweep file; train it with `mtbert train --config {where}`, or name it in a "
                         "sweep's base_config:")
    if stray:
        raise SweepError(f"{where}: {stray[0]}: a config key at the top level of a sweep file; "
                         f"put it under base: ({stray[0]}: ...)")
    if isinstance(raw.get("base"), str):
        raise SweepError(f"{where}: base: {raw['base']!r} is a file name; write base_config: {raw['base']} "
                         "(base: takes an inline mapping of config keys)")


def _full_epoch_budget(raw: dict, path: Path, where: str, config_set: dict) -> int | None:
    """The epoch budget of the sweep as it runs for real, before --smoke shrinks it (None when
    the file does not parse: the smoke load reports that)."""
    try:
        spec = coerce(SweepFile, copy.deepcopy(raw), "")
        base = _load_base(spec, path, where, config_set, {})
        dims = [parse_dimension(str(key), raw_dim, where, []) for key, raw_dim in spec.space.items()
                if str(key) == "train.epochs" or (isinstance(raw_dim, dict) and raw_dim.get("type") == "points")]
        return epoch_budget(base, dims, dotted(spec.baseline or {}))
    except (ConfigError, SweepError, TypeError, ValueError):
        return None


def _shrink_sweep(raw: dict, smoke_sweep: dict[str, Any], where: str) -> None:
    if isinstance(raw.get("num_samples"), int):
        raw["num_samples"] = min(raw["num_samples"], 2)
    if isinstance(raw.get("seeds"), list):
        raw["seeds"] = raw["seeds"][:1]
    elif isinstance(raw.get("seeds"), dict):
        parse_seeds(raw["seeds"], where, 0)  # the design as written is checked, then shrunk
        raw["seeds"] = {**raw["seeds"], "start": SMOKE_SEEDS[0], "max": SMOKE_SEEDS[1]}
    if isinstance(raw.get("max_failures"), int):
        raw["max_failures"] = min(raw["max_failures"], 1)
    resources = raw.get("resources")
    if isinstance(resources, dict):
        # CI runners have 2 cores and no GPU; a bigger request would wait forever.
        resources.update(cpu=1, gpu=0)
    sched = raw.get("scheduler")
    if isinstance(sched, dict):
        sched.pop("max_t", None)  # re-derived from the shrunk epoch budget
    for key, value in smoke_sweep.items():
        set_dotted(raw, key, value)


def _load_base(spec: SweepFile, path: Path, where: str, config_set: dict, smoke_config: dict) -> dict:
    base: dict[str, Any] = {}
    if spec.base_config:
        ref = Path(spec.base_config)
        ref = ref if ref.is_absolute() else path.parent / ref
        try:
            base = read_yaml(ref)
        except ConfigError as exc:
            raise SweepError(f"{where}: base_config: {exc}") from None
    for key, value in dotted(spec.base or {}).items():
        set_dotted(base, key, value)
    for key, value in {**smoke_config, **config_set}.items():
        set_dotted(base, key, value)
    return base


def _pinned_by(key: str, pinned: dict[str, Any]) -> bool:
    return any(key == p or key.startswith(p + ".") or p.startswith(key + ".") for p in pinned)


def _load_dims(spec: SweepFile, base: dict, where: str, pinned: dict) -> tuple[list[Dimension], list[str]]:
    try:
        tasks = build_config(copy.deepcopy(base), source="@").tasks
    except ConfigError:
        tasks = ["sst", "para", "sts"]  # the base error is reported, better worded, right after
    dims, notes = [], []
    for key, raw_dim in spec.space.items():
        key = str(key)
        if key == "train.seed":
            raise SweepError(f"{where}: space.{key}: use the top-level `seeds:` list for seeds")
        dim = parse_dimension(key, raw_dim, f"{where}: space.{key}", tasks)
        _check_overlap(dim, dims)
        if isinstance(dim, Points):
            dim = _pin_points(dim, base, pinned, notes)
            if dim is not None:
                dims.append(dim)
            continue
        if _pinned_by(key, pinned):
            _check_dropped(dim, base)
            notes.append(f"--smoke pins {key} (space dimension dropped)")
            continue
        dims.append(dim)
    return dims, notes


def _check_overlap(dim: Dimension, dims: list[Dimension]) -> None:
    """Two dimensions that set one key (or a key and its settings) would cross values that
    cannot both hold; a points dimension names the tied keys in its points instead."""
    for other in dims:
        if not (isinstance(dim, Points) or isinstance(other, Points)):
            continue  # a plain dimension's key is the YAML mapping's own: it cannot repeat
        for key in dim.config_keys():
            if _pinned_by(key, dict.fromkeys(other.config_keys())):
                at = dim.where
                if isinstance(dim, Points):
                    at += f".values[{next(i for i, p in enumerate(dim.points) if key in p)}].{key}"
                raise SweepError(f"{at}: also set by {other.where.split(': ', 1)[-1]}; set each key in "
                                 "one dimension (a points dimension ties keys together)")


def _pin_points(dim: Points, base: dict, pinned: dict, notes: list[str]) -> Points | None:
    """--smoke on a points dimension: the keys it pins leave every point (checked first, as
    _check_dropped does), the rest stays tied; points that become one are kept once, and a
    dimension left with no key is dropped."""
    keys = [k for k in dim.config_keys() if _pinned_by(k, pinned)]
    if not keys:
        return dim
    _check_dropped(dim, base)
    points: list[dict[str, Any]] = []
    for point in dim.points:
        kept = {k: v for k, v in point.items() if k not in keys}
        if kept not in points:
            points.append(kept)
    if not any(points):
        notes.append(f"--smoke pins {', '.join(keys)} (space dimension {dim.key} dropped)")
        return None
    notes.append(f"--smoke pins {', '.join(keys)} (dropped from the points of {dim.key}"
                 + (f"; {len(points)} of {len(dim.points)} points left)" if len(points) < len(dim.points) else ")"))
    return replace(dim, points=points)


def _check_dropped(dim: Dimension, base: dict) -> None:
    """A dimension --smoke drops is still checked value by value (config rules only: its
    values may name a real encoder the smoke run never loads), so that a CI smoke pass does
    not wave through a sweep file that fails for real."""
    _check_values(dim, lambda overrides: build_config(with_overrides(base, overrides), source="@"))


def _check_values(dim: Dimension, build) -> None:
    """Every value of `dim` through `build` (overrides -> config), one line per ConfigError."""
    for i, overrides in enumerate(dim.check_overrides()):
        try:
            build(overrides)
        except ConfigError as exc:
            raise _dim_error(exc, dim, i, overrides) from None


def _dim_error(exc: ConfigError, dim: Dimension, i: int, overrides: dict[str, Any]) -> SweepError:
    """One line naming the dimension, and for a points dimension the point and the key:
    `space.arm.values[2].train.epochs: value 'x': expected int`."""
    if not isinstance(dim, Points):
        value = overrides[dim.key]
        if "unknown key" in str(exc):  # the key is wrong, whatever the value
            return _config_error(exc, dim.where, dim.key)
        return _config_error(exc, f"{dim.where}: value {value!r}", dim.key)
    msg = str(exc).removeprefix("@: ")
    at = f"{dim.where}.values[{i}]"
    # The point's key the message names (a setting below a key counts as the key's).
    named = [k for k in overrides if msg.startswith((f"{k}: ", f"{k}."))]
    if not named:
        return SweepError(f"{at}: {msg}")
    key = max(named, key=len)
    if msg.startswith(f"{key}: "):  # about the key itself, not one of its settings
        msg = msg[len(key) + 2:]
        if "unknown key" in msg:  # the key is wrong, whatever the value
            return SweepError(f"{at}.{key}: {msg}")
    return SweepError(f"{at}.{key}: value {overrides[key]!r}: {msg}")


def _fit_tiny_depth(base: dict, dims: list[Dimension], baseline: dict, notes: list[str]) -> None:
    """--smoke swaps in a tiny encoder; give it enough layers for the swept depths, and one
    more where a `freeze.layers: n` would otherwise freeze all of it: n then leaves a layer to
    train, as it does on the real encoder, and stays apart from -1 (all frozen). Two
    configurations the real sweep tells apart stay apart; the note names the depth chosen."""
    depths = {key: [] for key in DEPTH_KEYS}
    for key in DEPTH_KEYS:
        depths[key] += [v for v in values_of(dims, key) if isinstance(v, int) and not isinstance(v, bool)]
    for key, value in dotted(baseline).items():
        if key in DEPTH_KEYS and isinstance(value, int):
            depths[key].append(value)
    for key in DEPTH_KEYS:
        value = get_dotted(base, key)
        if isinstance(value, int) and not isinstance(value, bool):
            depths[key].append(value)
    layers = max([2, *depths["sharing.encoder_shared_layers"], *depths["freeze.layers"]])
    frozen = [n for n in depths["freeze.layers"] if n > 0]
    if frozen and max(frozen) >= layers:
        layers += 1
    layers = min(layers, SMOKE_MAX_TINY_LAYERS)
    set_dotted(base, "model.tiny.layers", layers)
    if layers > SMOKE_CONFIG["model.tiny.layers"]:
        why = [f"{key} up to {max(values)}" for key, values in depths.items() if values and max(values) > 0]
        notes.append(f"--smoke: a {layers}-layer tiny encoder for {', '.join(why)}"
                     + (f" (freeze.layers {max(frozen)} leaves a layer to train, as on the real encoder)"
                        if frozen and max(frozen) < layers else ""))


def get_dotted(raw: dict, key: str) -> Any:
    """A dotted key's value in a nested mapping (None where it is not set)."""
    node: Any = raw
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _check_configs(sweep: Sweep, where: str) -> None:
    """Every value of every dimension, the baseline and the reference, as full trial configs."""
    for dim in sweep.dims:
        _check_values(dim, lambda overrides: sweep.config_for(overrides, sweep.seeds[0]))
    single = {f"single_task: {task}": overrides for task, overrides in sweep.single_task.items()}
    for name, overrides in (("baseline", sweep.baseline), ("reference", sweep.reference), *single.items()):
        if overrides is None:
            continue
        try:
            sweep.config_for(overrides, sweep.seeds[0])
        except ConfigError as exc:
            raise _config_error(exc, f"{where}: {name}") from None


def _check_metric(name: str, at: str, known: set[str]) -> None:
    if name not in known:
        raise SweepError(f"{at}: unknown metric '{name}'{did_you_mean(name, known)}; "
                         f"known: {', '.join(sorted(known))}")


def _check_search(sweep: Sweep, where: str, tasks: list[str]) -> None:
    search = sweep.spec.search
    known = set(figures.searchable(tasks))  # the per-epoch figures of train()'s report
    _check_metric(search.metric, f"{where}: search.metric", known)
    if search.algorithm == "optuna" and not sweep.dims:
        raise SweepError(f"{where}: space: optuna needs at least one dimension to search")
    if search.objectives is None:
        return
    if search.algorithm != "optuna":
        raise SweepError(f"{where}: search.objectives: multi-objective search needs algorithm optuna, "
                         f"got {search.algorithm}")
    if not search.objectives:
        raise SweepError(f"{where}: search.objectives: expected at least one 'metric max|min'")
    for i, item in enumerate(search.objectives):
        parts = item.split()
        if len(parts) != 2 or parts[1] not in ("max", "min"):
            raise SweepError(f"{where}: search.objectives[{i}]: expected 'metric max' or 'metric min', got {item!r}")
        _check_metric(parts[0], f"{where}: search.objectives[{i}]", known)


def _check_claims(sweep: Sweep, where: str, tasks: list[str], pinned: dict[str, Any]) -> None:
    """Every claim against the sweep's configurations, then with the design's looks. A --smoke
    run is checked against the plan it would have without --smoke (a typo is a typo there
    too), then runs only the claims whose two configurations its shrunk plan kept."""
    claims = parse_claims(sweep.spec.claims, where, sweep.experiment)
    searched = sweep.spec.search.algorithm != "optuna"
    if sweep.adaptive is not None:
        if not claims:
            raise SweepError(f"{where}: seeds: adaptive seeds spend seeds where a claim is still open, and "
                             "the sweep has no claims: (nothing to decide); add claims or list the seeds")
        if not searched:
            raise SweepError(f"{where}: seeds: adaptive seeds need grid or random search (their "
                             "configurations are known before the first round); optuna takes a list")
    if not claims:
        return
    planned = Planner(sweep).fixed_trials()
    if sweep.adaptive is not None and sweep.adaptive.budget.trials is not None \
            and sweep.adaptive.budget.trials < len(planned):
        raise SweepError(f"{where}: seeds.budget.trials: {sweep.adaptive.budget.trials} < {len(planned)}, "
                         f"the first round ({len(planned) // len(sweep.seeds)} configurations x "
                         f"{len(sweep.seeds)} seeds)")
    kept = configurations(planned)
    full = kept if not sweep.smoke else configurations(Planner(replace(sweep, smoke=False)).fixed_trials())
    if sweep.smoke:
        named = [c for c in claims if any(_pinned_by(k, pinned) for k in (*c.a, *c.b))]
        for claim in named:
            sweep.notes.append(f"--smoke pins a key that claim '{claim.name}' names: the claim is not judged")
        claims = [c for c in claims if c not in named]
    check_claims(claims, full, tasks, where, known_points=searched)
    if sweep.smoke and searched:
        dropped = [c for c in claims if not (pick(kept, c.a) and pick(kept, c.b))]
        for claim in dropped:
            sweep.notes.append(f"--smoke keeps {len(kept)} configurations, not both of claim '{claim.name}': "
                               "the claim is not judged")
        claims = [c for c in claims if c not in dropped]
        if sweep.adaptive is not None and not claims:
            sweep.adaptive = None  # nothing left to decide: the smoke run is its first round
    sweep.claims = with_verdicts(with_looks(claims, sweep.adaptive), sweep.spec.verdicts)


def _check_scheduler(sweep: Sweep, where: str, full_budget: int | None = None) -> None:
    sched = sweep.spec.scheduler
    if sched.type != "asha":
        return
    max_t = sched.max_t or sweep.epoch_budget()
    if sweep.smoke and full_budget is not None and sched.grace_period > full_budget:
        # Checked on the real budget: the smoke run shrinks epochs and would hide it.
        raise SweepError(f"{where}: scheduler.grace_period: {sched.grace_period} > {full_budget}, the "
                         "epoch budget of the real sweep; lower it or raise train.epochs")
    if sweep.smoke:
        sched.grace_period = min(sched.grace_period, max_t)
    if sched.grace_period < 1:
        raise SweepError(f"{where}: scheduler.grace_period: must be >= 1, got {sched.grace_period}")
    if max_t < sched.grace_period:
        raise SweepError(f"{where}: scheduler.grace_period: {sched.grace_period} > max_t {max_t} "
                         "(the epoch budget); lower it or raise train.epochs")
    if sched.reduction_factor <= 1:
        raise SweepError(f"{where}: scheduler.reduction_factor: must be > 1, got {sched.reduction_factor}")
    sched.max_t = max_t


def _check_counts(sweep: Sweep, where: str) -> None:
    spec = sweep.spec
    if spec.num_samples < 1:
        raise SweepError(f"{where}: num_samples: must be >= 1, got {spec.num_samples}")
    if spec.max_concurrent is not None and spec.max_concurrent < 1:
        raise SweepError(f"{where}: max_concurrent: must be >= 1 (or null), got {spec.max_concurrent}")
    if spec.tracking.outage_s <= 0:
        raise SweepError(f"{where}: tracking.outage_s: must be > 0 seconds, got {spec.tracking.outage_s}")
    if spec.tracking.outage_s > MAX_OUTAGE_S:
        raise SweepError(f"{where}: tracking.outage_s: {spec.tracking.outage_s:g}, over the bound of "
                         f"{MAX_OUTAGE_S:,} seconds (a week)")
    if spec.max_failures < 0:
        raise SweepError(f"{where}: max_failures: must be >= 0, got {spec.max_failures}")
    if spec.resources.cpu <= 0 or spec.resources.gpu < 0:
        raise SweepError(f"{where}: resources: cpu must be > 0 and gpu >= 0, got "
                         f"cpu={spec.resources.cpu}, gpu={spec.resources.gpu}")


def _config_error(exc: ConfigError, where: str, key: str | None = None) -> SweepError:
    msg = str(exc).removeprefix("@: ")
    if key and msg.startswith(f"{key}: "):
        msg = msg[len(key) + 2:]
    return SweepError(f"{where}: {msg}")
