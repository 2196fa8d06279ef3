"""A planted divergence on a real sweep: the tiny encoder at a learning rate of 1000 with no
gradient clipping blows up at every seed (its loss goes NaN in the first steps). The divergence
shows where a user looks: on each seed's MLflow run (tag `diverged` and its reason), on its
configuration's run (`seeds_diverged`), in every export of the leaderboard (`7 of 7`, `⊘`) and
in findings, where the verdict on a score leaves the diverged seeds out of the pairs and counts
them, and a claim on the divergence rate itself is decided from the same tags."""
from __future__ import annotations

import json

import pytest
from mlflow.tracking import MlflowClient

from orchestration.report.findings import findings
from orchestration.report.leaderboard import leaderboard
from orchestration.track.view import SEEDS_VIEW_KEY, VIEW_TAG_PREFIX

from .conftest import run_cli, write_sweep

pytestmark = pytest.mark.slow

BLOWUP = 1000.0  # on TINY_BASE with optim.grad_clip 0: every seed's loss goes NaN
SEEDS = 7  # the fewest at which a rate of 7 in 7 against 0 in 7 holds at 5% (docs/verdicts.md)
CLAIMS = [{"name": "the high rate scores higher", "metric": "overall", "a": {"optim.lr": BLOWUP},
           "b": {"role": "baseline"}, "relation": ">"},
          {"name": "the high rate diverges more often", "metric": "diverged", "a": {"optim.lr": BLOWUP},
           "b": {"role": "baseline"}, "relation": ">", "min_effect": 0.1}]


def test_a_diverging_configuration_is_a_finding_everywhere(tmp_path):
    path = write_sweep(tmp_path / "blowup.yaml", base={"optim": {"grad_clip": 0}},
                       space={"optim.lr": [BLOWUP]}, baseline={"optim.lr": 1e-3}, seeds=list(range(SEEDS)),
                       max_concurrent=2, tracking={"experiment": "blowup"}, claims=CLAIMS,
                       verdicts={"error_rate": "claim"})
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    proc = run_cli(["sweep", "run", str(path), "--num-cpus", "2", "--tracking-uri", uri,
                    "--storage", str(tmp_path / "runs")], cwd=tmp_path, timeout=500)
    out = proc.stdout
    # Diverged seeds are the sweep's finding, not its fault: it finished, and exits 0.
    assert proc.returncode == 0 and f"{SEEDS} diverged, 0 failed" in out, out[-3000:] + proc.stderr[-3000:]
    assert "claim the high rate diverges more often: holds" in out, out[-3000:] + proc.stderr[-3000:]
    assert f"claim the high rate scores higher: not run, A − B –, n=0; A {SEEDS} of {SEEDS} diverged" in out, out

    # MLflow: each seed's run says why; the configuration's run counts them.
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("blowup").experiment_id
    [parent] = client.search_runs([experiment], "tags.role = 'sweep'")
    assert parent.info.status == "FINISHED" and parent.data.metrics["trials_diverged"] == SEEDS
    assert parent.data.metrics["trials_failed"] == 0
    runs = client.search_runs([experiment], "tags.role != 'sweep'")
    seeds = [r for r in runs if "trial_key" in r.data.tags]
    gone = [r for r in seeds if r.data.tags["variant"] == "p000"]
    assert len(gone) == SEEDS and all(r.info.status == "FAILED" for r in gone)
    assert all(r.data.tags["diverged"].startswith("loss of task") for r in gone), gone[0].data.tags
    assert not [r for r in seeds if r.data.tags["variant"] == "baseline" and "diverged" in r.data.tags]
    [config] = [r for r in runs if r.data.tags.get("role") == "configuration" and r.data.tags["variant"] == "p000"]
    assert config.data.metrics["seeds"] == 0 and config.data.metrics["seeds_diverged"] == SEEDS
    assert set(config.data.tags["diverged_seeds"].split(",")) == {r.data.tags["trial_key"] for r in gone}
    seeds_view = client.get_experiment(experiment).tags[VIEW_TAG_PREFIX + SEEDS_VIEW_KEY]
    assert "tags.`diverged`" in json.loads(json.loads(seeds_view)["state"])["selectedColumns"]

    # The leaderboard: the configuration is one row, its count and its reason, in every export.
    text, table, _ = leaderboard(uri, "blowup")
    [row] = table[table["variant"] == "p000"].to_dict("records")
    assert row["status"] == "diverged" and row["seeds_diverged"] == SEEDS and row["n"] == 0
    assert f"| {SEEDS} of {SEEDS} |" in text and "⊘ (loss of task" in text
    for fmt in ("latex", "html"):
        assert f"{SEEDS} of {SEEDS}" in leaderboard(uri, "blowup", fmt=fmt)[0], fmt
    assert "seeds_diverged" in leaderboard(uri, "blowup", fmt="csv")[0].splitlines()[0]

    # Findings: no pair is left for the score; the rate claim reads the tags and holds.
    md, found = findings(uri, ["blowup"])
    found = found.set_index("claim")
    score = found.loc["the high rate scores higher"]
    assert (score["verdict"], score["n"], score["a_n"], score["a_diverged"], score["b_diverged"]) == (
        "not run", 0, SEEDS, SEEDS, 0)
    rate = found.loc["the high rate diverges more often"]
    assert (rate["verdict"], rate["method"], rate["delta"], rate["a_n"], rate["b_n"]) == ("holds", "rate", 1.0, SEEDS, SEEDS)
    assert f"A {SEEDS} of {SEEDS} seeds" in md and "rate 1.00 − 0.00 = +1.000 [" in md
