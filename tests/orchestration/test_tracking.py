"""MLflow parent/child runs, the TM-relative score and the leaderboard, on a real sqlite store.

The per-epoch reports are written out by hand here (their shape is train()'s), so every
expected figure is known; test_e2e.py runs the same path with real training."""
from __future__ import annotations

import math
import pickle
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from mtbert.config import build_config
from mtbert.train.metrics import tm_relative_score
from orchestration.errors import TrackingUnavailable
from orchestration.run.launch import _runs_view
from orchestration.track.view import save_runs_view
from orchestration.report.leaderboard import leaderboard, render
from orchestration.report.plots import pareto_front
from orchestration.report.reader import child_runs
from orchestration.report.table import build_table, sort_table
from orchestration.sweep.load import load_sweep
from orchestration.sweep.plan import Planner
from orchestration.track.tm import time_basis
from orchestration.track.tracking import SweepTracking, check_tracking, final_figures

from .conftest import write_sweep

TUNE_BOOKKEEPING = {"training_iteration": 1, "time_this_iter_s": 0.1, "hostname": "node-a",
                    "node_ip": "10.0.0.7", "trial_id": "abc", "done": False, "pid": 1, "date": "today"}


def report(epoch: int, overall: float, time_per_epoch: float, size: float, best: tuple[float, int]) -> dict:
    return {"epoch": epoch, "sst_acc": overall + 0.1, "para_acc": overall, "sts_corr": overall - 0.1,
            "overall": overall, "overall_cs224n": overall + 0.05, "loss_sst": 1.0 / epoch,
            "train_time_s": time_per_epoch * epoch, "epoch_time_s": time_per_epoch, "seq_per_s": 100.0,
            "peak_memory_mb": 50.0 + epoch, "model_size_mb": size, "params_total": 1000,
            "params_trainable": 900, "best_overall": best[0], "best_epoch": best[1], **TUNE_BOOKKEEPING}


def run_trial(tracking: SweepTracking, trial: dict, overalls: list[float], time_per_epoch: float,
              size: float, status: str = "FINISHED", error: str | None = None) -> str:
    tracking.start_trial(trial, f"id-{trial['key']}")
    best = (-1.0, 0)
    for epoch, overall in enumerate(overalls, 1):
        if overall > best[0]:
            best = (overall, epoch)
        tracking.log_epoch(trial["key"], report(epoch, overall, time_per_epoch, size, best))
    tracking.finish(trial, status, error=error)
    assert tracking.flush()
    return tracking.run_id(trial["key"])


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    # One store for the module: creating an MLflow sqlite schema costs seconds.
    tmp_path = tmp_path_factory.mktemp("tracking")
    sweep = load_sweep(write_sweep(tmp_path / "tiny.yaml", space={"sharing.head_regime": ["S-I-I", "I-S-S"]},
                                   seeds=[0, 1], baseline={"sharing.head_regime": "I-I-I"},
                                   base={"train": {"epochs": 3}}))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    check_tracking(uri)
    tracking = SweepTracking.start(uri, "exp", "tiny-run", sweep.name,
                                   {"tasks": "sst,para,sts", "space_keys": "sharing.head_regime"}, "deadbeef",
                                   view=_runs_view(sweep))
    trials = {t["key"]: t for t in Planner(sweep).fixed_trials()}
    ids = {
        "baseline-s0": run_trial(tracking, trials["baseline-s0"], [0.30, 0.40, 0.35], 10.0, 2.0),
        "baseline-s1": run_trial(tracking, trials["baseline-s1"], [0.32, 0.42, 0.41], 12.0, 2.0),
        "p000-s0": run_trial(tracking, trials["p000-s0"], [0.30, 0.50, 0.50], 5.0, 1.0),
        "p000-s1": run_trial(tracking, trials["p000-s1"], [0.30, 0.44, 0.60], 6.0, 1.0),
        # stopped by ASHA after 2 of 3 epochs: charged 3 epochs of time
        "p001-s0": run_trial(tracking, trials["p001-s0"], [0.20, 0.30], 4.0, 1.5),
        "p001-s1": run_trial(tracking, trials["p001-s1"], [0.10], 4.0, 1.5, status="FAILED",
                             error="ValueError: boom"),
    }
    return tracking, trials, ids


def configuration_runs(tracking) -> dict:
    """variant -> its configuration's run, read through MLflow's own search."""
    runs = tracking.client.search_runs([tracking.experiment_id], f"tags.`mlflow.parentRunId` = "
                                       f"'{tracking.parent_run_id}' and tags.role = 'configuration'")
    return {r.data.tags["variant"]: r for r in runs}


