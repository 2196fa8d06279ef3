"""The real CS224N minBERT files in ../shared (skipped when absent): every file loads, the
row counts match the data README, and the malformed Quora rows are counted, not trained on."""
from __future__ import annotations

import pytest

from mtbert.config import build_config
from mtbert.data.readers import DataError, load_splits, read_examples
from mtbert.data.tokenize import prepare
from mtbert.tasks import get_task

pytestmark = pytest.mark.shared

# file -> (task, data rows in the file, malformed rows): rows from ../shared/data/README.md
EXPECTED = {
    "ids-sst-train.csv": ("sst", 8544, 0), "ids-sst-dev.csv": ("sst", 1101, 0),
    "quora-train.csv": ("para", 16171, 1), "quora-dev.csv": ("para", 4043, 1),
    "sts-train.csv": ("sts", 6040, 0), "sts-dev.csv": ("sts", 863, 0),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_file_loads_with_the_expected_rows(minbert_dir, name):
    task_name, rows, malformed = EXPECTED[name]
    task = get_task(task_name)
    examples, bad = read_examples(minbert_dir / name, task)
    assert bad.rows_read == rows and bad.total == malformed
    assert len(examples) == rows - malformed
    assert all(task.parse_label(e.label) == e.label for e in examples)
    assert all(e.text and (e.text2 is not None) == task.pair for e in examples)
    # No CSV quoting left on wholly-quoted fields.
    assert not [e for e in examples if e.text.startswith('"""') or (e.text2 or "").startswith('"""')]


def test_quora_dev_bad_row_is_reported_and_strict_mode_stops_there(minbert_dir):
    path = minbert_dir / "quora-dev.csv"
    examples, bad = read_examples(path, get_task("para"))
    assert bad.counts == {"missing label": 1} and bad.examples == [(2891, "missing label")]
    assert bad.summary() == f"{path}: 1 of 4043 rows malformed (missing label: 1; first at row 2891)"
    texts = {e.text for e in examples}
    assert 'What does "turning the ship slowly" mean?' in texts  # was written '"""What does """"turning...'
    with pytest.raises(DataError, match=r"quora-dev\.csv: row 2891: missing label"):
        read_examples(path, get_task("para"), on_bad_row="error")


def test_load_splits_and_caps_on_real_data(minbert_dir):
    cfg = build_config({"data": {"source": "cs224n", "dir": str(minbert_dir), "max_train_examples": 500,
                                 "max_dev_examples": 100}})
    splits, bad = load_splits(cfg)
    assert {t: (len(tr), len(dv)) for t, (tr, dv) in splits.items()} == {t: (500, 100) for t in cfg.tasks}
    assert sum(b.total for b in bad) == 2
    # A representative subset: Quora's duplicate rate (about 37%) survives the cap.
    duplicates = sum(e.label for e in splits["para"][0]) / 500
    assert 0.28 < duplicates < 0.46


def test_prepare_real_data_with_pretrained_tokenizer(minbert_dir, minilm_dir, tmp_path):
    cfg = build_config({"model": {"name_or_path": str(minilm_dir), "max_length": 48},
                        "data": {"source": "cs224n", "dir": str(minbert_dir), "cache_dir": str(tmp_path),
                                 "max_train_examples": 200, "max_dev_examples": 50}})
    lines: list[str] = []
    out = prepare(cfg, log=lines.append)
    bad_rows = [line for line in lines if "rows malformed" in line]
    assert [line.split(": ", 1)[0].rsplit("/", 1)[-1] for line in bad_rows] == ["quora-train.csv", "quora-dev.csv"]
    # The rest are truncation lines: a few SST sentences are longer than 48 tokens.
    assert all(" rows cut at 48 tokens" in line for line in lines if line not in bad_rows)
    assert {t: (len(out.train[t]), len(out.dev[t])) for t in cfg.tasks} == {t: (200, 50) for t in cfg.tasks}
    assert max(len(s) for s in out.train["para"].sides[0]) <= 48
    assert out.train["para"].sides[0][0][0] == out.tokenizer.cls_token_id
