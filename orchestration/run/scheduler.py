"""Trial schedulers. ASHA stops weak trials early, but never the baseline: every trial's
TM-relative score is measured against it, so it runs its full epoch budget."""
from __future__ import annotations

from ray.tune.schedulers import AsyncHyperBandScheduler, FIFOScheduler, TrialScheduler

from orchestration.sweep.spec import Sweep

TIME_ATTR = "epoch"  # train() reports once per epoch; epochs are the budget ASHA divides


class BaselineKeepingASHA(AsyncHyperBandScheduler):
    def on_trial_result(self, tune_controller, trial, result: dict) -> str:
        decision = super().on_trial_result(tune_controller, trial, result)
        # The baseline still feeds the rungs (super() recorded it); it is only never cut.
        if decision == TrialScheduler.STOP and trial.config.get("role") == "baseline":
            if result.get(TIME_ATTR, 0) < trial.config["config"]["train"]["epochs"]:
                return TrialScheduler.CONTINUE
        return decision


def make_scheduler(sweep: Sweep) -> TrialScheduler:
    spec = sweep.spec.scheduler
    if spec.type == "fifo":
        return FIFOScheduler()
    kwargs = {}
    objectives = sweep.objectives
    if len(objectives) > 1 or sweep.spec.search.objectives is not None:
        # Multi-objective: ASHA ranks by the first objective; Tune itself gets no metric.
        kwargs = {"metric": objectives[0][0], "mode": objectives[0][1]}
    return BaselineKeepingASHA(time_attr=TIME_ATTR, max_t=spec.max_t or sweep.epoch_budget(),
                               grace_period=spec.grace_period,
                               reduction_factor=spec.reduction_factor, **kwargs)


def tune_metric(sweep: Sweep) -> tuple[str | None, str | None]:
    """metric/mode for TuneConfig: set for one objective, unset for multi-objective."""
    objectives = sweep.objectives
    if len(objectives) > 1 or sweep.spec.search.objectives is not None:
        return None, None
    return objectives[0]
