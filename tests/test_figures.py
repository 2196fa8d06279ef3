"""Every figure is declared once (mtbert/figures.py): train() reports it and its summary, the
sweep spec searches on it, tracking logs it, the leaderboard prints and ranks it."""
from __future__ import annotations

import math
import subprocess
import sys

import pandas as pd
import pytest
import torch

from mtbert import figures
from mtbert.config import build_config, merge
from mtbert.tasks import TASKS, TaskSpec, register_task
from mtbert.train import loop
from mtbert.train.precision import label
from orchestration.report import leaderboard, table as board
from orchestration.sweep.load import load_sweep
from orchestration.track import tracking

from .orchestration.conftest import TINY_BASE, write_sweep

TINY = merge(TINY_BASE, {"train": {"epochs": 3}, "sampling": {"steps_per_epoch": 2},
                         "data": {"synthetic": {"train_size": 32, "dev_size": 16}}})


def _train(tmp_path, **reports):
    cfg = build_config(merge(TINY, {"data": {"cache_dir": str(tmp_path / "cache")}}))
    sent: list[dict] = []
    result = loop.train(cfg, reporter=lambda m, _ckpt: sent.append(m), log=None, **reports)
    return result, sent


def test_the_summary_follows_each_figures_rule():
    history = [
        {"epoch": 1, "overall": 0.5, "sst_acc": 0.4, "train_time_s": 1.0, "peak_memory_mb": 90.0, "seq_per_s": 9.0},
        {"epoch": 2, "overall": 0.7, "sst_acc": 0.6, "train_time_s": 2.0, "peak_memory_mb": 80.0, "seq_per_s": 8.0},
        {"epoch": 3, "overall": 0.7, "sst_acc": 0.1, "train_time_s": 3.0, "peak_memory_mb": 70.0, "seq_per_s": 7.0},
        {"epoch": 4, "overall": math.nan, "sst_acc": 0.9, "train_time_s": 4.0, "peak_memory_mb": 60.0},
    ]
    # best: the first epoch reaching the highest overall (NaN counts lowest); last; max; per epoch only.
    assert figures.summary(history) == {"overall": 0.7, "sst_acc": 0.6, "train_time_s": 4.0, "peak_memory_mb": 90.0,
                                        "best_epoch": 2, "epochs_run": 4}
    assert figures.summary([]) == {}
    with pytest.raises(KeyError, match="'trian_time_s' is not declared .*'train_time_s'.*mtbert/figures.py"):
        figures.summary([{"epoch": 1, "overall": 0.1, "trian_time_s": 1.0}])


def test_a_declaration_that_could_not_work_is_refused():
    with pytest.raises(ValueError, match="searchable figures are the ones train\\(\\) reports every epoch"):
        figures.Figure("x", "", search=True, epoch=False)
    with pytest.raises(ValueError, match="neither reported nor summarised"):
        figures.Figure("x", "", sweep=True)
    with pytest.raises(ValueError, match="declared already"):
        figures.declare(figures.Figure("overall", ""))


def test_train_reports_every_figure_it_declares_and_its_own_summary(tmp_path):
    result, sent = _train(tmp_path)
    tasks = list(result.config["tasks"])
    assert [m["epoch"] for m in sent] == [1, 2, 3]
    for i, report in enumerate(sent):
        epoch = {k: v for k, v in report.items()
                 if k not in (figures.SUMMARY_KEY, figures.WHERE_KEY, figures.STEP_LOSSES, "timings")}
        # Words, not figures: what the run computed on and in (bf16 or fp32 by this CPU).
        assert report[figures.WHERE_KEY] == {"device": "cpu", "precision": label("auto", torch.device("cpu"))}
        assert all(figures.get(k).epoch for k in epoch), epoch
        assert epoch == result.epochs[i]
        # What the run's metrics would be, had it stopped here (a scheduler's stop never returns).
        assert report[figures.SUMMARY_KEY] == figures.summary(result.epochs[:i + 1])
    # The final figures are the last report's summary, not a second computation of it.
    assert sent[-1][figures.SUMMARY_KEY] == result.metrics
    assert set(result.metrics) <= set(figures.run_figures(tasks))
    # Figures that used to stop at train(): the truncation shares reach the run's metrics.
    assert {f"trunc_rows_{t}" for t in tasks} | {f"trunc_tokens_{t}" for t in tasks} <= set(result.metrics)
    assert result.metrics["best_epoch"] == result.epochs[-1]["best_epoch"]
    assert result.metrics["overall"] == result.epochs[-1]["best_overall"]


