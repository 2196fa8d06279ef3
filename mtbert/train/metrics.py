"""Task scores and the TM-relative score. Plain numpy so they run anywhere (tests check them
against scipy and scikit-learn)."""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np


def _arr(x) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().float().cpu().numpy()
    return np.asarray(x, dtype=np.float64).reshape(-1)


def accuracy(preds, labels) -> float:
    p, y = _arr(preds), _arr(labels)
    return float((p == y).mean()) if len(y) else float("nan")


def pearson(preds, labels) -> float:
    """Pearson r; 0.0 when either side is constant (an untrained model predicts a constant)."""
    p, y = _arr(preds), _arr(labels)
    if len(y) < 2:
        return float("nan")
    p, y = p - p.mean(), y - y.mean()
    denom = math.sqrt(float((p * p).sum()) * float((y * y).sum()))
    return float((p * y).sum() / denom) if denom > 0 else 0.0


def overall(scores: Sequence[float]) -> float:
    """The overall score: the arithmetic mean of the task scores (mops paper, section 4.2)."""
    return float(np.mean(list(scores))) if len(scores) else float("nan")


def delta_m(scores: Mapping[str, float], single: Mapping[str, float], lower_is_better: Mapping[str, bool]) -> float:
    """Delta_m%, the multitask field's yardstick (Maninis et al. 2019; Vandenhende et al.):
    the mean over tasks of each task's relative change against the model trained on that task
    alone, signed so that better is positive,

        Delta_m = 100 / T * sum_t (-1)^{l_t} (M_t - M_single,t) / M_single,t

    with l_t = 1 where lower is better. `scores` and `single` map each task's metric name to
    its value; every metric of `single` must be in `scores` and nonzero in `single`.
    """
    terms = [(-1 if lower_is_better[m] else 1) * (scores[m] - ref) / ref for m, ref in single.items()]
    return 100 * sum(terms) / len(terms)


def tm_relative_score(run: Mapping[str, float], baseline: Mapping[str, float]) -> float:
    """Time- and memory-relative overall score (mops paper, section 4.2):

        (overall / overall_base) x (time_base / time) x (size_base / size)

    so the baseline scores exactly 1.0 and a run that is as good, twice as fast and the
    same size scores 2.0. (The paper's tables print this value times overall_base.)
    Each mapping needs `overall`, `train_time_s` and `model_size_mb`.
    """
    return (
        (run["overall"] / baseline["overall"])
        * (baseline["train_time_s"] / run["train_time_s"])
        * (baseline["model_size_mb"] / run["model_size_mb"])
    )
