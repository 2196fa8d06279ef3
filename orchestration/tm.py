"""TM-relative score of a trial against its sweep's baseline (mops-tm-relative-score.txt, 4.2):

    (overall / overall_base) x (time_base / time) x (size_base / size)

Time basis. A trial that ASHA stopped after e of its E budgeted epochs has spent less time
*because* it was stopped; dividing by that time would reward being cut. So every trial is
charged its time per epoch times the full budget:

    time = train_time_s / epochs_run x epoch_budget

which for a trial that ran its whole budget is exactly its measured train_time_s
("measured"); for a stopped one it is the projection ("projected_full_budget"). Its overall
is still its best over the epochs it ran. The basis used is logged on every child run (tag
tm_time_basis, metric tm_time_s). The baseline is never stopped by ASHA (scheduler.py).

Pairing. With several seeds a trial is compared with the baseline run under the same seed
(the noise of the seed cancels); if that baseline failed, with the mean of the baselines
that finished (tag tm_baseline says which).
"""
from __future__ import annotations

import math
from collections.abc import Mapping

from mtbert.train.metrics import tm_relative_score

MEASURED = "measured"
PROJECTED = "projected_full_budget"


def time_basis(train_time_s: float, epochs_run: int, epoch_budget: int) -> tuple[float, str]:
    if epochs_run >= epoch_budget or epochs_run <= 0:
        return train_time_s, MEASURED
    return train_time_s / epochs_run * epoch_budget, PROJECTED


def trial_tm(trial: Mapping[str, float], baseline: Mapping[str, float]) -> float | None:
    """Both mappings need overall, tm_time_s and model_size_mb; None when undefined (a
    baseline with overall <= 0 or a zero time/size makes the ratio meaningless)."""
    needed = ("overall", "tm_time_s", "model_size_mb")
    if any(not isinstance(m.get(k), (int, float)) or math.isnan(m[k]) for m in (trial, baseline) for k in needed):
        return None
    if baseline["overall"] <= 0 or trial["tm_time_s"] <= 0 or trial["model_size_mb"] <= 0:
        return None
    return tm_relative_score(
        {"overall": trial["overall"], "train_time_s": trial["tm_time_s"], "model_size_mb": trial["model_size_mb"]},
        {"overall": baseline["overall"], "train_time_s": baseline["tm_time_s"],
         "model_size_mb": baseline["model_size_mb"]},
    )


def mean_reference(baselines: list[Mapping[str, float]]) -> dict[str, float]:
    keys = ("overall", "tm_time_s", "model_size_mb")
    return {k: sum(b[k] for b in baselines) / len(baselines) for k in keys}
