"""Columns that say what they mean: the learning rates that trained each row (the encoder's,
the heads', both when they differ), as `mtbert leaderboard` prints them from a sweep's
MLflow runs, checked against the rates the training loop gives its parameters; and a peak
memory column whose caption says what it counts on the device the rows trained on."""
from __future__ import annotations

import re

import pytest
from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient

from mtbert.cli import main
from mtbert.config import build_config, flatten, to_dict
from mtbert.model.multitask import MultitaskModel
from mtbert.train.loop import param_rates
from orchestration.report.table import LR_HEADER
from orchestration.sweep.labels import fmt_rates

TAGS = {"role": "sweep", "tasks": "sst,para,sts", "task_metrics": "sst_acc,para_acc,sts_corr",
        "space_keys": "freeze.layers", "tm_score": "compute"}
# The sweep on a pretrained encoder: its recipe trains the encoder at 5e-05 and the
# heads at 1e-03. variant -> (role, freeze.layers, head regime, overall)
CONFIGS = {"baseline": ("baseline", "0", "S-I-S", 0.70), "p000": ("search", "-1", "S-I-S", 0.62),
           "p001": ("search", "4", "S-I-S", 0.66), "reference": ("reference", "-1", "none", 0.60)}


def _sweep(uri: str, tmp_path, lr: str = "5e-05", head_lr: str = "0.001", configs: dict = CONFIGS,
           device: str = "cpu") -> None:
    client = MlflowClient(uri)
    exp = client.create_experiment("rates", artifact_location=(tmp_path / "mlartifacts").as_uri())
    parent = client.create_run(exp, run_name="rates-1", start_time=1_000, tags=TAGS).info.run_id
    start = 1_001
    for variant, (role, freeze, regime, overall) in configs.items():
        for seed in range(2):
            run = client.create_run(exp, run_name=f"{variant}-s{seed}", start_time=start, tags={
                "mlflow.parentRunId": parent, "variant": variant, "seed": str(seed), "role": role,
                "stopped_early": "false", "device": device}).info.run_id
            start += 1
            score = overall + 0.01 * seed
            figures = {"overall": score, "sst_acc": score, "para_acc": score, "sts_corr": score, "best_epoch": 1.0,
                       "train_time_s": 50.0, "tm_time_s": 50.0, "tm_flops": 1e12, "model_size_mb": 90.0,
                       "peak_memory_mb": 600.0, "tm_relative_score": 1.0, "tm_relative_score_compute": 1.0}
            # As a sweep logs them: the resolved config's params, as strings.
            params = {"sharing.head_regime": regime, "optim.lr": lr, "optim.head_lr": head_lr,
                      "freeze.layers": freeze, "model.pooling": "mean", "train.seed": str(seed)}
            client.log_batch(run, params=[Param(k, v) for k, v in params.items()],
                             metrics=[Metric(k, v, 0, 0) for k, v in figures.items()])
            client.set_terminated(run, "FINISHED")
    client.set_terminated(parent, "FINISHED")


def _board(uri: str, tmp_path, fmt: str, capsys) -> str:
    out = tmp_path / f"board.{fmt}"
    capsys.readouterr()
    code = main(["leaderboard", "--experiment", "rates", "--tracking-uri", uri, "--format", fmt,
                 "--output", str(out)])
    assert code == 0, capsys.readouterr().err
    return out.read_text()


def test_each_row_shows_the_rates_that_trained_it(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    _sweep(uri, tmp_path)
    md = _board(uri, tmp_path, "md", capsys)
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ") for line in md.splitlines() if line.startswith("| ")}
    header = rows["Regime"]
    at = header.index(LR_HEADER)
    assert rows["S-I-S k=all*"][at] == "5.0e-05 / 1.0e-03"  # fine-tuned: both rates
    assert rows["S-I-S k=all freeze=4"][at] == "5.0e-05 / 1.0e-03"  # the top two layers train at the encoder's
    assert rows["S-I-S k=all freeze=all"][at] == "– / 1.0e-03"  # heads only: their rate, not the encoder's
    assert rows["frozen reference"][at] == "– / 1.0e-03"
    assert "LR: encoder / heads (– : encoder frozen, only the heads train)" in md
    # LaTeX keeps a label column where rows differ in it; the caption states no single rate.
    tex = _board(uri, tmp_path, "latex", capsys)
    caption = re.search(r"\\caption\{(.*)\}", tex)[1]
    assert "Every row: LR" not in caption and "5.0e-05" not in caption, caption
    assert "-- / 1.0e-03" in tex


def test_one_rate_where_encoder_and_heads_share_it(tmp_path, capsys, monkeypatch):
    """A tiny encoder's recipe trains everything at one rate: the cell is that rate, and a
    LaTeX table whose rows all share it says so once, under its caption."""
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    _sweep(uri, tmp_path, lr="0.001", head_lr="0.001",
           configs={k: v for k, v in CONFIGS.items() if v[1] != "-1"})  # the encoder trains in every row
    md = _board(uri, tmp_path, "md", capsys)
    assert "| S-I-S k=all* | 1.0e-03 |" in md, md
    latex = _board(uri, tmp_path, "latex", capsys)
    assert latex.count(f"Every row: {LR_HEADER} 1.0e-03") == 1, latex  # in the caption or its notes


@pytest.mark.parametrize("freeze,pooling,lr", [(-1, "mean", 5e-5), (-1, "cls", 1e-3), (1, "mean", 5e-5),
                                               (0, "cls", 5e-5), (0, "mean", 1e-3)])
def test_the_label_agrees_with_the_rates_the_loop_trains_at(freeze, pooling, lr):
    """fmt_rates reads a run's params; param_rates and requires_grad are what trained."""
    cfg = build_config({}, {"optim.lr": lr, "optim.head_lr": 1e-3, "freeze.layers": freeze,
                            "model.pooling": pooling})
    model = MultitaskModel(cfg, vocab_size=50)
    rates = param_rates(model, cfg)
    encoder = {id(p) for m in [model.embeddings, *model.shared_layers, *model.task_layers.values()]
               for p in m.parameters() if p.requires_grad}
    heads = {rates[id(p)] for p in model.parameters() if p.requires_grad and id(p) not in encoder}
    assert heads == {1e-3}
    trained = {rates[i] for i in encoder}
    expected = ("– / 1.0e-03" if not trained else "1.0e-03" if trained == {1e-3} else
                f"{min(trained):.1e} / 1.0e-03")
    logged = {k: str(v) for k, v in flatten(to_dict(cfg)).items()}  # MLflow params are strings
    assert fmt_rates(logged) == expected


@pytest.mark.parametrize("device", ["cpu", "cuda (NVIDIA H100 80GB HBM3)"])
def test_the_caption_says_what_peak_memory_counts_where_the_rows_trained(device, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    _sweep(uri, tmp_path, device=device)
    md = _board(uri, tmp_path, "md", capsys)
    assert "Peak mem. (MB)" in md.splitlines()[0]
    cpu = "on CPU the peak resident set of the trial's process, which also counts the libraries"
    cuda = "CUDA peak allocated (weights, optimizer state, activations)"
    assert (cpu in md) == (device == "cpu") and (cuda in md) == (device != "cpu"), md
