"""Readers on small files written here: every format, bad rows per reason, config -> splits."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from mtbert.config import ColumnMap, build_config
from mtbert.data.readers import DataError, detect_format, load_splits, read_examples
from mtbert.data.types import Example
from mtbert.tasks import get_task

SST, PARA, STS = get_task("sst"), get_task("para"), get_task("sts")


def write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def cs224n_sts(path: Path, rows: list[str]) -> Path:
    return write(path, ["\tid\tsentence1\tsentence2\tsimilarity", *rows])


# --------------------------------------------------------------------------- formats

def test_cs224n_reads_and_unwraps_quoted_fields(tmp_path):
    path = write(tmp_path / "sst.csv", [
        "\tid\tsentence\tsentiment",
        "0\tab1\t It 's a lovely film .\t3",
        '1\tab2\t"""Quoted"" title"\t0',  # CSV-quoted field inside a tab file
        '2\tab3\t"Hi" he said "bye"\t4',  # starts and ends with a quote, but is not a quoted field
    ])
    assert detect_format(path) == "cs224n"
    examples, bad = read_examples(path, SST)
    assert examples == [Example("It 's a lovely film .", None, 3), Example('"Quoted" title', None, 0),
                        Example('"Hi" he said "bye"', None, 4)]
    assert bad.rows_read == 3 and bad.total == 0


def test_cs224n_stray_quote_does_not_swallow_lines(tmp_path):
    path = cs224n_sts(tmp_path / "sts.csv", [
        '0\tx\t"open quote never closed\tsecond\t2.5',
        "1\ty\tnext row\tstill here\t4.0",
    ])
    examples, bad = read_examples(path, STS)
    assert [e.text for e in examples] == ['"open quote never closed', "next row"]
    assert [e.label for e in examples] == [2.5, 4.0]


def test_csv_with_column_map(tmp_path):
    path = write(tmp_path / "para.csv", [
        "q1,q2,dup",
        '"Is it, really?","Is it so?",1',
        "How far,How near,0",
    ])
    assert detect_format(path) == "csv"
    examples, bad = read_examples(path, PARA, columns=ColumnMap(text="q1", text2="q2", label="dup"))
    assert examples == [Example("Is it, really?", "Is it so?", 1), Example("How far", "How near", 0)]


def test_tsv_with_column_map(tmp_path):
    path = write(tmp_path / "sst.tsv", ["label\ttext", "4\tgreat fun", '0\t"bad"'])
    examples, _ = read_examples(path, SST, columns=ColumnMap(text="text", label="label"))
    assert examples == [Example("great fun", None, 4), Example("bad", None, 0)]


def test_jsonl_with_column_map(tmp_path):
    path = write(tmp_path / "sts.jsonl", [
        json.dumps({"a": "one", "b": "two", "score": 3.5}),
        "",
        json.dumps({"a": "three", "b": "four", "score": "1"}),
    ])
    examples, bad = read_examples(path, STS, columns=ColumnMap(text="a", text2="b", label="score"))
    assert examples == [Example("one", "two", 3.5), Example("three", "four", 1.0)]
    assert bad.rows_read == 2


def test_default_columns_are_the_task_cs224n_names(tmp_path):
    path = write(tmp_path / "para.jsonl", [json.dumps({"sentence1": "a", "sentence2": "b", "is_duplicate": 0})])
    assert read_examples(path, PARA)[0] == [Example("a", "b", 0)]


# --------------------------------------------------------------------------- bad rows

def test_bad_rows_counted_per_reason_with_file_lines(tmp_path):
    path = cs224n_sts(tmp_path / "sts-dev.csv", [
        "0\ta\tgood one\tgood two\t2.0",        # line 2: fine
        "1\tb\tno label\there\t",               # line 3: missing label
        "2\tc\tlabel too high\there\t7.5",      # line 4: bad label (out of range)
        "3\td\tlabel is text\there\tabout 3",   # line 5: bad label (not a number)
        "4\te\t   \there\t1.0",                 # line 6: empty text
        "5\tf\tno second\t\t1.0",               # line 7: missing second sentence
        "6\tg\ttoo\tmany\tfields\t1.0",         # line 8: wrong field count
        "7\th\tfine again\tyes\t5",             # line 9: fine
    ])
    examples, bad = read_examples(path, STS)
    assert [e.text for e in examples] == ["good one", "fine again"]
    assert bad.rows_read == 8
    assert bad.counts == {"missing label": 1, "bad label": 2, "empty text": 1,
                          "missing second sentence": 1, "wrong field count": 1}
    assert bad.examples == [(3, "missing label"), (4, "bad label"), (5, "bad label"),
                            (6, "empty text"), (7, "missing second sentence")]
    assert bad.summary().startswith(f"{path}: 6 of 8 rows malformed (bad label: 2, empty text: 1")


