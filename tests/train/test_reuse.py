"""Cheap trials stay cheap: what a sweep worker keeps between trials (the prepared data, the
frozen layers' digest, the opened frozen-layer blocks) is keyed by what decides it, so a
reused worker never serves stale data; the frozen-layer cache a sweep builds before its first
trial is never charged to a trial's training time; a slim bundle compacted on the driver
predicts bit for bit as it did."""
import shutil
import time
import zlib
from pathlib import Path

import pytest
import torch

import mtbert
from mtbert.bundle import _compacted, _expanded, compact_bundle, read_weights
from mtbert.config import build_config
from mtbert.data.tokenize import prepare
from mtbert.train import frozen
from mtbert.train.frozen import _digest_params, frozen_digest
from mtbert.train.loop import build_frozen_cache, train

TINY = {"train.epochs": 1, "sampling.steps_per_epoch": 3, "data.synthetic.train_size": 40,
        "data.synthetic.dev_size": 20, "train.device": "cpu", "model.max_length": 32, "train.batch_size": 8}


def _sst_files(folder: Path, rows: list[tuple[str, int]]) -> None:
    """CS224N-format SST train and dev files (row, id, sentence, sentiment; tab-separated)."""
    folder.mkdir(parents=True, exist_ok=True)
    text = "\tid\tsentence\tsentiment\n" + "".join(f"{i}\tid{i}\t{s}\t{label}\n" for i, (s, label) in enumerate(rows))
    for split in ("train", "dev"):
        (folder / f"ids-sst-{split}.csv").write_text(text)


def test_prepare_is_kept_for_the_next_run_and_never_stale(tmp_path):
    data = tmp_path / "data"
    _sst_files(data, [("a good film", 4), ("a bad film", 0), ("fine", 2)])
    cfg = lambda: build_config({}, {**TINY, "tasks": ["sst"], "data.source": "cs224n", "data.dir": str(data),
                                    "data.cache_dir": str(tmp_path / "cache")})
    first = prepare(cfg(), log=None)
    assert prepare(cfg(), log=None) is first  # the same content: kept
    _sst_files(data, [("a good film", 4), ("a bad film", 0), ("fine", 3)])  # one label changed, same size
    changed = prepare(cfg(), log=None)
    assert changed is not first and changed.train["sst"].labels.tolist() == [4, 0, 3]
    other = prepare(build_config({}, {**TINY, "tasks": ["sst"], "data.source": "cs224n", "data.dir": str(data),
                                      "data.cache_dir": str(tmp_path / "cache"), "model.max_length": 4}), log=None)
    assert other is not changed  # another max_length: another entry


def test_a_new_process_prepares_from_the_index_an_earlier_one_left(tmp_path, monkeypatch):
    """A sweep worker's first run takes what the driver prepared from the index it left in the
    cache folder: no data file read into examples, the same datasets, bad rows and tokenizer
    fingerprint. Changed data, or a dataset file gone, is prepared afresh."""
    from mtbert.data import tokenize
    from tests.e2e.test_slim_bundle import save_encoder

    monkeypatch.setenv("MTBERT_REUSE", "0")  # every prepare() here is a new process's first
    encoder, data = save_encoder(tmp_path / "encoder"), tmp_path / "data"
    _sst_files(data, [("a good film", 4), ("a bad film", 0), ("fine", 2)])
    (data / "ids-sst-dev.csv").write_text((data / "ids-sst-dev.csv").read_text() + "3\tid3\tno label\n")
    cfg = lambda: build_config({}, {**TINY, "tasks": ["sst"], "data.source": "cs224n", "data.dir": str(data),
                                    "model.name_or_path": str(encoder), "data.cache_dir": str(tmp_path / "cache")})
    reads, real = [], tokenize.load_splits
    monkeypatch.setattr(tokenize, "load_splits", lambda c: reads.append(1) or real(c))
    first = prepare(cfg(), log=None)
    assert len(reads) == 1 and len(list((tmp_path / "cache").glob("prepared-*.json"))) == 1
    second = prepare(cfg(), log=None)
    assert len(reads) == 1 and second is not first
    for split in ("train", "dev"):
        a, b = getattr(first, split)["sst"], getattr(second, split)["sst"]
        assert a.sides == b.sides and torch.equal(a.labels, b.labels) and a.truncation == b.truncation
    assert second.bad_rows == first.bad_rows and second.bad_rows[-1].total == 1
    assert tokenize.tokenizer_fingerprint(second.tokenizer) == tokenize.tokenizer_fingerprint(first.tokenizer)
    _sst_files(data, [("a good film", 4), ("a bad film", 0), ("fine", 3)])  # one label changed
    assert prepare(cfg(), log=None).train["sst"].labels.tolist() == [4, 0, 3] and len(reads) == 2
    for stored in (tmp_path / "cache").glob("sst-dev-*.pt"):
        stored.unlink()
    assert prepare(cfg(), log=None).dev["sst"].labels.tolist() == [4, 0, 3] and len(reads) == 3


