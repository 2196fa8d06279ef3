"""The frozen reference is a yardstick, not a contender: in a sweep where it scores above every
trained configuration, `mtbert best`, the sweep's summary line, the parent run's best_config
tag and the model the sweep logs and registers all name the best trained configuration; the
leaderboard keeps the reference's row and says that it beats them; `mtbert best
--include-reference` lets it compete."""
from __future__ import annotations

import json

from mlflow.tracking import MlflowClient

from mtbert.cli import main
from orchestration.run.launch import SweepOutcome, _summary, sweep_summary
from orchestration.report.best import best_summary
from orchestration.report.leaderboard import leaderboard
from orchestration.track.models import best_configuration

from .test_importance import _figures, _sweep

SEEDS = [0, 1, 2]
PARAMS = {"sharing.head_regime": "I-I-I", "optim.lr": 1e-3, "freeze.layers": 0}
# (variant, role, its level): the reference above every trained configuration
LEVELS = [("baseline", "baseline", 0.60), ("p000", "search", 0.62), ("p001", "search", 0.58),
          ("reference", "reference", 0.70)]


def _store(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    exp = client.create_experiment("yard", artifact_location=(tmp_path / "mlartifacts").as_uri())
    regimes = {"baseline": "I-I-I", "p000": "S-I-I", "p001": "I-S-S", "reference": "none"}
    rows = [(v, role, s, {**PARAMS, "sharing.head_regime": regimes[v]}, _figures(level, 0.001 * s))
            for v, role, level in LEVELS for s in SEEDS]
    _sweep(client, exp, rows)
    return uri, client, exp


def test_best_the_summary_and_the_model_skip_the_reference_and_the_leaderboard_says_it_won(tmp_path, capsys,
                                                                                            monkeypatch):
    monkeypatch.chdir(tmp_path)  # the leaderboard's plots go to ./runs/
    uri, client, exp = _store(tmp_path)
    runs = [r for r in client.search_runs([exp]) if "trial_key" in r.data.tags]
    # What the sweep's end writes: the parent's tags and metrics, the summary line, the model it logs.
    metrics, tags = sweep_summary(runs)
    assert tags["best_config"] == "p000" and abs(metrics["best_config_overall"] - 0.571) < 1e-9
    lines: list[str] = []
    _summary(SweepOutcome("yard-1", "runs/yard", uri, "yard", "0" * 32, "FINISHED", trials=12, finished=12,
                          best=best_summary(runs)), lines.append)
    assert "best configuration p000: overall 0.5710" in lines[0] and "reference" not in lines[0]
    assert {r.data.tags["variant"] for r in best_configuration(runs)} == {"p000"}  # log_models' pick, registered
    # `mtbert best`, as a user reads it.
    capsys.readouterr()
    assert main(["best", "--experiment", "yard", "--tracking-uri", uri]) == 0
    text = capsys.readouterr().out
    assert "# best configuration p000: " in text and "reference" in text.splitlines()[2]
    assert "# the frozen reference (a yardstick, not a contender) beats every trained configuration: overall 0.6510" \
        in text
    assert main(["best", "--experiment", "yard", "--tracking-uri", uri, "--format", "json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert found["configuration"] == "p000" and found["reference_beats_all"]
    assert found["best_seed"]["trial_key"] == "p000-s2"
    assert main(["best", "--experiment", "yard", "--tracking-uri", uri, "--include-reference", "--format",
                 "json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert found["configuration"] == "reference" and not found["reference_beats_all"]
    # The leaderboard keeps the reference's row, and says it beats every trained configuration.
    text = leaderboard(uri, "yard")[0]
    assert "| frozen reference |" in text
    assert ("The frozen reference beats every trained configuration on Overall, SC acc., PD acc., STS corr.: "
            "fine-tuning lost what the encoder knew") in text
