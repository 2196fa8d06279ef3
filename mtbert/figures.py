"""Every figure a run reports, declared once: its name, which way is better, how it prints,
whether a sweep may search on it, whether the MLflow view shows it, and how it summarises
over epochs. The training loop, the sweep spec, tracking, the leaderboard and the MLflow view
read these declarations; none keeps its own list of names.

    train()       reports the per-epoch figures (`epoch=True`) every epoch, and under
                  SUMMARY_KEY its best-epoch summary so far (`summary(history)`): a trial the
                  scheduler stops never returns, so its last report is its final word.
    sweep spec    search.metric and objectives may name `searchable(tasks)`.
    tracking      logs the epoch figures per step and the last report's summary as the run's
                  metrics (`run_figures(tasks)`: the summary's and the sweep's own).
    leaderboard   reads, prints and ranks `on_board(metrics)`.
    MLflow view   shows `in_view()` beside the task scores.

A per-task figure is one declaration whose name holds {task} (the config name: loss_{task})
or is TASK_SCORE (each task's metric_name: sst_acc, para_acc, and a plugin task's own), so a
task added by a plugin gets its figures with no list to extend. `get(name)` answers for any
concrete name; a figure nobody declared is an error there, not a silently dropped metric.

This module knows nothing of Ray or MLflow: the TM-relative scores are declared here
because they are figures of a run like any other, though the sweep computes them.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from mtbert.errors import did_you_mean

# The report key under which train() hands over its summary of the epochs so far.
SUMMARY_KEY = "summary"
# The report key of what the run computes on and in ({"device": ..., "precision": ...}): words,
# not figures; a sweep tags its trial's run with them.
WHERE_KEY = "where"
# The report key of an epoch's step-level training losses (train.log_every_steps), beside the
# figures: loss_<task> -> [[global step, mean loss over the steps since the last point], ...].
STEP_LOSSES = "step_losses"
# The name pattern of each task's score: its TaskSpec.metric_name.
TASK_SCORE = "{metric}"
# The figure whose maximum picks the best epoch.
BEST_BY = "overall"

Better = Literal["max", "min", ""]
# How a figure summarises over a run's epochs:
#   best        its value at the best epoch (the first with the highest BEST_BY)
#   last        its value at the last epoch (cumulative or fixed: time, FLOPs, size)
#   max         its largest value over the epochs (peak memory)
#   best_epoch  the best epoch's number
#   epochs      how many epochs were run
Summary = Literal["best", "last", "max", "best_epoch", "epochs"]
BOARD = ("", "shown", "on request")


@dataclass(frozen=True)
class Figure:
    name: str  # as logged; a per-task figure's holds {task}, or is TASK_SCORE
    doc: str
    better: Better = ""  # max | min: the leaderboard bolds and ranks by it; "": no direction
    fmt: str = ".3f"  # how a value prints (a format spec)
    epoch: bool = True  # in train()'s report every epoch
    summary: Summary | None = None  # in train()'s summary, and how; None: per epoch only
    search: bool = False  # a sweep's search.metric or objectives may name it (an epoch figure)
    view: bool = False  # a column of the sweep's saved MLflow view
    board: str = ""  # the leaderboard: "shown" (by default), "on request" (--columns, csv), "" not read
    header: str = ""  # the leaderboard's column header (default: the name)
    count: bool = False  # a whole number per run: the leaderboard gives its seeds' median and range
    sweep: bool = False  # computed by the sweep from its trials' summaries, not by train()

    def __post_init__(self) -> None:
        where = f"figure {self.name!r}"
        if self.search and not self.epoch:
            raise ValueError(f"{where}: searchable figures are the ones train() reports every epoch")
        if self.summary in ("best", "last", "max") and not self.epoch:
            raise ValueError(f"{where}: summary {self.summary} summarises what train() reports every epoch")
        if self.sweep and (self.epoch or self.summary):
            raise ValueError(f"{where}: a figure the sweep computes is neither reported nor summarised by train()")
        if self.board not in BOARD:
            raise ValueError(f"{where}: board must be one of {BOARD}, got {self.board!r}")
        if self.per_task and not (self.name == TASK_SCORE or "{task}" in self.name):
            raise ValueError(f"{where}: a per-task name holds {{task}} or is {TASK_SCORE}")

    @property
    def per_task(self) -> bool:
        return "{" in self.name

    @property
    def run(self) -> bool:
        """A metric of a finished trial's run (the summary's, or the sweep's own)."""
        return self.summary is not None or self.sweep

    @property
    def label(self) -> str:
        return self.header or self.name

    def named(self, tasks: Iterable[str] = (), metrics: Iterable[str] | None = None) -> list[str]:
        """The concrete names: this name, or a per-task one for each task (a TASK_SCORE for
        each of `metrics` when given: the names a sweep recorded, whose plugin tasks this
        process may not have registered)."""
        if not self.per_task:
            return [self.name]
        if self.name == TASK_SCORE:
            return list(metrics) if metrics is not None else [_task(t).metric_name for t in tasks]
        return [self.name.format(task=t) for t in tasks]


