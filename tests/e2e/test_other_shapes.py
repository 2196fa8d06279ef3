"""Tasks of other shapes, end to end through the real CLI on the tiny model: a long-text fourth
task added by a plugin and `data.files` (its truncation reported), mixed with the CS224N
files of the built-in tasks, in a sweep whose cascade names the fourth task."""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]

PLUGIN = textwrap.dedent('''
    from mtbert.tasks import TaskSpec, register_task

    register_task(TaskSpec(name="reviews", kind="binary", metric_name="reviews_acc", pair=False,
                           description="long movie reviews, positive or not"))
''')


def cli(args: list[str], cwd: Path, timeout: float = 400) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("MLFLOW_TRACKING_URI", None)
    env.pop("RAY_ADDRESS", None)
    return subprocess.run([sys.executable, "-m", "mtbert.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def _write(path: Path, lines: list[str]) -> None:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def make_data(folder: Path, rows: int = 40) -> dict:
    """CS224N-format files for sst, para, sts and a CSV of long reviews (60-120 words)."""
    rng = random.Random(0)
    cs = folder / "cs224n"
    cs.mkdir(parents=True)
    words = ["good", "bad", "film", "plot", "actor", "scene", "long", "slow", "fine", "great"]
    for split in ("train", "dev"):
        _write(cs / f"ids-sst-{split}.csv", ["\tid\tsentence\tsentiment"] + [
            f"{i}\ts{i}\t{' '.join(rng.choices(words, k=6))}\t{i % 5}" for i in range(rows)])
        _write(cs / f"quora-{split}.csv", ["\tid\tsentence1\tsentence2\tis_duplicate"] + [
            f"{i}\tq{i}\twhat is {words[i % 10]}\twhat is {words[(i + i % 2) % 10]}\t{1 - i % 2}"
            for i in range(rows)])
        _write(cs / f"sts-{split}.csv", ["\tid\tsentence1\tsentence2\tsimilarity"] + [
            f"{i}\tt{i}\ta {words[i % 10]} film\ta {words[(i * 3) % 10]} film\t{(i % 6) * 0.9:.1f}"
            for i in range(rows)])
        reviews = ["review,stars"]
        for i in range(rows):
            mood = "great" if i % 2 else "bad"
            reviews.append(f"\"{' '.join(rng.choices(words, k=rng.randint(60, 120)))} {mood}\",{i % 2}")
        _write(folder / f"reviews-{split}.csv", reviews)
    return {"source": "cs224n", "dir": str(cs),
            "files": {"reviews": {"train": str(folder / "reviews-train.csv"), "dev": str(folder / "reviews-dev.csv"),
                                  "columns": {"text": "review", "label": "stars"}}}}


TINY = {"name_or_path": "tiny", "tiny": {"layers": 2, "hidden": 32, "heads": 2, "intermediate": 64},
        "max_length": 32}


def test_long_text_fourth_task_reports_its_truncation(tmp_path):
    (tmp_path / "mytasks.py").write_text(PLUGIN)
    config = {"plugins": ["mytasks"], "tasks": ["sst", "para", "sts", "reviews"], "model": TINY,
              "data": make_data(tmp_path), "task_options": {"reviews": {"max_length": 64}},
              "train": {"epochs": 1, "batch_size": 8, "device": "cpu"}, "sampling": {"steps_per_epoch": 6}}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    proc = cli(["train", "--config", "config.yaml", "--output", "out"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "out" / "result.json").read_text())
    cut = {(t["task"], t["split"]): t for t in result["truncation"]}
    # Every review (62-122 tokens) is cut at 64; the 95% length says what would keep them.
    assert cut[("reviews", "train")]["rows_cut"] > 30 and cut[("reviews", "train")]["max_length"] == 64
    assert 100 <= cut[("reviews", "train")]["p95_length"] <= 130
    assert cut[("sst", "train")]["rows_cut"] == 0 and cut[("sst", "train")]["max_length"] == 32
    assert result["metrics"]["trunc_rows_reviews"] > 0.75 and "reviews_acc" in result["metrics"]
    assert "data: reviews train:" in proc.stdout and "rows cut at 64 tokens" in proc.stdout
    # The record shows what the readers used: the reviews' CSV columns as mapped.
    files = result["config"]["data"]["files"]["reviews"]
    assert files["format"] == "csv" and files["columns"] == {"text": "review", "text2": None, "label": "stars", "id": None}


@pytest.mark.slow
def test_four_task_sweep_with_cs224n_mix_and_a_cascade_into_the_fourth_task(tmp_path):
    (tmp_path / "mytasks.py").write_text(PLUGIN)
    sweep = {
        "name": "shapes",
        "base": {"plugins": ["mytasks"], "tasks": ["sst", "para", "sts", "reviews"], "model": TINY,
                 "data": make_data(tmp_path), "task_options": {"reviews": {"max_length": 48}},
                 "sharing": {"cascade": "sst>reviews", "head_regime": "I-S"},
                 "pairs": {"encoding": "cross"},
                 "train": {"epochs": 2, "batch_size": 8, "device": "cpu"}, "sampling": {"steps_per_epoch": 4}},
        "space": {"optim.lr": [2e-3, 3e-3]},  # neither is the base 1e-3: a point equal to the baseline trains once, as it
        "max_concurrent": 2,
        "tracking": {"log_models": "none"},  # the runs' params and metrics are read, not a model
    }
    (tmp_path / "shapes.yaml").write_text(yaml.safe_dump(sweep))
    proc = cli(["sweep", "run", "shapes.yaml", "--num-cpus", "2"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "3 trials, 3 finished" in proc.stdout, proc.stdout

    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = client.get_experiment_by_name("shapes")
    runs = [r for r in client.search_runs([exp.experiment_id]) if "trial_key" in r.data.tags]
    assert len(runs) == 3
    for run in runs:
        params, metrics = run.data.params, run.data.metrics
        assert params["sharing.cascade"] == "sst>reviews" and params["data.source"] == "cs224n"
        assert params["data.files.reviews.format"] == "csv" and params["data.files.reviews.columns.text"] == "review"
        assert 0 <= metrics["reviews_acc"] <= 1 and 0 <= metrics["sst_acc"] <= 1
        assert metrics["epoch/trunc_rows_reviews"] > 0.75 and metrics["epoch/trunc_rows_sst"] == 0
