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
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id
                and r.data.tags.get("role") != "configuration"]  # the trials' runs
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
    assert ui_link(uri, experiment.experiment_id) in out  # the link the sweep prints is the one that works
    link = ui_link(uri, experiment.experiment_id).replace("viewStateShareKey=mtbert", "viewStateShareKey=mtbert-seeds")
    dom = _dom(link, chromium)
    text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", re.sub(r"<(script|style)[^>]*>.*?</\1>", "", dom, flags=re.S)))
    assert "Runs - Experiment" in text, text[:2000]  # the model-training runs table, not GenAI's overview
    assert parent.info.run_name in text
    assert "Run Name" in text and "Dataset" in text and "sst-train" in text
    assert "Traces 0" not in text
    # The seeds' saved view: which sweep and seed, scores as columns, best first, the swept keys as logged.
    assert "mtbert: seeds" in text and "Sort: overall" in text
    for column in ("sweep_run", "seed", "overall", "sst_acc", "para_acc", "sts_corr", "tm_relative_score",
                   "sharing.head_regime", "loss.weights.sst", "loss.weights.para", "loss.weights.sts"):
        assert f" {column} " in text, column
    assert "loss.weights " not in text  # the mapping's own param is not logged: its entries are
    # Its chart tab opens on the swept keys against overall.
    chart = _dom(link + "&compareRunsMode=CHART", chromium, until="Parallel Coordinates")
    assert "Swept dimensions" in chart and "Parallel Coordinates" in chart, chart[-3000:]


# --------------------------------------------------------------------------- configurations

def _text(dom: str) -> str:
    import html

    return html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", re.sub(r"<(script|style)[^>]*>.*?</\1>", "",
                                                                          dom, flags=re.S))))


def _screenshot(url: str, chromium: str, path, height: int = 900) -> None:
    """What the page looks like (docs/walkthrough/ keeps these), into the test's own folder."""
    subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", f"--window-size=1600,{height}",
                    "--virtual-time-budget=30000", "--hide-scrollbars", f"--screenshot={path}", url],
                   capture_output=True, timeout=240)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _chromium() -> str:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("Debian's chromium is not installed (apt-get install chromium) to render the MLflow UI")
    return chromium