FIGURES: list[Figure] = []


def declare(figure: Figure) -> Figure:
    """Add a figure (a plugin's, or a test's); a name declared twice is refused."""
    if any(f.name == figure.name for f in FIGURES):
        raise ValueError(f"figure {figure.name!r} is declared already")
    FIGURES.append(figure)
    return figure


def undeclare(name: str) -> None:
    """Remove a declared figure (a test's, when it is done)."""
    FIGURES[:] = [f for f in FIGURES if f.name != name]


def _task(name: str):
    from mtbert.tasks import get_task

    return get_task(name)


def get(name: str) -> Figure:
    """The declaration of a concrete figure name (a per-task one resolved against the
    registered tasks), with that name. KeyError, naming the closest, when none declares it."""
    for f in FIGURES:
        if f.name == name:
            return f
    from mtbert.tasks import TASKS

    for f in FIGURES:
        if f.per_task:
            for task in TASKS:
                if name in f.named([task]):
                    return replace(f, name=name)
    known = names(lambda f: True, list(TASKS))
    raise KeyError(f"figure '{name}' is not declared{did_you_mean(name, known)}: declare it in mtbert/figures.py")


def names(where: Callable[[Figure], bool], tasks: Iterable[str] = (), metrics: Iterable[str] | None = None
          ) -> list[str]:
    """The concrete names of the figures `where` picks, in declaration order."""
    tasks = list(tasks)
    metrics = None if metrics is None else list(metrics)
    return list(dict.fromkeys(n for f in FIGURES if where(f) for n in f.named(tasks, metrics)))


def searchable(tasks: Iterable[str]) -> list[str]:
    """What a sweep of these tasks may name as search.metric or an objective."""
    return names(lambda f: f.search, tasks)


def run_figures(tasks: Iterable[str]) -> list[str]:
    """A finished trial's run metrics: train()'s summary and the sweep's own (what a claim
    may compare)."""
    return names(lambda f: f.run, tasks)


def in_view() -> list[str]:
    """The MLflow view's figures besides the task scores (which the view adds per sweep):
    scores first, then costs, each as declared."""
    shown = [f for f in FIGURES if f.view and not f.per_task]
    return [f.name for f in sorted(shown, key=lambda f: f.better != "max")]


def on_board(metrics: Sequence[str]) -> list[Figure]:
    """The leaderboard's figures, concrete, in column order, for a sweep whose task scores
    are `metrics`."""
    return [replace(f, name=n) if f.per_task else f
            for f in FIGURES if f.board for n in f.named(metrics=metrics)]


def better(name: str) -> Better:
    """Which way is better for a concrete figure name ("" for one nobody declared)."""
    try:
        return get(name).better
    except KeyError:
        return ""


# --------------------------------------------------------------------------- the summary

def best_epoch_index(history: Sequence[dict[str, float]]) -> int:
    """The index of the best epoch: the first with the highest BEST_BY (NaN counts lowest)."""
    def score(i: int) -> float:
        value = history[i].get(BEST_BY, math.nan)
        return -math.inf if value is None or math.isnan(value) else value

    return max(range(len(history)), key=lambda i: (score(i), -i))


def summary(history: Sequence[dict[str, float]]) -> dict[str, float]:
    """train()'s summary of its epochs (each a dict of epoch figures, with "epoch"): every
    figure that declares one, by its rule. A key no figure declares is an error."""
    if not history:
        return {}
    best = best_epoch_index(history)
    out: dict[str, float] = {}
    rules: dict[str, Summary | None] = {}
    for row in history:
        for key in row:
            if key not in rules:
                rules[key] = get(key).summary
    for key, rule in rules.items():
        if rule == "best" and key in history[best]:
            out[key] = history[best][key]
        elif rule == "last" and key in history[-1]:
            out[key] = history[-1][key]
        elif rule == "max":
            out[key] = max(row[key] for row in history if key in row)
    for f in FIGURES:
        if f.summary == "best_epoch":
            out[f.name] = history[best]["epoch"]
        elif f.summary == "epochs":
            out[f.name] = len(history)
    return out