def test_jsonl_bad_lines(tmp_path):
    path = write(tmp_path / "sst.jsonl", [
        json.dumps({"sentence": "ok", "label": 1}),
        "{not json",
        json.dumps(["a list"]),
        json.dumps({"sentence": "no label"}),
        json.dumps({"sentence": "class 5 of 5", "label": 5}),
    ])
    examples, bad = read_examples(path, SST, columns=ColumnMap())
    assert examples == [Example("ok", None, 1)]
    assert bad.counts == {"invalid JSON": 2, "missing label": 1, "bad label": 1}
    assert [row for row, _ in bad.examples] == [2, 3, 4, 5]


def test_on_bad_row_error_names_file_row_and_reason(tmp_path):
    path = cs224n_sts(tmp_path / "sts.csv", ["0\ta\tfine\tfine\t1.0", "1\tb\tx\ty\t9"])
    with pytest.raises(DataError) as err:
        read_examples(path, STS, on_bad_row="error")
    assert str(err.value) == f"{path}: row 3: bad label '9' (sts expects a number in [0, 5])"


def test_missing_file_names_the_path(tmp_path):
    with pytest.raises(DataError, match=r"nope\.csv: file not found"):
        read_examples(tmp_path / "nope.csv", SST)


def test_missing_column_names_column_and_header(tmp_path):
    path = write(tmp_path / "x.csv", ["text,label", "hi,1"])
    with pytest.raises(DataError, match=r"x\.csv: column 'sentence' not in header \(text, label\)"):
        read_examples(path, SST, fmt="csv")


def test_pair_task_needs_a_second_column(tmp_path):
    path = write(tmp_path / "p.csv", ["sentence,label", "hi,1"])
    with pytest.raises(DataError, match="set columns.text2"):
        read_examples(path, PARA, columns=ColumnMap())


def test_unknown_extension_asks_for_a_format(tmp_path):
    path = write(tmp_path / "data.txt", ["a"])
    with pytest.raises(DataError, match=r"data\.txt: cannot tell the format"):
        read_examples(path, SST)


# --------------------------------------------------------------------------- load_splits

def small_cs224n_dir(root: Path) -> Path:
    root.mkdir()
    for split, n in (("train", 30), ("dev", 10)):
        write(root / f"ids-sst-{split}.csv", ["\tid\tsentence\tsentiment",
                                             *(f"{i}\tid{i}\tsentence {i}\t{i % 5}" for i in range(n))])
        cs224n_sts(root / f"sts-{split}.csv", [f"{i}\tid{i}\ta {i}\tb {i}\t{i % 6}" for i in range(n)]
                   + ([f"{n}\tbad\tno label\tx\t"] if split == "dev" else []))
    return root


def test_load_splits_cs224n(tmp_path):
    cfg = build_config({"tasks": ["sst", "sts"], "data": {"source": "cs224n", "dir": str(small_cs224n_dir(tmp_path / "d"))}})
    splits, bad = load_splits(cfg)
    assert {t: (len(tr), len(dv)) for t, (tr, dv) in splits.items()} == {"sst": (30, 10), "sts": (30, 10)}
    assert [(Path(b.file).name, b.total) for b in bad] == [
        ("ids-sst-train.csv", 0), ("ids-sst-dev.csv", 0), ("sts-train.csv", 0), ("sts-dev.csv", 1)]


