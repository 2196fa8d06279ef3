"""Sweep files: the schema, the validated `Sweep` a file loads into, and the small parsers
(`seeds:`, `verdicts:`, `--set`) that loading and claims.py both use.

Loading checks a sweep end to end before any compute is spent (load.py); this module holds
what it loads into and what plan.py and claims.py read, so that they import it and it
imports neither of them.

Every key of a sweep file is described in sweeps/README.md; the schema is `SweepFile` below,
dimensions are in orchestration/sweep/space.py, claims in orchestration/sweep/claims.py, the
bounds in orchestration/sweep/bounds.py, and adaptive seeds (spent only where a claim is still
open) in orchestration/run/searcher.py.

`--set KEY=VALUE` and `smoke:` entries use one rule: a key whose first part is a sweep key
(num_samples, search.seed, ...) changes the sweep; any other key (optim.lr, base.optim.lr)
changes the base config.
"""
from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal

from mtbert.config import (SEED_LIMIT, Config, ConfigError, build_config, coerce, parse_override, set_dotted,
                           to_dict)
from orchestration.errors import SweepError
from orchestration.paths import absolute_config_paths
from orchestration.sweep.bounds import MAX_HOURS, MAX_SEEDS, MAX_TRIALS
from orchestration.sweep.space import Dimension, dotted, values_of


# --------------------------------------------------------------------------- schema

@dataclass
class SearchSpec:
    algorithm: Literal["grid", "random", "optuna"] = "grid"
    seed: int = 0  # seeds the sampler (random/optuna), not the trials (see `seeds`)
    metric: str = "best_overall"  # a per-epoch metric of train(); best_overall = best dev overall so far
    mode: Literal["max", "min"] = "max"
    # optuna multi-objective, e.g. [best_overall max, train_time_s min, model_size_mb min]
    objectives: list[str] | None = None


@dataclass
class SchedulerSpec:
    type: Literal["fifo", "asha"] = "fifo"
    grace_period: int = 1  # epochs before ASHA may stop a trial
    reduction_factor: float = 2.0
    max_t: int | None = None  # null = the largest train.epochs in the sweep


@dataclass
class ResourcesSpec:
    cpu: float = 1.0
    gpu: float = 0.0  # fractions share a GPU between trials, e.g. 0.5


@dataclass
class TrackingSpec:
    uri: str | None = None  # null = --tracking-uri, $MLFLOW_TRACKING_URI, or sqlite:///<cwd>/mlflow.db
    experiment: str | None = None  # null = the sweep name; --smoke adds SMOKE_SUFFIX
    outage_s: float = 180.0  # seconds writes queue (trials train on) before the sweep stops to resume
    # The leaderboard's headline TM-relative score: compute (counted training FLOPs, which a
    # rerun reproduces on a loaded machine) or wall (measured train time).
    tm_score: Literal["wall", "compute"] = "compute"
    log_models: Literal["best", "all", "none"] = "best"  # which trials log an MLflow model
    register_model: str | None = None  # a Model Registry name for the best trial's model


@dataclass
class VerdictsSpec:
    """`verdicts:` how the sweep's claims are judged (orchestration/report/verdicts.py, docs/verdicts.md)."""
    # family: the chance that any verdict of the sweep's table is wrong stays within 5% (each of
    # its m claims at 5%/m); claim: each verdict on its own at 5%.
    error_rate: Literal["family", "claim"] = "family"
    # median: the interval of the per-seed differences' median, free of assumptions on the
    # noise (6 paired seeds or more); mean: the t-interval of their mean, right for near-normal
    # differences only.
    interval: Literal["median", "mean"] = "median"


@dataclass
class SeedBudget:
    trials: int | None = None  # at most this many trials in the whole sweep
    hours: float | None = None  # no new round after this much wall time from the first trial (not the setup)


