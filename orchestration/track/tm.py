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

Compute basis. Wall-clock time on a shared machine measures the neighbours as much as the
configuration, so a second score, tm_relative_score_compute, puts counted work in the time
factor: the trial's cumulative estimated training FLOPs (train()'s per-epoch train_flops),
projected to the full budget the same way (metric tm_flops), except the part spent once
before the first epoch (setup_flops: the cached frozen layers' forward, a probe), charged as
it is. Every trial does some counted work (its heads at least, and the frozen encoder's
forward), so the score is defined for a head-only configuration too; what is counted is in
docs/guide.md ("What a trial's compute counts"). It is the same on any machine, loaded or not. A sweep's `tracking.tm_score` picks the leaderboard's headline (compute by
default: a rerun reproduces it; wall beside it), the one `--sort tm` sorts by and the Pareto
plot's cost axis.

Pairing. With several seeds a trial is compared with the baseline run under the same seed
(the noise of the seed cancels); if that baseline failed, with the mean of the baselines
that finished (tag tm_baseline says which).
"""
from __future__ import annotations

import math
from collections.abc import Mapping

from mtbert import figures
from mtbert.train.metrics import delta_m, tm_relative_score

MEASURED = "measured"
PROJECTED = "projected_full_budget"


def time_basis(train_time_s: float, epochs_run: int, epoch_budget: int, once: float = 0.0) -> tuple[float, str]:
    """The cost charged on the full-budget basis; `once` of it was spent before the first epoch
    (setup_flops) and is charged as it is, not projected."""
    if epochs_run >= epoch_budget or epochs_run <= 0:
        return train_time_s, MEASURED
    return (train_time_s - once) / epochs_run * epoch_budget + once, PROJECTED


def trial_tm(trial: Mapping[str, float], baseline: Mapping[str, float], time_key: str = "tm_time_s") -> float | None:
    """Both mappings need overall, the time figure and model_size_mb; None when undefined (a
    baseline with overall <= 0 or a zero time/size makes the ratio meaningless).
    time_key tm_time_s: wall clock (tm_relative_score); tm_flops: counted training FLOPs on
    the same full-budget basis (tm_relative_score_compute), the same on a loaded machine."""
    needed = ("overall", time_key, "model_size_mb")
    if any(not isinstance(m.get(k), (int, float)) or math.isnan(m[k]) for m in (trial, baseline) for k in needed):
        return None
    if baseline["overall"] <= 0 or trial[time_key] <= 0 or trial["model_size_mb"] <= 0:
        return None
    return tm_relative_score(
        {"overall": trial["overall"], "train_time_s": trial[time_key], "model_size_mb": trial["model_size_mb"]},
        {"overall": baseline["overall"], "train_time_s": baseline[time_key],
         "model_size_mb": baseline["model_size_mb"]},
    )


def mean_reference(baselines: list[Mapping[str, float]]) -> dict[str, float]:
    keys = ("overall", "tm_time_s", "model_size_mb", "tm_flops")
    return {k: sum(b[k] for b in baselines) / len(baselines) for k in keys if all(k in b for b in baselines)}


# Delta_m% (mtbert.train.metrics.delta_m) against a sweep's single-task runs (`single_task: true`).
# Pairing as for the TM scores: each task's single-task run under the trial's seed; at the
# sweep's end, where that run failed, the mean of the task's finished single-task seeds (tag
# delta_m_single says which). A task with neither leaves the trial without Delta_m.
SAME_SEED = "same seed"


def single_task_scores(runs: list[tuple[str, str, Mapping[str, float]]], tasks: list[str], seed: str,
                       closing: bool) -> tuple[dict[str, float], str] | None:
    """(each of `tasks`' metric -> its single-task score, against what) for a trial of `seed`,
    from the finished single-task runs (task, seed, run figures); None while one is missing."""
    from mtbert.tasks import get_task

    scores, fallback = {}, False
    for task in tasks:
        metric = get_task(task).metric_name
        seeds = {s: f[metric] for t, s, f in runs if t == task and isinstance(f.get(metric), (int, float))
                 and math.isfinite(f[metric])}
        if seed in seeds:
            scores[metric] = seeds[seed]
        elif closing and seeds:
            scores[metric], fallback = sum(seeds.values()) / len(seeds), True
        else:
            return None
    return (scores, "mean of single-task seeds" if fallback else SAME_SEED) if scores else None


def trial_delta_m(trial: Mapping[str, float], single: tuple[dict[str, float], str] | None) -> dict:
    """{"delta_m": ..., "tags": {...}} for a trial's final figures, or {} when undefined."""
    if single is None:
        return {}
    scores, against = single
    if any(not isinstance(trial.get(m), (int, float)) for m in scores):
        return {}
    if any(v == 0 for v in scores.values()):
        return {"tags": {"delta_m_single": against, "delta_m_note": "undefined: a single-task score is 0"}}
    lower = {m: figures.better(m) == "min" for m in scores}
    return {"delta_m": delta_m(trial, scores, lower), "tags": {"delta_m_single": against}}