def test_each_configuration_has_a_run_with_its_mean_interval_and_seeds(swept):
    from orchestration.stats import mean_ci

    tracking, _, ids = swept
    assert tracking.flush()
    configs = configuration_runs(tracking)
    assert {"baseline", "p000", "p001"} <= set(configs)
    p000 = configs["p000"]
    assert p000.info.run_name == "p000" and p000.info.status == "FINISHED"
    assert p000.data.tags["mlflow.parentRunId"] == tracking.parent_run_id  # beside its seeds, under the sweep
    assert p000.data.tags["configuration_role"] == "search" and p000.data.tags["seed_runs"] == "p000-s0,p000-s1"
    assert "trial_key" not in p000.data.tags and "diverged_seeds" not in p000.data.tags
    # The swept value and the rest of the config as params; the seed is what its runs differ in.
    assert p000.data.params["sharing.head_regime"] == "S-I-I" and "train.seed" not in p000.data.params
    # The mean over its seeds under the figure's name, the 95% t-interval's ends, the seed count.
    m = p000.data.metrics
    mean, half, n = mean_ci([0.50, 0.60])
    # (to four significant digits: what the UI's table then shows in full)
    assert m["overall"] == pytest.approx(mean) and m["seeds"] == 2 and m["seeds_diverged"] == 0
    assert (m["overall_ci_low"], m["overall_ci_high"]) == (pytest.approx(mean - half, rel=1e-3),
                                                           pytest.approx(mean + half, rel=1e-3))
    assert m["overall_ci_low"] == float(f"{mean - half:.4g}")
    assert m["train_time_s"] == pytest.approx((15.0 + 18.0) / 2) and "sst_acc_ci_low" in m
    # A failed seed is not averaged in: one seed, no interval.
    p001 = configs["p001"].data
    assert p001.metrics["seeds"] == 1 and p001.metrics["overall"] == pytest.approx(0.30)
    assert "overall_ci_low" not in p001.metrics
    # Whatever reads the sweep's trials reads its seeds only.
    assert {r.data.tags["trial_key"] for r in tracking.children()} >= set(ids)
    assert all(r.data.tags.get("role") != "configuration" for r in tracking.children())


def test_configuration_runs_are_synced_once_per_seed_end_not_per_epoch(tmp_path):
    """A configuration's run changes when one of its seeds ends: its calls do not grow with the
    epochs, and a resume that replays the record sends it nothing again."""
    sweep = load_sweep(write_sweep(tmp_path / "tiny.yaml", space={"sharing.head_regime": ["S-I-I"]},
                                   seeds=[0, 1], base={"train": {"epochs": 6}}))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    (tmp_path / "sweep").mkdir()
    tracking = SweepTracking.start(uri, "exp", "calls-run", sweep.name, {}, None, state_dir=tmp_path / "sweep")
    trials = {t["key"]: t for t in Planner(sweep).fixed_trials()}
    calls = tracking.record.calls_by_ref
    run_trial(tracking, trials["p000-s0"], [0.3, 0.4], 1.0, 1.0)
    first = calls["configuration/p000"]
    run_trial(tracking, trials["p000-s1"], [0.3, 0.4, 0.5, 0.4, 0.5, 0.6], 1.0, 1.0)
    second = calls["configuration/p000"] - first
    assert 0 < second < first  # made once; then one batch of what changed
    parent_id = tracking.parent_run_id
    tracking.release()
    resumed = SweepTracking(uri, tracking.experiment_id, parent_id, sweep.name, state_dir=tmp_path / "sweep")
    assert resumed.resync() == 0  # nothing lags: nothing is sent twice
    [run] = configuration_runs(resumed).values()
    assert run.data.metrics["seeds"] == 2 and run.data.metrics["overall"] == pytest.approx(0.5)
    resumed.release()


def metrics_of(tracking, run_id):
    run = tracking.client.get_run(run_id)
    return run.data.metrics, run.data.tags, run.info.status


