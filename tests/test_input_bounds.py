"""Every size an input can name has a bound, checked at load (before Ray or MLflow start) in one
line naming the key and the bound; no command succeeds on a wrong premise; every command that
writes checks its outputs first; every command that reads opens the store without changing it.

Top-level for the reason tests/test_bad_inputs.py gives. The YAML bombs run the CLI in a
subprocess under a memory cap and a timeout, so a regression fails fast instead of taking the
machine down."""
from __future__ import annotations

import json
import os
import re
import resource
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from mtbert.cli import main
from mtbert.config import load_config
from mtbert.predict import read_predictions

from .orchestration.conftest import ROOT, TINY_BASE, cli_env, free_port, write_sweep
from .test_bad_inputs import TRAIN_FAST, error_line

MEMORY_CAP = 3 << 30  # bytes of address space: the CLI with torch and Ray imported fits in it


def _capped() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


def capped_cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mtbert.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, preexec_fn=_capped, env=cli_env(PYTHONPATH=str(ROOT)))


def one_line(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


# Nine levels of nine: 9^7 leaves from a few hundred bytes.
BOMB = "".join(f"  l{i}: &l{i} [{', '.join([f'*l{i - 1}' if i else 'x'] * 9)}]\n" for i in range(7))


# --------------------------------------------------------------------------- YAML bounds

def test_alias_bomb_under_tasks_is_refused_at_load(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text("anchors:\n" + BOMB + "tasks: [*l6, *l6]\n")
    line = one_line(capped_cli(["train", "--config", str(path)], tmp_path))
    assert line.startswith(f"mtbert: error: {path}: tasks: ") and line.endswith(
        "values once its YAML aliases are expanded, over the bound of 100,000"), line


def test_alias_bomb_under_seeds_is_refused_before_ray(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(yaml.safe_dump({"base": TINY_BASE, "space": {"optim.lr": [1e-3]}})
                    + "anchors:\n" + BOMB + "seeds: [*l6]\n")
    line = one_line(capped_cli(["sweep", "run", str(path)], tmp_path))
    assert line.startswith(f"mtbert: error: {path}: seeds: "), line
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "runs").exists()


def test_alias_bomb_in_a_set_value(tmp_path):
    value = "[&a [x,x,x,x,x,x,x,x,x,x], &b [*a,*a,*a,*a,*a,*a,*a,*a,*a,*a], &c [*b,*b,*b,*b,*b,*b,*b,*b,*b,*b], " \
            "&d [*c,*c,*c,*c,*c,*c,*c,*c,*c,*c], [*d,*d,*d,*d,*d,*d,*d,*d,*d,*d]]"
    line = one_line(capped_cli(["train", "--set", f"tasks={value}"], tmp_path))
    assert line.startswith("mtbert: error: --set tasks: ") and "over the bound of 100,000" in line, line


@pytest.mark.parametrize("text, says", [
    ("train:\n  epochs: 1\nmodel: {}\ntrain:\n  epochs: 2\n",
     "line 4: train: duplicate key (also at line 1); YAML would silently keep the last"),
    ("optim:\n  lr: 1.0e-3\n  lr: 2.0e-3\n", "line 3: optim.lr: duplicate key (also at line 2)"),
    ("tasks: &t [*t]\n", "tasks[0]: a YAML alias that contains itself"),
    ("tasks: " + "[" * 60 + "]" * 60 + "\n", "nested more than 50 levels deep (the bound)"),
    ("loss:\n  weighting: {name: cagrad, c: .inf}\nsampling: {strategy: tuple}\n",
     "loss.weighting.c: expected a finite number, got inf"),
    ("optim: {lr: .nan}\n", "optim.lr: expected a finite number, got nan"),
    ("model: {tiny: {hidden: 1000000000}}\n", "model.tiny.hidden: must be in 1..16,384, got 1,000,000,000"),
    ("train: {batch_size: 10000000}\n", "train.batch_size: must be in 1..65,536, got 10,000,000"),
    ("train: {seed: -1}\n", "train.seed: must be in 0..4294967295, got -1"),
])
def test_config_file_mistakes_are_one_line(text, says, tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    line = error_line(capsys, ["train", "--config", str(path), "--output", str(tmp_path / "out")])
    assert line.startswith(f"mtbert: error: {path}") and says in line, line
    assert not (tmp_path / "out").exists()


def test_a_file_over_the_size_bound(tmp_path, capsys):
    path = tmp_path / "big.yaml"
    path.write_text("# " + "x" * (1 << 20) + "\n")
    assert error_line(capsys, ["train", "--config", str(path)]) == \
        f"mtbert: error: {path}: {path.stat().st_size:,} bytes, over the bound of 1,048,576 for a config or sweep file"


def test_set_on_an_aliased_node_changes_that_place_only(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("tasks: [sst, para]\ntask_options:\n  sst: &opts {max_length: 32}\n  para: *opts\n")
    cfg = load_config(path, ["task_options.sst.max_length=16"])
    assert cfg.max_length("sst") == 16 and cfg.max_length("para") == 32


# --------------------------------------------------------------------------- sweep bounds

def _sweep_error(capsys, path: Path, tmp_path: Path) -> str:
    line = error_line(capsys, ["sweep", "run", str(path), "--tracking-uri", f"sqlite:///{tmp_path / 'm.db'}"])
    assert not (tmp_path / "m.db").exists()
    return line


@pytest.mark.parametrize("sections, says", [
    ({"space": {f"k{i}": {"type": "uniform", "low": 0, "high": 1} for i in range(33)}},
     "space: 33 dimensions, over the bound of 32"),
    ({"space": {k: [v * (i + 1) for i in range(10)] for k, v in
                (("optim.lr", 1e-4), ("optim.head_lr", 1e-4), ("optim.weight_decay", 0.001),
                 ("heads.dropout", 0.01), ("train.batch_size", 1), ("model.max_length", 8))}},
     "space: 1,000,000 configurations (optim.lr 10 x optim.head_lr 10 x optim.weight_decay 10 x heads.dropout 10 "
     "x train.batch_size 10 x model.max_length 10), over the bound of 1,000"),
    ({"space": {"loss.weights": {"type": "simplex", "step": 0.001}}},
     "space.loss.weights.step: 0.001 over 3 tasks is 501,501 weightings, over the bound of 1,000 configurations"),
    ({"space": {"optim.lr": [1e-3]}, "num_samples": 10**9}, "num_samples: 1000000000, over the bound of 1,000"),
    ({"space": {"optim.lr": [1e-3, 2e-3]}, "seeds": list(range(51))}, "seeds: 51 seeds, over the bound of 50"),
    ({"space": {"optim.lr": [1e-3, 2e-3]}, "seeds": [0, 2**40]}, "seeds[1]: must be in 0..4294967295"),
    ({"space": {"optim.lr": [1e-3, 2e-3]}, "seeds": {"start": 2, "max": 100000}},
     "seeds.max: 100000, over the bound of 50 seeds"),
    ({"space": {"optim.lr": [1e-3, 2e-3]}, "seeds": {"start": 2, "max": 4, "budget": {"trials": 10**9}}},
     "seeds.budget.trials: 1,000,000,000, over the bound of 5,000"),
    ({"space": {"optim.lr": [1e-3 * (i + 1) for i in range(1000)]}, "seeds": list(range(6))},
     "seeds: 1,000 configurations x 6 seeds is 6,000 trials, over the bound of 5,000"),
    ({"space": {"optim.lr": [1e-3, 2e-3]},
      "claims": [{"name": f"c{i}", "metric": "overall", "a": {"optim.lr": 1e-3}, "b": {"optim.lr": 2e-3},
                  "relation": ">"} for i in range(201)]},
     "claims: 201 claims, over the bound of 200"),
    ({"space": {"optim.lr": [1e-3, 2e-3]},
      "claims": [{"name": "c", "metric": "overall", "a": {"optim.lr": 1e-3}, "b": {"optim.lr": 2e-3},
                  "relation": "~", "min_effect": float("inf")}]},
     "claims[0] (c).min_effect: expected a finite number, got inf"),
])
def test_sweep_sizes_over_their_bounds_fail_before_ray(sections, says, tmp_path, capsys):
    path = write_sweep(tmp_path / "s.yaml", **sections)
    line = _sweep_error(capsys, path, tmp_path)
    assert line == f"mtbert: error: {path}: {says}" or line.startswith(f"mtbert: error: {path}: {says}"), line


# --------------------------------------------------------------------------- wrong premises

def _plugin(tmp_path: Path, monkeypatch, name: str, source: str) -> None:
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))


def test_a_plugin_that_exits_on_import_is_an_error(tmp_path, monkeypatch, capsys):
    _plugin(tmp_path, monkeypatch, "quits", "import sys\nsys.exit(0)\n")
    assert error_line(capsys, ["train", "--set", "plugins=[quits]"]) == (
        "mtbert: error: config: plugins[0]: importing 'quits' called sys.exit(0); a plugin registers tasks "
        "or components and returns")


def test_a_plugin_may_not_replace_a_builtin(tmp_path, monkeypatch, capsys):
    _plugin(tmp_path, monkeypatch, "takes_sst", """
        from mtbert.tasks import TaskSpec, register_task
        register_task(TaskSpec(name="sst", kind="binary", metric_name="sst_bin_acc", pair=False))
    """)
    line = error_line(capsys, ["train", "--set", "plugins=[takes_sst]"])
    assert line.startswith("mtbert: error: config: plugins[0]: importing 'takes_sst' raised ValueError: "
                           "register_task('sst'): task 'sst' is already registered"), line
    _plugin(tmp_path, monkeypatch, "takes_dwa", """
        from mtbert.train.weighting import Weighting, register_weighting
        @register_weighting
        class Mine(Weighting):
            name = "dwa"
    """)
    line = error_line(capsys, ["train", "--set", "plugins=[takes_dwa]"])
    assert "method 'dwa' is already mtbert.train.weighting.dwa." in line, line


def test_a_plugin_settings_check_that_asserts_is_one_line(tmp_path, monkeypatch, capsys):
    from mtbert.components import WEIGHTINGS

    _plugin(tmp_path, monkeypatch, "asserts", """
        from dataclasses import dataclass
        from mtbert.train.weighting import Weighting, register_weighting
        @register_weighting
        class Strict(Weighting):
            name = "strict"
            @dataclass
            class Settings(Weighting.Settings):
                k: float = 1.0
                def check(self, key):
                    assert self.k < 1, "k must be below 1"
    """)
    try:
        assert error_line(capsys, ["train", "--set", "plugins=[asserts]", "--set", "loss.weighting=strict"]) == (
            "mtbert: error: config: loss.weighting: method strict refused its settings (AssertionError: k must "
            "be below 1) in asserts")
    finally:
        WEIGHTINGS.pop("strict", None)


def _model_folder(root: Path, config: dict, tokenizer: bool) -> Path:
    import json

    root.mkdir()
    (root / "config.json").write_text(json.dumps(config))
    (root / "model.safetensors").write_bytes(b"")  # the load check reads no weights
    if tokenizer:
        (root / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a"]))
    return root


def test_a_model_folder_without_tokenizer_files_fails_at_load(tmp_path, capsys):
    folder = _model_folder(tmp_path / "minilm", {"model_type": "bert", "hidden_size": 32, "num_hidden_layers": 2,
                                                  "num_attention_heads": 2, "intermediate_size": 64}, tokenizer=False)
    assert error_line(capsys, ["train", "--set", f"model.name_or_path={folder}"]) == (
        f"mtbert: error: model.name_or_path: folder {folder} has no tokenizer files (tokenizer.json, vocab.txt, "
        "vocab.json, ...); copy them from the model it came from")


def test_a_model_that_is_not_bert_fails_at_load(tmp_path, capsys):
    folder = _model_folder(tmp_path / "gpt", {"model_type": "gpt2", "n_layer": 2, "n_embd": 32, "n_head": 2,
                                              "vocab_size": 100, "bos_token_id": 0, "eos_token_id": 0}, tokenizer=True)
    assert error_line(capsys, ["train", "--set", f"model.name_or_path={folder}"]) == (
        f"mtbert: error: model.name_or_path: '{folder}' (model_type gpt2) is not a BERT-family encoder "
        "(needs .embeddings and .encoder.layer)")


def test_predict_refuses_a_split_with_a_row_it_could_not_read(tmp_path, capsys):
    data = tmp_path / "data"
    data.mkdir()
    rows = [f"{i},the film number {i} is {'good' if i % 2 else 'bad'},{i % 5}" for i in range(40)]
    for split in ("train", "dev"):
        (data / f"{split}.csv").write_text("id,sentence,label\n" + "\n".join(rows) + "\n")
    test = rows[:20] + ["20,a row with, one field too many,3"] + rows[21:]
    (data / "test.csv").write_text("id,sentence,label\n" + "\n".join(test) + "\n")
    files = {s: str(data / f"{s}.csv") for s in ("train", "dev", "test")}
    out = tmp_path / "run"
    assert main(["train", "--output", str(out), *TRAIN_FAST, "--set", "tasks=[sst]", "--set", "data.source=files",
                 "--set", f"data.files={{sst: {files}}}", "--set", f"data.cache_dir={tmp_path / 'cache'}"]) == 0
    capsys.readouterr()
    line = error_line(capsys, ["predict", "--model", str(out / "best"), "--split", "test",
                               "--output", str(tmp_path / "preds")])
    assert line == (f"mtbert: error: {data / 'test.csv'}: 1 of 40 rows malformed (wrong field count: 1; first at "
                    "row 22); a prediction file needs every row: fix it (or --as-trained on dev scores the rows "
                    "the run read)")
    assert not (tmp_path / "preds").exists()  # nothing written for a split it refused


def test_predict_writes_a_row_whose_label_is_missing_and_scores_the_others(tmp_path, capsys):
    # CS224N's own quora-dev.csv has such a row: its text is there to predict, its score is not.
    data = tmp_path / "data"
    data.mkdir()
    rows = [f"{i},the film number {i} is {'good' if i % 2 else 'bad'},{i % 5}" for i in range(40)]
    (data / "train.csv").write_text("id,sentence,label\n" + "\n".join(rows) + "\n")
    dev = rows[:7] + ["7,the film number 7 is good,"] + rows[8:]
    (data / "dev.csv").write_text("id,sentence,label\n" + "\n".join(dev) + "\n")
    files = {s: str(data / f"{s}.csv") for s in ("train", "dev")}
    out = tmp_path / "run"
    assert main(["train", "--output", str(out), *TRAIN_FAST, "--set", "tasks=[sst]", "--set", "data.source=files",
                 "--set", f"data.files={{sst: {files}}}", "--set", f"data.cache_dir={tmp_path / 'cache'}"]) == 0
    capsys.readouterr()
    assert main(["predict", "--model", str(out / "best"), "--split", "dev", "--output", str(tmp_path / "p")]) == 0
    printed = capsys.readouterr().out
    assert re.search(r"sst: 40 predictions -> .* \(sst_acc=[\d.]+ on the 39 rows with a label\)", printed), printed
    assert [i for i, _ in read_predictions(tmp_path / "p" / "sst-dev-output.csv")] == [str(i) for i in range(40)]
    # Scored as the run scored: the same 39 rows (the run skipped the one without a label).
    scored = json.loads((tmp_path / "p" / "scores-dev.json").read_text())["sst"]
    assert scored == pytest.approx(json.loads((out / "result.json").read_text())["metrics"]["sst_acc"])


# --------------------------------------------------------------------------- outputs

def _files(root: Path) -> set[Path]:
    return {p for p in root.rglob("*")}


def test_every_writing_command_checks_its_output_first(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("mine")
    (tmp_path / "afolder").mkdir()
    (tmp_path / "model").mkdir()  # a bundle folder: predict checks --output before reading it
    before = _files(tmp_path)
    cases = [
        (["predict", "--model", "model", "--output", "afile"], "--output afile: exists and is not a folder"),
        (["bundle", "model", "--output", "afile"], "--output afile: exists and is not a folder"),
        (["bundle", "model", "--output", "afolder"], "--output afolder: exists; give a new folder"),
        (["leaderboard", "--experiment", "x", "--output", "afolder"], "--output afolder: is a folder; name a file"),
        (["leaderboard", "--experiment", "x", "--plot", "afolder"], "--plot afolder: is a folder; name a file"),
        (["importance", "--experiment", "x", "--output", "afile/t.md"],
         f"--output afile/t.md: {tmp_path / 'afile'} is a file, not a folder"),
        (["findings", "--output", "afolder"], "--output afolder: is a folder; name a file"),
    ]
    for argv, says in cases:
        assert error_line(capsys, argv) == f"mtbert: error: {says}", argv
    assert _files(tmp_path) == before  # no stray file, no folder made, no store created


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only folder")
def test_a_read_only_folder_is_one_line(tmp_path, capsys):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        assert error_line(capsys, ["findings", "--output", str(locked / "f.md")]) == \
            f"mtbert: error: --output {locked / 'f.md'}: cannot write in {locked} (permission denied)"
    finally:
        locked.chmod(0o700)


# --------------------------------------------------------------------------- stores

def _foreign_db(path: Path) -> bytes:
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE notes (text)")
    con.execute("INSERT INTO notes VALUES ('mine')")
    con.commit()
    con.close()
    return path.read_bytes()


@pytest.mark.parametrize("argv", [
    ["best", "--experiment", "x"],
    ["findings"],
    ["importance", "--experiment", "x"],
    ["predict", "--model", "models:/m/1"],
])
def test_reading_commands_leave_a_foreign_sqlite_file_alone(argv, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    db = tmp_path / "app.db"
    before = _foreign_db(db)
    line = error_line(capsys, [*argv, "--tracking-uri", f"sqlite:///{db}"])
    assert line == (f"mtbert: error: tracking store sqlite:///{db} unusable: not an MLflow store (no experiments "
                    "or runs table); it is left as it is")
    assert db.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["app.db"]


def test_predict_from_a_uri_without_a_store_creates_none(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    line = error_line(capsys, ["predict", "--model", "models:/m/1"])
    assert line == (f"mtbert: error: --tracking-uri sqlite:///{tmp_path / 'mlflow.db'}: no such store "
                    f"(file {tmp_path / 'mlflow.db'} does not exist)")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("argv", [["best", "--experiment", "x"], ["findings"], ["predict", "--model", "models:/m/1"]])
def test_reading_commands_say_a_closed_port_at_once(argv, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    port = free_port()
    assert error_line(capsys, [*argv, "--tracking-uri", f"http://127.0.0.1:{port}"]) == (
        f"mtbert: error: tracking server http://127.0.0.1:{port} unreachable (connection refused); "
        "start it or pass another --tracking-uri")


# --------------------------------------------------------------------------- weak answers, each naming its row, file or key

def test_a_set_key_with_an_empty_part_names_the_set(capsys):
    assert error_line(capsys, ["train", "--set", "optim.lr.=1e-3"]) == (
        "mtbert: error: --set optim.lr.=1e-3: 'optim.lr.' is not a dotted key (an empty part between dots), "
        "e.g. --set optim.lr=1e-4")


@pytest.mark.parametrize("row, says", [
    ('2,"an unclosed quote,3',
     "row 3: unclosed quote (its field runs on to line 5, taking the rows after it)"),
    ("2," + "x" * (1 << 20) + ",3", "row 3: field larger than field limit (131072)"),
])
def test_a_bad_data_row_is_named(row, says, tmp_path, capsys):
    path = tmp_path / "sst.csv"
    path.write_text("id,sentence,label\n1,fine,1\n" + row + "\n3,after it,4\n4,last,0\n")
    files = f"{{sst: {{train: {path}, dev: {path}, format: csv}}}}"
    line = error_line(capsys, ["train", "--set", "tasks=[sst]", "--set", "data.source=files",
                               "--set", f"data.files={files}", "--set", "data.on_bad_row=error",
                               "--set", f"data.cache_dir={tmp_path / 'cache'}", "--output", str(tmp_path / "out")])
    assert line == f"mtbert: error: {path}: {says}"


def test_a_truncated_sweep_record_names_its_file(tmp_path, capsys):
    run = tmp_path / "runs" / "s-1"
    run.mkdir(parents=True)
    (run / "tuner.pkl").write_bytes(b"")  # Tune saved its state; the driver was killed writing its own
    (run / "mtbert_sweep.json").write_text('{"tracking_uri": "sqlite:///x.db", "exper')
    line = error_line(capsys, ["sweep", "resume", str(run)])
    assert line.startswith(f"mtbert: error: {run / 'mtbert_sweep.json'}: unreadable (") and \
        line.endswith("the sweep cannot be resumed from it (a copy from a backup, or a new `sweep run`)"), line


def test_a_resume_says_its_sweep_file_was_edited(tmp_path):
    import hashlib

    from orchestration.run.launch import _say_if_edited

    path = tmp_path / "s.yaml"
    path.write_text("space: {optim.lr: [1.0e-3]}\n")
    state = {"sweep_file": str(path), "sweep_text_sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
    said: list[str] = []
    _say_if_edited(state, said.append)
    assert said == []
    path.write_text("space: {optim.lr: [1.0e-3, 2.0e-3]}\n")
    _say_if_edited(state, said.append)
    assert said == [f"{path} changed since this sweep started; resume continues the plan it started with "
                    "(the edits take effect in a new `sweep run`)"]


def test_sweep_submit_validates_the_sweep_before_submitting(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = write_sweep(tmp_path / "s.yaml", space={"optim.lr": [1e-3]}, search={"algoritm": "grid"})
    port = free_port()  # nothing listens: a submit that got past the check would say so instead
    assert error_line(capsys, ["sweep", "submit", "s.yaml", "--address", f"http://127.0.0.1:{port}"]) == (
        f"mtbert: error: {path.name}: search.algoritm: unknown key (did you mean 'search.algorithm'?)")


def test_best_of_a_sweep_whose_every_trial_failed_says_why(tmp_path, capsys):
    from mlflow.tracking import MlflowClient

    from .orchestration.conftest import new_experiment

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    exp = new_experiment(client, "broken")
    parent = client.create_run(exp, tags={"role": "sweep"}, run_name="b0")
    for key in ("p000-s0", "p001-s0"):
        run = client.create_run(exp, tags={"mlflow.parentRunId": parent.info.run_id, "variant": key[:4],
                                           "role": "search", "trial_key": key, "error": "Traceback ...\nTrainingError: loss is nan"})
        client.set_terminated(run.info.run_id, "FAILED")
    capsys.readouterr()
    assert error_line(capsys, ["best", "--experiment", "broken", "--tracking-uri", uri]) == (
        f"mtbert: error: sweep b0 ({parent.info.run_id}) has no finished trials: all 2 ended without a result "
        "(2 FAILED); trial p000-s0: TrainingError: loss is nan")


def test_findings_for_a_sweep_the_store_never_ran(tmp_path, capsys):
    from mlflow.tracking import MlflowClient

    from .orchestration.conftest import new_experiment

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    new_experiment(MlflowClient(uri), "other")
    path = write_sweep(tmp_path / "mine.yaml", space={"optim.lr": [1e-3, 2e-3]},
                       claims=[{"name": "c", "metric": "overall", "a": {"optim.lr": 1e-3}, "b": {"optim.lr": 2e-3},
                                "relation": ">"}])
    capsys.readouterr()
    assert error_line(capsys, ["findings", str(path), "--tracking-uri", uri]) == (
        f"mtbert: error: experiment mine of the claims is not in {uri} (it holds Default, other); run the "
        "sweep, or pass the --tracking-uri it ran with")


def test_a_tokenizer_larger_than_the_embedding_table_fails_before_training(tmp_path, capsys):
    from transformers import BertConfig, BertModel

    from mtbert.data.tokenize import _wrap, train_wordpiece

    folder = tmp_path / "encoder"
    folder.mkdir()
    words = [f"word{i} thing{i} other{i}" for i in range(300)]
    (tmp_path / "tok.json").write_text(train_wordpiece(words).to_str())
    tokenizer = _wrap(tmp_path / "tok.json")
    tokenizer.save_pretrained(folder)
    BertModel(BertConfig(vocab_size=len(tokenizer) - 10, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=64, max_position_embeddings=64)).save_pretrained(folder)
    capsys.readouterr()  # transformers' progress bar of the save
    line = error_line(capsys, ["train", *TRAIN_FAST, "--set", f"model.name_or_path={folder}",
                               "--set", f"data.cache_dir={tmp_path / 'cache'}", "--output", str(tmp_path / "out")])
    assert line == (f"mtbert: error: model.name_or_path: '{folder}': its tokenizer has {len(tokenizer):,} tokens "
                    f"but the encoder embeds {len(tokenizer) - 10:,}; the tokenizer files are another model's")


def test_a_store_mlflow_would_have_to_change_is_left_alone(tmp_path, capsys):
    # MLflow's table names without the rest of its schema (an older MLflow's store looks alike):
    # MLflow's client would create every table it lacks before reading. This also fails loudly
    # when MLflow moves the table list the check reads.
    db = tmp_path / "old.db"
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE experiments (experiment_id, name)")
    con.execute("CREATE TABLE runs (run_uuid)")
    con.commit()
    con.close()
    before = db.read_bytes()
    line = error_line(capsys, ["best", "--experiment", "x", "--tracking-uri", f"sqlite:///{db}"])
    assert line.startswith(f"mtbert: error: tracking store sqlite:///{db} unusable: not a store of this MLflow (no ")
    assert line.endswith("reading it through MLflow would change it (`mlflow db upgrade` migrates a store of an "
                         "older MLflow); it is left as it is")
    assert db.read_bytes() == before