@dataclass
class AdaptiveSeeds:
    """`seeds: {start, max, budget}`: seeds 0, 1, 2, ... spent where a claim is still open."""
    start: int = 3  # seeds of every configuration in the first round
    max: int = 12  # paired seeds at which an open claim stops taking more
    budget: SeedBudget = field(default_factory=SeedBudget)

    def describe(self) -> dict[str, Any]:
        return {"start": self.start, "max": self.max,
                "budget": {k: v for k, v in asdict(self.budget).items() if v is not None}}


@dataclass
class SweepFile:
    name: str | None = None  # null = the file name without .yaml
    description: str = ""
    base_config: str | None = None  # relative to the sweep file
    base: dict[str, Any] | None = None
    space: dict[str, Any] = field(default_factory=dict)
    search: SearchSpec = field(default_factory=SearchSpec)
    scheduler: SchedulerSpec = field(default_factory=SchedulerSpec)
    num_samples: int = 1
    max_concurrent: int | None = None  # null = as many as the resources allow
    max_failures: int = 2  # retries of a crashed trial, each from its last checkpoint
    resources: ResourcesSpec = field(default_factory=ResourcesSpec)
    baseline: dict[str, Any] | None = None  # null = the base config itself is the baseline
    # true = the frozen reference runs beside the sweep under each seed; a mapping = the same,
    # with these config overrides on top of it (e.g. {train.epochs: 10}).
    reference: bool | dict[str, Any] = False
    # true = each task of the base config also trains alone, under each seed (same encoder,
    # recipe and budget, static weighting): the single-task scores that Delta_m% is taken against.
    single_task: bool = False
    seeds: Any = None  # a list (null = [base train.seed]) or adaptive {start, max, budget}: parse_seeds
    claims: Any = None  # a list of claims: orchestration/sweep/claims.py
    verdicts: VerdictsSpec = field(default_factory=VerdictsSpec)  # how the claims are judged
    tracking: TrackingSpec = field(default_factory=TrackingSpec)
    smoke: dict[str, Any] | None = None


FILE_ONLY = ("space", "baseline", "smoke", "base", "base_config", "claims")  # not changed by --set
SWEEP_KEYS = {f.name for f in fields(SweepFile)} - set(FILE_ONLY)

# --smoke keeps an adaptive design adaptive, in its smallest form: one seed each, then a
# second one where a claim is open (with one seed there is no interval: every claim is).
SMOKE_SEEDS = (1, 2)

# --smoke: any sweep shrinks to seconds on a laptop or CI runner.
SMOKE_CONFIG: dict[str, Any] = {
    "model.name_or_path": "tiny",
    "model.tiny.layers": 2,
    "model.tiny.hidden": 32,
    "model.tiny.heads": 2,
    "model.tiny.intermediate": 64,
    "model.max_length": 32,
    "data.source": "synthetic",
    "data.files": {},  # synthetic data reads no files (an entry would be refused)
    "data.synthetic.train_size": 96,
    "data.synthetic.dev_size": 48,
    "data.max_train_examples": None,
    "data.max_dev_examples": None,
    "train.epochs": 2,
    "train.batch_size": 8,
    "train.device": "cpu",
    "sampling.steps_per_epoch": 4,
}
SMOKE_MAX_POINTS = 3  # searched configurations per seed (plus the baseline)
SMOKE_MAX_TINY_LAYERS = 12
SMOKE_SUFFIX = "-smoke"  # of a --smoke run's MLflow experiment: `<experiment>-smoke`
DEPTH_KEYS = ("sharing.encoder_shared_layers", "freeze.layers")


def single_task_overrides(task: str, base: dict[str, Any]) -> dict[str, Any]:
    """One task of the (nested, validated) base config trained alone: with one loss there is
    nothing to weigh, so static weighting (the weight 1) whatever method the multitask rows
    use; with one head no head is shared or cascaded; what the base says of the other tasks
    (their options, their files, the STS head) is dropped."""
    out: dict[str, Any] = {"tasks": [task], "loss.weighting": "static", "loss.weights": None,
                           "loss.pcgrad": False, "sharing.cascade": "none", "sharing.head_share_tasks": None}
    if "task_options" in base:
        out["task_options"] = {t: o for t, o in base["task_options"].items() if t == task}
    if (base.get("heads") or {}).get("task_dropout"):
        out["heads.task_dropout"] = {t: p for t, p in base["heads"]["task_dropout"].items() if t == task} or None
    if "files" in base.get("data", {}):
        out["data.files"] = {t: f for t, f in base["data"]["files"].items() if t == task}
    if task != "sts":
        out["sts.head"] = None
    return out