def test_final_figures_and_tags(swept, tmp_path):
    tmp = tmp_path
    tracking, _, ids = swept
    m, tags, status = metrics_of(tracking, ids["p000-s1"])
    assert status == "FINISHED"
    assert m["overall"] == 0.60 and m["best_epoch"] == 3 and m["sst_acc"] == pytest.approx(0.70)
    assert m["train_time_s"] == 18.0 and m["peak_memory_mb"] == 53.0 and m["epochs_run"] == 3
    assert tags["mlflow.parentRunId"] == tracking.parent_run_id and tags["trial_key"] == "p000-s1"
    assert tags["node"] == "node-a" and tags["node_ip"] == "10.0.0.7" and tags["git_commit"] == "deadbeef"
    assert tags["stopped_early"] == "false" and tags["tm_time_basis"] == "measured"
    history = tracking.client.get_metric_history(ids["p000-s1"], "epoch/overall")
    assert sorted((h.step, h.value) for h in history) == [(1, 0.30), (2, 0.44), (3, 0.60)]
    assert "epoch/training_iteration" not in m and "epoch/pid" not in m  # Tune bookkeeping dropped
    params = tracking.client.get_run(ids["p000-s1"]).data.params
    assert params["sharing.head_regime"] == "S-I-I" and params["train.seed"] == "1"
    artifacts = [a.path for a in tracking.client.list_artifacts(ids["p000-s1"])]
    assert {"result.json", "config.yaml"} <= set(artifacts)
    saved = yaml.safe_load(Path(tracking.client.download_artifacts(ids["p000-s1"], "config.yaml", str(tmp))).read_text())
    assert build_config(saved).sharing.head_regime == "S-I-I"  # a trial's exact config, loadable


def test_tm_relative_score_against_same_seed_baseline(swept):
    tracking, _, ids = swept
    base0, _, _ = metrics_of(tracking, ids["baseline-s0"])
    assert base0["tm_relative_score"] == 1.0
    m, tags, _ = metrics_of(tracking, ids["p000-s0"])
    expected = tm_relative_score({"overall": 0.50, "train_time_s": 15.0, "model_size_mb": 1.0},
                                 {"overall": 0.40, "train_time_s": 30.0, "model_size_mb": 2.0})
    assert m["tm_relative_score"] == pytest.approx(expected) == pytest.approx(5.0)
    assert tags["tm_baseline"] == ids["baseline-s0"]
    m1, tags1, _ = metrics_of(tracking, ids["p000-s1"])
    assert tags1["tm_baseline"] == ids["baseline-s1"]
    assert m1["tm_relative_score"] == pytest.approx((0.60 / 0.42) * (36.0 / 18.0) * (2.0 / 1.0))


def test_stopped_early_trial_is_charged_the_full_budget(swept):
    tracking, _, ids = swept
    m, tags, status = metrics_of(tracking, ids["p001-s0"])
    assert status == "FINISHED" and tags["stopped_early"] == "true"
    assert tags["tm_time_basis"] == "projected_full_budget"
    assert m["train_time_s"] == 8.0 and m["tm_time_s"] == 12.0 == time_basis(8.0, 2, 3)[0]
    assert m["tm_relative_score"] == pytest.approx((0.30 / 0.40) * (30.0 / 12.0) * (2.0 / 1.5))


def test_failed_trial_keeps_its_error(swept):
    tracking, _, ids = swept
    m, tags, status = metrics_of(tracking, ids["p001-s1"])
    assert status == "FAILED" and tags["error"] == "ValueError: boom"
    assert "tm_relative_score" not in m


def test_resumed_trial_continues_its_own_run(swept):
    tracking, trials, ids = swept
    revived = pickle.loads(pickle.dumps(tracking))  # what a restored sweep driver holds
    revived.start_trial(trials["p000-s0"], "new-trial-id")
    assert revived.flush()
    run_id = revived.run_id("p000-s0")
    assert run_id == ids["p000-s0"]  # found again, not created twice
    assert revived.client.get_run(run_id).data.tags["trial_id"] == "new-trial-id"
    assert revived.client.get_run(run_id).info.status == "RUNNING"
    assert revived.history("p000-s0")[3]["overall"] == 0.50  # the driver's record, not re-read
    revived.log_epoch("p000-s0", report(2, 0.55, 5.0, 1.0, (0.55, 2)))  # the epoch ran again
    assert revived.history("p000-s0")[2]["overall"] == 0.55  # the latest value per step wins
    keys = [r.data.tags["trial_key"] for r in revived.children()]
    assert len(keys) == len(set(keys)) and "p000-s0" in keys
    # Put the run back as it was (the module's other tests read it), closing it as a resumed
    # trial's end would.
    revived.log_epoch("p000-s0", report(2, 0.50, 5.0, 1.0, (0.50, 2)))
    final = revived.finish(trials["p000-s0"], "FINISHED")
    assert revived.flush()
    assert final["overall"] == 0.50 and final["best_epoch"] == 2
    points = revived.client.get_metric_history(run_id, "epoch/overall")
    # A replay of an epoch (the same scores, other timings: a resume with the RNG restored)
    # adds no point; each re-run that trained differently added one.
    replayed = len(points)
    revived.log_epoch("p000-s0", report(2, 0.50, 6.5, 1.0, (0.50, 2)))
    assert revived.flush()
    assert len(revived.client.get_metric_history(run_id, "epoch/overall")) == replayed
    assert revived.history("p000-s0")[2]["epoch_time_s"] == 6.5  # the record has the latest


