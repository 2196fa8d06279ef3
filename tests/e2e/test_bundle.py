"""The model bundle and `mtbert predict`: a run's best/ folder loads in a fresh process,
predicts files in the CS224N hand-in layout whose ids are the input's, and scores the dev
split exactly as the run did."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mtbert.config import build_config
from mtbert.data.readers import read_examples
from mtbert.data.synthetic import make_synthetic
from mtbert.predict import read_predictions
from mtbert.tasks import get_task
from mtbert.train.loop import train

COLUMNS = {"sst": ("sentence", None, "sentiment"), "para": ("sentence1", "sentence2", "is_duplicate"),
           "sts": ("sentence1", "sentence2", "similarity")}
STEMS = {"sst": "ids-sst", "para": "quora", "sts": "sts"}


def write_cs224n(folder: Path, task: str, split: str, n: int, seed: int, labels: bool = True) -> list[str]:
    """A CS224N-layout file (unnamed index, hex id, text, label) from synthetic examples."""
    text, text2, label = COLUMNS[task]
    header = ["", "id", text] + ([text2] if text2 else []) + ([label] if labels else [])
    lines, ids = ["\t".join(header)], []
    for i, e in enumerate(make_synthetic(get_task(task), n, seed)):
        ident = f"{seed:04x}{i:021x}"
        ids.append(ident)
        row = [str(1000 + i), ident, e.text] + ([e.text2] if text2 else []) + ([str(e.label)] if labels else [])
        lines.append("\t".join(row))
    name = f"{STEMS[task]}-{'test-student' if split == 'test' else split}.csv"
    (folder / name).write_text("\n".join(lines) + "\n")
    return ids


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("bundle")
    data = root / "data"
    data.mkdir()
    ids = {}
    for j, task in enumerate(COLUMNS):
        write_cs224n(data, task, "train", 240, 10 + j)
        ids[task, "dev"] = write_cs224n(data, task, "dev", 70, 20 + j)
        ids[task, "test"] = write_cs224n(data, task, "test", 30, 30 + j, labels=False)
    cfg = build_config({}, {"data.source": "cs224n", "data.dir": str(data), "data.cache_dir": str(root / "cache"),
                            "train.epochs": 2, "sampling.strategy": "tuple", "sampling.steps_per_epoch": 15,
                            "train.device": "cpu", "model.max_length": 32})
    result = train(cfg, output_dir=root / "out", log=None)
    return root, result, ids


def _cli(*args, **kw):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run([sys.executable, "-m", "mtbert.cli", *args], capture_output=True, text=True,
                          timeout=300, env=env, **kw)


def test_reader_keeps_ids_and_reads_unlabelled_test_files(run):
    root, _, ids = run
    dev, _ = read_examples(root / "data" / "quora-dev.csv", get_task("para"))
    assert [e.id for e in dev] == ids["para", "dev"]
    test, bad = read_examples(root / "data" / "sts-test-student.csv", get_task("sts"), labels_required=False)
    assert [e.id for e in test] == ids["sts", "test"] and all(e.label is None for e in test) and not bad.total
    jsonl = root / "rows.jsonl"
    jsonl.write_text('{"sentence": "a", "sentiment": 1}\n{"sentence": "b", "sentiment": 2}\n')
    assert [e.id for e in read_examples(jsonl, get_task("sst"))[0]] == ["1", "2"]  # row numbers


def test_bundle_is_one_folder(run):
    root, _, _ = run
    best = root / "out" / "best"
    assert {p.name for p in best.iterdir()} >= {"model.pt", "config.yaml", "tokenizer", "bundle.json"}


def test_predict_dev_in_a_fresh_process_scores_what_the_run_did(run, predicts_best_epoch):
    root, result, ids = run
    predicts_best_epoch(root / "out" / "best", root / "pred", result)
    header = (root / "pred" / "sst-dev-output.csv").read_text().splitlines()[0]
    assert header == "id \t Predicted_Sentiment "
    for task, stem in (("sst", "sst"), ("para", "para"), ("sts", "sts")):
        rows = read_predictions(root / "pred" / f"{stem}-dev-output.csv")
        assert [i for i, _ in rows] == ids[task, "dev"]
        values = [v for _, v in rows]
        if task == "sst":
            assert set(values) <= {0, 1, 2, 3, 4}
        elif task == "para":
            assert set(values) <= {0, 1}
        else:
            assert all(-0.5 <= v <= 5.5 for v in values)


def test_predict_test_split_writes_ids_without_scores(run):
    root, _, ids = run
    proc = _cli("predict", "--model", str(root / "out" / "best"), "--split", "test",
                "--output", str(root / "pred-test"), "--device", "cpu")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "no labels, not scored" in proc.stdout
    assert not (root / "pred-test" / "scores-test.json").exists()
    for task, stem in (("sst", "sst"), ("para", "para"), ("sts", "sts")):
        assert [i for i, _ in read_predictions(root / "pred-test" / f"{stem}-test-output.csv")] == ids[task, "test"]


def test_load_model_predicts_raw_text(run):
    import mtbert

    root, _, _ = run
    bundle = mtbert.load_model(root / "out" / "best", device="cpu")
    assert len(bundle.predict("sst", ["a superb film", "an awful film", "fine"])) == 3
    sims = bundle.predict("sts", ["the big house"], ["the large home"])
    assert len(sims) == 1 and isinstance(sims[0], float)


def test_not_a_bundle_is_one_line(tmp_path):
    proc = _cli("predict", "--model", str(tmp_path))
    assert proc.returncode == 2 and "not a model bundle" in proc.stderr and "Traceback" not in proc.stderr


ROOT = Path(__file__).resolve().parents[2]
MINILM = ROOT / ".." / "shared" / "models" / "all-MiniLM-L6-v2"
MINBERT = ROOT / ".." / "shared" / "data" / "minbert"


@pytest.mark.slow
@pytest.mark.shared
@pytest.mark.skipif(not (MINILM.is_dir() and MINBERT.is_dir()),
                    reason="../shared/models/all-MiniLM-L6-v2 or ../shared/data/minbert absent")
def test_pretrained_bundle_predicts_elsewhere_without_the_model_folder(tmp_path):
    """A bundle from a pretrained encoder carries every weight: trained from a copy of MiniLM
    given as a relative path, moved away, the copy deleted, it predicts from another working
    directory and scores the dev split to the last digit of the run (fp32 on CPU)."""
    shutil.copytree(MINILM, tmp_path / "minilm")
    work = tmp_path / "work"
    work.mkdir()
    proc = _cli("train", "--output", "out", "--set", "model.name_or_path=../minilm",
                "--set", "data.source=cs224n", "--set", f"data.dir={os.path.relpath(MINBERT, work)}",
                "--set", "data.max_train_examples=32", "--set", "data.max_dev_examples=24",
                "--set", "data.cache_dir=cache", "--set", "train.epochs=1",
                "--set", "sampling.steps_per_epoch=2", "--set", "model.max_length=32",
                "--set", "train.precision=fp32", "--set", "train.device=cpu", cwd=work)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = json.loads((work / "out" / "result.json").read_text())
    shutil.move(work / "out" / "best", tmp_path / "bundle")
    shutil.rmtree(tmp_path / "minilm")
    shutil.rmtree(work)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    proc = _cli("predict", "--model", "../bundle", "--split", "dev", "--as-trained", "--output", "pred",
                "--device", "cpu", cwd=elsewhere)
    assert proc.returncode == 0, proc.stderr[-3000:]
    scores = json.loads((elsewhere / "pred" / "scores-dev.json").read_text())
    m = run["metrics"]
    assert scores == {"sst": m["sst_acc"], "para": m["para_acc"], "sts": m["sts_corr"]}
    for stem in ("sst", "para", "sts"):
        assert len(read_predictions(elsewhere / "pred" / f"{stem}-dev-output.csv")) == 24