def test_reuse_off_keeps_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("MTBERT_REUSE", "0")
    cfg = lambda: build_config({}, {**TINY, "data.cache_dir": str(tmp_path / "cache")})
    assert prepare(cfg(), log=None) is not prepare(cfg(), log=None)


def test_the_kept_frozen_digest_is_the_weights_own_until_one_is_written(tmp_path):
    from tests.e2e.test_slim_bundle import save_encoder

    encoder = save_encoder(tmp_path / "encoder")
    cfg = build_config({}, {**TINY, "model.name_or_path": str(encoder), "freeze.layers": -1,
                            "data.cache_dir": str(tmp_path / "cache")})
    from mtbert.model.multitask import MultitaskModel

    a = MultitaskModel(cfg, vocab_size=200)
    digest = frozen_digest(a)
    b = MultitaskModel(cfg, vocab_size=200)  # a later trial of the same worker
    assert frozen_digest(b) == digest == _digest_params(b.digest_modules())
    with torch.no_grad():
        b.embeddings.word_embeddings.weight[0, 0] += 1.0  # a load that writes a frozen tensor
    assert frozen_digest(b) == _digest_params(b.digest_modules()) != digest


def test_the_frozen_cache_built_before_a_trial_is_never_in_its_training_time(tmp_path, monkeypatch):
    """What the sweep's driver does before the first trial (launch._prepare_data) takes the
    cache's build off every trial; built in the trial, it still never counts as training."""
    real = frozen.compute_side

    def slow(*a, **kw):
        time.sleep(0.5)
        return real(*a, **kw)

    monkeypatch.setattr(frozen, "compute_side", slow)
    cfg = lambda cache: build_config({}, {**TINY, "freeze.layers": -1, "train.frozen_cache_mb": 64,
                                          "data.cache_dir": str(tmp_path / cache)})
    in_trial = train(cfg("a"), log=None)
    blocks = 5  # sst, para x2, sts x2 sides ... per split: at least this many blocks slept 0.5 s each
    assert in_trial.timings["cache"] >= 0.5 * blocks and in_trial.epochs[0]["frozen_cache_s"] >= 0.5 * blocks
    assert in_trial.metrics["train_time_s"] < in_trial.timings["cache"]

    built, seconds = build_frozen_cache(cfg("b"))
    assert built > 0 and seconds >= 0.5 * blocks
    trial = train(cfg("b"), log=None)
    assert trial.epochs[0]["frozen_cache_s"] == 0.0 and trial.timings["cache"] < 0.5
    assert build_frozen_cache(cfg("b")) == (0, 0.0)  # once per sweep: a second look computes nothing


def test_every_report_carries_the_phase_timings(tmp_path):
    reports = []
    train(build_config({}, {**TINY, "train.epochs": 2, "data.cache_dir": str(tmp_path / "cache")}),
          reporter=lambda m, _c: reports.append(m), output_dir=tmp_path / "out", log=None)
    assert [set(r["timings"]) >= {"data", "model", "train", "eval", "checkpoint"} for r in reports] == [True, True]
    assert reports[1]["timings"]["report"] >= 0.0 and reports[1]["timings"]["train"] == pytest.approx(
        reports[1]["train_time_s"], abs=1e-3)