def test_no_run_left_running(swept):
    tracking, trials, _ = swept
    extra = dict(trials["p000-s0"], key="p009-s0", variant="p009")
    tracking.start_trial(extra, "x")
    assert tracking.flush()
    assert tracking.close_open("sweep ended") == 1
    assert tracking.flush()
    assert all(r.info.status != "RUNNING" for r in tracking.children())


def test_leaderboard_groups_seeds_and_renders(swept, tmp_path):
    tracking, _, _ = swept
    tracking.end_parent("FINISHED")
    text, table, parent = leaderboard(tracking.uri, "exp", fmt="md", plot=tmp_path / "p.png")
    assert parent.info.run_id == tracking.parent_run_id
    # baseline pinned, then by overall; the failed and the interrupted trial last, a row each
    assert list(table["variant"])[:3] == ["baseline", "p000", "p001"]
    assert sorted(zip(table["variant"][3:], table["status"][3:])) == [("p001", "failed"), ("p009", "interrupted")]
    row = table.set_index("variant").loc["p000"]
    assert row["n"] == 2 and row["overall"] == pytest.approx(0.55)
    assert row["overall_std"] == pytest.approx(math.sqrt(2 * 0.05 ** 2))
    # 95% t-interval of two seeds: t(0.975, 1) = 12.706 x std / sqrt(2)
    assert row["overall_ci95"] == pytest.approx(12.7062 * math.sqrt(2 * 0.05 ** 2) / math.sqrt(2), rel=1e-4)
    # paired by seed against the baseline's best overall: 0.50 - 0.40, 0.60 - 0.42
    assert row["overall_delta"] == pytest.approx(0.14) and row["overall_delta_n"] == 2
    assert math.isnan(row["overall_delta_low"])  # the median of two differences has no 95% interval
    assert table[table["status"] == "finished"].set_index("variant").loc["p001"]["n"] == 1  # failed seed not averaged in
    lines = text.splitlines()
    assert lines[0].startswith("| Regime | LR (enc. / heads) | w [sst para sts] | Overall | Δ overall vs * | Epoch |")
    assert "I-I-I k=all*" in lines[2] and "1.000 ± 0.000" in lines[2]
    # The best of each column bold; the epoch (2 and 3) a lower median and range, never a mean ± interval.
    assert "S-I-I k=all" in lines[3] and "**0.550** ± 0.635 | **+0.140** (n=2) | 2 (2–3) |" in lines[3]
    assert "I-S-S k=all †" in lines[4]
    assert "| I-S-S k=all ✗ (ValueError: boom) |" in text  # a failed trial shows, with its reason
    assert "| S-I-I k=all ‡ |" in text  # the run test_no_run_left_running closed: interrupted
    csv = render(table, "csv")
    assert csv.splitlines()[0].startswith("variant,role,regime,lr,weights,n")
    latex = render(table, "latex")
    assert r"\begin{tabular}" in latex and r"$\pm$" in latex and "I-I-I k=all*" in latex
    html = render(table, "html")
    assert html.count("<tr>") == 6 and "±" in html
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "pareto.png" in [a.path for a in MlflowClient(tracking.uri).list_artifacts(tracking.parent_run_id)]
    by_tm = sort_table(build_table(child_runs(tracking.uri, tracking.experiment_id, tracking.parent_run_id),
                                   parent.data.tags), "tm_relative_score")
    assert list(by_tm["variant"])[:3] == ["baseline", "p000", "p001"]
    assert list(by_tm["tm_relative_score"])[1:3] == sorted(by_tm["tm_relative_score"][1:3], reverse=True)


def test_leaderboard_errors_are_one_line(swept):
    from orchestration.errors import SweepError

    tracking, _, _ = swept
    with pytest.raises(SweepError, match="--experiment nope: no such experiment"):
        leaderboard(tracking.uri, "nope")
    with pytest.raises(SweepError, match="--sort speed: not a column"):
        leaderboard(tracking.uri, "exp", sort="speed")
    with pytest.raises(SweepError, match="--sweep 123: no sweep run"):
        leaderboard(tracking.uri, "exp", sweep="123")


