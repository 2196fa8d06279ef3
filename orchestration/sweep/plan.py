"""From a validated Sweep to the trials Ray Tune runs.

Every trial's Tune config is self-contained (its full nested mtbert config included), so a
restored sweep needs nothing but the experiment folder:

    {"key": "p003-s1", "variant": "p003", "role": "search", "seed": 1,
     "values": {"optim.lr": 3e-4, ...}, "config": {...full config...}}

`key` names a trial across driver restarts (Tune trial ids can change when a sweep is
resumed); MLflow child runs are found by it. `variant` groups one configuration's seeds.

Grid and random search are expanded here, in the driver, with Ray's own variant generator
(seeded), so every point is validated before launch and CI can list them. Optuna suggests
points while the sweep runs; `Planner.from_raw` turns its raw parameters into a trial.
Under adaptive seeds (`seeds: {start, max}`) the planned trials are the first round, `start`
seeds each; searcher.SeedRounds plans the rounds after it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from ray.tune.search.variant_generator import generate_variants

from mtbert.config import ConfigError
from orchestration.errors import SweepError
from orchestration.sweep.labels import REFERENCE, SINGLE_TASK, STANDS_FOR, single_task_variant
from orchestration.sweep.spec import SMOKE_MAX_POINTS, Sweep

BASELINE = "baseline"


def trial_key(variant: str, seed: int) -> str:
    return f"{variant}-s{seed}"


@dataclass
class Planner:
    """Picklable: it travels inside the searcher when Tune checkpoints the sweep."""
    sweep: Sweep
    _fixed: list[dict[str, Any]] | None = field(default=None, repr=False, compare=False)

    def trial(self, variant: str, role: str, values: dict[str, Any], seed: int) -> dict[str, Any]:
        try:
            config = self.sweep.config_for(values, seed)
        except ConfigError as exc:
            # Only Optuna combinations can get here (grid/random points are checked at load);
            # the trial fails with this message and the sweep goes on.
            config = {"__invalid__": str(exc).removeprefix("@: ")}
        return {"key": trial_key(variant, seed), "variant": variant, "role": role, "seed": seed,
                "values": values, "config": config}

    def decode(self, raw: dict[str, Any]) -> dict[str, Any]:
        """Raw parameters -> config overrides (dotted keys): a points dimension gives all of
        its point's keys, so a trial's values, params and labels name config keys only."""
        values: dict[str, Any] = {}
        for dim in self.sweep.dims:
            values.update(dim.overrides(raw))
        return values

    def from_raw(self, raw: dict[str, Any], variant: str, seed: int) -> dict[str, Any]:
        return self.trial(variant, "search", self.decode(raw), seed)

    def raw_space(self, expand_grid: bool) -> dict[str, Any]:
        space: dict[str, Any] = {}
        for dim in self.sweep.dims:
            space.update(dim.domains(expand_grid))
        return space

    def search_values(self) -> list[dict[str, Any]]:
        """Grid/random: the searched configurations, in launch order (seeds not yet applied)."""
        spec = self.sweep.spec
        rng = np.random.RandomState(spec.search.seed)
        space = self.raw_space(expand_grid=spec.search.algorithm == "grid")
        points: list[dict[str, Any]] = []
        for _ in range(spec.num_samples):
            if not space:
                points.append({})
                continue
            for _resolved, resolved_spec in generate_variants(space, random_state=rng):
                points.append(self.decode(resolved_spec))
        if self.sweep.smoke and len(points) > SMOKE_MAX_POINTS:
            # Evenly spread, so a shrunk grid still touches its first and last values.
            step = (len(points) - 1) / (SMOKE_MAX_POINTS - 1)
            points = [points[round(i * step)] for i in range(SMOKE_MAX_POINTS)]
        return points

    def fixed_trials(self) -> list[dict[str, Any]]:
        """Baseline trials first (so their scores exist early), then the frozen reference and
        the single-task trials (if the sweep asks for them), then the expanded points under every seed. Optuna sweeps get
        only the baselines and the reference here. Built (and validated) once."""
        if self._fixed is None:
            self._fixed = self._expand()
        return self._fixed

    def _expand(self) -> list[dict[str, Any]]:
        seeds = self.sweep.seeds
        trials = [self.trial(BASELINE, "baseline", self.sweep.baseline, s) for s in seeds]
        baselines = {t["seed"]: t for t in trials}
        if self.sweep.reference is not None:
            trials += [self.trial(REFERENCE, REFERENCE, self.sweep.reference, s) for s in seeds]
        for task, overrides in self.sweep.single_task.items():
            trials += [self.trial(single_task_variant(task), SINGLE_TASK, overrides, s) for s in seeds]
        if self.sweep.spec.search.algorithm == "optuna":
            return trials
        points = self.search_values()
        width = max(3, len(str(len(points))))
        for i, values in enumerate(points):
            variant = f"p{i:0{width}d}"
            for seed in seeds:
                trial = self.trial(variant, "search", values, seed)
                if "__invalid__" in trial["config"]:
                    raise SweepError(f"{self.sweep.source}: space point {values}: "
                                     f"{trial['config']['__invalid__']}")
                same = baselines.get(seed)
                if same is not None and same["config"] == trial["config"]:
                    # Training it again would only measure the same run twice: the baseline's run
                    # is this point's, and says so (STANDS_FOR, a tag on its MLflow run).
                    same.setdefault(STANDS_FOR, []).append(variant)
                    continue
                trials.append(trial)
        return trials

    def optuna_trials(self) -> int:
        return self.sweep.spec.num_samples * len(self.sweep.seeds) if self.sweep.spec.search.algorithm == "optuna" else 0

    def total_trials(self) -> int:
        """The trials the sweep runs; under adaptive seeds the most it may run (every
        configuration at `max` seeds, within the budget), the first round being fixed_trials()."""
        adaptive = self.sweep.adaptive
        if adaptive is not None:
            most = len({t["variant"] for t in self.fixed_trials()}) * adaptive.max
            return most if adaptive.budget.trials is None else min(most, adaptive.budget.trials)
        return len(self.fixed_trials()) + self.optuna_trials()