@pytest.fixture
def toy_figure():
    """A figure added in one place: its declaration."""
    figure = figures.declare(figures.Figure("toy_margin", "a test's figure", "min", ".4f", summary="best",
                                            search=True, board="shown", header="Toy margin"))
    yield figure
    figures.undeclare(figure.name)


def test_a_figure_declared_once_is_searchable_logged_and_on_the_leaderboard(toy_figure, tmp_path, monkeypatch):
    # The loop computes its value (here a stand-in beside the task scores); nothing else names it.
    scores = loop.epoch_metrics
    monkeypatch.setattr(loop, "epoch_metrics", lambda s: {**scores(s), "toy_margin": 1 - scores(s)["overall"]})
    result, sent = _train(tmp_path)

    # Searchable: a sweep may search on it, and the spec knows it.
    sweep = load_sweep(write_sweep(tmp_path / "toy.yaml", search={"metric": "toy_margin", "mode": "min"},
                                   space={"optim.lr": [1e-3, 2e-3]}))
    assert sweep.spec.search.metric == "toy_margin"
    # Logged: every epoch (tracking's per-epoch figures of a report), and in the summary the
    # run's metrics are made of; summarised by its rule (its value at the best epoch).
    assert all("toy_margin" in tracking.report_figures(m) for m in sent)
    best = result.epochs[result.metrics["best_epoch"] - 1]
    assert sent[-1][figures.SUMMARY_KEY]["toy_margin"] == result.metrics["toy_margin"] == best["toy_margin"]
    assert "toy_margin" in figures.run_figures(result.config["tasks"])
    # On the leaderboard: read from the runs, printed under its header and format, ranked its way.
    runs = pd.DataFrame({
        "run_id": ["a", "b", "c"], "status": ["FINISHED"] * 3, "tags.variant": ["baseline", "p000", "p001"],
        "tags.role": ["baseline", "search", "search"], "tags.seed": ["0"] * 3,
        "params.optim.lr": ["0.001", "0.002", "0.003"],
        **{f"metrics.{k}": [0.5, 0.6, 0.7] for k in ("overall", "sst_acc", "train_time_s")},
        "metrics.toy_margin": [0.25, 0.5, 0.125]})
    tags = {"tasks": "sst", "task_metrics": "sst_acc", "space_keys": "optim.lr"}
    assert "toy_margin" in board.table_keys(tags)[1]
    table = board.sort_table(board.build_table(runs, tags), "toy_margin")
    assert list(table["toy_margin"]) == [0.25, 0.125, 0.5]  # the baseline first, then by it, lowest first
    text = leaderboard.render(table, "md")
    assert "Toy margin" in text and "0.1250" in text


@pytest.fixture
def plugin_task():
    spec = register_task(TaskSpec(name="polarity", kind="binary", metric_name="polarity_acc", pair=False))
    yield spec
    TASKS.pop(spec.name)


def test_the_per_task_figures_cover_a_plugin_task(plugin_task):
    assert figures.get("polarity_acc").summary == "best" and figures.get("polarity_acc").better == "max"
    assert {"polarity_acc", "loss_polarity"} <= set(figures.searchable(["sst", "polarity"]))
    assert {"polarity_acc", "trunc_rows_polarity", "trunc_tokens_polarity"} <= set(figures.run_figures(["polarity"]))
    assert "polarity_acc" in board.figure_columns(["sst_acc", "polarity_acc"])
    # A sweep names its task scores; the leaderboard reads them without the plugin registered.
    assert [f.name for f in figures.on_board(["nli_acc"])][:3] == ["overall", "best_epoch", "nli_acc"]


def test_the_bundle_and_the_loop_do_not_import_each_other():
    from mtbert import bundle

    assert "mtbert.train.loop" not in open(bundle.__file__).read()
    code = ("import sys, mtbert.bundle; assert 'mtbert.train.loop' not in sys.modules, 'bundle imports the loop'; "
            "import mtbert.train.loop")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