def test_log_leaderboard_puts_the_table_and_plot_on_the_parent(swept, tmp_path):
    from orchestration.report.leaderboard import log_leaderboard

    tracking, _, _ = swept
    assert log_leaderboard(tracking)
    client = MlflowClient(tracking.uri)
    listed = {a.path for a in client.list_artifacts(tracking.parent_run_id)}
    assert {"pareto.png", "leaderboard.md", "leaderboard.csv"} <= listed
    board = Path(client.download_artifacts(tracking.parent_run_id, "leaderboard.md", str(tmp_path))).read_text()
    assert board == leaderboard(tracking.uri, "exp")[0]


def test_pareto_front():
    points = [(10, 0.5), (5, 0.4), (20, 0.6), (8, 0.3), (30, 0.55), (5, 0.45)]
    assert sorted(pareto_front(points)) == [0, 2, 5]


def test_final_figures_take_the_first_best_epoch():
    history = {1: {"overall": 0.4, "sst_acc": 0.1, "train_time_s": 1.0, "peak_memory_mb": 3.0},
               2: {"overall": 0.4, "sst_acc": 0.2, "train_time_s": 2.0, "peak_memory_mb": 2.0},
               3: {"overall": float("nan"), "sst_acc": 0.3, "train_time_s": 3.0, "peak_memory_mb": 1.0}}
    final = final_figures(history, ["sst_acc"])
    assert final["best_epoch"] == 1 and final["sst_acc"] == 0.1
    assert final["train_time_s"] == 3.0 and final["peak_memory_mb"] == 3.0 and final["epochs_run"] == 3


def test_unusable_sqlite_folder_fails_in_one_line(tmp_path):
    with pytest.raises(TrackingUnavailable, match="folder .* does not exist"):
        check_tracking(f"sqlite:///{tmp_path / 'no' / 'such' / 'mlflow.db'}")


# What MLflow 3.17's runs page reads from a saved view (its JS, spelled out: the contract):
# the experiment tag mlflow.sharedViewState.<key>, an envelope whose `state` is the JSON of
# these search-facet and UI-state keys.
VIEW_STATE_KEYS = {"searchFilter", "orderByKey", "orderByAsc", "startTime", "lifecycleFilter",
                   "modelVersionFilter", "datasetsFilter", "selectedColumns", "columnOrder", "columnWidths",
                   "runsHiddenMode", "compareRunCharts", "compareRunSections", "viewMaximized",
                   "runListHidden", "isAccordionReordered", "groupBy", "groupsExpanded",
                   "useGroupedValuesInCharts", "hideEmptyCharts", "globalLineChartConfig", "chartsSearchFilter"}


def test_the_experiment_holds_the_saved_views_the_link_opens(swept):
    import json

    tracking, _, _ = swept
    tags = tracking.client.get_experiment(tracking.experiment_id).tags
    envelope = json.loads(tags["mlflow.sharedViewState.mtbert"])
    assert isinstance(envelope["name"], str) and isinstance(envelope["createdAt"], int)
    state = json.loads(envelope["state"])
    assert set(state) <= VIEW_STATE_KEYS
    assert envelope["name"] == "mtbert: configurations"
    assert state["orderByKey"] == "metrics.`overall`" and state["orderByAsc"] is False
    # One row per configuration: what was swept, then overall with its interval and what it stands on.
    assert state["searchFilter"] == "tags.role = 'configuration'"
    assert state["selectedColumns"][:6] == ["params.`sharing.head_regime`", "metrics.`overall`",
                                            "metrics.`overall_ci_low`", "metrics.`overall_ci_high`",
                                            "metrics.`seeds`", "metrics.`seeds_diverged`"]
    assert {"metrics.`sst_acc`", "metrics.`para_acc`", "metrics.`sts_corr`", "metrics.`train_time_s`",
            "metrics.`peak_memory_mb`", "tags.`diverged_seeds`"} <= set(state["selectedColumns"])
    # The seeds' view: which sweep and seed a row is, then its scores.
    seeds = json.loads(tags["mlflow.sharedViewState.mtbert-seeds"])
    assert seeds["name"] == "mtbert: seeds"
    state = json.loads(seeds["state"])
    assert set(state) <= VIEW_STATE_KEYS and state["searchFilter"] == "tags.role != 'configuration'"
    assert state["selectedColumns"][:8] == ["tags.`sweep_run`", "tags.`seed`", "tags.`diverged`", "metrics.`overall`",
                                            "metrics.`sst_acc`", "metrics.`para_acc`", "metrics.`sts_corr`",
                                            "metrics.`tm_relative_score`"]
    assert "params.`sharing.head_regime`" in state["selectedColumns"]
    # A later sweep into the same experiment refreshes the view and keeps its creation time.
    save_runs_view(tracking.client, tracking.experiment_id, "tm_relative_score", ["sst_acc"], [])
    again = json.loads(tracking.client.get_experiment(tracking.experiment_id).tags["mlflow.sharedViewState.mtbert"])
    assert again["createdAt"] == envelope["createdAt"]
    assert json.loads(again["state"])["orderByKey"] == "metrics.`tm_relative_score`"