def test_load_splits_files_source(tmp_path):
    write(tmp_path / "tr.jsonl", [json.dumps({"t": f"s{i}", "y": i % 2}) for i in range(8)])
    write(tmp_path / "dv.jsonl", [json.dumps({"t": "d", "y": 1})])
    cfg = build_config({"tasks": ["sst"], "data": {"source": "files", "files": {"sst": {
        "train": str(tmp_path / "tr.jsonl"), "dev": str(tmp_path / "dv.jsonl"),
        "columns": {"text": "t", "label": "y"}}}}})
    splits, _ = load_splits(cfg)
    assert len(splits["sst"][0]) == 8 and splits["sst"][1] == [Example("d", None, 1)]


def test_load_splits_missing_dir_and_files_name_the_key(tmp_path):
    cfg = build_config({"data": {"source": "cs224n", "dir": str(tmp_path / "absent")}})
    with pytest.raises(DataError, match=r"^data\.dir: .*absent not found"):
        load_splits(cfg)
    small_cs224n_dir(tmp_path / "d")
    cfg = build_config({"tasks": ["para"], "data": {"source": "cs224n", "dir": str(tmp_path / "d")}})
    with pytest.raises(DataError, match=r"^data\.dir: .*quora-train\.csv not found"):
        load_splits(cfg)
    cfg = build_config({"tasks": ["sst"], "data": {"source": "files", "files": {"sst": {
        "train": str(tmp_path / "no-train.csv"), "dev": str(tmp_path / "no-dev.csv")}}}})
    with pytest.raises(DataError, match=r"^data\.files\.sst\.train: .*no-train\.csv not found"):
        load_splits(cfg)


def test_task_with_no_usable_rows_is_an_error(tmp_path):
    write(tmp_path / "bad.csv", ["sentence,label", "x,9", "y,"])
    cfg = build_config({"tasks": ["sst"], "data": {"source": "files", "files": {"sst": {
        "train": str(tmp_path / "bad.csv"), "dev": str(tmp_path / "bad.csv")}}}})
    with pytest.raises(DataError, match=r"data\.files\.sst\.train: .*no usable rows \(.*2 of 2 rows malformed"):
        load_splits(cfg)


def test_synthetic_splits_are_deterministic_and_dev_is_a_different_stream():
    cfg = build_config({"data": {"synthetic": {"train_size": 50, "dev_size": 20, "seed": 3}}})
    splits, bad = load_splits(cfg)
    assert bad == []
    assert {t: (len(tr), len(dv)) for t, (tr, dv) in splits.items()} == {t: (50, 20) for t in cfg.tasks}
    assert load_splits(cfg)[0] == splits
    for train, dev in splits.values():
        assert not set(dev) & set(train)
    assert splits["sst"][0] != splits["sts"][0]  # tasks do not share one random stream
    other = build_config({"data": {"synthetic": {"train_size": 50, "dev_size": 20, "seed": 4}}})
    assert load_splits(other)[0]["sst"] != splits["sst"]


def test_caps_take_a_stable_representative_subset():
    full_cfg = build_config({"tasks": ["sst"], "data": {"synthetic": {"train_size": 400, "dev_size": 100}}})
    capped_cfg = build_config({"tasks": ["sst"], "data": {"synthetic": {"train_size": 400, "dev_size": 100},
                                                           "max_train_examples": 50, "max_dev_examples": 30}})
    full_train, full_dev = load_splits(full_cfg)[0]["sst"]
    train, dev = load_splits(capped_cfg)[0]["sst"]
    assert (len(train), len(dev)) == (50, 30)
    assert load_splits(capped_cfg)[0]["sst"] == (train, dev)
    positions = [full_train.index(e) for e in train]
    assert positions == sorted(positions)  # file order kept
    assert positions != list(range(50)) and max(positions) > 300  # not just the head
    assert set(dev) <= set(full_dev)


def test_byte_order_mark_and_non_utf8(tmp_path):
    path = tmp_path / "bom.csv"
    path.write_bytes("\ufeffsentence,label\nhello,2\n".encode("utf-8"))
    assert read_examples(path, SST, columns=ColumnMap())[0] == [Example("hello", None, 2)]
    path.write_bytes(b"sentence,label\ncaf\xe9,2\n")
    with pytest.raises(DataError, match=r"bom\.csv: not UTF-8 text"):
        read_examples(path, SST, columns=ColumnMap())
