"""What a person finds in MLflow after a sweep, against a real `mlflow server`: the model
view, dataset inputs keyed by the tokenization cache, the sweep file as source, data reports,
system metrics, the best trial's model (loadable, predicting, registered), and the UI itself
rendered in headless Chromium when it is installed."""
from __future__ import annotations

import re
import shutil
import subprocess

import pytest
from mlflow.tracking import MlflowClient


# The names orchestration/track/view.py writes (spelled out: what the UI reads is the contract).
EXPERIMENT_KIND_TAG, EXPERIMENT_KIND = "mlflow.experimentKind", "custom_model_development"


def ui_link(base: str, experiment_id: str) -> str:
    return (f"{base.rstrip('/')}/#/experiments/{experiment_id}/runs"
            "?workflowType=machine_learning&viewStateShareKey=mtbert")

from .conftest import run_cli, write_sweep

pytestmark = pytest.mark.slow

TASKS = ("sst", "para", "sts")


@pytest.fixture(scope="module")
def server(tmp_path_factory, mlflow_server):
    """The session's shared `mlflow server`; the sweep runs in a folder of its own."""
    return tmp_path_factory.mktemp("mlflow-ui"), mlflow_server


@pytest.fixture(scope="module")
def sweep(server):
    root, uri = server
    # The weights are drawn (continuous simplex): still one trial per regime, and a mapping the
    # saved view shows as a column per task.
    path = write_sweep(root / "ui.yaml",
                       space={"sharing.head_regime": {"type": "grid", "values": ["S-I-I", "I-S-S"]},
                              "loss.weights": {"type": "simplex"}},
                       tracking={"experiment": "ui", "register_model": "mtbert-ui"})
    proc = run_cli(["sweep", "run", str(path), "--num-cpus", "2", "--tracking-uri", uri], cwd=root, timeout=500)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("ui")
    runs = client.search_runs([experiment.experiment_id], max_results=100)
    parent = next(r for r in runs if r.data.tags.get("role") == "sweep")
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    return root, uri, path, proc.stdout, client, experiment, parent, children


def test_runs_carry_source_datasets_data_report_and_system_metrics(sweep):
    root, uri, path, out, client, experiment, parent, children = sweep
    assert experiment.tags[EXPERIMENT_KIND_TAG] == EXPERIMENT_KIND
    assert len(children) == 3
    cached = {p.name for p in (root / ".mtbert_cache").glob("*.pt")}
    for run in [parent, *children]:
        assert run.data.tags["mlflow.source.name"] == str(path)
        inputs = {d.dataset.name: d for d in run.inputs.dataset_inputs}
        assert set(inputs) == {f"{t}-{s}" for t in TASKS for s in ("train", "dev")}
        for name, d in inputs.items():
            # The digest is the tokenization cache key: it names the cached file.
            assert f"{name}-{d.dataset.digest}.pt" in cached, (name, d.dataset.digest, cached)
            assert {t.value for t in d.tags} == {"training" if name.endswith("train") else "eval"}
        assert run.data.tags["bad_rows"] == "0"
        assert "data_report.txt" in {a.path for a in client.list_artifacts(run.info.run_id)}
    for run in children:
        assert run.data.metrics["system/process_memory_rss_megabytes"] > 0
        assert "system/process_cpu_utilization_percentage" in run.data.metrics
        steps = {m.step for m in client.get_metric_history(run.info.run_id, "system/process_memory_rss_megabytes")}
        assert steps == {1, 2}  # one sample per epoch


def test_best_trial_logs_a_model_that_loads_predicts_and_is_registered(sweep, monkeypatch):
    import mlflow
    import pandas as pd

    root, uri, path, out, client, experiment, parent, children = sweep
    best = max(children, key=lambda r: r.data.metrics["overall"])
    assert [r.info.run_id for r in children if r.data.tags.get("model_uri")] == [best.info.run_id]
    assert best.info.status == "FINISHED"  # logging the model kept the run's end state
    assert f"model: {best.data.tags['trial_key']} logged" in out and "registered as 'mtbert-ui'" in out
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    mlflow.set_tracking_uri(uri)
    try:
        model = mlflow.pyfunc.load_model(best.data.tags["model_uri"])
    finally:  # the server outlives this module: leave MLflow's process-wide URI as found
        mlflow.set_tracking_uri(None)
    got = model.predict(pd.DataFrame({"text": ["a superb film", "an awful film"],
                                      "text2": ["a wonderful movie", None]}))
    assert list(got.columns) == list(TASKS) and len(got) == 2
    assert set(got["sst"]) <= set(range(5)) and got["para"][0] in (0, 1) and pd.isna(got["sts"][1])
    versions = client.search_model_versions("name='mtbert-ui'")
    assert len(versions) == 1 and versions[0].run_id == best.info.run_id


def _dom(url: str, chromium: str, until: str = "Run Name") -> str:
    """The page's DOM once the app has rendered (virtual time lets its requests finish)."""
    dom = ""
    for budget in (20000, 40000):
        # Wide: the table renders only the columns in view.
        proc = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--window-size=3200,900",
                               f"--virtual-time-budget={budget}", "--dump-dom", url],
                              capture_output=True, text=True, timeout=240)
        dom = proc.stdout
        if until in dom:
            break
    return dom


def test_the_experiment_page_opens_on_the_runs_table_in_a_browser(sweep):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("Debian's chromium is not installed (apt-get install chromium) to render the MLflow UI")
    root, uri, path, out, client, experiment, parent, children = sweep
    link = ui_link(uri, experiment.experiment_id)
    assert link in out  # the link the sweep prints is the one that works
    dom = _dom(link, chromium)
    text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", re.sub(r"<(script|style)[^>]*>.*?</\1>", "", dom, flags=re.S)))
    assert "Runs - Experiment" in text, text[:2000]  # the model-training runs table, not GenAI's overview
    assert parent.info.run_name in text
    assert "Run Name" in text and "Dataset" in text and "sst-train" in text
    assert "Traces 0" not in text
    # The saved view: which sweep and seed, scores as columns, best first, the swept keys as logged.
    assert "mtbert: scores" in text and "Sort: overall" in text
    for column in ("sweep_run", "seed", "overall", "sst_acc", "para_acc", "sts_corr", "tm_relative_score",
                   "sharing.head_regime", "loss.weights.sst", "loss.weights.para", "loss.weights.sts"):
        assert f" {column} " in text, column
    assert "loss.weights " not in text  # the mapping's own param is not logged: its entries are
    # Its chart tab opens on the swept keys against overall.
    chart = _dom(link + "&compareRunsMode=CHART", chromium, until="Parallel Coordinates")
    assert "Swept dimensions" in chart and "Parallel Coordinates" in chart, chart[-3000:]