# --------------------------------------------------------------------------- the declarations
# Order matters where a list of names is read in order: the leaderboard's columns, the view's.

for _figure in (
    Figure("epoch", "the epoch this report is of (1-based)", fmt=".0f"),
    Figure(BEST_BY, "mean of the task scores (mops paper, section 4.2)", "max", summary="best",
           search=True, view=True, board="shown", header="Overall"),
    Figure("best_epoch", "the best epoch so far (by overall)", "min", ".0f", summary="best_epoch", board="shown",
           header="Epoch", count=True),
    Figure(TASK_SCORE, "a task's dev score (its TaskSpec.metric_name: accuracy, Pearson r)", "max",
           summary="best", search=True, view=True, board="shown"),
    Figure("train_time_s", "training wall time so far (probe included), seconds", "min", ".1f", summary="last",
           search=True, view=True, board="shown", header="Train time (s)"),
    Figure("model_size_mb", "the model's size, MB", "min", ".2f", summary="last", search=True, view=True,
           board="shown", header="Size (MB)"),
    Figure("peak_memory_mb", "CUDA peak allocated, or peak RSS on CPU, MB", "min", ".0f", summary="max",
           search=True, view=True, board="shown", header="Peak mem. (MB)"),
    Figure("tm_relative_score", "TM-relative score on wall time vs the baseline (mops 4.2)", "max", epoch=False,
           sweep=True, view=True, board="shown", header="TM-rel. (wall)"),
    Figure("tm_relative_score_compute", "TM-relative score on counted training FLOPs vs the baseline", "max",
           epoch=False, sweep=True, board="shown", header="TM-rel. (compute)"),
    Figure("tm_time_s", "train time on the full-epoch-budget basis (orchestration/track/tm.py), seconds", "min",
           ".1f", epoch=False, sweep=True, board="on request", header="TM time (s)"),
    Figure("tm_flops", "training FLOPs on the full-epoch-budget basis", "min", ".2e", epoch=False, sweep=True,
           board="on request", header="TM FLOPs"),
    Figure("delta_m", "Delta_m%: the mean over tasks of the signed relative change of each task's score "
           "against the same task trained alone (a sweep's single_task runs; mtbert.train.metrics.delta_m)",
           "max", "+.2f", epoch=False, sweep=True, view=True, board="on request", header="Δm%"),
    Figure("overall_cs224n", "overall with STS mapped to (r+1)/2 (the CS224N leaderboard's)", "max",
           summary="best", search=True),
    Figure("best_overall", "the best overall so far (a sweep's default search metric)", "max", search=True),
    Figure("epochs_run", "epochs trained (fewer than train.epochs when stopped early)", fmt=".0f", epoch=False,
           summary="epochs"),
    Figure("train_flops", "training FLOPs counted so far (probe and frozen-layer cache included)", "min", ".2e",
           summary="last", search=True),
    Figure("setup_flops", "the part of train_flops spent once, not per epoch: the cached frozen layers' "
           "forward over the training data and a probe's whole count", "min", ".2e", summary="last"),
    Figure("params_total", "parameters of the model", "min", ".0f", summary="last", search=True),
    Figure("params_trainable", "parameters that train", "min", ".0f", summary="last", search=True),
    Figure("epoch_time_s", "this epoch's training time, seconds", "min", ".1f", search=True),
    Figure("seq_per_s", "training sequences per second this epoch", "max", ".0f", search=True),
    Figure("tokens_per_s", "real (not padding) tokens trained per second, at the last epoch", "max", ".0f",
           summary="last", search=True, board="on request", header="Tokens/s"),
    Figure("mfu", "model FLOPs utilisation at the last epoch: counted training FLOPs less padding, per second, "
           "over this device's matmul peak in the run's precision (measured once per process)", "max", ".2%",
           summary="last", search=True, board="on request", header="MFU"),
    Figure("pad_fraction", "share of this epoch's token positions that were padding", "min", search=True),
    Figure("frozen_cache_s", "seconds spent computing the frozen-layer cache", "min", ".1f", search=True),
    Figure("lr", "the encoder's learning rate after this epoch", fmt=".2e"),
    Figure("loss_{task}", "a task's mean training loss this epoch", "min", search=True),
    Figure("weight_{task}", "the weighting method's mean effective weight of a task this epoch"),
    Figure("trunc_rows_{task}", "share of a task's training rows that max_length cut", "min", summary="last"),
    Figure("trunc_tokens_{task}", "share of a task's training tokens that max_length cut", "min", summary="last"),
    Figure("probe_overall", "overall of the linear probe a train.probe run fine-tunes from", "max",
           summary="last"),
):
    declare(_figure)
del _figure
