"""Single-task runs and Delta_m%: `single_task: true` trains each task alone under each seed,
and every multitask row gets its average signed relative change against them (Maninis et al.
2019), in MLflow and in the leaderboard beside the frozen reference."""
from __future__ import annotations

import pytest
from mlflow.tracking import MlflowClient

from mtbert import figures
from mtbert.cli import main
from mtbert.train.metrics import delta_m
from orchestration.sweep.load import load_sweep
from orchestration.sweep.plan import Planner
from orchestration.track.tm import single_task_scores, trial_delta_m

from .conftest import run_cli, write_sweep


def test_delta_m_on_a_planted_case_equals_the_hand_computation():
    scores = {"sst_acc": 0.44, "para_acc": 0.70, "err": 0.30}
    single = {"sst_acc": 0.40, "para_acc": 0.80, "err": 0.25}
    lower = {"sst_acc": False, "para_acc": False, "err": True}
    # (+0.04/0.40 - 0.10/0.80 - 0.05/0.25) / 3 x 100 = (10 - 12.5 - 20) / 3
    assert delta_m(scores, single, lower) == pytest.approx(-7.5)
    assert delta_m(single, single, lower) == 0.0


def test_each_task_is_read_against_its_own_seed_and_the_mean_only_at_the_end():
    runs = [("sst", "0", {"sst_acc": 0.40}), ("sst", "1", {"sst_acc": 0.50}), ("sts", "0", {"sts_corr": 0.20}),
            ("sts", "1", {"sts_corr": float("nan")})]
    assert single_task_scores(runs, ["sst", "sts"], "0", closing=False) == (
        {"sst_acc": 0.40, "sts_corr": 0.20}, "same seed")
    # Seed 1's STS run diverged: no Delta_m while the sweep runs, its finished seeds' mean at the end.
    assert single_task_scores(runs, ["sst", "sts"], "1", closing=False) is None
    assert single_task_scores(runs, ["sst", "sts"], "1", closing=True) == (
        {"sst_acc": 0.50, "sts_corr": 0.20}, "mean of single-task seeds")
    out = trial_delta_m({"sst_acc": 0.45, "sts_corr": 0.30}, ({"sst_acc": 0.50, "sts_corr": 0.20}, "same seed"))
    assert out["delta_m"] == pytest.approx((-10 + 50) / 2) and out["tags"] == {"delta_m_single": "same seed"}
    assert figures.get("delta_m").better == "max"


def test_single_task_adds_one_trial_per_task_and_seed_beside_the_reference(sweep_file):
    path = sweep_file(space={"loss.weighting": ["famo", "dwa"]}, base={"sampling": {"strategy": "tuple"}},
                      seeds=[0, 1], reference=True, single_task=True)
    trials = Planner(load_sweep(path)).fixed_trials()
    single = [t for t in trials if t["role"] == "single_task"]
    assert [t["key"] for t in single] == [f"single-{task}-s{s}" for task in ("sst", "para", "sts") for s in (0, 1)]
    for t in single:
        assert t["config"]["tasks"] == [t["variant"].removeprefix("single-")]
        assert t["config"]["loss"]["weighting"] == {"name": "static"}  # one loss: nothing to weigh
        assert t["config"]["train"]["epochs"] == 2 and t["config"]["model"]["name_or_path"] == "tiny"
    assert sum(t["role"] == "reference" for t in trials) == 2
    assert not any(t["role"] == "single_task" for t in Planner(load_sweep(path, ["single_task=false"])).fixed_trials())


@pytest.mark.slow
def test_a_sweep_logs_delta_m_against_its_single_task_runs(tmp_path, monkeypatch, capsys):
    path = write_sweep(tmp_path / "single.yaml", space={"loss.weighting": ["famo"]},
                       base={"sampling": {"strategy": "tuple"}}, reference=True, single_task=True,
                       max_concurrent=2, tracking={"experiment": "single"})
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    proc = run_cli(["sweep", "run", str(path), "--num-cpus", "2", "--tracking-uri", uri,
                    "--storage", str(tmp_path / "runs")], cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "3 single-task" in proc.stdout, proc.stdout[-3000:]
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("single").experiment_id
    runs = {r.data.tags["variant"]: r for r in client.search_runs([experiment], "tags.role != 'sweep'")
            if "trial_key" in r.data.tags}
    assert set(runs) == {"baseline", "reference", "p000", "single-sst", "single-para", "single-sts"}
    single = {m: runs[f"single-{t}"].data.metrics[m] for t, m in (("sst", "sst_acc"), ("para", "para_acc"),
                                                                     ("sts", "sts_corr"))}
    for variant in ("baseline", "reference", "p000"):
        m = runs[variant].data.metrics
        hand = 100 / 3 * sum((m[k] - v) / v for k, v in single.items())
        assert m["delta_m"] == pytest.approx(hand, rel=1e-9), variant
        assert runs[variant].data.tags["delta_m_single"] == "same seed"
    assert not any("delta_m" in runs[f"single-{t}"].data.metrics for t in ("sst", "para", "sts"))

    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    assert main(["leaderboard", "--experiment", "single", "--tracking-uri", uri]) == 0
    text = capsys.readouterr().out
    assert "| Δm% |" in text and "| frozen reference |" in text and "| single-task sst |" in text, text
    # A single-task row's overall is one task's score: no Δ against the three-task baseline;
    # and a half-width has no sign.
    header = [c.strip() for c in next(line for line in text.splitlines() if "| Δm% |" in line).split("|")]
    row = next(line for line in text.splitlines() if line.startswith("| single-task sst |")).split("|")
    assert row[header.index("Δ overall vs *")].strip() == "–", row
    assert "± +" not in text and "± -" not in text, text
    assert main(["best", "--experiment", "single", "--tracking-uri", uri]) == 0
    best = [line for line in capsys.readouterr().out.splitlines() if "best configuration" in line]
    assert best and "single-" not in best[0], best