def reference_overrides(extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The frozen reference inside a sweep: mtbert.config.reference_settings() without its own
    training budget (the sweep's epochs and steps apply, so the row is read at the same budget), with
    the recipe's STS head (cosine for a pretrained bi-encoder), its head rate and mean pooling,
    whatever the base config chose for the fine-tuned rows; then `extra` on top."""
    from mtbert.config import reference_settings

    out = {k: v for k, v in reference_settings().items() if not k.startswith("train.")}
    out.update({"sts.head": None, "optim.head_lr": None, "model.pooling": "mean"})
    out.update(dotted(extra or {}))
    return out


@dataclass
class Sweep:
    """A validated sweep: everything the launcher needs, nothing left to check."""
    source: str  # the sweep file as given
    text: str  # its YAML, logged as an artifact of the parent run
    name: str
    spec: SweepFile
    base: dict[str, Any]  # nested base config, paths absolute, validated
    dims: list[Dimension]
    baseline: dict[str, Any]  # dotted overrides of the baseline trial
    seeds: list[int]  # the first round's under adaptive seeds (0 .. start-1)
    reference: dict[str, Any] | None = None  # dotted overrides of the frozen-reference trial
    # task -> dotted overrides of the trial that trains it alone (`single_task: true`)
    single_task: dict[str, dict[str, Any]] = field(default_factory=dict)
    claims: list = field(default_factory=list)  # orchestration.sweep.claims.Claim, experiment filled in
    adaptive: AdaptiveSeeds | None = None  # None: every configuration runs every seed of `seeds`
    smoke: bool = False
    notes: list[str] = field(default_factory=list)  # e.g. dimensions pinned by --smoke

    @property
    def experiment(self) -> str:
        """The MLflow experiment its runs go to; a --smoke run's is its own (SMOKE_SUFFIX), so
        that synthetic rows never sit among the real sweep's in its table or its MLflow view."""
        name = self.spec.tracking.experiment or self.name
        return name + SMOKE_SUFFIX if self.smoke else name

    @property
    def objectives(self) -> list[tuple[str, str]]:
        """(metric, mode) pairs; one pair unless optuna multi-objective."""
        if self.spec.search.objectives:
            return [tuple(o.split()) for o in self.spec.search.objectives]  # type: ignore[misc]
        return [(self.spec.search.metric, self.spec.search.mode)]

    def config_for(self, values: dict[str, Any], seed: int) -> dict[str, Any]:
        """The full nested config of one trial (validated); raises ConfigError."""
        raw = with_overrides(self.base, {**values, "train.seed": seed})
        return to_dict(validated_config(absolute_config_paths(raw)))

    def epoch_budget(self) -> int:
        return epoch_budget(self.base, self.dims, self.baseline)


def epoch_budget(base: dict[str, Any], dims: list[Dimension], baseline: dict[str, Any]) -> int:
    """The most epochs any trial of the sweep trains: the base's, a swept value's, the
    baseline's (TM-relative time and ASHA's max_t are read against it)."""
    budgets = [int((base.get("train") or {}).get("epochs") or 3)]
    budgets += [int(v) for v in values_of(dims, "train.epochs")]
    if "train.epochs" in baseline:
        budgets.append(int(baseline["train.epochs"]))
    return max(budgets)


def with_overrides(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """A copy of the nested `base` with the dotted `overrides` set (`base` is left as it was)."""
    raw = copy.deepcopy(base)
    for key, value in overrides.items():
        set_dotted(raw, key, copy.deepcopy(value))
    return raw


def validated_config(raw: dict[str, Any]) -> Config:
    """A trial's config as a trial would build it: the config rules, its files resolved, and
    the encoder-depth checks; raises ConfigError (`@: ...`)."""
    from mtbert.data.readers import resolve_files
    from mtbert.model.encoder import check_against_encoder

    cfg = build_config(raw, source="@")
    resolve_files(cfg)  # the params a trial logs name the format and columns really read
    try:
        check_against_encoder(cfg)
    except ConfigError as exc:
        raise ConfigError(f"@: {exc}") from None
    return cfg


# --------------------------------------------------------------------------- parsers

def split_overrides(items: list[str] | dict[str, Any] | None, where: str) -> tuple[dict, dict]:
    """--set / smoke entries -> (sweep-level overrides, base-config overrides), both dotted."""
    pairs = items.items() if isinstance(items, dict) else map(parse_override, items or [])
    sweep_level, config = {}, {}
    for key, value in pairs:
        head = key.split(".", 1)[0]
        if head in SWEEP_KEYS:
            sweep_level[key] = value
        elif head == "base" and "." in key:
            config[key.split(".", 1)[1]] = value
        elif head in FILE_ONLY:
            raise SweepError(f"{where} {key}: '{head}' can only be changed in the sweep file")
        else:
            config[key] = value
    return sweep_level, config


def parse_seeds(raw: Any, where: str, base_seed: int) -> tuple[list[int], AdaptiveSeeds | None]:
    """`seeds:` -> (the first round's seeds, the adaptive design or None)."""
    if raw is None:
        return [base_seed], None
    if isinstance(raw, dict):
        try:
            design = coerce(AdaptiveSeeds, raw, "seeds")
        except ConfigError as exc:
            raise SweepError(f"{where}: {exc}") from None
        if design.start < 1:
            raise SweepError(f"{where}: seeds.start: must be >= 1, got {design.start}")
        if design.max <= design.start:
            raise SweepError(f"{where}: seeds.max: must be > start ({design.start}), got {design.max}; "
                             "a fixed design is a list (seeds: [0, 1, 2])")
        if design.max > MAX_SEEDS:
            raise SweepError(f"{where}: seeds.max: {design.max}, over the bound of {MAX_SEEDS} seeds")
        budget = design.budget
        if budget.trials is not None and budget.trials < 1:
            raise SweepError(f"{where}: seeds.budget.trials: must be >= 1, got {budget.trials}")
        if budget.trials is not None and budget.trials > MAX_TRIALS:
            raise SweepError(f"{where}: seeds.budget.trials: {budget.trials:,}, over the bound of {MAX_TRIALS:,}")
        if budget.hours is not None and budget.hours <= 0:
            raise SweepError(f"{where}: seeds.budget.hours: must be > 0, got {budget.hours}")
        if budget.hours is not None and budget.hours > MAX_HOURS:
            raise SweepError(f"{where}: seeds.budget.hours: {budget.hours:g}, over the bound of {MAX_HOURS:,}")
        return list(range(design.start)), design
    try:
        seeds = coerce(list[int], raw, "seeds")
    except ConfigError:
        raise SweepError(f"{where}: seeds: expected a list of seeds or an adaptive design "
                         f"{{start, max, budget}}, got {raw!r}") from None
    if len(seeds) > MAX_SEEDS:
        raise SweepError(f"{where}: seeds: {len(seeds)} seeds, over the bound of {MAX_SEEDS}")
    for i, seed in enumerate(seeds):
        if not 0 <= seed < SEED_LIMIT:
            raise SweepError(f"{where}: seeds[{i}]: must be in 0..{SEED_LIMIT - 1}, got {seed}")
    if len(set(seeds)) != len(seeds):
        raise SweepError(f"{where}: seeds: duplicate seed in {seeds}")
    return (seeds or [base_seed]), None


def parse_verdicts(raw: Any, where: str) -> VerdictsSpec:
    """`verdicts:` of a sweep file read on its own (mtbert findings FILE): checked as at load."""
    try:
        return coerce(VerdictsSpec, raw or {}, "verdicts")
    except ConfigError as exc:
        raise SweepError(f"{where}: {exc}") from None
