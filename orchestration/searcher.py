"""One Tune searcher for every sweep: fixed trials first, then (optionally) Optuna.

- Fixed trials: the baseline under each seed, and for grid/random the whole expanded plan.
  Emitting the baselines first lets their scores exist early; they never reach Optuna.
- Optuna: each suggestion runs under every seed (`seeds:`) and Optuna is told the mean over
  the seeds, per objective. Ray's `Repeater` does the same for one metric only; this one
  handles multi-objective lists too.

The state (what was handed out, the seed groups, Optuna's study) is saved with Tune's
experiment checkpoints, so `mtbert sweep resume` continues the same plan: the n-th
suggestion keeps its variant id and finds its MLflow run again.
"""
from __future__ import annotations

import math
import os
import pickle
import tempfile
from typing import Any

from ray.tune.search import Searcher

from orchestration.plan import Planner


class SweepSearcher(Searcher):
    def __init__(self, planner: Planner, inner: Searcher | None = None,
                 metric: str | None = None, mode: str | None = None):
        super().__init__(metric=metric, mode=mode)
        self._planner = planner
        self._inner = inner
        self._fixed = planner.fixed_trials()
        self._next_fixed = 0
        self._fixed_ids: set[str] = set()
        self._inner_budget = planner.sweep.spec.num_samples if inner is not None else 0
        self._inner_made = 0
        self._queued: list[tuple[str, dict]] = []  # (primary trial id, config) of later seeds
        self._groups: dict[str, dict[str, Any]] = {}  # primary trial id -> {size, results}
        self._primary_of: dict[str, str] = {}

    @property
    def total_trials(self) -> int:
        return len(self._fixed) + self._inner_budget * len(self._planner.sweep.seeds)

    def set_search_properties(self, metric: str | None, mode: str | None, config: dict, **spec) -> bool:
        # The space lives in the plan (and in the inner searcher, set up at construction).
        if metric and not self._metric:
            self._metric = metric
        if mode and not self._mode:
            self._mode = mode
        return True

    def suggest(self, trial_id: str) -> dict | None:
        if self._next_fixed < len(self._fixed):
            config = self._fixed[self._next_fixed]
            self._next_fixed += 1
            self._fixed_ids.add(trial_id)
            return config
        if self._queued:
            primary, config = self._queued.pop(0)
            self._primary_of[trial_id] = primary
            return config
        if self._inner is None or self._inner_made >= self._inner_budget:
            return Searcher.FINISHED
        raw = self._inner.suggest(trial_id)
        if raw is None or raw == Searcher.FINISHED:
            return raw
        variant = f"o{self._inner_made:03d}"
        self._inner_made += 1
        configs = [self._planner.from_raw(raw, variant, seed) for seed in self._planner.sweep.seeds]
        self._groups[trial_id] = {"size": len(configs), "results": {}}
        self._primary_of[trial_id] = trial_id
        self._queued.extend((trial_id, c) for c in configs[1:])
        return configs[0]

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        # Optuna runs with a NopPruner here (ASHA stops trials), so intermediate values unused.
        return

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        if trial_id in self._fixed_ids or trial_id not in self._primary_of or self._inner is None:
            return
        primary = self._primary_of[trial_id]
        group = self._groups[primary]
        group["results"][trial_id] = None if error else result
        if len(group["results"]) < group["size"]:
            return
        ok = [r for r in group["results"].values() if r]
        if not ok:
            self._inner.on_trial_complete(primary, None, error=True)
            return
        metrics = self._inner.metric if isinstance(self._inner.metric, list) else [self._inner.metric]
        mean = {}
        for name in metrics:
            values = [float(r[name]) for r in ok if isinstance(r.get(name), (int, float))]
            values = [v for v in values if not math.isnan(v)]
            if values:
                mean[name] = sum(values) / len(values)
        if len(mean) < len(metrics):
            self._inner.on_trial_complete(primary, None, error=True)
        else:
            self._inner.on_trial_complete(primary, mean)

    # ------------------------------------------------------------------ checkpointing

    def get_state(self) -> dict:
        state = dict(self.__dict__)
        state.pop("_inner", None)
        return state

    def set_state(self, state: dict) -> None:
        self.__dict__.update(state)

    def save(self, checkpoint_path: str) -> None:
        inner_blob = None
        if self._inner is not None:
            fd, tmp = tempfile.mkstemp(suffix=".pkl")
            os.close(fd)
            try:
                self._inner.save(tmp)
                with open(tmp, "rb") as f:
                    inner_blob = f.read()
            finally:
                os.unlink(tmp)
        with open(checkpoint_path, "wb") as f:
            pickle.dump({"state": self.get_state(), "inner": inner_blob}, f)

    def restore(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "rb") as f:
            saved = pickle.load(f)
        self.set_state(saved["state"])
        if saved["inner"] is not None and self._inner is not None:
            fd, tmp = tempfile.mkstemp(suffix=".pkl")
            os.close(fd)
            try:
                with open(tmp, "wb") as f:
                    f.write(saved["inner"])
                self._inner.restore(tmp)
            finally:
                os.unlink(tmp)


def make_searcher(planner: Planner) -> SweepSearcher:
    sweep = planner.sweep
    search = sweep.spec.search
    objectives = sweep.objectives
    inner = None
    if search.algorithm == "optuna":
        import optuna
        from ray.tune.search.optuna import OptunaSearch

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        metrics = [m for m, _ in objectives]
        modes = [d for _, d in objectives]
        multi = len(objectives) > 1 or search.objectives is not None
        inner = OptunaSearch(space=OptunaSearch.convert_search_space(planner.raw_space(expand_grid=False)),
                             metric=metrics if multi else metrics[0],
                             mode=modes if multi else modes[0], seed=search.seed)
    metric, mode = (objectives[0] if len(objectives) == 1 else (None, None))
    return SweepSearcher(planner, inner, metric=metric, mode=mode)
