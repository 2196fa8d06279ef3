"""Tokenizers (tiny WordPiece and a real pretrained one), encoding, dynamic padding, the cache."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

import mtbert.data.tokenize as tokenize
from mtbert.config import build_config
from mtbert.data.readers import DataError
from mtbert.data.tokenize import collate, encode_examples, get_tokenizer, prepare
from mtbert.data.types import Example
from mtbert.tasks import get_task

SST, PARA, STS = get_task("sst"), get_task("para"), get_task("sts")
TEXTS = ["the film was good", "a movie that was bad", "what is the capital of france",
         "which city is the capital of france", "two dogs play on the grass"] * 3
PAIRS = [Example("what is the capital of france", "which city is the capital", 1),
         Example("two dogs", "a film that was good and a movie that was bad", 0),
         Example("good", "bad", 1)]


def tiny_cfg(tmp_path: Path, **data) -> object:
    return build_config({"data": {"cache_dir": str(tmp_path / "cache"), **data}})


@pytest.fixture
def tiny(tmp_path):
    return get_tokenizer(tiny_cfg(tmp_path), TEXTS)


# --------------------------------------------------------------------------- tokenizers

def test_tiny_tokenizer_special_tokens_and_pair_template(tiny):
    assert [tiny.convert_tokens_to_ids(t) for t in ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]] == [0, 1, 2, 3, 4]
    assert tiny.pad_token_id == 0
    enc = tiny("the film", "a movie")
    assert tiny.convert_ids_to_tokens(enc["input_ids"]) == ["[CLS]", "the", "film", "[SEP]", "a", "movie", "[SEP]"]
    assert enc["token_type_ids"] == [0, 0, 0, 0, 1, 1, 1]
    assert tiny.convert_ids_to_tokens(tiny("The FILM")["input_ids"]) == ["[CLS]", "the", "film", "[SEP]"]


def test_tiny_tokenizer_is_deterministic_and_cached_by_texts(tmp_path, monkeypatch):
    trained = []
    real_train = tokenize.train_wordpiece
    monkeypatch.setattr(tokenize, "train_wordpiece", lambda texts: trained.append(1) or real_train(texts))
    a = get_tokenizer(tiny_cfg(tmp_path / "a"), TEXTS)
    b = get_tokenizer(tiny_cfg(tmp_path / "b"), TEXTS)  # separate cache: trained again
    assert len(trained) == 2 and a.get_vocab() == b.get_vocab()
    assert a.backend_tokenizer.to_str() == b.backend_tokenizer.to_str()
    get_tokenizer(tiny_cfg(tmp_path / "a"), TEXTS)  # same texts, same cache: loaded
    assert len(trained) == 2
    get_tokenizer(tiny_cfg(tmp_path / "a"), TEXTS + ["new words arrive"])  # new texts: new tokenizer
    assert len(trained) == 3
    assert len(list((tmp_path / "a" / "cache").glob("tokenizer-tiny-*.json"))) == 2


def test_tiny_tokenizer_needs_texts(tmp_path):
    with pytest.raises(DataError, match="model.name_or_path: tiny"):
        get_tokenizer(tiny_cfg(tmp_path), [])


def test_missing_local_model_dir(tmp_path):
    cfg = build_config({"model": {"name_or_path": str(tmp_path / "no-model")}})
    with pytest.raises(DataError, match=r"^model\.name_or_path: .*no-model not found$"):
        get_tokenizer(cfg)
    cfg = build_config({"model": {"name_or_path": "./models/absent"}})
    with pytest.raises(DataError, match=r"^model\.name_or_path: \./models/absent not found$"):
        get_tokenizer(cfg)


@pytest.mark.shared
def test_pretrained_tokenizer_cross_and_bi(minilm_dir):
    tok = get_tokenizer(build_config({"model": {"name_or_path": str(minilm_dir)}}))
    cls, sep = tok.cls_token_id, tok.sep_token_id
    ex = [Example("What is a cat?", "Is a cat an animal?", 1)]
    cross = encode_examples(tok, ex, PARA, "cross", 64)
    (ids,), (types,) = cross.sides[0], cross.type_ids[0]
    first_sep = ids.index(sep)
    assert ids[0] == cls and ids[-1] == sep and ids.count(sep) == 2
    assert tok.decode(ids[1:first_sep]) == "what is a cat?"
    assert types == [0] * (first_sep + 1) + [1] * (len(ids) - first_sep - 1)
    bi = encode_examples(tok, ex, PARA, "bi", 64)
    assert len(bi.sides) == 2
    assert [tok.decode(side[0], skip_special_tokens=True) for side in bi.sides] == ["what is a cat?", "is a cat an animal?"]
    assert all(side[0][0] == cls and side[0][-1] == sep for side in bi.sides)
    assert bi.type_ids == [[[0] * len(bi.sides[0][0])], [[0] * len(bi.sides[1][0])]]


# --------------------------------------------------------------------------- encode + collate

def test_encode_sides_labels_and_truncation(tiny):
    single = encode_examples(tiny, [Example("the film was good", None, 3)], SST, "bi", 64)
    assert len(single.sides) == 1 and single.labels.dtype == torch.long and len(single) == 1
    cross = encode_examples(tiny, PAIRS, STS, "cross", 8)
    assert len(cross.sides) == 1 and cross.labels.dtype == torch.float32
    assert max(len(s) for s in cross.sides[0]) == 8  # the long pair is truncated
    assert all(s.count(3) == 2 for s in cross.sides[0])  # both [SEP]s survive truncation
    bi = encode_examples(tiny, PAIRS, PARA, "bi", 64)
    assert len(bi.sides) == 2 and bi.labels.tolist() == [1, 0, 1]


def reference_pad(seqs: list[list[int]], pad: int) -> torch.Tensor:
    width = max(map(len, seqs))
    return torch.tensor([s + [pad] * (width - len(s)) for s in seqs])


@pytest.mark.parametrize("encoding", ["cross", "bi"])
def test_collate_pads_to_the_longest_in_the_batch(tiny, encoding):
    ds = encode_examples(tiny, PAIRS * 4, PARA, encoding, 64)
    for indices in ([2], [0, 2], [1, 0, 2], [2, 2, 5]):
        batch = collate(ds, indices, pad_id=tiny.pad_token_id)
        assert batch.task == "para" and len(batch) == len(indices)
        assert batch.labels.tolist() == [PAIRS[i % 3].label for i in indices]
        assert len(batch.inputs) == len(ds.sides)
        for enc, side, types in zip(batch.inputs, ds.sides, ds.type_ids):
            seqs = [side[i] for i in indices]
            assert enc.input_ids.shape[1] == max(map(len, seqs)) < 64
            assert torch.equal(enc.input_ids, reference_pad(seqs, 0))
            assert torch.equal(enc.token_type_ids, reference_pad([types[i] for i in indices], 0))
            assert enc.attention_mask.tolist() == [[1] * len(s) + [0] * (enc.input_ids.shape[1] - len(s)) for s in seqs]
            assert enc.input_ids.dtype == enc.attention_mask.dtype == enc.token_type_ids.dtype == torch.long


def test_collate_uses_the_given_pad_id(tiny):
    ds = encode_examples(tiny, PAIRS, PARA, "cross", 64)
    ids = collate(ds, [0, 2], pad_id=99).inputs[0].input_ids
    assert ids[1, -1].item() == 99 and (ids[0] != 99).all()


# --------------------------------------------------------------------------- prepare + cache

@pytest.fixture
def count_encodes(monkeypatch):
    # What the cache on disk saves: the process keeps nothing of its own here (ProcessMemo).
    monkeypatch.setenv("MTBERT_REUSE", "0")
    calls: list[tuple[str, int]] = []
    real = tokenize.encode_examples

    def counting(tokenizer, examples, task, encoding, max_length):
        calls.append((task.name, len(examples)))
        return real(tokenizer, examples, task, encoding, max_length)

    monkeypatch.setattr(tokenize, "encode_examples", counting)
    return calls


def synthetic_cfg(tmp_path: Path, **over):
    return build_config({"pairs": {"encoding": "cross"},
                         "data": {"cache_dir": str(tmp_path / "cache"),
                                  "synthetic": {"train_size": 60, "dev_size": 20}}}, over)


def cache_files(tmp_path: Path) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in (tmp_path / "cache").iterdir()}


def test_second_prepare_reads_the_cache(tmp_path, count_encodes):
    cfg = synthetic_cfg(tmp_path)
    first = prepare(cfg, log=None)
    assert sorted(count_encodes) == sorted([(t, n) for t in cfg.tasks for n in (60, 20)])
    files = cache_files(tmp_path)
    assert len([f for f in files if f.endswith(".pt")]) == 6 and not [f for f in files if f.endswith(".tmp")]

    count_encodes.clear()
    second = prepare(cfg, log=None)
    assert count_encodes == []
    assert cache_files(tmp_path) == files  # nothing rewritten
    for split in ("train", "dev"):
        for task in cfg.tasks:
            a, b = getattr(first, split)[task], getattr(second, split)[task]
            assert a.sides == b.sides and a.type_ids == b.type_ids and torch.equal(a.labels, b.labels)
            assert torch.equal(collate(a, [0, 1, 2], 0).inputs[0].input_ids, collate(b, [0, 1, 2], 0).inputs[0].input_ids)


def test_content_changes_miss_the_cache(tmp_path, count_encodes):
    prepare(synthetic_cfg(tmp_path), log=None)
    count_encodes.clear()
    prepare(synthetic_cfg(tmp_path, **{"data.synthetic.dev_size": 21}), log=None)  # new dev examples
    assert sorted(count_encodes) == sorted([(t, 21) for t in ("sst", "para", "sts")])
    count_encodes.clear()
    prepare(synthetic_cfg(tmp_path, **{"pairs.encoding": "bi"}), log=None)  # only pair tasks change
    assert sorted(count_encodes) == [("para", 20), ("para", 60), ("sts", 20), ("sts", 60)]
    count_encodes.clear()
    prepare(synthetic_cfg(tmp_path, **{"model.max_length": 16}), log=None)
    assert len(count_encodes) == 6


def test_unreadable_cache_file_is_a_miss(tmp_path, count_encodes):
    cfg = synthetic_cfg(tmp_path, tasks=["sst"])
    prepare(cfg, log=None)
    (victim,) = (tmp_path / "cache").glob("sst-train-*.pt")
    victim.write_bytes(b"truncated")
    count_encodes.clear()
    out = prepare(cfg, log=None)
    assert count_encodes == [("sst", 60)] and len(out.train["sst"]) == 60
    assert victim.stat().st_size > 100  # rewritten


def test_prepare_logs_one_line_per_file_with_bad_rows(tmp_path):
    data = tmp_path / "d"
    data.mkdir()
    for split in ("train", "dev"):
        rows = [f"{i}\tx{i}\tsentence {i}\t{i % 5}" for i in range(12)]
        if split == "dev":
            rows += ["12\tbad\tfine text\t", "13\tbad2\t\t2"]
        (data / f"ids-sst-{split}.csv").write_text("\n".join(["\tid\tsentence\tsentiment", *rows]) + "\n")
    cfg = build_config({"tasks": ["sst"], "data": {"source": "cs224n", "dir": str(data),
                                                   "cache_dir": str(tmp_path / "cache")}})
    lines: list[str] = []
    out = prepare(cfg, log=lines.append)
    assert lines == [f"{data / 'ids-sst-dev.csv'}: 2 of 14 rows malformed (empty text: 1, missing label: 1; first at row 14)"]
    assert (len(out.train["sst"]), len(out.dev["sst"])) == (12, 12)
    assert [b.total for b in out.bad_rows] == [0, 2]


def test_prepare_relative_paths_resolve_against_cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = build_config({"tasks": ["sst"], "data": {"cache_dir": "rel-cache",
                                                   "synthetic": {"train_size": 10, "dev_size": 5}}})
    prepare(cfg, log=None)
    assert len(list((tmp_path / "rel-cache").glob("sst-*.pt"))) == 2
    assert os.listdir(tmp_path) == ["rel-cache"]
