"""Tasks of other shapes and inputs that used to crash or lie: per-task length and its
truncation counts, the encoder's position limit, model folders, source mixing, the columns
the record shows, and the readers' lines for a wrong column map or delimiter."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from mtbert.config import ConfigError, build_config
from mtbert.data.readers import DataError, load_splits, read_examples, resolve_files
from mtbert.data.tokenize import _wrap, encode_examples, prepare, train_wordpiece
from mtbert.data.types import Example
from mtbert.tasks import get_task


def write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


# --------------------------------------------------------------------------- length

def test_truncation_counts_on_known_lengths(tmp_path):
    # One word = one token; [CLS] and [SEP] make 2 more: lengths 4, 7, 12, 22.
    words = ["w%d" % i for i in range(20)]
    texts = [" ".join(words[:n]) for n in (2, 5, 10, 20)]
    path = tmp_path / "tok.json"
    path.write_text(train_wordpiece(texts).to_str())
    tok = _wrap(path)
    ds = encode_examples(tok, [Example(t, None, 1) for t in texts], get_task("sst"), "bi", max_length=8)
    t = ds.truncation
    assert [len(s) for s in ds.sides[0]] == [4, 7, 8, 8]
    assert (t["rows"], t["rows_cut"], t["tokens"], t["tokens_lost"]) == (4, 2, 45, 4 + 14)
    assert t["p95_length"] == 22 and t["lost_share"] == pytest.approx(18 / 45)


def test_per_task_length_and_report_in_result(tmp_path):
    from mtbert.train.loop import train

    long_text = " ".join(["great"] * 60)
    rows = ["sentence,label"] + [f"{long_text} {'bad' if i % 2 else 'good'},{i % 2}" for i in range(24)]
    write(tmp_path / "long.csv", rows)
    cfg = build_config({"tasks": ["sst"], "data": {"source": "files", "cache_dir": str(tmp_path / "c"),
                                                   "files": {"sst": {"train": str(tmp_path / "long.csv"),
                                                                     "dev": str(tmp_path / "long.csv"),
                                                                     "columns": {"label": "label"}}}},
                        "task_options": {"sst": {"max_length": 16}},
                        "train": {"epochs": 1, "batch_size": 8}, "sampling": {"steps_per_epoch": 2}})
    assert cfg.max_length("sst") == 16 and cfg.model.max_length == 64
    lines: list[str] = []
    prepared = prepare(cfg, log=lines.append)
    assert max(len(s) for s in prepared.train["sst"].sides[0]) == 16
    assert "sst train: 24 of 24 rows cut at 16 tokens" in lines[0]
    result = train(cfg, prepared=prepared, output_dir=tmp_path / "out", log=None)
    saved = json.loads((tmp_path / "out" / "result.json").read_text())
    assert {t["split"]: t["rows_cut"] for t in saved["truncation"]} == {"train": 24, "dev": 24}
    assert saved["metrics"]["trunc_rows_sst"] == 1.0 and result.epochs[0]["trunc_tokens_sst"] > 0.7
    assert any("rows cut at 16 tokens" in line for line in saved["data_report"])


def _model_folder(path: Path, positions: int = 64, weights: bool = True) -> Path:
    from transformers import BertConfig

    BertConfig(vocab_size=100, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
               intermediate_size=32, max_position_embeddings=positions).save_pretrained(path)
    if weights:
        (path / "model.safetensors").write_bytes(b"")  # present: only the config is read here
    (path / "vocab.txt").write_text("[PAD]\n[UNK]\n")  # present: a folder trained from needs its tokenizer
    return path


def test_max_length_beyond_the_position_limit_fails_at_load(tmp_path):
    from mtbert.model.encoder import check_against_encoder

    folder = _model_folder(tmp_path / "m", positions=64)
    check_against_encoder(build_config({"model": {"name_or_path": str(folder), "max_length": 64}}))
    with pytest.raises(ConfigError) as err:
        check_against_encoder(build_config({"model": {"name_or_path": str(folder), "max_length": 100}}))
    assert str(err.value) == (f"model.max_length: 100 > 64, the position limit of '{folder}' "
                              "(max_position_embeddings)")
    with pytest.raises(ConfigError, match=r"^task_options\.sts\.max_length: 512 > 64"):
        check_against_encoder(build_config({"model": {"name_or_path": str(folder)},
                                            "task_options": {"sts": {"max_length": 512}}}))


def test_model_folder_without_weights_or_config_names_the_key(tmp_path):
    from mtbert.model.encoder import check_against_encoder

    folder = _model_folder(tmp_path / "noweights", weights=False)
    with pytest.raises(ConfigError) as err:
        check_against_encoder(build_config({"model": {"name_or_path": str(folder)}}))
    assert str(err.value) == (f"model.name_or_path: folder {folder} has config.json but no weights "
                              "(model.safetensors or pytorch_model.bin)")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ConfigError, match=rf"^model\.name_or_path: folder {empty} holds no model \(no config\.json\)"):
        check_against_encoder(build_config({"model": {"name_or_path": str(empty)}}))


# --------------------------------------------------------------------------- sources and the record

def test_files_entry_under_synthetic_is_refused():
    with pytest.raises(ConfigError) as err:
        build_config({"data": {"files": {"sts": {"train": "a.csv", "dev": "b.csv"}}}})
    assert str(err.value) == ("config: data.files.sts: data.source is synthetic, which reads no files; "
                              "set data.source: files (or cs224n, whose tasks read data.dir)")
    with pytest.raises(ConfigError, match=r"data\.files\.nosuch: 'nosuch' is not one of tasks"):
        build_config({"data": {"source": "files", "files": {"nosuch": {"train": "a", "dev": "b"}}}})


def _cs224n_dir(folder: Path) -> Path:
    folder.mkdir()
    for split in ("train", "dev"):
        write(folder / f"ids-sst-{split}.csv", ["\tid\tsentence\tsentiment"]
              + [f"{i}\tx{i}\tfilm number {i}\t{i % 5}" for i in range(10)])
        write(folder / f"quora-{split}.csv", ["\tid\tsentence1\tsentence2\tis_duplicate"]
              + [f"{i}\tq{i}\twhat is {i}\twhat was {i}\t{i % 2}" for i in range(10)])
    return folder


def test_cs224n_source_mixes_with_files_for_extra_tasks(tmp_path, toy_tasks):
    data = _cs224n_dir(tmp_path / "cs224n")
    write(tmp_path / "polar.jsonl", [json.dumps({"review": f"so {'good' if i % 2 else 'bad'}", "y": i % 2})
                                      for i in range(8)])
    raw = {"tasks": ["sst", "para", "toy_polar"],
           "data": {"source": "cs224n", "dir": str(data),
                    "files": {"toy_polar": {"train": str(tmp_path / "polar.jsonl"), "dev": str(tmp_path / "polar.jsonl"),
                                            "columns": {"text": "review", "label": "y"}}}}}
    splits, _ = load_splits(build_config(raw))
    assert {t: len(tr) for t, (tr, _) in splits.items()} == {"sst": 10, "para": 10, "toy_polar": 8}
    del raw["data"]["files"]
    with pytest.raises(DataError, match=r"^data\.files\.toy_polar: missing; task 'toy_polar' has no CS224N files"):
        load_splits(build_config(raw))


def test_the_record_shows_the_columns_the_reader_used(tmp_path):
    data = _cs224n_dir(tmp_path / "cs224n")
    cfg = build_config({"tasks": ["sst", "para"], "data": {"source": "files", "files": {
        t: {"train": str(data / f"{stem}-train.csv"), "dev": str(data / f"{stem}-dev.csv")}
        for t, stem in (("sst", "ids-sst"), ("para", "quora"))}}})
    assert cfg.data.files["para"].columns.label == "label"  # as written: defaults
    resolve_files(cfg)
    para, sst = cfg.data.files["para"], cfg.data.files["sst"]
    assert para.format == "cs224n" and (para.columns.text, para.columns.text2, para.columns.label) == \
        ("sentence1", "sentence2", "is_duplicate")
    assert (sst.columns.text, sst.columns.text2, sst.columns.label) == ("sentence", None, "sentiment")
    # ... and they are what the reader reads: the resolved entry gives the same examples.
    examples, _ = read_examples(para.train, get_task("para"), para.format, para.columns)
    assert examples[0] == Example("what is 0", "what was 0", 0)


def test_wrong_column_map_and_wrong_delimiter_are_named(tmp_path):
    jsonl = write(tmp_path / "x.jsonl", [json.dumps({"text": "hi", "label": 1})] * 3)
    with pytest.raises(DataError) as err:
        read_examples(jsonl, get_task("sst"), columns=_cols("sentence"))
    assert str(err.value) == f"{jsonl}: column 'sentence' missing from every row (keys: text, label); set its columns map"
    tsv = write(tmp_path / "x.tsv", ["sentence,label", "hi,1"])
    with pytest.raises(DataError, match=r"column 'sentence' not in header \(sentence,label\); the header has "
                                        r"commas but the file is read tab-separated: set format: csv \(wrong delimiter\)"):
        read_examples(tsv, get_task("sst"), columns=_cols("sentence"))


def _cols(text: str):
    from mtbert.config import ColumnMap

    return ColumnMap(text=text, label="label")
