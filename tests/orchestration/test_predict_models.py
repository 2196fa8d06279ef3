"""`mtbert predict --model` takes what a sweep prints (a models:/ URI, a run id, a registered
name) as well as a bundle folder, and predicts the whole dev split unless told to score only
what the run scored."""
from __future__ import annotations

import json

import mlflow
import pytest
from mlflow.tracking import MlflowClient

from mtbert.cli import main
from mtbert.config import build_config
from mtbert.predict import read_predictions
from mtbert.train.loop import train
from orchestration.track.models import log_bundle
from tests.e2e.test_bundle import write_cs224n

from .conftest import new_experiment

DEV_ROWS, CAP = 70, 40


@pytest.fixture(scope="module")
def logged(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    data = root / "data"
    data.mkdir()
    for j, task in enumerate(("sst", "para", "sts")):
        write_cs224n(data, task, "train", 200, 10 + j)
        write_cs224n(data, task, "dev", DEV_ROWS, 20 + j)
    cfg = build_config({}, {"data.source": "cs224n", "data.dir": str(data), "data.cache_dir": str(root / "cache"),
                            "data.max_dev_examples": CAP, "train.epochs": 1, "sampling.strategy": "tuple",
                            "sampling.steps_per_epoch": 6, "train.device": "cpu", "model.max_length": 32})
    result = train(cfg, output_dir=root / "out", log=None)
    uri = f"sqlite:///{root / 'mlflow.db'}"
    client = MlflowClient(uri)
    run = client.create_run(new_experiment(client, "predict"))
    client.set_terminated(run.info.run_id)
    model_uri = log_bundle(uri, run.info.run_id, root / "out" / "best", register_as="sst-para-sts")
    return root, uri, run.info.run_id, model_uri, result


def _predict(root, *args):
    return main(["predict", "--split", "dev", "--device", "cpu", *args])


@pytest.mark.parametrize("ref", ["uri", "run_id", "name"])
def test_predict_from_what_the_sweep_prints(logged, ref, tmp_path, monkeypatch, capsys):
    root, uri, run_id, model_uri, _ = logged
    monkeypatch.chdir(tmp_path)  # the download cache is the working folder's own
    given = {"uri": model_uri, "run_id": run_id, "name": "sst-para-sts"}[ref]
    # No --output: a model read from the store predicts into the folder the command runs in,
    # not into the download cache.
    assert _predict(root, "--model", given, "--tracking-uri", uri) == 0
    assert "-> bundle" in capsys.readouterr().out
    theirs = json.loads((tmp_path / "predictions" / "scores-dev.json").read_text())
    main(["predict", "--model", str(root / "out" / "best"), "--split", "dev", "--device", "cpu",
          "--output", str(tmp_path / "folder")])
    assert theirs == json.loads((tmp_path / "folder" / "scores-dev.json").read_text())


def test_whole_dev_split_unless_as_trained(logged, tmp_path):
    root, _, _, _, result = logged
    best = root / "out" / "best"
    assert _predict(root, "--model", str(best), "--output", str(tmp_path / "all")) == 0
    assert len(read_predictions(tmp_path / "all" / "sst-dev-output.csv")) == DEV_ROWS
    assert _predict(root, "--model", str(best), "--output", str(tmp_path / "run"), "--as-trained") == 0
    assert len(read_predictions(tmp_path / "run" / "sst-dev-output.csv")) == CAP
    scores = json.loads((tmp_path / "run" / "scores-dev.json").read_text())
    epoch = result.epochs[result.metrics["best_epoch"] - 1]
    assert scores == {"sst": epoch["sst_acc"], "para": epoch["para_acc"], "sts": epoch["sts_corr"]}


def test_unknown_model_name_is_one_line(logged, tmp_path, monkeypatch, capsys):
    _, uri, _, _, _ = logged
    monkeypatch.chdir(tmp_path)
    assert main(["predict", "--model", "no-such-model", "--tracking-uri", uri]) == 2
    err = capsys.readouterr().err
    assert "no-such-model" in err and "registered model" in err and len(err.strip().splitlines()) == 1


def _cached_files(folder):
    return {f: f.stat().st_ino for f in (folder / ".mtbert_cache" / "models").rglob("model.pt")}


def test_a_registry_version_is_downloaded_once_and_a_broken_entry_again(logged, tmp_path, monkeypatch, capsys):
    root, uri, _, _, _ = logged
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", raising=False)
    version = max(int(v.version) for v in MlflowClient(uri).search_model_versions("name = 'sst-para-sts'"))
    MlflowClient(uri).set_registered_model_alias("sst-para-sts", "champion", str(version))

    def predict(ref, out):
        assert _predict(root, "--model", ref, "--tracking-uri", uri, "--output", str(tmp_path / out)) == 0
        return (tmp_path / out / "scores-dev.json").read_text(), capsys.readouterr()

    first, said = predict(f"models:/sst-para-sts/{version}", "first")
    assert "model: downloading models:/sst-para-sts/" in said.out
    # The console is no terminal here: no download bar drawn into it.
    assert "Downloading artifacts" not in said.err and "%|" not in said.err
    downloaded = _cached_files(tmp_path)
    assert len(downloaded) == 1
    # The alias names the same version: one cache entry for both, not a second download.
    second, said = predict("models:/sst-para-sts@champion", "second")
    assert "read from the cache" in said.out and "downloading" not in said.out
    assert _cached_files(tmp_path) == downloaded and second == first

    # A download cut short (a file truncated) is no cache: it is fetched again, whole.
    (model_pt,) = downloaded
    model_pt.write_bytes(model_pt.read_bytes()[:1000])
    third, said = predict(f"models:/sst-para-sts/{version}", "third")
    assert "is incomplete: downloading again" in said.out
    assert third == first and model_pt.stat().st_size > 1000


def test_an_unknown_alias_is_one_line(logged, tmp_path, monkeypatch, capsys):
    root, uri, _, _, _ = logged
    monkeypatch.chdir(tmp_path)
    assert _predict(root, "--model", "models:/sst-para-sts@nobody", "--tracking-uri", uri) == 2
    err = capsys.readouterr().err
    assert "models:/sst-para-sts@nobody" in err and len(err.strip().splitlines()) == 1
