"""Which swept dimensions matter (orchestration/report/importance.py), on sweeps written to a real
sqlite MLflow store: one key carries the whole effect, one none, one never varied; two
configurations get their paired difference. The error rates of "matters" are measured in
test_importance_simulation.py."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient

from mtbert.cli import main
from orchestration.paths import tool
from orchestration.report import importance as imp
from orchestration.report.leaderboard import leaderboard
from orchestration.report.reader import child_runs
from orchestration.report.table import build_table, sort_table, table_keys
from orchestration.sweep.load import load_sweep
from orchestration.sweep.plan import Planner
from orchestration.track.tracking import SweepTracking, check_tracking

from .conftest import write_sweep

REGIMES = {"S-I-I": 0.50, "I-S-S": 0.60, "S-S-S": 0.70}  # the effect: 0.1 a regime
LRS = [1.2e-4, 3.9e-4, 1.6e-3]  # no effect at all
SEEDS = [0, 1, 2]
FIGURES = ["sst_acc", "para_acc", "sts_corr", "overall", "tm_relative_score_compute"]
SPACE = {"sharing.head_regime": {"type": "choice", "values": list(REGIMES)},
         "optim.lr": {"type": "loguniform", "low": 1e-4, "high": 2e-3},
         "freeze.layers": {"type": "randint", "low": 0, "high": 0}}


def _sweep(client: MlflowClient, exp: str, rows: list[tuple[str, str, int, dict, dict]], tm_score: str = "compute",
           run_name: str = "sweep-1") -> str:
    """A parent run as launch.py writes it (tags, search_space.json) and a child run per
    (variant, role, seed, params, metrics), as the tracking layer tags them; returns the parent id."""
    parent = client.create_run(exp, run_name=run_name, tags={
        "role": "sweep", "tasks": "sst,para,sts", "task_metrics": "sst_acc,para_acc,sts_corr",
        "space_keys": ",".join(SPACE), "baseline_keys": "sharing.head_regime", "tm_score": tm_score})
    pid = parent.info.run_id
    client.log_text(pid, json.dumps({"dimensions": SPACE}), imp.SPACE_DOC)
    for variant, role, seed, params, metrics in rows:
        run = client.create_run(exp, run_name=f"{variant}-s{seed}", tags={
            "mlflow.parentRunId": pid, "trial_key": f"{variant}-s{seed}", "variant": variant, "role": role,
            "seed": str(seed), "stopped_early": "false", "interrupted": "false"})
        client.log_batch(run.info.run_id, params=[Param(k, str(v)) for k, v in params.items()],
                         metrics=[Metric(k, v, 0, 0) for k, v in metrics.items()])
        client.set_terminated(run.info.run_id, "FINISHED")
    client.set_terminated(pid, "FINISHED")
    return pid


def _figures(level: float, noise: float) -> dict[str, float]:
    scores = {"sst_acc": level + noise, "para_acc": level + 0.05 + noise, "sts_corr": level - 0.2 + noise}
    return {**scores, "overall": sum(scores.values()) / 3, "tm_relative_score_compute": 2 * level + noise,
            "tm_relative_score": 1.0 + noise, "train_time_s": 10.0, "tm_time_s": 10.0, "model_size_mb": 2.0}


def _rows(seeds: list[int]) -> list[tuple[str, str, int, dict, dict]]:
    rng = np.random.default_rng(7)
    rows = [("baseline", "baseline", s, {"sharing.head_regime": "I-I-I", "optim.lr": 1e-5, "freeze.layers": 0},
             _figures(0.2, 0.0)) for s in seeds]  # far off the space: it must not count
    for i, (regime, lr) in enumerate((r, lr) for r in REGIMES for lr in LRS):
        for s in seeds:
            params = {"sharing.head_regime": regime, "optim.lr": lr, "freeze.layers": 0}
            rows.append((f"p{i:03d}", "search", s, params, _figures(REGIMES[regime], rng.normal(0, 0.01))))
    return rows


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("importance")
    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    client = MlflowClient(uri)
    exp = client.create_experiment("imp", artifact_location=(tmp / "mlartifacts").as_uri())
    pid = _sweep(client, exp, _rows(SEEDS))
    return uri, tmp, client, exp, pid


@pytest.fixture(scope="module")
def computed(store, tmp_path_factory):
    """`mtbert importance` on the store, once for the module (the fitting is the slow part)."""
    uri, _, _, _, _ = store
    out = tmp_path_factory.mktemp("out") / "imp.md"
    assert main(["importance", "--experiment", "imp", "--tracking-uri", uri, "--output", str(out),
                 "--permutations", "199"]) == 0
    return out


def test_the_key_with_the_effect_matters_and_the_key_without_does_not(store, computed, tmp_path):
    uri, _, client, _, pid = store
    found = pd.read_csv(client.download_artifacts(pid, imp.CSV, str(tmp_path)))
    assert list(found.columns) == imp.COLUMNS
    assert set(found["figure"]) == set(FIGURES)  # compute is the sweep's headline TM score
    assert set(found["dimension"]) == {"sharing.head_regime", "optim.lr"}  # freeze.layers never varied
    # 9 searched configurations, 27 runs: the baseline differs from the space and is left out
    assert set(found["configurations"]) == {9} and set(found["runs"]) == {27} and set(found["permutations"]) == {199}
    assert set(found["null"]) == {"seed and other keys"}  # the regimes and rates were crossed
    for figure, part in found.groupby("figure"):
        rows = part.set_index("dimension")
        head, lr = rows.loc["sharing.head_regime"], rows.loc["optim.lr"]
        assert head["importance"] > 0.9 and head["matters"] and head["p"] <= 0.01, (figure, part)
        assert head["effect"] == pytest.approx(0.2 if figure != "tm_relative_score_compute" else 0.4, abs=0.02)
        assert not lr["matters"] and lr["p"] > 0.05, (figure, part)  # "no": the rate's noise is seed noise
        assert np.isnan(head["low"]) and np.isnan(head["ped_anova"])  # no interval of a share; 9 < 50 for PED-ANOVA
    text = computed.read_text()
    assert text.startswith("| Dimension | SC acc. | PD acc. | STS corr. | Overall | TM-rel. (compute) |")
    head = next(line for line in text.splitlines() if line.startswith("| sharing.head_regime |"))
    assert head.count("(p ") == len(FIGURES) and head.count("**") == 2 * len(FIGURES)  # bold: it matters
    lr = next(line for line in text.splitlines() if line.startswith("| optim.lr |"))
    assert "**" not in lr and "199 shuffles of the key's levels within each seed and each combination" in text
    png = computed.with_suffix(".importance.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert {imp.CSV, imp.PNG} <= {a.path for a in client.list_artifacts(pid)}


def test_two_configurations_get_their_paired_difference(tmp_path, capsys):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    exp = client.create_experiment("two", artifact_location=(tmp_path / "mlartifacts").as_uri())
    _sweep(client, exp, [r for r in _rows(SEEDS) if r[0] in ("p000", "p003")])  # S-I-I vs I-S-S, one rate
    out = tmp_path / "two.md"
    assert main(["importance", "--experiment", "two", "--tracking-uri", uri, "--output", str(out)]) == 0
    text = out.read_text()
    assert text.startswith("| Configurations | SC acc. | PD acc. | STS corr. | Overall | TM-rel. (compute) |")
    row = text.splitlines()[2]
    assert row.startswith("| sharing.head_regime: I-S-S - S-I-I | **+0.1") and row.count("[+0.") == len(FIGURES)
    assert "paired by seed, in brackets its 95% t-interval" in text


def test_leaderboard_shows_the_stored_importance_in_every_format(store, computed, tmp_path, capsys):
    uri, _, _, _, _ = store
    for fmt, marker in (("md", "| sharing.head_regime |"), ("latex", r"sharing.head\_regime &"),
                        ("html", '<table class="mtbert-importance">')):
        out = tmp_path / f"board.{fmt}"
        assert main(["leaderboard", "--experiment", "imp", "--tracking-uri", uri, "--format", fmt,
                     "--output", str(out)]) == 0
        assert marker in out.read_text(), out.read_text()
    assert (tmp_path / "board.importance.png").is_file()
    # csv: one table a file; the importance is a csv beside it, as importance.csv holds it
    assert main(["leaderboard", "--experiment", "imp", "--tracking-uri", uri, "--format", "csv",
                 "--output", str(tmp_path / "board.csv")]) == 0
    assert "head_regime" not in (tmp_path / "board.csv").read_text().splitlines()[0]
    beside = pd.read_csv(tmp_path / "board.importance.csv")
    assert list(beside.columns) == imp.COLUMNS and len(beside) == 2 * len(FIGURES)
    assert "not computed" not in capsys.readouterr().err


def test_a_new_run_makes_the_stored_importance_stale(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the leaderboard's Pareto plot goes to ./runs/
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    exp = client.create_experiment("stale", artifact_location=(tmp_path / "mlartifacts").as_uri())
    rows = [r for r in _rows([0]) if r[0] in ("baseline", "p000", "p003", "p006")]
    pid = _sweep(client, exp, rows)
    assert main(["importance", "--experiment", "stale", "--tracking-uri", uri, "--output",
                 str(tmp_path / "imp.md")]) == 0
    text, table, parent = leaderboard(uri, "stale")
    assert "Importance of the swept dimensions" in text
    assert "a permutation test" in text and "(p " in text
    run = client.create_run(exp, tags={"mlflow.parentRunId": pid, "variant": "p001", "role": "search", "seed": "0"})
    client.log_batch(run.info.run_id, metrics=[Metric("overall", 0.5, 0, 0)],
                     params=[Param("sharing.head_regime", "S-I-I"), Param("optim.lr", "0.0003")])
    client.set_terminated(run.info.run_id, "FINISHED")
    capsys.readouterr()
    assert main(["leaderboard", "--experiment", "stale", "--tracking-uri", uri]) == 0
    out, err = capsys.readouterr()
    assert "Importance" not in out
    assert (f"importance of the swept dimensions: not computed from these 4 finished runs yet; `{tool('mtbert')} importance "
            f"--experiment stale --tracking-uri {uri}` computes it") in err


def test_one_seed_per_configuration_is_still_tested_within_the_other_keys():
    rows = [r for r in _rows([0]) if r[1] == "search"]
    runs = pd.DataFrame([{"status": "FINISHED", "tags.variant": v, "tags.role": role, "tags.seed": str(s),
                          **{f"params.{k}": str(x) for k, x in p.items()}, **{f"metrics.{k}": x for k, x in m.items()}}
                         for v, role, s, p, m in rows])
    tags = {"task_metrics": "sst_acc,para_acc,sts_corr", "space_keys": ",".join(SPACE)}
    points = imp.points(runs, tags, "tm_relative_score_compute", SPACE)
    assert [(d.name, d.kind, d.log) for d in points.dims] == [("sharing.head_regime", "categorical", False),
                                                               ("optim.lr", "float", True)]
    found = imp.compute(points, permutations=199)
    assert found["low"].isna().all() and set(found["permutations"]) == {199}
    top = found[found["figure"] == "overall"].iloc[0]
    assert top["dimension"] == "sharing.head_regime" and top["importance"] > 0.9 and top["matters"]
    # The rate is a range: its 3 values cut into bins, shuffled within the seed (the grid's runs of
    # one regime differ in the rate only, so that is where its levels can move).
    assert set(found[found["dimension"] == "optim.lr"]["null"]) == {"seed and other keys"}
    table = imp.render(found, "md").split("\n\n")[0]
    head = next(line for line in table.splitlines() if line.startswith("| sharing.head_regime |"))
    assert head.count("**") == 2 * len(FIGURES) and head.count("(p 0.0") == len(FIGURES) and "[" not in table
    # Two configurations of one seed: their difference, no interval.
    few = imp.compute(imp.points(runs[runs["tags.variant"].isin(["p000", "p003"])], tags,
                                 "tm_relative_score_compute", SPACE))
    assert len(few) == len(FIGURES) and few["low"].isna().all() and not few["matters"].any()
    assert set(few["dimension"]) == {"sharing.head_regime: I-S-S - S-I-I"}
    assert few.set_index("figure").loc["overall", "effect"] == pytest.approx(0.1, abs=0.05)


def test_a_continuous_simplex_is_a_number_per_task():
    draws = [{"sst": 0.2, "para": 0.3, "sts": 0.5}, {"sst": 0.6, "para": 0.1, "sts": 0.3},
             {"sst": 0.1, "para": 0.8, "sts": 0.1}]
    dims = imp._encode("loss.weights", draws, {"type": "simplex", "distribution": "dirichlet(1)"})
    assert [d.name for d, _ in dims] == ["loss.weights[sst]", "loss.weights[para]", "loss.weights[sts]"]
    fixed = imp._encode("loss.weights", draws[:2] * 2, {"type": "simplex", "values": draws[:2]})
    assert [(d.name, d.kind, len(d.choices)) for d, _ in fixed] == [("loss.weights", "categorical", 2)]
    assert imp._encode("freeze.layers", [0, 0, 0], {"type": "randint"}) == []


def test_a_baseline_identical_to_a_searched_point_is_trained_once_and_shown_as_both(tmp_path):
    sweep = load_sweep(write_sweep(tmp_path / "dedup.yaml", space={"sharing.head_regime": ["I-I-I", "S-I-I", "I-S-S"]},
                                   seeds=[0, 1], baseline={"sharing.head_regime": "I-I-I"},
                                   base={"train": {"epochs": 1}}))
    trials = Planner(sweep).fixed_trials()
    assert [t["key"] for t in trials] == ["baseline-s0", "baseline-s1", "p001-s0", "p001-s1", "p002-s0", "p002-s1"]
    assert [t.get("stands_for") for t in trials[:2]] == [["p000"], ["p000"]]
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    check_tracking(uri)
    tracking = SweepTracking.start(uri, "dedup", "dedup-1", sweep.name,
                                   {"tasks": "sst,para,sts", "space_keys": "sharing.head_regime"}, None)
    for i, trial in enumerate(trials):
        tracking.start_trial(trial, f"id-{i}")
        tracking.log_epoch(trial["key"], {"epoch": 1, "overall": 0.5 + i / 100, "sst_acc": 0.5, "para_acc": 0.5,
                                          "sts_corr": 0.5, "train_time_s": 10.0, "model_size_mb": 2.0})
        tracking.finish(trial, "FINISHED")
    assert tracking.flush()
    runs = child_runs(uri, tracking.experiment_id, tracking.parent_run_id,
                      *table_keys({"space_keys": "sharing.head_regime"}))
    assert sorted(runs["tags.stands_for"].fillna("")) == ["", "", "", "", "p000", "p000"]
    table = sort_table(build_table(runs, tracking.client.get_run(tracking.parent_run_id).data.tags))
    text = leaderboard(uri, "dedup")[0]
    assert "| I-I-I k=all* (also searched) |" in text and "(also searched): a searched point identical" in text
    assert imp.eligible_runs(table) == (3, 6)  # the baseline is one of the space's configurations
    tracking.release()