def test_compacted_weights_come_back_bit_for_bit():
    torch.manual_seed(0)
    shared = torch.randn(16, 8)
    state = {"a.weight": shared, "b.weight": shared, "c.bias": torch.randn(8), "d": torch.arange(5),
             "e": torch.randn(3, 4).to(torch.bfloat16), "f": torch.zeros(0)}
    back = _expanded(_compacted(state))
    assert list(back) == list(state)
    assert all(back[k].dtype == v.dtype and torch.equal(back[k], v) for k, v in state.items())
    assert back["a.weight"].data_ptr() == back["b.weight"].data_ptr()  # shared: stored once
    # Bundles compacted before, with the two highest planes deflated, still read bit for bit.
    packed = _compacted({"w": state["c.bias"]})
    planes = state["c.bias"].view(torch.uint8).reshape(-1, 4).T.contiguous().numpy()
    packed["tensors"][0].update(raw=torch.from_numpy(planes[:2].copy()).reshape(-1), deflated=torch.frombuffer(
        bytearray(zlib.compress(planes[2:].tobytes(), 1)), dtype=torch.uint8))
    assert torch.equal(_expanded(packed)["w"], state["c.bias"])


def test_a_compacted_slim_bundle_predicts_as_before(tmp_path):
    from tests.e2e.test_slim_bundle import SMALL, _dev_predictions, save_encoder

    encoder = save_encoder(tmp_path / "encoder")
    cfg = build_config({}, {**SMALL, "model.name_or_path": str(encoder), "data.cache_dir": str(tmp_path / "cache"),
                            "train.frozen_cache_mb": 0, "train.epochs": 1})
    train(cfg, output_dir=tmp_path / "out", log=None)
    best = tmp_path / "out" / "best"
    assert not (best / "tokenizer").exists()  # the pretrained model's own, named by its digest
    want, weights = _dev_predictions(mtbert.load_model(best, device="cpu")), read_weights(best)
    before = (best / "model.pt").stat().st_size
    assert compact_bundle(best) and not compact_bundle(best)
    assert (best / "model.pt").stat().st_size < before
    got = _dev_predictions(mtbert.load_model(best, device="cpu"))
    assert all(torch.equal(got[t], want[t]) for t in want)
    assert all(torch.equal(v, weights[k]) for k, v in read_weights(best).items())
    full = mtbert.bundle.make_self_contained(best, tmp_path / "full")  # tokenizer and weights stored
    assert (full / "tokenizer").is_dir() and "codec" not in torch.load(full / "model.pt", weights_only=True)
    shutil.rmtree(encoder)
    got = _dev_predictions(mtbert.load_model(full, device="cpu"))
    assert all(torch.equal(got[t], want[t]) for t in want)


def test_the_kept_tokenizer_fingerprint_is_the_tokenizers_own(tmp_path):
    """One fingerprint keys the tokenized data and names a slim bundle's tokenizer. A worker
    keeps it with the tokenizer object: it is the one computed afresh, tokenizing with
    truncation (which changes the tokenizer's own state) leaves it, and a token added to that
    object is a new fingerprint."""
    from mtbert.data.tokenize import _tiny_tokenizer, tokenizer_fingerprint

    texts = ["a small corpus of words", "words of a corpus", "small words"]
    tok = _tiny_tokenizer(texts, tmp_path)
    first = tokenizer_fingerprint(tok)
    assert tokenizer_fingerprint(tok) == first == tokenizer_fingerprint(_tiny_tokenizer(texts, tmp_path))
    tok(texts, truncation=True, max_length=4, padding=True)
    assert tokenizer_fingerprint(_tiny_tokenizer(texts, tmp_path)) == first
    tok.add_tokens(["zebra"])
    assert tokenizer_fingerprint(tok) != first
