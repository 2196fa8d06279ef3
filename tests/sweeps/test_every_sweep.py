"""Every sweep file under sweeps/ (sub-folders included): valid as written, documented, and
run end to end with --smoke, each trial ending FINISHED in a real MLflow store.

The smoke runs share what a user's back-to-back sweeps would share: one local Ray and one
sqlite store (its schema migrations run once) for the whole module, one tokenization cache.
Each sweep still goes through `run_sweep`, the function behind `mtbert sweep run --smoke`,
with its own Ray Tune experiment, searcher, scheduler, trial actor and MLflow parent run.
"""
from __future__ import annotations

import math
from pathlib import Path

import pytest

from orchestration.sweep.load import load_sweep
from orchestration.sweep.plan import Planner

ROOT = Path(__file__).resolve().parents[2]
SWEEPS = ROOT / "sweeps"
SHARED = ROOT / ".." / "shared"
FILES = sorted(SWEEPS.rglob("*.yaml"))
PAPERS = ("hybrid-bert-layer-sharing.txt", "mops-tm-relative-score.txt", "progressive-layer-sharing.txt",
          "pals-annealed-sampling.txt", "freeze-your-layers.txt")
# One trial at a time: a fresh trial actor spends ~5 CPU-seconds importing torch and
# transformers, far more than a smoke trial trains, and with one actor per sweep (reused by
# its trials) CI pays that once per file instead of twice. Concurrency has its own e2e tests.
# No model logged at the end (seconds per sweep): nothing here reads one; test_mlflow_ui does.
SMOKE_SET = ["max_concurrent=1", "tracking.log_models=none"]
STUDIES = ("head_sharing", "encoder_sharing", "cascade", "pals", "freezing", "combined")


def _id(path: Path) -> str:
    return str(path.relative_to(SWEEPS))


def _header(path: Path) -> list[str]:
    lines = path.read_text().splitlines()
    return lines[:next((i for i, line in enumerate(lines) if not line.startswith("#")), len(lines))]


def _needs_shared(path: Path) -> bool:
    return "../shared/" in path.read_text()


def test_every_study_has_its_sweeps():
    folders = {p.parent.name for p in FILES if p.parent != SWEEPS}
    assert set(STUDIES) <= folders, f"missing study folders: {set(STUDIES) - folders}"


def test_each_sweep_logs_to_its_own_experiment():
    # Two files in one MLflow experiment would interleave their leaderboards.
    seen: dict[str, str] = {}
    for path in FILES:
        sweep = load_sweep(path, smoke=True)
        experiment = sweep.spec.tracking.experiment or sweep.name
        assert experiment not in seen, f"{_id(path)} and {seen[experiment]} share experiment '{experiment}'"
        seen[experiment] = _id(path)


@pytest.mark.parametrize("path", FILES, ids=_id)
def test_header_says_how_to_run_it(path):
    header = _header(path)
    assert header, f"{_id(path)}: no header comment"
    text = "\n".join(header)
    assert f"mtbert sweep run sweeps/{_id(path)}" in text, "the header's command must name this file"
    if path.parent.name in STUDIES:  # the papers' experiments: each file says what it reproduces
        reproduces = [line for line in header if line.startswith("# Reproduces:")]
        assert reproduces, f"{_id(path)}: no '# Reproduces:' line"
        assert any(paper in text for paper in PAPERS), f"{_id(path)}: names none of {PAPERS}"


@pytest.mark.parametrize("path", FILES, ids=_id)
def test_validates_as_written(path, monkeypatch):
    if _needs_shared(path) and not SHARED.is_dir():
        pytest.skip("needs ../shared (real data and encoder)")
    monkeypatch.chdir(ROOT)  # the shipped files name ../shared relative to the project root
    sweep = load_sweep(path)
    planner = Planner(sweep)
    trials = planner.fixed_trials()  # every grid/random point built and validated
    assert [t["role"] for t in trials[:len(sweep.seeds)]] == ["baseline"] * len(sweep.seeds)
    assert planner.total_trials() > len(sweep.seeds), "a sweep needs more than its baseline"


# --------------------------------------------------------------------------- smoke runs

@pytest.fixture(scope="module")
def sweep_env(tmp_path_factory):
    """One local Ray (2 CPUs, like the CI runner) and one sqlite store for every smoke run."""
    import logging

    import ray

    if ray.is_initialized():
        pytest.skip("another Ray session is live in this process")
    work = tmp_path_factory.mktemp("every_sweep")
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             logging_level=logging.WARNING)
    try:
        yield {"work": work, "uri": f"sqlite:///{work / 'mlflow.db'}"}
    finally:
        ray.shutdown()


@pytest.mark.slow
@pytest.mark.parametrize("path", FILES, ids=_id)
def test_smoke_run_finishes_every_trial(path, sweep_env, monkeypatch):
    from mlflow.tracking import MlflowClient

    from orchestration.run.launch import run_sweep

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(sweep_env["work"])  # caches and defaults land in the test's folder
    planned = load_sweep(path, smoke=True)
    expected = Planner(planned).total_trials()
    run_name = "smoke-" + _id(path).removesuffix(".yaml").replace("/", "-")
    lines: list[str] = []
    outcome = run_sweep(path, overrides=SMOKE_SET, smoke=True, name=run_name, tracking_uri=sweep_env["uri"],
                        storage=sweep_env["work"] / "runs", log=lines.append, progress=False)
    log = "\n".join(lines)
    assert (outcome.status, outcome.failed) == ("FINISHED", 0), log

    client = MlflowClient(sweep_env["uri"])
    experiment = client.get_experiment_by_name(planned.experiment)  # --smoke: `<experiment>-smoke`
    assert planned.experiment == (planned.spec.tracking.experiment or planned.name) + "-smoke"
    parents = client.search_runs([experiment.experiment_id],
                                 f"tags.role = 'sweep' and attributes.run_name = '{run_name}'")
    assert len(parents) == 1 and parents[0].info.status == "FINISHED", log
    children = client.search_runs([experiment.experiment_id],
                                  f"tags.`mlflow.parentRunId` = '{parents[0].info.run_id}' and tags.role != 'configuration'", max_results=1000)
    if planned.adaptive is None:
        assert len(children) == expected, log
    else:  # `expected` is the most it may run; the first round always runs
        assert len(Planner(planned).fixed_trials()) <= len(children) <= expected, log
    assert [r.info.run_name for r in children if r.info.status != "FINISHED"] == [], log
    for run in children:
        m = run.data.metrics
        assert math.isfinite(m["overall"]) and math.isfinite(m["tm_relative_score"]), run.info.run_name
    baselines = [r for r in children if r.data.tags["role"] == "baseline"]
    if planned.adaptive is None:
        assert len(baselines) == len(planned.seeds)
    else:
        seeds = sorted(int(r.data.tags["seed"]) for r in baselines)
        assert seeds == list(range(len(seeds))) and planned.adaptive.start <= len(seeds) <= planned.adaptive.max
    assert all(r.data.metrics["tm_relative_score"] == 1.0 for r in baselines)
    # Each claim the smoke plan keeps is checked on the sweep's runs, never judged: a console line each.
    judged = [line for line in lines if line.startswith("claim ")]
    assert len(judged) == len(planned.claims), log
    assert all(line.startswith(f"claim {c.name}: smoke: not judged") for line, c in zip(judged, planned.claims)), log
    if planned.claims:
        stored = {a.path for a in client.list_artifacts(parents[0].info.run_id)}
        assert "claims.json" in stored and "findings.md" not in stored
        assert parents[0].data.tags["verdicts"] == "smoke: not judged"