@pytest.fixture(scope="module")
def configured(server):
    """Two configurations and the baseline at two seeds each, one claim: what a researcher
    compares in MLflow is the configuration, and the verdict sits on the sweep's run."""
    root, uri = server
    path = write_sweep(root / "configs.yaml", space={"sharing.head_regime": {"type": "grid", "values": ["S-I-I", "I-S-S"]}},
                       baseline={"sharing.head_regime": "I-I-I"}, seeds=[0, 1], max_concurrent=2,
                       tracking={"experiment": "ui-configurations", "log_models": "none"},
                       claims=[{"name": "S-I-I > I-I-I", "metric": "overall", "a": {"sharing.head_regime": "S-I-I"},
                                "b": {"role": "baseline"}, "relation": ">", "min_effect": 0.01}])
    proc = run_cli(["sweep", "run", str(path), "--num-cpus", "2", "--tracking-uri", uri], cwd=root, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("ui-configurations")
    runs = client.search_runs([experiment.experiment_id], max_results=100)
    parent = next(r for r in runs if r.data.tags.get("role") == "sweep")
    configs = {r.data.tags["variant"]: r for r in runs if r.data.tags.get("role") == "configuration"}
    return uri, proc.stdout, client, experiment, parent, configs


def test_each_configuration_is_a_run_under_the_sweep_with_its_mean_interval_and_verdict_role(configured):
    uri, out, client, experiment, parent, configs = configured
    assert set(configs) == {"baseline", "p000", "p001"}
    for variant, run in configs.items():
        m = run.data.metrics
        assert run.data.tags["mlflow.parentRunId"] == parent.info.run_id and run.info.status == "FINISHED"
        assert m["seeds"] == 2 and m["seeds_diverged"] == 0
        assert m["overall_ci_low"] <= m["overall"] <= m["overall_ci_high"]
        seeds = client.search_runs([experiment.experiment_id], f"tags.variant = '{variant}' and tags.role != 'configuration'")
        mean = sum(s.data.metrics["overall"] for s in seeds) / 2
        assert m["overall"] == float(f"{mean:.4g}")  # four significant digits: what the runs table shows
    # Its part in the claim, and the claim's verdict, on the configuration's run.
    verdict = parent.data.tags["claim/S-I-I_I-I-I"]
    assert configs["p000"].data.tags["claim/S-I-I_I-I-I"] == f"A, {verdict}"
    assert configs["baseline"].data.tags["claim/S-I-I_I-I-I"] == f"B, {verdict}"
    assert "claim/S-I-I_I-I-I" not in configs["p001"].data.tags


def test_the_sweeps_run_carries_its_verdicts_searchable_and_rendered(configured, tmp_path):
    uri, out, client, experiment, parent, configs = configured
    tags, m = parent.data.tags, parent.data.metrics
    verdict = tags["claim/S-I-I_I-I-I"]
    assert verdict in ("holds", "contradicted", "no difference that matters", "inconclusive")
    assert m["claim/S-I-I_I-I-I/n"] == 2 and "claim/S-I-I_I-I-I/effect" in m
    assert f"claim S-I-I > I-I-I: {verdict}" in out
    # Searchable: the sweeps where the claim held, or did not.
    found = client.search_runs([experiment.experiment_id], f"tags.`claim/S-I-I_I-I-I` = '{verdict}'")
    assert [r.info.run_id for r in found] == [parent.info.run_id]
    note = tags["mlflow.note.content"]
    assert note.startswith("### Verdicts") and "| S-I-I > I-I-I |" in note and f"**{verdict}**" in note
    # Four columns fit the description's half page; the rest is findings.md, which it names.
    assert "| Claim | Verdict | Effect A − B (interval) | Seeds needed |" in note and "findings.md" in note
    chromium = _chromium()
    page = f"{uri}/#/experiments/{experiment.experiment_id}/runs/{parent.info.run_id}?workflowType=machine_learning"
    text = _text(_dom(page, chromium, until="Verdicts"))
    _screenshot(page, chromium, tmp_path / "mlflow-sweep-verdicts.png", height=1100)
    # The description rendered: the heading and the table's cells, not markdown source.
    assert "Verdicts" in text and "S-I-I > I-I-I" in text and "Seeds needed" in text, text[:3000]
    assert "| Claim |" not in text and "### Verdicts" not in text


def test_the_default_view_shows_one_row_per_configuration_with_mean_interval_and_seeds(configured, tmp_path):
    uri, out, client, experiment, parent, configs = configured
    chromium = _chromium()
    link = ui_link(uri, experiment.experiment_id)
    assert link in out
    text = _text(_dom(link, chromium))
    assert "mtbert: configurations" in text and "Sort: overall" in text, text[:3000]
    for column in ("sharing.head_regime", "overall", "overall_ci_low", "overall_ci_high", "seeds",
                   "seeds_diverged", "sst_acc", "para_acc", "sts_corr", "train_time_s"):
        assert f" {column} " in text, column
    for variant in configs:  # a row per configuration, no row per seed
        assert f" {variant} " in text, variant
    assert "-s0 " not in text and "-s1 " not in text
    # The seeds' view shows the trials.
    seeds = _text(_dom(link.replace("viewStateShareKey=mtbert", "viewStateShareKey=mtbert-seeds"), chromium))
    assert "mtbert: seeds" in seeds and " p000-s1 " in seeds and " sweep_run " in seeds
    _screenshot(link, chromium, tmp_path / "mlflow-configurations.png")


def test_the_compare_view_of_configurations_shows_the_swept_dimensions(configured, tmp_path):
    import json
    from urllib.parse import quote

    uri, out, client, experiment, parent, configs = configured
    chromium = _chromium()
    ids = json.dumps([r.info.run_id for r in configs.values()])
    page = (f"{uri}/#/compare-runs?runs={quote(ids)}&experiments={quote(json.dumps([experiment.experiment_id]))}"
            "&workflowType=machine_learning")
    text = _text(_dom(page, chromium, until="Parallel Coordinates Plot"))
    # Its plot opens on the swept dimension against overall (a configuration's first metric).
    assert re.search(r"Parameters:\s+sharing\.head_regime\s+Metrics:\s+overall\s", text), text[:3000]
    _screenshot(page, chromium, tmp_path / "mlflow-compare.png", height=1400)
