"""Bad inputs at the CLI: each is one line of its own, before compute (or Ray) is spent, and
an output folder is never left holding two runs' files."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from mtbert.cli import main
from orchestration.errors import SweepError
from orchestration.sweep.load import load_sweep

# Top-level on purpose (not in tests/orchestration, whose package name shadows `orchestration`
# under --import-mode=importlib): the in-process calls below must reach this checkout's code.
# The tiny sweep and its helpers are the orchestration tests' own.
from .orchestration.conftest import TINY_BASE, free_port, new_experiment, write_sweep


def error_line(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err  # one line, no traceback
    return err[0]


# --------------------------------------------------------------------------- mtbert train

TRAIN_FAST = ["--set", "train.epochs=1", "--set", "sampling.steps_per_epoch=3",
              "--set", "data.synthetic.train_size=48", "--set", "data.synthetic.dev_size=16",
              "--set", "model.max_length=32"]


def test_output_naming_a_file_fails_before_training(tmp_path, capsys):
    (tmp_path / "taken").write_text("x")
    line = error_line(capsys, ["train", "--output", str(tmp_path / "taken"), *TRAIN_FAST])
    assert line == f"mtbert: error: --output {tmp_path / 'taken'}: exists and is not a folder"


def test_a_failed_run_leaves_the_earlier_run_intact(tmp_path, capsys):
    out = tmp_path / "out"
    cache = ["--set", f"data.cache_dir={tmp_path / 'cache'}"]
    assert main(["train", "--output", str(out), *TRAIN_FAST, *cache]) == 0
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert {Path("result.json"), Path("best/model.pt"), Path("best/config.yaml")} <= set(before)
    capsys.readouterr()
    # A learning rate that diverges: the run fails after it has started writing its own files.
    assert main(["train", "--output", str(out), *TRAIN_FAST, *cache, "--set", "optim.lr=1e12",
                 "--set", "train.epochs=3", "--set", "optim.grad_clip=0"]) == 2
    err = capsys.readouterr().err
    assert "keeps the earlier run" in err and ("nan" in err or "inf" in err), err
    after = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert after == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".out.partial")] == []


def test_a_new_run_replaces_the_whole_earlier_run(tmp_path):
    out = tmp_path / "out"
    cache = ["--set", f"data.cache_dir={tmp_path / 'cache'}"]
    assert main(["train", "--output", str(out), *TRAIN_FAST, *cache]) == 0
    (out / "notes.txt").write_text("mine")
    assert main(["train", "--output", str(out), *TRAIN_FAST, *cache, "--set", "train.save_checkpoint=false"]) == 0
    # No best/ from the first run beside the second run's result.json; the user's file stays.
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt", "result.json"]


# --------------------------------------------------------------------------- leaderboard and tracking URIs

def test_leaderboard_against_a_closed_port_is_one_line_at_once(capsys):
    port = free_port()
    line = error_line(capsys, ["leaderboard", "--experiment", "x", "--tracking-uri", f"http://127.0.0.1:{port}"])
    assert line == (f"mtbert: error: tracking server http://127.0.0.1:{port} unreachable (connection refused); "
                    "start it or pass another --tracking-uri")


def test_a_ray_address_no_cluster_answers_is_one_line_before_any_work(tmp_path, capsys, monkeypatch):
    """Ray itself would retry for a minute and more, a warning every few seconds."""
    monkeypatch.chdir(tmp_path)
    port = free_port()
    sweep = Path(__file__).resolve().parents[1] / "sweeps" / "smoke.yaml"
    line = error_line(capsys, ["sweep", "run", str(sweep), "--address", f"127.0.0.1:{port}",
                               "--tracking-uri", f"sqlite:///{tmp_path / 'm.db'}"])
    assert line.startswith(f"mtbert: error: --address 127.0.0.1:{port}: no Ray cluster answers there ("), line
    assert not (tmp_path / "runs").exists()


def test_leaderboard_on_a_mistyped_store_creates_nothing(tmp_path, capsys):
    db = tmp_path / "mlfow.db"
    line = error_line(capsys, ["leaderboard", "--experiment", "x", "--tracking-uri", f"sqlite:///{db}"])
    assert line == f"mtbert: error: --tracking-uri sqlite:///{db}: no such store (file {db} does not exist)"
    assert not db.exists()


def test_leaderboard_on_a_sqlite_file_not_mlflows_is_one_line_and_left_alone(tmp_path, capsys):
    import sqlite3

    db = tmp_path / "other.db"
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE notes (text)")
    con.commit()
    con.close()
    before = db.read_bytes()
    line = error_line(capsys, ["leaderboard", "--experiment", "x", "--tracking-uri", f"sqlite:///{db}"])
    assert line == (f"mtbert: error: tracking store sqlite:///{db} unusable: not an MLflow store "
                    "(no experiments or runs table); it is left as it is")
    assert db.read_bytes() == before  # MLflow's schema is not written into someone else's database
    junk = tmp_path / "junk.db"
    junk.write_text("not a database")
    line = error_line(capsys, ["leaderboard", "--experiment", "x", "--tracking-uri", f"sqlite:///{junk}"])
    assert line == f"mtbert: error: tracking store sqlite:///{junk} unusable: file is not a database"


def test_importance_refuses_what_it_cannot_assess_in_one_line(tmp_path, capsys):
    line = error_line(capsys, ["importance", "--experiment", "x", "--permutations", "5"])
    assert line == ("mtbert: error: --permutations 5: must be >= 19 (the smallest p-value is 1 / (permutations + 1), "
                    "and it must reach 0.05)")
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    exp = new_experiment(client, "one")
    parent = client.create_run(exp, run_name="one-1", tags={"role": "sweep", "space_keys": "optim.lr"})
    for seed in (0, 1):  # one configuration: nothing to compare it with
        run = client.create_run(exp, tags={"mlflow.parentRunId": parent.info.run_id, "variant": "p000",
                                           "role": "search", "seed": str(seed)})
        client.log_param(run.info.run_id, "optim.lr", "0.001")
        client.log_metric(run.info.run_id, "overall", 0.5)
        client.set_terminated(run.info.run_id, "FINISHED")
    capsys.readouterr()  # MLflow's notes on creating the store
    line = error_line(capsys, ["importance", "--experiment", "one", "--tracking-uri", uri])
    assert line == (f"mtbert: error: sweep one-1 ({parent.info.run_id}): importance needs at least 2 finished "
                    "searched configurations; it has 1")


@pytest.mark.parametrize("uri, says", [
    ("htp:/x", "unknown tracking store scheme 'htp'"),
    ("sqlite:/x.db", "a sqlite URI needs three slashes"),
    ("http:/127.0.0.1:5000", "expected http://host:port"),
])
def test_malformed_tracking_uris_get_our_line(uri, says, capsys, tmp_path):
    line = error_line(capsys, ["leaderboard", "--experiment", "x", "--tracking-uri", uri])
    assert line.startswith(f"mtbert: error: --tracking-uri {uri!r}: {says}"), line
    sweep = write_sweep(tmp_path / "s.yaml", space={"optim.lr": [1e-3]})
    line = error_line(capsys, ["sweep", "run", str(sweep), "--tracking-uri", uri])
    assert line.startswith(f"mtbert: error: --tracking-uri {uri!r}: {says}"), line


# --------------------------------------------------------------------------- sweep files

@pytest.mark.parametrize("doc, line", [
    ({"base": "base.yaml", "space": {"optim.lr": [1e-3]}},
     "base: 'base.yaml' is a file name; write base_config: base.yaml (base: takes an inline mapping of config keys)"),
    ({"model": {"name_or_path": "tiny"}, "optim": {"lr": 1e-3}},
     "a training config (it has model:, optim:), not a sweep file; train it with `mtbert train --config {path}`, "
     "or name it in a sweep's base_config:"),
    ({"base": {}, "optim": {"lr": 1e-3}, "space": {"optim.lr": [1e-3]}},
     "optim: a config key at the top level of a sweep file; put it under base: (optim: ...)"),
    ({"base": TINY_BASE, "space": {}},
     "space: empty and no baseline overrides, so the sweep would train the base config twice; add a "
     "dimension, or train it once with `mtbert train`"),
])
def test_sweep_shape_mistakes(doc, line, tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(SweepError) as err:
        load_sweep(path)
    assert str(err.value) == f"{path}: " + line.format(path=path)


def test_smoke_still_checks_what_it_drops(tmp_path):
    # --smoke pins model.max_length, so this dimension is dropped; its -1 still fails.
    path = write_sweep(tmp_path / "s.yaml", space={"model.max_length": [64, -1], "optim.lr": [1e-3]})
    with pytest.raises(SweepError) as err:
        load_sweep(path, smoke=True)
    assert str(err.value) == f"{path}: space.model.max_length: value -1: must be > 0, got -1"
    # An ASHA grace period the real sweep cannot reach fails under --smoke too.
    path = write_sweep(tmp_path / "a.yaml", space={"optim.lr": [1e-3, 2e-3]},
                       scheduler={"type": "asha", "grace_period": 5})
    with pytest.raises(SweepError, match=re.escape("scheduler.grace_period: 5 > 2, the epoch budget of the real sweep")):
        load_sweep(path, smoke=True)


def test_num_cpus_zero_and_gpu_without_one_fail_before_ray(tmp_path, capsys, monkeypatch):
    import torch

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    path = write_sweep(tmp_path / "s.yaml", space={"optim.lr": [1e-3]})
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    assert error_line(capsys, ["sweep", "run", str(path), "--num-cpus", "0", "--tracking-uri", uri]) == \
        "mtbert: error: --num-cpus: must be >= 1, got 0"
    path = write_sweep(tmp_path / "g.yaml", space={"optim.lr": [1e-3]}, resources={"cpu": 1, "gpu": 1})
    if not torch.cuda.is_available():
        assert error_line(capsys, ["sweep", "run", str(path), "--tracking-uri", uri]) == (
            f"mtbert: error: {path}: resources.gpu: each trial asks for 1 GPU but this machine has none "
            "(set resources.gpu: 0, or --address a cluster with GPUs)")
    path = write_sweep(tmp_path / "c.yaml", space={"optim.lr": [1e-3]}, resources={"cpu": 2})
    assert error_line(capsys, ["sweep", "run", str(path), "--num-cpus", "1", "--tracking-uri", uri]) == (
        f"mtbert: error: {path}: resources.cpu: each trial asks for 2 but --num-cpus is 1; no trial could ever start")


def test_printed_commands_quote_paths_with_spaces():
    from orchestration.run.launch import SweepOutcome, _summary

    lines: list[str] = []
    _summary(SweepOutcome("s", "/r", "sqlite:////my runs/mlflow.db", "exp", "p", "FINISHED"), lines.append)
    assert "--tracking-uri 'sqlite:////my runs/mlflow.db'" in lines[1]
    assert "--backend-store-uri 'sqlite:////my runs/mlflow.db'" in lines[2]
