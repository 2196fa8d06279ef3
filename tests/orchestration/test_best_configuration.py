"""The sweep's best is a configuration judged by its mean over the seeds every configuration
ran, not one lucky seed: the summary line and the logged model follow it."""
from __future__ import annotations

from mlflow.tracking import MlflowClient

from orchestration.run.launch import SweepOutcome, _summary
from orchestration.track.models import best_configuration

from .conftest import new_experiment


def _runs(tmp_path, scores: dict[str, list[float]]):
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = new_experiment(client, "best")
    for variant, values in scores.items():
        for seed, value in enumerate(values):
            run = client.create_run(exp, tags={"variant": variant, "trial_key": f"{variant}-s{seed}"})
            client.log_metric(run.info.run_id, "overall", value)
            client.set_terminated(run.info.run_id)
    failed = client.create_run(exp, tags={"variant": "p009", "trial_key": "p009-s0"})
    client.log_metric(failed.info.run_id, "overall", 0.99)  # a crashed trial's last epoch counts for nothing
    client.set_terminated(failed.info.run_id, "FAILED")
    return client.search_runs([exp], max_results=100)


def test_the_best_mean_wins_over_the_luckiest_seed(tmp_path):
    runs = _runs(tmp_path, {"p000": [0.70, 0.50, 0.50], "p001": [0.60, 0.62, 0.61], "baseline": [0.58, 0.59, 0.60]})
    best = best_configuration(runs)
    assert {r.data.tags["variant"] for r in best} == {"p001"}
    assert best[0].data.tags["trial_key"] == "p001-s1"  # the model: the best seed of the best configuration


def test_one_seed_each_is_the_best_run_and_ties_go_to_more_seeds(tmp_path):
    assert best_configuration(_runs(tmp_path / "a", {"p000": [0.5], "p001": [0.7]}))[0].data.tags["trial_key"] == "p001-s0"
    tied = best_configuration(_runs(tmp_path / "b", {"p000": [0.6], "p001": [0.6, 0.6]}))
    assert len(tied) == 2
    assert best_configuration([]) == []


def test_summary_line_names_the_configuration_its_interval_and_its_model():
    lines: list[str] = []
    outcome = SweepOutcome("s", "runs/s", "sqlite:///m.db", "s", "0" * 32, "FINISHED", trials=9, finished=9,
                           best={"variant": "p001", "trial_key": "p001-s1", "overall": 0.61, "half": 0.0248,
                                 "n": 3, "seed_overall": 0.62, "tm": {}})
    _summary(outcome, lines.append)
    assert "best configuration p001: overall 0.6100 ± 0.0248 over 3 seeds (model: its best seed p001-s1, 0.6200)" in lines[0]


def test_printed_commands_run_as_printed(tmp_path, monkeypatch):
    """`make demo` leaves mtbert and mlflow in .venv/bin, not on PATH: the sweep's closing lines
    name them by a path that runs; with the environment on PATH, by their bare names."""
    import os
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    from orchestration.paths import tool

    bin_dir = Path(sys.executable).parent
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.chdir(tmp_path)
    for name in ("mtbert", "mlflow"):
        printed = tool(name)
        assert shutil.which(printed) is None or Path(printed).is_absolute()
        assert subprocess.run([printed, "--help"], capture_output=True, timeout=120).returncode == 0
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}/usr/bin:/bin")
    assert tool("mtbert") == "mtbert"


# Adaptive seeds: p000 was decided after 2 seeds, p001 and the baseline ran on to 5. Over all
# its seeds p000 leads (0.65 against 0.598); over the seeds both ran, p001 does (0.67 against 0.65).
ADAPTIVE = {"baseline": [0.50] * 5, "p000": [0.70, 0.60], "p001": [0.72, 0.62, 0.55, 0.55, 0.55]}


def _adaptive_store(tmp_path, scores: dict[str, dict[int, float]]):
    from .test_importance import _sweep

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    exp = client.create_experiment("adaptive-best", artifact_location=(tmp_path / "mlartifacts").as_uri())
    rows = [(v, "baseline" if v == "baseline" else "search", seed, {"sharing.head_regime": "I-I-I"},
             {"overall": value}) for v, by_seed in scores.items() for seed, value in by_seed.items()]
    _sweep(client, exp, rows)
    return uri, [r for r in client.search_runs([exp]) if "trial_key" in r.data.tags]


def test_configurations_are_ranked_on_the_seeds_they_share(tmp_path, capsys):
    import json

    from mtbert.cli import main
    from orchestration.report.best import best_summary
    from orchestration.run.launch import sweep_summary

    uri, runs = _adaptive_store(tmp_path, {v: dict(enumerate(values)) for v, values in ADAPTIVE.items()})
    assert {r.data.tags["variant"] for r in best_configuration(runs)} == {"p001"}
    best = best_summary(runs)
    assert (best["variant"], best["n"], best["ranked_on"]) == ("p001", 5, ["0", "1"])
    assert abs(best["ranked_overall"] - 0.67) < 1e-9 and abs(best["overall"] - 0.598) < 1e-9
    metrics, tags = sweep_summary(runs)
    assert tags["best_config"] == "p001"
    assert tags["best_config_ranked_by"] == "the mean over seeds 0, 1, those every configuration ran"
    lines: list[str] = []
    _summary(SweepOutcome("s", "runs/s", uri, "adaptive-best", "0" * 32, "FINISHED", trials=12, finished=12,
                          best=best), lines.append)
    assert "best configuration p001: overall 0.5980 ± " in lines[0]
    assert "ranked by the mean over seeds 0, 1, those every configuration ran: 0.6700" in lines[0]
    capsys.readouterr()
    assert main(["best", "--experiment", "adaptive-best", "--tracking-uri", uri]) == 0
    text = capsys.readouterr().out
    assert "# best configuration p001" in text
    assert "over 5 seed(s) (0, 1, 2, 3, 4); ranked by the mean over seeds 0, 1, those every configuration ran: " \
           "0.6700" in text, text
    assert main(["best", "--experiment", "adaptive-best", "--tracking-uri", uri, "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["ranked_on"] == ["0", "1"]


def test_with_no_seed_shared_each_is_ranked_on_all_its_seeds_and_says_so(tmp_path):
    from orchestration.report.best import best_summary

    # p000 ran seeds 5 and 6 only (0.65 on average), p001 0..4 (0.598): no seed is common to all.
    scores = {"p000": {5: 0.70, 6: 0.60}, "p001": dict(enumerate(ADAPTIVE["p001"]))}
    _, runs = _adaptive_store(tmp_path, scores)
    best = best_summary(runs)
    assert (best["variant"], best["ranked_on"]) == ("p000", [])
    assert best["ranked_by"] == "the mean over all its seeds (no seed is shared by every configuration)"