def test_a_trial_tune_ended_unrecorded_is_ended_from_tunes_own_record(tmp_path):
    """A driver killed between Tune ending a trial and recording it: the resumed driver's
    record has the trial RUNNING, Tune has it ended. Tune hands its trials to every
    callback's on_experiment_end; the record takes Tune's end and last report from there."""
    from types import SimpleNamespace

    from ray.tune.experiment import Trial

    from orchestration.run.callbacks import TrackingCallback

    sweep = load_sweep(write_sweep(tmp_path / "tiny.yaml", space={"sharing.head_regime": ["S-I-I"]},
                                   seeds=[0, 1], baseline={"sharing.head_regime": "I-I-I"}))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracking = SweepTracking.start(uri, "exp", "killed-run", sweep.name, {}, None)
    plan = {t["key"]: t for t in Planner(sweep).fixed_trials()}
    done, failed, live = plan["p000-s0"], plan["p000-s1"], plan["baseline-s0"]
    for trial in (done, failed, live):
        tracking.start_trial(trial, f"id-{trial['key']}")
    assert tracking.flush()
    for key in (done["key"], failed["key"]):
        tracking.record.started.pop(key)  # the driver that saw these start is gone
    error = tmp_path / "error.txt"
    error.write_text("Traceback ...\nRuntimeError: worker died\n")
    tune_trials = [
        SimpleNamespace(config=done, status=Trial.TERMINATED, last_result=report(1, 0.45, 5.0, 1.0, (0.45, 1))),
        SimpleNamespace(config=failed, status=Trial.ERROR, last_result={}, error_file=str(error)),
        # Recorded by this driver: Tune's view does not override the record's own.
        SimpleNamespace(config=live, status=Trial.TERMINATED, last_result={}),
    ]
    TrackingCallback(tracking).on_experiment_end(trials=tune_trials)
    assert tracking.flush()
    m, _, status = metrics_of(tracking, tracking.run_id(done["key"]))
    assert status == "FINISHED" and m["overall"] == 0.45
    _, tags, status = metrics_of(tracking, tracking.run_id(failed["key"]))
    assert status == "FAILED" and tags["error"] == "RuntimeError: worker died"
    assert metrics_of(tracking, tracking.run_id(live["key"]))[2] == "RUNNING"
    tracking.release()


def test_a_runs_dataset_digest_names_the_tokenized_data_it_read(tmp_path):
    """The digest a run's dataset inputs carry is the key of the tokenized data the trial read,
    per-task max_length included (it was read at model.max_length)."""
    from mtbert.config import to_dict
    from mtbert.data.tokenize import prepare
    from orchestration.track.describe import data_summary

    cfg = build_config({"data": {"cache_dir": str(tmp_path / "cache")},
                        "task_options": {"sts": {"max_length": 16}}})
    prepare(cfg, log=None)
    files = {p.name for p in (tmp_path / "cache").iterdir()}
    for d in data_summary(to_dict(cfg))["datasets"]:
        assert f"{d['task']}-{d['split']}-{d['digest']}.pt" in files, (d, files)


def test_a_trial_whose_score_or_loss_is_not_a_number_is_tagged_diverged():
    from orchestration.track.tracking import diverged_reason

    history = {1: {"loss_sst": 1.2, "loss_sts": 0.8}, 2: {"loss_sst": float("nan"), "loss_sts": 0.7}}
    assert diverged_reason({"overall": 0.61}, history) == "loss_sst is nan"
    assert diverged_reason({"overall": float("inf")}, {1: {"loss_sst": 1.0}}) == "overall is inf"
    assert diverged_reason({"overall": 0.61}, {1: {"loss_sst": 1.0}}) is None
